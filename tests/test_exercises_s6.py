"""The new exercises of notebooks 20 and 21 (bestgears, breakeven): each is graded against the lesson's own function,
the truth is what the notebook's function says, and an answer slightly off fails."""

from __future__ import annotations

import math
import re
import sys
from itertools import combinations
from pathlib import Path

import pytest

from fusionlab.exercises import bestgears, breakeven, core
from fusionlab.lessons import dynamic_shapes

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # solutions/ sits at the repository root
from solutions import bestgears as s_bestgears  # noqa: E402
from solutions import breakeven as s_breakeven  # noqa: E402


# -- bestgears (20) -------------------------------------------------------------------------------------------------

def _computed(lengths, gear_set):
    return sum(dynamic_shapes.gear_for(n, gear_set) for n in lengths)


@pytest.mark.parametrize("case", bestgears.CASES, ids=lambda c: c.name[:30])
def test_bestgears_truth_is_the_least_waste_over_every_gear_set(case):
    """The optimum the checker grades against is no worse than any set of request lengths the brute force tries."""
    c = case.data
    distinct = sorted(set(c.lengths))
    k = min(c.k, len(distinct))
    brute = min(_computed(c.lengths, s + (distinct[-1],)) for s in combinations(distinct[:-1], k - 1))
    assert bestgears.expected(c) == pytest.approx(brute / sum(c.lengths), rel=1e-12)


def test_bestgears_cases_reach_the_corners_they_name():
    clusters, top500, outlier, few, uniform = (c.data for c in bestgears.CASES[:5])
    assert max(top500.lengths) == 500 and bestgears.expected(top500) < bestgears._waste(top500, (260, 512))
    assert dynamic_shapes.best_gears(outlier.lengths, outlier.k) == (20, 400)
    assert len(set(few.lengths)) < few.k and bestgears.expected(few) == 1.0
    # several optimal sets: the checker grades the waste, not the set
    best = dynamic_shapes.best_gears(uniform.lengths, uniform.k)
    other = (34, 67, 100)
    assert other != best and bestgears._waste(uniform, other) == pytest.approx(bestgears.expected(uniform), rel=1e-12)
    assert bestgears.check(lambda lengths, k: other if list(lengths) == list(range(1, 101)) else
                           s_bestgears.best_gears(lengths, k)).ok
    # the quantile mistake is really worse on the clusters
    q = s_bestgears.best_gears_quantiles(clusters.lengths, clusters.k)
    assert bestgears._waste(clusters, q) > bestgears.expected(clusters)


def test_bestgears_one_token_off_fails():
    v = bestgears.check(lambda lengths, k: [g + 1 for g in s_bestgears.best_gears(lengths, k)])
    assert v.status == core.FAIL and v.passed == 0 and "lower it to 120" in v.hint


def test_bestgears_refuses_too_many_gears_and_a_short_top_gear():
    v = bestgears.check(lambda lengths, k: sorted(set(lengths)))
    assert v.status == core.FAIL and "at most 2" in v.hint
    v = bestgears.check(lambda lengths, k: s_bestgears.best_gears(lengths, k)[:-1] + (max(lengths) - 1,))
    assert v.status == core.FAIL and "no gear holds it" in v.hint


# -- breakeven (21) -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", breakeven.CASES, ids=lambda c: c.name[:30])
def test_breakeven_truth_is_where_the_replays_cross(case):
    """At the answer compiling costs no more than padding by the lesson's replay; one request fewer, it costs more."""
    c = case.data
    want = breakeven.expected(c)
    assert want == s_breakeven.break_even(*c.args())
    if math.isinf(want):
        own, padded = breakeven._replays(c, 1000)
        assert own.total_seconds > padded.total_seconds
        return
    own, padded = breakeven._totals(c, want)
    assert own <= padded
    if want > 1:
        own, padded = breakeven._totals(c, want - 1)
        assert own > padded


def test_breakeven_tie_is_exact():
    c = breakeven.CASES[1].data
    own, padded = breakeven._totals(c, breakeven.expected(c))
    assert own == padded


def test_breakeven_one_off_fails_and_none_is_not_never():
    v = breakeven.check(lambda *a: s_breakeven.break_even(*a) + 1)
    assert v.status == core.FAIL and v.passed == 0
    v = breakeven.check(lambda *a: None if math.isinf(s_breakeven.break_even(*a)) else s_breakeven.break_even(*a))
    assert v.status == core.FAIL and "math.inf" in v.hint
    v = breakeven.check(lambda *a: 2.5)
    assert v.status == core.FAIL and "whole number" in v.hint


def test_breakeven_works_on_measured_costs_as_notebook_21_holds_them():
    """The notebook's run_static is {length: seconds} on a grid and build_median a float: the reference takes them."""
    runs = {8: 2.7e-4, 64: 1.3e-3, 128: 2.5e-3, 512: 1.2e-2}
    got = s_breakeven.break_even(65, dynamic_shapes.gears(512, 4), runs, 0.15)
    c = breakeven.BreakEvenCase(65, dynamic_shapes.gears(512, 4), tuple(runs.items()), 0.15)
    assert got == breakeven.expected(c) > 1


@pytest.mark.parametrize("module, wrong", [(bestgears, s_bestgears.best_gears_quantiles),
                                           (breakeven, s_breakeven.break_even_runs)])
def test_verdicts_print_the_same_twice_within_110_characters(module, wrong):
    first, again = str(module.check(wrong)), str(module.check(wrong))
    passed = str(module.check(getattr(sys.modules[f"solutions.{module.__name__.rsplit('.', 1)[1]}"], "REFERENCE")))
    assert first == again
    assert all(len(line) <= 110 for text in (first, passed) for line in text.splitlines())
    assert not re.search(r"0x[0-9a-f]{6,}", first)  # no object addresses


# -- hints that name a mistake only where the case can tell it (issue 21, a reader's findings) -----------------------

def _search(lengths, k, key):
    """The reference's search over request lengths (the top at the longest), minimising another sum."""
    distinct = sorted(set(lengths))
    return min((c + (distinct[-1],) for c in combinations(distinct[:-1], min(k, len(distinct)) - 1)), key=key)


def test_bestgears_another_sum_over_request_lengths_is_told_to_count_every_request():
    """Gears at request lengths with the top at the longest already sit where an optimum does: the hint says what
    else is wrong; a greedy answer whose gears happen to be halvings (25/50/100) is not told 'halvings'."""
    ratio = bestgears.check(lambda lengths, k: _search(lengths, k, lambda g: sum(
        dynamic_shapes.gear_for(n, g) / n for n in lengths)))
    assert ratio.status == core.FAIL and "count every request" in ratio.hint and "some request's" not in ratio.hint

    def greedy(lengths, k):
        distinct, chosen = sorted(set(lengths)), [max(lengths)]
        while len(chosen) < min(k, len(distinct)):
            chosen = min((sorted(chosen + [x]) for x in distinct if x not in chosen),
                         key=lambda g: _computed(lengths, g))
        return chosen

    v = bestgears.check(greedy)
    assert v.status == core.FAIL and "25/50/100" in v.hint and "halvings" not in v.hint
    halvings = bestgears.check(lambda lengths, k: dynamic_shapes.gears(max(lengths), k))
    assert halvings.status == core.FAIL and "halvings" in halvings.hint  # 60/120: 60 is no request's length


def test_breakeven_a_count_two_mistakes_give_names_both():
    """Rounding down and the nearest measured length both give 84 on case 1: the hint names both, not one."""
    def nearest(length, gears, run_seconds, build_seconds):
        runs = dict(run_seconds)
        near = runs[min(runs, key=lambda x: (abs(x - length), x))]
        saving = dynamic_shapes.interpolate(runs)(dynamic_shapes.gear_for(length, gears)) - near
        return math.inf if saving <= 0 else math.ceil(build_seconds / saving)

    v = breakeven.check(nearest)
    assert v.status == core.FAIL and v.passed == 0
    assert "rounded down" in v.hint and "nearest measured length" in v.hint
    v = breakeven.check(s_breakeven.break_even_floor)
    assert "rounded down" in v.hint and "nearest measured length" in v.hint
