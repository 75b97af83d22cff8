"""The second exercise of notebook 13: requantise an int32 accumulator onto the output's uint8 grid."""

import numpy as np


def requantize(acc, x_scale, w_scale, y_scale, y_zero_point):
    """Reference: M = s_x * s_w / s_y in float32 (per column when s_w is), round half to even, add the zero point,
    saturate to 0..255."""
    m = np.float32(x_scale) * np.asarray(w_scale, np.float32) / np.float32(y_scale)
    v = np.rint(acc.astype(np.float32) * m) + y_zero_point
    return np.clip(v, 0, 255).astype(np.uint8)


def requantize_truncate(acc, x_scale, w_scale, y_scale, y_zero_point):
    """WRONG: truncates (astype) instead of rounding half to even."""
    m = np.float32(x_scale) * np.asarray(w_scale, np.float32) / np.float32(y_scale)
    return np.clip(np.trunc(acc * m) + y_zero_point, 0, 255).astype(np.uint8)


def requantize_no_zero_point(acc, x_scale, w_scale, y_scale, y_zero_point):
    """WRONG: forgets the output's zero point."""
    m = np.float32(x_scale) * np.asarray(w_scale, np.float32) / np.float32(y_scale)
    return np.clip(np.rint(acc * m), 0, 255).astype(np.uint8)


def requantize_no_clip(acc, x_scale, w_scale, y_scale, y_zero_point):
    """WRONG: casts to uint8 without saturating, so values past 255 or below 0 wrap around."""
    m = np.float32(x_scale) * np.asarray(w_scale, np.float32) / np.float32(y_scale)
    return (np.rint(acc * m) + y_zero_point).astype(np.int64).astype(np.uint8)


def requantize_stub(acc, x_scale, w_scale, y_scale, y_zero_point):
    raise NotImplementedError

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "requant"
REFERENCE = requantize
WRONG = [(requantize_truncate, 0, "truncation toward 0"), (requantize_no_zero_point, 0, "zero point forgotten"),
         (requantize_no_clip, 3, "no saturation")]
STUB = requantize_stub
