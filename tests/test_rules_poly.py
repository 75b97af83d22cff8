"""The tanh-GELU prover (rules/poly.py) on its own: the polynomial algebra, and proofs that hold or fail exactly
where the function is (or is not) tanh-GELU."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper as h

from fusionlab import load
from fusionlab.build import tensor, value_info
from fusionlab.passes import engine
from fusionlab.passes.rules.poly import _padd, _pmul, _poly_is, prove_tanh_gelu
from fusionlab.zoo import tanh_gelu

from rulekit import mk


def _graph(nodes, inits, dtype=np.float32):
    m = mk(nodes, [value_info("x", dtype, [2, 8])], [value_info("y", dtype, [2, 8])], inits, opset=17)
    return load(m)


def _prove(graph):
    cx = engine.Context(graph)
    tanh = next(n for n in graph.graph if n.op_type == "Tanh")
    return prove_tanh_gelu(cx, tanh)


def test_polynomials_multiply_and_add_term_by_term():
    one_plus_x, one_minus_x = {(0, 0): 1.0, (1, 0): 1.0}, {(0, 0): 1.0, (1, 0): -1.0}
    assert _pmul(one_plus_x, one_minus_x) == {(0, 0): 1.0, (1, 0): 0.0, (2, 0): -1.0}
    assert _padd(one_plus_x, one_minus_x, -1.0) == {(1, 0): 2.0}  # the constants cancel and the term goes
    assert _pmul({(1, 0): 0.5}, {(0, 0): 1.0, (0, 1): 1.0}) == {(1, 0): 0.5, (1, 1): 0.5}  # 0.5 x (1 + t)


def test_a_polynomial_is_its_terms_within_a_relative_tolerance():
    want = {(1, 0): 0.5, (1, 1): 0.5}
    assert _poly_is({(1, 0): 0.5 * (1 + 1e-7), (1, 1): 0.5, (2, 0): 1e-15}, want)  # a vanishing term is no term
    assert not _poly_is({(1, 0): 0.5 * (1 + 1e-4), (1, 1): 0.5}, want)  # 0.01% off is another function
    assert not _poly_is({(1, 0): 0.5}, want)  # a missing term
    assert not _poly_is({(1, 0): 0.5, (1, 1): 0.5, (3, 0): 0.1}, want)  # an extra one


@pytest.mark.parametrize("form", ["ort", "pow", "div", "sub"])
def test_every_arrangement_is_proved_with_all_its_nodes(form):
    nodes, inits = tanh_gelu(form)
    g = _graph(nodes, inits)
    found = _prove(g)
    assert found is not None
    members, x = found
    assert x.name == "x"
    assert sorted(n.name for n in members) == sorted(n.name for n in g.graph)


@pytest.mark.parametrize("k", [0.0447, 0.045, 0.0])
def test_another_cubic_coefficient_is_no_proof(k):
    nodes, inits = tanh_gelu("pow", k=k)
    assert _prove(_graph(nodes, inits)) is None


def test_the_outer_half_must_be_there():
    a = math.sqrt(2 / math.pi)
    n = h.make_node
    nodes = [n("Pow", ["x", "three"], ["p"], name="pow"), n("Mul", ["p", "k3"], ["m1"], name="m1"),
             n("Add", ["x", "m1"], ["a1"], name="a1"), n("Mul", ["a1", "a"], ["m2"], name="m2"),
             n("Tanh", ["m2"], ["t"], name="tanh"), n("Add", ["one", "t"], ["a2"], name="a2"),
             n("Mul", ["x", "a2"], ["y"], name="m3")]  # x * (1 + t): twice GELU
    inits = [tensor(k, np.float32(v)) for k, v in (("three", 3.0), ("k3", 0.044715), ("a", a), ("one", 1.0))]
    assert _prove(_graph(nodes, inits)) is None


def test_a_cube_through_pow_4_is_not_expanded():
    nodes, inits = tanh_gelu("pow")
    for i, t in enumerate(inits):
        if t.name == "three":
            inits[i] = tensor("three", np.float32(4.0))
    assert _prove(_graph(nodes, inits)) is None
