"""fusionlab.exercises: each reference answer in solutions/ passes its checker, each planted wrong answer fails with
a hint naming the case it fails on, and the notebook's stub gets NOT ANSWERED YET (no traceback)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

import numpy as np
import pytest

from fusionlab.cost import devices
from fusionlab import exercises
from fusionlab.exercises import buffers, core, folding, qparams, rules, softmax, thresholds, traffic
from fusionlab.lessons.quantization import qparams as lesson_qparams, run_qdq
from fusionlab.lessons.reductions import online_softmax

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # solutions/ sits at the repository root
import solutions  # noqa: E402
from solutions import buffers as s_buffers  # noqa: E402
from solutions import folding as s_folding
from solutions import qparams as s_qparams
from solutions import rules as s_rules
from solutions import softmax as s_softmax
from solutions import thresholds as s_thresholds
from solutions import traffic as s_traffic

SOLUTIONS = solutions.modules()


def _checker(sol):
    return importlib.import_module(f"fusionlab.exercises.{sol.CHECKER}")


#: (checker module, reference answer), one per solutions module
REFERENCES = [pytest.param(_checker(s), s.REFERENCE, id=s.CHECKER) for s in SOLUTIONS]

#: (checker, planted wrong answer, the case it must fail on, words the hint must contain)
WRONG = [pytest.param(_checker(s), answer, index, words, id=f"{s.CHECKER}-{n}")
         for s in SOLUTIONS for n, (answer, index, words) in enumerate(s.WRONG)]

#: what each notebook's stub cell holds
STUBS = [pytest.param(_checker(s), s.STUB, id=s.CHECKER) for s in SOLUTIONS]


def test_every_exercise_has_its_solution_and_a_planted_wrong_answer():
    names = {m.name for m in pkgutil.iter_modules(exercises.__path__)} - {"core"}
    assert names == {s.CHECKER for s in SOLUTIONS}
    assert set(exercises.__all__) >= names  # `exercises.NAME` works after `from fusionlab import exercises`
    assert all(s.WRONG for s in SOLUTIONS)


@pytest.mark.parametrize("module, answer", REFERENCES)
def test_reference_passes(module, answer):
    v = module.check(answer)
    assert v.ok, str(v)
    assert str(v).startswith(f"PASS {module.EXERCISE}: all {len(module.CASES)} case")
    for case in module.CASES:
        assert case.name in str(v)


@pytest.mark.parametrize("module, answer, index, words", WRONG)
def test_planted_wrong_fails_naming_its_case(module, answer, index, words):
    v = module.check(answer)
    assert not v.ok and v.status == core.FAIL
    case = module.CASES[index]
    assert v.failed_case == case.name and v.passed == index
    assert f"case {index + 1} of {len(module.CASES)}: {case.name}" in str(v).replace("\n   ", " ")
    assert words in v.hint, v.hint


@pytest.mark.parametrize("module, answer", STUBS)
def test_stub_is_not_answered_yet(module, answer):
    v = module.check(answer)
    assert v.status == core.UNANSWERED and not v
    assert str(v).startswith(f"NOT ANSWERED YET {module.EXERCISE}")
    assert "Traceback" not in str(v) and "NOT ANSWERED YET" in v._repr_markdown_()


def test_an_answer_that_raises_fails_on_its_first_case_in_one_line():
    v = softmax.check(lambda m, l, acc, scores, v: 1 / 0)
    assert v.status == core.FAIL and v.passed == 0
    assert v.hint == "your answer raised ZeroDivisionError: division by zero"


def test_verdicts_print_the_same_every_time_and_within_110_characters():
    first = [str(m.check(a)) for m, a in ((folding, s_folding.fold_forgot_bias), (rules, s_rules.MaxMinClip))]
    again = [str(m.check(a)) for m, a in ((folding, s_folding.fold_forgot_bias), (rules, s_rules.MaxMinClip))]
    assert first == again
    assert all(len(line) <= 110 for text in first for line in text.splitlines())
    md = folding.check(s_folding.fold)._repr_markdown_()
    assert md.startswith("**PASS**") and "1. 3x3 Conv 4 -\\> 6 channels" in md


def test_folding_checks_against_onnxruntime_not_the_formula():
    # a fold that is off by 1e-3 relative everywhere: close to the formula, outside fp32 tolerance at the output
    def slightly_off(W, b, scale):
        w2, b2 = s_folding.fold(W, b, scale)
        return w2 * np.float32(1.001), b2

    v = folding.check(slightly_off)
    assert v.status == core.FAIL and "onnxruntime's Conv -> Mul" in v.hint


def test_rule_near_misses_hold_the_pattern():
    """A rule without legality checks fuses the near misses the rule must refuse; the engine itself refuses the
    escaping intermediates (a second consumer, a graph output), whatever the rule says, and says so in the case's
    name."""
    for case in rules.CASES:
        model, _ = rules.build_case(case.data)
        found, _, _ = rules.run_rule(s_rules.ClipAnyBound(), model)
        loose, _, _ = rules.run_rule(s_rules.AnyUpperInput(), model)
        if case.data.positive:
            assert found, case.name
        elif "engine refuses" in case.name:
            assert not found and not loose, case.name
        elif "graph input" in case.name:
            assert loose and not found, case.name
        else:
            assert found or "three inputs" in case.name, case.name


def test_rules_check_refuses_a_rule_with_the_wrong_name():
    class Renamed(s_rules.MaxMinClip):
        names = ("my_clip",)

    v = rules.check(Renamed)
    assert v.status == core.FAIL and "names = ('max_min_clip',)" in v.hint


def test_traffic_truth_is_the_cost_model_and_the_hand_count():
    assert traffic.truth() == s_traffic.ANSWER
    v = traffic.check((s_traffic.ANSWER["unfused"] * 1.005, s_traffic.ANSWER["fused"]))  # the count is exact
    assert v.status == core.FAIL and "too high" in v.hint
    v = traffic.check((s_traffic.ANSWER["unfused"] + 1, s_traffic.ANSWER["fused"]))  # one byte off
    assert v.status == core.FAIL and "off by 1 B" in v.hint


def test_thresholds_best_is_the_largest_fitting_cap():
    assert thresholds.best() == s_thresholds.ANSWER
    assert thresholds.fits(s_thresholds.ANSWER) and not thresholds.fits(s_thresholds.ANSWER + 1)
    assert thresholds.BUDGET_KB == 192.0
    v = thresholds.check(True)
    assert v.status == core.FAIL and "int >= 1" in v.hint


def test_softmax_reference_solution_matches_the_lesson_loop():
    """The reference update, driven over blocks, is the loop of fusionlab.lessons.reductions.flash_attention."""
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((3, 20)).astype(np.float32)
    v = np.eye(20, dtype=np.float32)
    got = softmax.drive(s_softmax.update, scores, v, 6)
    assert np.allclose(got, online_softmax(scores, 6), rtol=1e-5, atol=1e-6)


def test_buffers_cases_use_the_device_presets():
    assert buffers.CASES[0].data.ub == int(devices.get("Atlas 300I Pro").ub_kb * 1024)
    assert buffers.CASES[1].data.ub == int(devices.get("Atlas 800I A2").ub_kb * 1024)


def test_a_rule_that_ignores_the_second_consumer_is_kept_safe_by_the_engine():
    """The brief's classic mistake cannot fail this exercise: the engine, not the rule, refuses an intermediate read
    outside the group, and records why."""
    assert rules.check(s_rules.FirstReader).ok
    case = next(c for c in rules.CASES if "also read by" in c.name)
    model, _ = rules.build_case(case.data)
    found, _, refusals = rules.run_rule(s_rules.FirstReader(), model)
    assert not found and any("read outside the group" in r.reason for r in refusals)


def test_the_tie_case_is_a_tie_in_float32_and_onnxruntime_rounds_it_to_even():
    """The qparams tie case is exact (scale 1/64), so onnxruntime's QuantizeLinear decides it, not float error."""
    case = qparams.CASES[4].data
    s, z = lesson_qparams(case.lo, case.hi, "uint8")
    assert s == 1 / 64 and z == 64
    ratios = case.array / np.float32(s)
    assert np.all(ratios - np.floor(ratios) == 0.5)
    q, _ = run_qdq(case.array, s, z)
    assert [int(v) for v in q] == [int(np.rint(r)) + z for r in ratios]  # 2.5 -> 2, 3.5 -> 4: even
