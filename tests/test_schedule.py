"""fusionlab.cost.schedule: which kernels a plan launches, their order, and what each writes."""

import numpy as np
import pytest
from onnx import helper

from fusionlab.build import make_model, value_info
from fusionlab.cost import schedule
from fusionlab.graph import load
from fusionlab.plan import FusionGroup, FusionPlan


def _graph():
    h = helper.make_node
    nodes = [h("Relu", ["x"], ["a"], name="r"), h("Neg", ["a"], ["b"], name="n"), h("Exp", ["b"], ["c"], name="e"),
             h("Abs", ["a"], ["d"], name="abs"), h("Add", ["c", "d"], ["y"], name="add")]
    return load(make_model(nodes, [value_info("x", np.float32, [8])], [value_info("y", np.float32, [8])]))


def test_ungrouped_nodes_are_kernels_and_groups_write_only_what_leaves_them():
    g = _graph()
    order = g.topological_order()
    ks = schedule.kernels_of(order, FusionPlan([FusionGroup("g", "mixed", "t", ["n", "e"], ["Neg", "Exp"])]))
    assert ks.order == ["r", "g", "abs", "add"]
    by = {n.name: n for n in order}
    assert ks.written("g", by["e"].outputs[0]) and not ks.written("g", by["n"].outputs[0])
    assert ks.readers(by["r"].outputs[0]) == {"g", "abs"}


def test_a_group_that_absorbs_an_earlier_one_wins_its_nodes():
    g = _graph()
    plan = FusionPlan([FusionGroup("v", "vertical", "t", ["n", "e"], ["Neg", "Exp"]),
                       FusionGroup("m", "mixed", "t", ["n", "e", "add"], ["Neg", "Exp", "Add"])])
    ks = schedule.kernels_of(g.topological_order(), plan)
    assert "v" not in ks.members and [n.name for n in ks.members["m"]] == ["n", "e", "add"]


def test_peak_live_adds_the_step_workspace():
    g = _graph()
    order = g.topological_order()
    ks = schedule.kernels_of(order, FusionPlan())
    peak, _ = schedule.peak_live(ks, g.inputs(), lambda v: 32, [0] * len(ks.order))
    more, step = schedule.peak_live(ks, g.inputs(), lambda v: 32, [0, 0, 1000, 0, 0])
    assert more == max(peak, 1000 + 3 * 32) and step == 2  # while e runs: a, b and c are live


def test_a_plan_naming_unknown_nodes_is_refused():
    with pytest.raises(ValueError, match="not in the model"):
        schedule.kernels_of(_graph().topological_order(), FusionPlan([FusionGroup("g", "mixed", "t", ["zz"], ["X"])]))
