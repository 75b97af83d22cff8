"""Horizontal fusion: siblings on one input -> one wide op + Split; legal only when it provably is."""

import numpy as np
import onnx
import pytest
from onnx import helper

from fusionlab import zoo
from fusionlab.analysis import derive
from fusionlab.build import make_model, tensor, value_info
from fusionlab.graph import load
from fusionlab.passes import fuse, horizontal
from fusionlab.verification.runtime import run, verify

RNG = np.random.default_rng(0)


def _w(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def qkv_model(with_bias=True, outputs_are_branches=False, hidden=16):
    """x -> LayerNorm-ish Relu -> three MatMul(+Add) siblings -> Add of the three (or three outputs)."""
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu")]
    inits = []
    outs = []
    for p in "qkv":
        nodes.append(helper.make_node("MatMul", ["h", f"W{p}"], [f"{p}0"], name=f"{p}_mm"))
        inits.append(tensor(f"W{p}", _w(hidden, hidden)))
        last = f"{p}0"
        if with_bias:
            nodes.append(helper.make_node("Add", [f"{p}0", f"b{p}"], [f"{p}1"], name=f"{p}_add"))
            inits.append(tensor(f"b{p}", _w(hidden)))
            last = f"{p}1"
        outs.append(last)
    if outputs_are_branches:
        graph_outputs = [value_info(o, np.float32, ["batch", "sequence", hidden]) for o in outs]
    else:
        nodes.append(helper.make_node("Add", [outs[0], outs[1]], ["qk"], name="sum1"))
        nodes.append(helper.make_node("Mul", ["qk", outs[2]], ["y"], name="mul"))
        graph_outputs = [value_info("y", np.float32, ["batch", "sequence", hidden])]
    return make_model(nodes, [value_info("x", np.float32, ["batch", "sequence", hidden])], graph_outputs, inits)


def conv_branches(attrs_b=None, bn=True, relu=True, group_b=1, cin=4, drop_b=()):
    """x -> three Conv(+BN)(+Relu) branches -> Concat (branch b's attributes updated by `attrs_b`, `drop_b` left out)."""
    nodes, inits, outs = [], [], []
    for i, k in enumerate("abc"):
        attrs = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])
        if k == "b" and attrs_b:
            attrs.update(attrs_b)
        group = group_b if k == "b" else 1
        cout = 4 + 2 * i
        kshape = attrs["kernel_shape"]
        if k == "b":
            attrs = {a: v for a, v in attrs.items() if a not in drop_b}
        nodes.append(helper.make_node("Conv", ["x", f"W{k}", f"B{k}"], [f"{k}0"], name=f"{k}_conv", group=group,
                                      **attrs))
        inits += [tensor(f"W{k}", _w(cout, cin // group, *kshape)), tensor(f"B{k}", _w(cout))]
        last = f"{k}0"
        if bn:
            nodes.append(helper.make_node("BatchNormalization", [last, f"g{k}", f"be{k}", f"m{k}", f"v{k}"],
                                          [f"{k}1"], name=f"{k}_bn", epsilon=1e-3))
            inits += [tensor(f"g{k}", _w(cout)), tensor(f"be{k}", _w(cout)), tensor(f"m{k}", _w(cout)),
                      tensor(f"v{k}", np.abs(_w(cout)) + 0.5)]
            last = f"{k}1"
        if relu:
            nodes.append(helper.make_node("Relu", [last], [f"{k}2"], name=f"{k}_relu"))
            last = f"{k}2"
        outs.append(last)
    nodes.append(helper.make_node("Concat", outs, ["y"], name="cat", axis=1))
    return make_model(nodes, [value_info("x", np.float32, [1, cin, 8, 8])], [value_info("y", np.float32, [1, 18, 8, 8])],
                      inits)


def _check_dag(graph):
    order = graph.topological_order()  # raises on a cycle
    assert len(order) == len(graph)
    onnx.checker.check_model(graph.to_proto(), full_check=True)


def test_derivation_concat_matmul_equals_separate():
    x = _w(5, 8)
    ws, bs = [_w(8, 3), _w(8, 5), _w(8, 2)], [_w(3), None, _w(2)]
    w, b, sizes = derive.concat_matmul_weights(ws, bs)
    parts = np.split(x @ w + b, np.cumsum(sizes)[:-1], axis=-1)
    for part, wi, bi in zip(parts, ws, bs):
        np.testing.assert_allclose(part, x @ wi + (0 if bi is None else bi), rtol=1e-5, atol=1e-5)


def test_qkv_fuses_to_one_matmul_add_split_and_verifies():
    g = load(qkv_model())
    result = fuse(g, ("horizontal",))
    assert len(result.plan) == 1
    group = result.plan[0]
    assert group.kind == "horizontal" and group.rule == "concat_matmul"
    assert sorted(group.nodes) == sorted(["q_mm", "q_add", "k_mm", "k_add", "v_mm", "v_add"])
    assert group.extra["split"] == [16, 16, 16]
    assert result.after.get("MatMul") == 1 and result.after.get("Add") == 2 and result.after.get("Split") == 1
    _check_dag(result.graph)
    for dims in ({"batch": 1, "sequence": 4}, {"batch": 3, "sequence": 7}):
        report = verify(g, result.graph, dims=dims)
        assert report.ok, report.table()
    assert g.op_counts()["MatMul"] == 3, "the caller's graph must not change"


def test_consumers_rewired_and_graph_outputs_keep_names():
    g = load(qkv_model(outputs_are_branches=True))
    result = fuse(g, ("horizontal",))
    assert len(result.plan) == 1
    assert [o.name for o in result.graph.outputs()] == ["q1", "k1", "v1"]
    split = [n for n in result.graph if n.op_type == "Split"]
    assert len(split) == 1 and [o.name for o in split[0].outputs] == ["q1", "k1", "v1"]
    assert verify(g, result.graph).ok


def test_matmul_without_bias_and_mixed_followers():
    g = load(qkv_model(with_bias=False))
    result = fuse(g, ("horizontal",))
    assert result.after["MatMul"] == 1 and "Split" in result.after
    assert verify(g, result.graph, dims={"batch": 2, "sequence": 3}).ok


def test_conv_bn_relu_branches_fuse_and_verify():
    g = load(conv_branches())
    result = fuse(g, ("horizontal",))
    assert len(result.plan) == 1
    group = result.plan[0]
    assert group.rule == "concat_conv" and group.extra["split"] == [4, 6, 8]
    assert group.size == 9
    assert result.after["Conv"] == 1 and result.after["BatchNormalization"] == 1 and result.after["Relu"] == 1
    _check_dag(result.graph)
    report = verify(g, result.graph)
    assert report.ok, report.table()


def test_different_conv_attributes_do_not_fuse():
    g = load(conv_branches(attrs_b=dict(strides=[2, 2]), bn=False, relu=False))
    p = horizontal.plan(g)
    # a and c still match each other; b (stride 2) stays alone
    assert len(p) == 1 and sorted(p[0].nodes) == ["a_conv", "c_conv"]
    g2 = load(conv_branches(attrs_b=dict(kernel_shape=[1, 1], pads=[0, 0, 0, 0]), bn=False, relu=False))
    assert all("b_conv" not in grp.nodes for grp in horizontal.plan(g2))


@pytest.mark.parametrize("attrs_b,drop_b", [
    ({"dilations": [1, 1]}, ()),                         # a default written out in one sibling only
    ({}, ("strides",)),                                  # a default left out in one sibling only
    ({}, ("kernel_shape",)),                             # the kernel shape left to the weight's
    ({"auto_pad": "NOTSET", "dilations": [1, 1]}, ("strides",)),
])
def test_a_default_written_or_left_out_is_the_same_convolution(attrs_b, drop_b):
    """Siblings compare by meaning, not by spelling: exporters write defaults out or leave them (they once compared
    the attributes as written, so a sibling that spelt `strides=[1, 1]` stayed alone)."""
    g = load(conv_branches(attrs_b=attrs_b, drop_b=drop_b, bn=True, relu=False))
    p = horizontal.plan(g)
    assert len(p) == 1 and sorted(n for n in p[0].nodes if n.endswith("_conv")) == ["a_conv", "b_conv", "c_conv"]
    result = fuse(g, ("horizontal",))
    _check_dag(result.graph)
    assert verify(g, result.graph).ok


def test_a_follower_default_left_out_matches_one_written_out():
    """LeakyRelu's alpha 0.01 written in one branch and left to the schema default in the other: one activation."""
    nodes, inits = [], []
    for k in "ab":
        nodes.append(helper.make_node("MatMul", ["x", f"W{k}"], [f"{k}0"], name=f"{k}_mm"))
        extra = {"alpha": 0.01} if k == "a" else {}
        nodes.append(helper.make_node("LeakyRelu", [f"{k}0"], [k], name=f"{k}_act", **extra))
        inits.append(tensor(f"W{k}", _w(6, 5)))
    nodes.append(helper.make_node("Add", ["a", "b"], ["y"], name="sum"))
    m = make_model(nodes, [value_info("x", np.float32, [3, 6])], [value_info("y", np.float32, [3, 5])], inits)
    g = load(m)
    p = horizontal.plan(g)
    assert len(p) == 1 and {"a_act", "b_act"} <= set(p[0].nodes)
    assert verify(g, fuse(g, ("horizontal",)).graph).ok
    m2 = make_model([n if n.name != "b_act" else helper.make_node("LeakyRelu", ["b0"], ["b"], name="b_act", alpha=0.2)
                     for n in nodes], [value_info("x", np.float32, [3, 6])], [value_info("y", np.float32, [3, 5])],
                    inits)
    assert not any({"a_act", "b_act"} <= set(grp.nodes) for grp in horizontal.plan(load(m2)))


def test_grouped_conv_is_not_fused():
    g = load(conv_branches(group_b=2, bn=False, relu=False))
    assert all("b_conv" not in grp.nodes for grp in horizontal.plan(g))


def test_min_branches_parameter():
    g = load(conv_branches(attrs_b=dict(strides=[2, 2]), bn=False, relu=False))
    assert len(horizontal.plan(g, min_branches=2)) == 1
    assert len(horizontal.plan(g, min_branches=3)) == 0
    with pytest.raises(ValueError):
        horizontal.plan(g, min_branches=1)


def test_non_constant_weight_is_not_fused():
    h = 8
    nodes = [helper.make_node("MatMul", ["x", "Wa"], ["a"], name="a_mm"),
             helper.make_node("MatMul", ["x", "w_in"], ["b"], name="b_mm"),
             helper.make_node("Add", ["a", "b"], ["y"], name="sum")]
    m = make_model(nodes, [value_info("x", np.float32, [2, h]), value_info("w_in", np.float32, [h, h])],
                   [value_info("y", np.float32, [2, h])], [tensor("Wa", _w(h, h))])
    p = horizontal.plan(load(m))
    assert len(p) == 0
    assert any("not a constant" in n for n in p.notes)


def test_overridable_initializer_weight_is_not_fused():
    m = qkv_model(with_bias=False)
    m.graph.input.append(helper.make_tensor_value_info("Wk", onnx.TensorProto.FLOAT, [16, 16]))
    p = horizontal.plan(load(m))
    assert len(p) == 1 and "k_mm" not in p[0].nodes and sorted(p[0].nodes) == ["q_mm", "v_mm"]


def test_sibling_depending_on_another_is_not_fused():
    # b's weight is computed from a's output: fusing a and b into one node would need b's weight
    # before the fused node runs -> a cycle. (AMDMIGraphX #5250, csarofeen/pytorch #1097)
    h = 4
    nodes = [helper.make_node("MatMul", ["x", "Wa"], ["a"], name="a_mm"),
             helper.make_node("Reshape", ["a", "shape"], ["wb"], name="to_weight"),
             helper.make_node("MatMul", ["x", "wb"], ["b"], name="b_mm"),
             helper.make_node("MatMul", ["x", "Wc"], ["c"], name="c_mm"),
             helper.make_node("Sum", ["b", "c"], ["y"], name="sum")]
    m = make_model(nodes, [value_info("x", np.float32, [h, h])], [value_info("y", np.float32, [h, h])],
                   [tensor("Wa", _w(h, h)), tensor("Wc", _w(h, h)), tensor("shape", np.array([h, h], np.int64))])
    g = load(m)
    p = horizontal.plan(g)
    assert all("b_mm" not in grp.nodes for grp in p)
    result = fuse(g, ("horizontal",))
    _check_dag(result.graph)
    assert verify(g, result.graph).ok
    # the dependency check itself
    a, b = g.node("a_mm"), g.node("b_mm")
    assert horizontal._depends(a, b) and not horizontal._depends(b, a)
    assert not horizontal._independent([a, b]) and horizontal._independent([a, g.node("c_mm")])


def test_branch_intermediate_that_is_graph_output_stops_followers():
    m = qkv_model()
    m.graph.output.append(helper.make_tensor_value_info("k0", onnx.TensorProto.FLOAT, ["batch", "sequence", 16]))
    g = load(m)
    result = fuse(g, ("horizontal",))
    group = result.plan[0]
    assert "k_add" not in group.nodes  # followers ride along only when every branch allows it
    assert sorted(group.nodes) == ["k_mm", "q_mm", "v_mm"]
    assert "k0" in [o.name for o in result.graph.outputs()]
    assert verify(g, result.graph).ok


def test_gemm_siblings_fuse_and_verify():
    nodes, inits = [], []
    for k, trans in (("a", 1), ("b", 1)):
        nodes.append(helper.make_node("Gemm", ["x", f"W{k}", f"C{k}"], [k], name=f"{k}_gemm", transB=trans))
        inits += [tensor(f"W{k}", _w(5, 6)), tensor(f"C{k}", _w(5))]
    nodes.append(helper.make_node("Concat", ["a", "b"], ["y"], name="cat", axis=1))
    m = make_model(nodes, [value_info("x", np.float32, [3, 6])], [value_info("y", np.float32, [3, 10])], inits)
    g = load(m)
    result = fuse(g, ("horizontal",))
    assert result.after["Gemm"] == 1
    assert verify(g, result.graph).ok


def test_bert_tiny_qkv_fused_per_layer():
    g = load(zoo.get("bert_tiny"))
    result = fuse(g, ("horizontal",))
    groups = [grp for grp in result.plan if grp.rule == "concat_matmul"]
    assert len(groups) == 2  # one per layer
    for grp in groups:
        names = " ".join(grp.nodes)
        assert all(p in names for p in ("query", "key", "value"))
        assert grp.op_types.count("MatMul") == 3 and grp.op_types.count("Add") == 3
    assert result.before["MatMul"] - result.after["MatMul"] == 4
    _check_dag(result.graph)
    report = verify(g, result.graph, dims={"batch": 2, "sequence": 16})
    assert report.ok, report.table()


def test_inception_tiny_sibling_1x1_convs_fused():
    g = load(zoo.get("inception", image_size=75, width=0.25))
    result = fuse(g, ("horizontal",))
    assert len(result.plan) >= 3
    for grp in result.plan:
        assert grp.rule == "concat_conv"
        convs = [g.node(n) for n in grp.nodes if g.node(n).op_type == "Conv"]
        assert len(convs) >= 2
        assert all(list(c.attributes["kernel_shape"].value) == [1, 1] for c in convs)
    _check_dag(result.graph)
    report = verify(g, result.graph, dims={"batch": 2})
    assert report.ok, report.table()


def test_outputs_identical_names_and_values_beyond_tolerance_check():
    # the Split hands each consumer exactly its own channels: swap two branches' weights and it fails
    g = load(qkv_model(outputs_are_branches=True))
    result = fuse(g, ("horizontal",))
    feeds = {"x": RNG.standard_normal((1, 3, 16)).astype(np.float32)}
    ref, got = run(g, feeds), run(result.graph, feeds)
    for name in ("q1", "k1", "v1"):
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-4, atol=1e-5)
    assert not np.allclose(got["q1"], ref["k1"])


def test_after_vertical_fusion_fusedconv_siblings_fuse():
    # the graph vertical fusion leaves behind: Conv+BN folded, activation inside com.microsoft:FusedConv
    nodes, inits = [], []
    for k, act in (("a", "Relu"), ("b", "Relu"), ("c", "Sigmoid")):
        nodes.append(helper.make_node("FusedConv", ["x", f"W{k}", f"B{k}"], [k], name=f"{k}_fc", domain="com.microsoft",
                                      kernel_shape=[1, 1], activation=act))
        inits += [tensor(f"W{k}", _w(3, 4, 1, 1)), tensor(f"B{k}", _w(3))]
    nodes.append(helper.make_node("Concat", ["a", "b", "c"], ["y"], name="cat", axis=1))
    m = make_model(nodes, [value_info("x", np.float32, [1, 4, 5, 5])], [value_info("y", np.float32, [1, 9, 5, 5])],
                   inits, extra_opsets={"com.microsoft": 1})
    g = load(m, check=False)
    result = fuse(g, ("horizontal",))
    assert len(result.plan) == 1 and sorted(result.plan[0].nodes) == ["a_fc", "b_fc"]  # same activation only
    assert verify(g, result.graph).ok
