"""Generator patterns for LayerNorm: the decomposed form exporters write, and Add + LayerNormalization.

Decomposed: mean = ReduceMean(x), d = x - mean, var = ReduceMean(d^2 or d*d), n = d / sqrt(var + eps)
(or d * Reciprocal(...)), then optional * gamma, + beta. Near misses: Pow(d, 2.0015), eps of rank 3-5,
reduction over the wrong axis, gamma/beta that are run-time inputs, the variance of another tensor. A quarter of
the norms have freshly initialised weights: gamma exactly one, beta exactly zero (what an export of an untrained
model holds; the scale Mul is then a no-op a fold may remove, on whichever side the weight is).
"""

from __future__ import annotations

import numpy as np

from .builder import Builder, Pattern, static_last
from .gelus import bias_add

__all__ = ["reduce", "layernorm", "add_layernorm", "PATTERNS"]


def reduce(b: Builder, op: str, x: str, axes: list[int] | None, keepdims: int = 1) -> str:
    """A Reduce* node with axes as an attribute (before opset 18; 13 for ReduceSum) or as an input."""
    shape = b.shape(x)
    rank = len(shape)
    norm = sorted(a % rank for a in axes) if axes is not None else list(range(rank))
    out = tuple((1 if i in norm else d) for i, d in enumerate(shape) if keepdims or i not in norm)
    attrs = {} if keepdims == 1 and b.rng.random() < 0.6 else {"keepdims": keepdims}
    input_axes = b.opset >= 18 or (op == "ReduceSum" and b.opset >= 13)
    if axes is None:
        return b.node(op, [x], out, **attrs)
    if input_axes:
        return b.node(op, [x, b.ints(axes, "axes")], out, **attrs)
    return b.node(op, [x], out, axes=list(axes), **attrs)


def _axis(b: Builder, rank: int) -> list[int]:
    return [b.rng.choice((-1, rank - 1))]


def layernorm(b: Builder, x: str, pool: list[str]) -> str:
    """The decomposed LayerNorm over the last axis (with its near misses)."""
    shape = b.shape(x)
    rank = len(shape)
    h = shape[-1]
    b.tags.append("layernorm")
    axes = _axis(b, rank)
    if rank >= 2 and b.miss("ln_axes"):
        axes = [b.rng.choice((-2, 0))] if b.rng.random() < 0.7 else [-2, -1]
        b.tags.append("nm:ln_axes")
    mean = reduce(b, "ReduceMean", x, axes)
    d = b.binary("Sub", x, mean, swap=False)
    if b.rng.random() < 0.5:
        e = 2.0
        if b.miss("ln_pow"):
            e = 2.0015
            b.tags.append("nm:ln_pow_2.0015")
        sq = b.binary("Pow", d, b.scalar(e, "two"), swap=False)
    else:
        sq = b.binary("Mul", d, d, swap=False)
    var = reduce(b, "ReduceMean", sq, axes)
    rank_up = b.miss("ln_eps_rank")
    if rank_up:
        b.tags.append("nm:rank_up")
    eps = b.scalar(b.rng.choice((1e-5, 1e-6, 1e-12)), "eps", rank_up=rank_up)
    ve = b.binary("Add", var, eps)
    s = b.unary("Sqrt", ve)
    if b.rng.random() < 0.8:
        n = b.binary("Div", d, s, swap=False)
    else:
        n = b.binary("Mul", d, b.unary("Reciprocal", s))
    b.mark_inner(mean, d, sq, var, ve, s)
    y = n
    if isinstance(h, int) and b.rng.random() < 0.9:
        fresh = b.rng.random() < 0.25  # a freshly initialised norm: gamma exactly one, beta exactly zero
        if fresh:
            b.tags.append("ln_fresh_weights")
        b.mark_inner(y)
        gamma = b.const(np.ones((h,), dtype=b.dtype), "gamma") if fresh else \
            b.weight((h,), "gamma", "ln_gamma", near_miss=b.miss("ln_gamma"))
        y = b.binary("Mul", y, gamma)  # either operand order (Hugging Face writes weight * hidden)
        if b.rng.random() < 0.75:
            b.mark_inner(y)
            beta = b.const(np.zeros((h,), dtype=b.dtype), "beta") if fresh else \
                b.weight((h,), "beta", "ln_beta", scale=0.3, near_miss=b.miss("ln_beta"))
            y = b.binary("Add", y, beta)
    return y


def add_layernorm(b: Builder, x: str, pool: list[str]) -> str:
    """[x + bias ->] x + skip (a tensor of the same shape or a bias) -> LayerNormalization (opset 17+):
    SkipLayerNorm's pattern, with its bias input (in every dtype the generator picks: float16 too, which the
    Skip*LayerNormalization kernels take)."""
    shape = b.shape(x)
    h = shape[-1]
    if b.opset < 17 or not isinstance(h, int):
        return layernorm(b, x, pool)
    b.tags.append("add_layernorm")
    same = [t for t in pool if b.shape(t) == shape and t != x]
    if b.rng.random() < 0.35:  # the projection's bias first (BERT's MatMul -> + bias -> + residual -> LN)
        x = bias_add(b, x)
        b.mark_inner(x)
        b.tags.append("skip_bias")
    if same and b.rng.random() < 0.8:
        skip = b.rng.choice(same)
    elif b.rng.random() < 0.5:
        skip = b.input(shape, "skip")
    else:
        skip = b.const(b.rand((h,), 0.3), "skipb")
        b.tags.append("nm:skip_is_bias")
    a = b.binary("Add", x, skip)
    b.mark_inner(a)
    attrs: dict = {}
    axis = -1
    if len(shape) >= 2 and b.miss("ln_node_axis"):
        axis = -2
        b.tags.append("nm:ln_node_axis")
    if axis != -1 or b.rng.random() < 0.3:
        attrs["axis"] = axis
    if b.rng.random() < 0.5:
        attrs["epsilon"] = b.rng.choice((1e-5, 1e-12))
    norm_shape = tuple(shape[axis:])
    if not all(isinstance(d, int) for d in norm_shape):
        attrs.pop("axis", None)
        norm_shape = (h,)
    fresh = b.rng.random() < 0.2  # scale exactly one, bias exactly zero
    if fresh:
        b.tags.append("ln_fresh_weights")
    ins = [a, b.const(np.ones(norm_shape, dtype=b.dtype), "lng") if fresh else b.weight(norm_shape, "lng", "ln_scale")]
    if b.rng.random() < 0.7:
        ins.append(b.const(np.zeros(norm_shape, dtype=b.dtype), "lnb") if fresh else
                   b.weight(norm_shape, "lnb", "ln_bias", scale=0.3))
    return b.node("LayerNormalization", ins, shape, **attrs)


def _normable(b: Builder, x: str) -> bool:
    return len(b.shape(x)) >= 2 and static_last(b, x)


PATTERNS = (
    Pattern(layernorm, lambda b, x: (2.0 if len(b.shape(x)) == 3 else 0.6) if _normable(b, x) else 0.0),
    Pattern(add_layernorm, lambda b, x: (1.2 if len(b.shape(x)) == 3 else 0.3)
            if _normable(b, x) and b.opset >= 17 else 0.0),
)
