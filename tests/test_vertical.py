"""Vertical fusion passes: each rule fuses what it may (verified against the unfused model) and leaves
alone what it may not (the reliability anchors: second consumer, graph output, training BN, ...)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper as h

from fusionlab import load, verify
from fusionlab.build import make_model, tensor, value_info
from fusionlab.zoo import tanh_gelu
from fusionlab.passes import fuse, plan
from fusionlab.passes import vertical
from fusionlab.passes.vertical import RULE_NAMES
from fusionlab.plan import FusionPlan

RNG = np.random.default_rng(7)


def mk(*args, **kw):
    """make_model, then give graph outputs declared without a shape their inferred type (the checker wants one)."""
    m = make_model(*args, **kw)
    try:
        inferred = onnx.shape_inference.infer_shapes(m)
    except Exception:
        return m
    known = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for out in m.graph.output:
        if not out.type.tensor_type.HasField("shape") and out.name in known:
            out.type.CopyFrom(known[out.name].type)
    return m


def r(*shape, dtype=np.float32, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def bn_params(c, prefix="bn", dtype=np.float32, var=None):
    v = np.abs(r(c)) + 0.5 if var is None else var
    return [tensor(f"{prefix}_g", r(c).astype(dtype)), tensor(f"{prefix}_b", r(c).astype(dtype)),
            tensor(f"{prefix}_m", r(c).astype(dtype)), tensor(f"{prefix}_v", np.asarray(v).astype(dtype))]


def bn_node(x, y, prefix="bn", **attrs):
    return h.make_node("BatchNormalization", [x, f"{prefix}_g", f"{prefix}_b", f"{prefix}_m", f"{prefix}_v"], [y],
                       name=prefix, **attrs)


def conv_model(tail_nodes, tail_inits=(), *, cin=3, cout=8, k=3, spatial=(8, 8), opset=17, bias=True, group=1,
               dtype=np.float32, out="y", out_shape=None, extra_outputs=(), weight_scale=1.0):
    nd = len(spatial)
    w = r(cout, cin // group, *([k] * nd), dtype=dtype, scale=weight_scale)
    inits = [tensor("W", w)] + ([tensor("B", r(cout, dtype=dtype))] if bias else []) + list(tail_inits)
    conv = h.make_node("Conv", ["x", "W"] + (["B"] if bias else []), ["c"], name="conv", kernel_shape=[k] * nd,
                       pads=[k // 2] * (2 * nd), group=group)
    outputs = [value_info(out, dtype, out_shape)] + [value_info(n, dtype, None) for n in extra_outputs]
    return mk([conv] + list(tail_nodes), [value_info("x", dtype, ["batch", cin, *spatial])], outputs, inits,
                      opset=opset)


def check(model, expect=None, *, rtol=None, atol=None, dims=None, **opts):
    """Fuse, check the result is a valid model that computes the same, and that op counts are as expected."""
    res = fuse(model, **opts)
    proto = res.graph.to_proto()
    load(proto)  # the fused model passes the ONNX checker
    report = verify(model, proto, rtol=rtol, atol=atol, dims=dims)
    assert report.ok, report.table()
    if expect is not None:
        assert res.after == dict(sorted(expect.items())), res.after
    return res


def unchanged(model, **opts):
    res = fuse(model, **opts)
    assert res.after == res.before, (res.before, res.after, res.plan.notes)
    assert len(res.plan) == 0
    report = verify(model, res.graph.to_proto())
    assert report.ok, report.table()
    return res


# ---------------------------------------------------------------------------------------------------
# Conv + BN (+ activation)
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("opset", [9, 14, 15, 17])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_bn_folds_every_bn_opset(opset, bias):
    m = conv_model([bn_node("c", "y")], bn_params(8), opset=opset, bias=bias)
    res = check(m, {"Conv": 1})
    assert res.plan.rule_counts() == {"conv_bn": 1}
    g = res.plan[0]
    assert g.nodes == ["conv", "bn"] and g.saved_launches == 1 and g.saved_bytes == 2 * 8 * 8 * 8 * 4


def test_conv_bn_relu_becomes_fusedconv_and_keeps_output_name():
    m = conv_model([bn_node("c", "n"), h.make_node("Relu", ["n"], ["y"], name="relu")], bn_params(8))
    res = check(m, {"com.microsoft:FusedConv": 1})
    assert [o.name for o in res.graph.outputs()] == ["y"]
    assert res.plan[0].rule == "conv_bn_act" and res.plan[0].lowered_to == "com.microsoft:FusedConv"


@pytest.mark.parametrize("act,attrs,extra", [
    ("Sigmoid", {}, ()), ("Tanh", {}, ()), ("LeakyRelu", {"alpha": 0.2}, ()),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, ()),
])
def test_conv_activation_to_fusedconv(act, attrs, extra):
    m = conv_model([h.make_node(act, ["c"], ["y"], name="act", **attrs)])
    res = check(m, {"com.microsoft:FusedConv": 1})
    assert res.plan.rule_counts() == {"conv_act": 1}


def test_conv_clip_inputs_opset11_and_attrs_opset10():
    lo, hi = tensor("lo", np.float32(-0.5)), tensor("hi", np.float32(0.7))
    m11 = conv_model([h.make_node("Clip", ["c", "lo", "hi"], ["y"], name="clip")], [lo, hi], opset=13)
    check(m11, {"com.microsoft:FusedConv": 1})
    m10 = conv_model([h.make_node("Clip", ["c"], ["y"], name="clip", min=-0.5, max=0.7)], opset=10)
    check(m10, {"com.microsoft:FusedConv": 1})
    # a Clip bound computed at run time cannot become an attribute
    m_dyn = mk(
        [h.make_node("Conv", ["x", "W"], ["c"], name="conv", kernel_shape=[1, 1]),
         h.make_node("ReduceMin", ["x"], ["lo"], name="rmin", keepdims=0),
         h.make_node("Clip", ["c", "lo"], ["y"], name="clip")],
        [value_info("x", shape=[1, 2, 4, 4])], [value_info("y", shape=None)], [tensor("W", r(2, 2, 1, 1))], opset=13)
    unchanged(m_dyn)


def test_softsign_not_fused_in_runtime_but_wrapped_as_function():
    m = conv_model([bn_node("c", "n"), h.make_node("Softsign", ["n"], ["y"], name="ss")], bn_params(8))
    res = check(m, {"Conv": 1, "Softsign": 1})
    assert res.plan.rule_counts() == {"conv_bn": 1}
    res = check(m, {"fusionlab.fused:ConvBnSoftsign_0": 1}, lower="functions")
    assert res.plan[0].rule == "conv_bn_act" and res.plan[0].lowered_to == "fusionlab.fused:ConvBnSoftsign_0"


def test_silu_after_conv_bn_becomes_conv_quickgelu():
    m = conv_model([bn_node("c", "n"), h.make_node("Sigmoid", ["n"], ["s"], name="sig"),
                    h.make_node("Mul", ["n", "s"], ["y"], name="mul")], bn_params(8))
    res = check(m, {"Conv": 1, "com.microsoft:QuickGelu": 1})
    assert res.plan[0].rule == "conv_bn_act" and res.plan[0].saved_launches == 2


def test_lower_onnx_only_folds():
    m = conv_model([bn_node("c", "n"), h.make_node("Relu", ["n"], ["y"], name="relu")], bn_params(8))
    check(m, {"Conv": 1, "Relu": 1}, lower="onnx")


@pytest.mark.parametrize("spatial", [(9,), (5, 6, 7)])
def test_conv_1d_and_3d(spatial):
    m = conv_model([bn_node("c", "n"), h.make_node("Relu", ["n"], ["y"], name="relu")], bn_params(8), spatial=spatial)
    check(m, {"com.microsoft:FusedConv": 1})


@pytest.mark.parametrize("group,cin,cout", [(2, 4, 6), (8, 8, 8)])
def test_grouped_and_depthwise_conv_bn(group, cin, cout):
    m = conv_model([bn_node("c", "y")], bn_params(cout), cin=cin, cout=cout, group=group)
    check(m, {"Conv": 1})


def test_convtranspose_grouped_bn_folds_on_axis_1():
    w = r(4, 3, 3, 3)  # C_in=4, group=2 -> C_out = 3*2 = 6
    m = mk([h.make_node("ConvTranspose", ["x", "W"], ["c"], name="deconv", group=2, kernel_shape=[3, 3]),
                    bn_node("c", "n", prefix="bn"), h.make_node("Relu", ["n"], ["y"], name="relu")],
                   [value_info("x", shape=[1, 4, 5, 5])], [value_info("y", shape=None)],
                   [tensor("W", w)] + bn_params(6))
    res = check(m, {"ConvTranspose": 1, "Relu": 1})  # no FusedConv for ConvTranspose
    assert res.plan.rule_counts() == {"convtranspose_bn": 1}


def test_conv_scale_bias_per_channel_mul_add_sub():
    inits = [tensor("s", r(1, 8, 1, 1)), tensor("t", r(8, 1, 1)), tensor("u", np.float32(0.3))]
    m = conv_model([h.make_node("Mul", ["s", "c"], ["a"], name="mul"), h.make_node("Add", ["a", "t"], ["b"], name="add"),
                    h.make_node("Sub", ["b", "u"], ["y"], name="sub")], inits)
    res = check(m, {"Conv": 1})
    assert res.plan.rule_counts() == {"conv_scale_bias": 1}


@pytest.mark.parametrize("shape", [(1, 8, 8, 8), (1, 1, 1, 1, 8), (8, 1, 1, 1)])
def test_conv_mul_not_per_channel_left_alone(shape):
    m = conv_model([h.make_node("Mul", ["c", "s"], ["y"], name="mul")], [tensor("s", r(*shape))])
    unchanged(m)


def test_sub_with_constant_first_left_alone():
    m = conv_model([h.make_node("Sub", ["s", "c"], ["y"], name="sub")], [tensor("s", r(1, 8, 1, 1))])
    unchanged(m)


@pytest.mark.parametrize("opset", [10, 17, 19])
def test_pad_folds_into_conv(opset):
    if opset < 11:
        pad = h.make_node("Pad", ["x"], ["p"], name="pad", pads=[0, 0, 1, 2, 0, 0, 1, 2], mode="constant")
        inits = []
    else:
        pad = h.make_node("Pad", ["x", "pads"], ["p"], name="pad", mode="constant")
        inits = [tensor("pads", np.array([0, 0, 1, 2, 0, 0, 1, 2], np.int64))]
    m = mk([pad, h.make_node("Conv", ["p", "W"], ["y"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
                   [value_info("x", shape=[1, 3, 6, 6])], [value_info("y", shape=None)], [tensor("W", r(4, 3, 3, 3))] + inits,
                   opset=opset)
    res = check(m, {"Conv": 1})
    conv = next(iter(res.graph))
    assert list(conv.attributes["pads"].value) == [2, 3, 2, 3]


@pytest.mark.parametrize("case", ["reflect", "channel", "value", "negative"])
def test_pad_not_folded(case):
    pads = [0, 0, 1, 1, 0, 0, 1, 1]
    mode, value = "constant", 0.0
    if case == "reflect":
        mode = "reflect"
    if case == "channel":
        pads = [0, 1, 1, 1, 0, 0, 1, 1]
    if case == "value":
        value = 1.5
    if case == "negative":
        pads = [0, 0, -1, 0, 0, 0, 0, 0]
    cin = 4 if case == "channel" else 3
    m = mk([h.make_node("Pad", ["x", "pads", "v"], ["p"], name="pad", mode=mode),
                    h.make_node("Conv", ["p", "W"], ["y"], name="conv", kernel_shape=[3, 3])],
                   [value_info("x", shape=[1, 3, 6, 6])], [value_info("y", shape=None)],
                   [tensor("W", r(4, cin, 3, 3)), tensor("pads", np.array(pads, np.int64)), tensor("v", np.float32(value))])
    unchanged(m)


def pool_model(pool_op, pad_pads=(0, 0, 1, 1, 0, 0, 1, 1), value=0.0, *, extra_consumer=False, **pool_attrs):
    """Pad (constant `value`) -> pool; `pool_attrs` are the pool's own attributes (pads, count_include_pad...)."""
    pool_attrs.setdefault("kernel_shape", [3, 3])
    nodes = [h.make_node("Pad", ["x", "pads", "v"], ["p"], name="pad", mode="constant"),
             h.make_node(pool_op, ["p"], ["y"], name="pool", **pool_attrs)]
    outputs = [value_info("y", shape=None)]
    if extra_consumer:
        nodes.append(h.make_node("Relu", ["p"], ["z"], name="relu"))
        outputs.append(value_info("z", shape=None))
    return mk(nodes, [value_info("x", shape=[1, 3, 7, 7])], outputs,
              [tensor("pads", np.array(pad_pads, np.int64)), tensor("v", np.float32(value))], opset=19)


@pytest.mark.parametrize("own_pads", [None, [1, 0, 0, 1]])
def test_pad_folds_into_average_pool_counting_the_zeros(own_pads):
    """The Pad's zeros counted in the average; the fused pool must count its own pads (count_include_pad=1)."""
    attrs = {"strides": [2, 2]}
    if own_pads is not None:
        attrs.update(pads=own_pads, count_include_pad=1)
    res = check(pool_model("AveragePool", **attrs), {"AveragePool": 1})
    pool = next(iter(res.graph))
    assert pool.attributes["count_include_pad"].value == 1
    assert list(pool.attributes["pads"].value) == ([2, 1, 1, 2] if own_pads else [1, 1, 1, 1])
    assert res.plan.rule_counts() == {"pad_pool": 1}


def test_pad_folds_into_max_pool_only_when_it_pads_as_max_pool_does():
    """MaxPool's own padding is the lowest finite float in onnxruntime: a Pad with that value folds exactly.

    A -inf Pad folded once too (until the fuzzer's class N1): max(-inf data, -inf pad) is -inf, but
    max(-inf data, MaxPool's own padding) is -3.4e38, so it is refused now, and so are zeros.
    """
    res = check(pool_model("MaxPool", value=float(np.finfo(np.float32).min)), {"MaxPool": 1})
    assert list(next(iter(res.graph)).attributes["pads"].value) == [1, 1, 1, 1]
    unchanged(pool_model("MaxPool", value=0.0))  # zeros would beat negative inputs; MaxPool's own pads never do
    res = unchanged(pool_model("MaxPool", value=-np.inf))
    assert any("lowest finite value" in r.reason for r in res.plan.refusals)


@pytest.mark.parametrize(("pool", "between"), [((2, 1), "Pad"), ((2, 1), "Transpose"), ((3, 1), "Pad")])
def test_a_scale_folds_into_a_conv_after_a_max_pool_only_without_windows_in_padding(pool, between):
    """A MaxPool window entirely in padding gives float32's lowest on onnxruntime's CPU; ops that only move
    values between it and the Conv keep that value (fuzz seed 7: -inf Pad, MaxPool, zero Pad, Conv, Mul: NaN
    where the original gives -0). Kernel 2 with pads 1 after a -inf Pad has such windows; ResNet's kernel 3,
    pads 1 on the data has none."""
    k, p = pool
    mid = (h.make_node("Pad", ["m", "pads"], ["q"], name="pad", mode="constant") if between == "Pad"
           else h.make_node("Transpose", ["m"], ["q"], name="t", perm=[0, 1, 3, 2]))
    head = ([h.make_node("Pad", ["x", "pads", "ninf"], ["x2"], name="inf_pad", mode="constant")] if k == 2
            else [h.make_node("Identity", ["x"], ["x2"], name="id")])  # -inf rows, then a pad: windows of -inf
    nodes = [*head, h.make_node("MaxPool", ["x2"], ["m"], name="pool", kernel_shape=[k, k], pads=[p] * 4), mid,
             h.make_node("Conv", ["q", "W"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             h.make_node("Mul", ["c", "k"], ["y"], name="scale")]
    model = mk(nodes, [value_info("x", shape=[1, 3, 6, 6])], [value_info("y", shape=None)],
               [tensor("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)), tensor("W", r(4, 3, 3, 3)),
                tensor("k", np.full((4, 1, 1), 1.5, np.float32)), tensor("ninf", np.float32(-np.inf))], opset=19)
    res = fuse(model)
    if k == 2:
        assert "Mul" in res.after and any("entirely in padding" in x.reason for x in res.plan.refusals)
    else:
        assert "Mul" not in res.after, res.plan.refusals
        assert verify(model, res.graph.to_proto()).ok


@pytest.mark.parametrize("case", ["own_pads_not_counted", "ceil_mode", "pad_not_smaller_than_kernel", "value",
                                  "second_consumer", "channel_axis"])
def test_pad_not_folded_into_pool(case):
    op, kw, pads, value = "AveragePool", {}, (0, 0, 1, 1, 0, 0, 1, 1), 0.0
    if case == "own_pads_not_counted":  # onnxruntime PR #23190: the fused pool would count the pool's own pads
        kw = {"pads": [1, 1, 1, 1], "count_include_pad": 0}
    if case == "ceil_mode":
        kw = {"ceil_mode": 1, "strides": [2, 2]}
    if case == "pad_not_smaller_than_kernel":
        pads = (0, 0, 3, 0, 0, 0, 0, 0)
    if case == "value":
        value = 1.0
    if case == "channel_axis":
        pads = (0, 1, 0, 0, 0, 0, 0, 0)
    res = unchanged(pool_model(op, pads, value, extra_consumer=case == "second_consumer", **kw))
    if case not in ("second_consumer",):
        assert any("pad_pool" in n for n in res.plan.notes), res.plan.notes


# ---------------------------------------------------------------------------------------------------
# must-not-fuse anchors for Conv + BN
# ---------------------------------------------------------------------------------------------------

def test_second_consumer_blocks_folding():
    m = conv_model([bn_node("c", "y"), h.make_node("Relu", ["c"], ["z"], name="relu")], bn_params(8),
                   extra_outputs=("z",))
    res = fuse(m)
    assert res.after.get("BatchNormalization") == 1
    assert "conv_bn" not in res.plan.rule_counts()
    assert verify(m, res.graph.to_proto()).ok


def test_conv_output_that_is_graph_output_is_not_folded():
    m = conv_model([bn_node("c", "y")], bn_params(8), extra_outputs=("c",))
    unchanged(m)


def test_training_mode_bn_is_not_folded():
    m = conv_model([bn_node("c", "y", training_mode=1)], bn_params(8), opset=15, out_shape=["batch", 8, 8, 8])
    p = vertical.plan(load(m))  # (passes.plan drops notes)
    assert len(p) == 0
    assert any("training" in n for n in p.notes)


def test_bn_with_optional_outputs_is_not_folded():
    bn = h.make_node("BatchNormalization", ["c", "bn_g", "bn_b", "bn_m", "bn_v"], ["y", "rm", "rv"], name="bn")
    m = conv_model([bn], bn_params(8), opset=14, out_shape=["batch", 8, 8, 8])
    assert len(plan(m)) == 0


def test_overridable_bn_parameter_is_not_folded():
    m = conv_model([bn_node("c", "y")], bn_params(8))
    m.graph.input.append(value_info("bn_m", np.float32, [8]))  # initializer that is also an input
    res = fuse(m)
    assert res.after.get("BatchNormalization") == 1
    assert len(res.plan) == 0


def test_shared_weight_is_copied_not_mutated():
    w = r(8, 3, 3, 3)
    m = mk([h.make_node("Conv", ["x", "W"], ["c1"], name="conv1", kernel_shape=[3, 3]),
                    bn_node("c1", "y1"),
                    h.make_node("Conv", ["x", "W"], ["y2"], name="conv2", kernel_shape=[3, 3])],
                   [value_info("x", shape=[1, 3, 6, 6])], [value_info("y1", shape=None), value_info("y2", shape=None)],
                   [tensor("W", w)] + bn_params(8))
    res = check(m, {"Conv": 2})
    conv2 = res.graph.node("conv2")
    assert conv2.inputs[1].name == "W"
    np.testing.assert_array_equal(conv2.inputs[1].const_value.numpy(), w)


def test_activation_between_conv_and_bn_blocks_folding():
    m = conv_model([h.make_node("Relu", ["c"], ["a"], name="relu"), bn_node("a", "y")], bn_params(8))
    res = check(m, {"com.microsoft:FusedConv": 1, "BatchNormalization": 1})
    assert res.plan.rule_counts() == {"conv_act": 1}


def test_dynamic_weight_is_not_folded():
    m = mk([h.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[1, 1]), bn_node("c", "y")],
                   [value_info("x", shape=[1, 2, 4, 4]), value_info("w", shape=[8, 2, 1, 1])],
                   [value_info("y", shape=None)], bn_params(8))
    unchanged(m)


def test_zero_variance_uses_epsilon():
    m = conv_model([bn_node("c", "y", epsilon=1e-3)], bn_params(8, var=np.zeros(8)))
    check(m, {"Conv": 1}, rtol=1e-4, atol=1e-4)  # scale 1/sqrt(1e-3) ~ 32 amplifies fp32 rounding


def test_fp16_model_folds_in_high_precision():
    m = conv_model([bn_node("c", "n"), h.make_node("Relu", ["n"], ["y"], name="relu")],
                   bn_params(8, dtype=np.float16), dtype=np.float16)
    res = check(m, {"Conv": 1, "Relu": 1})  # no fp16 FusedConv; fp16 tolerances from fusionlab.runtime
    conv = res.graph.node(res.plan[0].extra["fused_nodes"][0])
    assert conv.inputs[1].const_value.numpy().dtype == np.float16


def test_fp16_overflowing_fold_is_refused():
    m = conv_model([bn_node("c", "y")], bn_params(8, dtype=np.float16, var=np.full(8, 1e-4)), dtype=np.float16,
                   weight_scale=1e4)
    p = vertical.plan(load(m))
    assert len(p) == 0 and any("overflow" in n for n in p.notes)


def test_fp16_fold_that_would_lose_precision_is_refused():
    """Fuzz class 7: a zero-variance fp16 channel (scale ~300) whose mean is far from the bias. onnxruntime runs
    the unfolded fp16 chain in float32; the folded weights, rounded to fp16, were off by 0.08 on 3 draws."""
    params = bn_params(8, dtype=np.float16, var=np.zeros(8))
    m = conv_model([bn_node("c", "n"), h.make_node("Tanh", ["n"], ["y"], name="tanh")], params, dtype=np.float16)
    mean = next(i for i in m.graph.initializer if i.name == "bn_m")
    mean.CopyFrom(tensor(mean.name, np.full(8, 0.4, np.float16)))
    p = vertical.plan(load(m))
    assert len(p) == 0
    assert any("lose float16 precision" in n and "standard deviations from the bias" in n for n in p.notes)
    # the same channel in float32 folds (the unfolded float32 model rounds W·x in float32 as well)
    m32 = conv_model([bn_node("c", "y")], bn_params(8, var=np.zeros(8)))
    assert len(vertical.plan(load(m32))) == 1


def test_symbolic_batch_verified_at_batch_3():
    m = conv_model([bn_node("c", "y")], bn_params(8))
    check(m, {"Conv": 1}, dims={"batch": 3})


def test_identity_chains_and_dropout_fuse_like_clean_models():
    nodes = [h.make_node("Identity", ["W0"], ["W1"], name="id1"), h.make_node("Identity", ["W1"], ["W"], name="id2"),
             h.make_node("Identity", ["bn_g0"], ["bn_g"], name="id3"),
             h.make_node("Conv", ["x", "W"], ["c"], name="conv", kernel_shape=[3, 3]),
             h.make_node("Dropout", ["c"], ["d"], name="drop"), bn_node("d", "n"),
             h.make_node("Relu", ["n"], ["y"], name="relu")]
    params = bn_params(8)
    params[0].name = "bn_g0"
    m = mk(nodes, [value_info("x", shape=[1, 3, 6, 6])], [value_info("y", shape=None)],
                   [tensor("W0", r(8, 3, 3, 3))] + params)
    res = check(m, {"com.microsoft:FusedConv": 1})
    assert len(res.graph.graph.initializers) == 2  # folded W and B only: dead weights removed


# ---------------------------------------------------------------------------------------------------
# MatMul / Gemm
# ---------------------------------------------------------------------------------------------------

def mm_model(tail, inits, *, a_shape=("batch", 6), k=6, n=5, out="y", extra_outputs=(), opset=17):
    nodes = [h.make_node("MatMul", ["a", "B"], ["mm"], name="mm")] + list(tail)
    outputs = [value_info(out, np.float32, None)] + [value_info(o, np.float32, None) for o in extra_outputs]
    return mk(nodes, [value_info("a", shape=list(a_shape))], outputs, [tensor("B", r(k, n))] + list(inits),
                      opset=opset)


@pytest.mark.parametrize("bias_shape", [(5,), (1, 5), (1, 1), ()])
def test_matmul_add_to_gemm(bias_shape):
    m = mm_model([h.make_node("Add", ["mm", "C"], ["y"], name="add")], [tensor("C", r(*bias_shape))])
    res = check(m, {"Gemm": 1})
    assert res.plan.rule_counts() == {"matmul_add_gemm": 1}


def test_matmul_add_bias_not_broadcastable_to_gemm_left_alone():
    m = mm_model([h.make_node("Add", ["mm", "C"], ["y"], name="add")], [tensor("C", r(2, 1, 5))])
    unchanged(m)


def test_rank3_matmul_add_not_gemm():
    m = mm_model([h.make_node("Add", ["mm", "C"], ["y"], name="add")], [tensor("C", r(5))], a_shape=("batch", 4, 6))
    res = unchanged(m)
    assert any("rank 2" in n for n in res.plan.notes)


def test_rank1_input_matmul_add_not_gemm():
    m = mm_model([h.make_node("Add", ["mm", "C"], ["y"], name="add")], [tensor("C", r(5))], a_shape=(6,))
    unchanged(m)


def test_matmul_add_relu_to_fusedgemm():
    m = mm_model([h.make_node("Add", ["mm", "C"], ["s"], name="add"), h.make_node("Relu", ["s"], ["y"], name="relu")],
                 [tensor("C", r(5))])
    res = check(m, {"com.microsoft:FusedGemm": 1})
    assert res.plan.rule_counts() == {"gemm_act": 1}


@pytest.mark.parametrize("act,attrs", [("LeakyRelu", {"alpha": 0.2}), ("Sigmoid", {}), ("Tanh", {}),
                                       ("HardSigmoid", {"alpha": 0.3, "beta": 0.6}), ("Elu", {"alpha": 0.5}),
                                       ("Softplus", {}), ("Softsign", {}), ("Selu", {})])
def test_gemm_activation_to_fusedgemm(act, attrs):
    m = mk([h.make_node("Gemm", ["a", "B", "C"], ["g"], name="gemm", transB=1),
                    h.make_node(act, ["g"], ["y"], name="act", **attrs)],
                   [value_info("a", shape=["batch", 6])], [value_info("y", shape=None)],
                   [tensor("B", r(5, 6)), tensor("C", r(5))])
    check(m, {"com.microsoft:FusedGemm": 1})


def test_gemm_output_graph_output_not_fused_with_activation():
    m = mk([h.make_node("Gemm", ["a", "B"], ["g"], name="gemm"), h.make_node("Relu", ["g"], ["y"], name="relu")],
                   [value_info("a", shape=[2, 6])], [value_info("y", shape=None), value_info("g", shape=None)],
                   [tensor("B", r(6, 5))])
    unchanged(m)


def test_matmul_bn_to_gemm():
    m = mm_model([bn_node("mm", "y")], bn_params(5))
    res = check(m, {"Gemm": 1})
    assert res.plan.rule_counts() == {"matmul_bn": 1}


def test_rank3_matmul_bn_not_folded():
    m = mk([h.make_node("MatMul", ["a", "B"], ["mm"], name="mm"), bn_node("mm", "y")],
                   [value_info("a", shape=[2, 5, 6])], [value_info("y", shape=None)], [tensor("B", r(6, 4))] + bn_params(5))
    unchanged(m)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_bn_folds_with_alpha_beta(trans_b):
    b = r(5, 6) if trans_b else r(6, 5)
    m = mk([h.make_node("Gemm", ["a", "B", "C"], ["g"], name="gemm", transB=trans_b, alpha=0.7, beta=1.3),
                    bn_node("g", "y")],
                   [value_info("a", shape=[3, 6])], [value_info("y", shape=None)],
                   [tensor("B", b), tensor("C", r(5))] + bn_params(5))
    res = check(m, {"Gemm": 1})
    assert res.plan.rule_counts() == {"gemm_bn": 1}


# ---------------------------------------------------------------------------------------------------
# GELU, LayerNorm, SiLU
# ---------------------------------------------------------------------------------------------------

def gelu_nodes(x, y, form=0):
    s2 = [tensor("sqrt2", np.float32(np.sqrt(2.0))), tensor("one", np.float32(1.0)), tensor("half", np.float32(0.5))]
    if form == 0:  # torch: x * (1 + erf(x / sqrt2)) * 0.5
        nodes = [h.make_node("Div", [x, "sqrt2"], ["g1"], name="div"), h.make_node("Erf", ["g1"], ["g2"], name="erf"),
                 h.make_node("Add", ["g2", "one"], ["g3"], name="add1"), h.make_node("Mul", [x, "g3"], ["g4"], name="mul1"),
                 h.make_node("Mul", ["g4", "half"], [y], name="mul2")]
    elif form == 1:  # (x * 0.5) * (1 + erf(x / sqrt2))
        nodes = [h.make_node("Mul", [x, "half"], ["h"], name="mulh"), h.make_node("Div", [x, "sqrt2"], ["g1"], name="div"),
                 h.make_node("Erf", ["g1"], ["g2"], name="erf"), h.make_node("Add", ["one", "g2"], ["g3"], name="add1"),
                 h.make_node("Mul", ["h", "g3"], [y], name="mul1")]
    else:  # ((1 + erf(x * 1/sqrt2)) * 0.5) * x
        s2[0] = tensor("sqrt2", np.float32(1 / np.sqrt(2.0)))
        nodes = [h.make_node("Mul", [x, "sqrt2"], ["g1"], name="div"), h.make_node("Erf", ["g1"], ["g2"], name="erf"),
                 h.make_node("Add", ["g2", "one"], ["g3"], name="add1"), h.make_node("Mul", ["g3", "half"], ["g4"], name="mul1"),
                 h.make_node("Mul", ["g4", x], [y], name="mul2")]
    return nodes, s2


@pytest.mark.parametrize("form", [0, 1, 2])
def test_decomposed_gelu_to_contrib_gelu(form):
    nodes, inits = gelu_nodes("x", "y", form)
    m = mk(nodes, [value_info("x", shape=["batch", 8, 16])], [value_info("y", shape=None)], inits)
    res = check(m, {"com.microsoft:Gelu": 1})
    assert res.plan.rule_counts() == {"gelu": 1}


def test_gelu_opset20_uses_onnx_gelu_and_onnx_lowering_respects_opset():
    nodes, inits = gelu_nodes("x", "y")
    m20 = mk(nodes, [value_info("x", shape=[2, 16])], [value_info("y", shape=None)], inits, opset=20)
    check(m20, {"Gelu": 1}, lower="onnx")
    m17 = mk(nodes, [value_info("x", shape=[2, 16])], [value_info("y", shape=None)], inits)
    unchanged(m17, lower="onnx")


def test_bias_gelu():
    nodes, inits = gelu_nodes("xb", "y")
    m = mk([h.make_node("Add", ["x", "bias"], ["xb"], name="badd")] + nodes,
                   [value_info("x", shape=["batch", 8, 16])], [value_info("y", shape=None)], inits + [tensor("bias", r(16))])
    res = check(m, {"com.microsoft:BiasGelu": 1})
    assert res.plan.rule_counts() == {"bias_gelu": 1}


def test_gelu_with_intermediate_graph_output_not_fused():
    nodes, inits = gelu_nodes("x", "y")
    m = mk(nodes, [value_info("x", shape=[2, 16])], [value_info("y", shape=None), value_info("g3", shape=None)], inits)
    unchanged(m)


def ln_nodes(x, y, *, with_affine=True):
    nodes = [h.make_node("ReduceMean", [x], ["mu"], name="mean", axes=[-1]),
             h.make_node("Sub", [x, "mu"], ["d"], name="sub"),
             h.make_node("Pow", ["d", "two"], ["d2"], name="pow"),
             h.make_node("ReduceMean", ["d2"], ["var"], name="mean2", axes=[-1]),
             h.make_node("Add", ["var", "eps"], ["ve"], name="addeps"),
             h.make_node("Sqrt", ["ve"], ["std"], name="sqrt"),
             h.make_node("Div", ["d", "std"], ["nrm"], name="div"),
             h.make_node("Mul", ["nrm", "gamma"], ["sc"], name="mulg"),
             h.make_node("Add", ["sc", "beta"], [y], name="addb")]
    inits = [tensor("two", np.float32(2.0)), tensor("eps", np.float32(1e-5)), tensor("gamma", r(16)), tensor("beta", r(16))]
    return nodes, inits


def test_decomposed_layernorm_opset17():
    nodes, inits = ln_nodes("x", "y")
    m = mk(nodes, [value_info("x", shape=["batch", 8, 16])], [value_info("y", shape=None)], inits)
    res = check(m, {"LayerNormalization": 1})
    assert res.plan.rule_counts() == {"layernorm": 1}


def test_layernorm_opset13_has_no_standard_op_left_alone():
    nodes, inits = ln_nodes("x", "y")
    m = mk(nodes, [value_info("x", shape=["batch", 8, 16])], [value_info("y", shape=None)], inits, opset=13)
    res = unchanged(m)
    assert any("opset 17" in n for n in res.plan.notes)


def test_skip_layernorm_and_onnx_lowering():
    nodes, inits = ln_nodes("s", "y")
    m = mk([h.make_node("Add", ["x", "skip"], ["s"], name="resid")] + nodes,
                   [value_info("x", shape=["batch", 8, 16]), value_info("skip", shape=["batch", 8, 16])],
                   [value_info("y", shape=None)], inits)
    res = check(m, {"com.microsoft:SkipLayerNormalization": 1}, rules=RULE_NAMES)  # opt-in rule
    assert res.plan.rule_counts() == {"skip_layernorm": 1}
    check(m, {"Add": 1, "LayerNormalization": 1}, lower="onnx", rules=RULE_NAMES)
    default = check(m, {"Add": 1, "LayerNormalization": 1})  # by default: measured slower, not fused
    assert default.plan.rule_counts() == {"layernorm": 1}


def test_skip_layernorm_needs_same_shapes():
    nodes, inits = ln_nodes("s", "y")
    m = mk([h.make_node("Add", ["x", "skip"], ["s"], name="resid")] + nodes,
                   [value_info("x", shape=["batch", 8, 16]), value_info("skip", shape=[8, 16])],
                   [value_info("y", shape=None)], inits)
    check(m, {"Add": 1, "LayerNormalization": 1}, rules=RULE_NAMES)


def test_standalone_silu_to_quickgelu():
    m = mk([h.make_node("Add", ["x", "x"], ["a"], name="add"), h.make_node("Sigmoid", ["a"], ["s"], name="sig"),
                    h.make_node("Mul", ["s", "a"], ["y"], name="mul")],
                   [value_info("x", shape=[2, 16])], [value_info("y", shape=None)])
    check(m, {"Add": 1, "com.microsoft:QuickGelu": 1})


# ---------------------------------------------------------------------------------------------------
# the pass protocol and options
# ---------------------------------------------------------------------------------------------------

def test_rules_subset_and_bad_options():
    m = conv_model([bn_node("c", "n"), h.make_node("Relu", ["n"], ["y"], name="relu")], bn_params(8))
    check(m, {"Conv": 1, "Relu": 1}, rules=["conv_bn"])
    check(m, {"Conv": 1, "Relu": 1}, rules="conv_bn,gelu")
    with pytest.raises(ValueError, match="unknown vertical rule"):
        fuse(m, rules=["conv_bnn"])
    with pytest.raises(ValueError, match="unknown lowering"):
        fuse(m, lower="gpu")


def test_plan_is_pure_and_json_round_trips():
    m = conv_model([h.make_node("Identity", ["c"], ["i"], name="id"), bn_node("i", "y")], bn_params(8))
    g = load(m)
    before = g.op_counts()
    p = vertical.plan(g)
    assert g.op_counts() == before and len(p) == 1
    assert FusionPlan.from_json(p.to_json()) == p


def test_stale_plan_group_is_refused_by_name():
    """A plan group whose nodes no longer match is refused, naming the group (it was silently dropped before)."""
    from fusionlab.passes import StaleGroup

    m = conv_model([bn_node("c", "y")], bn_params(8))
    g = load(m)
    p = vertical.plan(g)
    p.groups[0].nodes = ["conv", "nonexistent"]
    with pytest.raises(StaleGroup, match="group v0 .*'nonexistent' is not in the model"):
        vertical.apply(g, p)
    assert g.op_counts() == {"BatchNormalization": 1, "Conv": 1}


def test_fuse_never_touches_the_input_model():
    m = conv_model([bn_node("c", "y")], bn_params(8))
    g = load(m)
    fuse(g)
    assert g.op_counts() == {"BatchNormalization": 1, "Conv": 1}


# ---------------------------------------------------------------------------------------------------
# real (zoo) models: fuse, verify, and the expected group counts derived from the original graph
# ---------------------------------------------------------------------------------------------------

zoo = pytest.importorskip("fusionlab.zoo")

ZOO_CASES = {
    "resnet_small": {},
    "yolov5s": {"image_size": 64, "width_mult": 0.125, "depth_mult": 0.33},
    "mobilenet_v2": {"image_size": 32, "width_mult": 0.25},
    "bert": {"layers": 2, "hidden": 64, "heads": 2, "intermediate": 128, "vocab": 100},
}


def _after_bn(graph, op):
    """How many BatchNormalization outputs feed straight (and only) into `op`."""
    count = 0
    for n in graph:
        if n.op_type == "BatchNormalization":
            users = graph.consumers(n.outputs[0])
            if op in ("Relu", "Clip") and len(users) == 1 and users[0].op_type == op:
                count += 1
            elif op == "SiLU" and sorted(u.op_type for u in users) == ["Mul", "Sigmoid"]:
                count += 1
    return count


@pytest.mark.parametrize("name", sorted(ZOO_CASES))
def test_zoo_models_fuse_and_verify(name):
    model = zoo.get(name, **ZOO_CASES[name])
    graph = load(model)
    res = fuse(graph)
    ref = __import__("fusionlab").run(model)
    scale = max(1.0, max(float(np.abs(v).max()) for v in ref.values() if v.dtype.kind == "f"))
    # Folding BN reassociates fp32 arithmetic in every conv; across a deep net the error grows with the
    # activation scale, not per element (onnxruntime's own BASIC-level folding shows the same ~1e-6 x scale),
    # so the absolute tolerance is taken relative to the largest output.
    report = verify(model, res.graph.to_proto(), atol=1e-5 * scale)
    assert report.ok, report.table()
    rules = res.plan.rule_counts()
    bn = graph.op_counts().get("BatchNormalization", 0)
    if name != "bert":
        assert res.after.get("BatchNormalization", 0) == 0
        assert rules.get("conv_bn", 0) + rules.get("conv_bn_act", 0) + rules.get("conv_add_act", 0) == bn
    if name == "resnet_small":
        # BN->Relu chains, plus BN->Add(residual)->Relu chains (FusedConv with its Z input)
        residual = graph.op_counts()["Add"]
        assert res.after.get("com.microsoft:FusedConv", 0) == _after_bn(graph, "Relu") + residual > residual
    if name == "mobilenet_v2":
        assert res.after.get("com.microsoft:FusedConv", 0) == _after_bn(graph, "Clip") > 0
    if name == "yolov5s":
        assert res.after.get("com.microsoft:QuickGelu", 0) == _after_bn(graph, "SiLU") == bn
        assert "Sigmoid" not in res.after
    if name == "bert":
        layers = ZOO_CASES["bert"]["layers"]
        assert rules["bias_gelu"] == layers and "Erf" not in res.after
        assert "skip_layernorm" not in rules  # opt-in (measured slower on CPU)
        assert rules["layernorm"] == graph.op_counts()["Sqrt"]  # every decomposed LayerNorm
        opted = fuse(graph, passes=("vertical",), rules=RULE_NAMES).plan.rule_counts()
        assert opted["skip_layernorm"] >= layers  # the FFN residual of every layer
        assert opted["skip_layernorm"] + opted.get("layernorm", 0) == graph.op_counts()["Sqrt"]


# ---------------------------------------------------------------------------------------------------
# Conv (+ BN) + residual Add + activation -> FusedConv with its Z input
# ---------------------------------------------------------------------------------------------------

def residual_model(*, z_shape=("batch", 8, 8, 8), bias=True, tail="Relu", add_inputs=("n", "z"), bn=True,
                   extra_outputs=()):
    nodes = ([bn_node("c", "n")] if bn else [h.make_node("Identity", ["c"], ["n"], name="id")]) + \
        [h.make_node("Add", list(add_inputs), ["s"], name="add")]
    if tail:
        nodes.append(h.make_node(tail, ["s"], ["y"], name="act"))
    else:
        nodes.append(h.make_node("Neg", ["s"], ["y"], name="neg"))
    m = conv_model(nodes, bn_params(8), bias=bias, extra_outputs=extra_outputs)
    m.graph.input.append(value_info("z", np.float32, list(z_shape)))
    return m


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("order", [("n", "z"), ("z", "n")])
def test_residual_add_relu_becomes_one_fusedconv(bias, order):
    m = residual_model(bias=bias, add_inputs=order)
    res = check(m, {"com.microsoft:FusedConv": 1})
    assert res.plan.rule_counts() == {"conv_add_act": 1}
    fused = next(n for n in res.graph.graph if n.op_type == "FusedConv")
    assert len(fused.inputs) == 4 and fused.inputs[3].name == "z"
    assert res.plan[0].op_types == ["Conv", "BatchNormalization", "Add", "Relu"] and res.plan[0].saved_launches == 3


def test_residual_add_is_not_fused_when_it_would_broadcast():
    m = residual_model(z_shape=("batch", 8, 1, 1))
    res = check(m)
    assert "conv_add_act" not in res.plan.rule_counts()
    assert res.after.get("Add") == 1
    assert any("residual" in n for n in res.plan.notes)


def test_residual_add_needs_a_fusedconv_activation_after_it():
    res = check(residual_model(tail=None))
    assert "conv_add_act" not in res.plan.rule_counts() and res.after.get("Add") == 1


def test_residual_add_with_itself_or_as_graph_output_is_left_alone():
    res = check(residual_model(add_inputs=("n", "n")))
    assert "conv_add_act" not in res.plan.rule_counts()
    res = check(residual_model(extra_outputs=("s",)))
    assert "conv_add_act" not in res.plan.rule_counts() and res.after.get("Add") == 1


def test_residual_add_not_in_onnx_lowering_and_opt_out():
    res = check(residual_model(), lower="onnx")
    assert "FusedConv" not in str(res.after) and res.after.get("Add") == 1
    res = check(residual_model(), rules=[r for r in RULE_NAMES if r != "conv_add_act"])
    assert res.after == {"Add": 1, "Conv": 1, "Relu": 1}  # BN folded; the Relu follows the Add, not the conv


def test_resnet_residual_blocks_fuse_their_adds():
    from fusionlab import zoo

    m = zoo.resnet_small()
    res = check(m)
    adds = load(m).op_counts()["Add"]
    assert res.plan.rule_counts()["conv_add_act"] == adds and "Add" not in res.after and "Relu" not in res.after


# ---------------------------------------------------------------------------------------------------
# tanh-GELU -> FastGelu: any arrangement of the polynomial, proved by multiplying it out
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("form", ["ort", "pow", "div", "sub"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_tanh_gelu_in_any_arrangement_becomes_fast_gelu(form, with_bias):
    nodes, inits = tanh_gelu(form, "xb" if with_bias else "x")
    if with_bias:
        nodes = [h.make_node("Add", ["x", "bias"], ["xb"], name="bias_add")] + nodes
        inits = inits + [tensor("bias", r(16))]
    m = mk(nodes, [value_info("x", shape=[2, 8, 16])], [value_info("y", shape=[2, 8, 16])], inits, opset=17)
    res = check(m, {"com.microsoft:FastGelu": 1})
    node = next(iter(res.graph))
    assert len(node.inputs) == (2 if with_bias else 1)
    assert res.plan.rule_counts() == {"fast_gelu": 1}


def test_tanh_gelu_of_a_computed_value_keeps_the_computation():
    """x = 2h: the GELU is of x, not of h (the nearest candidate that proves the polynomial wins)."""
    nodes, inits = tanh_gelu("ort", "x2")
    m = mk([h.make_node("Mul", ["x", "two"], ["x2"], name="scale")] + nodes, [value_info("x", shape=[4, 16])],
           [value_info("y", shape=[4, 16])], inits, opset=17)
    check(m, {"Mul": 1, "com.microsoft:FastGelu": 1})


@pytest.mark.parametrize("case", ["wrong_constant", "graph_output", "two_variables", "fp16"])
def test_tanh_gelu_not_fused(case):
    k = 0.05 if case == "wrong_constant" else 0.044715
    nodes, inits = tanh_gelu("ort", k=k)
    outputs = [value_info("y", shape=[4, 16])]
    inputs = [value_info("x", shape=[4, 16])]
    if case == "graph_output":
        outputs.append(value_info("t", shape=[4, 16]))
    if case == "two_variables":  # the outer x*0.5 reads another tensor z
        nodes[7] = h.make_node("Mul", ["z", "half"], ["m5"], name="g7_Mul")
        inputs.append(value_info("z", shape=[4, 16]))
    if case == "fp16":
        inits = [tensor(t.name, onnx.numpy_helper.to_array(t).astype(np.float16)) for t in inits]
        inputs = [value_info("x", np.float16, [4, 16])]
        outputs = [value_info("y", np.float16, [4, 16])]
    m = mk(nodes, inputs, outputs, inits, opset=17)
    res = unchanged(m)
    assert res.after.get("Tanh") == 1


def test_tanh_gelu_with_standard_ops_only():
    nodes, inits = tanh_gelu("pow")
    for opset, expect in ((20, {"Gelu": 1}), (17, None)):
        m = mk(nodes, [value_info("x", shape=[4, 16])], [value_info("y", shape=[4, 16])], inits, opset=opset)
        if expect is None:
            res = unchanged(m, lower="onnx")
            assert any("opset 20" in n for n in res.plan.notes), res.plan.notes
        else:
            res = check(m, expect, lower="onnx")
            assert next(iter(res.graph)).attributes["approximate"].value == "tanh"
