"""fuse() never changes the caller's model, whatever the passes do."""

import pytest

from fusionlab import load, zoo
from fusionlab.passes import fuse

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
