"""Mixed fusion (TVM FuseOps on ONNX): op classes, post-dominator tree, grouping rules, thresholds."""

import numpy as np
import onnx
import pytest
from onnx import helper

from fusionlab import zoo
from fusionlab.analysis.opclass import KIND_OF, OpKind, classify, combine, table
from fusionlab.build import make_model, tensor, value_info
from fusionlab.graph import load
from fusionlab.passes import mixed

RNG = np.random.default_rng(1)


def _w(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def chain_model(ops, shape=(1, 4, 8, 8)):
    """x -> ops[0] -> ops[1] -> ... -> y (unary ops)."""
    nodes, prev = [], "x"
    for i, op in enumerate(ops):
        out = "y" if i == len(ops) - 1 else f"t{i}"
        nodes.append(helper.make_node(op, [prev], [out], name=f"n{i}"))
        prev = out
    return make_model(nodes, [value_info("x", np.float32, list(shape))], [value_info("y", np.float32, list(shape))])


def diamond_model():
    """x -> conv -> {relu, exp} -> add -> y   (TVM's diamond: the add post-dominates the conv)."""
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv", kernel_shape=[1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Exp", ["c"], ["e"], name="exp"),
             helper.make_node("Add", ["r", "e"], ["y"], name="add")]
    return make_model(nodes, [value_info("x", np.float32, [1, 4, 8, 8])], [value_info("y", np.float32, [1, 4, 8, 8])],
                      [tensor("W", _w(4, 4, 1, 1))])


def conv_add_relu_conv():
    """conv1 + bias Add + Relu, then conv2 + Relu: TVM's test_conv2d_fuse shape (two groups)."""
    nodes = [helper.make_node("Conv", ["x", "W1"], ["c1"], name="conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c1", "b1"], ["a1"], name="bias1"),
             helper.make_node("Relu", ["a1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "W2"], ["c2"], name="conv2", kernel_shape=[1, 1]),
             helper.make_node("Relu", ["c2"], ["y"], name="relu2")]
    return make_model(nodes, [value_info("x", np.float32, [1, 4, 8, 8])], [value_info("y", np.float32, [1, 4, 8, 8])],
                      [tensor("W1", _w(4, 4, 3, 3)), tensor("b1", _w(4, 1, 1)), tensor("W2", _w(4, 4, 1, 1))])


def layernorm_model(hidden=16):
    """Decomposed LayerNorm as torch.onnx exports it (Sub has two consumers; paths meet at Div)."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["mu"], name="mean", axes=[-1]),
             helper.make_node("Sub", ["x", "mu"], ["d"], name="sub"),
             helper.make_node("Pow", ["d", "two"], ["d2"], name="pow"),
             helper.make_node("ReduceMean", ["d2"], ["var"], name="var", axes=[-1]),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="add_eps"),
             helper.make_node("Sqrt", ["ve"], ["sd"], name="sqrt"),
             helper.make_node("Div", ["d", "sd"], ["n"], name="div"),
             helper.make_node("Mul", ["n", "gamma"], ["ng"], name="scale"),
             helper.make_node("Add", ["ng", "beta"], ["y"], name="shift")]
    shape = ["batch", 8, hidden]
    return make_model(nodes, [value_info("x", np.float32, shape)], [value_info("y", np.float32, shape)],
                      [tensor("two", np.array(2.0, np.float32)), tensor("eps", np.array(1e-5, np.float32)),
                       tensor("gamma", _w(hidden)), tensor("beta", _w(hidden))], opset=17)


# --------------------------------------------------------------------------------------------------
# classification
# --------------------------------------------------------------------------------------------------

def test_classification_table():
    expected = {"Relu": OpKind.ELEMWISE, "Add": OpKind.BROADCAST, "Reshape": OpKind.INJECTIVE,
                "Transpose": OpKind.INJECTIVE, "ReduceMean": OpKind.REDUCTION, "Conv": OpKind.OUT_EWISE_FUSABLE,
                "MatMul": OpKind.OUT_EWISE_FUSABLE, "Gemm": OpKind.OUT_EWISE_FUSABLE}
    for op, kind in expected.items():
        assert KIND_OF[op] == kind, op
    assert "Softmax" not in KIND_OF  # opaque, as in TVM
    rows = table()
    assert rows == sorted(rows, key=lambda r: (OpKind[r[1]], r[0])) and len(rows) == len(KIND_OF)
    assert combine(OpKind.ELEMWISE, OpKind.INJECTIVE) == OpKind.INJECTIVE


def test_classify_nodes_and_demotion():
    g = load(diamond_model())
    kinds = {n.name: classify(n) for n in g}
    assert kinds["conv"] == OpKind.OUT_EWISE_FUSABLE and kinds["relu"] == OpKind.ELEMWISE
    # Add of two same-shape tensors is elementwise once shapes are known, broadcast otherwise
    assert classify(g.node("add")) == OpKind.BROADCAST
    shapes = {"r": (1, 4, 8, 8), "e": (1, 4, 8, 8), "y": (1, 4, 8, 8)}
    assert classify(g.node("add"), shapes) == OpKind.ELEMWISE
    custom = helper.make_node("Foo", ["x"], ["y"], domain="my.domain")
    m = make_model([custom], [value_info("x", np.float32, [2])], [value_info("y", np.float32, [2])],
                   extra_opsets={"my.domain": 1})
    assert classify(next(iter(load(m, check=False)))) == OpKind.OPAQUE


# --------------------------------------------------------------------------------------------------
# post-dominator tree (structure asserted, TVM-test style)
# --------------------------------------------------------------------------------------------------

def test_post_dominator_diamond():
    tree = mixed.post_dominator_tree(load(diamond_model()))
    assert tree == {"conv": "add", "relu": "add", "exp": "add", "add": None}


def test_post_dominator_branches_that_never_meet():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("Exp", ["a"], ["b"], name="b"),
             helper.make_node("Neg", ["a"], ["c"], name="c"),
             helper.make_node("Abs", ["b"], ["y1"], name="d")]
    m = make_model(nodes, [value_info("x", np.float32, [4])],
                   [value_info("y1", np.float32, [4]), value_info("c", np.float32, [4])])
    tree = mixed.post_dominator_tree(load(m))
    assert tree == {"a": None, "b": "d", "c": None, "d": None}


def test_post_dominator_nested_diamonds_and_graph_output_inside():
    # a -> {b, c}; b -> {d, e}; d, e -> f; c, f -> g.  pd(a)=g, pd(b)=f.
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("Exp", ["a"], ["b"], name="b"),
             helper.make_node("Neg", ["a"], ["c"], name="c"),
             helper.make_node("Abs", ["b"], ["d"], name="d"),
             helper.make_node("Sin", ["b"], ["e"], name="e"),
             helper.make_node("Add", ["d", "e"], ["f"], name="f"),
             helper.make_node("Mul", ["c", "f"], ["y"], name="g")]
    m = make_model(nodes, [value_info("x", np.float32, [4])], [value_info("y", np.float32, [4])])
    assert mixed.post_dominator_tree(load(m)) == {"a": "g", "b": "f", "c": "g", "d": "f", "e": "f", "f": "g",
                                                  "g": None}
    # make f a graph output too: it must be written out, so it post-dominates nothing and b loses nothing
    m.graph.output.append(helper.make_tensor_value_info("f", onnx.TensorProto.FLOAT, [4]))
    tree = mixed.post_dominator_tree(load(m))
    assert tree["f"] is None and tree["b"] == "f" and tree["a"] is None


# --------------------------------------------------------------------------------------------------
# grouping
# --------------------------------------------------------------------------------------------------

def _groups(p):
    return [sorted(g.nodes) for g in p]


def test_conv_fuses_with_elementwise_diamond():
    p = mixed.plan(load(diamond_model()))
    assert _groups(p) == [["add", "conv", "exp", "relu"]]
    assert p[0].anchor == "conv" and p[0].extra["pattern"] == "out_ewise_fusable"


def test_two_convs_stay_in_two_groups():
    p, steps = mixed.plan(load(conv_add_relu_conv()), trace=True)
    assert _groups(p) == [["bias1", "conv1", "relu1"], ["conv2", "relu2"]]
    assert "out-fusable group only grows through elementwise ops" in p[0].reason
    assert p[1].reason.startswith("graph output")
    assert any(s.node == "relu1" and not s.fused for s in steps)
    assert all(isinstance(str(s), str) for s in steps)


def test_opaque_op_is_a_barrier():
    p = mixed.plan(load(chain_model(["Relu", "Exp", "Softmax", "Neg", "Abs"])), max_group_ops=None)
    assert _groups(p) == [["n0", "n1"], ["n3", "n4"]]
    assert "opaque" in p[0].reason


def test_reduction_only_ends_a_group():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("ReduceSum", ["a"], ["s"], name="sum", keepdims=1),
             helper.make_node("Exp", ["s"], ["y"], name="exp")]
    m = make_model(nodes, [value_info("x", np.float32, [4, 8])], [value_info("y", np.float32, [1, 1])])
    p = mixed.plan(load(m))
    assert _groups(p) == [["relu", "sum"]]
    assert p[0].reason.startswith("reduction")


def test_layernorm_multi_consumer_and_recompute():
    g = load(layernorm_model())
    p = mixed.plan(g, max_group_ops=None)
    groups = _groups(p)
    # Sub feeds Pow and Div; their paths meet at Div only through a ReduceMean: Sub cannot fuse
    assert not any("sub" in grp for grp in groups)
    assert ["add_eps", "div", "scale", "shift", "sqrt"] in groups
    assert any("recompute not allowed" in s.reason for s in mixed.trace(g, max_group_ops=None)[1]
               if s.node == "sub")
    pr = mixed.plan(g, max_group_ops=None, allow_recompute=True)
    recomputed = [grp for grp in pr if grp.recompute]
    assert len(recomputed) == 2 and all(grp.recompute == ["sub"] for grp in recomputed)
    assert sum(grp.size for grp in pr) == sum(grp.size for grp in p) + 2


def test_max_group_ops_caps_groups_and_reason():
    g = load(chain_model(["Relu", "Exp", "Neg", "Abs", "Sin", "Cos", "Relu", "Exp", "Neg", "Abs", "Sin", "Cos"]))
    assert _groups(mixed.plan(g, max_group_ops=None)) == [sorted(f"n{i}" for i in range(12))]
    p = mixed.plan(g, max_group_ops=5)
    assert [grp.size for grp in p] == [5, 5, 2]  # a group grows from its first node until the cap
    assert any(grp.reason.startswith("max ops reached") for grp in p)
    with pytest.raises(ValueError):
        mixed.plan(g, max_group_ops=0)


def _kernels(graph, p):
    return len(graph) - p.saved_launches


def _assert_acyclic(graph, p):
    """Contract every group to one node; the quotient graph must still be a DAG."""
    group_of = p.node_to_group()
    key = {id(n): group_of.get(n.name, n.name) for n in graph}
    succ = {k: set() for k in key.values()}
    for n in graph:
        for out in n.outputs:
            for c in graph.consumers(out):
                a, b = key[id(n)], key[id(c)]
                if a != b:
                    succ[a].add(b)
    indeg = {k: 0 for k in succ}
    for k in succ:
        for s in succ[k]:
            indeg[s] += 1
    ready = [k for k, d in indeg.items() if d == 0]
    seen = 0
    while ready:
        k = ready.pop()
        seen += 1
        for s in succ[k]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    assert seen == len(succ), "fusion groups form a cycle"


@pytest.fixture(scope="module")
def zoo_graphs():
    return {"bert_tiny": load(zoo.get("bert_tiny")),
            "yolov5n": load(zoo.get("yolov5n", image_size=160)),
            "inception": load(zoo.get("inception", image_size=75, width=0.25))}


@pytest.mark.parametrize("name", ["bert_tiny", "yolov5n", "inception"])
def test_thresholds_monotonic_and_respected(zoo_graphs, name):
    g = zoo_graphs[name]
    from fusionlab.shapes import infer_shapes
    shapes = infer_shapes(g)
    kernels = []
    for mx in (None, 8, 5, 3, 2, 1):
        p = mixed.plan(g, max_group_ops=mx, shapes=shapes)
        assert all(mx is None or grp.size <= mx for grp in p)
        _assert_acyclic(g, p)
        kernels.append(_kernels(g, p))
    assert kernels == sorted(kernels), kernels
    assert kernels[-1] == len(g) and kernels[0] < len(g)
    budget_kernels = []
    for kb in (None, 512, 192, 96, 48):
        p = mixed.plan(g, max_group_ops=None, buffer_kb=kb, shapes=shapes)
        for grp in p:
            assert kb is None or grp.extra["working_set_kb"] <= kb, (grp.nodes, grp.extra)
        _assert_acyclic(g, p)
        budget_kernels.append(_kernels(g, p))
    assert budget_kernels == sorted(budget_kernels), budget_kernels
    assert mixed.plan(g, shapes=shapes) == mixed.plan(g, shapes=shapes)  # deterministic
    _assert_acyclic(g, mixed.plan(g, max_group_ops=None, allow_recompute=True, shapes=shapes))


def test_buffer_budget_splits_a_group():
    g = load(chain_model(["Relu", "Exp", "Neg", "Abs"], shape=(1, 64, 32, 32)))  # 256 KB per tensor
    full = mixed.working_set(g, ["n0", "n1", "n2", "n3"])
    # in + out double-buffered 16 KB tiles (64) + at most two live intermediates (32)
    assert full == pytest.approx(96.0)
    assert mixed.working_set(g, ["n0"]) == pytest.approx(64.0)
    assert len(mixed.plan(g, buffer_kb=96)) == 1
    p = mixed.plan(g, buffer_kb=80)
    assert all(grp.extra["working_set_kb"] <= 80 for grp in p) and all(grp.size < 4 for grp in p)
    assert any("buffer budget exceeded" in grp.reason for grp in p)


# --------------------------------------------------------------------------------------------------
# lowering to ONNX functions: the result runs and computes the same
# --------------------------------------------------------------------------------------------------

from fusionlab.passes import fuse  # noqa: E402
from fusionlab.verification.runtime import verify


def _check_lowered(g, result, dims=None):
    onnx.checker.check_model(result.graph.to_proto(), full_check=True)
    result.graph.topological_order()  # raises on a cycle
    assert all(grp.lowered_to.startswith("fusionlab.fused:") for grp in result.plan), \
        [(grp.id, grp.lowered_to) for grp in result.plan]
    calls = sum(n.domain == "fusionlab.fused" for n in result.graph)
    assert calls == len(result.plan)
    copies = [n for grp in result.plan for n in grp.recompute]
    extra = len(copies) - len(set(copies))  # a recomputed op: one copy per group that recomputes it
    prepared = len(fuse(g, ()).graph)  # after clean-up and constant folding, before grouping
    assert len(result.graph) == prepared + extra - result.plan.saved_launches
    assert [o.name for o in result.graph.outputs()] == [o.name for o in g.outputs()]
    report = verify(g, result.graph, dims=dims)
    assert report.ok, report.table()


def test_lowered_layernorm_with_recompute_verifies():
    g = load(layernorm_model())
    result = fuse(g, ("mixed",), max_group_ops=None, allow_recompute=True)
    assert any(grp.recompute for grp in result.plan)
    _check_lowered(g, result, dims={"batch": 3})


@pytest.mark.parametrize("name", ["bert_tiny", "yolov5n"])
def test_lowered_zoo_model_verifies(zoo_graphs, name):
    g = zoo_graphs[name]
    result = fuse(g, ("mixed",), max_group_ops=5, buffer_kb=192)
    assert len(result.plan) > 5
    _check_lowered(g, result, dims={"batch": 2, "sequence": 16})
