"""fusionlab.export.cann: a FusionPlan as ATC's fusion_result.json and fusion switch file."""

import json

from fusionlab import zoo
from fusionlab import passes
from fusionlab.export import cann
from fusionlab.graph import load
from fusionlab.plan import FusionGroup, FusionPlan


def plan_of(*rules_kinds):
    return FusionPlan([FusionGroup(f"g{i}", kind, rule, [f"n{i}a", f"n{i}b"]) for i, (rule, kind) in enumerate(rules_kinds)])


def test_the_format_is_atcs():
    text = cann.fusion_result_json(plan_of(("conv_bn", "vertical"), ("conv_bn_act", "vertical"), ("fuse_ops", "mixed")))
    data = json.loads(text)
    assert sorted(data) == ["graph_fusion", "session_and_graph_id", "ub_fusion"]
    assert data["session_and_graph_id"] == "0_0"
    assert data["graph_fusion"]["ConvBatchnormFusionPass"] == {"effect_times": "2", "match_times": "2"}
    assert data["ub_fusion"]["TbeCommonRules0FusionPass"] == {"effect_times": "1", "match_times": "1"}
    assert data["ub_fusion"]["FusionlabFuseOpsFusionPass"] == {"effect_times": "1", "match_times": "1"}
    for stage in ("graph_fusion", "ub_fusion"):
        for counts in data[stage].values():
            assert all(isinstance(v, str) for v in counts.values())  # ATC writes the counts as strings


def test_reads_atcs_published_example():
    # Ascend/samples cplusplus/contrib/super_resolution/model/fusion_result.json (cann_facts.md s6)
    atc = ('{"graph_fusion": {"ConvToFullyConnectionFusionPass": {"effect_times": "0", "match_times": "3"},'
           ' "TransdataCastFusionPass": {"effect_times": "0", "match_times": "5"}},'
           ' "session_and_graph_id": "0_0",'
           ' "ub_fusion": {"TbeCommonRules0FusionPass": {"effect_times": "2", "match_times": "2"}}}')
    parsed = cann.read_fusion_result(atc)
    assert parsed["graph_fusion"]["TransdataCastFusionPass"] == (5, 0)
    assert parsed["ub_fusion"] == {"TbeCommonRules0FusionPass": (2, 2)}


def test_a_real_plan_round_trips_and_counts_every_group():
    g = load(zoo.get("resnet_small"))
    plan = passes.plan(g, passes=("vertical", "horizontal", "mixed"))
    parsed = cann.read_fusion_result(cann.fusion_result_json(plan))
    counted = sum(effect for stage in parsed.values() for _, effect in stage.values())
    assert counted == sum(len(cann.pass_for(grp)) for grp in plan) and counted >= len(plan) > 0
    for stage in parsed.values():
        for match, effect in stage.values():
            assert match == effect
    bn_groups = sum("BatchNormalization" in grp.op_types for grp in plan)
    assert parsed["graph_fusion"]["ConvBatchnormFusionPass"] == (bn_groups, bn_groups)


def test_rules_without_an_atc_pass_get_a_fusionlab_name():
    passes = cann.pass_for(FusionGroup("h", "horizontal", "concat_matmul", ["a", "b"]))
    assert passes == [("graph_fusion", "FusionlabConcatMatmulFusionPass")]


def test_fusion_switch_file():
    data = json.loads(cann.fusion_switch(["ConvBatchnormFusionPass", "TbeCommonRules0FusionPass"]))
    assert data["Switch"]["GraphFusion"] == {"ConvBatchnormFusionPass": "off"}
    assert data["Switch"]["UBFusion"] == {"TbeCommonRules0FusionPass": "off"}
    assert json.loads(cann.fusion_switch(all_off=True)) == {"Switch": {"GraphFusion": {"ALL": "off"}, "UBFusion": {"ALL": "off"}}}
