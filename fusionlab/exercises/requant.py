"""Exercise: requantise an int32 accumulator onto the output's uint8 grid (notebook 13).

The learner writes ``requantize(acc, x_scale, w_scale, y_scale, y_zero_point) -> uint8``: what an int8 kernel
does after its integer products (notebook 13 §1, "Inside an int8 kernel"): multiply the int32 accumulator by
M = s_x · s_w / s_y (one s_w per output column when the weights are per channel), round half to even, add the
output's zero point and saturate to 0..255. `check(requantize)` builds each hidden case from uint8 activations and
int8 weights, hands the learner the exact accumulator (q_x − z_x) @ q_w, and compares the answer with onnxruntime's
own ``QLinearMatMul`` kernel run on the same integers and scales. The cases include saturation at 0 and at 255,
exact ties and per-column weight scales; the hint names truncation, a forgotten zero point or a missing clip.

The random cases keep the int8 weights within −63..63 (7 bits, what `lessons.quantization.quantize` stores with
onnxruntime's ``reduce_range``): with the full −127..127 range, onnxruntime's uint8 × int8 kernel on a CPU without
VNNI adds pairs of products in int16 (AVX2's vpmaddubsw) and saturates, departing from the exact int32 sum
(tests/test_quantization.py), and the exercise is about the requantisation, not that.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from ..build import make_model, tensor
from ..lessons.quantization import qparams, quantize_array
from ..verification import runtime
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "run_qlinear_matmul", "accumulator"]

EXERCISE = "requantise an int32 accumulator"
TASK = "requantize(acc, x_scale, w_scale, y_scale, y_zero_point)"


@dataclass(frozen=True)
class RequantCase:
    qx: np.ndarray  # uint8 [M, K]
    x_scale: float
    x_zero: int
    qw: np.ndarray  # int8 [K, N], symmetric
    w_scale: object  # float, or float32 [N] per column
    y_scale: float
    y_zero: int

    def __hash__(self):  # frozen dataclass of arrays: hashed by identity
        return id(self)


def accumulator(c: RequantCase) -> np.ndarray:
    """The int32 sum an int8 kernel computes before it requantises: (q_x - z_x) @ q_w, exact."""
    return (c.qx.astype(np.int32) - c.x_zero) @ c.qw.astype(np.int32)


def run_qlinear_matmul(c: RequantCase) -> np.ndarray:
    """onnxruntime's QLinearMatMul on the case's integers and scales (optimisations off): the uint8 output."""
    sw = np.asarray(c.w_scale, np.float32)
    u8 = onnx.TensorProto.UINT8
    inits = [tensor("sx", np.float32(c.x_scale)), tensor("zx", np.array(c.x_zero, np.uint8)), tensor("qw", c.qw),
             tensor("sw", sw), tensor("zw", np.zeros(sw.shape, np.int8)), tensor("sy", np.float32(c.y_scale)),
             tensor("zy", np.array(c.y_zero, np.uint8))]
    node = helper.make_node("QLinearMatMul", ["qx", "sx", "zx", "qw", "sw", "zw", "sy", "zy"], ["y"])
    m, n = c.qx.shape[0], c.qw.shape[1]
    model = make_model([node], [helper.make_tensor_value_info("qx", u8, list(c.qx.shape))],
                       [helper.make_tensor_value_info("y", u8, [m, n])], inits, opset=21)
    return runtime.session(model, "disable").run(["y"], {"qx": c.qx})[0]


def _notebook_case() -> RequantCase:
    """Notebook 13 §1's 1x4 activation times 4x2 weight, quantized as the notebook quantizes it."""
    xa = np.array([[0.52, -0.2, 1.3, 0.0]], np.float32)
    wa = np.array([[0.5, -0.25], [1.0, 0.1], [-0.4, 0.8], [0.3, -0.6]], np.float32)
    sx, zx = qparams(-1.0, 2.0, "uint8")
    sw, _ = qparams(wa.min(), wa.max(), "int8", symmetric=True)
    sy, zy = qparams(-2.0, 2.0, "uint8")
    return RequantCase(quantize_array(xa, sx, zx, "uint8"), sx, zx, quantize_array(wa, sw, 0, "int8"), sw, sy, zy)


def _random_case(seed: int, m: int, k: int, n: int, sy: float, zy: int, per_column: bool = False) -> RequantCase:
    rng = np.random.default_rng(seed)
    qx = rng.integers(0, 256, (m, k)).astype(np.uint8)
    qw = rng.integers(-63, 64, (k, n)).astype(np.int8)  # 7-bit weights: see the module's docstring
    sw = (rng.uniform(0.5, 2.0, n) * 2e-3).astype(np.float32) if per_column else 1.5e-3
    return RequantCase(qx, 0.02, 128, qw, sw, sy, zy)


def _tie_case() -> RequantCase:
    """Scales of powers of two, M = 1/2 exactly, odd accumulators: M * acc is exactly k + 1/2."""
    qx = np.arange(0, 22, dtype=np.uint8)[:, None]        # acc = q_x - 10: -10 .. 11, odd ones are ties
    return RequantCase(qx, 0.5, 10, np.ones((1, 1), np.int8), 0.25, 0.25, 100)


CASES = (
    Case("notebook 13's 1x4 activation times its 4x2 weight", _notebook_case()),
    Case("8x64 times 64x16, one weight scale, outputs inside the range", _random_case(1, 8, 64, 16, 0.6, 128)),
    Case("exact ties: M x acc = k + 1/2, rounded half to even", _tie_case()),
    Case("a narrow output range: saturate at 0 and at 255", _random_case(2, 8, 64, 16, 0.005, 128)),
    Case("per-channel weights: one s_w per output column", _random_case(3, 6, 48, 12, 0.6, 100, per_column=True)),
    Case("an output zero point of 0 (a Relu's range): negatives saturate at 0", _random_case(4, 8, 64, 16, 0.3, 0)),
)


def _mistake(c: RequantCase, acc: np.ndarray, got: np.ndarray) -> str:
    """The plausible mistakes that give exactly `got`, in words ("" if none does)."""
    m = np.float32(c.x_scale) * np.asarray(c.w_scale, np.float32) / np.float32(c.y_scale)
    v = acc.astype(np.float64) * m
    said = [words for value, words in (
        (np.clip(np.trunc(v) + c.y_zero, 0, 255), "truncation toward 0: round half to even (np.rint)"),
        (np.clip(np.floor(v + 0.5) + c.y_zero, 0, 255), "a tie rounded up: QLinearMatMul rounds it to even (np.rint)"),
        (np.clip(np.rint(v), 0, 255), "the output's zero point forgotten"),
        ((np.rint(v) + c.y_zero).astype(np.int64) % 256, "no saturation: uint8 wraps around, clip to 0..255 first"),
        (np.clip(np.rint(acc * np.float32(c.x_scale) * np.ravel(c.w_scale)[0] / np.float32(c.y_scale)) + c.y_zero,
                 0, 255), "one weight scale for every column: w_scale holds one per output column"))
        if value.shape == got.shape and np.array_equal(value.astype(np.int64), got)]
    return f" (that is {' or '.join(said)})" if said else ""


def _judge(requantize, case: Case) -> str | None:
    c: RequantCase = case.data
    acc = accumulator(c)
    w_scale = np.array(c.w_scale, np.float32) if np.ndim(c.w_scale) else float(c.w_scale)
    got = attempt(requantize, acc.copy(), float(c.x_scale), w_scale, float(c.y_scale), int(c.y_zero))
    if is_stub(got):
        raise NotAnswered
    try:
        got_arr = np.asarray(got)
        got_i = got_arr.astype(np.int64)
    except (TypeError, ValueError):
        raise AnswerRaised(f"requantize must return an array, got {type(got).__name__}") from None
    want = run_qlinear_matmul(c)
    if got_i.shape != want.shape:
        return f"your result has shape {got_i.shape}; the accumulator has {acc.shape}"
    bad = np.argwhere(got_i != want.astype(np.int64))
    if bad.size:
        i = tuple(int(v) for v in bad[0])
        return (f"at {i}, acc = {int(acc[i])}: you give {int(got_i[i])}, onnxruntime's QLinearMatMul "
                f"{int(want[i])}{_mistake(c, acc, got_i)}")
    if got_arr.dtype != np.uint8:
        return f"the values are right, but the array is {got_arr.dtype}: an int8 kernel's output is uint8"
    return None


def check(requantize) -> Verdict:
    """Grade `requantize(acc, x_scale, w_scale, y_scale, y_zero_point)` on the hidden cases."""
    return grade(EXERCISE, requantize, CASES, _judge, task=TASK,
                 checked="Each case: your uint8 output against onnxruntime's QLinearMatMul run on the same uint8 "
                         "activations, int8 weights and scales.")
