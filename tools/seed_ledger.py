#!/usr/bin/env python3
"""Write docs/seed_claims.md from data/seed_claims.json (the ledger of the seed's claims).

`python tools/seed_ledger.py` rewrites the document; `--check` exits 1 if the stored document is stale
(tests/test_seed_claims.py runs the same check).
"""

from __future__ import annotations

import argparse
import sys

from fusionlab import seed_claims


def main(argv: list[str] | None = None) -> int:
    """Render the ledger, or check that the stored document is current."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if docs/seed_claims.md is stale")
    args = parser.parse_args(argv)
    text = seed_claims.render()
    if args.check:
        current = seed_claims.DOC.read_text(encoding="utf-8") if seed_claims.DOC.exists() else ""
        if current != text:
            print(f"{seed_claims.DOC} is stale: run python tools/seed_ledger.py", file=sys.stderr)
            return 1
        return 0
    path = seed_claims.write_doc()
    print(f"wrote {path} ({len(seed_claims.load())} claims)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
