"""Notebook 01's third exercise, `tanhhelper`: its truth is onnxruntime's Tanh, the generator's own helper passes,
an answer calling the library's tanh is refused, and near misses fail."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
from numpy import tanh as imported_tanh

from fusionlab.exercises import core, tanhhelper
from fusionlab.lessons import codegen
from fusionlab.verification.runtime import run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # solutions/ sits at the repository root
from solutions import tanhhelper as s_tanh  # noqa: E402


def test_truth_is_onnxruntime_and_the_overflow_cases_hold_what_their_names_say():
    """onnxruntime's Tanh agrees with float64 tanh on every hidden input; the overflow cases really overflow
    e^(2x) (case 3) and e^|x| (case 4), in both signs."""
    for case in tanhhelper.CASES:
        x = case.data.array()
        want = run(tanhhelper.tanh_model(x.shape), {"x": x})["y"]
        ref = np.tanh(x.astype(np.float64))
        assert np.allclose(want, ref, rtol=1e-6, atol=1e-7, equal_nan=True), case.name
    over2x, overx = (tanhhelper.CASES[i].data.array() for i in (2, 3))
    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(2 * over2x)).any() and np.isfinite(np.exp(np.abs(over2x))).all()
        assert np.isinf(np.exp(np.abs(overx))).all()
    assert (over2x > 0).any() and (over2x < 0).any() and (overx > 0).any() and (overx < 0).any()
    special = tanhhelper.CASES[4].data.array()
    assert np.isnan(special).any() and np.isposinf(special).any() and np.isneginf(special).any()


def test_the_generators_own_tanh_helper_passes():
    """codegen's float32 Tanh kernel (the helper §5 prints) passes the checker: the exercise asks for what the
    generator does."""
    kernels = {c.data.shape: codegen.fuse_elementwise([("Tanh",)], shape=c.data.shape) for c in tanhhelper.CASES}
    assert tanhhelper.check(lambda x: kernels[x.shape](x)).ok


def test_an_answer_that_calls_the_library_tanh_is_refused():
    v = tanhhelper.check(lambda x: np.tanh(x))
    assert v.status == core.FAIL and v.passed == 0 and "calls the library's tanh" in v.hint

    def nested(x):
        def inner(v):
            return math.tanh(v)
        return np.array([inner(float(v)) for v in x.ravel()]).reshape(x.shape)

    assert "calls the library's tanh" in tanhhelper.check(nested).hint
    assert "calls the library's tanh" in tanhhelper.check(lambda x: imported_tanh(x)).hint
    assert tanhhelper.check(lambda x: s_tanh.tanh(x)).ok  # another module's function named tanh is not the library's
    v = tanhhelper.check(np.vectorize(math.tanh))
    assert v.status == core.FAIL and "np.vectorize" in v.hint


def test_near_misses_fail():
    # the textbook form flipped to e^(-2x): overflows for large negative x (case 3 holds both signs)
    def flipped(x):
        e = np.exp(-2 * x)
        return (1 - e) / (1 + e)

    v = tanhhelper.check(flipped)
    assert v.status == core.FAIL and v.passed == 2 and "overflows" in v.hint
    # a clamp at +-4, where tanh is 0.99933 and not yet 1 within 1e-4
    v = tanhhelper.check(lambda x: s_tanh.tanh(np.clip(x, -4.0, 4.0)))
    assert v.status == core.FAIL and v.passed == 1
    # flattened output, a scalar, a NaN dropped by the clamp (np.nan_to_num)
    assert "keeps the input's shape" in tanhhelper.check(lambda x: s_tanh.tanh(x).ravel()).hint
    assert "one number" in tanhhelper.check(lambda x: 0.0).hint
    v = tanhhelper.check(lambda x: s_tanh.tanh(np.nan_to_num(x)))
    assert v.status == core.FAIL and v.passed == 4 and "NaN must stay NaN" in v.hint


def test_verdicts_print_the_same_every_time_and_within_110_characters():
    answers = (s_tanh.tanh, s_tanh.tanh_textbook, s_tanh.tanh_sinh_cosh, s_tanh.tanh_scalar_branch)
    first = [str(tanhhelper.check(a)) for a in answers]
    assert first == [str(tanhhelper.check(a)) for a in answers]
    assert all(len(line) <= 110 for text in first for line in text.splitlines())
