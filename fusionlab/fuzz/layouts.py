"""Generator patterns for channels-last blocks (ConvNeXt): Transpose pairs around elementwise ops, layer-scale.

On an NCHW map x: ``Transpose(x, [0, 2, 3, 1])`` into NHWC, then either

- an elementwise chain (Mul/Add by per-channel constants, an activation, Add of another NCHW tensor that is
  itself transposed) and ``Transpose(., [0, 3, 1, 2])`` back: what ``transpose_cancel`` removes; or
- ConvNeXt's pointwise MLP (MatMul [+ bias] [-> activation] -> MatMul [+ bias]), ``Transpose`` back, a
  layer-scale ``Mul(gamma[C, 1, 1])`` and the residual Add: what ``layer_scale`` folds into the second MatMul
  (and ``transpose_cancel`` when the residual is itself transposed).

Near misses: a back-Transpose that is not the inverse, an operand that is neither a constant nor transposed
(a graph input in NHWC), an op with an axis (Softmax) in the chain, a constant of higher rank than the map
(it would broadcast the result up), gamma that is not per channel ([1, H, 1] or [C, H, W]), gamma as a
run-time input.
"""

from __future__ import annotations

import numpy as np

from .builder import Builder, Pattern, is_map
from .convs import activation

__all__ = ["channels_last", "PATTERNS"]

TO_LAST, TO_FIRST = [0, 2, 3, 1], [0, 3, 1, 2]


def _permuted(shape, perm) -> tuple:
    return tuple(shape[p] for p in perm)


def _transpose(b: Builder, x: str, perm: list[int]) -> str:
    return b.node("Transpose", [x], _permuted(b.shape(x), perm), perm=list(perm))


def _back(b: Builder, y: str) -> str:
    perm = TO_FIRST
    if len(b.shape(y)) == 5:  # a rank-up constant broadcast the chain up: back to channels-first all the same
        perm = [0, 1, 4, 2, 3]
    elif b.miss("tc_perm"):
        perm = b.rng.choice(([0, 3, 2, 1], [0, 1, 3, 2], [0, 2, 1, 3]))
        b.tags.append("nm:tc_not_inverse")
    return _transpose(b, y, perm)


def _elementwise(b: Builder, t: str, pool: list[str]) -> str:
    """1-3 elementwise ops on NHWC `t`, constants per channel (the last axis)."""
    n, hgt, wid, c = b.shape(t)
    cur = t
    for _ in range(b.rng.randint(1, 3)):
        b.mark_inner(cur)
        kind = b.rng.choice(("scale", "shift", "act", "residual"))
        if kind in ("scale", "shift"):
            shape = b.rng.choice(((c,), (1, 1, c), (1, 1, 1, c)))
            if b.miss("tc_rank_up"):
                shape = (1, 1, 1, 1, c)
                b.tags.append("nm:tc_rank_up")
            op = "Mul" if kind == "scale" else b.rng.choice(("Add", "Sub"))
            cur = b.binary(op, cur, b.const(b.rand(shape, 0.5 if op != "Mul" else 1.0), "cl_k"))
        elif kind == "act":
            if b.miss("tc_axis_op"):
                cur = b.unary("Softmax", cur, axis=b.rng.choice((-1, 1)))
                b.tags.append("nm:tc_softmax")
            else:
                cur = b.unary(b.rng.choice(("Relu", "Sigmoid", "Tanh", "Neg", "Abs")), cur)
        else:
            others = [p for p in pool if b.shape(p) == _permuted(b.shape(cur), TO_FIRST) and p != t]
            if b.miss("tc_raw_operand") or not others:
                other = b.input(b.shape(cur), "nhwc")  # neither a constant nor a Transpose: refused
                b.tags.append("nm:tc_raw_operand")
            else:
                other = _transpose(b, b.rng.choice(others), TO_LAST)
            cur = b.binary("Add", cur, other)
    return cur


def _mlp(b: Builder, t: str) -> str:
    """ConvNeXt's pointwise MLP on NHWC `t`: MatMul [+ b] [-> act] -> MatMul [+ b], back to C channels."""
    c = int(b.shape(t)[-1])
    d = b.rng.choice((c, 2 * c, 4 * c))
    y = b.node("MatMul", [t, b.weight((c, d), "W", "MatMul")], b.shape(t)[:-1] + (d,))
    if b.rng.random() < 0.7:
        b.mark_inner(y)
        y = b.binary("Add", y, b.weight((d,), "bias", "MatMul_bias", scale=0.3))
    if b.rng.random() < 0.6:
        b.mark_inner(y)
        y = activation(b, y, family="gemm")
    b.mark_inner(y)
    y = b.node("MatMul", [y, b.weight((d, c), "W", "MatMul")], b.shape(y)[:-1] + (c,))
    if b.rng.random() < 0.8:
        b.mark_inner(y)
        y = b.binary("Add", y, b.weight((c,), "bias", "MatMul_bias", scale=0.3))
    return y


def _gamma(b: Builder, shape: tuple) -> str:
    _, c, hgt, wid = shape
    gshape = (c, 1, 1)
    if b.miss("ls_shape"):
        gshape = b.rng.choice(((1, hgt, 1), (c, hgt, wid)))
        b.tags.append("nm:ls_not_per_channel")
    if b.miss("ls_runtime"):
        b.tags.append("nm:ls_runtime")
        return b.input(gshape, "gamma")
    overridable = b.miss("ls_overridable")
    if overridable:
        b.tags.append("nm:ls_overridable")
    return b.param(b.rand(gshape, 0.4, positive=True), "gamma", near_miss=overridable)


def channels_last(b: Builder, x: str, pool: list[str]) -> str:
    """Transpose to NHWC, an elementwise chain or ConvNeXt's MLP, Transpose back; layer-scale and residual."""
    shape = b.shape(x)
    t = _transpose(b, x, TO_LAST)
    b.mark_inner(t)
    if b.rng.random() < 0.45:
        b.tags.append("transpose_pair")
        y = _back(b, _elementwise(b, t, pool + [x]))
        return y
    b.tags.append("layer_scale")
    y = _mlp(b, t)
    b.mark_inner(y)
    back = _back(b, y)
    if b.shape(back) != shape:
        return back
    b.mark_inner(back)
    y = b.binary("Mul", back, _gamma(b, shape))
    if b.rng.random() < 0.7:
        b.mark_inner(y)
        y = b.binary("Add", y, x)
        b.tags.append("residual")
    return y


PATTERNS = (Pattern(channels_last, lambda b, x: 1.2 if is_map(b, x) and b.dtype != np.float64 else 0.0),)
