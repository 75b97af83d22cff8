"""The `fusionlab` command line: `fusionlab <command> ...` (also `python -m fusionlab`).

Each command lives in `fusionlab/commands/<name>.py` with `register(subparsers)` adding its parser
and setting `func`. Exit codes, each with one line on stderr and never a traceback:

- 0 success; 1 the answer is "no" (fused model not equivalent, models differ);
- 2 bad input: the model (`ModelError`), the arguments or a plan file that does not fit (`UsageError`);
- 3 an internal failure: fusionlab produced something invalid or crashed (`FusionError` names the pass,
  rule and group). Nothing is written; please report it with the model if you can share it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__
from .graph import ModelError
from .passes import FusionError

#: command modules, in the order `fusionlab --help` lists them
COMMANDS = ["fuse", "verify", "bench", "show", "explain", "blame", "report", "customop", "profile"]


class UsageError(Exception):
    """A bad command-line request (exit 2)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fusionlab",
        description="Operator fusion on ONNX models: plan, rewrite, verify, measure, explain.",
    )

    parser.add_argument("--version", action="version", version=f"fusionlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"fusionlab.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"fusionlab.commands.{name}":
                continue  # command not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ModelError, UsageError) as exc:
        print(f"fusionlab {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except FileExistsError as exc:
        print(f"fusionlab {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `fusionlab ... | head`: the reader went away; stop quietly like other Unix tools.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except Exception as exc:  # our bug, not the user's: one line, exit 3, nothing written

        kind = "internal error" if isinstance(exc, FusionError) else f"internal error ({type(exc).__name__})"
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"fusionlab {args.command}: {kind}: {text} -- nothing was written; this is a fusionlab bug, "
              f"please report it (fusionlab {__import__('fusionlab').__version__})", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
