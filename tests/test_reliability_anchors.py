"""Reliability anchors: one test per real fusion bug from other projects that applies to our passes.

The catalogue is section 2 (items 1-34) and section 4 (loading untrusted models) of the research notes
`reliability_anchors.md`; `docs/reliability_anchors.md` maps every item to its test here or says why it
does not apply. Each test builds a tiny model, runs the pass(es) the bug was in, and asserts the outcome:
an illegal rewrite must leave the graph alone (and the result still verifies), a legal one must happen
*and* verify at the project tolerances (fusionlab.verification.runtime.TOLERANCES). The last test keeps the doc and
this file in step.
"""

from __future__ import annotations

import ast
import itertools
import os
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper as h

from fusionlab import ModelError, load, run, verify
from fusionlab.build import make_model, save_with_external_weight, tensor, value_info
from fusionlab.passes import fuse
from fusionlab.verification.runtime import TOLERANCES

RNG = np.random.default_rng(2024)
F32, F16, F64 = np.float32, np.float16, np.float64
ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "reliability_anchors.md"


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------

def r(*shape, dtype=F32, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def bn_inits(c, prefix="bn", dtype=F32, stats_dtype=None, var=None):
    """scale, bias, mean, var initializers named <prefix>_g/_b/_m/_v (stats may have their own dtype, BN-15)."""
    sd = stats_dtype or dtype
    v = np.abs(r(c)) + 0.5 if var is None else np.asarray(var)
    return [tensor(f"{prefix}_g", r(c).astype(dtype)), tensor(f"{prefix}_b", r(c).astype(dtype)),
            tensor(f"{prefix}_m", r(c).astype(sd)), tensor(f"{prefix}_v", v.astype(sd))]


def bn(x, y, prefix="bn", outputs=None, **attrs):
    ins = [x, f"{prefix}_g", f"{prefix}_b", f"{prefix}_m", f"{prefix}_v"]
    return h.make_node("BatchNormalization", ins, outputs or [y], name=prefix, **attrs)


def conv_model(tail, tail_inits=(), *, cin=3, cout=4, k=3, hw=6, group=1, bias=True, dtype=F32, opset=17,
               outputs=("y",), name="conv", extra_inputs=()):
    """x[1,cin,hw,hw] -> Conv(W[,B]) -> c -> tail...; graph outputs named in `outputs` (shapes inferred)."""
    inits = [tensor("W", r(cout, cin // group, k, k, dtype=dtype))]
    inits += [tensor("B", r(cout, dtype=dtype))] if bias else []
    conv = h.make_node("Conv", ["x", "W"] + (["B"] if bias else []), ["c"], name=name, kernel_shape=[k, k],
                       pads=[k // 2] * 4, group=group)
    inputs = [value_info("x", dtype, [1, cin, hw, hw])] + list(extra_inputs)
    return mk([conv] + list(tail), inputs, outputs, inits + list(tail_inits), opset=opset, dtype=dtype)


def mk(nodes, inputs, outputs, inits, *, opset=17, dtype=F32, **kw):
    """make_model with graph outputs given by name: their types and shapes come from shape inference."""
    outs = [o if isinstance(o, onnx.ValueInfoProto) else value_info(o, dtype, None) for o in outputs]
    m = make_model(nodes, inputs, outs, inits, opset=opset, **kw)
    bare = onnx.ModelProto()
    bare.CopyFrom(m)
    bare.graph.ClearField("output")  # a shapeless output would stop inference from filling the others in
    try:
        inferred = onnx.shape_inference.infer_shapes(bare)
    except Exception:
        return m
    g = inferred.graph
    known = {vi.name: vi for vi in list(g.input) + list(g.value_info) + list(g.output)}
    known.update({i.name: h.make_tensor_value_info(i.name, i.data_type, list(i.dims)) for i in m.graph.initializer})
    for out in m.graph.output:
        if not out.type.tensor_type.HasField("shape") and out.name in known:
            out.type.CopyFrom(known[out.name].type)
    return m


def well_formed(proto: onnx.ModelProto) -> None:
    """What the catalogued rewrites broke: SSA names, unique initializers/attributes, defined-before-use, checker."""
    g = proto.graph
    inits = [i.name for i in g.initializer]
    assert len(inits) == len(set(inits)), f"duplicate initializer names {inits}"
    defined = {i.name for i in g.input} | set(inits) | {""}
    for node in g.node:
        attrs = [a.name for a in node.attribute]
        assert len(attrs) == len(set(attrs)), f"{node.name}: attribute appears twice {attrs}"
        missing = [i for i in node.input if i not in defined]
        assert not missing, f"{node.name} reads {missing}, which nothing before it defines"
        for o in node.output:
            assert o == "" or o not in defined, f"{o} is defined twice"
            defined.add(o)
    assert not [o.name for o in g.output if o.name not in defined], "a graph output is produced by nothing"
    onnx.checker.check_model(proto, full_check=True)


def fused(model, passes=("vertical",), **opts):
    """fuse, then check the result is a well-formed model."""
    res = fuse(model, passes=passes, **opts)
    well_formed(res.graph.to_proto())
    return res


def verifies(original, res, **kw) -> None:
    report = verify(original, res.graph.to_proto(), **kw)
    assert report.ok, report.table()


def grouped(res, *names) -> bool:
    """True if any fusion group contains any of the named nodes."""
    taken = res.plan.node_to_group()
    return any(n in taken for n in names)


def ops(res) -> dict:
    return res.after


def nodes_of(res, op_type):
    return [n for n in res.graph if n.op_type == op_type]


def outputs_sig(proto: onnx.ModelProto):
    def dims(vi):
        return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in vi.type.tensor_type.shape.dim]
    return [(o.name, o.type.tensor_type.elem_type, dims(o)) for o in proto.graph.output]


# --------------------------------------------------------------------------------------------------
# A. Conv + BatchNormalization folding
# --------------------------------------------------------------------------------------------------

def test_anchor_01_conv_bn_folds_completely_with_fresh_names():
    """Anchor 1, onnx/optimizer #133 (+ #174, PR #277): fuse_bn_into_conv left an unfolded Cast/Sqrt/Div/... subgraph
    behind and reused initializer names. Two Conv+BN pairs, and initializers already named like the ones a fold would
    generate: no BN and no helper op remains, names are fresh, the pre-existing tensors are untouched."""
    taken = r(1, 4, 1, 1)
    nodes = [h.make_node("Conv", ["x", "W1", "B1"], ["c1"], name="conv", kernel_shape=[1, 1]), bn("c1", "y1", "bn1"),
             h.make_node("Conv", ["x", "W2"], ["c2"], name="conv2", kernel_shape=[1, 1]), bn("c2", "y2", "bn2"),
             h.make_node("Add", ["y2", "conv_W_fused"], ["a"], name="other"),
             h.make_node("Add", ["a", "conv_B_fused"], ["y3"], name="other2")]
    inits = [tensor("W1", r(4, 3, 1, 1)), tensor("B1", r(4)), tensor("W2", r(4, 3, 1, 1)),
             tensor("conv_W_fused", taken), tensor("conv_B_fused", taken)] + bn_inits(4, "bn1") + bn_inits(4, "bn2")
    m = mk(nodes, [value_info("x", shape=[1, 3, 5, 5])], ["y1", "y2", "y3"], inits)
    res = fused(m)
    assert ops(res) == {"Add": 2, "Conv": 2}
    assert res.plan.rule_counts() == {"conv_bn": 2}
    proto = res.graph.to_proto()
    init = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer}
    np.testing.assert_array_equal(init["conv_W_fused"], taken)
    np.testing.assert_array_equal(init["conv_B_fused"], taken)
    assert not [n for n in init if n.startswith(("bn1_", "bn2_", "W1", "B1", "W2"))]  # old parameters gone
    conv_inputs = {i for n in proto.graph.node if n.op_type == "Conv" for i in n.input[1:]}
    assert len(conv_inputs) == 4 and not conv_inputs & {"conv_W_fused", "conv_B_fused"}
    verifies(m, res)


@pytest.mark.parametrize("opset", [11, 12, 13, 17])
def test_anchor_02_inserted_split_matches_the_opset(opset):
    """Anchor 2, onnx/optimizer commit 156fc4d: a rewrite inserted the opset-13 form of Unsqueeze into opset-12 models.
    Our inserted helper is horizontal fusion's Split: `split` is an attribute before opset 13, an input from 13."""
    nodes = [h.make_node("Conv", ["x", f"W{k}"], [k], name=f"{k}_conv", kernel_shape=[1, 1]) for k in "ab"]
    nodes.append(h.make_node("Mul", ["a", "b"], ["y"], name="mul"))
    inits = [tensor("Wa", r(3, 4, 1, 1)), tensor("Wb", r(3, 4, 1, 1))]
    m = mk(nodes, [value_info("x", shape=[1, 4, 5, 5])], ["y"], inits, opset=opset)
    res = fused(m, ("horizontal",))
    (split,) = nodes_of(res, "Split")
    if opset < 13:
        assert len(split.inputs) == 1 and list(split.attributes["split"].value) == [3, 3]
    else:
        assert len(split.inputs) == 2 and "split" not in split.attributes
    verifies(m, res)


def test_anchor_03_fold_verifies_at_documented_fp32_tolerance():
    """Anchor 3, onnx/optimizer #255: a fuzzer flagged a fold at max_abs 3.8e-6 because no tolerance was documented.
    Ours is fixed (fp32 rtol 1e-4 / atol 1e-5) and a fold passes it on NNSmith-style inputs in [1, 2)."""
    assert TOLERANCES[np.dtype(F32)] == (1e-4, 1e-5)
    m = conv_model([bn("c", "y")], bn_inits(4))
    res = fused(m)
    assert ops(res) == {"Conv": 1}
    feeds = {"x": RNG.uniform(1.0, 2.0, (1, 3, 6, 6)).astype(F32)}
    report = verify(m, res.graph.to_proto(), feeds=feeds)
    assert report.ok, report.table()
    assert (report.outputs[0].rtol, report.outputs[0].dtype) == (1e-4, "float32")


@pytest.mark.parametrize("case", ["outputs_used", "outputs_declared"])
def test_anchor_04_bn_with_optional_outputs_not_folded(case):
    """Anchor 4, ORT PR #2216 (test DontFuseConvWithBNWithOptionalOutputs): BN carrying optional (training) outputs
    was folded anyway. BN-9 with mean/var outputs, used as graph outputs or only declared: must not fold."""
    outs = ["y", "rm", "rv", "sm", "sv"]
    m = conv_model([bn("c", "y", outputs=outs)], bn_inits(4), opset=9,
                   outputs=("y", value_info("rm", F32, [4])) if case == "outputs_used" else ("y",))
    res = fused(m)
    assert ops(res) == {"BatchNormalization": 1, "Conv": 1} and not grouped(res, "bn")
    verifies(m, res)


@pytest.mark.parametrize("opset,stats", [(7, F32), (9, F32), (14, F32), (15, F32), (15, F16)])
def test_anchor_05_bn_folds_at_every_bn_opset(opset, stats):
    """Anchor 5, ORT PR #11960: BN-15 was missing from the allowed versions, so folding silently stopped after an opset
    upgrade. BN 7, 9, 14, 15 (and BN-15 with fp16 mean/var next to fp32 scale/bias) all fold and verify."""
    m = conv_model([bn("c", "y")], bn_inits(4, stats_dtype=stats), opset=opset)
    res = fused(m)
    assert ops(res) == {"Conv": 1}
    assert res.plan.rule_counts() == {"conv_bn": 1}
    verifies(m, res)


@pytest.mark.parametrize("opset", [14, 15])
def test_anchor_06_training_mode_bn_not_folded(opset):
    """Anchor 6, BN training_mode (onnx PR #3333; ORT's ConvBNFusion does not check it): a BN with training_mode=1
    normalises with batch statistics. Its running-stat outputs are declared but unused: it still must not fold."""
    m = conv_model([bn("c", "y", outputs=["y", "rm", "rv"], training_mode=1)], bn_inits(4), opset=opset)
    res = fused(m)
    assert ops(res) == {"BatchNormalization": 1, "Conv": 1} and not grouped(res, "bn")
    verifies(m, res)


def test_anchor_07_weight_shared_with_an_unfused_conv_is_not_mutated():
    """Anchor 7, PyTorch #104593 / #197539: a Conv reused on two paths got BN-folded weights on the path without BN.
    ONNX analogue: one W initializer read by two Convs, only one followed by BN."""
    w = r(4, 3, 3, 3)
    nodes = [h.make_node("Conv", ["x", "W"], ["c1"], name="conv1", kernel_shape=[3, 3]), bn("c1", "y1"),
             h.make_node("Conv", ["x", "W"], ["y2"], name="conv2", kernel_shape=[3, 3])]
    m = mk(nodes, [value_info("x", shape=[1, 3, 6, 6])], ["y1", "y2"], [tensor("W", w)] + bn_inits(4))
    res = fused(m)
    assert ops(res) == {"Conv": 2} and res.plan.rule_counts() == {"conv_bn": 1}
    conv2 = res.graph.node("conv2")
    assert conv2.inputs[1].name == "W"
    np.testing.assert_array_equal(conv2.inputs[1].const_value.numpy(), w)
    folded = next(n for n in res.graph if n.op_type == "Conv" and n is not conv2)
    assert folded.inputs[1].name != "W"
    verifies(m, res)


def test_anchor_08_shared_bn_bias_and_duplicate_node_names_fold_separately():
    """Anchor 8, TNN #808 / onnxruntime-qnn PR #582 / onnxscript PR #2680: shared conv weights, two BNs sharing a bias
    initializer with different mean/var (the folded tensor was cached by name), and generated names that collided.
    Here both Convs share W, both BNs share scale and bias, and the Conv and BN node names are duplicated."""
    def model(names):
        nodes = [h.make_node("Conv", ["x", "W"], ["c1"], name=names[0], kernel_shape=[1, 1]),
                 h.make_node("BatchNormalization", ["c1", "g", "beta", "m1", "v1"], ["y1"], name=names[1]),
                 h.make_node("Conv", ["x", "W"], ["c2"], name=names[2], kernel_shape=[1, 1]),
                 h.make_node("BatchNormalization", ["c2", "g", "beta", "m2", "v2"], ["y2"], name=names[3])]
        return mk(nodes, [value_info("x", shape=[1, 3, 4, 4])], ["y1", "y2"], inits)

    inits = [tensor("W", r(3, 3, 1, 1)), tensor("g", r(3)), tensor("beta", r(3)), tensor("m1", r(3)),
             tensor("v1", np.abs(r(3)) + 0.5), tensor("m2", r(3) + 3.0), tensor("v2", np.abs(r(3)) + 4.0)]
    reference = model(["conv_a", "bn_a", "conv_b", "bn_b"])  # onnxruntime refuses duplicate node names
    res = fused(model(["conv", "bn", "conv", "bn"]))
    assert ops(res) == {"Conv": 2} and res.plan.rule_counts() == {"conv_bn": 2}
    biases = [n.inputs[2].const_value.numpy() for n in nodes_of(res, "Conv")]
    assert not np.allclose(biases[0], biases[1])
    verifies(reference, res)


@pytest.mark.parametrize("second", ["conv_output", "bn_output"])
def test_anchor_09_second_consumer_of_the_conv_blocks_folding(second):
    """Anchor 9, executorch PR #20601: the fuser checked the BN's user count instead of the Conv's, so a Conv read by
    {BN, Relu} was folded and the Relu got corrupted values. A second reader of the Conv output blocks the fold; a
    second reader of the BN output does not."""
    reader = "c" if second == "conv_output" else "y"
    m = conv_model([bn("c", "y"), h.make_node("Relu", [reader], ["z"], name="relu")], bn_inits(4), outputs=("y", "z"))
    res = fused(m)
    if second == "conv_output":
        assert ops(res)["BatchNormalization"] == 1 and not grouped(res, "bn")
    else:
        assert "BatchNormalization" not in ops(res) and res.plan.rule_counts() == {"conv_bn": 1}
    verifies(m, res)


@pytest.mark.parametrize("group,cin,cout", [(1, 4, 6), (2, 4, 6), (2, 6, 4)])
def test_anchor_10_convtranspose_bn_scales_the_output_channel_axis(group, cin, cout):
    """Anchor 10, ultralytics PR #25364 / onnx/optimizer PR #106,#316 / PyTorch #180995: ConvTranspose+BN scaled weight
    axis 0, but ConvTranspose weights are [C_in, C_out/group, k, k]; grouped ones crashed. C_in != C_out here."""
    nodes = [h.make_node("ConvTranspose", ["x", "W", "B"], ["c"], name="deconv", group=group, kernel_shape=[3, 3]),
             bn("c", "y")]
    m = mk(nodes, [value_info("x", shape=[1, cin, 5, 5])], ["y"],
           [tensor("W", r(cin, cout // group, 3, 3)), tensor("B", r(cout))] + bn_inits(cout))
    res = fused(m)
    assert ops(res) == {"ConvTranspose": 1} and res.plan.rule_counts() == {"convtranspose_bn": 1}
    verifies(m, res)


@pytest.mark.parametrize("tail", ["bn", "add", "mul_add", "residual_relu"])
@pytest.mark.parametrize("group,cin,cout", [(1, 4, 6), (2, 4, 6), (6, 6, 6)])
def test_anchor_11_grouped_and_depthwise_conv_folds(tail, group, cin, cout):
    """Anchor 11, LeViT PR #22 / ncnn #1339 / ORT #12498: grouped-conv folds computed channels from w.size(1), a
    depthwise conv's bias was folded as bias+a instead of bias*s+a, and ConvAdd fusion was wrong with `group`.
    Grouped and depthwise Convs with a bias, followed by BN, a per-channel Add, Mul+Add, or a residual Add+Relu."""
    inits, extra = [], []
    if tail == "bn":
        nodes, inits = [bn("c", "y")], bn_inits(cout)
    elif tail == "add":
        nodes, inits = [h.make_node("Add", ["c", "t"], ["y"], name="add")], [tensor("t", r(cout, 1, 1))]
    elif tail == "mul_add":
        nodes = [h.make_node("Mul", ["c", "s"], ["p"], name="mul"), h.make_node("Add", ["p", "t"], ["y"], name="add")]
        inits = [tensor("s", r(1, cout, 1, 1)), tensor("t", r(cout, 1, 1))]
    else:  # FusedConv's residual input Z
        nodes = [h.make_node("Add", ["c", "z"], ["s"], name="add"), h.make_node("Relu", ["s"], ["y"], name="relu")]
        extra = [value_info("z", F32, [1, cout, 6, 6])]
    m = conv_model(nodes, inits, cin=cin, cout=cout, group=group, extra_inputs=extra)
    res = fused(m)
    assert grouped(res, "conv")
    if tail == "residual_relu":
        (fc,) = nodes_of(res, "FusedConv")
        assert len(fc.inputs) == 4 and int(fc.attributes["group"].value) == group
    else:
        assert ops(res) == {"Conv": 1}
    verifies(m, res)


@pytest.mark.parametrize("which", ["W", "B", "bn_g", "bn_b", "bn_m", "bn_v", "computed"])
def test_anchor_12_non_constant_parameters_are_not_folded(which):
    """Anchor 12, ORT PR #32143 / PR #3721: folding needs constant W, B, scale, bias, mean, var; an initializer that is
    also a graph input can be overridden at run time. Overridden at run time here, the output must follow."""
    inits, tail, extra = bn_inits(4), [bn("c", "y")], []
    feeds = {"x": r(1, 3, 6, 6)}
    if which == "computed":  # BN scale computed at run time from an input
        inits = [i for i in inits if i.name != "bn_g"]
        tail = [h.make_node("Abs", ["s"], ["bn_g"], name="abs")] + tail
        extra = [value_info("s", F32, [4])]
        feeds["s"] = r(4)
    m = conv_model(tail, inits, extra_inputs=extra)
    if which != "computed":
        init = next(i for i in m.graph.initializer if i.name == which)
        m.graph.input.append(value_info(which, F32, list(init.dims)))
        feeds[which] = (np.abs(onnx.numpy_helper.to_array(init)) + 1.0).astype(F32)  # a different value at run time
    res = fused(m)
    assert ops(res)["BatchNormalization"] == 1 and not grouped(res, "bn")
    np.testing.assert_allclose(run(res.graph, feeds)["y"], run(m, feeds)["y"], rtol=1e-4, atol=1e-5)
    verifies(m, res)


@pytest.mark.parametrize("eps", [1e-3, None, 1e-9])
def test_anchor_13_zero_variance_folds_with_the_nodes_epsilon(eps):
    """Anchor 13, tf-onnx #1075 / ai8x-training PR #108 / ncnn PR #311: var=0 gave scale 1/sqrt(eps) from a hard-coded
    eps, or eps was added outside the sqrt. With var=0 only BN's own epsilon (default 1e-5) inside sqrt verifies."""
    attrs = {} if eps is None else {"epsilon": eps}
    m = conv_model([bn("c", "y", **attrs)], bn_inits(4, var=np.zeros(4)))
    res = fused(m)
    assert ops(res) == {"Conv": 1}
    verifies(m, res)


def test_anchor_13_zero_variance_and_zero_epsilon_not_folded():
    """Anchor 13, tf-onnx #1075: var + eps = 0 has no finite fold; the BN stays (and the output keeps its inf/NaN)."""
    m = conv_model([bn("c", "y", epsilon=0.0)], bn_inits(4, var=np.zeros(4)))
    res = fused(m)
    assert ops(res)["BatchNormalization"] == 1 and not grouped(res, "bn")
    verifies(m, res)


def test_anchor_14_fp16_folds_in_high_precision():
    """Anchor 14, PyTorch PR #106576 / apple/coreai-torch PR #54 / tf-onnx PR #1106: folding in fp16 loses accuracy, and
    casting fp32 BN statistics to fp16 turned var > 65504 into inf and zeroed the output. fp16 Conv + BN-15 with fp32
    statistics up to 1e5: folds, weights stay fp16 and finite, verifies at fp16 tolerances."""
    var = np.array([1e5, 7e4, 2.0, 0.5])
    inits = [tensor("bn_g", (r(4) * 300).astype(F32)), tensor("bn_b", r(4)), tensor("bn_m", r(4)),
             tensor("bn_v", var.astype(F32))]
    m = conv_model([bn("c", "y")], inits, dtype=F16, opset=15)
    res = fused(m)
    assert ops(res) == {"Conv": 1}
    w = nodes_of(res, "Conv")[0].inputs[1].const_value.numpy()
    assert w.dtype == F16 and np.all(np.isfinite(w)) and np.all(np.abs(w[:2]).max(axis=(1, 2, 3)) > 0)
    verifies(m, res)


def test_anchor_14_fp16_activation_gets_no_fused_kernel():
    """Anchor 14, ORT #12045: FusedConv was created for fp16 where no fp16 kernel exists. fp16 Conv+BN+Relu and
    MatMul+Add+Relu: the BN folds and the Add becomes Gemm, but no com.microsoft FusedConv/FusedGemm appears."""
    m = conv_model([bn("c", "n"), h.make_node("Relu", ["n"], ["y"], name="relu")], bn_inits(4, dtype=F16), dtype=F16)
    res = fused(m)
    assert ops(res) == {"Conv": 1, "Relu": 1}
    verifies(m, res)
    nodes = [h.make_node("MatMul", ["a", "Bw"], ["mm"], name="mm"), h.make_node("Add", ["mm", "C"], ["s"], name="add"),
             h.make_node("Relu", ["s"], ["y"], name="relu")]
    inits = [tensor("Bw", r(6, 5, dtype=F16)), tensor("C", r(5, dtype=F16))]
    m = mk(nodes, [value_info("a", F16, [3, 6])], ["y"], inits, dtype=F16)
    res = fused(m)
    assert ops(res) == {"Gemm": 1, "Relu": 1}
    verifies(m, res)


def test_anchor_14_fp16_fold_that_would_overflow_is_refused():
    """Anchor 14, apple/coreai-torch PR #54: folded fp16 weights beyond 65504 become inf; such a fold is refused."""
    m = conv_model([bn("c", "y")], bn_inits(4, dtype=F16, var=np.full(4, 1e-4)), dtype=F16)
    m.graph.initializer[0].CopyFrom(tensor("W", r(4, 3, 3, 3, dtype=F16, scale=1e4)))
    res = fused(m)
    assert ops(res)["BatchNormalization"] == 1 and any("overflow" in n for n in res.plan.notes)
    verifies(m, res)


def test_anchor_15_bn_after_an_activation_is_not_folded():
    """Anchor 15, OpenCV #28689: BN was folded into the Conv of a Conv->ReLU->BN chain (L1 error ~13).
    Only a BN that reads the Conv output directly folds: the Relu may fuse, the BN stays."""
    m = conv_model([h.make_node("Relu", ["c"], ["a"], name="relu"), bn("a", "y")], bn_inits(4))
    res = fused(m)
    assert ops(res)["BatchNormalization"] == 1 and not grouped(res, "bn")
    verifies(m, res)


# --------------------------------------------------------------------------------------------------
# B. Conv + Add / activation
# --------------------------------------------------------------------------------------------------

def two_convs_into_add(outputs=("y",)):
    nodes = [h.make_node("Conv", ["x", "Wa", "Ba"], ["a"], name="conv_a", kernel_shape=[3, 3], pads=[1] * 4),
             h.make_node("Conv", ["x", "Wb", "Bb"], ["b"], name="conv_b", kernel_shape=[3, 3], pads=[1] * 4),
             h.make_node("Add", ["a", "b"], ["s"], name="add"), h.make_node("Relu", ["s"], ["y"], name="relu")]
    inits = [tensor("Wa", r(4, 3, 3, 3)), tensor("Ba", r(4)), tensor("Wb", r(4, 3, 3, 3)), tensor("Bb", r(4))]
    return mk(nodes, [value_info("x", shape=["batch", 3, 6, 6])], outputs, inits)


@pytest.mark.parametrize("needed", [None, "a", "s"])
def test_anchor_17_two_convs_feeding_one_add(needed):
    """Anchor 17, ORT PR #20282: Conv+Add+Relu fused although intermediates were still needed, with several Convs
    feeding one Add. One Conv may absorb Add+Relu (the other's output as Z); not a Conv whose output is needed
    elsewhere, and not at all when the Add's result is itself needed."""
    m = two_convs_into_add(("y",) if needed is None else ("y", needed))
    res = fused(m)
    if needed == "s":
        assert ops(res) == {"Add": 1, "Conv": 2, "Relu": 1} and len(res.plan) == 0
    else:
        assert ops(res) == {"Conv": 1, "com.microsoft:FusedConv": 1}
        (group,) = res.plan.groups
        assert group.rule == "conv_add_act" and group.nodes[1:] == ["add", "relu"]
        if needed == "a":
            assert group.nodes == ["conv_b", "add", "relu"]
    verifies(m, res, dims={"batch": 2})


@pytest.mark.parametrize("producer", ["Conv", "Gemm"])
@pytest.mark.parametrize("act", ["Relu", "Clip"])
@pytest.mark.parametrize("other", ["node", "graph_output"])
def test_anchor_18_activation_not_fused_when_the_preactivation_is_read_elsewhere(producer, act, other):
    """Anchor 18, ORT PR #28814 (#28543/#28544): Clip/Relu were fused into a producer whose output had other consumers,
    leaving a dangling pre-activation value and an invalid model."""
    extra = [tensor("lo", F32(-0.5)), tensor("hi", F32(0.5))]
    act_node = h.make_node(act, ["c"] + (["lo", "hi"] if act == "Clip" else []), ["y"], name="act")
    reader = [h.make_node("Neg", ["c"], ["z"], name="neg")] if other == "node" else []
    outputs = ("y", "z") if other == "node" else ("y", "c")
    if producer == "Conv":
        m = conv_model([act_node] + reader, extra, outputs=outputs)
    else:
        nodes = [h.make_node("Gemm", ["a", "Bw", "C"], ["c"], name="gemm", transB=1), act_node] + reader
        m = mk(nodes, [value_info("a", shape=[3, 6])], outputs, [tensor("Bw", r(5, 6)), tensor("C", r(5))] + extra)
    res = fused(m)
    assert ops(res) == {producer: 1, act: 1, **({"Neg": 1} if other == "node" else {})} and len(res.plan) == 0
    verifies(m, res)


def test_anchor_19_node_names_that_equal_tensor_names():
    """Anchor 19, ORT #28559: after a layout transform ConvMulFusion referenced a *node* name as a tensor ("Node input
    'node_28' is not a graph input"). Node names here equal other tensors' names; every input must be a tensor."""
    nodes = [h.make_node("Conv", ["x", "W"], ["c"], name="y", kernel_shape=[1, 1]),
             h.make_node("Mul", ["c", "s"], ["y"], name="c")]
    m = mk(nodes, [value_info("x", shape=[1, 3, 4, 4])], ["y"], [tensor("W", r(4, 3, 1, 1)), tensor("s", r(4, 1, 1))])
    res = fused(m)  # well_formed: every node input is a tensor defined before it
    assert ops(res) == {"Conv": 1} and res.plan.rule_counts() == {"conv_scale_bias": 1}
    verifies(m, res)


CLIP_FORMS = {
    "attrs_opset10": (10, {"min": -0.5, "max": 0.5}, [], [-0.5, 0.5]),
    "no_bounds_opset10": (10, {}, [], [-3.4028234663852886e38, 3.4028234663852886e38]),
    "inputs_opset13": (13, {}, ["lo", "hi"], [-0.5, 0.5]),
    "only_max_opset13": (13, {}, ["", "hi"], [-3.4028234663852886e38, 0.5]),
    "only_min_opset13": (13, {}, ["lo"], [-0.5, 3.4028234663852886e38]),
    "no_bounds_opset13": (13, {}, [], [-3.4028234663852886e38, 3.4028234663852886e38]),
}


@pytest.mark.parametrize("form", sorted(CLIP_FORMS))
def test_anchor_20_clip_in_every_form_fuses_with_its_bounds(form):
    """Anchor 20, ORT FuseReluClip #9753/#10936/#11836/#23116/#24158: crashes on the opset-11 attribute form of Clip
    and on absent bounds. Clip with bounds as attributes, inputs, partly or not at all: FusedConv with those bounds."""
    opset, attrs, ins, bounds = CLIP_FORMS[form]
    clip = h.make_node("Clip", ["c"] + ins, ["y"], name="clip", **attrs)
    m = conv_model([clip], [tensor("lo", F32(-0.5)), tensor("hi", F32(0.5))] if ins else [], opset=opset)
    res = fused(m)
    (fc,) = nodes_of(res, "FusedConv")
    assert len(res.graph) == 1 and fc.attributes["activation"].value == "Clip"
    np.testing.assert_allclose(list(fc.attributes["activation_params"].value), bounds, rtol=1e-7)
    verifies(m, res)


def test_anchor_20_clip_with_empty_min_tensor_is_left_alone():
    """Anchor 20, ORT PR #26878: an empty (shape [0]) Clip `min` tensor was dereferenced (a DoS). The pass must not
    crash or fold it; onnxruntime itself rejects the model at run time, so only the structure is checked."""
    m = conv_model([h.make_node("Clip", ["c", "lo", "hi"], ["y"], name="clip")],
                   [tensor("lo", np.zeros(0, F32)), tensor("hi", F32(0.5))], opset=13)
    res = fused(m)
    assert ops(res) == {"Clip": 1, "Conv": 1} and len(res.plan) == 0


@pytest.mark.parametrize("dtype", [F16, F64])
def test_anchor_20_clip_in_fp16_and_fp64_is_not_given_a_float_kernel(dtype):
    """Anchor 20, ORT #11836: FuseReluClip crashed on float64 Clip bounds. fp16/fp64 Clip after a linear op: the Add
    may become Gemm, the Clip keeps its own dtype bounds and is not put into a float-only fused kernel."""
    nodes = [h.make_node("MatMul", ["a", "Bw"], ["mm"], name="mm"), h.make_node("Add", ["mm", "C"], ["s"], name="add"),
             h.make_node("Clip", ["s", "lo", "hi"], ["y"], name="clip")]
    inits = [tensor("Bw", r(6, 5, dtype=dtype)), tensor("C", r(5, dtype=dtype)), tensor("lo", dtype(-0.5)),
             tensor("hi", dtype(0.5))]
    m = mk(nodes, [value_info("a", dtype, [3, 6])], ["y"], inits, opset=13, dtype=dtype)
    res = fused(m)
    assert ops(res) == {"Clip": 1, "Gemm": 1}
    verifies(m, res)


# --------------------------------------------------------------------------------------------------
# C. MatMul + Add (+ Gelu), norms
# --------------------------------------------------------------------------------------------------

def mm_add(bias_shape, a_shape=("batch", 6), n=5):
    nodes = [h.make_node("MatMul", ["a", "Bw"], ["mm"], name="mm"), h.make_node("Add", ["mm", "C"], ["y"], name="add")]
    inits = [tensor("Bw", r(6, n)), tensor("C", r(*bias_shape))]
    return mk(nodes, [value_info("a", shape=list(a_shape))], ["y"], inits)


@pytest.mark.parametrize("bias_shape,a_shape,legal", [
    ((5,), ("batch", 6), True), ((1, 5), ("batch", 6), True), ((4, 1), (4, 6), True), ((4, 5), (4, 6), True),
    ((2, 1, 5), ("batch", 6), False), ((3, 5), ("batch", 6), False), ((3, 1), ("batch", 6), False),
])
def test_anchor_21_gemm_bias_must_broadcast_to_mn(bias_shape, a_shape, legal):
    """Anchor 21, ORT #3764 -> PR #3780 (tf-onnx #902, OnnxSlim #210/#323): MatMul+Add became a Gemm whose C is not
    unidirectionally broadcastable to (M, N). Biases of rank 3, or sized for an M that the symbolic batch may not
    have, stay an Add (at batch 1 the Add broadcasts the output *up* to (3, 5))."""
    m = mm_add(bias_shape, a_shape)
    res = fused(m)
    assert ops(res) == ({"Gemm": 1} if legal else {"Add": 1, "MatMul": 1})
    verifies(m, res, dims={"batch": 1})


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
def test_anchor_21_horizontal_bias_must_broadcast_to_the_branch_output(op):
    """Anchor 21, ORT #3764 / OnnxSlim #210: a bias that is not unidirectionally broadcastable to its producer's output.
    Horizontal siblings with N=1 outputs and a length-7 bias ((3,1)+(7,) -> (3,7)): the Add may not be absorbed into
    the wide op (it broadcasts the branch output up); the pass must not crash and the result must verify."""
    nodes, inits = [], []
    for k in "ab":
        nodes += [h.make_node(op, ["x", f"W{k}"], [f"{k}0"], name=f"{k}_mm"),
                  h.make_node("Add", [f"{k}0", f"c{k}"], [k], name=f"{k}_add")]
        inits += [tensor(f"W{k}", r(6, 1)), tensor(f"c{k}", r(7))]
    nodes.append(h.make_node("Concat", ["a", "b"], ["y"], name="cat", axis=-1))
    m = mk(nodes, [value_info("x", shape=[3, 6])], ["y"], inits)
    res = fused(m, ("horizontal",))
    assert not grouped(res, "a_add", "b_add")
    verifies(m, res)


@pytest.mark.parametrize("tail", ["add", "bn"])
def test_anchor_22_rank3_matmul_is_not_turned_into_gemm(tail):
    """Anchor 22, ORT #22512 -> PR #22762: MatMulBnFusion produced a Gemm with a rank-3 input ("First input does not
    have rank 2"). A rank-3 MatMul followed by Add or BN stays a MatMul."""
    last = (h.make_node("Add", ["mm", "C"], ["y"], name="add") if tail == "add" else bn("mm", "y"))
    inits = [tensor("Bw", r(6, 4))] + ([tensor("C", r(4))] if tail == "add" else bn_inits(5))
    nodes = [h.make_node("MatMul", ["a", "Bw"], ["mm"], name="mm"), last]
    m = mk(nodes, [value_info("a", shape=[2, 5, 6])], ["y"], inits)
    res = fused(m)
    assert "Gemm" not in ops(res) and ops(res)["MatMul"] == 1 and len(res.plan) == 0
    verifies(m, res)


def test_anchor_23_scale_with_extra_leading_dims_is_not_folded():
    """Anchor 23, ORT #24407 -> PR #24492: MatMulScaleFusion accepted a scale that broadcast extra leading dims and
    changed the output shape. Conv output [1,4,6,6] times a rank-5 per-channel scale [2,1,4,1,1] stays a Mul."""
    m = conv_model([h.make_node("Mul", ["c", "s"], ["y"], name="mul")], [tensor("s", r(2, 1, 4, 1, 1))])
    res = fused(m)
    assert ops(res) == {"Conv": 1, "Mul": 1} and len(res.plan) == 0
    verifies(m, res)


def test_anchor_23_rank1_matmul_input_is_not_turned_into_gemm():
    """Anchor 23, ORT #10950 -> PR #11121: a scalar-like (rank < 2) MatMul input was fused and the fused op's shape
    inference rejected it. A rank-1 MatMul input with Add stays MatMul + Add."""
    m = mm_add((5,), a_shape=(6,))
    res = fused(m)
    assert ops(res) == {"Add": 1, "MatMul": 1}
    verifies(m, res)


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
def test_anchor_23_horizontal_bias_with_extra_leading_dims(op):
    """Anchor 23, ORT #24407: a constant with extra leading dims broadcast the output to a higher rank. Horizontal
    siblings [3,6]x[6,5] each add a [1,1,5] bias (output [1,3,5]): fusing the Adds must keep that rank, or not fuse."""
    nodes, inits = [], []
    for k in "ab":
        nodes += [h.make_node(op, ["x", f"W{k}"], [f"{k}0"], name=f"{k}_mm"),
                  h.make_node("Add", [f"{k}0", f"c{k}"], [k], name=f"{k}_add")]
        inits += [tensor(f"W{k}", r(6, 5)), tensor(f"c{k}", r(1, 1, 5))]
    nodes.append(h.make_node("Concat", ["a", "b"], ["y"], name="cat", axis=-1))
    m = mk(nodes, [value_info("x", shape=[3, 6])], ["y"], inits)
    res = fused(m, ("horizontal",))
    assert grouped(res, "a_mm") and outputs_sig(res.graph.to_proto()) == outputs_sig(m)
    verifies(m, res)


def test_anchor_24_fused_nodes_carry_each_attribute_once():
    """Anchor 24, ORT PR #2776: a fused Gemm had "Attribute 'alpha' appeared multiple times". Gemm(alpha, beta) +
    LeakyRelu(alpha), and Gemm + BN + Elu(alpha): one FusedGemm each, every attribute name once."""
    nodes = [h.make_node("Gemm", ["a", "Bw", "C"], ["g"], name="gemm", alpha=0.5, beta=2.0, transB=1),
             h.make_node("LeakyRelu", ["g"], ["y"], name="act", alpha=0.3)]
    m1 = mk(nodes, [value_info("a", shape=[3, 6])], ["y"], [tensor("Bw", r(5, 6)), tensor("C", r(5))])
    nodes = [h.make_node("Gemm", ["a", "Bw", "C"], ["g"], name="gemm", alpha=0.5, beta=2.0), bn("g", "n"),
             h.make_node("Elu", ["n"], ["y"], name="act", alpha=0.7)]
    m2 = mk(nodes, [value_info("a", shape=[3, 6])], ["y"], [tensor("Bw", r(6, 5)), tensor("C", r(5))] + bn_inits(5))
    for m in (m1, m2):
        res = fused(m)  # well_formed asserts unique attribute names
        (fg,) = nodes_of(res, "FusedGemm")
        assert len(res.graph) == 1 and float(fg.attributes["alpha"].value) == 0.5
        assert "activation_alpha" in fg.attributes
        verifies(m, res)


def gelu_nodes(x, y):
    nodes = [h.make_node("Div", [x, "sqrt2"], ["g1"], name="div"), h.make_node("Erf", ["g1"], ["g2"], name="erf"),
             h.make_node("Add", ["g2", "one"], ["g3"], name="add1"), h.make_node("Mul", [x, "g3"], ["g4"], name="mul1"),
             h.make_node("Mul", ["g4", "half"], [y], name="mul2")]
    return nodes, [tensor("sqrt2", F32(np.sqrt(2.0))), tensor("one", F32(1.0)), tensor("half", F32(0.5))]


@pytest.mark.parametrize("bias_shape,bias_gelu", [((16,), True), ((1, 16), False), ((8, 16), False), ((1,), False)])
def test_anchor_25_bias_gelu_needs_a_1d_bias_over_the_last_axis(bias_shape, bias_gelu):
    """Anchor 25, onnxscript PR #2393: BiasGelu fusion did not check the bias rank (BiasGelu needs a 1-D bias)."""
    nodes, inits = gelu_nodes("xb", "y")
    m = mk([h.make_node("Add", ["x", "bias"], ["xb"], name="badd")] + nodes, [value_info("x", shape=[2, 8, 16])], ["y"],
           inits + [tensor("bias", r(*bias_shape))])
    res = fused(m)
    assert ("com.microsoft:BiasGelu" in ops(res)) == bias_gelu
    assert grouped(res, "badd") == bias_gelu
    verifies(m, res)


@pytest.mark.parametrize("approximate,bias_gelu", [("none", True), ("tanh", False)])
def test_anchor_25_onnx_gelu_only_exact_form_becomes_bias_gelu(approximate, bias_gelu):
    """Anchor 25, onnxscript PRs #2364/#2362: match both contrib and opset-20 Gelu, but only the exact (erf) form
    becomes BiasGelu: BiasGelu computes erf-GELU. A tanh-approximate Gelu after a bias Add becomes FastGelu (the
    tanh form with a bias), never BiasGelu."""
    nodes = [h.make_node("Add", ["x", "bias"], ["xb"], name="badd"),
             h.make_node("Gelu", ["xb"], ["y"], name="gelu", approximate=approximate)]
    m = mk(nodes, [value_info("x", shape=[2, 8, 16])], ["y"], [tensor("bias", r(16))], opset=20)
    res = fused(m)
    assert ops(res) == ({"com.microsoft:BiasGelu": 1} if bias_gelu else {"com.microsoft:FastGelu": 1})
    verifies(m, res)


@pytest.mark.parametrize("pattern", ["silu", "gelu"])
def test_anchor_25_intermediate_graph_output_blocks_gelu_and_silu(pattern):
    """Anchor 25, ORT PR #15109: QuickGeluFusion applied although an intermediate was a graph output (graph outputs are
    not edges, so an edge count of 1 is not enough). SiLU's Sigmoid and GELU's Erf+1 are graph outputs here."""
    if pattern == "silu":
        nodes, inits, mid = [h.make_node("Sigmoid", ["x"], ["s"], name="sig"),
                             h.make_node("Mul", ["x", "s"], ["y"], name="mul")], [], "s"
    else:
        (nodes, inits), mid = gelu_nodes("x", "y"), "g3"
    m = mk(nodes, [value_info("x", shape=[2, 16])], ["y", mid], inits)
    res = fused(m)
    assert res.after == res.before and len(res.plan) == 0
    verifies(m, res)


def layernorm(gamma_shape):
    nodes = [h.make_node("ReduceMean", ["x"], ["mu"], name="mean", axes=[-1]),
             h.make_node("Sub", ["x", "mu"], ["d"], name="sub"), h.make_node("Pow", ["d", "two"], ["d2"], name="pow"),
             h.make_node("ReduceMean", ["d2"], ["var"], name="mean2", axes=[-1]),
             h.make_node("Add", ["var", "eps"], ["ve"], name="addeps"),
             h.make_node("Sqrt", ["ve"], ["sd"], name="sqrt"), h.make_node("Div", ["d", "sd"], ["nrm"], name="div"),
             h.make_node("Mul", ["nrm", "gamma"], ["sc"], name="mulg"),
             h.make_node("Add", ["sc", "beta"], ["y"], name="addb")]
    inits = [tensor("two", F32(2.0)), tensor("eps", F32(1e-5)), tensor("gamma", r(*gamma_shape)), tensor("beta", r(16))]
    return mk(nodes, [value_info("x", shape=[2, 8, 16])], ["y"], inits)


@pytest.mark.parametrize("gamma_shape,legal", [((16,), True), ((8, 16), False), ((1,), False), ((8, 1), False)])
def test_anchor_26_layernorm_scale_must_match_the_last_dim(gamma_shape, legal):
    """Anchor 26, ORT #31980: SimplifiedLayerNormFusion absorbed a downstream Mul whose scale shape does not match the
    last dim. Only a [H] gamma becomes LayerNormalization's scale."""
    m = layernorm(gamma_shape)
    res = fused(m)
    assert ("LayerNormalization" in ops(res)) == legal
    verifies(m, res)


def test_anchor_26_reshape_feeding_a_shape_input_keeps_its_type():
    """Anchor 26, ORT #32105: ReshapeFusion fused a Reshape whose output was the *shape input* of another Reshape, a
    float/int64 type error. Mixed fusion groups such a chain; the lowered function must keep the int64 shape path."""
    nodes = [h.make_node("Reshape", ["s0", "s0shape"], ["s1"], name="rs_shape"),
             h.make_node("Relu", ["x"], ["xr"], name="relu"), h.make_node("Reshape", ["xr", "s1"], ["xx"], name="rs"),
             h.make_node("Mul", ["xx", "k"], ["y"], name="mul")]
    inits = [tensor("s0", np.array([[6, 4]], np.int64)), tensor("s0shape", np.array([2], np.int64)),
             tensor("k", F32(2.0))]
    m = mk(nodes, [value_info("x", shape=[2, 3, 4])], ["y"], inits)
    res = fused(m, ("vertical", "mixed"))
    assert grouped(res, "rs") and outputs_sig(res.graph.to_proto()) == outputs_sig(m)
    verifies(m, res)


# --------------------------------------------------------------------------------------------------
# D. Horizontal fusion
# --------------------------------------------------------------------------------------------------

def acyclic(res) -> None:
    assert len(res.graph.topological_order()) == len(res.graph)  # raises ModelError on a cycle


def test_anchor_27_dependent_siblings_are_not_batched():
    """Anchor 27, AMDMIGraphX PR #5250: dependent dots (d01 -> add -> d11) were batched into one dot, a cycle.
    After vertical fusion three sibling FusedConv(Relu) read x, and one takes another's output as its residual Z:
    batching those two would need the wide op's output as its own input. The dependent one is left out."""
    nodes = [h.make_node("Conv", ["x", f"W{k}", f"B{k}"], [f"{k}0"], name=f"conv_{k}", kernel_shape=[1, 1])
             for k in "abc"]
    nodes += [h.make_node("Relu", [f"{k}0"], [k], name=f"relu_{k}") for k in "bc"]
    nodes += [h.make_node("Add", ["a0", "b"], ["s"], name="add"), h.make_node("Relu", ["s"], ["t"], name="relu_a"),
              h.make_node("Mul", ["t", "c"], ["y"], name="mul")]
    inits = [tensor(f"{p}{k}", r(4, 4, 1, 1) if p == "W" else r(4)) for k in "abc" for p in "WB"]
    m = mk(nodes, [value_info("x", shape=[1, 4, 5, 5])], ["y"], inits)
    res = fused(m, ("vertical", "horizontal"))
    with_z = [n.name for n in nodes_of(res, "FusedConv") if len(n.inputs) == 4]
    assert len(with_z) == 1 and [g.rule for g in res.plan if g.kind == "vertical"].count("conv_add_act") == 1
    assert not any(with_z[0] in g.nodes for g in res.plan if g.kind == "horizontal")
    acyclic(res)
    verifies(m, res)


@pytest.mark.parametrize("stored", ["sorted", "reversed"])
def test_anchor_28_horizontal_result_is_topologically_sorted(stored):
    """Anchor 28, csarofeen/pytorch PR #1097 (XLA: "no new cycles after fusion"): merged producers were not
    topologically sorted. Siblings far apart in the stored order, with the first one's consumers in between (and the
    whole graph stored in reverse order): the result is acyclic and stored in topological order."""
    nodes = [h.make_node("MatMul", ["x", "Wa"], ["a"], name="a_mm"), h.make_node("Relu", ["a"], ["ar"], name="relu"),
             h.make_node("Mul", ["ar", "x"], ["am"], name="mul"),
             h.make_node("MatMul", ["x", "Wb"], ["b"], name="b_mm"),
             h.make_node("Add", ["am", "b"], ["y"], name="add")]
    if stored == "reversed":
        nodes = nodes[::-1]
    m = make_model(nodes, [value_info("x", shape=[4, 4])], [value_info("y", shape=[4, 4])],
                   [tensor("Wa", r(4, 4)), tensor("Wb", r(4, 4))])
    g = load(m)  # sorts a stored order that is not topological
    res = fused(g, ("horizontal",))  # well_formed: every input defined before use, checker's topological check
    assert len(res.plan) == 1 and sorted(res.plan[0].nodes) == ["a_mm", "b_mm"]
    acyclic(res)
    verifies(g, res)


@pytest.mark.parametrize("passes", [("horizontal",), ("vertical", "horizontal", "mixed")])
def test_anchor_29_chained_sibling_groups_and_residual(passes):
    """Anchor 29, TVM PR #2167/#2218 (CombineParallelConv2D): substitutions referred to already-substituted nodes and
    "sometimes changed residual blocks". Two sibling groups in series (the second reads the first group's Split
    output) inside a residual block."""
    nodes = [h.make_node("Conv", ["x", "W1"], ["p"], name="c1", kernel_shape=[1, 1]),
             h.make_node("Conv", ["x", "W2"], ["q"], name="c2", kernel_shape=[1, 1]),
             h.make_node("Relu", ["p"], ["pr"], name="r1"),
             h.make_node("Conv", ["pr", "W3"], ["s"], name="c3", kernel_shape=[1, 1]),
             h.make_node("Conv", ["pr", "W4"], ["t"], name="c4", kernel_shape=[1, 1]),
             h.make_node("Add", ["s", "t"], ["st"], name="a1"), h.make_node("Add", ["st", "q"], ["u"], name="a2"),
             h.make_node("Add", ["u", "x"], ["y"], name="res")]
    m = mk(nodes, [value_info("x", shape=[1, 4, 5, 5])], ["y"], [tensor(f"W{i}", r(4, 4, 1, 1)) for i in range(1, 5)])
    res = fused(m, passes)
    horizontal = [sorted(g.nodes) for g in res.plan if g.kind == "horizontal"]
    assert ["c3", "c4"] in horizontal and len(horizontal) == (2 if passes == ("horizontal",) else 1)
    acyclic(res)
    verifies(m, res)


def test_anchor_30_horizontal_conv_branches_keep_their_own_channels():
    """Anchor 30, MIGraphX #394 / Paddle-Lite PR #10163,#4446: conv+conv fusion broke accuracy through weight-index
    errors and was restricted to group=1. Three sibling Conv+BN+Relu branches of 2, 3 and 5 channels fuse and verify;
    a grouped sibling is left out."""
    nodes, inits = [], []
    for k, cout, group in (("a", 2, 1), ("b", 3, 1), ("c", 5, 1), ("d", 4, 2)):
        nodes += [h.make_node("Conv", ["x", f"W{k}", f"B{k}"], [f"{k}0"], name=f"{k}_conv", kernel_shape=[3, 3],
                              pads=[1] * 4, group=group),
                  bn(f"{k}0", f"{k}1", f"bn{k}"), h.make_node("Relu", [f"{k}1"], [k], name=f"{k}_relu")]
        inits += [tensor(f"W{k}", r(cout, 4 // group, 3, 3)), tensor(f"B{k}", r(cout))] + bn_inits(cout, f"bn{k}")
    nodes.append(h.make_node("Concat", list("abcd"), ["y"], name="cat", axis=1))
    m = mk(nodes, [value_info("x", shape=[1, 4, 6, 6])], ["y"], inits)
    res = fused(m, ("horizontal",))
    (group,) = res.plan.groups
    assert [n for n in group.nodes if n.endswith("_conv")] == ["a_conv", "b_conv", "c_conv"]
    assert group.extra["split"] == [2, 3, 5]
    verifies(m, res)


@pytest.mark.parametrize("const_shape,width", [((5, 1, 1), 6), ((1, 5, 1, 1), 6), ((1, 1, 1, 1), 6), ((1,), 6),
                                               ((1,), 10), ((6,), 6)],
                         ids=["5x1x1", "1x5x1x1", "1x1x1x1", "1", "1-width10", "6-width-axis"])
def test_anchor_30_horizontal_conv_add_constant_stays_on_its_axis(const_shape, width):
    """Anchor 30, Paddle-Lite PR #10163 (conv-conv fuse index errors): a per-branch constant must be re-indexed along
    the channel axis of the wide op. Two 5-channel Conv siblings each followed by Add of a constant shaped (5,1,1),
    (1,5,1,1), (1,1,1,1) or (1,), or (6,) which broadcasts along the *width* axis (6 wide, or 10 = total channels):
    either the Adds fuse correctly or they are left alone; the result has the original shape and values."""
    nodes, inits = [], []
    for k in "ab":
        nodes += [h.make_node("Conv", ["x", f"W{k}"], [f"{k}0"], name=f"{k}_conv", kernel_shape=[1, 1]),
                  h.make_node("Add", [f"{k}0", f"c{k}"], [k], name=f"{k}_add")]
        inits += [tensor(f"W{k}", r(5, 4, 1, 1)), tensor(f"c{k}", r(*const_shape))]
    nodes.append(h.make_node("Concat", ["a", "b"], ["y"], name="cat", axis=1))
    m = mk(nodes, [value_info("x", shape=[1, 4, 5, width])], ["y"], inits)
    res = fused(m, ("horizontal",))
    assert grouped(res, "a_conv", "b_conv")
    assert outputs_sig(res.graph.to_proto()) == outputs_sig(m)
    verifies(m, res)


# --------------------------------------------------------------------------------------------------
# E. Graph-level integrity
# --------------------------------------------------------------------------------------------------

def test_anchor_31_intermediate_graph_output_survives():
    """Anchor 31, ORT #4110 / #23118: an intermediate requested as a graph output was fused away ("Graph output does
    not exist"). BN's output is a graph output and read by Relu: BN may fold into the Conv (its output keeps the
    name), the Relu must not fuse; both outputs keep their names and values."""
    m = conv_model([bn("c", "n"), h.make_node("Relu", ["n"], ["y"], name="relu")], bn_inits(4), outputs=("y", "n"))
    res = fused(m)
    assert ops(res) == {"Conv": 1, "Relu": 1}
    assert [o.name for o in res.graph.outputs()] == ["y", "n"]
    verifies(m, res)


def test_anchor_31_initializer_and_input_graph_outputs_survive():
    """Anchor 31, ORT #13425 (NNSmith): an initializer that is also a graph output came back as None. The Conv weight,
    a BN statistic and the graph input are graph outputs while Conv+BN folds: all three come back unchanged."""
    m = conv_model([bn("c", "y")], bn_inits(4), outputs=("y", "W", "bn_m", "x"))
    res = fused(m)
    assert ops(res) == {"Conv": 1}
    feeds = {"x": r(1, 3, 6, 6)}
    got, want = run(res.graph, feeds), run(m, feeds)
    assert list(got) == ["y", "W", "bn_m", "x"]
    for name in ("W", "bn_m", "x"):
        np.testing.assert_array_equal(got[name], want[name])
    verifies(m, res)


def shape_cases():
    nodes = [h.make_node("Relu", ["x"], ["h"], name="relu")]
    inits = []
    for p in "qkv":
        nodes += [h.make_node("MatMul", ["h", f"W{p}"], [f"{p}0"], name=f"{p}_mm"),
                  h.make_node("Add", [f"{p}0", f"b{p}"], [p], name=f"{p}_add")]
        inits += [tensor(f"W{p}", r(16, 16)), tensor(f"b{p}", r(16))]
    qkv = mk(nodes, [value_info("x", shape=["batch", "seq", 16])], list("qkv"), inits)
    return {
        "conv_bn": (conv_model([bn("c", "y")], bn_inits(4)), ("vertical",)),
        "matmul_add_gemm": (mm_add((1, 5), a_shape=(2, 6)), ("vertical",)),
        "layernorm": (layernorm((16,)), ("vertical",)),
        "qkv_horizontal": (qkv, ("horizontal",)),
    }


@pytest.mark.parametrize("case", sorted(shape_cases()))
def test_anchor_32_output_shapes_and_dtypes_unchanged(case):
    """Anchor 32, ORT #11870 / #23185: an output's rank changed ({5,50,1} instead of {1,5,50,1}) only with
    optimisations on. Declared output names, dtypes and shapes and the run-time shapes are those of the original."""
    m, passes = shape_cases()[case]
    res = fused(m, passes)
    assert len(res.plan) >= 1
    assert outputs_sig(res.graph.to_proto()) == outputs_sig(m)
    got, want = run(res.graph), run(m)
    assert {k: (v.shape, v.dtype) for k, v in got.items()} == {k: (v.shape, v.dtype) for k, v in want.items()}
    verifies(m, res)


def combination_model():
    """Identity, Cast, no-op Dropout, Div/Mul, sibling Conv+BN+Relu branches and elementwise tails: every pass acts."""
    nodes = [h.make_node("Identity", ["x"], ["xi"], name="id"), h.make_node("Cast", ["xi"], ["xc"], to=1, name="cast"),
             h.make_node("Div", ["xc", "two"], ["xd"], name="div"),
             h.make_node("Mul", ["xd", "three"], ["xm"], name="mul")]
    inits = [tensor("two", F32(2.0)), tensor("three", F32(3.0))]
    for k in "ab":
        nodes += [h.make_node("Conv", ["xm", f"W{k}", f"B{k}"], [f"{k}0"], name=f"{k}_conv", kernel_shape=[3, 3],
                              pads=[1] * 4),
                  bn(f"{k}0", f"{k}1", f"bn{k}"), h.make_node("Relu", [f"{k}1"], [k], name=f"{k}_relu")]
        inits += [tensor(f"W{k}", r(4, 3, 3, 3)), tensor(f"B{k}", r(4))] + bn_inits(4, f"bn{k}")
    nodes += [h.make_node("Add", ["a", "b"], ["s"], name="add"), h.make_node("Dropout", ["s"], ["d"], name="drop"),
              h.make_node("Sigmoid", ["d"], ["g"], name="sig"), h.make_node("Mul", ["d", "g"], ["y"], name="silu")]
    return mk(nodes, [value_info("x", shape=[1, 3, 6, 6])], ["y"], inits)


@pytest.mark.parametrize("order", list(itertools.permutations(("cleanup", "vertical", "horizontal", "mixed"))),
                         ids="-".join)
def test_anchor_33_every_pass_order_gives_a_valid_equivalent_model(order):
    """Anchor 33, ORT #32416: CastElimination + DivMulFusion together produced "Node input 'mid' is not a graph
    input"; each pass alone was fine. Every order of our four passes, checked (full checker) and verified after
    every single pass."""
    m = combination_model()
    g = load(m)
    for name in order:
        res = fused(g, (name,))
        verifies(m, res)
        g = res.graph
    assert len(g) < len(m.graph.node)


def external_model(folder: Path, location="weights.bin", write=True):
    """Conv+BN with the Conv weight stored as external data at `location` (relative to `folder`); and the model."""
    m = conv_model([bn("c", "y")], bn_inits(4))
    return save_with_external_weight(m, folder, location=location, write=write)[0], m


def test_anchor_34_model_over_2gib_is_refused_with_a_model_error(tmp_path):
    """Anchor 34, onnx/optimizer #46/#53, ORT #12882 (and section 4.2, protobuf's 2 GiB limit): tools failed on models
    over 2 GB deep inside protobuf. A (sparse) 2 GiB file is refused up front with a one-line ModelError."""
    path = tmp_path / "big.onnx"
    with open(path, "wb") as f:
        f.truncate(2**31)
    with pytest.raises(ModelError, match="2 GiB") as err:
        load(path)
    assert "\n" not in str(err.value)


def test_anchor_34_external_weights_fuse_save_and_reload(tmp_path):
    """Anchor 34, onnxsim PR #173 / optimum #886,#901: large-model support means weights in external files survive
    fusion and saving. An external-data Conv+BN folds, saves with external data, reloads and verifies."""
    path, m = external_model(tmp_path)
    g = load(path)
    res = fused(g)
    assert ops(res) == {"Conv": 1}
    verifies(m, res)
    out = res.graph.save(tmp_path / "out" / "fused.onnx", external_data_threshold=0)
    assert (out.parent / "fused.onnx.data").exists()
    back = load(out)
    assert back.op_counts() == {"Conv": 1}
    report = verify(m, back)
    assert report.ok, report.table()


# --------------------------------------------------------------------------------------------------
# Section 4: loading untrusted models
# --------------------------------------------------------------------------------------------------

def _add_external_key(path: Path, key: str, value: str) -> None:
    m = onnx.load(str(path), load_external_data=False)
    entries = m.graph.initializer[0].external_data
    for e in entries:
        if e.key == key:
            e.value = value
            break
    else:
        e = entries.add()
        e.key, e.value = key, value
    path.write_bytes(m.SerializeToString())


ESCAPES = {
    "CVE-2022-25882": ("../weights.bin", "leaves the model's folder"),
    "CVE-2024-27318": ("sub/../../weights.bin", "leaves the model's folder"),
    "absolute_posix": ("/etc/passwd", "absolute path"),
    "absolute_windows": ("C:\\weights.bin", "absolute path"),
    "CVE-2026-27489": ("link_dir/weights.bin", "symlink"),
    "CVE-2026-34447": ("link_file.bin", "symlink"),
    "CVE-2026-34446": ("hard.bin", "hard link"),
    "GHSA-538c_unknown_key": ("weights.bin", "unknown external-data keys"),
    "GHSA-538c_negative_offset": ("weights.bin", "exceeds"),
    "GHSA-538c_length_beyond_file": ("weights.bin", "exceeds"),
}


@pytest.mark.parametrize("case", sorted(ESCAPES))
def test_anchor_s4_external_data_escapes_are_refused(tmp_path, case):
    """Section 4.1, onnx CVE-2022-25882 / CVE-2024-27318 / CVE-2026-27489 / CVE-2026-34447 / CVE-2026-34446 /
    GHSA-538c-55jv-c5g9: external-data locations that leave the model's folder (.., a/../.., absolute, a symlink in a
    parent or the final component, a hard link), unknown keys, and offset/length outside the file."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "weights.bin").write_bytes(b"\0" * 4096)
    (tmp_path / "weights.bin").write_bytes(b"\0" * 4096)
    inner = tmp_path / "inner"
    inner.mkdir()
    location, problem = ESCAPES[case]
    path, _ = external_model(inner, location=location)
    if case == "CVE-2026-27489":
        os.symlink(secret, inner / "link_dir")
    elif case == "CVE-2026-34447":
        os.symlink(secret / "weights.bin", inner / "link_file.bin")
    elif case == "CVE-2026-34446":
        os.link(inner / "weights.bin", inner / "hard.bin")
    elif case == "GHSA-538c_unknown_key":
        _add_external_key(path, "__class__", "x")
    elif case == "GHSA-538c_negative_offset":
        _add_external_key(path, "offset", "-8")
    elif case == "GHSA-538c_length_beyond_file":
        _add_external_key(path, "length", str(10**9))
    with pytest.raises(ModelError, match=problem) as err:
        load(path)
    assert "\n" not in str(err.value)


def test_anchor_s4_external_data_from_bytes_is_refused(tmp_path):
    """Section 4.1, ORT PR #27430: models loaded *from bytes* did not validate external-data paths. From bytes there
    is no folder to contain them, so any external reference is refused."""
    path, _ = external_model(tmp_path)
    with pytest.raises(ModelError, match="external data"):
        load(path.read_bytes())


@pytest.mark.parametrize("extra", [-20, 16], ids=["short", "long"])
def test_anchor_s4_raw_data_that_does_not_match_its_shape_is_refused(extra):
    """Section 4.1, public checker gaps: `check_model` accepted `raw_data` whose byte length does not match the dims.
    A weight with 20 bytes too few or 16 bytes too many must be refused by `load` with a ModelError (not crash a
    pass later); onnxruntime refuses both."""
    m = conv_model([bn("c", "y")], bn_inits(4))
    w = m.graph.initializer[0]
    raw = onnx.numpy_helper.to_array(w).tobytes()
    w.ClearField("float_data")
    w.raw_data = raw[:extra] if extra < 0 else raw + b"\0" * extra
    with pytest.raises(ModelError, match="W") as err:
        load(m)
    assert "\n" not in str(err.value)


def test_anchor_s4_onnx_has_the_external_data_fixes():
    """Section 4.1 recommendation "pin onnx>=1.21" (CVE-2024-27318/27319 fixed in 1.16, CVE-2026-27489/34446/34447 and
    GHSA-538c in 1.21): the onnx this project runs with includes every listed fix."""
    major, minor = (int(p) for p in onnx.__version__.split(".")[:2])
    assert (major, minor) >= (1, 21), onnx.__version__


# --------------------------------------------------------------------------------------------------
# the doc and this file stay in step
# --------------------------------------------------------------------------------------------------

def test_doc_cites_exactly_the_anchor_tests():
    """docs/reliability_anchors.md cites every anchor test in this file, and every test it cites exists."""
    text = DOC.read_text(encoding="utf-8")
    here = {n.name for n in ast.parse(Path(__file__).read_text(encoding="utf-8")).body
            if isinstance(n, ast.FunctionDef) and n.name.startswith("test_anchor_")}
    cited = set(re.findall(r"\btest_anchor_\w+", text))
    assert cited - here == set(), f"the doc cites tests that do not exist: {sorted(cited - here)}"
    assert here - cited == set(), f"anchor tests the doc does not cite: {sorted(here - cited)}"
    for file, name in set(re.findall(r"\b(tests/test_\w+\.py)::(test_\w+)", text)):
        source = (ROOT / file).read_text(encoding="utf-8") if (ROOT / file).exists() else ""
        assert re.search(rf"^def {name}\(", source, re.M), f"the doc cites {file}::{name}, which does not exist"
    rows = re.findall(r"^\|\s*(\d+|S\d+)\b", text, re.M)
    assert [int(x) for x in rows if x.isdigit()] == list(range(1, 35)), "the doc needs one row per item 1-34"
