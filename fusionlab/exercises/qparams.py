"""Exercise: quantize a tensor to uint8 as onnxruntime does (notebook 13).

The learner writes ``quantize(x, lo, hi) -> (q, scale, zero_point)``: the asymmetric uint8 parameters that map the
calibrated range [lo, hi] (widened to hold 0, so that 0 is exact) onto 0..255, and ``q``, x quantized with them.
`check(quantize)` grades each hidden case twice: the parameters against `lessons.quantization.qparams` (what
onnxruntime's quantizer computes), and ``q`` against onnxruntime's own QuantizeLinear kernel run on the same x with
the learner's parameters (so a rounding or saturation mistake shows even when the parameters are right). The cases
include a range that does not hold 0, values outside the range, exact ties, which QuantizeLinear rounds to even, and
a zero point that is itself a tie: -lo / scale = 127.5 with the float64 scale, which the quantizer rounds to 128
(from the float32 scale the ratio is 127.49999, and it rounds to 127).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..lessons.quantization import qparams, run_qdq
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check"]

EXERCISE = "uint8 scale, zero point and QuantizeLinear"
TASK = "quantize(x, lo, hi) returning (q, scale, zero_point)"


@dataclass(frozen=True)
class QCase:
    x: tuple
    lo: float
    hi: float

    @property
    def array(self) -> np.ndarray:
        return np.array(self.x, np.float32)


#: a range whose scale is a power of two, (hi - lo) / 255 = 1/64, so that x / scale is exact and a tie is a tie
TIE_LO, TIE_HI = -1.0, -1.0 + 255 / 64


def _ties() -> tuple:
    """Values that land exactly halfway between two levels: x / scale = j + 0.5."""
    return tuple(float(np.float32(j / 64)) for j in (2.5, 3.5, -10.5, 11.5))


CASES = (
    Case("a range around 0: [-1, 2]", QCase((-1.0, -0.5, 0.0, 0.3, 1.0, 2.0), -1.0, 2.0)),
    Case("a range that does not hold 0: [0.5, 4] (widen it to [0, 4])", QCase((0.5, 1.0, 2.5, 4.0), 0.5, 4.0)),
    Case("an all-negative range: [-3, -1]", QCase((-3.0, -2.0, -1.0), -3.0, -1.0)),
    Case("values outside the calibrated range: saturate", QCase((-5.0, -1.0, 0.0, 1.0, 9.0), -1.0, 1.5)),
    Case("exact ties: QuantizeLinear rounds half to even", QCase(_ties(), TIE_LO, TIE_HI)),
    Case("a zero point that is a tie: [-1, 1], -lo / scale = 127.5", QCase((-1.0, -0.25, 0.0, 0.5, 1.0), -1.0, 1.0)),
)


def _judge(quantize, case: Case) -> str | None:
    c: QCase = case.data
    out = attempt(quantize, c.array.copy(), c.lo, c.hi)
    if is_stub(out):
        raise NotAnswered
    try:
        q, scale, zp = out
    except (TypeError, ValueError):
        raise AnswerRaised("quantize must return three things: (q, scale, zero_point)") from None
    if any(is_stub(v) for v in (q, scale, zp)):
        raise NotAnswered
    want_s, want_z = qparams(c.lo, c.hi, "uint8")
    if not np.isclose(float(scale), want_s, rtol=1e-6, atol=0):
        wide = " (did you widen the range to hold 0?)" if not c.lo <= 0 <= c.hi else ""
        return f"your scale {float(scale):.6g} is not (hi - lo) / 255 = {want_s:.6g}{wide}"
    if int(zp) != want_z:
        lo = min(c.lo, 0.0)
        ratio32 = -lo / np.float32((max(c.hi, 0.0) - lo) / 255)
        if int(zp) == int(np.clip(np.round(ratio32), 0, 255)):
            return (f"your zero point {int(zp)} is round(-lo / scale) with the scale as float32 (-lo / scale = "
                    f"{float(ratio32):.8g}); the quantizer divides by the float64 scale, rounding half to even: {want_z}")
        return (f"your zero point {int(zp)} is not round(0 - lo / scale) = {want_z}, clipped to 0..255 (compute it with "
                "the scale in float64, as onnxruntime's quantizer does, and round half to even)")
    want_q, _ = run_qdq(c.array, float(scale), int(zp), "uint8")
    got_q = np.asarray(q)
    if got_q.shape != want_q.shape:
        return f"q has shape {got_q.shape}, x has {want_q.shape}"
    bad = np.flatnonzero(got_q.astype(np.int64) != want_q.astype(np.int64))
    if bad.size:
        i = int(bad[0])
        why = (" (QuantizeLinear rounds a tie to the even level: np.rint, not floor(v + 0.5))"
               if abs(c.array[i] / float(scale) - np.floor(c.array[i] / float(scale)) - 0.5) < 1e-6 else
               " (saturate to 0..255)" if not 0 <= got_q.astype(np.int64)[i] <= 255 or want_q[i] in (0, 255) else "")
        return (f"q[{i}] = {int(got_q[i])} for x = {c.array[i]:g}, onnxruntime's QuantizeLinear gives "
                f"{int(want_q[i])}{why}")
    if got_q.dtype != np.uint8:
        return f"q is {got_q.dtype}; QuantizeLinear to uint8 gives uint8"
    return None


def check(quantize) -> Verdict:
    """Grade `quantize(x, lo, hi) -> (q, scale, zero_point)` on the hidden cases."""
    return grade(EXERCISE, quantize, CASES, _judge, task=TASK,
                 checked="Each case: your scale and zero point against the quantizer's (range widened to hold 0), "
                         "and your q against onnxruntime's QuantizeLinear on the same x.")
