"""Clean-up pass: Identity / inference-Dropout removal, dead code, unique node names; outputs keep their names."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper as h

from fusionlab import load, verify
from fusionlab.build import make_model, tensor, value_info
from fusionlab.passes import cleanup, fuse

W = np.random.default_rng(3).standard_normal((4, 4)).astype(np.float32)


def model(nodes, outputs=("y",), inits=(), opset=17):
    return make_model(nodes, [value_info("x", shape=[2, 4])], [value_info(o, shape=[2, 4]) for o in outputs],
                      [tensor("W", W)] + list(inits), opset=opset)


def cleaned(m):
    g = load(m)
    report = cleanup.clean(g)
    assert verify(m, g.to_proto()).ok
    load(g.to_proto())  # still a valid model
    return g, report


def test_identity_chain_on_weights_removed():
    m = model([h.make_node("Identity", ["W"], ["w1"], name="i1"), h.make_node("Identity", ["w1"], ["w2"], name="i2"),
               h.make_node("MatMul", ["x", "w2"], ["y"], name="mm")])
    g, report = cleaned(m)
    assert g.op_counts() == {"MatMul": 1} and report["Identity"] == 2
    assert g.node("mm").inputs[1].name == "W"


def test_identity_producing_graph_output_keeps_output_name():
    m = model([h.make_node("Relu", ["x"], ["r"], name="relu"), h.make_node("Identity", ["r"], ["y"], name="id")])
    g, _ = cleaned(m)
    assert g.op_counts() == {"Relu": 1}
    assert [o.name for o in g.outputs()] == ["y"]


def test_identity_from_graph_input_to_output_stays():
    m = model([h.make_node("Identity", ["x"], ["y"], name="id")])
    g, _ = cleaned(m)
    assert g.op_counts() == {"Identity": 1}


def test_identity_whose_source_is_also_an_output_stays():
    m = model([h.make_node("Relu", ["x"], ["r"], name="relu"), h.make_node("Identity", ["r"], ["y"], name="id")],
              outputs=("y", "r"))
    g, _ = cleaned(m)
    assert [o.name for o in g.outputs()] == ["y", "r"]
    assert g.op_counts() == {"Identity": 1, "Relu": 1}


@pytest.mark.parametrize("opset", [10, 13])
def test_inference_dropout_removed(opset):
    m = model([h.make_node("Dropout", ["x"], ["d"], name="drop"), h.make_node("Relu", ["d"], ["y"], name="relu")],
              opset=opset)
    g, report = cleaned(m)
    assert g.op_counts() == {"Relu": 1} and report["Dropout"] == 1


def test_dropout_with_used_mask_or_training_mode_stays():
    used_mask = make_model(
        [h.make_node("Dropout", ["x"], ["d", "mask"], name="drop"), h.make_node("Relu", ["d"], ["y"], name="relu")],
        [value_info("x", shape=[2, 4])], [value_info("y", shape=[2, 4]), value_info("mask", np.bool_, [2, 4])])
    g = load(used_mask)
    cleanup.clean(g)
    assert g.op_counts()["Dropout"] == 1
    training = model([h.make_node("Dropout", ["x", "ratio", "train"], ["y"], name="drop")],
                     inits=[tensor("ratio", np.float32(0.5)), tensor("train", np.bool_(True))])
    g = load(training)
    cleanup.clean(g)
    assert g.op_counts() == {"Dropout": 1}


def test_dead_nodes_and_initializers_removed():
    m = model([h.make_node("Relu", ["x"], ["y"], name="relu"), h.make_node("MatMul", ["x", "W"], ["dead"], name="mm")],
              inits=[tensor("unused", np.ones(3, np.float32))])
    g, report = cleaned(m)
    assert g.op_counts() == {"Relu": 1}
    assert report["dead nodes"] == 1 and report["dead initializers"] == 2
    assert len(g.graph.initializers) == 0


def test_unique_names_assigned_deterministically():
    m = model([h.make_node("Relu", ["x"], ["a"]), h.make_node("Relu", ["a"], ["b"], name="r"),
               h.make_node("Relu", ["b"], ["y"], name="r")])
    g1, g2 = load(m), load(m)
    cleanup.ensure_node_names(g1)
    cleanup.ensure_node_names(g2)
    names = [n.name for n in g1]
    assert len(set(names)) == 3 and all(names) and names == [n.name for n in g2]


def test_needed_and_as_a_pass():
    clean_model = model([h.make_node("MatMul", ["x", "W"], ["y"], name="mm")])
    assert not cleanup.needed(load(clean_model))
    dirty = model([h.make_node("Identity", ["x"], ["i"], name="id"), h.make_node("MatMul", ["i", "W"], ["y"], name="mm")])
    assert cleanup.needed(load(dirty))
    res = fuse(dirty, passes=("cleanup",))
    assert res.after == {"MatMul": 1} and len(res.plan) == 0 and any("Identity" in n for n in res.plan.notes)


def test_constant_nodes_become_initializers_and_results_stay_equal():
    import numpy as np
    from onnx import helper as oh

    from fusionlab import load, verify
    from fusionlab.build import make_model, value_info
    from fusionlab.passes.cleanup import clean

    nodes = [
        oh.make_node("Constant", [], ["k"], value_floats=[2.0, 3.0], name="k"),
        oh.make_node("Constant", [], ["shape"], value_ints=[4, 2], name="shape"),
        oh.make_node("Mul", ["x", "k"], ["m"], name="mul"),
        oh.make_node("Reshape", ["m", "shape"], ["r"], name="reshape"),
        oh.make_node("Constant", [], ["y2"], value_float=1.0, name="out_const"),  # a graph output: stays
        oh.make_node("Identity", ["r"], ["y"], name="id"),
    ]
    model = make_model(nodes, [value_info("x", shape=[4, 2])], [value_info("y", shape=[4, 2]), value_info("y2", shape=[])])
    g = load(model)
    report = clean(g)
    assert report["Constant"] == 2
    assert g.op_counts().get("Constant") == 1
    assert {"k", "shape"} <= set(g.graph.initializers)
    assert verify(model, g).ok
    np.testing.assert_array_equal(g.constant(g.graph.initializers["k"]), np.float32([2.0, 3.0]))
