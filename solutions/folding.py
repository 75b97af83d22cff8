"""The exercise of notebook 02: fold Conv -> per-channel Mul into the Conv."""

import numpy as np


def fold(W, b, scale):
    """Reference: each output channel's weights and bias times its factor (axis 0, whatever the group)."""
    s = np.broadcast_to(np.asarray(scale, np.float64).reshape(-1), (W.shape[0],))
    bias = np.zeros(W.shape[0]) if b is None else np.asarray(b, np.float64)
    return (W * s.reshape(-1, 1, 1, 1)).astype(W.dtype), (bias * s).astype(W.dtype)


def fold_forgot_bias(W, b, scale):
    """WRONG: scales the weights but hands the bias on unscaled (right only when there is no bias)."""
    s = np.broadcast_to(np.asarray(scale, np.float64).reshape(-1), (W.shape[0],))
    return (W * s.reshape(-1, 1, 1, 1)).astype(W.dtype), b


def fold_wrong_axis(W, b, scale):
    """WRONG: scales weight axis 1 (the input channels) as if the Mul came before the Conv."""
    s = np.asarray(scale, np.float64).reshape(-1)
    s = np.broadcast_to(s, (W.shape[0],)) if s.size == 1 else s
    bias = np.zeros(W.shape[0]) if b is None else np.asarray(b, np.float64)
    if W.shape[1] != s.size:
        return (W * s[: W.shape[1]].reshape(1, -1, 1, 1)).astype(W.dtype), (bias * s).astype(W.dtype)
    return (W * s.reshape(1, -1, 1, 1)).astype(W.dtype), (bias * s).astype(W.dtype)


def fold_bias_none(W, b, scale):
    """WRONG: right weights, but hands back b2 = None when the Conv had no bias (the folded Conv needs one)."""
    w2, b2 = fold(W, b, scale)
    return w2, (None if b is None else b2)

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "folding"
REFERENCE = fold
WRONG = [(fold_forgot_bias, 0, "your bias differs"), (fold_wrong_axis, 0, "your weights differ"),
         (fold_bias_none, 1, "b2 is None")]
STUB = lambda W, b, scale: ...  # noqa: E731 - the notebook's stub cell
