"""GELU (rules/gelu.py): decomposed erf-GELU -> Gelu, bias + GELU -> BiasGelu, tanh-GELU in any arrangement ->
FastGelu (the polynomials multiplied out, rules/poly.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper as h

from fusionlab.build import tensor, value_info
from fusionlab.zoo import tanh_gelu

from chainkit import check, r, unchanged
from rulekit import mk


def gelu_nodes(x, y, form=0):
    s2 = [tensor("sqrt2", np.float32(np.sqrt(2.0))), tensor("one", np.float32(1.0)), tensor("half", np.float32(0.5))]
    if form == 0:  # torch: x * (1 + erf(x / sqrt2)) * 0.5
        nodes = [h.make_node("Div", [x, "sqrt2"], ["g1"], name="div"), h.make_node("Erf", ["g1"], ["g2"], name="erf"),
                 h.make_node("Add", ["g2", "one"], ["g3"], name="add1"), h.make_node("Mul", [x, "g3"], ["g4"], name="mul1"),
                 h.make_node("Mul", ["g4", "half"], [y], name="mul2")]
    elif form == 1:  # (x * 0.5) * (1 + erf(x / sqrt2))
        nodes = [h.make_node("Mul", [x, "half"], ["h"], name="mulh"), h.make_node("Div", [x, "sqrt2"], ["g1"], name="div"),
                 h.make_node("Erf", ["g1"], ["g2"], name="erf"), h.make_node("Add", ["one", "g2"], ["g3"], name="add1"),
                 h.make_node("Mul", ["h", "g3"], [y], name="mul1")]
    else:  # ((1 + erf(x * 1/sqrt2)) * 0.5) * x
        s2[0] = tensor("sqrt2", np.float32(1 / np.sqrt(2.0)))
        nodes = [h.make_node("Mul", [x, "sqrt2"], ["g1"], name="div"), h.make_node("Erf", ["g1"], ["g2"], name="erf"),
                 h.make_node("Add", ["g2", "one"], ["g3"], name="add1"), h.make_node("Mul", ["g3", "half"], ["g4"], name="mul1"),
                 h.make_node("Mul", ["g4", x], [y], name="mul2")]
    return nodes, s2


@pytest.mark.parametrize("form", [0, 1, 2])
def test_decomposed_gelu_to_contrib_gelu(form):
    nodes, inits = gelu_nodes("x", "y", form)
    m = mk(nodes, [value_info("x", shape=["batch", 8, 16])], [value_info("y", shape=None)], inits)
    res = check(m, {"com.microsoft:Gelu": 1})
    assert res.plan.rule_counts() == {"gelu": 1}


def test_gelu_opset20_uses_onnx_gelu_and_onnx_lowering_respects_opset():
    nodes, inits = gelu_nodes("x", "y")
    m20 = mk(nodes, [value_info("x", shape=[2, 16])], [value_info("y", shape=None)], inits, opset=20)
    check(m20, {"Gelu": 1}, lower="onnx")
    m17 = mk(nodes, [value_info("x", shape=[2, 16])], [value_info("y", shape=None)], inits)
    unchanged(m17, lower="onnx")


def test_bias_gelu():
    nodes, inits = gelu_nodes("xb", "y")
    m = mk([h.make_node("Add", ["x", "bias"], ["xb"], name="badd")] + nodes,
                   [value_info("x", shape=["batch", 8, 16])], [value_info("y", shape=None)], inits + [tensor("bias", r(16))])
    res = check(m, {"com.microsoft:BiasGelu": 1})
    assert res.plan.rule_counts() == {"bias_gelu": 1}


def test_gelu_with_intermediate_graph_output_not_fused():
    nodes, inits = gelu_nodes("x", "y")
    m = mk(nodes, [value_info("x", shape=[2, 16])], [value_info("y", shape=None), value_info("g3", shape=None)], inits)
    unchanged(m)


@pytest.mark.parametrize("form", ["ort", "pow", "div", "sub"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_tanh_gelu_in_any_arrangement_becomes_fast_gelu(form, with_bias):
    nodes, inits = tanh_gelu(form, "xb" if with_bias else "x")
    if with_bias:
        nodes = [h.make_node("Add", ["x", "bias"], ["xb"], name="bias_add")] + nodes
        inits = inits + [tensor("bias", r(16))]
    m = mk(nodes, [value_info("x", shape=[2, 8, 16])], [value_info("y", shape=[2, 8, 16])], inits, opset=17)
    res = check(m, {"com.microsoft:FastGelu": 1})
    node = next(iter(res.graph))
    assert len(node.inputs) == (2 if with_bias else 1)
    assert res.plan.rule_counts() == {"fast_gelu": 1}


def test_tanh_gelu_of_a_computed_value_keeps_the_computation():
    """x = 2h: the GELU is of x, not of h (the nearest candidate that proves the polynomial wins)."""
    nodes, inits = tanh_gelu("ort", "x2")
    m = mk([h.make_node("Mul", ["x", "two"], ["x2"], name="scale")] + nodes, [value_info("x", shape=[4, 16])],
           [value_info("y", shape=[4, 16])], inits, opset=17)
    check(m, {"Mul": 1, "com.microsoft:FastGelu": 1})


@pytest.mark.parametrize("case", ["wrong_constant", "graph_output", "two_variables", "fp16"])
def test_tanh_gelu_not_fused(case):
    k = 0.05 if case == "wrong_constant" else 0.044715
    nodes, inits = tanh_gelu("ort", k=k)
    outputs = [value_info("y", shape=[4, 16])]
    inputs = [value_info("x", shape=[4, 16])]
    if case == "graph_output":
        outputs.append(value_info("t", shape=[4, 16]))
    if case == "two_variables":  # the outer x*0.5 reads another tensor z
        nodes[7] = h.make_node("Mul", ["z", "half"], ["m5"], name="g7_Mul")
        inputs.append(value_info("z", shape=[4, 16]))
    if case == "fp16":
        inits = [tensor(t.name, onnx.numpy_helper.to_array(t).astype(np.float16)) for t in inits]
        inputs = [value_info("x", np.float16, [4, 16])]
        outputs = [value_info("y", np.float16, [4, 16])]
    m = mk(nodes, inputs, outputs, inits, opset=17)
    res = unchanged(m)
    assert res.after.get("Tanh") == 1


def test_tanh_gelu_with_standard_ops_only():
    nodes, inits = tanh_gelu("pow")
    for opset, expect in ((20, {"Gelu": 1}), (17, None)):
        m = mk(nodes, [value_info("x", shape=[4, 16])], [value_info("y", shape=[4, 16])], inits, opset=opset)
        if expect is None:
            res = unchanged(m, lower="onnx")
            assert any("opset 20" in n for n in res.plan.notes), res.plan.notes
        else:
            res = check(m, expect, lower="onnx")
            assert next(iter(res.graph)).attributes["approximate"].value == "tanh"
