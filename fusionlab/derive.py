"""The algebra behind each fusion, as small functions a notebook can show and a test can check.

Conv + BatchNormalization (inference mode) is an affine map per output channel after a linear op:

    BN(y) = γ · (y − μ) / √(σ² + ε) + β = s · y + (β − s·μ),   s = γ / √(σ² + ε)

and Conv is linear in its weights, so  BN(Conv(x, W) + b) = Conv(x, s·W) + (s·(b − μ) + β).
The seed's formula `b' = β − γμ/√(σ²+ε)` is the special case b = 0.

Folding is computed in float64 and cast back to the model's dtype once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["bn_scale_shift", "fold_conv_bn", "fold_matmul_bn", "fold_gemm_bn", "Folded"]


@dataclass
class Folded:
    """Folded weight and bias, plus what folding in the model's own dtype would have cost."""

    weight: np.ndarray
    bias: np.ndarray
    overflow: bool = False  # folded values exceed the dtype's range (e.g. fp16 > 65504)


def bn_scale_shift(gamma, beta, mean, var, eps: float = 1e-5):
    """Per-channel (scale, shift) of an inference-mode BatchNormalization, in float64."""
    gamma, beta, mean, var = (np.asarray(a, dtype=np.float64) for a in (gamma, beta, mean, var))
    scale = gamma / np.sqrt(var + float(eps))
    shift = beta - scale * mean
    return scale, shift


def _cast_back(w64: np.ndarray, b64: np.ndarray, dtype) -> Folded:
    dtype = np.dtype(dtype)
    overflow = False
    if dtype.kind == "f":
        big = np.finfo(dtype).max
        overflow = bool(np.any(np.abs(w64) > big) or np.any(np.abs(b64) > big))
    with np.errstate(over="ignore"):
        return Folded(w64.astype(dtype), b64.astype(dtype), overflow)


def fold_conv_bn(weight, bias, gamma, beta, mean, var, eps: float = 1e-5, *, group: int = 1,
                 transpose: bool = False) -> Folded:
    """Fold an inference-mode BN into the preceding Conv (or ConvTranspose) weight and bias.

    Conv weight is (C_out, C_in/group, *k): output channels are axis 0.
    ConvTranspose weight is (C_in, C_out/group, *k): output channel `g*C_out/group + j` lives at
    axis 1 index j of the rows belonging to group g.
    `bias` may be None (a Conv without bias).
    """
    w = np.asarray(weight)
    dtype = w.dtype
    w64 = w.astype(np.float64)
    scale, shift = bn_scale_shift(gamma, beta, mean, var, eps)
    c_out = scale.shape[0]
    b64 = np.zeros(c_out) if bias is None else np.asarray(bias, dtype=np.float64)
    if not transpose:
        if w64.shape[0] != c_out:
            raise ValueError(f"Conv weight has {w64.shape[0]} output channels, BN has {c_out}")
        w_new = w64 * scale.reshape((-1,) + (1,) * (w64.ndim - 1))
    else:
        c_in, per_group = w64.shape[0], w64.shape[1]
        if per_group * group != c_out or c_in % group:
            raise ValueError(f"ConvTranspose weight {w64.shape} with group={group} does not give {c_out} channels")
        # (group, C_in/group, C_out/group, *k): scale axis 2 by the slice of `scale` for that group
        wg = w64.reshape((group, c_in // group, per_group) + w64.shape[2:])
        sg = scale.reshape(group, 1, per_group, *([1] * (w64.ndim - 2)))
        w_new = (wg * sg).reshape(w64.shape)
    b_new = scale * (b64 - np.asarray(mean, dtype=np.float64)) + np.asarray(beta, dtype=np.float64)
    return _cast_back(w_new, b_new, dtype)


def fold_matmul_bn(weight, bias, gamma, beta, mean, var, eps: float = 1e-5) -> Folded:
    """Fold BN over the last axis into `y = x @ W + b` (W is (K, N); BN channels are N)."""
    w = np.asarray(weight)
    scale, shift = bn_scale_shift(gamma, beta, mean, var, eps)
    b64 = np.zeros(w.shape[-1]) if bias is None else np.asarray(bias, dtype=np.float64)
    w_new = w.astype(np.float64) * scale
    b_new = scale * (b64 - np.asarray(mean, dtype=np.float64)) + np.asarray(beta, dtype=np.float64)
    return _cast_back(w_new, b_new, w.dtype)


def fold_gemm_bn(weight, bias, gamma, beta, mean, var, eps: float = 1e-5, *, trans_b: bool = False) -> Folded:
    """Fold BN into Gemm(A, B, C) with B (K, N), or (N, K) when transB=1."""
    w = np.asarray(weight)
    if trans_b:
        f = fold_matmul_bn(w.T, bias, gamma, beta, mean, var, eps)
        return Folded(np.ascontiguousarray(f.weight.T), f.bias, f.overflow)
    return fold_matmul_bn(w, bias, gamma, beta, mean, var, eps)
