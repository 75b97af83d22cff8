"""fusionlab.compilers.grouping: edge agreement and pair Jaccard between two groupings."""

import numpy as np
from onnx import helper

from fusionlab.build import make_model, value_info
from fusionlab.compilers.grouping import compare_groupings, edges
from fusionlab.graph import load


def diamond():
    """a -> (b, c) -> d -> e, plus a Constant feeding e (constants are not edges)."""
    h = helper.make_node
    nodes = [h("Relu", ["x"], ["a"], name="a"), h("Neg", ["a"], ["b"], name="b"), h("Abs", ["a"], ["c"], name="c"),
             h("Add", ["b", "c"], ["d"], name="d"),
             h("Constant", [], ["k"], name="k", value=helper.make_tensor("k", 1, [1], [2.0])),
             h("Mul", ["d", "k"], ["y"], name="e")]
    return load(make_model(nodes, [value_info("x", np.float32, [4])], [value_info("y", np.float32, [4])]))


def test_edges_skip_constants():
    assert sorted((p, c) for p, c, *_ in edges(diamond())) == [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e")]


def test_identical_groupings_agree_fully():
    g = diamond()
    groups = [["a", "b", "c", "d"], ["e"]]
    agreement = compare_groupings(g, groups, groups)
    assert agreement.edge_agreement == 1.0 and agreement.pair_jaccard == 1.0 and not agreement.disagreements


def test_disagreements_are_listed_by_who_fused_them():
    g = diamond()
    a = compare_groupings(g, [["a", "b", "c", "d", "e"]], [["a", "b", "c", "d"]], name_a="tvm", name_b="fl")
    assert a.edge_agreement == 4 / 5
    assert [(e.producer, e.consumer) for e in a.disagreements] == [("d", "e")]
    assert a.by_pattern() == [("tvm", "Add -> Mul", 1)]
    assert a.pairs_a == 10 and a.pairs_b == 6 and a.pair_jaccard == 6 / 10


def test_uncovered_nodes_are_excluded():
    g = diamond()
    a = compare_groupings(g, [["b", "d"]], [["a", "b"]], covered_a=["b", "c", "d", "e"])
    assert a.excluded == ["a"]
    assert all("a" not in (e.producer, e.consumer) for e in a.edges)


def test_a_node_split_over_two_groups_counts_as_together_with_both():
    g = diamond()
    a = compare_groupings(g, [["a", "b"], ["a", "c"]], [["a", "b", "c"]])
    assert a.edge_agreement == 1.0
