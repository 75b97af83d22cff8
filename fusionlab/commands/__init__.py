"""One module per `fusionlab` sub-command; each has `register(subparsers)`."""

from __future__ import annotations

from pathlib import Path

from ..graph import Graph, ModelError, load


def load_input(path: str) -> Graph:
    """Load a command's input model (ModelError on anything wrong)."""
    return load(path)


def check_output(out: str, inputs: list[str], *, force: bool = True) -> Path:
    """An output path that is not one of the inputs (ModelError otherwise)."""
    target = Path(out)
    for src in inputs:
        s = Path(src)
        if s.resolve() == target.resolve():
            raise ModelError(out, "refusing to overwrite the input model; choose another output path")
    if target.exists() and target.is_dir():
        raise ModelError(out, "output path is a directory")
    return target
