"""Lowering groups to model-local functions: one node per group, and the model still runs the same."""

from __future__ import annotations

import numpy as np
from onnx import helper as h

from fusionlab import load, verify
from fusionlab.build import make_model, tensor, value_info
from fusionlab.passes.functions import function_name, to_functions
from fusionlab.plan import FusionGroup, FusionPlan

RNG = np.random.default_rng(5)


def chain_model():
    nodes = [h.make_node("Conv", ["x", "W"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             h.make_node("Softsign", ["c"], ["s"], name="ss"),
             h.make_node("Add", ["s", "x2"], ["y"], name="add")]
    return make_model(nodes, [value_info("x", shape=[1, 2, 5, 5]), value_info("x2", shape=[1, 4, 5, 5])],
                      [value_info("y", shape=[1, 4, 5, 5])], [tensor("W", RNG.standard_normal((4, 2, 3, 3)).astype(np.float32))])


def test_function_names():
    assert function_name(["Conv", "BatchNormalization", "Relu"]) == "ConvBnRelu_0"
    assert function_name(["Conv", "BatchNormalization", "Relu"], {"ConvBnRelu_0"}) == "ConvBnRelu_1"
    assert function_name(["com.microsoft:FusedConv", "Mul"]) == "FusedConvMul_0"


def test_group_becomes_one_call_and_still_runs():
    m = chain_model()
    g = load(m)
    plan = FusionPlan([FusionGroup("g0", "vertical", "conv_act", ["conv", "ss"], ["Conv", "Softsign"])])
    made = to_functions(g, plan)
    assert made == ["ConvSoftsign_0"]
    assert g.op_counts() == {"Add": 1, "fusionlab.fused:ConvSoftsign_0": 1}
    assert plan[0].lowered_to == "fusionlab.fused:ConvSoftsign_0"
    proto = g.to_proto()
    assert [f.name for f in proto.functions] == ["ConvSoftsign_0"]
    assert [n.op_type for n in proto.functions[0].node] == ["Conv", "Softsign"]
    load(proto)  # passes the checker
    report = verify(m, proto)
    assert report.ok, report.table()


def test_group_output_that_is_a_graph_output_keeps_its_name():
    m = chain_model()
    g = load(m)
    plan = FusionPlan([FusionGroup("g0", "vertical", "x", ["ss", "add"], ["Softsign", "Add"])])
    to_functions(g, plan)
    assert [o.name for o in g.outputs()] == ["y"]
    assert verify(m, g.to_proto()).ok


def test_non_convex_group_is_left_alone():
    # conv -> relu -> add, and conv -> add: grouping {conv, add} without relu would need a cycle
    nodes = [h.make_node("Relu", ["x"], ["c"], name="first"), h.make_node("Neg", ["c"], ["r"], name="mid"),
             h.make_node("Add", ["c", "r"], ["y"], name="last")]
    m = make_model(nodes, [value_info("x", shape=[2, 3])], [value_info("y", shape=[2, 3])])
    g = load(m)
    plan = FusionPlan([FusionGroup("g0", "vertical", "x", ["first", "last"], ["Relu", "Add"])])
    assert to_functions(g, plan) == []
    assert g.op_counts() == {"Add": 1, "Neg": 1, "Relu": 1}
    assert any("convex" in n for n in plan.notes)


def test_missing_nodes_are_noted():
    g = load(chain_model())
    plan = FusionPlan([FusionGroup("g0", "vertical", "x", ["conv", "gone"], ["Conv", "Relu"])])
    assert to_functions(g, plan) == []
    assert any("not found" in n for n in plan.notes)


def test_two_groups_and_branching_member_output():
    # a member output read outside the group becomes a second function output
    nodes = [h.make_node("Relu", ["x"], ["a"], name="n1"), h.make_node("Neg", ["a"], ["b"], name="n2"),
             h.make_node("Abs", ["a"], ["y2"], name="n3"), h.make_node("Exp", ["b"], ["c"], name="n4"),
             h.make_node("Sqrt", ["c"], ["y"], name="n5")]
    m = make_model(nodes, [value_info("x", shape=[2, 3])], [value_info("y", shape=[2, 3]), value_info("y2", shape=[2, 3])])
    g = load(m)
    plan = FusionPlan([FusionGroup("g0", "vertical", "x", ["n1", "n2"], ["Relu", "Neg"]),
                       FusionGroup("g1", "vertical", "x", ["n4", "n5"], ["Exp", "Sqrt"])])
    assert to_functions(g, plan) == ["ReluNeg_0", "ExpSqrt_0"]
    assert g.op_counts() == {"Abs": 1, "fusionlab.fused:ExpSqrt_0": 1, "fusionlab.fused:ReluNeg_0": 1}
    report = verify(m, g.to_proto())
    assert report.ok, report.table()
