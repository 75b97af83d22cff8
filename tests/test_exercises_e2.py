"""The third exercise of notebook 04 (selection): its truth is fusionlab.timing's verdict on the paired ratios, its
cases are the corners they name, and its hint names a mistake only where the answer really follows it (the generic
reference / wrong / stub tests are in tests/test_exercises.py)."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

from fusionlab import load, timing, zoo
from fusionlab.exercises import core, selection
from fusionlab.passes import fuse, plan
from fusionlab.passes import select as sel
from fusionlab.passes.prepare import prepare

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # solutions/ sits at the repository root
from solutions import selection as s_selection  # noqa: E402

SETS = [c.data for c in selection.CASES] + list(selection.PROBES)


def _case(words: str) -> selection.Samples:
    return next(c.data for c in selection.CASES if words in c.name)


def test_truth_is_the_verdict_on_the_median_of_the_paired_ratios():
    for s in SETS:
        ratios = [u / f for u, f in zip(s.unfused, s.fused)]
        _, lo, hi = timing.median_ci(ratios)  # computed here from the ratios, not through Comparison
        assert selection.expected(s) == (timing.ratio_verdict(lo, hi) == "faster")
        assert s_selection.keep(list(s.unfused), list(s.fused)) == selection.expected(s)


def test_no_verdict_hinges_on_how_the_interval_is_rounded():
    for s in SETS:
        c = selection.comparison(s)
        raw = "faster" if c.ci_low > 1 else "slower" if c.ci_high < 1 else "no clear difference"
        assert raw == timing.ratio_verdict(c.ci_low, c.ci_high)
        assert min(abs(c.ci_low - 1), abs(c.ci_high - 1)) > 0.005


def test_the_cases_are_the_corners_they_name():
    said = {c.name: timing.ratio_verdict(selection.comparison(c.data).ci_low, selection.comparison(c.data).ci_high)
            for c in selection.CASES}
    assert list(said.values())[:2] == ["faster", "slower"]
    noise = selection.comparison(_case("within the noise"))
    assert noise.speedup > 1 and noise.ci_low < 1 < noise.ci_high
    tiny = _case("five rounds")
    assert len(tiny.unfused) < 6 and statistics.median(tiny.unfused) > statistics.median(tiny.fused)
    assert not selection.expected(tiny) and selection._normal_low(tiny) > 1  # a normal interval would keep it
    busy = _case("busy half-way")
    assert statistics.median(busy.fused) > statistics.median(busy.unfused) and selection.expected(busy)
    assert sum(u > f for u, f in zip(busy.unfused, busy.fused)) == 28
    stall = _case("a stall")
    assert statistics.fmean(stall.fused) > statistics.fmean(stall.unfused) and selection.expected(stall)
    small = selection.comparison(_case("a small gain"))
    assert 1 < small.ci_low < 1.05 and said[selection.CASES[-1].name] == "faster"


def test_each_mistake_decides_its_own_way_and_is_wrong_on_some_case():
    truth = [selection.expected(c.data) for c in selection.CASES]
    signatures = [tuple(decide(s) for s in SETS) for decide, _ in selection._MISTAKES]
    assert len(set(signatures)) == len(signatures)  # the probe separates the two that agree on every case
    for sig, (_, words) in zip(signatures, selection._MISTAKES):
        assert list(sig[:len(truth)]) != truth, words


def test_a_mistake_is_named_only_when_the_answer_follows_it_everywhere():
    last = selection.CASES[-1].data

    def median_but_not_on_the_last_case(unfused, fused):  # the median rule where the hint's case fails, not everywhere
        alone = s_selection.keep_median(unfused, fused)
        return (not alone) if tuple(unfused) == last.unfused else alone

    v = selection.check(median_but_not_on_the_last_case)
    assert v.status == core.FAIL and v.passed == 2 and "that is" not in v.hint and "no clear difference" in v.hint
    v = selection.check(s_selection.keep_median)
    assert "the median ratio alone" in v.hint and "upper end" not in v.hint


def test_the_wrong_way_round_fails_on_the_first_case():
    v = selection.check(lambda unfused, fused: timing.ratio_verdict(*_ci(fused, unfused)) == "faster")
    assert v.status == core.FAIL and v.passed == 0 and "the wrong way round" in v.hint


def _ci(a, b):
    c = timing.Comparison.from_samples(a, b)
    return c.ci_low, c.ci_high


def test_the_answer_gets_its_own_copies_and_must_return_a_bool():
    def sorts_in_place(unfused, fused):  # sorting each list in place breaks the pairing, and must not reach the truth
        unfused.sort()
        fused.sort()
        return s_selection.keep(unfused, fused)

    selection.check(sorts_in_place)
    assert selection.check(s_selection.keep).ok
    v = selection.check(lambda unfused, fused: "faster")
    assert v.status == core.FAIL and "True or False" in v.hint


def test_verdicts_print_the_same_every_time_and_within_110_characters():
    for answer in (s_selection.keep, s_selection.keep_unpaired, s_selection.keep_normal, s_selection.keep_stub):
        first, again = str(selection.check(answer)), str(selection.check(answer))
        assert first == again and all(len(line) <= 110 for line in first.splitlines())


def test_select_itself_keeps_on_the_median_as_the_hint_and_the_notebook_say(monkeypatch):
    """The hint calls the median alone 'what select itself tests', and §3 of notebook 04 says select keeps a group
    whose median ratio is above 1: a measurement within the noise, median above 1, is kept by select."""
    noise = _case("within the noise")
    monkeypatch.setattr(sel, "_measure", lambda *a, **k: selection.comparison(noise))
    g = load(zoo.bert(layers=1, hidden=32, heads=2, intermediate=64, vocab=50))
    prepare(g)
    part = plan(g, ("vertical",), prepare=False)
    chosen, trials = sel.select(g, part)
    assert trials and all(t.kept for t in trials) and len(chosen) == len(part)
    assert not selection.expected(noise)


@pytest.mark.parametrize("answer", [s_selection.keep_median, s_selection.keep_unpaired, s_selection.keep_normal,
                                    s_selection.keep_margin])
def test_the_planted_mistakes_are_named_in_their_hint(answer):
    v = selection.check(answer)
    assert v.status == core.FAIL and ": that is " in v.hint
