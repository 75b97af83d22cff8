"""The exercise of notebook 02: fold BatchNormalization into the ConvTranspose before it."""

import numpy as np


def fold_bn(W, b, gamma, beta, mean, var, eps, group):
    """Reference: output channel g * C_out/group + j is column j (axis 1) of group g's rows; b' = s(b - mean) + beta."""
    s = np.asarray(gamma, np.float64) / np.sqrt(np.asarray(var, np.float64) + eps)
    per = W.shape[1]
    wg = W.astype(np.float64).reshape((group, W.shape[0] // group, per) + W.shape[2:])
    w2 = (wg * s.reshape((group, 1, per) + (1,) * (W.ndim - 2))).reshape(W.shape)
    bias = np.zeros(s.shape[0]) if b is None else np.asarray(b, np.float64)
    return w2.astype(W.dtype), (s * (bias - mean) + beta).astype(W.dtype)


def fold_bn_axis0(W, b, gamma, beta, mean, var, eps, group):
    """WRONG: scales weight axis 0 as for a Conv; on a ConvTranspose that is the input channels."""
    s = np.asarray(gamma, np.float64) / np.sqrt(np.asarray(var, np.float64) + eps)
    bias = np.zeros(s.shape[0]) if b is None else np.asarray(b, np.float64)
    return (W * s.reshape((-1,) + (1,) * (W.ndim - 1))).astype(W.dtype), (s * (bias - mean) + beta).astype(W.dtype)


def fold_bn_first_group(W, b, gamma, beta, mean, var, eps, group):
    """WRONG: scales axis 1 by the first C_out/group factors, for every group (right only when group = 1)."""
    s = np.asarray(gamma, np.float64) / np.sqrt(np.asarray(var, np.float64) + eps)
    per = W.shape[1]
    bias = np.zeros(s.shape[0]) if b is None else np.asarray(b, np.float64)
    w2 = W * s[:per].reshape((1, per) + (1,) * (W.ndim - 2))
    return w2.astype(W.dtype), (s * (bias - mean) + beta).astype(W.dtype)


def fold_bn_seed_bias(W, b, gamma, beta, mean, var, eps, group):
    """WRONG: the write-up's bias, beta - s * mean: forgets the ConvTranspose's own bias s * b."""
    w2, _ = fold_bn(W, None, gamma, beta, mean, var, eps, group)
    s = np.asarray(gamma, np.float64) / np.sqrt(np.asarray(var, np.float64) + eps)
    return w2, (beta - s * mean).astype(W.dtype)


def fold_bn_stub(W, b, gamma, beta, mean, var, eps, group):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "transposed"
REFERENCE = fold_bn
WRONG = [(fold_bn_axis0, 0, "weight axis 0"), (fold_bn_first_group, 3, "first group's factors"),
         (fold_bn_seed_bias, 0, "forgets")]
STUB = fold_bn_stub
