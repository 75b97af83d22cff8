"""Constant folding and shape simplification before fusion, with the limits that keep a fold honest."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper as h

from fusionlab import cost, load, verify
from fusionlab.build import make_model, tensor, value_info
from fusionlab.passes import fold, fuse, mixed
from fusionlab.shapes import ShapeInfo

RNG = np.random.default_rng(3)


def _weight_transpose_model():
    """What `torch.onnx.export(do_constant_folding=False)` writes: the weight transposed at run time."""
    nodes = [h.make_node("Transpose", ["W"], ["Wt"], name="wt", perm=[1, 0]),
             h.make_node("Cast", ["Wt"], ["Wc"], name="cast", to=1),
             h.make_node("MatMul", ["x", "Wc"], ["y"], name="mm")]
    return make_model(nodes, [value_info("x", shape=["batch", 8])], [value_info("y", shape=["batch", 4])],
                      [tensor("W", RNG.standard_normal((4, 8)).astype(np.float32))])


def test_weight_only_subgraph_becomes_an_initializer():
    m = _weight_transpose_model()
    g = load(m)
    assert fold.needed(g)
    done = fold.fold(g)
    # the Transpose is evaluated; the float32 -> float32 Cast is the identity and is bypassed
    assert done["folded"] == 1 and done["identity casts"] == 1 and g.op_counts() == {"MatMul": 1}
    assert verify(m, g, dims={"batch": 3}).ok


def _shape_chain_model(batch="batch"):
    """Reshape(x, Concat(Shape(x)[0], 2, Shape(x)[2])): the dynamic batch stays, the static dims fold."""
    nodes = [h.make_node("Shape", ["x"], ["s"], name="shape"),
             h.make_node("Gather", ["s", "i0"], ["b"], name="g0", axis=0),
             h.make_node("Gather", ["s", "i2"], ["c"], name="g2", axis=0),
             h.make_node("Unsqueeze", ["b", "ax"], ["bu"], name="u0"),
             h.make_node("Unsqueeze", ["c", "ax"], ["cu"], name="u2"),
             h.make_node("Concat", ["bu", "two", "cu"], ["target"], name="cat", axis=0),
             h.make_node("Reshape", ["x", "target"], ["y"], name="reshape")]
    inits = [tensor("i0", np.array(0, np.int64)), tensor("i2", np.array(2, np.int64)),
             tensor("ax", np.array([0], np.int64)), tensor("two", np.array([2], np.int64))]
    return make_model(nodes, [value_info("x", shape=[batch, 2, 6])], [value_info("y", shape=[batch, 2, 6])], inits)


def test_static_dims_of_a_dynamic_shape_fold_and_the_dynamic_ones_stay():
    m = _shape_chain_model()
    g = load(m)
    done = fold.fold(g)
    assert done["shape values"] >= 1
    ops = g.op_counts()
    assert ops["Gather"] == 1 and "Shape" in ops  # the batch is read at run time, the static 6 became a constant
    for batch in (1, 3):
        assert verify(m, g, dims={"batch": batch}).ok


def test_fully_static_shape_chain_folds_away():
    m = _shape_chain_model(batch=5)
    g = load(m)
    fold.fold(g)
    from fusionlab.passes import cleanup

    cleanup.clean(g)
    assert g.op_counts() == {"Reshape": 1}
    assert verify(m, g).ok


def test_scalar_results_stay_scalars_at_opset_10():
    """Gather with a scalar index gives a scalar; Unsqueeze-10 (axes attribute) makes it a vector again."""
    nodes = [h.make_node("Shape", ["x"], ["s"], name="shape"),
             h.make_node("Gather", ["s", "i"], ["d"], name="g", axis=0),
             h.make_node("Unsqueeze", ["d"], ["du"], name="u", axes=[0]),
             h.make_node("Concat", ["du", "minus1"], ["t"], name="cat", axis=0),
             h.make_node("Reshape", ["x", "t"], ["y"], name="r")]
    m = make_model(nodes, [value_info("x", shape=[2, 3, 4])], [value_info("y", shape=[2, 12])],
                   [tensor("i", np.array(0, np.int64)), tensor("minus1", np.array([-1], np.int64))], opset=10)
    res = fuse(m, ("vertical",))
    assert res.after == {"Reshape": 1}
    assert verify(m, res.graph).ok


def test_limits_no_ballooning_no_overridable_no_random_no_outputs():
    nodes = [h.make_node("Expand", ["c", "big"], ["e"], name="expand"),             # would materialise 4 MiB
             h.make_node("Add", ["x", "e"], ["y"], name="add"),
             h.make_node("Neg", ["w"], ["wn"], name="neg"),                         # w is overridable
             h.make_node("Mul", ["x", "wn"], ["z"], name="mul"),
             h.make_node("RandomUniformLike", ["c"], ["r"], name="rand"),
             h.make_node("Add", ["x", "r"], ["q"], name="addr"),
             h.make_node("Abs", ["c"], ["out_const"], name="abs")]                  # a graph output
    inits = [tensor("c", np.ones((1, 1), np.float32)), tensor("big", np.array([1024, 1024], np.int64)),
             tensor("w", np.ones((1, 1), np.float32))]
    m = make_model(nodes, [value_info("x", shape=[1024, 1024]), value_info("w", shape=[1, 1])],
                   [value_info("y", shape=[1024, 1024]), value_info("z", shape=[1024, 1024]),
                    value_info("q", shape=[1024, 1024]), value_info("out_const", shape=[1, 1])], inits)
    g = load(m)
    assert fold.fold(g)["folded"] == 0
    assert set(g.op_counts()) == {"Expand", "Add", "Neg", "Mul", "RandomUniformLike", "Abs"}


def test_fold_keeps_a_broken_model_broken_not_unloadable():
    """ConstantOfShape -> NonZero gives an empty tensor: not folded (the model fails at run time, as before)."""
    nodes = [h.make_node("ConstantOfShape", ["n"], ["zeros"], name="cos"),
             h.make_node("NonZero", ["zeros"], ["nz"], name="nonzero"),
             h.make_node("Cast", ["nz"], ["nzf"], name="cast", to=1),
             h.make_node("ReduceSum", ["nzf"], ["s"], name="sum", keepdims=0),
             h.make_node("Add", ["x", "s"], ["y"], name="add")]
    m = make_model(nodes, [value_info("x", shape=[2])], [value_info("y", shape=[2])],
                   [tensor("n", np.array([3], np.int64))], opset=12)
    g = load(m)
    fold.fold(g)
    assert "NonZero" in g.op_counts()


def test_host_side_shape_arithmetic_is_never_a_kernel():
    m = _shape_chain_model()
    g = load(m)
    info = ShapeInfo(g)
    host = {n.name for n in g if fold.is_host_side(n, info)}
    assert {"shape", "g0", "g2", "u0", "u2", "cat"} <= host and "reshape" not in host
    p = mixed.plan(g, max_group_ops=None)
    assert not any(set(grp.nodes) & host for grp in p)
    c = cost.plan_cost(g, None, "Atlas 300I Pro")
    launched = {k.id for k in c.kernels_detail if k.launch_s > 0}
    assert not launched & host and "reshape" in launched


@pytest.mark.parametrize("folding", [True, False])
def test_fuse_prepares_by_default_and_can_be_told_not_to(folding):
    m = _weight_transpose_model()
    res = fuse(m, ("vertical",), prepare=folding)
    assert ("Transpose" in res.after) is not folding
    assert verify(m, res.graph, dims={"batch": 2}).ok


def test_reshape_target_from_the_live_shape_becomes_zeros_that_copy_dims():
    """TorchScript's Reshape(x, Concat(Shape(x)[0], Shape(x)[1], 4, 8)) -> Reshape(x, [0, 0, 4, 8]) (ORT's ReshapeFusion)."""
    nodes = [h.make_node("Shape", ["x"], ["s"], name="shape"),
             h.make_node("Gather", ["s", "i0"], ["b"], name="g0", axis=0),
             h.make_node("Gather", ["s", "i1"], ["t"], name="g1", axis=0),
             h.make_node("Unsqueeze", ["b", "ax"], ["bu"], name="u0"),
             h.make_node("Unsqueeze", ["t", "ax"], ["tu"], name="u1"),
             h.make_node("Concat", ["bu", "tu", "heads"], ["target"], name="cat", axis=0),
             h.make_node("Reshape", ["x", "target"], ["y"], name="reshape")]
    inits = [tensor("i0", np.array(0, np.int64)), tensor("i1", np.array(1, np.int64)),
             tensor("ax", np.array([0], np.int64)), tensor("heads", np.array([4, 8], np.int64))]
    m = make_model(nodes, [value_info("x", shape=["batch", "sequence", 32])],
                   [value_info("y", shape=["batch", "sequence", 4, 8])], inits)
    res = fuse(m, ())
    assert res.after == {"Reshape": 1}
    [r] = list(res.graph)
    assert r.inputs[1].const_value.numpy().tolist() == [0, 0, 4, 8]
    for dims in ({"batch": 1, "sequence": 3}, {"batch": 2, "sequence": 5}):
        assert verify(m, res.graph, dims=dims).ok


def test_a_weight_reshape_still_folds():
    nodes = [h.make_node("Reshape", ["W", "s"], ["Wr"], name="wr"), h.make_node("MatMul", ["x", "Wr"], ["y"], name="mm")]
    m = make_model(nodes, [value_info("x", shape=[2, 6])], [value_info("y", shape=[2, 2])],
                   [tensor("W", RNG.standard_normal((2, 6)).astype(np.float32)), tensor("s", np.array([6, 2], np.int64))])
    res = fuse(m, ())
    assert res.after == {"MatMul": 1} and verify(m, res.graph).ok


# --------------------------------------------------------------------------------------------------
# no-op arithmetic (issue 19): the operand forwarded is the one proved to pass through
# --------------------------------------------------------------------------------------------------

H = 8


def _noop_model(op: str, first: bool, cshape: tuple, *, batch="batch", dtype=np.float32, form="init", lead=None):
    """x <op> c (or c <op> x) with c neutral, then MatMul (floats; the Hugging Face norm: weight * hidden, then a
    projection) or Cast + Add (integers): forwarding the constant instead of x breaks the shapes or the values."""
    neutral = 0 if op in ("Add", "Sub") else 1
    c = np.full(cshape, neutral, dtype=dtype)
    ins = ["c", "x"] if first else ["x", "c"]
    nodes = [h.make_node(op, ins, ["n"], name="noop")]
    inits = [tensor("c", c)] if form == "init" else []
    if form == "constant":
        nodes.insert(0, h.make_node("Constant", [], ["c"], name="const", value=tensor("c", c)))
    if np.dtype(dtype).kind == "f":
        nodes.append(h.make_node("MatMul", ["n", "W"], ["y"], name="proj"))
        inits.append(tensor("W", RNG.standard_normal((H, 4)).astype(dtype)))
        out = value_info("y", dtype, lead or [batch, 3, 4])
    else:
        nodes += [h.make_node("Cast", ["n"], ["nf"], name="cast", to=1), h.make_node("Relu", ["nf"], ["y"], name="relu")]
        out = value_info("y", np.float32, [batch, 3, H])
    return make_model(nodes, [value_info("x", dtype, [batch, 3, H])], [out], inits)


NEUTRAL = [("Mul", True, np.float32), ("Mul", False, np.float32), ("Div", False, np.float32),
           ("Mul", True, np.float16), ("Add", True, np.int64), ("Add", False, np.int64), ("Sub", False, np.int64),
           ("Mul", True, np.int32), ("Div", False, np.int64)]


@pytest.mark.parametrize("op, first, dtype", NEUTRAL, ids=lambda v: getattr(v, "__name__", str(v)))
@pytest.mark.parametrize("cshape", [(), (1,), (H,), (1, 1, H), (3, 1)], ids=str)
@pytest.mark.parametrize("batch", ["batch", 2])
def test_a_noop_forwards_the_operand_it_proved_neutral(op, first, dtype, cshape, batch):
    """The family of issue 19's repro: the neutral constant on either side, of every shape that leaves x's shape,
    symbolic or static batch. The node is removed and every reader reads x itself."""
    m = _noop_model(op, first, cshape, batch=batch, dtype=dtype)
    g = load(m)
    assert fold.fold(g)["no-op arithmetic"] == 1 and "noop" not in {n.name for n in g}
    reader = next(n for n in g if n.name in ("proj", "cast"))
    assert reader.inputs[0].name == "x"
    res = fuse(m)  # the safety net runs it (batch 2, and compares)
    assert res.check.ran and res.check.compared
    for b in (1, 3):
        assert verify(m, res.graph, dims={"batch": b}).ok


@pytest.mark.parametrize("case", ["rank up", "dim up", "batch up", "almost one", "overridable", "x / ones first",
                                  "float + 0"])
def test_neutral_looking_constants_that_are_no_noop_stay(case):
    """Ones that broadcast x up (a rank more, or a dim > 1 where x has 1), a value one ulp from one, ones a user
    may override, 1 / x, and x + 0.0 (it turns -0.0 into +0.0) are no identity: nothing folds, and it runs."""
    if case == "rank up":
        m = _noop_model("Mul", True, (1, 1, 1, H), lead=[1, "batch", 3, 4])
    elif case == "dim up":
        m = _noop_model("Mul", False, (2, 3, H), batch=1, lead=[2, 3, 4])
    elif case == "batch up":
        m = _noop_model("Mul", True, (2, 1, 1), batch=1, lead=[2, 3, 4])
    elif case == "almost one":
        m = _noop_model("Mul", True, (H,))
        m.graph.initializer[0].CopyFrom(tensor("c", np.full(H, np.nextafter(np.float32(1), np.float32(2)))))
    elif case == "overridable":
        m = _noop_model("Mul", False, (H,))
        m.graph.input.append(value_info("c", np.float32, [H]))
    elif case == "x / ones first":
        m = _noop_model("Div", True, (H,))
    else:
        m = _noop_model("Add", False, (H,))
    g = load(m)
    assert fold.fold(g)["no-op arithmetic"] == 0 and "noop" in {n.name for n in g}
    res = fuse(m)
    assert res.check.ran and res.check.compared


def test_a_noop_whose_output_is_a_graph_output_keeps_the_declared_shape():
    """The generator's first find (seed 19, graph 19-11): the output's declared [N, 24] must survive the bypass."""
    from fusionlab.passes.validate import problems

    m = onnx.load(str(Path(__file__).parent / "data" / "fuzz_repros"
                      / "fuzz_noop_bypass_graph_output_keeps_declared_shape.onnx"))
    g = load(m)
    res = fuse(g)
    assert not problems(g, res.graph)
    assert [d if isinstance(d, int) else None for d in res.graph.graph.outputs[0].shape] == [None, 24]


# --------------------------------------------------------------------------------------------------
# identity casts (issue 19): TorchScript's hidden.to(float32) of a float32 tensor, which the residual reads
# --------------------------------------------------------------------------------------------------

def _cast_model(src=np.float32, to=np.float32, *, like=False, out_is_cast=False, relu_first=True):
    """Abs(x) -> Cast(to) [or CastLike(., like)] read by a Neg and by a residual Add
    (TorchScript aliases the Cast's output as the residual); `out_is_cast`: the Cast's output is the graph output."""
    from fusionlab.build import _DTYPES

    first = "r" if relu_first else "x"
    nodes = [h.make_node("Abs", ["x"], ["r"], name="relu")] if relu_first else []
    inits = []
    if like:
        inits.append(tensor("like", np.zeros((1,), dtype=to)))
        nodes.append(h.make_node("CastLike", [first, "like"], ["c"], name="cast"))
    else:
        nodes.append(h.make_node("Cast", [first], ["c"], name="cast", to=_DTYPES[np.dtype(to)]))
    outs = [value_info("c", to, ["batch", H])] if out_is_cast else []
    if not out_is_cast:
        nodes += [h.make_node("Neg", ["c"], ["s"], name="neg"), h.make_node("Add", ["c", "s"], ["y"], name="res")]
        outs = [value_info("y", to, ["batch", H])]
    return make_model(nodes, [value_info("x", src, ["batch", H])], outs, inits)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
@pytest.mark.parametrize("like", [False, True], ids=["Cast", "CastLike"])
def test_a_cast_to_the_type_it_has_is_bypassed(dtype, like):
    m = _cast_model(dtype, dtype, like=like)
    g = load(m)
    assert fold.fold(g)["identity casts"] == 1 and "cast" not in {n.name for n in g}
    assert {n.name: n for n in g}["res"].inputs[0].name == "r"
    res = fuse(m)
    assert res.check.ran and res.check.compared


@pytest.mark.parametrize("src, to", [(np.float16, np.float32), (np.float32, np.float16), (np.float32, np.int64),
                                     (np.int64, np.float32)])
@pytest.mark.parametrize("like", [False, True], ids=["Cast", "CastLike"])
def test_a_cast_to_another_type_stays(src, to, like):
    m = _cast_model(src, to, like=like)
    g = load(m)
    assert fold.fold(g)["identity casts"] == 0 and "cast" in {n.name for n in g}
    res = fuse(m)
    assert res.check.ran and res.check.compared


@pytest.mark.parametrize("like", [False, True], ids=["Cast", "CastLike"])
def test_a_float16_identity_cast_stays(like):
    """onnxruntime's CPU runs float16 ops through Casts it inserts and removes by the graph around them: dropping a
    float16 identity Cast moved a float32 output of its propagate_cast test model by one float16 ulp."""
    m = _cast_model(np.float16, np.float16, like=like)
    g = load(m)
    assert fold.fold(g)["identity casts"] == 0 and "cast" in {n.name for n in g}


def test_the_peer_sibling_casts_model_still_verifies():
    import glob

    roots = (Path(__file__).resolve().parents[2] / "shared" / "peer-tests", Path("/work/shared/peer-tests"))
    found = [f for r in roots for f in glob.glob(str(r / "**" / "fuse_sibling_casts_float_float16.onnx"),
                                                  recursive=True)]
    if not found:
        pytest.skip("onnxruntime's peer test models are not on this machine")
    res = fuse(load(found[0]))
    assert res.check.ran and res.check.compared


def test_an_identity_cast_that_is_the_graph_output_hands_its_name_on():
    m = _cast_model(out_is_cast=True)
    g = load(m)
    assert fold.fold(g)["identity casts"] == 1 and [n.name for n in g] == ["relu"]
    assert [o.name for o in g.graph.outputs] == ["c"] and g.graph.outputs[0].producer().name == "relu"
    res = fuse(m)
    assert res.check.ran and res.check.compared


def test_an_identity_cast_from_input_to_output_stays():
    """Nothing may take a graph output's name from a graph input: the Cast stays."""
    m = _cast_model(out_is_cast=True, relu_first=False)
    g = load(m)
    assert fold.fold(g)["identity casts"] == 0 and [n.name for n in g] == ["cast"]


def test_a_cast_of_an_untyped_contrib_op_output_stays():
    """onnx does not know com.microsoft ops; ShapeInfo guesses their outputs from input 0, which for
    DynamicQuantizeLinear-like ops is wrong: a Cast after one is not judged the identity."""
    m = _cast_model()
    m.graph.node[0].op_type, m.graph.node[0].domain = "QuickGelu", "com.microsoft"  # typed like its input
    m.opset_import.append(h.make_opsetid("com.microsoft", 1))
    g = load(m)
    assert fold.fold(g)["identity casts"] == 0 and "cast" in {n.name for n in g}
