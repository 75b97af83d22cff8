"""From a fusion group to a custom op that onnxruntime runs, verified against the unfused model."""

import os

import numpy as np
import onnx
import pytest
from onnx import helper

from fusionlab import zoo
from fusionlab.build import make_model, tensor, value_info
from fusionlab.export import DeclarationError, UnsupportedGroup, compute, declare_group, library_path, register, replace_groups, reg_op
from fusionlab.graph import load
from fusionlab.plan import FusionGroup
from fusionlab.verification.runtime import run, session, verify

rng = np.random.default_rng(0)
OUT4 = ["d0", "d1", "d2", "d3"]  # symbolic output shape (the checker wants one)


def group_of(graph, gid="g0", names=None):
    nodes = [n for n in graph if names is None or n.name in names]
    return FusionGroup(gid, "vertical", "test", [n.name for n in nodes], [n.op_type for n in nodes])


def check(original, result):
    report = verify(original, result.graph, custom_ops_library=library_path(), dims={"batch": 2})
    assert report.ok, report.table()
    return report


def conv_model(act_nodes, *, bias=True, bn=False, extra_out=False, c=6, training=0, bn_mean_input=False, **conv_kw):
    nodes, inits = [], [tensor("W", rng.standard_normal((c, 3, 3, 3)).astype(np.float32))]
    ins = ["x", "W"]
    if bias:
        inits.append(tensor("B", rng.standard_normal(c).astype(np.float32)))
        ins.append("B")
    nodes.append(helper.make_node("Conv", ins, ["c"], name="conv", pads=[1, 1, 1, 1], **conv_kw))
    cur = "c"
    inputs = [value_info("x", np.float32, ["batch", 3, 8, 8])]
    if bn:
        inits += [tensor("g", rng.uniform(0.5, 1.5, c).astype(np.float32)),
                  tensor("b", rng.standard_normal(c).astype(np.float32)),
                  tensor("v", rng.uniform(0.5, 2, c).astype(np.float32))]
        if bn_mean_input:
            inputs.append(value_info("m", np.float32, [c]))
        else:
            inits.append(tensor("m", rng.standard_normal(c).astype(np.float32)))
        kw = {"training_mode": 1} if training else {}
        nodes.append(helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"], name="bn", **kw))
        cur = "n"
    prev_in = cur  # a Mul multiplies the activation's output by that activation's input (SiLU)
    for i, (op, kw) in enumerate(act_nodes):
        out = "y" if i == len(act_nodes) - 1 else f"a{i}"
        if op == "Mul":
            nodes.append(helper.make_node("Mul", [prev_in, cur], [out], name=f"act{i}"))
        else:
            prev_in = cur
            nodes.append(helper.make_node(op, [cur], [out], name=f"act{i}", **kw))
        cur = out
    outputs = [value_info("y", np.float32, OUT4)] + ([value_info("c", np.float32, OUT4)] if extra_out else [])
    return load(make_model(nodes, inputs, outputs, inits))


def test_conv_bn_relu_from_the_zoo_becomes_convrelu_and_matches():
    g = load(zoo.conv_bn_relu(3, 16, 3, image_size=16))
    before = g.op_counts()
    res = replace_groups(g, group_of(g))
    assert res.graph.op_counts() == {"ai.onnx.contrib:ConvRelu": 1}
    assert g.op_counts() == before  # the input graph is untouched
    op = res.ops[0]
    assert op.decl.name == "ConvRelu" and op.decl.folded == ("BatchNormalization",)
    assert op.attrs == {"strides": [1, 1, 1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1, 1, 1], "groups": 1,
                        "data_format": "NCHW"}
    # the BN statistics and the unfolded weight are gone; folded filter and bias are new initializers
    inits = set(res.graph.graph.initializers)
    assert len(inits) == 2 and all(n.startswith("ConvRelu_g0.") for n in inits)
    check(g, res)


def test_conv_without_bias_gets_a_zero_bias_and_stride_pads_are_converted():
    g = conv_model([("Relu", {})], bias=False, strides=[2, 1])
    res = replace_groups(g, group_of(g))
    assert res.ops[0].attrs["strides"] == [1, 1, 2, 1]
    assert res.ops[0].decl.inputs[2].param_type == "optional"
    check(g, res)


def test_asymmetric_pads_are_reordered_for_cann():
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv", pads=[0, 1, 2, 0]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    g = load(make_model(nodes, [value_info("x", np.float32, [1, 3, 7, 9])], [value_info("y", np.float32, OUT4)],
                        [tensor("W", rng.standard_normal((4, 3, 3, 3)).astype(np.float32))]))
    res = replace_groups(g, group_of(g))
    assert res.ops[0].attrs["pads"] == [0, 2, 1, 0]  # ONNX (t, l, b, r) -> Conv2D (t, b, l, r)
    check(g, res)


def test_leaky_relu_alpha_becomes_negative_slope():
    g = conv_model([("LeakyRelu", {"alpha": 0.2})], bn=True)
    res = replace_groups(g, group_of(g))
    op = res.ops[0]
    assert op.decl.name == "ConvLeakyRelu" and op.attrs["negative_slope"] == pytest.approx(0.2)
    check(g, res)


def test_silu_diamond_is_a_mixed_group():
    g = conv_model([("Sigmoid", {}), ("Mul", {})], bn=True)
    res = replace_groups(g, group_of(g))
    assert res.ops[0].decl.name == "ConvSigmoidMul"
    assert [s.op for s in res.ops[0].decl.body] == ["Conv", "Sigmoid", "Mul"]
    check(g, res)


@pytest.mark.parametrize("kwargs, message", [
    ({"bn": True, "training": 1}, "training mode"),
    ({"bn": True, "bn_mean_input": True}, "not constants"),
    ({"extra_out": True}, "2 values leave the group"),
    ({"auto_pad": "SAME_UPPER"}, "auto_pad"),
])
def test_groups_that_cannot_be_proven_legal_are_refused(kwargs, message):
    pads_free = "auto_pad" in kwargs
    if pads_free:
        nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv", auto_pad="SAME_UPPER"),
                 helper.make_node("Relu", ["c"], ["y"], name="relu")]
        g = load(make_model(nodes, [value_info("x", np.float32, [1, 3, 8, 8])], [value_info("y", np.float32, OUT4)],
                            [tensor("W", np.ones((4, 3, 3, 3), np.float32))]))
    else:
        g = conv_model([("Relu", {})], **kwargs)
    before = onnx.printer.to_text(g.to_proto())
    with pytest.raises(UnsupportedGroup, match=message):
        replace_groups(g, group_of(g))
    assert onnx.printer.to_text(g.to_proto()) == before


def test_conv_bn_alone_needs_no_custom_op():
    g = load(zoo.conv_bn_relu(3, 4, 3, image_size=8))
    grp = group_of(g, names={"/conv/Conv", "/bn/BatchNormalization"})
    with pytest.raises(UnsupportedGroup, match="single op after folding"):
        declare_group(g, grp)


def test_unknown_group_id_and_unknown_node():
    g = load(zoo.conv_bn_relu(3, 4, 3, image_size=8))
    with pytest.raises(UnsupportedGroup, match="no group 'nope'"):
        replace_groups(g, [group_of(g)], ["nope"])
    with pytest.raises(UnsupportedGroup, match="not in the model"):
        declare_group(g, FusionGroup("g9", "vertical", "t", ["ghost", "/relu/Relu"]))


def test_kernel_matches_onnxruntime_conv_relu_directly():
    x = rng.standard_normal((2, 4, 9, 9)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 1], pads=[1, 0, 0, 1], dilations=[1, 2],
                              group=2), helper.make_node("Relu", ["c"], ["y"])]
    m = make_model(nodes, [value_info("x", np.float32, list(x.shape))], [value_info("y", np.float32, OUT4)],
                   [tensor("w", w), tensor("b", b)])
    expected = run(session(m), {"x": x})["y"]
    decl = (reg_op("ConvRelu").INPUT("x", "float32").INPUT("filter", "float32").OPTIONAL_INPUT("bias", "float32")
            .OUTPUT("y", "float32").REQUIRED_ATTR("strides", "ListInt").REQUIRED_ATTR("pads", "ListInt")
            .ATTR("dilations", "ListInt", [1, 1, 1, 1]).ATTR("groups", "Int", 1).fuses("Conv", "Relu")
            .OP_END_FACTORY_REG("ConvRelu"))
    got = compute(decl, x, w, b, strides=[1, 1, 2, 1], pads=[1, 0, 0, 1], dilations=[1, 1, 1, 2], groups=2)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert (got >= 0).all() and (got == 0).any()


def test_same_name_different_body_is_refused_by_the_registry():
    decl = (reg_op("SigmoidRelu").INPUT("x", "float32").OUTPUT("y", "float32").fuses("Sigmoid", "Relu")
            .OP_END_FACTORY_REG("SigmoidRelu"))
    assert register(decl) == "SigmoidRelu"
    assert register(decl) == "SigmoidRelu"  # idempotent
    other = (reg_op("SigmoidRelu").INPUT("x", "float32").INPUT("x1", "float32").OUTPUT("y", "float32")
             .fuses("Sigmoid", "Relu").OP_END_FACTORY_REG("SigmoidRelu"))
    with pytest.raises(DeclarationError, match="already registered"):
        register(other)


def test_every_conv_bn_relu_group_of_a_resnet_plan():
    from fusionlab.passes import vertical

    g = load(zoo.resnet_small(image_size=32, width=8))
    plan = vertical.plan(g)
    ids = [grp.id for grp in plan if grp.pattern == "Conv+BatchNormalization+Relu"]
    assert len(ids) >= 3
    res = replace_groups(g, plan, ids)
    assert res.graph.op_counts()["ai.onnx.contrib:ConvRelu"] == len(ids)
    assert list(res.declarations()) == ["ConvRelu"]
    check(g, res)


def test_loading_the_custom_op_library_leaves_the_environment_alone():
    """onnxruntime-extensions sets PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python on import; kernels undoes that, so
    child processes (nbval's notebook kernels) keep the compiled protobuf."""
    import subprocess
    import sys

    code = ("import os; from fusionlab.export import kernels; kernels.library_path(); "
            "print(os.environ.get('PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION', 'unset'))")
    env = {k: v for k, v in os.environ.items() if k != "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "unset"
