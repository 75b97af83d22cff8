"""The `fusionlab` command line: `fusionlab <command> ...` (also `python -m fusionlab`).

Each command lives in `fusionlab/commands/<name>.py` with `register(subparsers)` adding its parser
and setting `func`. Errors in the model (`ModelError`) and bad arguments print one line on stderr
and exit 2, with no traceback and nothing written.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .graph import ModelError

#: command modules, in the order `fusionlab --help` lists them
COMMANDS = ["fuse", "verify", "bench", "show", "explain", "customop", "profile"]


class UsageError(Exception):
    """A bad command-line request (exit 2)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fusionlab",
        description="Operator fusion on ONNX models: plan, rewrite, verify, measure, explain.",
    )
    from . import __version__

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


if __name__ == "__main__":
    sys.exit(main())
