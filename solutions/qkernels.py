"""The first exercise of notebook 14: which kernel onnxruntime runs a quantized MatMul as."""

MOVE = ("Reshape", "Transpose")  # ops that only move data: onnxruntime moves a quantize across them


def _quantized(rest):
    """Whether a QuantizeLinear follows, with only data-moving ops before it."""
    for op in rest:
        if op == "QuantizeLinear":
            return True
        if op not in MOVE:
            return False
    return False


def runs_as(after):
    """Reference: a constant bias Add right after makes it a Gemm kind (MatMul + Add -> Gemm comes first); a
    quantize reached through data movement only makes the kernel requantise its output."""
    after = list(after)
    if after[:1] == ["Add"]:
        return "QGemm" if _quantized(after[1:]) else "Gemm"
    return "QLinearMatMul" if _quantized(after) else "MatMulIntegerToFloat"


def runs_as_quantize_right_after(after):
    """WRONG: counts only a quantize that reads the output directly, not one behind a Reshape or Transpose."""
    after = list(after)
    bias = after[:1] == ["Add"]
    rest = after[1:] if bias else after
    q = rest[:1] == ["QuantizeLinear"]
    return ("QGemm" if q else "Gemm") if bias else ("QLinearMatMul" if q else "MatMulIntegerToFloat")


def runs_as_quantize_anywhere(after):
    """WRONG: any quantize further on makes it requantise, even behind an op that computes."""
    after = list(after)
    bias = after[:1] == ["Add"]
    q = "QuantizeLinear" in after
    return ("QGemm" if q else "Gemm") if bias else ("QLinearMatMul" if q else "MatMulIntegerToFloat")


def runs_as_no_gemm(after):
    """WRONG: forgets that a bias Add is folded in first; always a MatMul kind."""
    return "QLinearMatMul" if _quantized([op for op in after if op != "Add"]) else "MatMulIntegerToFloat"


def runs_as_any_add_is_bias(after):
    """WRONG: takes a residual Add for a bias."""
    return runs_as(["Add" if op == "Add (residual)" else op for op in after])


def runs_as_stub(after):
    raise NotImplementedError

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "qkernels"
REFERENCE = runs_as
WRONG = [(runs_as_quantize_anywhere, 2, "computes in float"), (runs_as_quantize_right_after, 3, "move data"),
         (runs_as_no_gemm, 4, "constant bias"), (runs_as_any_add_is_bias, 7, "no bias")]
STUB = runs_as_stub
