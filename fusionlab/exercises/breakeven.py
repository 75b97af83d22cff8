"""Exercise: after how many requests compiling a shape of its own pays (notebook 21).

The learner writes ``break_even(length, gears, run_seconds, build_seconds) -> int``: requests of one `length` keep
arriving and the model of their gear (the smallest gear that holds them) is compiled already. Compiling the exact
shape costs one build and then a run at `length` per request; padding costs a run at the gear per request. The answer
is the fewest requests for which compiling costs no more in total than padding, or ``math.inf`` when it never does.
`run_seconds` is {length: seconds} measured at a few lengths (interpolated linearly, as §1's `run_static` is read),
`build_seconds` the time of one compile. `check(break_even)` grades it against `fusionlab.lessons.dynamic_shapes.replay`
of the same requests under the "exact" and the "gears" policy (the gear's build not charged), and names the likely
mistake: the build counted in runs at the length (§1's "1 build = N runs"), a tie that does not pay yet, a count
rounded down, the run time of the nearest measured length instead of the interpolated one (both, where a case's
count cannot tell the two apart).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..lessons.dynamic_shapes import gear_for, interpolate, replay
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "expected"]

EXERCISE = "when compiling a shape pays"
TASK = "break_even(length, gears, run_seconds, build_seconds)"
POW2 = (64, 128, 256, 512)
#: run times at a grid of lengths, of the size §1 measures for BERT-tiny on one thread (an input, not an answer)
GRID_RUNS = {8: 0.35e-3, 16: 0.4e-3, 32: 0.55e-3, 64: 1.0e-3, 128: 1.6e-3, 256: 4.0e-3, 512: 9.0e-3}


@dataclass(frozen=True)
class BreakEvenCase:
    length: int
    gears: tuple[int, ...]
    run_seconds: tuple[tuple[int, float], ...]  # {length: seconds}, frozen
    build_seconds: float

    def args(self):
        return self.length, list(self.gears), dict(self.run_seconds), self.build_seconds


def _case(length, gears, runs, build) -> BreakEvenCase:
    return BreakEvenCase(length, tuple(gears), tuple(sorted(runs.items())), build)


CASES = (
    Case("65 tokens on gears 64/128/256/512, runs measured at 8-512 tokens",
         _case(65, POW2, GRID_RUNS, 0.05)),
    Case("a tie: 4 requests at 100 tokens save exactly one build", _case(100, (128,), {100: 0.25, 128: 0.5}, 1.0)),
    Case("a length equal to its gear (128): nothing to save", _case(128, POW2, GRID_RUNS, 0.05)),
    Case("the gear measured faster than the length (noise): padding costs nothing",
         _case(96, POW2, {64: 1.0e-3, 96: 2.0e-3, 128: 1.9e-3}, 0.05)),
    Case("a slow compile: 2 s against a few ms saved per request, 300 tokens", _case(300, POW2, GRID_RUNS, 2.0)),
    Case("gears given out of order (512, 128, 256, 64), 130 tokens", _case(130, (512, 128, 256, 64), GRID_RUNS, 0.05)),
)


def _replays(c: BreakEvenCase, n: int):
    """(compile the exact shape, pad to the gear) for `n` requests: the lesson's replay under each policy."""
    runs, stream = dict(c.run_seconds), [c.length] * n
    return (replay(stream, "exact", run_seconds=runs, build_seconds=c.build_seconds),
            replay(stream, "gears", gears=c.gears, run_seconds=runs))  # the gear's model is compiled already


def _totals(c: BreakEvenCase, n: int) -> tuple[float, float]:
    own, padded = _replays(c, n)
    return own.total_seconds, padded.total_seconds


def expected(c: BreakEvenCase) -> float:
    """The fewest requests for which compiling costs no more than padding (by replay), or math.inf."""
    own, padded = _replays(c, 1)
    if padded.run_seconds <= own.run_seconds:  # no time saved per request: compiling never pays
        return math.inf
    hi = 1
    while (lambda t: t[0] > t[1])(_totals(c, hi)):
        hi *= 2
    lo = hi // 2  # does not pay at lo (or lo == 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        own, padded = _totals(c, mid)
        lo, hi = (lo, mid) if own <= padded else (mid, hi)
    return hi


def _mistakes(c: BreakEvenCase, want: float) -> list[tuple[float, str, str]]:
    """(the count a mistake gives, the mistake, what is right instead), the commonest first."""
    runs = dict(c.run_seconds)
    at = interpolate(runs)
    gear = gear_for(c.length, c.gears)
    nearest = runs[min(runs, key=lambda x: (abs(x - c.length), x))]
    out = []
    if math.isfinite(want):
        out += [(want + 1, "one request too many", "at a tie compiling costs no more, so it already pays"),
                (want - 1, "one request too few (a count rounded down?)",
                 "with that many compiling still costs more, so round the count up")]
    out.append((math.ceil(c.build_seconds / at(c.length)), "the build in runs at the length (§1's '1 build = N runs')",
                "a compilation pays back only what padding costs per request, the run at the gear minus the run at "
                "the length"))
    if at(gear) > nearest:
        out.append((math.ceil(c.build_seconds / (at(gear) - nearest)), "the run time of the nearest measured length",
                    "interpolate between the measured points"))
    first_fit = next(g for g in c.gears if g >= c.length)
    if first_fit != gear and at(first_fit) > at(c.length):
        out.append((math.ceil(c.build_seconds / (at(first_fit) - at(c.length))),
                    "the first gear that fits in the order given", "a request runs on the smallest gear that holds it"))
    return out


def _judge(break_even, case: Case) -> str | None:
    c: BreakEvenCase = case.data
    got = attempt(break_even, *c.args())
    want = expected(c)
    if got is None and case is not CASES[0] and not math.isfinite(want):
        return "you return None: when compiling never pays, return math.inf"
    if is_stub(got):
        raise NotAnswered
    if isinstance(got, (bool, np.bool_)) or not isinstance(got, (int, float, np.integer, np.floating)) or not (
            math.isinf(got) or float(got).is_integer()):
        raise AnswerRaised(f"break_even must return a whole number of requests or math.inf, got {got!r:.40}")
    if got == want:
        return None
    if not math.isfinite(want):
        return (f"you say {int(got) if math.isfinite(got) else got}; padding to gear "
                f"{gear_for(c.length, c.gears)} costs no time per request here, so compiling never pays: math.inf")
    if not math.isfinite(got):
        return f"you say never; compiling pays after {want} requests"
    said = [(mistake, fix) for value, mistake, fix in _mistakes(c, want) if value != want and value == got]
    if len(said) > 1:  # two mistakes give this count here: name both, as the one this case cannot tell apart
        said = [(" or ".join(m for m, _ in said), "; or ".join(f for _, f in said))]
    return (f"you say {int(got)} requests, {'too many' if got > want else 'too few'}; compiling pays after "
            f"{want}" + (f": that is {said[0][0]}: {said[0][1]}" if said else ""))


def check(break_even) -> Verdict:
    """Grade `break_even(length, gears, run_seconds, build_seconds)` on the hidden cases."""
    return grade(EXERCISE, break_even, CASES, _judge, task=TASK,
                 checked="Each case: your count against the fewest requests for which dynamic_shapes.replay totals "
                         "the 'exact' policy at no more than the 'gears' one.")
