"""Exercise: which kernel onnxruntime runs a quantized MatMul as (notebook 14).

The learner writes ``runs_as(after) -> str``: given the op types that follow a ``MatMul`` with dequantized inputs in
a QDQ model (as notebook 14 §1's table lists them, up to the first ``QuantizeLinear`` or the graph's output), the op
onnxruntime runs the MatMul as at level ALL: ``QLinearMatMul`` or ``QGemm`` when a quantize follows it, directly or
behind ops that only move data (Reshape, Transpose), ``MatMulIntegerToFloat`` or a float ``Gemm`` when its output
goes on in float; the Gemm kinds when a constant bias ``Add`` follows the MatMul, which onnxruntime folds in first.
``"Add"`` right after the MatMul is that bias; ``"Add (residual)"`` adds another activation.

`check(runs_as)` builds each hidden chain as a small QDQ graph (`qdq_chain`: a quantized input, int8 weights, the
MatMul, the chain, a dequantize after its quantize), lets onnxruntime optimise it (`lessons.quantization.optimized`)
and reads which kernel holds the MatMul: the truth is onnxruntime's, not a rule typed here. The cases are the rows
of notebook 14 §1's table and their near misses: a quantize behind a Transpose and a Reshape, one behind an op that
computes, a bias with and without a quantize after it, and a residual Add that is no bias.
"""

from __future__ import annotations

import functools

import numpy as np
from onnx import helper

from ..build import make_model, tensor, value_info
from ..lessons.quantization import optimized
from .core import Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "KINDS", "OPS", "check", "qdq_chain", "onnxruntime_kernel"]

EXERCISE = "which kernel a quantized MatMul becomes"
TASK = "runs_as(after) returning an op type"
#: what the MatMul can become; the first two requantise their output to uint8, the last two leave it float
KINDS = ("QLinearMatMul", "QGemm", "MatMulIntegerToFloat", "Gemm")
#: the op types a chain may hold ("Add" right after the MatMul is its constant bias)
OPS = ("Add", "Add (residual)", "Reshape", "Transpose", "Div", "Softmax", "Erf", "QuantizeLinear")
_MOVE = ("Reshape", "Transpose")
_B, _S, _H = 2, 8, 16


def qdq_chain(after) -> object:
    """x → Q → DQ, int8 weights → DQ, MatMul, then the op types of `after` in order (a QuantizeLinear followed by
    its DequantizeLinear, as the quantizer writes it): the QDQ model whose MatMul onnxruntime fuses."""
    rng = np.random.default_rng(0)
    inits = [tensor("sx", np.float32(0.02)), tensor("zx", np.array(128, np.uint8)),
             tensor("qw", rng.integers(-63, 64, (_H, _H)).astype(np.int8)), tensor("sw", np.float32(0.01)),
             tensor("zw", np.array(0, np.int8)), tensor("bias", rng.standard_normal(_H).astype(np.float32)),
             tensor("to4", np.array([_B, _S, 2, _H // 2], np.int64)), tensor("to3", np.array([_B, _S, _H], np.int64)),
             tensor("two", np.float32(2.0)), tensor("sy", np.float32(0.05)), tensor("zy", np.array(128, np.uint8))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="Qx"),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], name="DQx"),
             helper.make_node("DequantizeLinear", ["qw", "sw", "zw"], ["wd"], name="DQw"),
             helper.make_node("MatMul", ["xd", "wd"], ["t0"], name="MatMul")]
    cur, rank = "t0", 3
    for i, op in enumerate(after):
        out = f"t{i + 1}"
        if op == "Add":
            nodes.append(helper.make_node("Add", [cur, "bias"], [out], name=f"Add_{i}"))
        elif op == "Add (residual)":
            nodes.append(helper.make_node("Add", [cur, "x"], [out], name=f"Residual_{i}"))
        elif op == "Reshape":
            nodes.append(helper.make_node("Reshape", [cur, "to4" if rank == 3 else "to3"], [out], name=f"Reshape_{i}"))
            rank = 7 - rank
        elif op == "Transpose":
            nodes.append(helper.make_node("Transpose", [cur], [out], name=f"Transpose_{i}",
                                          perm=[0, 2, 1, 3] if rank == 4 else [0, 2, 1]))
        elif op == "Div":
            nodes.append(helper.make_node("Div", [cur, "two"], [out], name=f"Div_{i}"))
        elif op in ("Softmax", "Erf"):
            nodes.append(helper.make_node(op, [cur], [out], name=f"{op}_{i}"))
        elif op == "QuantizeLinear":
            nodes += [helper.make_node("QuantizeLinear", [cur, "sy", "zy"], [out + "q"], name=f"Q_{i}"),
                      helper.make_node("DequantizeLinear", [out + "q", "sy", "zy"], [out], name=f"DQ_{i}")]
        else:
            raise ValueError(f"no op {op!r} in a chain: {OPS}")
        cur = out
    nodes.append(helper.make_node("Identity", [cur], ["y"], name="output"))
    return make_model(nodes, [value_info("x", np.float32, [_B, _S, _H])], [value_info("y", np.float32, None)], inits,
                      opset=17)


@functools.lru_cache(maxsize=None)
def onnxruntime_kernel(after: tuple) -> str:
    """onnxruntime's answer: the op type that holds the chain's MatMul after optimisation at level ALL ("MatMul"
    if it stayed a float MatMul)."""
    ran = [n.op_type for n in optimized(qdq_chain(after), "all").graph.node]
    return next((op for op in KINDS if op in ran), "MatMul")


CASES = (
    Case("a quantize right after the MatMul", ("QuantizeLinear",)),
    Case("the graph's output right after the MatMul", ()),
    Case("attention scores: a Div and a Softmax before the quantize", ("Div", "Softmax", "QuantizeLinear")),
    Case("probabilities x values: a Transpose and a Reshape before the quantize",
         ("Transpose", "Reshape", "QuantizeLinear")),
    Case("a bias Add, then a quantize", ("Add", "QuantizeLinear")),
    Case("a query projection: bias, Reshape, Transpose, quantize", ("Add", "Reshape", "Transpose", "QuantizeLinear")),
    Case("the MLP's first projection: bias, then the GELU's Div and Erf", ("Add", "Div", "Erf")),
    Case("no bias: a residual Add before the quantize", ("Add (residual)", "QuantizeLinear")),
    Case("a Reshape, then an op that computes, then the quantize", ("Reshape", "Div", "QuantizeLinear")),
)


def _why(after: tuple, want: str, got: str) -> str:
    """Why onnxruntime chose `want` rather than `got`, from the chain's shape (the choice itself is onnxruntime's)."""
    gemm_kind = ("QGemm", "Gemm")
    if (want in gemm_kind) != (got in gemm_kind):
        if want in gemm_kind:
            return ("the Add right after the MatMul adds a constant bias, and onnxruntime folds MatMul + Add into a "
                    "Gemm first")
        if after[:1] == ("Add (residual)",):
            return "an Add of another activation is no bias: MatMul + Add -> Gemm folds only a constant"
        return "no bias Add follows the MatMul, so nothing makes it a Gemm"
    rest = after[1:] if want in gemm_kind else after
    if want in ("QLinearMatMul", "QGemm"):
        between = rest[:rest.index("QuantizeLinear")]
        if not between:
            return "a QuantizeLinear reads its output, so the kernel requantises it to uint8"
        return (f"only ops that move data ({', '.join(between)}) lie before the QuantizeLinear; onnxruntime moves the "
                "quantize across them, so the kernel requantises its output")
    computes = next((op for op in rest if op not in _MOVE + ("QuantizeLinear",)), None)
    if computes and "QuantizeLinear" in rest:
        return f"{computes} computes in float before the quantize, so the kernel's output stays float"
    return "no QuantizeLinear follows, so the kernel's output stays float"


def _judge(answer, case: Case) -> str | None:
    after = case.data
    got = attempt(answer, list(after))
    if is_stub(got):
        raise NotAnswered
    want = onnxruntime_kernel(after)
    if got == want:
        return None
    if got not in KINDS:
        return f"you answered {got!r}; answer one of {', '.join(KINDS)} (onnxruntime ran {want})"
    return f"you answered {got}, onnxruntime ran {want}: {_why(after, want, got)}"


def check(answer) -> Verdict:
    """Grade `runs_as(after)` on the hidden chains."""
    return grade(EXERCISE, answer, CASES, _judge, task=TASK,
                 checked="Each case: your op type against the kernel onnxruntime made of the MatMul in that chain's "
                         "QDQ graph at level ALL.")
