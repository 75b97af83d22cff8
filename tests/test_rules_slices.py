"""slice_split: TorchScript's torch.chunk (Slices with starts/ends from the shape) -> one Split (YOLO11's head)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper as h

from fusionlab.build import tensor, value_info

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
