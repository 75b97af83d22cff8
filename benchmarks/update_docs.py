#!/usr/bin/env python3
"""Copy benchmarks/results/*.md into docs/benchmarks.md between the results markers (numbers come from the scripts)."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
ORDER = ["vertical.md", "rules.md", "horizontal.md", "elementwise.md", "reductions.md", "compilers.md",
         "tvm_agreement.md", "profiling_fixes.md", "exports.md", "exports_after.md", "exports_quiet.md",
         "exports_long.md", "exports_select.md", "new_exports.md", "new_exports_resnet_fp16.md", "gqa_cache.md"]


def block(root: Path = ROOT) -> str:
    """The results block docs/benchmarks.md holds between its markers: every results file of ORDER, as written."""
    parts = []
    for name in ORDER:
        path = root / "benchmarks" / "results" / name
        if path.exists():
            body = path.read_text().strip()
            body = re.sub(r"^# ", "## ", body, count=1, flags=re.M)  # demote the title under the page's "# Benchmarks"
            parts.append(body + f"\n\n(from `benchmarks/results/{name}`)")
    return BEGIN + "\n" + "\n\n".join(parts) + "\n" + END


def main() -> int:
    doc = ROOT / "docs" / "benchmarks.md"
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        print("docs/benchmarks.md has no results markers", file=sys.stderr)
        return 1
    new = block()
    text = text[: text.index(BEGIN)] + new + text[text.index(END) + len(END):]
    doc.write_text(text)
    print(f"docs/benchmarks.md: {new.count('(from `benchmarks/results/')} result tables")
    return 0


if __name__ == "__main__":
    sys.exit(main())
