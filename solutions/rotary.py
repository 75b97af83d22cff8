"""The second exercise of notebook 11: rotary embeddings in LLaMA's half-rotated form."""

import numpy as np


def apply_rotary(x, positions, base=10000.0):
    """Reference: channel i pairs with i + D/2 and turns by p * base^(-2i/D): x * cos + rotate_half(x) * sin."""
    d = x.shape[-1]
    theta = base ** (-np.arange(0, d, 2) / d)                  # D/2 frequencies
    ang = np.asarray(positions, np.float64)[:, None] * theta   # [S, D/2]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    rotated = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rotated * sin


def apply_rotary_interleaved(x, positions, base=10000.0):
    """WRONG: the interleaved form (GPT-J's rotate_every_two), pairs (2i, 2i + 1)."""
    d = x.shape[-1]
    theta = base ** (-np.arange(0, d, 2) / d)
    ang = np.asarray(positions, np.float64)[:, None] * theta
    cos, sin = np.repeat(np.cos(ang), 2, -1), np.repeat(np.sin(ang), 2, -1)
    rotated = np.stack([-x[..., 1::2], x[..., 0::2]], -1).reshape(x.shape)
    return x * cos + rotated * sin


def apply_rotary_exponent(x, positions, base=10000.0):
    """WRONG: the frequency exponent off by the factor 2, base^(-i/D)."""
    d = x.shape[-1]
    theta = base ** (-np.arange(d // 2) / d)
    ang = np.asarray(positions, np.float64)[:, None] * theta
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    rotated = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rotated * sin


def apply_rotary_stub(x, positions, base=10000.0):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "rotary"
REFERENCE = apply_rotary
WRONG = [(apply_rotary_interleaved, 0, "the interleaved form"), (apply_rotary_exponent, 0, "the exponent is -2i/D")]
STUB = apply_rotary_stub
