"""When Conv/MatMul + BatchNormalization folding is illegal: one tiny model per condition, plus legal ones."""

import numpy as np
import onnx
import pytest
from onnx import helper

from fusionlab import build, load, verify
from fusionlab.analysis import derive
from fusionlab.analysis.legality import conv_bn_legal, constant_inputs, matmul_bn_legal, bn_inference_mode

RNG = np.random.default_rng(0)
F = np.float32


def _bn_inits(c, prefix="bn", shape=None):
    shape = shape or (c,)
    vals = [RNG.uniform(0.5, 1.5, shape), RNG.standard_normal(shape), RNG.standard_normal(shape),
            RNG.uniform(0.5, 2, shape)]
    return [build.tensor(f"{prefix}_{n}", v.astype(F)) for n, v in zip(("scale", "bias", "mean", "var"), vals)]


def conv_bn_model(*, c_in=3, c_out=4, group=1, bias=True, transpose=False, bn_channels=None, bn_shape=None,
                  bn_attrs=None, bn_outputs=("y",), extra_outputs=(), opset=17, extra_nodes=(),
                  graph_inputs=(), bn_inputs=None, weight_name="W", bias_name="B", extra_inits=(), k=3):
    """x[1,c_in,6,6] -> Conv(W, B) -> c -> BatchNormalization -> y, with knobs for every illegal case."""
    if transpose:
        w = RNG.standard_normal((c_in, c_out // group, k, k)).astype(F)
    else:
        w = RNG.standard_normal((c_out, c_in // group, k, k)).astype(F)
    inits = [build.tensor("W", w)]
    conv_inputs = ["x", weight_name]
    if bias:
        inits.append(build.tensor("B", RNG.standard_normal(c_out).astype(F)))
        conv_inputs.append(bias_name)
    inits += _bn_inits(bn_channels or c_out, shape=bn_shape)
    inits += list(extra_inits)
    op = "ConvTranspose" if transpose else "Conv"
    nodes = [helper.make_node(op, conv_inputs, ["c"], name="conv", group=group, pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", bn_inputs or ["c", "bn_scale", "bn_bias", "bn_mean", "bn_var"],
                              list(bn_outputs), name="bn", **(bn_attrs or {}))]
    nodes += list(extra_nodes)
    inputs = [build.value_info("x", F, [1, c_in, 6, 6])] + [build.value_info(n, F, s) for n, s in graph_inputs]
    outputs = [build.value_info(n, F, ["d0", "d1", "d2", "d3"]) for n in ("y",) + tuple(extra_outputs)]
    return build.make_model(nodes, inputs, outputs, inits, opset=opset)


def verdict(model, fn=conv_bn_legal, first="conv", second="bn", **kw):
    g = load(model, check=False)
    return fn(g, g.node(first), g.node(second), **kw)


# --------------------------------------------------------------------------------------------------
# legal
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [
    dict(), dict(bias=False), dict(c_in=4, c_out=4, group=4), dict(c_in=4, c_out=6, group=2),
    dict(transpose=True), dict(transpose=True, c_in=4, c_out=6, group=2),
])
def test_legal_and_folding_verifies_in_onnxruntime(kw):
    model = conv_bn_model(**kw)
    onnx.checker.check_model(model)
    v = verdict(model)
    assert v.ok and v.code == "ok" and not v.shared_weight, v.reason
    # fold by hand and check the result against the unfused model in onnxruntime
    g = load(model)
    p = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    f = derive.fold_conv_bn(p["W"], p.get("B"), p["bn_scale"], p["bn_bias"], p["bn_mean"], p["bn_var"],
                            1e-5, group=kw.get("group", 1), transpose=kw.get("transpose", False))
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    conv = folded.graph.node[0]
    del folded.graph.node[1]
    conv.output[0] = "y"
    keep = [t for t in folded.graph.initializer if t.name == "W"]
    del folded.graph.initializer[:]
    folded.graph.initializer.extend([build.tensor("W", f.weight), build.tensor("B_folded", f.bias)])
    if len(conv.input) == 3:
        conv.input[2] = "B_folded"
    else:
        conv.input.append("B_folded")
    assert keep
    report = verify(g, folded)
    assert report.ok, report.table()


def test_opset_9_inference_bn_is_legal():
    assert verdict(conv_bn_model(opset=9)).ok


def test_training_mode_zero_is_legal():
    assert verdict(conv_bn_model(bn_attrs={"training_mode": 0})).ok


def test_weight_through_identity_is_constant():
    ident = helper.make_node("Identity", ["W"], ["W_id"], name="id")
    model = conv_bn_model(weight_name="W_id", extra_nodes=[ident])
    model.graph.node.insert(0, model.graph.node.pop())  # Identity first
    v = verdict(model)
    assert v.ok and not v.shared_weight


# --------------------------------------------------------------------------------------------------
# illegal: one condition each
# --------------------------------------------------------------------------------------------------

def test_training_mode():
    v = verdict(conv_bn_model(bn_attrs={"training_mode": 1}))
    assert not v.ok and v.code == "training_mode" and "training_mode" in v.reason


def test_optional_outputs_used():
    model = conv_bn_model(bn_attrs={"training_mode": 0}, bn_outputs=("y", "running_mean", "running_var"),
                          extra_outputs=("running_mean",))
    v = verdict(model)
    assert not v.ok and v.code == "bn_outputs_used" and "running_mean" in v.reason


def test_optional_outputs_declared_in_old_opset_mean_training():
    model = conv_bn_model(opset=9, bn_outputs=("y", "mean_out", "var_out"))
    v = verdict(model)
    assert not v.ok and v.code == "bn_outputs"


def test_conv_output_has_another_consumer():
    relu = helper.make_node("Relu", ["c"], ["r"], name="relu")
    v = verdict(conv_bn_model(extra_nodes=[relu], extra_outputs=("r",)))
    assert not v.ok and v.code == "multi_consumer" and "2 consumers" in v.reason


def test_conv_output_is_graph_output():
    v = verdict(conv_bn_model(extra_outputs=("c",)))
    assert not v.ok and v.code == "graph_output"


def test_bn_parameter_computed():
    neg = helper.make_node("Neg", ["m_in"], ["m_neg"], name="neg")
    model = conv_bn_model(bn_inputs=["c", "bn_scale", "bn_bias", "m_neg", "bn_var"], extra_nodes=[neg],
                          graph_inputs=[("m_in", [4])])
    v = verdict(model)
    assert not v.ok and v.code == "non_constant" and "BN mean" in v.reason


def test_bn_parameter_overridable():
    model = conv_bn_model(graph_inputs=[("bn_var", [4])])  # initializer also a graph input
    v = verdict(model)
    assert not v.ok and v.code == "overridable" and "bn_var" in v.reason


def test_conv_weight_overridable():
    v = verdict(conv_bn_model(graph_inputs=[("W", [4, 3, 3, 3])]))
    assert not v.ok and v.code == "overridable" and "weight" in v.reason


def test_conv_weight_is_a_graph_input():
    v = verdict(conv_bn_model(weight_name="W_in", graph_inputs=[("W_in", [4, 3, 3, 3])]))
    assert not v.ok and v.code == "non_constant"


def test_conv_bias_overridable():
    v = verdict(conv_bn_model(graph_inputs=[("B", [4])]))
    assert not v.ok and v.code == "overridable" and "bias" in v.reason


def test_shared_weight_is_legal_but_flagged():
    other = helper.make_node("Conv", ["x", "W"], ["c2"], name="conv2", pads=[1, 1, 1, 1])
    v = verdict(conv_bn_model(extra_nodes=[other], extra_outputs=("c2",)))
    assert v.ok and v.shared_weight and "copy" in v.reason


def test_shared_bias_through_identity_is_flagged():
    ident = helper.make_node("Identity", ["B"], ["B_id"], name="id")
    neg = helper.make_node("Neg", ["B_id"], ["z"], name="neg")  # another reader of the bias, via Identity
    v = verdict(conv_bn_model(extra_nodes=[ident, neg], extra_outputs=("z",)))
    assert v.ok and v.shared_weight


def test_channel_mismatch():
    v = verdict(conv_bn_model(bn_channels=5))
    assert not v.ok and v.code == "channel_mismatch" and "5 channels" in v.reason


def test_conv_transpose_channel_mismatch():
    # ConvTranspose output channels are W.shape[1]*group = 6, not W.shape[0] = 4
    v = verdict(conv_bn_model(transpose=True, c_in=4, c_out=6, group=2, bn_channels=4))
    assert not v.ok and v.code == "channel_mismatch"


def test_bn_scale_not_per_channel():
    v = verdict(conv_bn_model(bn_shape=(4, 1, 1)))
    assert not v.ok and v.code == "not_per_channel"


def test_bn7_spatial_zero_is_not_per_channel():
    v = verdict(conv_bn_model(opset=7, bn_attrs={"spatial": 0}))
    assert not v.ok and v.code == "not_per_channel"


def test_weight_rank_unknown():
    bad = build.tensor("W2", np.ones((4, 27), F))
    v = verdict(conv_bn_model(weight_name="W2", extra_inits=[bad]))
    assert not v.ok and v.code == "unknown_rank"


def test_not_a_pair():
    relu = helper.make_node("Relu", ["x"], ["r"], name="relu")
    model = conv_bn_model(extra_nodes=[relu], extra_outputs=("r",))
    assert verdict(model, first="relu").code == "not_a_pair"
    g = load(model, check=False)
    assert conv_bn_legal(g, g.node("conv"), g.node("relu")).code == "not_a_pair"


def test_bn_inference_mode_helper():
    g = load(conv_bn_model(), check=False)
    assert bn_inference_mode(g, g.node("bn")).ok


# --------------------------------------------------------------------------------------------------
# MatMul / Gemm + BN
# --------------------------------------------------------------------------------------------------

def mm_bn_model(*, op="MatMul", x_shape=(2, 5), trans_b=False, n=4, gemm_c=True):
    k = x_shape[-1] if x_shape else 5
    w = RNG.standard_normal((n, k) if trans_b else (k, n)).astype(F)
    inits = [build.tensor("W", w)] + _bn_inits(n)
    if op == "MatMul":
        node = helper.make_node("MatMul", ["x", "W"], ["c"], name="mm")
    else:
        ins = ["x", "W"] + (["C"] if gemm_c else [])
        if gemm_c:
            inits.append(build.tensor("C", RNG.standard_normal(n).astype(F)))
        node = helper.make_node("Gemm", ins, ["c"], name="mm", transB=int(trans_b), alpha=0.5, beta=2.0)
    bn = helper.make_node("BatchNormalization", ["c", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["y"], name="bn")
    return build.make_model([node, bn], [build.value_info("x", F, list(x_shape) if x_shape else None)],
                            [build.value_info("y", F, ["m", "n"])], inits)


@pytest.mark.parametrize("kw", [dict(), dict(op="Gemm"), dict(op="Gemm", trans_b=True), dict(op="Gemm", gemm_c=False)])
def test_matmul_bn_legal(kw):
    v = verdict(mm_bn_model(**kw), fn=matmul_bn_legal, first="mm")
    assert v.ok, v.reason


def test_matmul_3d_normalises_the_wrong_axis():
    v = verdict(mm_bn_model(x_shape=(2, 3, 5)), fn=matmul_bn_legal, first="mm")
    assert not v.ok and v.code == "channel_axis"


def test_matmul_unknown_rank():
    v = verdict(mm_bn_model(x_shape=None), fn=matmul_bn_legal, first="mm")
    assert not v.ok and v.code == "unknown_rank"


def test_gemm_channel_mismatch():
    # transB=1 makes W (N, K) = (4, 5); reading it as (K, N) would give 5 channels
    model = mm_bn_model(op="Gemm", trans_b=True)
    for node in model.graph.node:
        if node.op_type == "Gemm":
            keep = [a for a in node.attribute if a.name != "transB"]
            del node.attribute[:]
            node.attribute.extend(keep)
    v = verdict(model, fn=matmul_bn_legal, first="mm")
    assert not v.ok and v.code == "channel_mismatch"


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------

def test_constant_inputs():
    g = load(conv_bn_model(bias=False), check=False)
    conv = g.node("conv")
    w, b = constant_inputs(g, conv, 1, 2)
    assert w.shape == (4, 3, 3, 3) and b is None          # absent optional input
    assert constant_inputs(g, conv, 0, 1) is None         # x is not constant
    g = load(conv_bn_model(graph_inputs=[("W", [4, 3, 3, 3])]), check=False)
    assert constant_inputs(g, g.node("conv"), 1) is None  # overridable
