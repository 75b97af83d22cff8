"""One module per `fusionlab` sub-command; each has `register(subparsers)`."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from ..cli import UsageError
from ..graph import Graph, ModelError, load
from ..passes import PASSES


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


def add_dim_option(parser) -> None:
    """The `--dim NAME=N` option every command that runs a model shares."""
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=N",
                        help="size of a symbolic dimension, e.g. --dim batch=4 (repeatable)")


def parse_dims(items: list[str]) -> dict[str, int]:
    """{name: size} from repeated `--dim NAME=N` (UsageError on anything else)."""

    dims = {}
    for item in items:
        name, _, value = item.partition("=")
        if not name or not value.isdigit() or int(value) <= 0:
            raise UsageError(f"--dim expects NAME=N with N > 0, got {item!r}")
        dims[name] = int(value)
    return dims


def parse_passes(text: str, allowed: Iterable[str] | None = None) -> list[str]:
    """Pass names from a comma list, each one known (default: `fusionlab.passes.PASSES`)."""

    allowed = list(PASSES if allowed is None else allowed)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError("--passes needs at least one pass name")
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise UsageError(f"unknown pass {unknown[0]!r}; choose from {', '.join(allowed)}")
    return names
