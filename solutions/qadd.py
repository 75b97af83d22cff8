"""The second exercise of notebook 14: add two differently scaled uint8 tensors, as a residual QLinearAdd does."""

import numpy as np


def qlinear_add(qa, sa, za, qb, sb, zb, sy, zy):
    """Reference: one multiplier per input onto the output's scale, round half to even, add z_y, saturate."""
    a = qa.astype(np.int32) - za
    b = qb.astype(np.int32) - zb
    v = np.float32(sa) / np.float32(sy) * a.astype(np.float32) + np.float32(sb) / np.float32(sy) * b.astype(np.float32)
    return np.clip(np.rint(v) + zy, 0, 255).astype(np.uint8)


def qlinear_add_dequantized(qa, sa, za, qb, sb, zb, sy, zy):
    """Also right: back to real numbers in float64, added, quantized onto the output's grid."""
    real = sa * (qa.astype(np.float64) - za) + sb * (qb.astype(np.float64) - zb)
    return np.clip(np.rint(real / sy) + zy, 0, 255).astype(np.uint8)


def qlinear_add_integers(qa, sa, za, qb, sb, zb, sy, zy):
    """WRONG: adds the integers as they are, as if both inputs and the output shared one scale."""
    return np.clip(qa.astype(np.int32) - za + qb.astype(np.int32) - zb + zy, 0, 255).astype(np.uint8)


def qlinear_add_one_multiplier(qa, sa, za, qb, sb, zb, sy, zy):
    """WRONG: one multiplier, s_a / s_y, for both inputs."""
    v = (qa.astype(np.int32) - za + qb.astype(np.int32) - zb) * (sa / sy)
    return np.clip(np.rint(v) + zy, 0, 255).astype(np.uint8)


def qlinear_add_uint8_difference(qa, sa, za, qb, sb, zb, sy, zy):
    """WRONG: subtracts the zero points from the uint8 arrays as they are: q - z wraps around below 0."""
    v = (sa * (qa - za) + sb * (qb - zb)) / sy
    return np.clip(np.rint(v) + zy, 0, 255).astype(np.uint8)


def qlinear_add_round_half_up(qa, sa, za, qb, sb, zb, sy, zy):
    """WRONG: rounds a tie up (floor(v + 0.5)); QLinearAdd rounds it to even."""
    v = (sa * (qa.astype(np.float64) - za) + sb * (qb.astype(np.float64) - zb)) / sy
    return np.clip(np.floor(v + 0.5) + zy, 0, 255).astype(np.uint8)


def qlinear_add_no_clip(qa, sa, za, qb, sb, zb, sy, zy):
    """WRONG: casts to uint8 without saturating, so sums past 255 or below 0 wrap around."""
    v = (sa * (qa.astype(np.float64) - za) + sb * (qb.astype(np.float64) - zb)) / sy
    return (np.rint(v) + zy).astype(np.int64).astype(np.uint8)


def qlinear_add_stub(qa, sa, za, qb, sb, zb, sy, zy):
    raise NotImplementedError

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "qadd"
REFERENCE = qlinear_add
WRONG = [(qlinear_add_integers, 1, "integers added as they are"), (qlinear_add_one_multiplier, 1, "used for both"),
         (qlinear_add_uint8_difference, 0, "computed in uint8 wraps around"),
         (qlinear_add_round_half_up, 3, "a tie rounded up"), (qlinear_add_no_clip, 0, "no saturation")]
STUB = qlinear_add_stub
