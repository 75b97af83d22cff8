"""The exercises of notebook 14 (qkernels, qadd; qparams and requant of notebook 13 are in test_exercises.py and
test_exercises_h5.py): where their truth comes from, and that answers a little off, or right only away from the hard
corners, fail."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np

from fusionlab import zoo
from fusionlab.exercises import core, qadd, qkernels
from fusionlab.lessons import quantization as quant

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # solutions/ sits at the repository root
from solutions import qadd as s_qadd  # noqa: E402
from solutions import qkernels as s_qkernels  # noqa: E402


def test_qkernels_truth_is_onnxruntime_and_covers_every_kind():
    """Each chain's kernel is read from onnxruntime's optimised graph: one of the four kinds (never a float MatMul
    left over), all four among the cases, and the float chain without any QuantizeLinear keeps its MatMul's inputs
    dequantized only where the kind says so."""
    kinds = Counter(qkernels.onnxruntime_kernel(c.data) for c in qkernels.CASES)
    assert set(kinds) == set(qkernels.KINDS)
    ran = [n.op_type for n in quant.optimized(qkernels.qdq_chain(("Add", "Div", "Erf"))).graph.node]
    assert "Gemm" in ran and "QGemm" not in ran and ran.count("DequantizeLinear") == 2


def test_qkernels_reference_agrees_with_a_quantized_bert():
    """The small chains stand for the real thing: in a one-layer BERT quantized as notebook 14 §1's "MatMul, float
    out", every MatMul runs as the reference rule says, given the op types after it in the QDQ model."""
    bert = zoo.bert(layers=1, hidden=32, heads=2, intermediate=64, vocab=50, batch=2, seq=8)
    qdq = quant.quantize(bert, quant.token_batches(2, 2, 8, 50, seed=1), op_types=["MatMul"],
                         extra_options={"OpTypesToExcludeOutputQuantization": ["MatMul"]})
    readers = {}
    for n in qdq.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    ran = {n.name.removesuffix("/MatMulAddFusion"): n.op_type for n in quant.optimized(qdq).graph.node
           if n.op_type in qkernels.KINDS}
    checked = 0
    for node in qdq.graph.node:
        if node.op_type != "MatMul" or node.name not in ran:
            continue
        after, cur = [], node
        while cur.output[0] in readers and after[-1:] != ["QuantizeLinear"] and len(after) < 6:
            cur = readers[cur.output[0]][0]
            const_bias = cur.op_type == "Add" and not after and any(
                t.name in cur.input for t in qdq.graph.initializer)
            after.append("Add" if const_bias else "Add (residual)" if cur.op_type == "Add" else cur.op_type)
        assert s_qkernels.runs_as(after) == ran[node.name], (node.name, after)
        checked += 1
    assert checked >= 6


def test_qkernels_a_constant_answer_fails_early_and_says_which_kind_ran():
    v = qkernels.check(lambda after: "QLinearMatMul")
    assert v.status == core.FAIL and v.passed == 1 and "onnxruntime ran MatMulIntegerToFloat" in v.hint
    v = qkernels.check(lambda after: "MatMulInteger")
    assert v.status == core.FAIL and v.passed == 0 and "answer one of" in v.hint


def test_qadd_truth_is_onnxruntime_qlinearadd_and_the_lessons_numpy_agrees():
    """onnxruntime fuses the case's DQ, DQ -> Add -> Q into one QLinearAdd; the notebook's `requantize_add` and a
    float64 answer pass too (no case sits on a float32 rounding boundary but the exact ties)."""
    for case in qadd.CASES:
        c = case.data
        assert np.array_equal(quant.run_qlinear_add(*c.args), quant.requantize_add(*c.args))
        v = qadd.exact_sum(c)
        frac = np.abs(v - np.floor(v) - 0.5)
        assert np.all((frac > qadd.MARGIN) | (frac == 0))
    assert qadd.check(quant.requantize_add).ok and qadd.check(s_qadd.qlinear_add_dequantized).ok
    ties = qadd.exact_sum(qadd.CASES[3].data)
    assert np.sum(ties - np.floor(ties) == 0.5) >= 10


def test_qadd_one_level_off_on_one_element_fails():
    def one_off(qa, sa, za, qb, sb, zb, sy, zy):
        y = s_qadd.qlinear_add(qa, sa, za, qb, sb, zb, sy, zy).astype(np.int64)
        i = int(np.flatnonzero((y > 0) & (y < 255))[-1])
        y[i] += 1
        return y.astype(np.uint8)

    v = qadd.check(one_off)
    assert v.status == core.FAIL and v.passed == 0 and "onnxruntime's QLinearAdd" in v.hint
    v = qadd.check(lambda *args: s_qadd.qlinear_add(*args).astype(np.int32))
    assert v.status == core.FAIL and "QLinearAdd's output is uint8" in v.hint
