"""The exercise of notebook 00: BatchNormalization at inference as one scale and one shift per channel."""

import numpy as np


def bn_affine(gamma, beta, mean, var, eps):
    """Reference: gamma * (x - mean) / sqrt(var + eps) + beta = scale * x + (beta - mean * scale)."""
    scale = gamma / np.sqrt(var + eps)
    return scale, beta - mean * scale


def bn_affine_no_eps(gamma, beta, mean, var, eps):
    """WRONG: leaves eps out (right to ~1e-5 while var >> eps; infinite where var is 0)."""
    scale = gamma / np.sqrt(var)
    return scale, beta - mean * scale


def bn_affine_shift_by_gamma(gamma, beta, mean, var, eps):
    """WRONG: shifts by the mean times gamma, forgetting that the mean is divided by the deviation too."""
    return gamma / np.sqrt(var + eps), beta - mean * gamma


def bn_affine_stub(gamma, beta, mean, var, eps):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "bnaffine"
REFERENCE = bn_affine
WRONG = [(bn_affine_no_eps, 2, "eps left out"), (bn_affine_shift_by_gamma, 0, "beta - mean * gamma")]
STUB = bn_affine_stub
