"""slice_split: TorchScript's torch.chunk (Slices with starts/ends from the shape) -> one Split (YOLO11's head)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper as h

from fusionlab.build import tensor, value_info
from fusionlab.passes import fuse

from rulekit import CORPUS, check, mk, refused

BIG = np.iinfo(np.int64).max


def chunk(ranges, *, axis=1, shape=(1, 4, 525), steps=None, dynamic=False):
    """Slices of x on `axis` with the given (start, end); outputs in order."""
    nodes, inits, outs = [], [tensor("ax", np.array([axis], np.int64))], []
    for k, (a, b) in enumerate(ranges):
        ins = ["x", f"s{k}", f"e{k}", "ax"] + ([f"st{k}"] if steps else [])
        nodes.append(h.make_node("Slice", ins, [f"y{k}"], name=f"slice{k}"))
        inits += [tensor(f"s{k}", np.array([a], np.int64)), tensor(f"e{k}", np.array([b], np.int64))]
        if steps:
            inits.append(tensor(f"st{k}", np.array([steps[k]], np.int64)))
        outs.append(value_info(f"y{k}", shape=None))
    dims = list(shape)
    if dynamic:
        dims[axis] = "n"
    return mk(nodes, [value_info("x", shape=dims)], outs, inits, opset=20)


@pytest.mark.parametrize("ranges", [[(0, 2), (2, 4)], [(2, BIG), (0, 2)], [(0, 1), (1, 3), (-1, BIG)]])
def test_slices_that_tile_an_axis_become_one_split(ranges):
    res = check(chunk(ranges), ("slice_split",), {"Split": 1})
    assert res.plan.rule_counts() == {"slice_split": 1}
    assert [o.name for o in res.graph.graph.outputs] == [f"y{k}" for k in range(len(ranges))]


def test_a_range_sliced_twice_joins_the_split_once_and_the_other_slice_stays():
    # fuzz seed 12, graph 5627: two Slices of one range crashed the sort of the ranges (Nodes do not compare)
    res = check(chunk([(0, 2), (0, 2), (2, 4)]), ("slice_split",), {"Slice": 1, "Split": 1})
    assert res.plan.rule_counts() == {"slice_split": 1}
    assert [o.name for o in res.graph.graph.outputs] == ["y0", "y1", "y2"]


@pytest.mark.parametrize("case, kw, node, reason", [
    ("a gap", {"ranges": [(0, 1), (2, 4)]}, "slice0", "do not tile"),
    ("an overlap", {"ranges": [(0, 3), (2, 4)]}, "slice0", "do not tile"),
    # fuzz seed 12, graph 5627: two Slices of one range crashed the sort (Nodes do not compare)
    ("one range twice", {"ranges": [(0, 2), (0, 2)]}, "slice0", "do not tile"),
    ("unknown length", {"ranges": [(0, 2), (2, 4)], "dynamic": True}, "slice0", "is not known"),
])
def test_slice_split_refuses(case, kw, node, reason):
    reasons = refused(chunk(**kw), ("slice_split",), node)
    assert any(reason in x for x in reasons), reasons


def test_strided_or_single_slices_are_left_alone():
    assert refused(chunk([(0, 2), (2, 4)], steps=[2, 1]), ("slice_split",), "slice0") == []
    assert refused(chunk([(0, 4)]), ("slice_split",), "slice0") == []


@pytest.mark.parametrize("name", ["yolo11.ts-fold", "yolo11.ts-nofold"])
def test_corpus_yolo11_chunk(name):
    if not (CORPUS / f"{name}.onnx").exists():
        pytest.skip("no corpus")
    res = check(str(CORPUS / f"{name}.onnx"), ("slice_split",))
    assert res.plan.rule_counts() == {"slice_split": 1}


def test_a_split_plan_round_trips_through_json():
    from fusionlab.passes import apply, fuse
    from fusionlab.plan import FusionPlan

    m = chunk([(0, 1), (1, 3), (3, 4)])
    res = fuse(m, ("vertical",), rules=("slice_split",))
    again = apply(m, FusionPlan.from_json(res.plan.to_json()))
    assert again.graph.to_proto().SerializeToString() == res.graph.to_proto().SerializeToString()


# ---------------------------------------------------------------------------------------------------
# rotary rotate_half as the exporters write it, and the shape vectors beside it (issue 19.3)
# ---------------------------------------------------------------------------------------------------

MIN = np.iinfo(np.int64).min


def rotary(*, start="pos", end="max", axis=3, steps=True, ends_from_shape=False, dyn=True, opset=18, d=16, heads=4):
    """q and k [B, heads, S, d] through rotate_half (x[..., :d/2], x[..., d/2:], cat(-x2, x1)), x*cos + rot*sin, then
    q @ k^T: what LLaMA's attention reads. `start` "neg" writes x[..., -d/2:]; `end` "max" INT64_MAX, "exact" d,
    "over" d + 5, "neg" (first half as x[..., :-d/2]); `ends_from_shape`: TorchScript's Shape -> Gather -> Div."""
    B, S = ("batch", "seq") if dyn else (2, 3)
    half = d // 2
    nodes, inits = [], []

    def c(name, arr):
        inits.append(tensor(name, np.asarray(arr, np.int64)))
        return name

    def rotate(x):
        first_end = c(f"{x}e0", [-half] if end == "neg" else [half])
        second_start = c(f"{x}s1", [half] if start == "pos" else [-half])
        if ends_from_shape:
            nodes.extend([h.make_node("Shape", [x], [f"{x}sh"]),
                          h.make_node("Gather", [f"{x}sh", c(f"{x}i3", 3)], [f"{x}d"], axis=0),
                          h.make_node("Div", [f"{x}d", c(f"{x}two", 2)], [f"{x}hd"]),
                          h.make_node("Unsqueeze", [f"{x}hd", c(f"{x}u0", [0])], [f"{x}half"])])
            first_end = second_start = f"{x}half"
        e1 = {"max": BIG, "exact": d, "over": d + 5, "neg": BIG}[end]
        s1 = [x, c(f"{x}s0", [0]), first_end, c(f"{x}a0", [axis])] + ([c(f"{x}t0", [1])] if steps else [])
        s2 = [x, second_start, c(f"{x}e1", [e1]), c(f"{x}a1", [axis])] + ([c(f"{x}t1", [1])] if steps else [])
        nodes.extend([h.make_node("Slice", s1, [f"{x}1"], name=f"{x}_slice1"),
                      h.make_node("Slice", s2, [f"{x}2"], name=f"{x}_slice2"),
                      h.make_node("Neg", [f"{x}2"], [f"{x}n2"]),
                      h.make_node("Concat", [f"{x}n2", f"{x}1"], [f"{x}rot"], axis=-1),
                      h.make_node("Mul", [x, "cos"], [f"{x}c"]), h.make_node("Mul", [f"{x}rot", "sin"], [f"{x}s"]),
                      h.make_node("Add", [f"{x}c", f"{x}s"], [f"{x}emb"])])
        return f"{x}emb"

    q, k = rotate("q"), rotate("k")
    nodes += [h.make_node("Transpose", [k], ["kt"], perm=[0, 1, 3, 2]), h.make_node("MatMul", [q, "kt"], ["scores"])]
    ins = [value_info(n, shape=[B, heads, S, d]) for n in ("q", "k")] + \
        [value_info(n, shape=[B, 1, S, d]) for n in ("cos", "sin")]
    return mk(nodes, ins, [value_info("scores", shape=[B, heads, S, S])], inits, opset=opset)


@pytest.mark.parametrize("start, end", [("pos", "max"), ("neg", "max"), ("pos", "exact"), ("pos", "over"),
                                        ("neg", "neg")])
@pytest.mark.parametrize("axis", [3, -1])
@pytest.mark.parametrize("steps, ends_from_shape, dyn, opset",
                         [(True, False, True, 18), (False, True, True, 13), (True, True, False, 20)])
def test_rotate_half_becomes_a_split_the_checker_accepts(start, end, axis, steps, ends_from_shape, dyn, opset):
    """The family of issue 19's LLaMA export (dynamo: ends INT64_MAX, axes [3]; TorchScript: ends from the shape):
    each rotate_half is one Split, and the fused model passes the full checker, runs and agrees (`check`)."""
    m = rotary(start=start, end=end, axis=axis, steps=steps, ends_from_shape=ends_from_shape, dyn=dyn, opset=opset)
    res = check(m, ("slice_split",))
    assert res.plan.rule_counts() == {"slice_split": 2} and res.after.get("Split") == 2
    for passes in (("vertical",), ("vertical", "horizontal", "mixed")):
        onnx.checker.check_model(fuse(m, passes).graph.to_proto(), full_check=True)


def shape_slices(*, use="Reshape", opset=18, declared=True):
    """Shape(x)[:-2], [-2:-1], [-1:] (the dynamo exporter's repeat_kv: INT64_MIN starts, INT64_MAX ends) around a 1,
    the shape of a Reshape or Expand, then a MatMul; x [B, S, T] with every dim symbolic, so nothing folds."""
    c = lambda n, a: tensor(n, np.asarray(a, np.int64))  # noqa: E731
    nodes = [h.make_node("Shape", ["x"], ["s"], name="shape"),
             h.make_node("Slice", ["s", "a0", "b0"], ["p0"], name="lead"),
             h.make_node("Slice", ["s", "a1", "b1"], ["p1"], name="second_last"),
             h.make_node("Slice", ["s", "a2", "b2"], ["p2"], name="last"),
             h.make_node("Concat", ["p0", "one", "p1", "p2"], ["target"], axis=0, name="cat"),
             h.make_node(use, ["x", "target"], ["x4"], name="reshape"), h.make_node("MatMul", ["x4", "w"], ["y"], name="mm")]
    inits = [c("a0", [MIN]), c("b0", [-2]), c("a1", [-2]), c("b1", [-1]), c("a2", [-1]), c("b2", [BIG]), c("one", [1])]
    m = mk(nodes, [value_info("x", shape=["B", "S", "T"]), value_info("w", shape=["B", 1, "T", 4])],
           [value_info("y", shape=["B", 1, "S", 4])], inits, opset=opset)
    if declared:  # as the dynamo exporter declares every value
        m.graph.value_info.extend(onnx.shape_inference.infer_shapes(m, data_prop=True).graph.value_info)
    return m


@pytest.mark.parametrize("use", ["Reshape", "Expand"])
@pytest.mark.parametrize("declared", [True, False])
def test_slices_of_a_shape_vector_stay_shape_arithmetic(use, declared):
    """They tile the shape vector, but a Split there hid every dim computed from them from onnx's shape inference
    ([B, 1, S, T] became [unk, 1, unk, unk]): refused, saying why; the model is fused otherwise and stays valid."""
    m = shape_slices(use=use, declared=declared)
    reasons = refused(m, ("slice_split",), "lead")
    assert any("shape vector" in x for x in reasons), reasons
    res = fuse(m, ("vertical", "horizontal", "mixed"))
    assert "Split" not in res.after
    proto = res.graph.to_proto()
    onnx.checker.check_model(proto, full_check=True)

    def dims(model):
        bare = onnx.ModelProto()
        bare.CopyFrom(model)
        del bare.graph.value_info[:]
        inferred = onnx.shape_inference.infer_shapes(bare, data_prop=True)
        return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
                for v in inferred.graph.value_info}

    assert dims(proto)["x4"] == dims(m)["x4"] and not any("unk" in str(d) for d in dims(proto)["x4"])
