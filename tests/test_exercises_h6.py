"""The exercises of notebooks 15 (agreement, atcswitch) and 12 (prototype, pykernel): their truth is the lesson's own
function, and answers that are slightly off fail (the generic reference / wrong / stub tests are in
tests/test_exercises.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from fusionlab.compilers import grouping
from fusionlab.exercises import agreement, atcswitch, core, prototype, pykernel
from fusionlab.export import cann, reg_op

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # solutions/ sits at the repository root
from solutions import agreement as s_agreement  # noqa: E402
from solutions import atcswitch as s_atcswitch  # noqa: E402
from solutions import prototype as s_prototype  # noqa: E402
from solutions import pykernel as s_pykernel  # noqa: E402

# -- notebook 15: edges alike ------------------------------------------------------------------------------------


def test_agreement_truth_is_compare_groupings_and_the_reference_counts_the_same():
    for case in agreement.CASES:
        graph, a, b = agreement.build(case.data.graph)
        got = grouping.compare_groupings(graph, a, b)
        assert agreement.expected(case.data) == (sum(e.fused_a == e.fused_b for e in got.edges), len(got.edges))
        assert s_agreement.edges_alike(graph, a, b) == agreement.expected(case.data)


def test_agreement_cases_are_the_corners_they_name():
    square, _, _ = agreement.build("square")
    mul = next(n for n in square if n.op_type == "Mul")
    assert mul.inputs[0] is mul.inputs[1]  # Mul(t, t): one producer read twice
    constant, _, _ = agreement.build("constant")
    assert any(n.op_type == "Constant" for n in constant)
    bert, a, b = agreement.build("bert")
    alike, total = agreement.expected(agreement.CASES[-1].data)
    assert 0 < alike < total  # the 5-op threshold really splits some groups


@pytest.mark.parametrize("flags, words", agreement._MISTAKES)
def test_each_mistake_the_hint_names_shows_on_some_case(flags, words):
    shown = [c for c in agreement.CASES
             if agreement._variant(*agreement.build(c.data.graph), **flags) != agreement.expected(c.data)]
    assert shown, words


def test_agreement_rejects_an_answer_off_by_one_and_a_non_pair():
    def one_more(graph, a, b):
        alike, total = s_agreement.edges_alike(graph, a, b)
        return alike, total + 1

    v = agreement.check(one_more)
    assert v.status == core.FAIL and v.passed == 0 and "compare_groupings finds 2 of 3" in v.hint
    v = agreement.check(lambda graph, a, b: 0.5)
    assert v.status == core.FAIL and "two ints" in v.hint


# -- notebook 15: the ATC switch file ---------------------------------------------------------------------------


def test_atcswitch_truth_is_cann_fusion_switch_of_the_documented_passes():
    for case in atcswitch.CASES:
        plan = atcswitch.plan_for(case.data.model)
        want = atcswitch.expected(case.data)
        assert json.loads(s_atcswitch.switch_file(plan))["Switch"] == want
        named = {n for stage in want.values() for n in stage}
        documented = {n for passes in cann.ATC_PASSES.values() for _, n in passes}
        assert named <= documented
        result = cann.fusion_result(plan)
        assert named == {n for st in (cann.GRAPH, cann.UB) for n in result[st]} & documented


def test_atcswitch_cases_cover_both_stages_and_an_empty_switch():
    wants = [atcswitch.expected(c.data) for c in atcswitch.CASES]
    assert any(w["GraphFusion"] and w["UBFusion"] for w in wants)
    assert any(not w["GraphFusion"] and not w["UBFusion"] for w in wants)
    bert = cann.fusion_result(atcswitch.plan_for("bert_tiny"))
    assert bert[cann.GRAPH] and all(n.startswith("Fusionlab") for st in (cann.GRAPH, cann.UB) for n in bert[st])


def test_atcswitch_refuses_a_pass_left_on_a_value_other_than_off_and_text_that_is_not_json():
    def one_left_on(plan):
        data = json.loads(s_atcswitch.switch_file(plan))
        data["Switch"]["UBFusion"].pop("TbeCommonRules0FusionPass", None)
        return json.dumps(data)

    v = atcswitch.check(one_left_on)
    assert v.status == core.FAIL and v.passed == 0 and "TbeCommonRules0FusionPass (UBFusion) is still on" in v.hint

    def switched_on(plan):
        return s_atcswitch.switch_file(plan).replace('"off"', '"on"')

    assert "can only turn passes off" in atcswitch.check(switched_on).hint
    v = atcswitch.check(lambda plan: "ConvBatchnormFusionPass:off")
    assert v.status == core.FAIL and "JSON" in v.hint


# -- notebook 16: the declaration ---------------------------------------------------------------------------------


def test_prototype_truth_is_onnxruntime_and_the_reference_infers_it():
    decl = s_prototype.declare_matmul_add_relu()
    for case in prototype.CASES:
        c = case.data
        if c.kind != "infer":
            continue
        shape, dtype = prototype.expected(c)
        want = np.matmul(np.zeros(c.x1), np.zeros(c.x2)) + np.zeros(c.bias)
        assert shape == want.shape and dtype == ("DT_FLOAT16" if c.dtype == "float16" else "DT_FLOAT")
        assert decl.infer(dict(zip(prototype.INPUTS, (c.x1, c.x2, c.bias))), {"x1": c.dtype}, {})["y"] == (shape,
                                                                                                            dtype)


def test_prototype_refuses_a_rule_broken_and_a_transpose_defaulting_to_true():
    F = ["DT_FLOAT16", "DT_FLOAT"]

    def gemm_names():  # ONNX Gemm's transA: rule 2 names the built-in's attribute
        return (reg_op("MatMulAddRelu").INPUT("x1", F).INPUT("x2", F).INPUT("bias", F).OUTPUT("y", F)
                .ATTR("transA", "Bool", False).ATTR("transpose_x2", "Bool", False)
                .fuses("MatMul", "Add", "Relu").OP_END_FACTORY_REG("MatMulAddRelu"))

    v = prototype.check(gemm_names)
    assert v.status == core.FAIL and v.passed == 0 and "DeclarationError" in v.hint and "rule 2" in v.hint

    def transposed():
        return (reg_op("MatMulAddRelu").INPUT("x1", F).INPUT("x2", F).INPUT("bias", F).OUTPUT("y", F)
                .ATTR("transpose_x1", "Bool", False).ATTR("transpose_x2", "Bool", True)
                .fuses("MatMul", "Add", "Relu").OP_END_FACTORY_REG("MatMulAddRelu"))

    v = prototype.check(transposed)
    assert v.status == core.FAIL and v.passed == 1 and "transpose_x2 defaults to True" in v.hint


# -- notebook 16: the kernel --------------------------------------------------------------------------------------


def test_pykernel_runs_the_answer_inside_onnxruntime():
    calls = []

    def counted(x1, x2, bias):
        calls.append(x1.shape)
        return s_pykernel.matmul_add_relu(x1, x2, bias)

    assert pykernel.check(counted).ok
    assert calls == [c.data.x1 for c in pykernel.CASES]  # one call per case, through the custom op


def test_pykernel_fails_an_answer_slightly_off_and_one_with_the_wrong_shape():
    def slightly_off(x1, x2, bias):
        return s_pykernel.matmul_add_relu(x1, x2, bias) * np.float32(1.001)

    v = pykernel.check(slightly_off)
    assert v.status == core.FAIL and v.passed == 0 and "onnxruntime's MatMul -> Add -> Relu" in v.hint

    v = pykernel.check(lambda x1, x2, bias: s_pykernel.matmul_add_relu(x1, x2, bias).T)
    assert v.status == core.FAIL and "the unfused ops give" in v.hint


def test_pykernel_names_the_bias_pushed_case_for_an_answer_without_relu():
    v = pykernel.check(lambda x1, x2, bias: np.matmul(x1, x2) + bias)
    assert v.status == core.FAIL and "no ReLU" in v.hint
