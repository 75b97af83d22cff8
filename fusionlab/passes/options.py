"""Pass options: each pass declares the options it takes; an option nobody declares is an error, not a no-op.

The vertical pass's `lower` option takes a `Lowering` (see `fusionlab.passes.lowering` for what each writes)."""

from __future__ import annotations

from enum import Enum
from typing import Iterable

__all__ = ["Lowering", "check_options", "split_options"]


class Lowering(str, Enum):
    """The lowering modes; a member is its string ("runtime" == Lowering.RUNTIME), as the CLI and plans write it."""

    RUNTIME = "runtime"
    FUNCTIONS = "functions"
    ONNX = "onnx"

    __str__ = str.__str__
    __format__ = str.__format__


def check_options(pass_name: str, given: dict, declared: dict) -> dict:
    """`given` if every key is one of `declared`; ValueError naming the option and the valid ones otherwise."""
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r} for the {pass_name} pass; "
                         f"valid options: {', '.join(sorted(declared))}")
    return dict(given)


def split_options(passes: Iterable[tuple[str, dict]], options: dict) -> dict[str, dict]:
    """{pass: the options it declares} from one dict for several passes; ValueError for an option none takes."""
    passes = list(passes)
    taken = set().union(*(set(decl) for _, decl in passes)) if passes else set()
    unknown = sorted(set(options) - taken)
    if unknown:
        names = ", ".join(name for name, _ in passes)
        raise ValueError(f"unknown option {unknown[0]!r} for passes {names}; valid options: {', '.join(sorted(taken))}")
    return {name: {k: v for k, v in options.items() if k in decl} for name, decl in passes}
