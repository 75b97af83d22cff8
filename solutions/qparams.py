"""The exercise of notebook 13: uint8 scale, zero point and QuantizeLinear, as onnxruntime computes them."""

import numpy as np


def quantize(x, lo, hi):
    """Reference: widen [lo, hi] to hold 0, scale = (hi - lo) / 255, zero point = round(-lo / scale) (in float64,
    as onnxruntime's quantizer computes both; the scale stored as float32), then
    q = saturate(round_half_even(x / scale) + zero point)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / 255  # in float64, as onnxruntime's quantizer computes it; stored as float32
    zp = int(np.clip(np.round(-lo / scale), 0, 255))
    scale = np.float32(scale)
    q = np.clip(np.rint(np.asarray(x, np.float32) / scale) + zp, 0, 255).astype(np.uint8)
    return q, float(scale), zp


def quantize_no_widen(x, lo, hi):
    """WRONG: does not widen the range to hold 0 (then 0 is not exact, and a ReLU's zeros move)."""
    scale = (hi - lo) / 255  # in float64, as onnxruntime's quantizer computes it; stored as float32
    zp = int(np.clip(np.round(-lo / scale), 0, 255))
    scale = np.float32(scale)
    q = np.clip(np.rint(np.asarray(x, np.float32) / scale) + zp, 0, 255).astype(np.uint8)
    return q, float(scale), zp


def quantize_round_half_up(x, lo, hi):
    """WRONG: rounds a tie up (floor(v + 0.5)); QuantizeLinear rounds it to the even level."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / 255  # in float64, as onnxruntime's quantizer computes it; stored as float32
    zp = int(np.clip(np.round(-lo / scale), 0, 255))
    scale = np.float32(scale)
    q = np.clip(np.floor(np.asarray(x, np.float32) / scale + 0.5) + zp, 0, 255).astype(np.uint8)
    return q, float(scale), zp


def quantize_zero_point_from_float32(x, lo, hi):
    """WRONG: the zero point from the float32 scale (as quant.qparams returns it): for [-1, 1] -lo / scale is
    127.49999 and rounds to 127; the quantizer divides by the float64 scale, 127.5, and rounds to 128."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = np.float32((hi - lo) / 255)
    zp = int(np.clip(np.round(-lo / scale), 0, 255))
    q = np.clip(np.rint(np.asarray(x, np.float32) / scale) + zp, 0, 255).astype(np.uint8)
    return q, float(scale), zp


def quantize_stub(x, lo, hi):
    raise NotImplementedError

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "qparams"
REFERENCE = quantize
WRONG = [(quantize_no_widen, 1, "widen the range"), (quantize_round_half_up, 4, "rounds a tie to the even level"),
         (quantize_zero_point_from_float32, 5, "the float64 scale")]
STUB = quantize_stub
