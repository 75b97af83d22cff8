"""The second exercise of notebook 21: after how many requests compiling a shape of its own pays."""

import math

from fusionlab.lessons.dynamic_shapes import interpolate


def break_even(length, gears, run_seconds, build_seconds):
    """Reference: each request compiled for saves run(gear) - run(length); the build is paid back after
    build / saving requests, rounded up (a tie already pays); never when nothing is saved."""
    run_at = interpolate(run_seconds)
    gear = min(g for g in gears if g >= length)
    saving = run_at(gear) - run_at(length)
    if saving <= 0:
        return math.inf
    return math.ceil(build_seconds / saving)


def break_even_runs(length, gears, run_seconds, build_seconds):
    """WRONG: counts the build in runs at the length (the '1 build = N runs' column), not in time saved."""
    return math.ceil(build_seconds / interpolate(run_seconds)(length))


def break_even_strict(length, gears, run_seconds, build_seconds):
    """WRONG: wants compiling to be strictly cheaper, so a tie counts one request more."""
    run_at = interpolate(run_seconds)
    saving = run_at(min(g for g in gears if g >= length)) - run_at(length)
    return math.inf if saving <= 0 else math.floor(build_seconds / saving) + 1


def break_even_floor(length, gears, run_seconds, build_seconds):
    """WRONG: rounds build / saving down (math.floor, or int()), one request before compiling has paid."""
    run_at = interpolate(run_seconds)
    saving = run_at(min(g for g in gears if g >= length)) - run_at(length)
    return math.inf if saving <= 0 else math.floor(build_seconds / saving)


def break_even_stub(length, gears, run_seconds, build_seconds):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "breakeven"
REFERENCE = break_even
WRONG = [(break_even_runs, 0, "1 build = N runs"), (break_even_strict, 1, "at a tie"),
         (break_even_floor, 0, "rounded down")]
STUB = break_even_stub
