"""fusionlab.lessons.quantization: the QDQ arithmetic against onnxruntime's kernels and quantizer, BN before
quantizing, folds into int8 weights, the scales a residual Add meets."""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper
from onnxruntime.quantization import quant_utils

from fusionlab.analysis.derive import bn_scale_shift
from fusionlab.build import make_model, tensor, value_info
from fusionlab.lessons import quantization as quant
from fusionlab.passes import fuse
from fusionlab.verification import runtime

CANN_FACTS = Path(__file__).resolve().parents[2] / "shared" / "reference" / "cann_facts.md"


def _proto(graph) -> onnx.ModelProto:
    return onnx.load_model_from_string(runtime.model_bytes(graph))


@pytest.mark.parametrize("lo, hi", [(-1.0, 2.0), (0.0, 6.0), (-3.5, -0.5), (0.2, 0.9), (-0.01, 40.0)])
def test_qparams_are_onnxruntime_quantizers_uint8(lo, hi):
    z, s = quant_utils.compute_scale_zp(np.float32(lo), np.float32(hi), np.uint8(0), np.uint8(255))
    assert quant.qparams(lo, hi, "uint8") == (pytest.approx(float(s), rel=1e-6), int(z))


@pytest.mark.parametrize("lo, hi", [(-0.6, 0.4), (-0.1, 2.0), (0.0, 1.0)])
def test_qparams_are_onnxruntime_quantizers_int8_symmetric(lo, hi):
    qmin, qmax = quant_utils.get_qmin_qmax_for_qType(onnx.TensorProto.INT8, symmetric=True)
    z, s = quant_utils.compute_scale_zp(np.float32(lo), np.float32(hi), qmin, qmax, symmetric=True)
    assert quant.qparams(lo, hi, "int8", symmetric=True) == (pytest.approx(float(s), rel=1e-6), int(z))
    assert (int(qmin), int(qmax)) == quant.QRANGE["int8"]


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_numpy_quantize_dequantize_match_onnxruntimes_kernels(dtype):
    x = np.random.default_rng(3).uniform(-3, 3, 500).astype(np.float32)
    s, z = quant.qparams(-1.5, 2.0, dtype, symmetric=dtype == "int8")
    q = quant.quantize_array(x, s, z, dtype)
    q_ort, y_ort = quant.run_qdq(x, s, z, dtype)
    assert q.dtype == q_ort.dtype and np.array_equal(q, q_ort)
    assert np.array_equal(quant.dequantize_array(q, s, z), y_ort)
    assert q.max() == quant.QRANGE[dtype][1]  # values above the range saturated


def test_zero_is_exact_and_error_within_half_a_step():
    s, z = quant.qparams(-1.0, 2.0)
    x = np.linspace(-1, 2, 301, dtype=np.float32)
    back = quant.dequantize_array(quant.quantize_array(x, s, z), s, z)
    assert np.abs(back - x).max() <= s / 2 + 1e-6
    assert quant.dequantize_array(quant.quantize_array(np.float32(0), s, z), s, z) == 0


@pytest.mark.parametrize("seed", range(8))
def test_qlinear_matmul_matches_onnxruntimes_fused_kernel(seed):
    """With 7-bit weights (what `quantize` writes: reduce_range) onnxruntime's uint8 x int8 kernel is exact on every
    x86 CPU, so it equals the integer arithmetic to the level. With 8-bit weights it is not on a CPU without VNNI:
    AVX2's vpmaddubsw adds two uint8 x int8 products in int16 and saturates (255 * 127 * 2 > 32767); on this suite's
    machines that moved outputs by up to 28 levels, which is why the lesson quantizes weights to 7 bits."""
    rng = np.random.default_rng(seed)
    qa = rng.integers(0, 256, (5, 16)).astype(np.uint8)
    qb = rng.integers(-64, 65, (16, 3)).astype(np.int8)
    acc, m, qy = quant.qlinear_matmul(qa, 0.013, 120, qb, 0.0071, 0.09, 128)
    assert acc.dtype == np.int32 and m == pytest.approx(0.013 * 0.0071 / 0.09, rel=1e-6)
    np.testing.assert_array_equal(acc, (qa.astype(np.int64) - 120) @ qb.astype(np.int64))
    ort, ran = quant.run_qlinear_matmul(qa, 0.013, 120, qb, 0.0071, 0.09, 128)
    assert ran == ["QLinearMatMul"]
    np.testing.assert_array_equal(ort, qy)


def test_the_quantizer_keeps_weights_to_seven_bits():
    """`quantize` asks onnxruntime for reduce_range: every int8 weight lies in [-64, 64], per tensor and per channel,
    so no pair of products can saturate the int16 sum of a CPU without VNNI; activations keep all 8 bits."""
    from onnx import numpy_helper

    model = quant.bn_spread_layer(10.0)
    calib = quant.image_batches(2, (4, 8, 16, 16), seed=1)
    for per_channel in (False, True):
        q = quant.quantize(model, calib, per_channel=per_channel)
        weights = [numpy_helper.to_array(t) for t in q.graph.initializer if t.data_type == onnx.TensorProto.INT8]
        assert weights and all(w.min() >= -64 and w.max() <= 64 for w in weights)
        assert max(int(np.abs(w).max()) for w in weights) >= 60  # the range is used, not shrunk further
        full = quant.quantize(model, calib, per_channel=per_channel, reduce_range=False)
        assert max(int(np.abs(numpy_helper.to_array(t)).max()) for t in full.graph.initializer
                   if t.data_type == onnx.TensorProto.INT8) > 64


def test_requantize_add_matches_qlinear_add():
    rng = np.random.default_rng(1)
    qa, qb = (rng.integers(0, 256, 4000).astype(np.uint8) for _ in range(2))
    args = (qa, 0.0641, 100, qb, 0.0542, 31, 0.0571, 87)
    ours, ort = quant.requantize_add(*args), quant.run_qlinear_add(*args)
    diff = np.abs(ours.astype(int) - ort.astype(int))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.99
    # and it is a requantisation, not an integer add: adding the integers gives something else
    assert not np.array_equal(ours, np.clip(qa.astype(int) + qb - 31, 0, 255).astype(np.uint8))


def test_fold_channel_scale_is_exact_per_channel_and_rerounds_per_tensor():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 3, 3, 3)).astype(np.float32)
    factor = np.array([0.05, 2.0, -1.0, 5.0, 0.3, -0.02], np.float32)
    a = factor.reshape(-1, 1, 1, 1)
    s_pc = (quant.channel_ranges(w) / 127).astype(np.float32)
    q_pc = quant.quantize_array(w, s_pc, 0, "int8", axis=0)
    q2, s2 = quant.fold_channel_scale(q_pc, s_pc, factor)
    want = quant.dequantize_array(q_pc, s_pc, 0, axis=0) * a
    assert np.array_equal(np.abs(q2), np.abs(q_pc))
    np.testing.assert_allclose(quant.dequantize_array(q2, s2, 0, axis=0), want, rtol=1e-6, atol=1e-7)
    s_pt, _ = quant.qparams(w.min(), w.max(), "int8", symmetric=True)
    q_pt = quant.quantize_array(w, s_pt, 0, "int8")
    q3, s3 = quant.fold_channel_scale(q_pt, s_pt, factor)
    want = quant.dequantize_array(q_pt, s_pt, 0) * a
    err = np.abs(quant.dequantize_array(q3, s3, 0) - want).max()
    assert err > 1e-3 * np.abs(want).max()  # re-rounded: not exact
    assert err <= float(s3) / 2 + 1e-6  # but within half a step of the new grid


def test_fold_channel_scale_refuses_minus_128():
    q = np.array([[-128, 5]], np.int8)
    with pytest.raises(ValueError, match="-128"):
        quant.fold_channel_scale(q, np.float32([0.1]), np.float32([-1.0]))


def test_image_batches_are_seeded_and_unit_spread():
    a, b = quant.image_batches(2, (2, 3, 8, 8), seed=5), quant.image_batches(2, (2, 3, 8, 8), seed=5)
    assert all(np.array_equal(x["input"], y["input"]) for x, y in zip(a, b))
    assert not np.array_equal(a[0]["input"], quant.image_batches(1, (2, 3, 8, 8), seed=6)[0]["input"])
    assert abs(float(a[0]["input"].std()) - 1) < 1e-5


def test_feeds_reader_hands_out_each_feed_once():
    feeds = quant.token_batches(3, 1, 4, 10)
    r = quant.FeedsReader(feeds)
    got = [r.get_next() for _ in range(4)]
    assert got[3] is None and [g["input_ids"].tolist() for g in got[:3]] == [f["input_ids"].tolist() for f in feeds]
    r.rewind()
    assert r.get_next() is not None


def test_bn_scales_are_the_fold_factors():
    layer = quant.bn_spread_layer(10.0)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in layer.graph.initializer}
    want, _ = bn_scale_shift(inits["bn.weight"], inits["bn.bias"], inits["bn.running_mean"],
                             inits["bn.running_var"], 1e-5)
    np.testing.assert_allclose(quant.bn_scales(layer)["/bn/BatchNormalization"], want, rtol=1e-6)


def test_bn_spread_layer_spreads_its_channels_and_its_bn_normalises_them():
    narrow, wide = quant.channel_ranges(quant.weight_of(quant.bn_spread_layer(1.0), "/conv1/Conv")), \
        quant.channel_ranges(quant.weight_of(quant.bn_spread_layer(100.0), "/conv1/Conv"))
    assert wide.max() / wide.min() > 10 * narrow.max() / narrow.min()
    folded = _proto(fuse(quant.bn_spread_layer(100.0), rules=("conv_bn",)).graph)
    conv = next(n.name for n in folded.graph.node if n.op_type == "Conv")
    fr = quant.channel_ranges(quant.weight_of(folded, conv))
    assert fr.max() / fr.min() < 10  # the BN undid the spread


def test_quantize_writes_a_qdq_model_and_onnxruntime_fuses_it():
    layer = _proto(fuse(quant.bn_spread_layer(10.0), rules=("conv_bn",)).graph)
    q = quant.quantize(layer, quant.image_batches(2, (4, 8, 16, 16), seed=1))
    counts = quant.op_counts(q)
    assert counts["Conv"] == 2 and counts["QuantizeLinear"] > 0 and counts["DequantizeLinear"] > 0
    assert quant.op_counts(quant.optimized(q, "basic"))["QLinearConv"] == 0
    at_all = quant.optimized(q, "all")
    assert quant.op_counts(at_all)["QLinearConv"] == 2 and quant.op_counts(at_all)["Conv"] == 0
    assert not quant.float_islands(at_all)


def test_unfolded_bn_costs_accuracy_and_stays_a_float_island():
    layer = quant.bn_spread_layer(100.0)
    folded = _proto(fuse(layer, rules=("conv_bn",)).graph)
    calib, test = quant.image_batches(4, (4, 8, 16, 16), seed=1), quant.image_batches(4, (4, 8, 16, 16), seed=2)
    q_unfolded, q_folded = quant.quantize(layer, calib, per_channel=True), quant.quantize(folded, calib)
    bad, good = quant.accuracy(layer, q_unfolded, test), quant.accuracy(layer, q_folded, test)
    assert bad.rel > 5 * good.rel and good.rel < 0.05
    assert quant.float_islands(quant.optimized(q_unfolded))["BatchNormalization"] == 1
    assert quant.op_counts(quant.preprocess(layer))["BatchNormalization"] == 0


def test_accuracy_of_a_model_against_itself():
    layer = quant.bn_spread_layer(1.0)
    a = quant.accuracy(layer, layer, quant.image_batches(2, (4, 8, 16, 16)), classifier=True)
    assert a.max_abs < 1e-5 and a.rel < 1e-6 and a.top1 == 1.0 and a.n == 2
    assert quant.accuracy(layer, layer, quant.image_batches(1, (4, 8, 16, 16))).top1 is None


def _residual(scale_b: float) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((4, 4, 1, 1)) * 0.5).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Mul", ["x", "k"], ["xb"], name="mul"),
             helper.make_node("Add", ["c", "xb"], ["y"], name="add")]
    return make_model(nodes, [value_info("x", np.float32, [1, 4, 8, 8])], [value_info("y", np.float32, [1, 4, 8, 8])],
                      [tensor("w", w), tensor("k", np.float32(scale_b))])


def test_add_scales_reads_the_scales_a_residual_add_meets():
    model = _residual(10.0)
    q = quant.quantize(model, quant.image_batches(2, (1, 4, 8, 8), name="x"))
    (entry,) = quant.add_scales(q)
    assert entry["node"] == "add"
    (sa, _), (sb, _), (sy, _) = entry["a"], entry["b"], entry["y"]
    assert sb / sa > 3  # the scaled branch has the wider range
    assert sy >= max(sa, sb) * 0.9
    assert quant.op_counts(quant.optimized(q))["QLinearAdd"] == 1


def test_op_table_lists_each_column_and_totals():
    text = quant.op_table({"a": quant.op_counts(_residual(1.0)), "b": quant.Counter({"Conv": 2})})
    lines = text.splitlines()
    assert lines[0].split() == ["op", "type", "a", "b"]
    assert lines[-1].split() == ["nodes", "3", "2"]
    assert any(line.split() == ["Conv", "1", "2"] for line in lines)


def test_cpu_flags_reads_cpuinfo():
    flags = quant.cpu_flags("fpu", "no_such_flag_xyz")
    assert flags["no_such_flag_xyz"] is False and set(flags) == {"fpu", "no_such_flag_xyz"}


def test_cann_counterparts_cite_the_notes():
    text = quant.cann_table()
    assert all(row[1] in text for row in quant.CANN_COUNTERPARTS)
    if not CANN_FACTS.exists():
        pytest.skip("the project's CANN notes are not beside this checkout")
    facts = CANN_FACTS.read_text()
    for _, there, where in quant.CANN_COUNTERPARTS:
        for name in (w.rstrip(":,") for w in there.split() if w.endswith(("Pass", "Pass:")) or w.startswith("Ascend")):
            assert name.strip("()") in facts, name
        assert where.split()[0] in facts


def test_seven_bit_weights_are_exact_and_eight_bit_ones_saturate_without_vnni():
    """`levels_off`, which notebook 13 prints: 0 for 7-bit weights on any CPU; on a CPU without VNNI (this suite's
    machine when it was written: AMD EPYC, AVX2 only) 8-bit weights move the output, the int16 saturation."""
    assert quant.levels_off(7) == 0
    flags = quant.cpu_flags("avx512_vnni", "avx_vnni")
    if not any(flags.values()):
        assert quant.levels_off(8) > 0
