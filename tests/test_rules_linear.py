"""MatMul / Gemm chains (rules/linear.py): MatMul + Add -> Gemm, BN folded, activation -> FusedGemm."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper as h

from fusionlab.build import tensor, value_info

from chainkit import bn_node, bn_params, check, r, unchanged
from rulekit import mk


def mm_model(tail, inits, *, a_shape=("batch", 6), k=6, n=5, out="y", extra_outputs=(), opset=17):
    nodes = [h.make_node("MatMul", ["a", "B"], ["mm"], name="mm")] + list(tail)
    outputs = [value_info(out, np.float32, None)] + [value_info(o, np.float32, None) for o in extra_outputs]
    return mk(nodes, [value_info("a", shape=list(a_shape))], outputs, [tensor("B", r(k, n))] + list(inits),
                      opset=opset)


@pytest.mark.parametrize("bias_shape", [(5,), (1, 5), (1, 1), ()])
def test_matmul_add_to_gemm(bias_shape):
    m = mm_model([h.make_node("Add", ["mm", "C"], ["y"], name="add")], [tensor("C", r(*bias_shape))])
    res = check(m, {"Gemm": 1})
    assert res.plan.rule_counts() == {"matmul_add_gemm": 1}


def test_matmul_add_bias_not_broadcastable_to_gemm_left_alone():
    m = mm_model([h.make_node("Add", ["mm", "C"], ["y"], name="add")], [tensor("C", r(2, 1, 5))])
    unchanged(m)


def test_rank3_matmul_add_not_gemm():
    m = mm_model([h.make_node("Add", ["mm", "C"], ["y"], name="add")], [tensor("C", r(5))], a_shape=("batch", 4, 6))
    res = unchanged(m)
    assert any("rank 2" in n for n in res.plan.notes)


def test_rank1_input_matmul_add_not_gemm():
    m = mm_model([h.make_node("Add", ["mm", "C"], ["y"], name="add")], [tensor("C", r(5))], a_shape=(6,))
    unchanged(m)


def test_matmul_add_relu_to_fusedgemm():
    m = mm_model([h.make_node("Add", ["mm", "C"], ["s"], name="add"), h.make_node("Relu", ["s"], ["y"], name="relu")],
                 [tensor("C", r(5))])
    res = check(m, {"com.microsoft:FusedGemm": 1})
    assert res.plan.rule_counts() == {"gemm_act": 1}


@pytest.mark.parametrize("act,attrs", [("LeakyRelu", {"alpha": 0.2}), ("Sigmoid", {}), ("Tanh", {}),
                                       ("HardSigmoid", {"alpha": 0.3, "beta": 0.6}), ("Elu", {"alpha": 0.5}),
                                       ("Softplus", {}), ("Softsign", {}), ("Selu", {})])
def test_gemm_activation_to_fusedgemm(act, attrs):
    m = mk([h.make_node("Gemm", ["a", "B", "C"], ["g"], name="gemm", transB=1),
                    h.make_node(act, ["g"], ["y"], name="act", **attrs)],
                   [value_info("a", shape=["batch", 6])], [value_info("y", shape=None)],
                   [tensor("B", r(5, 6)), tensor("C", r(5))])
    check(m, {"com.microsoft:FusedGemm": 1})


def test_gemm_output_graph_output_not_fused_with_activation():
    m = mk([h.make_node("Gemm", ["a", "B"], ["g"], name="gemm"), h.make_node("Relu", ["g"], ["y"], name="relu")],
                   [value_info("a", shape=[2, 6])], [value_info("y", shape=None), value_info("g", shape=None)],
                   [tensor("B", r(6, 5))])
    unchanged(m)


def test_matmul_bn_to_gemm():
    m = mm_model([bn_node("mm", "y")], bn_params(5))
    res = check(m, {"Gemm": 1})
    assert res.plan.rule_counts() == {"matmul_bn": 1}


def test_rank3_matmul_bn_not_folded():
    m = mk([h.make_node("MatMul", ["a", "B"], ["mm"], name="mm"), bn_node("mm", "y")],
                   [value_info("a", shape=[2, 5, 6])], [value_info("y", shape=None)], [tensor("B", r(6, 4))] + bn_params(5))
    unchanged(m)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_bn_folds_with_alpha_beta(trans_b):
    b = r(5, 6) if trans_b else r(6, 5)
    m = mk([h.make_node("Gemm", ["a", "B", "C"], ["g"], name="gemm", transB=trans_b, alpha=0.7, beta=1.3),
                    bn_node("g", "y")],
                   [value_info("a", shape=[3, 6])], [value_info("y", shape=None)],
                   [tensor("B", b), tensor("C", r(5))] + bn_params(5))
    res = check(m, {"Gemm": 1})
    assert res.plan.rule_counts() == {"gemm_bn": 1}
