"""FusionPlan: plain data that prints, serialises and compares."""

import json

import pytest

from fusionlab.plan import FusionGroup, FusionPlan


def sample_plan():
    plan = FusionPlan(model="toy")
    plan.add(FusionGroup("g0", "vertical", "conv_bn_act", ["conv", "bn", "relu"], ["Conv", "BatchNormalization", "Relu"],
                         saved_bytes=4096, saved_launches=2, lowered_to="com.microsoft:FusedConv"))
    plan.add(FusionGroup("g1", "horizontal", "concat_matmul", ["q", "k", "v"], ["MatMul"] * 3,
                         saved_bytes=0, saved_launches=2, lowered_to="MatMul+Split"))
    return plan


def test_json_round_trip_and_equality():
    plan = sample_plan()
    back = FusionPlan.from_json(plan.to_json())
    assert back == plan
    assert json.loads(plan.to_json())["groups"][0]["nodes"] == ["conv", "bn", "relu"]
    back.groups[0].saved_bytes += 1
    assert back != plan


def test_summaries():
    plan = sample_plan()
    assert plan.saved_launches == 4 and plan.saved_bytes == 4096
    assert plan.rule_counts() == {"concat_matmul": 1, "conv_bn_act": 1}
    assert plan.node_to_group()["bn"] == "g0"
    assert plan["g1"].pattern == "MatMul+MatMul+MatMul"
    assert len(plan.by_kind("vertical")) == 1


def test_table_is_deterministic_text():
    plan = sample_plan()
    text = plan.table()
    assert text == sample_plan().table()
    # the text table writes runs as Op×n, contrib ops without their domain and BatchNormalization as BN
    assert "Conv+BN+Relu" in text and "MatMul×3" in text and "FusedConv" in text and "com.microsoft:" not in text
    assert "…" not in text and max(map(len, text.splitlines())) <= 110
    assert plan.rows()[0]["pattern"] == "Conv+BatchNormalization+Relu"
    assert text.splitlines()[-1].startswith("2 groups: 6 nodes run as 2 kernels, 4 launches")
    assert "kernels" in text.splitlines()[0]
    assert "<table>" in plan._repr_html_() and "Conv+BatchNormalization+Relu" in plan._repr_html_()


def test_a_node_belongs_to_one_group():
    plan = sample_plan()
    with pytest.raises(ValueError, match="already belong"):
        plan.add(FusionGroup("g2", "vertical", "x", ["relu", "other"]))
    with pytest.raises(ValueError, match="duplicate group id"):
        plan.add(FusionGroup("g0", "vertical", "x", ["other"]))


def test_group_validation():
    with pytest.raises(ValueError, match="unknown fusion kind"):
        FusionGroup("g", "diagonal", "r", ["a"])
    with pytest.raises(ValueError, match="no nodes"):
        FusionGroup("g", "vertical", "r", [])
    with pytest.raises(ValueError, match="differ in length"):
        FusionGroup("g", "vertical", "r", ["a", "b"], ["Conv"])


def test_a_plan_without_the_groups_it_builds_on_counts_only_its_own_saving():
    """The horizontal groups of a vertical + horizontal plan, shown on their own (notebook 05): each stacks three
    FusedConvs (each Conv+BN+Relu) into FusedConv + Split. Their footer must count 3 nodes as 2 kernels, 1 launch
    saved per group, what the table's column sums to; counting the covered Conv, BN and Relu behind each FusedConv
    claimed the vertical groups' launches again (28 for 4 groups, where the column says 4; issue 20)."""
    from fusionlab.plan import FusionGroup, FusionPlan

    vertical = [FusionGroup(f"v{i}", "vertical", "conv_bn_act", [f"conv{i}", f"bn{i}", f"relu{i}"],
                            ["Conv", "BatchNormalization", "Relu"], saved_launches=2) for i in range(3)]
    stack = FusionGroup("h0", "horizontal", "concat_conv", ["fc0", "fc1", "fc2"], ["FusedConv"] * 3, kernels=2,
                        saved_launches=1, covers=[n for v in vertical for n in v.nodes])
    other = FusionGroup("v3", "vertical", "conv_bn_act", ["conv3", "bn3", "relu3"],
                        ["Conv", "BatchNormalization", "Relu"], saved_launches=2)
    whole = FusionPlan(vertical + [other, stack])
    c = whole.counts()
    assert (c.nodes, c.kernels, c.groups, c.formed) == (12, 3, 2, 5)  # 12 loaded nodes as FusedConv+Split + 1
    assert c.launches_saved == whole.saved_launches == 9
    horizontal = whole.by_kind("horizontal")
    h = horizontal.counts()
    assert (h.nodes, h.kernels, h.launches_saved) == (3, 2, 1) == (3, 2, horizontal.saved_launches)
    assert "1 groups: 3 nodes run as 2 kernels, 1 launches" in horizontal.footer()


def test_a_group_over_an_earlier_groups_product_is_not_counted_twice():
    """A mixed group that takes in a vertically fused Conv covers the vertical group's nodes: the summary counts
    each loaded-model node and each kernel once (69 nodes, not 73; issue 20)."""
    from fusionlab.plan import FusionGroup, FusionPlan

    v = FusionGroup("v0", "vertical", "conv_bn", ["conv", "bn"], ["Conv", "BatchNormalization"], saved_launches=1)
    m = FusionGroup("m0", "mixed", "fuse_ops", ["conv_fused", "add", "relu"], ["Conv", "Add", "Relu"],
                    saved_launches=2, covers=["conv", "bn", "add", "relu"])
    alone = FusionGroup("v1", "vertical", "conv_bn", ["conv2", "bn2"], ["Conv", "BatchNormalization"], saved_launches=1)
    plan = FusionPlan([v, alone, m])
    c = plan.counts()
    assert (c.nodes, c.kernels, c.groups, c.formed) == (6, 2, 2, 3)  # conv, bn, add, relu in m0 (1 kernel); conv2, bn2 in v1
    assert "2 groups: 6 nodes run as 2 kernels" in plan.footer()
