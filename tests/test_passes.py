"""fuse() never changes the caller's model, and apply() never the caller's plan, whatever the passes do."""

import pytest

from fusionlab import load, zoo
from fusionlab.passes import apply, fuse, get_pass, plan
from fusionlab.passes.prepare import graph_of as prepared_graph_of

MODELS = {
    "resnet_small": lambda: zoo.resnet_small(),
    "yolov5n": lambda: zoo.yolov5s(image_size=64, width_mult=0.25, depth_mult=0.33),
    "bert_tiny": lambda: zoo.bert(layers=1, hidden=32, heads=2, intermediate=64, vocab=50),
    "inception": lambda: zoo.inception(image_size=75, width=0.25),
    "mobilenet_v2": lambda: zoo.mobilenet_v2(image_size=32, width_mult=0.25),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fuse_leaves_the_input_model_byte_identical(name):
    proto = MODELS[name]()
    graph = load(proto)
    before = graph.to_proto().SerializeToString()
    result = fuse(graph, passes=("vertical", "horizontal", "mixed"))
    assert len(result.plan) > 0
    assert graph.to_proto().SerializeToString() == before
    # and the fused graph owns its nodes: changing it does not reach the original
    result.graph.graph.remove(list(result.graph.graph)[-1], safe=False)
    assert graph.to_proto().SerializeToString() == before


@pytest.mark.parametrize("kind, name", [("vertical", "resnet_small"), ("horizontal", "inception"),
                                        ("mixed", "mobilenet_v2"), ("mixed", "bert_tiny")])
def test_apply_never_changes_the_callers_plan(kind, name):
    """`apply` (the public one, and the pass's own) rewrites the model as the plan says; the plan stays as it was."""
    graph = load(MODELS[name]())
    fplan = plan(graph, passes=(kind,))
    assert any(g.kind == kind for g in fplan)
    before = fplan.to_json()
    result = apply(graph, fplan)
    assert fplan.to_json() == before
    assert result.plan is not fplan and [g.id for g in result.plan] == [g.id for g in fplan]
    work = prepared_graph_of(graph, fplan).copy()
    get_pass(kind).apply(work, fplan)
    assert fplan.to_json() == before
