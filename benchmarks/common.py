"""Shared bits of the benchmark scripts: argument parsing, the results folder, markdown tables."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))


def parser(description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true", help="small models and short runs (a smoke test, not a result)")
    ap.add_argument("--min-time", type=float, default=None, help="seconds per comparison")
    return ap


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def write_result(name: str, text: str) -> Path:
    """Write benchmarks/results/<name> atomically and echo it."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    fd, tmp = tempfile.mkstemp(dir=RESULTS, prefix=f".{name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text.rstrip() + "\n")
    os.replace(tmp, path)
    print(text)
    return path


def machine_line() -> str:
    from fusionlab.timing import machine_info

    info = machine_info()
    keys = ("cpu", "logical_cores", "onnxruntime", "numpy", "python")
    return "Machine: " + ", ".join(f"{k} {info[k]}" for k in keys if k in info)
