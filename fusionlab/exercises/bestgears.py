"""Exercise: the gears that pad a stream least (notebook 20).

The learner writes ``best_gears(lengths, k) -> gears``: at most `k` sequence-length gears under which the stream of
request lengths computes the fewest tokens, each request padded up to the smallest gear that holds it (§3's waste,
with gears that know the distribution, as §3 ends by suggesting). `check(best_gears)` grades the answer by its waste,
`fusionlab.lessons.dynamic_shapes.replay(lengths, "gears", gears=answer).waste`, against the waste of the optimum
`dynamic_shapes.best_gears(lengths, k)` finds (a dynamic programme over the distinct lengths), so any optimal set
passes. It refuses more than `k` gears and a longest request no gear holds, and names the likely mistake: a top gear
above the longest request, gears at the quantiles of the lengths, the optimum of the distinct lengths each counted
once, equal steps or halvings of the longest (where they are not all request lengths, which a search might pick
too), a gear at no request's length, or else another sum minimised than the tokens computed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..lessons.dynamic_shapes import best_gears, gears as make_gears, replay, request_lengths
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "expected"]

EXERCISE = "the gears that pad a stream least"
TASK = "best_gears(lengths, k)"
RTOL = 1e-12


@dataclass(frozen=True)
class GearCase:
    lengths: tuple[int, ...]
    k: int


CASES = (
    Case("two clusters (10-30 and 100-120 tokens), two gears", GearCase((10, 20, 30, 100, 110, 120), 2)),
    Case("the longest request has 500 tokens, two gears", GearCase((100, 250, 500, 420, 130, 260), 2)),
    Case("nine requests of 20 tokens and one of 400, two gears", GearCase((20,) * 9 + (400,), 2)),
    Case("four gears for three distinct lengths: nothing need be padded", GearCase((64, 64, 200, 200, 300), 4)),
    Case("lengths 1 to 100, three gears (several sets are optimal)", GearCase(tuple(range(1, 101)), 3)),
    Case("150 requests like §2's stream, three gears",
         GearCase(tuple(int(n) for n in request_lengths(150, seed=11)), 3)),
    Case("100 long requests (257-512 tokens), three gears",
         GearCase(tuple(int(n) for n in request_lengths(100, seed=12, median=384, sigma=0.25, min_len=257)), 3)),
)


def _waste(c: GearCase, gear_set) -> float:
    return replay(c.lengths, "gears", gears=tuple(gear_set)).waste


def expected(c: GearCase) -> float:
    """The least waste any `k` gears reach: that of the lesson's `best_gears`, replayed."""
    return _waste(c, best_gears(c.lengths, c.k))


def _mistakes(c: GearCase) -> list[tuple[tuple[int, ...], str]]:
    top, k, lengths = max(c.lengths), c.k, set(c.lengths)
    out = [(tuple(sorted(set(int(np.quantile(c.lengths, (i + 1) / k, method="higher")) for i in range(k)))),
            "gears at the quantiles of the lengths: they split the requests evenly, not the padded tokens"),
           (tuple(best_gears(sorted(lengths), k)),
            "the best gears if each distinct length came once: count every request, as often as it comes")]
    # equal steps and halvings that all land on request lengths are what a search over those lengths may find too
    fixed = [(make_gears(top, k, "linear"), "equal steps up to the longest request: they ignore the distribution")]
    if top % 2 ** (k - 1) == 0 and make_gears(top, k) != fixed[0][0]:
        fixed.append((make_gears(top, k), "halvings of the longest request: they ignore the distribution"))
    elif top % 2 ** (k - 1) == 0:  # two gears: the same set either way
        fixed = [(fixed[0][0], "equal steps or halvings of the longest request: they ignore the distribution")]
    return out + [(g, words) for g, words in fixed if not set(g) <= lengths]


def _judge(answer, case: Case) -> str | None:
    c: GearCase = case.data
    got = attempt(answer, list(c.lengths), c.k)
    if is_stub(got):
        raise NotAnswered
    try:
        got = list(got)
        gear_set = sorted({int(g) for g in got if not isinstance(g, (bool, np.bool_)) and int(g) == g})
        if len(gear_set) != len(set(got)):
            raise TypeError
    except (TypeError, ValueError):
        raise AnswerRaised(f"best_gears must return whole numbers of tokens (a list or tuple), got {got!r:.60}")
    longest = max(c.lengths)
    if not gear_set or len(gear_set) > c.k:
        return f"you give {len(gear_set)} gears; the task allows at most {c.k} (each gear is a compilation)"
    if gear_set[-1] < longest:
        return (f"your top gear is {gear_set[-1]}, but the longest request has {longest} tokens: "
                f"no gear holds it, and the top gear must")
    if min(gear_set) < 1:
        return f"a gear of {min(gear_set)} tokens holds no request"
    want, waste = expected(c), _waste(c, gear_set)
    if abs(waste - want) <= RTOL * want:
        return None
    said = [words for g, words in _mistakes(c) if tuple(gear_set) == g]
    if not said and gear_set[-1] > longest:
        said = [f"a top gear above the longest request pads for nothing: lower it to {longest}"]
    if not said and not set(gear_set) <= set(c.lengths):
        said = ["an optimal gear sits at some request's length"]
    if not said:  # request lengths, the top at the longest: the sum minimised is not the tokens computed
        said = ["another set of request lengths computes fewer tokens: count every request, minimise the total"]
    return (f"your gears {'/'.join(map(str, gear_set))} compute {waste:.4f}x the useful tokens; the best "
            f"{c.k} reach {want:.4f}x: {said[0]}")


def check(best_gears) -> Verdict:
    """Grade `best_gears(lengths, k)` on the hidden streams."""
    return grade(EXERCISE, best_gears, CASES, _judge, task=TASK,
                 checked="Each stream: the waste of your gears (dynamic_shapes.replay) against that of the optimum "
                         "dynamic_shapes.best_gears finds.")
