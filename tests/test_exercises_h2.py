"""Specific tests of the exercises of notebooks 02 (transposed), 03 (plans) and 04 (gelu, skipln): the truth is the
lesson's own function, the hints name the mistakes, and a slightly-off answer fails."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
from onnx import helper

from fusionlab.analysis import derive
from fusionlab.cost import node_costs
from fusionlab.exercises import core, gelu, plans, skipln, transposed
from fusionlab.passes import fuse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # solutions/ sits at the repository root
from solutions import gelu as s_gelu  # noqa: E402
from solutions import plans as s_plans  # noqa: E402
from solutions import skipln as s_skipln  # noqa: E402
from solutions import transposed as s_transposed  # noqa: E402


# --- 02: transposed -------------------------------------------------------------------------------------------

def test_transposed_lessons_fold_passes():
    def lesson(W, b, gamma, beta, mean, var, eps, group):
        f = derive.fold_conv_bn(W, b, gamma, beta, mean, var, eps, group=group, transpose=True)
        return f.weight, f.bias
    assert transposed.check(lesson).ok


def test_transposed_axis0_on_square_weights_is_named():
    case = transposed.CASES[2]
    assert case.data.c_in == case.data.c_out and case.data.group == 1
    hint = transposed._judge(s_transposed.fold_bn_axis0, case)
    assert hint and "weight axis 0" in hint


def test_transposed_slightly_off_fails():
    def off(*args):
        w2, b2 = s_transposed.fold_bn(*args)
        return w2 * np.float32(1.001), b2
    v = transposed.check(off)
    assert v.status == core.FAIL and v.passed == 0 and "your weights differ" in v.hint


def test_transposed_the_conv_fold_fails_on_the_first_case():
    def conv_fold(W, b, gamma, beta, mean, var, eps, group):
        f = derive.fold_conv_bn(W, b, gamma, beta, mean, var, eps, group=group)
        return f.weight, f.bias
    v = transposed.check(conv_fold)  # axis 0 of a ConvTranspose weight has C_in entries, not C_out
    assert v.status == core.FAIL and v.passed == 0 and "your answer raised ValueError" in v.hint


# --- 03: plans ------------------------------------------------------------------------------------------------

def test_plans_truth_is_the_vertical_pass():
    for letter in plans.GRAPHS:
        count, result = plans.kernels_after(letter)
        fused = fuse(plans.model(letter), passes=("vertical",))
        assert count == sum(n.op_type != "Constant" for n in fused.graph.nodes())
        assert count == s_plans.KERNELS[letter]
        assert count <= len(plans.model(letter).graph.node)


def test_plans_every_graph_off_by_one_fails_on_it():
    for i, letter in enumerate(plans.GRAPHS):
        v = plans.check(dict(s_plans.KERNELS, **{letter: s_plans.KERNELS[letter] + 1}))
        assert v.status == core.FAIL and v.passed == i and "fewer" in v.hint


def test_plans_hint_names_the_second_reader():
    v = plans.check(dict(s_plans.KERNELS, D=1))
    assert v.failed_case.startswith("graph D") and "also read by Sigmoid" in v.hint


def test_plans_partial_answer_is_not_answered_and_listing_shows_every_graph():
    assert plans.check({"A": 1}).status == core.UNANSWERED
    assert [line[0] for line in plans.listing().splitlines()] == list(plans.GRAPHS)


# --- 04: gelu -------------------------------------------------------------------------------------------------

def _c(name, value):
    return helper.make_node("Constant", [], [name], value_float=value)


def test_gelu_other_arrangements_fuse_too():
    def half_first(x, y):  # (x * 0.5) * (1 + erf(x * (1 / sqrt 2)))
        return [_c(f"{y}_r", 1 / math.sqrt(2)), _c(f"{y}_one", 1.0), _c(f"{y}_half", 0.5),
                helper.make_node("Mul", [x, f"{y}_half"], [f"{y}_h"]),
                helper.make_node("Mul", [x, f"{y}_r"], [f"{y}_s"]),
                helper.make_node("Erf", [f"{y}_s"], [f"{y}_e"]),
                helper.make_node("Add", [f"{y}_e", f"{y}_one"], [f"{y}_a"]),
                helper.make_node("Mul", [f"{y}_h", f"{y}_a"], [y])]
    assert gelu.check(half_first).ok


def test_gelu_rounded_constant_computes_gelu_but_does_not_fuse():
    c = gelu.CASES[0].data
    model = gelu.case_model(c, s_gelu.gelu_nodes_rounded("x", "y"))
    from fusionlab.verification.runtime import run
    got = run(model, {"x": c.x()})["y"]
    assert core.first_difference(got, gelu.gelu64(c.x()), gelu.RTOL, gelu.ATOL * 3) is None
    hint = gelu._judge(s_gelu.gelu_nodes_rounded, gelu.CASES[0])
    assert "onnxruntime computes GELU, but the vertical pass leaves" in hint


def test_gelu_a_name_clash_is_reported():
    def clash(x, y):
        nodes = s_gelu.gelu_nodes(x, y)
        nodes[3] = helper.make_node("Div", [x, f"{y}_sqrt2"], ["t"])
        nodes[4] = helper.make_node("Erf", ["t"], [f"{y}_erf"])
        return nodes
    v = gelu.check(clash)
    assert v.status == core.FAIL and "'t'" in v.hint


def test_gelu_not_a_list_fails():
    assert "list of ONNX nodes" in gelu.check(lambda x, y: "Gelu").hint


# --- 04: skipln -----------------------------------------------------------------------------------------------

def test_skipln_truth_is_the_cost_model():
    c = skipln.CASES[3].data
    unfused = skipln.model(c)
    from fusionlab.passes import vertical
    fused = fuse(unfused, passes=("vertical",), rules=vertical.RULE_NAMES)
    want = sum(n.bytes for n in node_costs(unfused)) - sum(n.bytes for n in node_costs(fused.graph))
    assert skipln.cost_model_saving(c) == want > 0
    assert "SkipLayerNormalization" in [n.op_type for n in fused.graph.nodes()]


def test_skipln_one_byte_off_fails():
    v = skipln.check(lambda *a: s_skipln.saved_bytes(*a) + 1)
    assert v.status == core.FAIL and v.passed == 0 and "fewer" in v.hint


def test_skipln_pre_ln_saves_less_than_post_ln():
    pre, post = skipln.CASES[3].data, skipln.CASES[0].data
    assert pre.args[:4] == post.args[:4]
    assert 0 < skipln.cost_model_saving(pre) < skipln.cost_model_saving(post)
