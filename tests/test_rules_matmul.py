"""fused_matmul: scalar scales and operand transposes around a MatMul -> com.microsoft FusedMatMul.

The positive models copy the corpus exporters' attention patterns (docs/corpus.md); each legality condition
has a model the rule must leave alone, with the refusal it gives asserted.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper as h

from fusionlab.build import tensor, value_info
from fusionlab.passes import fuse

from rulekit import CORPUS, check, corpus_files, mk, r, refused

RULES = ("fused_matmul",)
QK = 1 / math.sqrt(math.sqrt(32))  # SDPA's d^-1/4 on Q and on K


def _node(graph, op):
    return next(n for n in graph if n.op_type == op)


def sdpa_scores(*, k_perm=(0, 2, 3, 1), q_scale=QK, k_scale=QK, const_first=False):
    """SDPA export (bert/gpt2/vit ts-fold and dynamo): Transpose -> Mul(d^-1/4) on Q and K, MatMul, + mask."""
    def mul(x, c, y, name):
        return h.make_node("Mul", [c, x] if const_first else [x, c], [y], name=name)
    nodes = [h.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1, 3], name="tq"), mul("qt", "sq", "qs", "mq"),
             h.make_node("Transpose", ["k"], ["kt"], perm=list(k_perm), name="tk"), mul("kt", "sk", "ks", "mk"),
             h.make_node("MatMul", ["qs", "ks"], ["s"], name="scores"),
             h.make_node("Add", ["s", "mask"], ["y"], name="addmask")]
    inits = [tensor("sq", np.float32(q_scale)), tensor("sk", np.float32(k_scale)), tensor("mask", r(2, 1, 11, 11))]
    return mk(nodes, [value_info("q", shape=[2, 11, 4, 32]), value_info("k", shape=[2, 11, 4, 32])],
              [value_info("y", shape=[2, 4, 11, 11])], inits, opset=20)


@pytest.mark.parametrize("const_first", [False, True])
def test_sdpa_scales_on_q_and_k_become_alpha(const_first):
    res = check(sdpa_scores(const_first=const_first), RULES, {"Transpose": 2, "com.microsoft:FusedMatMul": 1, "Add": 1})
    fm = _node(res.graph, "FusedMatMul")
    assert fm.attributes["alpha"].value == pytest.approx(QK * QK, rel=1e-6)
    assert fm.attributes["transA"].value == fm.attributes["transB"].value == 0
    assert res.plan.rule_counts() == {"fused_matmul": 1}


def test_eager_attention_scale_after_the_matmul_mul_or_div():
    for op, c in (("Mul", 1 / math.sqrt(32)), ("Div", math.sqrt(32))):
        nodes = [h.make_node("MatMul", ["q", "kt"], ["s"], name="scores"), h.make_node(op, ["s", "c"], ["ss"], name="scale"),
                 h.make_node("Add", ["ss", "mask"], ["y"], name="addmask")]
        m = mk(nodes, [value_info("q", shape=[2, 4, 11, 32]), value_info("kt", shape=[2, 4, 32, 11])],
               [value_info("y", shape=[2, 4, 11, 11])], [tensor("c", np.float32(c)), tensor("mask", r(2, 1, 11, 11))], opset=20)
        res = check(m, RULES, {"com.microsoft:FusedMatMul": 1, "Add": 1})
        assert _node(res.graph, "FusedMatMul").attributes["alpha"].value == pytest.approx(1 / math.sqrt(32), rel=1e-6)


def test_yolo11_attention_transposes_and_scale():
    """YOLO11's AAttn: MatMul(Transpose(Mul(q, s)), k) -> Softmax -> MatMul(v, Transpose(softmax))."""
    nodes = [h.make_node("Mul", ["q", "s"], ["qs"], name="mq"),
             h.make_node("Transpose", ["qs"], ["qt"], perm=[0, 1, 3, 2], name="tq"),
             h.make_node("MatMul", ["qt", "k"], ["a"], name="scores"), h.make_node("Softmax", ["a"], ["p"], axis=-1, name="sm"),
             h.make_node("Transpose", ["p"], ["pt"], perm=[0, 1, 3, 2], name="tp"),
             h.make_node("MatMul", ["v", "pt"], ["y"], name="context")]
    m = mk(nodes, [value_info("q", shape=[1, 2, 32, 25]), value_info("k", shape=[1, 2, 32, 25]),
                   value_info("v", shape=[1, 2, 32, 25])], [value_info("y", shape=[1, 2, 32, 25])],
           [tensor("s", np.float32(QK * QK))], opset=20)
    res = check(m, RULES, {"com.microsoft:FusedMatMul": 2, "Softmax": 1})
    first, second = [n for n in res.graph if n.op_type == "FusedMatMul"]
    assert (first.attributes["transA"].value, first.attributes["transB"].value) == (1, 0)
    assert (second.attributes["transA"].value, second.attributes["transB"].value) == (0, 1)
    assert second.attributes["alpha"].value == 1.0


@pytest.mark.parametrize("perm, flags", [([1, 2, 0, 3], (0, 1)), ([1, 2, 3, 0], (1, 1)), ([0, 1, 3, 2], (1, 0))])
@pytest.mark.parametrize("side", [0, 1])
def test_batch_transposes_set_trans_batch(perm, flags, side):
    shapes = {0: {(0, 1): [5, 2, 3, 4], (1, 1): [4, 2, 3, 5], (1, 0): [2, 3, 4, 5]},
              1: {(0, 1): [4, 2, 3, 6], (1, 1): [6, 2, 3, 4], (1, 0): [2, 3, 6, 4]}}
    other = [2, 3, 5, 4] if side == 1 else [2, 3, 4, 6]
    ins = ["xt", "o"] if side == 0 else ["o", "xt"]
    nodes = [h.make_node("Transpose", ["x"], ["xt"], perm=perm, name="t"), h.make_node("MatMul", ins, ["y"], name="mm")]
    m = mk(nodes, [value_info("x", shape=shapes[side][flags]), value_info("o", shape=other)], [value_info("y", shape=None)],
           opset=20)
    res = check(m, RULES, {"com.microsoft:FusedMatMul": 1})
    a = _node(res.graph, "FusedMatMul").attributes
    names = ("transA", "transBatchA") if side == 0 else ("transB", "transBatchB")
    assert (a[names[0]].value, a[names[1]].value) == flags


def test_transpose_of_a_rank2_operand_against_a_rank3_one():
    nodes = [h.make_node("Transpose", ["w"], ["wt"], perm=[1, 0], name="t"), h.make_node("MatMul", ["x", "wt"], ["y"], name="mm")]
    m = mk(nodes, [value_info("x", shape=["batch", 7, 16]), value_info("w", shape=[24, 16])], [value_info("y", shape=None)],
           opset=20)
    res = check(m, RULES, {"com.microsoft:FusedMatMul": 1})
    assert _node(res.graph, "FusedMatMul").attributes["transB"].value == 1


def _scaled(scale_node, inits, inputs=None, outputs=None, extra=()):
    nodes = [scale_node, h.make_node("MatMul", ["xs", "b"], ["y"], name="mm"), *extra]
    return mk(nodes, inputs or [value_info("x", shape=[2, 8, 16]), value_info("b", shape=[2, 16, 8])],
              outputs or [value_info("y", shape=[2, 8, 8])], inits, opset=20)


NOT_FUSED = {
    "per-channel scale": (lambda: _scaled(h.make_node("Mul", ["x", "c"], ["xs"], name="sc"), [tensor("c", r(16))]),
                          "not a scalar scale"),
    "scalar that broadcasts up": (lambda: _scaled(h.make_node("Mul", ["x", "c"], ["xs"], name="sc"),
                                                  [tensor("c", np.full([1, 1, 1, 1], 0.5, np.float32))],
                                                  outputs=[value_info("y", shape=[1, 2, 8, 8])]),
                                  "broadcast the operand up a rank"),
    "scaled value read elsewhere": (lambda: _scaled(h.make_node("Mul", ["x", "c"], ["xs"], name="sc"),
                                                    [tensor("c", np.float32(0.5))],
                                                    outputs=[value_info("y", shape=[2, 8, 8]), value_info("xs", shape=[2, 8, 16])]),
                                    "read elsewhere"),
    "constant divided by the operand": (lambda: _scaled(h.make_node("Div", ["c", "x"], ["xs"], name="sc"),
                                                        [tensor("c", np.float32(2.0))]), "divides a constant"),
    "division by zero": (lambda: _scaled(h.make_node("Div", ["x", "c"], ["xs"], name="sc"), [tensor("c", np.float32(0.0))]),
                         "not finite and non-zero"),
    "head transpose": (lambda: _scaled(h.make_node("Transpose", ["x"], ["xs"], perm=[0, 2, 1, 3], name="sc"), [],
                                       inputs=[value_info("x", shape=[2, 8, 4, 16]), value_info("b", shape=[2, 4, 16, 8])],
                                       outputs=[value_info("y", shape=[2, 4, 8, 8])]),
                       "is not one FusedMatMul takes"),
    "fp16": (lambda: _scaled(h.make_node("Mul", ["x", "c"], ["xs"], name="sc"), [tensor("c", np.float16(0.5))],
                             inputs=[value_info("x", np.float16, [2, 8, 16]), value_info("b", np.float16, [2, 16, 8])],
                             outputs=[value_info("y", np.float16, [2, 8, 8])]), "float32 only"),
    "transBatch with unequal ranks": (lambda: _scaled(h.make_node("Transpose", ["x"], ["xs"], perm=[1, 0, 2], name="sc"), [],
                                                      inputs=[value_info("x", shape=[8, 2, 16]), value_info("b", shape=[16, 8])],
                                                      outputs=[value_info("y", shape=[2, 8, 8])]),
                                      "same rank >= 3"),
}


@pytest.mark.parametrize("case", sorted(NOT_FUSED))
def test_fused_matmul_refuses(case):
    build, reason = NOT_FUSED[case]
    reasons = refused(build(), RULES, "mm")
    assert any(reason in x for x in reasons), reasons


def test_sdpa_head_transposes_stay_and_say_why():
    """bert ts-fold's K Transpose[0, 2, 3, 1] is no FusedMatMul transpose: only the scales fold, the refusal is kept."""
    res = check(sdpa_scores(), RULES)
    assert any("perm [0, 2, 3, 1]" in x.reason for x in res.plan.why_not("scores"))


def test_no_fused_matmul_with_standard_ops_only():
    res = fuse(sdpa_scores(), ("vertical",), rules=RULES, lower="onnx")
    assert res.after == res.before


@pytest.mark.parametrize("name, count", [("bert.dynamo", 2), ("bert.ts-fold", 2), ("bert_eager.dynamo", 2),
                                         ("gpt2.dynamo", 2), ("vit.dynamo", 2), ("yolo11.dynamo", 2),
                                         ("yolo11.ts-fold", 2)])
def test_corpus_fused_matmuls_match_onnxruntime(name, count):
    """As many FusedMatMul as onnxruntime EXTENDED makes on each export (docs/corpus.md), and the model computes the same."""
    if not (CORPUS / f"{name}.onnx").exists():
        pytest.skip("no corpus")
    res = check(str(CORPUS / f"{name}.onnx"), RULES)
    assert res.plan.rule_counts().get("fused_matmul") == count
