"""The verification oracle must catch wrong rewrites and accept right ones."""

import numpy as np
import pytest
from onnx import helper

from fusionlab.build import make_model, tensor, value_info
from fusionlab.verification.runtime import make_feeds, random_sources, run, session, verify


def scale_model(k=2.0, dtype=np.float32, out_name="y"):
    nodes = [helper.make_node("Mul", ["x", "k"], [out_name])]
    return make_model(nodes, [value_info("x", dtype, ["batch", 4])], [value_info(out_name, dtype, ["batch", 4])],
                      [tensor("k", np.array([k], dtype=dtype))])


def test_verify_accepts_equal_and_rejects_different():
    good = verify(scale_model(2.0), scale_model(2.0))
    assert good.ok and good.max_abs == 0.0
    bad = verify(scale_model(2.0), scale_model(2.001))
    assert not bad.ok
    assert "NOT equivalent" in bad.table()


def test_verify_tolerance_is_per_dtype_and_overridable():
    # a relative change of 5e-5 is inside fp32's rtol 1e-4 but outside fp64's 1e-7
    assert verify(scale_model(2.0), scale_model(2.0001)).ok
    assert not verify(scale_model(2.0, np.float64), scale_model(2.0001, np.float64)).ok
    assert not verify(scale_model(2.0), scale_model(2.0001), rtol=1e-6, atol=0).ok


def test_verify_reports_missing_output():
    report = verify(scale_model(2.0), scale_model(2.0, out_name="z"))
    assert not report.ok and report.outputs[0].problem == "output missing"


def test_nan_positions_must_match():
    nodes = [helper.make_node("Log", ["x"], ["y"])]  # log of negative numbers -> NaN
    m = make_model(nodes, [value_info("x", shape=[16])], [value_info("y", shape=[16])])
    nodes2 = [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Log", ["a"], ["y"])]
    m2 = make_model(nodes2, [value_info("x", shape=[16])], [value_info("y", shape=[16])])
    assert verify(m, m).ok  # NaN == NaN at the same places
    report = verify(m, m2)
    assert not report.ok and "NaN" in report.outputs[0].problem


def test_feeds_respect_dtypes_dims_ids_and_masks():
    vocab = 11
    nodes = [
        helper.make_node("Gather", ["emb", "input_ids"], ["e"]),
        helper.make_node("Cast", ["attention_mask"], ["m"], to=1),
        helper.make_node("Unsqueeze", ["m", "axes"], ["m3"]),
        helper.make_node("Mul", ["e", "m3"], ["y"]),
    ]
    m = make_model(nodes, [value_info("input_ids", np.int64, ["batch", "sequence"]),
                           value_info("attention_mask", np.int64, ["batch", "sequence"])],
                   [value_info("y", shape=["batch", "sequence", 4])],
                   [tensor("emb", np.ones((vocab, 4), np.float32)), tensor("axes", np.array([2], np.int64))])
    feeds = make_feeds(m, seed=3, dims={"batch": 2, "sequence": 5})
    assert feeds["input_ids"].shape == (2, 5) and feeds["input_ids"].dtype == np.int64
    assert feeds["input_ids"].min() >= 0 and feeds["input_ids"].max() < vocab
    assert np.all(feeds["attention_mask"] == 1)
    out = run(m, feeds)
    assert out["y"].shape == (2, 5, 4)
    again = make_feeds(m, seed=3, dims={"batch": 2, "sequence": 5})
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)


def test_unknown_level_is_refused():
    with pytest.raises(ValueError, match="optimisation level"):
        session(scale_model(), level="turbo")


def test_a_model_that_cannot_run_gives_a_model_error():
    from fusionlab.graph import ModelError

    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    m = make_model(nodes, [value_info("x", shape=["n", "k"])], [value_info("y", shape=["n", 5])],
                   [tensor("w", np.ones((4, 5), np.float32))])  # 3 != 4: fails at run time only
    with pytest.raises(ModelError, match="failed to run"):
        run(m, {"x": np.ones((2, 3), np.float32)})


def test_atol_scales_with_output_magnitude_only_when_asked():
    # outputs of magnitude ~100: a 5e-5 difference is fp32 rounding (5e-7 relative to the scale)
    nodes = [helper.make_node("Mul", ["x", "k"], ["y"]), helper.make_node("Add", ["y", "c"], ["z"])]

    def model(c):
        return make_model(nodes, [value_info("x", shape=[64])], [value_info("z", shape=[64])],
                          [tensor("k", np.float32([100.0])), tensor("c", np.float32([c]))])

    feeds = {"x": np.concatenate([np.zeros(8, np.float32), np.linspace(-1, 1, 56, dtype=np.float32)])}
    shifted = model(5e-5)
    assert verify(model(0.0), shifted, feeds=feeds).ok  # atol 1e-5 x max|z| = 1e-3
    strict = verify(model(0.0), shifted, feeds=feeds, scale_atol=False)
    assert not strict.ok  # at the zeros, 5e-5 > 1e-5
    assert strict.outputs[0].atol == 1e-5 and verify(model(0.0), shifted, feeds=feeds).outputs[0].atol == pytest.approx(1e-3)
    # for outputs of order 1 nothing changes
    small = verify(scale_model(2.0), scale_model(2.0), feeds={"x": np.full((1, 4), 0.25, np.float32)})
    assert small.outputs[0].atol == 1e-5


def test_a_nondeterministic_original_is_named_not_blamed_on_the_rewrite():
    nodes = [helper.make_node("Dropout", ["x", "ratio", "train"], ["y"])]  # training mode: a random mask per run
    m = make_model(nodes, [value_info("x", shape=[64])], [value_info("y", shape=[64])],
                   [tensor("ratio", np.float32(0.5)), tensor("train", np.bool_(True))])
    report = verify(m, m)
    assert not report.ok
    assert "nondeterministic" in report.outputs[0].problem
    # a deterministic mismatch is still reported as a plain tolerance failure
    bad = verify(scale_model(2.0), scale_model(2.5))
    assert bad.outputs[0].problem == "outside tolerance"


def test_random_sources_are_found_statically():
    """Outputs downstream of a training-mode Dropout or a random op are named; inference Dropout is not."""
    nodes = [
        helper.make_node("Dropout", ["x", "ratio", "train"], ["d1"], name="train_drop"),
        helper.make_node("Relu", ["d1"], ["y1"]),
        helper.make_node("Dropout", ["x", "ratio", "infer"], ["y2"], name="infer_drop"),
        helper.make_node("Dropout", ["x", "zero", "train"], ["y3"], name="zero_ratio"),
        helper.make_node("Dropout", ["x", "ratio", "mode"], ["y4"], name="fed_mode"),
        helper.make_node("RandomUniformLike", ["x"], ["r"], name="noise"),
        helper.make_node("Add", ["x", "r"], ["y5"]),
    ]
    m = make_model(nodes, [value_info("x", shape=[64]), value_info("mode", np.bool_, shape=[])],
                   [value_info(n, shape=[64]) for n in ("y1", "y2", "y3", "y4", "y5")],
                   [tensor("ratio", np.float32(0.5)), tensor("zero", np.float32(0.0)),
                    tensor("train", np.bool_(True)), tensor("infer", np.bool_(False))])
    assert random_sources(m) == {"y1": ["train_drop"], "y4": ["fed_mode"], "y5": ["noise"]}


def test_a_tiny_random_output_is_still_recognised_as_nondeterministic():
    """Regression (peer corpus dropout_ratio.onnx, a 2x1 tensor): one extra run of the original often
    draws the same mask, so the run-to-run check alone was flaky; the static check is not."""
    nodes = [helper.make_node("Dropout", ["x", "ratio", "train"], ["y"])]
    m = make_model(nodes, [value_info("x", shape=[2, 1]), value_info("ratio", shape=[])],
                   [value_info("y", shape=[2, 1])], [tensor("train", np.bool_(True))])
    feeds = {"x": np.ones((2, 1), np.float32), "ratio": np.array(0.3, np.float32)}
    for seed in range(20):
        report = verify(m, m, feeds=feeds, seed=seed)
        assert report.ok or "nondeterministic (depends on random op" in report.outputs[0].problem


def test_random_sources_are_found_in_every_form_of_model(tmp_path):
    """The static check must work for a path, bytes, a Graph and a ModelProto alike (it once returned {} for all
    but the proto, because of a keyword onnx.load_from_string does not take)."""
    from onnx import helper as oh

    from fusionlab import load
    from fusionlab.build import make_model, tensor, value_info
    from fusionlab.verification.runtime import random_sources

    m = make_model([oh.make_node("Dropout", ["x", "r", "t"], ["y"], name="drop")], [value_info("x", shape=[2, 3])],
                   [value_info("y", shape=[2, 3])], [tensor("r", np.array(0.5, np.float32)), tensor("t", np.array(True))],
                   opset=13)
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    for form in (m, m.SerializeToString(), path, str(path), load(m)):
        assert random_sources(form) == {"y": ["drop"]}, type(form)


def _threshold_model(threshold: float | None):
    """y = x + 0, or (with a threshold) y = x + 1 wherever max(x) > threshold: wrong only on some draws."""
    if threshold is None:
        nodes = [helper.make_node("Add", ["x", "zero"], ["y"])]
        inits = [tensor("zero", np.array([0.0], np.float32))]
    else:
        nodes = [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=1),
                 helper.make_node("Greater", ["m", "t"], ["big"]),
                 helper.make_node("Add", ["x", "one"], ["x1"]),
                 helper.make_node("Where", ["big", "x1", "x"], ["y"])]
        inits = [tensor("t", np.array([threshold], np.float32)), tensor("one", np.array([1.0], np.float32))]
    return make_model(nodes, [value_info("x", shape=[1, 8])], [value_info("y", shape=[1, 8])], inits)


def test_several_draws_catch_a_rewrite_that_is_wrong_only_on_some_inputs():
    original = _threshold_model(None)
    peaks = [float(make_feeds(original, seed=k)["x"].max()) for k in range(3)]
    assert peaks[1] > peaks[0] or peaks[2] > peaks[0]  # the draws differ
    # wrong exactly where max(x) exceeds draw 0's peak: draw 0 cannot see it
    wrong = _threshold_model(peaks[0])
    one = verify(original, wrong, draws=1)
    assert one.ok and one.draws == 1 and "on 1 input draw" in one.table()
    three = verify(original, wrong)
    assert three.draws == 3 and not three.ok
    assert three.outputs[0].draw == (1 if peaks[1] > peaks[0] else 2)
    assert "NOT equivalent on 3 input draws" in three.summary()


def _fp16_layernorm(decomposed: bool, scale: float = 1.0):
    """LayerNormalization(x + 100) in float16, as the op or (decomposed) as ReduceMean/Sub/Mul/Sqrt/Div.

    onnxruntime runs float16 LayerNormalization natively, so the original stores x + 100 in float16
    (ulp 0.0625 against x's spread 0.05) and is far from the float32 result; the decomposed ops it runs
    in float32 throughout, which the float32 reference shows to be the more accurate of the two.
    """
    f16 = np.float16
    if decomposed:
        nodes = [helper.make_node("Add", ["x", "c"], ["s"]),
                 helper.make_node("ReduceMean", ["s"], ["mu"], axes=[-1]), helper.make_node("Sub", ["s", "mu"], ["d"]),
                 helper.make_node("Mul", ["d", "d"], ["d2"]), helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1]),
                 helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
                 helper.make_node("Div", ["d", "sd"], ["n"]), helper.make_node("Mul", ["n", "g"], ["y"])]
    else:
        nodes = [helper.make_node("Add", ["x", "c"], ["s"]), helper.make_node("LayerNormalization", ["s", "g"], ["y"])]
    inits = [tensor("c", np.array([100.0], f16)), tensor("g", np.full(256, scale, f16)),
             tensor("eps", np.array([1e-5], f16))][:3 if decomposed else 2]
    return make_model(nodes, [value_info("x", f16, [4, 256])], [value_info("y", f16, [4, 256])], inits, opset=17)


def test_fp16_outputs_are_judged_against_a_float32_run_too():
    # the decomposed LayerNorm differs from the fp16 op beyond the tolerance, and is closer to float32
    feeds = {"x": (np.random.default_rng(0).standard_normal((4, 256)) * 0.05).astype(np.float16)}
    report = verify(_fp16_layernorm(False), _fp16_layernorm(True), feeds=feeds)
    check = report.outputs[0]
    assert report.ok and check.accepted_by_reference and report.reference.startswith("float32")
    assert check.max_abs > 0.1 and check.fused_vs_reference < check.original_vs_reference / 2
    assert "as accurate" in report.table()
    # a changed function is not rescued: a gamma of 1.01 is further from the float32 run than the original
    wrong = verify(_fp16_layernorm(False), _fp16_layernorm(True, 1.01), feeds=feeds)
    assert not wrong.ok and not wrong.outputs[0].accepted_by_reference
    # without the reference the first comparison fails: the tolerance alone cannot tell them apart
    assert not verify(_fp16_layernorm(False), _fp16_layernorm(True), feeds=feeds, reference="never").ok
    # float32 outputs get no reference run unless asked
    assert verify(scale_model(2.0), scale_model(2.0)).reference == ""
    assert verify(scale_model(2.0), scale_model(2.0), reference="always").outputs[0].fused_vs_reference == 0.0
    with pytest.raises(ValueError, match="reference"):
        verify(scale_model(2.0), scale_model(2.0), reference="fp32")
