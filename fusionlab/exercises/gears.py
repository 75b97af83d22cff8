"""Exercise: the compute that padding to shape gears wastes (notebook 20).

The learner writes ``padded_waste(lengths, gears) -> float``: each request of a stream is padded up to the smallest
gear that holds it (§1's rule), and the waste is the tokens computed over the tokens asked for, over the whole
stream (§3's measure: 1.0 means no padding). `check(padded_waste)` grades it on hidden streams and gear sets against
`fusionlab.lessons.dynamic_shapes.replay(lengths, "gears", gears=...).waste`, and names the likely mistake: the
nearest gear (below the length for a 65-token request), the next gear even when a length equals one, the first
gear that fits in the order given, the mean of per-request ratios, or the padding alone (waste minus 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..lessons.dynamic_shapes import gears as make_gears, replay
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, first_difference, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "expected"]

EXERCISE = "the compute padding to gears wastes"
TASK = "padded_waste(lengths, gears)"
RTOL = 1e-9


@dataclass(frozen=True)
class StreamCase:
    lengths: tuple[int, ...]
    gears: tuple[int, ...]


def _lognormal(n: int, seed: int, median: float, sigma: float, lo: int, hi: int) -> tuple[int, ...]:
    """Request lengths drawn like §2's stream (seeded, rounded, clipped)."""
    rng = np.random.default_rng(seed)
    return tuple(int(v) for v in np.clip(np.round(rng.lognormal(np.log(median), sigma, n)), lo, hi))


CASES = (
    Case("six requests on gears 64/128/256/512, one of 65 tokens", StreamCase((65, 100, 30, 300, 7, 500),
                                                                              (64, 128, 256, 512))),
    Case("lengths equal to a gear: no padding at all", StreamCase((64, 128, 256, 128, 64), (64, 128, 256, 512))),
    Case("gears given out of order: 512, 64, 256, 128", StreamCase((20, 70, 130, 300, 64), (512, 64, 256, 128))),
    Case("one gear: every request padded to 512 (one static model)", StreamCase((8, 96, 200, 511), (512,))),
    Case("linear gears, dynamic_shapes.gears(512, 3, 'linear')",
         StreamCase((1, 170, 171, 172, 341, 343, 500), make_gears(512, 3, "linear"))),
    Case("2000 requests like §2's stream (log-normal, median 96), pow2 gears",
         StreamCase(_lognormal(2000, 7, 96, 0.8, 8, 512), make_gears(512, 4))),
    Case("long traffic (257-512 tokens) on gears 320/384/448/512",
         StreamCase(_lognormal(500, 8, 384, 0.25, 257, 512), (320, 384, 448, 512))),
)


def expected(c: StreamCase) -> float:
    """The lesson's replay: computed tokens / useful tokens with each request padded to its gear."""
    return replay(c.lengths, "gears", gears=c.gears).waste


def _mistakes(c: StreamCase) -> list[tuple[float, str]]:
    useful = sum(c.lengths)
    ordered = sorted(c.gears)

    def waste_of(pick) -> float:
        try:
            return sum(pick(n) for n in c.lengths) / useful
        except (StopIteration, ValueError):
            return float("nan")

    right = [next(g for g in ordered if g >= n) for n in c.lengths]
    return [
        (waste_of(lambda n: min(ordered, key=lambda g: (abs(g - n), g))),
         "the nearest gear: a request must be padded UP, to the smallest gear >= its length"),
        (waste_of(lambda n: next(g for g in ordered if g > n)),
         "the next gear above: a length equal to a gear runs on that gear (>=, not >)"),
        (waste_of(lambda n: next(g for g in c.gears if g >= n)),
         "the first gear that fits in the order given: sort the gears first"),
        (float(np.mean([g / n for g, n in zip(right, c.lengths)])),
         "the mean of each request's gear / length: the waste is all computed tokens over all useful ones"),
        (sum(right) / useful - 1, "the padding alone: computed / useful tokens is 1.0 when nothing is padded"),
        (useful / sum(right), "useful / computed: the waste is computed / useful tokens"),
    ]


def _close(a, b) -> bool:
    return first_difference(np.float64(a), np.float64(b), RTOL, 0.0) is None


def _judge(padded_waste, case: Case) -> str | None:
    c: StreamCase = case.data
    got = attempt(padded_waste, list(c.lengths), list(c.gears))
    if is_stub(got):
        raise NotAnswered
    if isinstance(got, bool) or not isinstance(got, (int, float, np.integer, np.floating)):
        raise AnswerRaised(f"padded_waste must return a number (computed / useful tokens), got {type(got).__name__}")
    want = expected(c)
    if _close(got, want):
        return None
    said = [words for value, words in _mistakes(c) if not _close(value, want) and _close(got, value)]
    word = "too high" if got > want else "too low"
    return (f"you say {float(got):.4f}, {word}; padded to these gears the stream computes {want:.4f}x the "
            f"useful tokens" + (f": that is {said[0]}" if said else ""))


def check(padded_waste) -> Verdict:
    """Grade `padded_waste(lengths, gears)` on the hidden streams."""
    return grade(EXERCISE, padded_waste, CASES, _judge, task=TASK,
                 checked="Each stream: your waste against dynamic_shapes.replay(lengths, 'gears', gears=...).waste "
                         "(computed / useful tokens).")
