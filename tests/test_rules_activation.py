"""hard_sigmoid / hard_swish: the decomposed forms -> HardSigmoid / HardSwish, and Conv + hard sigmoid -> FusedConv.

Forms: YOLOv5's export-friendly Hardswish and Keras' hard_swish, x * hardtanh(x + 3, 0, 6) / 6 (Add, Clip, Mul,
Div); TensorFlow's x * relu6(x + 3) * (1/6) and hard_sigmoid relu6(x + 3) / 6 (tf2onnx writes relu6 as Clip);
Keras' clip(0.2 x + 0.5, 0, 1); a squeeze-excitation gate Conv -> relu6(x + 3) / 6 -> Mul.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper as h

from fusionlab.build import tensor, value_info
from fusionlab.passes import fuse

from chainkit import check as chain_check
from rulekit import check, mk, r, refused

SHAPE = [2, 8, 5, 5]
CONSTS = {"three": 3.0, "six": 6.0, "zero": 0.0, "sixth": 1 / 6, "p2": 0.2, "half": 0.5, "one": 1.0}


def model(nodes, opset=20, x="x", consts=None, out_shape=SHAPE):
    c = {**CONSTS, **(consts or {})}
    return mk(nodes, [value_info(x, shape=SHAPE)], [value_info("y", shape=out_shape)],
              [tensor(k, np.float32(v)) for k, v in c.items()], opset=opset)


def swish_yolov5(x="x", y="y"):
    return [h.make_node("Add", [x, "three"], ["t"], name="add3"), h.make_node("Clip", ["t", "zero", "six"], ["c"], name="clip"),
            h.make_node("Mul", [x, "c"], ["m"], name="times_x"), h.make_node("Div", ["m", "six"], [y], name="div6")]


def swish_tf(x="x", y="y"):
    return [h.make_node("Add", [x, "three"], ["t"], name="add3"), h.make_node("Clip", ["t", "zero", "six"], ["c"], name="clip"),
            h.make_node("Mul", ["c", "sixth"], ["s"], name="mul_sixth"), h.make_node("Mul", [x, "s"], [y], name="times_x")]


def sigmoid_tf(x="x", y="y"):
    return [h.make_node("Add", [x, "three"], ["t"], name="add3"), h.make_node("Clip", ["t", "zero", "six"], ["c"], name="clip"),
            h.make_node("Div", ["c", "six"], [y], name="div6")]


def sigmoid_keras(x="x", y="y"):
    return [h.make_node("Mul", [x, "p2"], ["t0"], name="mul"), h.make_node("Add", ["t0", "half"], ["t"], name="add"),
            h.make_node("Clip", ["t", "zero", "one"], [y], name="clip")]


@pytest.mark.parametrize("form", [swish_yolov5, swish_tf])
def test_hard_swish_forms(form):
    res = check(model(form()), ("hard_swish",), {"HardSwish": 1})
    assert res.plan.rule_counts() == {"hard_swish": 1}


@pytest.mark.parametrize("form, alpha, beta", [(sigmoid_tf, 1 / 6, 0.5), (sigmoid_keras, 0.2, 0.5)])
def test_hard_sigmoid_forms(form, alpha, beta):
    res = check(model(form()), ("hard_sigmoid",), {"HardSigmoid": 1})
    node = next(iter(res.graph))
    assert node.attributes["alpha"].value == pytest.approx(alpha, rel=1e-6)
    assert node.attributes["beta"].value == pytest.approx(beta, rel=1e-6)


def test_a_swish_of_another_hard_sigmoid_is_hardsigmoid_times_x():
    """x * clip(0.2x + 0.5, 0, 1) is no HardSwish (alpha 0.2): HardSigmoid + Mul, two ops instead of four."""
    nodes = sigmoid_keras(y="hs") + [h.make_node("Mul", ["x", "hs"], ["y"], name="times_x")]
    check(model(nodes), ("hard_swish",), {"HardSigmoid": 1, "Mul": 1})


def test_hard_swish_below_opset_14_has_no_op():
    reasons = refused(model(swish_yolov5(), opset=13), ("hard_swish",), "clip")
    assert any("opset 14" in x for x in reasons), reasons


def test_conv_then_a_written_out_hard_sigmoid_is_one_fusedconv():
    """The squeeze-excitation gate of a TF-exported MobileNetV3: Conv -> relu6(x + 3) / 6 -> Mul(features)."""
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["cv"], kernel_shape=[1, 1], name="se_conv")] + sigmoid_tf("cv", "gate") + \
        [h.make_node("Mul", ["x", "gate"], ["y"], name="excite")]
    m = mk(nodes, [value_info("x", shape=SHAPE)], [value_info("y", shape=SHAPE)],
           [tensor(k, np.float32(v)) for k, v in CONSTS.items()] + [tensor("w", r(8, 8, 1, 1, scale=0.3)), tensor("b", r(8))],
           opset=20)
    res = check(m, ("conv_act", "hard_sigmoid"), {"com.microsoft:FusedConv": 1, "Mul": 1})
    fc = next(n for n in res.graph if n.op_type == "FusedConv")
    assert fc.attributes["activation"].value == "HardSigmoid"
    assert list(fc.attributes["activation_params"].value) == pytest.approx([1 / 6, 0.5], rel=1e-6)
    # without the hard_sigmoid rule the chain is left as it was
    assert fuse(m, ("vertical",), rules=("conv_act",)).after == res.before


def _not_hard(case):
    consts = {}
    nodes = swish_yolov5()
    if case == "lower bound not zero":
        consts = {"zero": -1.0}
    elif case == "scale does not normalise":
        consts = {"six": 5.5}
        nodes = [h.make_node("Add", ["x", "three"], ["t"], name="add3"),
                 h.make_node("Clip", ["t", "zero", "six6"], ["c"], name="clip"),
                 h.make_node("Mul", ["x", "c"], ["m"], name="times_x"), h.make_node("Div", ["m", "six"], ["y"], name="div6")]
        consts["six6"] = 6.0
    elif case == "intermediate read elsewhere":
        nodes = sigmoid_tf(y="y") + [h.make_node("Neg", ["c"], ["y2"], name="other_reader")]
        return mk(nodes, [value_info("x", shape=SHAPE)], [value_info("y", shape=SHAPE), value_info("y2", shape=SHAPE)],
                  [tensor(k, np.float32(v)) for k, v in CONSTS.items()], opset=20)
    elif case == "per-channel offset":
        m = model(nodes)
        m.graph.initializer[0].CopyFrom(tensor("three", np.full([8, 1, 1], 3.0, np.float32)))
        return m
    return model(nodes, consts=consts)


@pytest.mark.parametrize("case, reason", [("lower bound not zero", "no hard sigmoid"),
                                          ("scale does not normalise", "no hard sigmoid"),
                                          ("intermediate read elsewhere", "read outside the pattern")])
def test_hard_activations_refuse(case, reason):
    reasons = refused(_not_hard(case), ("hard_sigmoid", "hard_swish"), "clip")
    assert any(reason in x for x in reasons), reasons


def test_relu6_alone_and_a_per_channel_offset_are_left_alone_quietly():
    m = model([h.make_node("Clip", ["x", "zero", "six"], ["y"], name="clip")])
    assert refused(m, ("hard_sigmoid", "hard_swish"), "clip") == []
    assert refused(_not_hard("per-channel offset"), ("hard_sigmoid", "hard_swish"), "clip") == []


# ---------------------------------------------------------------------------------------------------
# (from tests/test_vertical.py)
# ---------------------------------------------------------------------------------------------------

def test_standalone_silu_to_quickgelu():
    m = mk([h.make_node("Add", ["x", "x"], ["a"], name="add"), h.make_node("Sigmoid", ["a"], ["s"], name="sig"),
                    h.make_node("Mul", ["s", "a"], ["y"], name="mul")],
                   [value_info("x", shape=[2, 16])], [value_info("y", shape=None)])
    chain_check(m, {"Add": 1, "com.microsoft:QuickGelu": 1})
