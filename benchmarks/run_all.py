#!/usr/bin/env python3
"""Run every benchmark script in benchmarks/ (each writes benchmarks/results/<name>.md)."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: run on their own target: bench_exports.py needs the full-size exports (`make bench-exports`)
SEPARATE = {"bench_exports.py"}


def main() -> int:
    scripts = sorted(p for p in HERE.glob("bench_*.py") if p.name not in SEPARATE)
    failed = []
    for script in scripts:
        print(f"== {script.name}", flush=True)
        if subprocess.run([sys.executable, str(script), *sys.argv[1:]], cwd=HERE).returncode:
            failed.append(script.name)
    if failed:
        print("failed:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
