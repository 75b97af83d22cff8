"""Notebook 08's exercises (issue 21, split 1): `splits` prices every cut of a chain of Adds with the cost model, and
`launchfit` finds the launch cost at which the model predicts a measured speedup; the truths are fusionlab's."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fusionlab import cost
from fusionlab.exercises import core, launchfit, splits
from fusionlab.lessons import overfusion

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # solutions/ sits at the repository root
from solutions import launchfit as s_launchfit  # noqa: E402
from solutions import splits as s_splits  # noqa: E402


def test_chain_plan_cuts_the_chain_into_consecutive_near_equal_groups():
    chain = overfusion.add_chain(7)
    assert [n.op_type for n in chain] == ["Add"] * 7
    for parts in range(1, 8):
        plan = overfusion.chain_plan(chain, parts)
        sizes = [g.size for g in plan]
        assert len(plan) == parts and sum(sizes) == 7 and max(sizes) - min(sizes) <= 1
        assert [n for g in plan for n in g.nodes] == [n.name for n in chain]
    with pytest.raises(ValueError):
        overfusion.chain_plan(chain, 8)


def test_splits_truth_is_the_cost_models_minimum_and_the_cases_disagree():
    """The answer is the argmin of plan_cost over every split; the cases are not all 1 (the curve does turn up),
    and one chain length has different answers on different presets."""
    answers = {}
    for case in splits.CASES:
        c = case.data
        chain = overfusion.add_chain(c.adds)
        lat = [cost.plan_cost(chain, overfusion.chain_plan(chain, p), c.device).latency_s for p in range(1, c.adds + 1)]
        assert splits.best(c) == lat.index(min(lat)) + 1
        answers[c] = splits.best(c)
    assert {1, 2, 3} <= set(answers.values())
    at24 = {c.device: a for c, a in answers.items() if c.adds == 24}
    assert len(set(at24.values())) > 1


def test_splits_one_part_off_fails_and_out_of_range_is_a_failure_not_a_traceback():
    for delta in (-1, 1):
        v = splits.check(lambda k, device: max(1, min(k, s_splits.best_parts(k, device) + delta)))
        assert v.status == core.FAIL
    v = splits.check(lambda k, device: 0)
    assert v.status == core.FAIL and "an int from 1 to k" in v.hint


def test_launchfit_truth_reproduces_the_measured_speedup_with_the_libraries_own_prediction():
    for case in launchfit.CASES:
        f = case.data
        want = launchfit.truth(f)
        if want is None:
            continue
        model, plan, device, measured = launchfit.inputs(f)
        got = cost.predicted_speedup(model, cost.as_launched(plan), replace(device, launch_overhead_us=want))
        assert got == pytest.approx(measured, rel=1e-9)


def test_launchfit_none_cases_have_no_launch_cost_that_fits():
    """Where the truth is None, the predicted speedup at launch costs from 0 to 1 ms never reaches the measurement."""
    nones = [c.data for c in launchfit.CASES if launchfit.truth(c.data) is None]
    assert len(nones) == 2
    for f in nones:
        model, plan, device, measured = launchfit.inputs(f)
        for us in (0.0, 1.0, 10.0, 1000.0):
            got = cost.predicted_speedup(model, cost.as_launched(plan), replace(device, launch_overhead_us=us))
            assert abs(got - measured) > 0.01


def test_launchfit_slightly_off_answer_fails():
    v = launchfit.check(lambda *a: None if s_launchfit.launch_us(*a) is None else s_launchfit.launch_us(*a) * 1.01)
    assert v.status == core.FAIL and v.passed == 0


def test_verdicts_print_the_same_every_time_and_within_110_characters():
    answers = [(splits, s_splits.best_parts), (splits, s_splits.best_parts_fit_ub),
               (splits, s_splits.best_parts_never_split), (launchfit, s_launchfit.launch_us),
               (launchfit, s_launchfit.launch_us_as_made), (launchfit, s_launchfit.launch_us_seconds)]
    first = [str(m.check(a)) for m, a in answers]
    assert first == [str(m.check(a)) for m, a in answers]
    assert all(len(line) <= 110 for text in first for line in text.splitlines())
