#!/usr/bin/env python3
"""How long a learner needs for each notebook, estimated from its source, and the README's column of it.

The estimate reads `notebooks_src/NN_name.py`: its prose at 200 words a minute, its code at 10 lines a minute
(reading a cell, running it and reading what it prints), rounded to 5 minutes. It is an estimate, and the README
says so; what it guarantees is that the column cannot drift from the notebooks: `--check` (tests/test_readme.py)
fails when a notebook grew or shrank past its printed figure, `--write` rewrites the column.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORDS_PER_MINUTE = 200
CODE_LINES_PER_MINUTE = 10
_ROW = re.compile(r"^(\| \[`(\d\d_[a-z0-9_]+)`\]\(notebooks/\2\.ipynb\) \|)( [^|]*\|)( [^|]*\|)?$")


def counts(source: Path) -> tuple[int, int]:
    """(words of prose, non-blank code lines) of a percent-format notebook source."""
    words = code = 0
    markdown = False
    for line in source.read_text().splitlines():
        if line.startswith("# %%"):
            markdown = "[markdown]" in line
            continue
        if markdown:
            words += len(line.lstrip("#").split())
        elif line.strip() and not line.lstrip().startswith("# NBVAL"):
            code += 1
    return words, code


def minutes(source: Path) -> int:
    """The estimate for one notebook, in minutes, rounded to 5 (at least 5)."""
    words, code = counts(source)
    raw = words / WORDS_PER_MINUTE + code / CODE_LINES_PER_MINUTE
    return max(5, 5 * round(raw / 5))


def estimates(root: Path = ROOT) -> dict[str, int]:
    return {p.stem: minutes(p) for p in sorted((root / "notebooks_src").glob("[0-9][0-9]_*.py"))}


def rewrite(readme: str, times: dict[str, int]) -> str:
    """The README with the third column of its notebook table set to `times` (and its header to 'minutes')."""
    out = []
    for line in readme.splitlines():
        m = _ROW.match(line)
        if m and m.group(2) in times:
            line = f"{m.group(1)}{m.group(3)} {times[m.group(2)]} |"
        elif line.startswith("| notebook | what you learn |"):
            line = "| notebook | what you learn | minutes |"
        elif line.startswith("|---|---|") and out and out[-1].startswith("| notebook | what you learn |"):
            line = "|---|---|---:|"
        out.append(line)
    return "\n".join(out) + ("\n" if readme.endswith("\n") else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if README.md's column differs from the estimates")
    ap.add_argument("--write", action="store_true", help="rewrite README.md's column")
    args = ap.parse_args(argv)
    times = estimates()
    readme_path = ROOT / "README.md"
    readme = readme_path.read_text()
    want = rewrite(readme, times)
    if args.write:
        readme_path.write_text(want)
    elif args.check:
        if want != readme:
            print("README.md's reading times are stale: run python tools/reading_time.py --write", file=sys.stderr)
            return 1
    else:
        for stem, m in times.items():
            w, c = counts(ROOT / "notebooks_src" / f"{stem}.py")
            print(f"{stem:<28} {m:>3} min  ({w} words, {c} code lines)")
        print(f"{'total':<28} {sum(times.values()):>3} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
