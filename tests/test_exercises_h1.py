"""The exercises of notebooks 00 (bnaffine; levels in test_exercises_f1.py) and 01 (hardswish): where their truth comes from, and that
answers a little off, or right only away from the hard corners, fail."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from fusionlab.exercises import bnaffine, core, hardswish
from fusionlab.lessons import codegen
from fusionlab.verification.runtime import run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # solutions/ sits at the repository root
from solutions import bnaffine as s_bnaffine  # noqa: E402
from solutions import hardswish as s_hardswish  # noqa: E402


def test_bnaffine_checks_against_onnxruntime_not_the_formula():
    """A scale 1e-3 off fails on the first case; the planted eps mistake passes until a variance is 0."""
    def slightly_off(gamma, beta, mean, var, eps):
        scale, shift = s_bnaffine.bn_affine(gamma, beta, mean, var, eps)
        return scale * np.float32(1.001), shift

    v = bnaffine.check(slightly_off)
    assert v.status == core.FAIL and v.passed == 0 and "onnxruntime's BatchNormalization" in v.hint
    zero = bnaffine.CASES[2].data
    assert zero.zero_var and np.any(zero.arrays()[3] == 0)
    v = bnaffine.check(s_bnaffine.bn_affine_no_eps)
    assert v.passed == 2 and "not finite" in v.hint


def test_bnaffine_reference_against_onnxruntime_on_notebook_00s_statistics():
    """The reference applied to a BatchNormalization of the notebook's kind matches onnxruntime at fp32 tolerance."""
    case = bnaffine.CASES[0].data
    gamma, beta, mean, var, x = case.arrays()
    scale, shift = s_bnaffine.bn_affine(gamma, beta, mean, var, case.eps)
    want = run(bnaffine.bn_model(case, gamma, beta, mean, var), {"x": x})["y"]
    assert np.allclose(x * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1), want, rtol=1e-4, atol=1e-5)


def test_hardswish_truth_is_onnxruntime_and_other_arrangements_pass():
    x = np.float32([-4.0, -3.0, -1.5, 0.0, 1.5, 3.0, 4.0])
    want = run(hardswish.hardswish_model(x.shape), {"x": x})["y"]
    assert np.allclose(want, x * np.clip(x + 3, 0, 6) / 6, rtol=1e-6, atol=0)
    kernel = codegen.fuse_elementwise(s_hardswish.HARD_SWISH, shape=x.shape)
    assert np.allclose(kernel(x), want, rtol=1e-6, atol=1e-7)
    assert hardswish.check([("Div", 6.0), ("Add", 0.5), ("Clip", 0.0, 1.0), ("Mul", "x")]).ok


def test_hardswish_fails_an_approximate_constant_and_an_unsupported_op_in_one_line():
    v = hardswish.check([("Add", 3.0), ("Clip", 0.0, 6.0), ("Mul", "x"), ("Mul", 0.1666)])
    assert v.status == core.FAIL and v.passed == 0 and "onnxruntime's HardSwish" in v.hint
    v = hardswish.check([("HardSwish",)])
    assert v.status == core.FAIL and "unsupported op 'HardSwish'" in v.hint and "\n" not in v.hint
    v = hardswish.check([("Add", 3.0), ("Clip", 0.0, 6.0), ("Mul", "z"), ("Div", 6.0)])
    assert v.status == core.FAIL and "inputs other than x (z)" in v.hint


def test_verdicts_print_the_same_every_time_and_within_110_characters():
    pairs = ((bnaffine, s_bnaffine.bn_affine_no_eps),
             (bnaffine, s_bnaffine.bn_affine_shift_by_gamma), (hardswish, s_hardswish.NO_CLIP),
             (hardswish, s_hardswish.NO_MUL_X))
    first = [str(m.check(a)) for m, a in pairs]
    assert first == [str(m.check(a)) for m, a in pairs]
    assert all(len(line) <= 110 for text in first for line in text.splitlines())
