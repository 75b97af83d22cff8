"""Generator patterns for LayerNorm and RMSNorm: the decomposed forms exporters write, and Add + the norm.

Decomposed: mean = ReduceMean(x), d = x - mean, var = ReduceMean(d^2 or d*d), n = d / sqrt(var + eps)
(or d * Reciprocal(...)), then optional * gamma, + beta. Near misses: Pow(d, 2.0015), eps of rank 3-5,
reduction over the wrong axis, gamma/beta that are run-time inputs, the variance of another tensor. A quarter of
the norms have freshly initialised weights: gamma exactly one, beta exactly zero (what an export of an untrained
model holds; the scale Mul is then a no-op a fold may remove, on whichever side the weight is).

RMSNorm (`rmsnorm`, `add_rmsnorm`) as Hugging Face models are exported: LLaMA's
``weight * (x.to(float32) * rsqrt(x.to(float32).pow(2).mean(-1) + eps)).to(dtype)`` (the Casts identities on
float32, real on float16; T5's half-precision form casts x twice), the square as Pow(x, 2) or x * x, the
inverse root as Sqrt + Reciprocal, Div(1, Sqrt), x / Sqrt or Pow(., -0.5), every commutative operand order,
the weight first or last (or exactly one, or read by another node too), after a residual Add [+ a bias] whose
sum may be read again (the final norm and pre-norm blocks). Near misses: Pow(x, 2.0015), the mean over another
axis, epsilon of rank 3-5 or added after the root, a Cast to a *different* type (float32 -> float16, float64 ->
float32: lossy, never an identity), an overridable weight, a residual that is a broadcast bias.
"""

from __future__ import annotations

import numpy as np

from .builder import Builder, DTYPES, Pattern, broadcast, static_last
from .gelus import bias_add

_F32, _F16 = np.dtype(np.float32), np.dtype(np.float16)

__all__ = ["reduce", "layernorm", "add_layernorm", "rmsnorm", "add_rmsnorm", "PATTERNS"]


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
    shape = b.shape(a)  # a near-miss bias of higher rank broadcasts x up: the norm keeps the sum's shape
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


def _cast(b: Builder, x: str, dt) -> str:
    return b.node("Cast", [x], b.shape(x), to=DTYPES[np.dtype(dt)], dtype=dt)


def _op(b: Builder, op: str, a: str, c: str, dt, *, swap: bool | None = None) -> str:
    """a <op> c in dtype `dt` (the operands of Add/Mul swapped at random)."""
    if swap is None:
        swap = op in ("Add", "Mul") and b.rng.random() < 0.5

    return b.node(op, [c, a] if swap else [a, c], broadcast(b.shape(a), b.shape(c)), dtype=dt)


def rmsnorm(b: Builder, x: str, pool: list[str]) -> str:
    """The decomposed RMSNorm over the last axis as Hugging Face models are exported (with near misses)."""
    shape = b.shape(x)
    rank, h = len(shape), shape[-1]
    b.tags.append("rmsnorm")
    dt = b.dtype_of(x)
    cdt, xf, xm = dt, x, x  # the compute dtype; x for the variance; x for the product
    if dt in (_F32, _F16) and b.rng.random() < 0.6:  # LLaMA / T5: hidden.to(torch.float32)
        cdt = _F32
        if b.miss("rms_cast_other"):
            cdt = _F16 if dt == _F32 else _F32  # float32 -> float16 is lossy: no identity
            b.tags.append("nm:rms_cast_other")
        xf = xm = _cast(b, x, cdt)
        b.tags.append("rms_cast" + ("_identity" if cdt == dt else ""))
        if b.rng.random() < 0.3:  # T5 in half precision: a second Cast for the product
            xm = _cast(b, x, cdt)
            b.tags.append("rms_twin_cast")
    elif dt == np.dtype(np.float64) and b.miss("rms_cast_down"):
        cdt = _F32
        xf = xm = _cast(b, x, cdt)
        b.tags.append("nm:rms_cast_down")
    axes = _axis(b, rank)
    if rank >= 2 and b.miss("rms_axes"):
        axes = [b.rng.choice((-2, 0))]
        b.tags.append("nm:rms_axes")
    if b.rng.random() < 0.6:
        e = 2.0
        if b.miss("rms_pow"):
            e = 2.0015
            b.tags.append("nm:rms_pow_2.0015")
        sq = _op(b, "Pow", xf, b.scalar(e, "two", dtype=cdt), cdt, swap=False)
    else:
        sq = _op(b, "Mul", xf, xf, cdt, swap=False)
    mean = reduce(b, "ReduceMean", sq, axes)
    if cdt != b.dtype:
        b.types[mean] = cdt
    rank_up = b.miss("rms_eps_rank")
    if rank_up:
        b.tags.append("nm:rank_up")
    eps = b.scalar(b.rng.choice((1e-5, 1e-6)), "eps", rank_up=rank_up, dtype=cdt)
    form = b.rng.choice(("reciprocal", "div1", "divx", "pow"))
    b.tags.append(f"rms_{form}")
    after = b.miss("rms_eps_after_root")
    if after:  # sqrt(mean) + eps: another function
        b.tags.append("nm:rms_eps_after_root")
        root = _op(b, "Add", b.node("Sqrt", [mean], b.shape(mean), dtype=cdt), eps, cdt)
        form = b.rng.choice(("reciprocal", "div1", "divx"))
    else:
        ve = _op(b, "Add", mean, eps, cdt)
        root = b.node("Sqrt", [ve], b.shape(ve), dtype=cdt) if form != "pow" else None
        b.mark_inner(ve)
    if form == "divx":
        n = _op(b, "Div", xm, root, cdt)
    else:
        if form == "pow":
            inv = _op(b, "Pow", ve, b.scalar(-0.5, "mhalf", dtype=cdt), cdt, swap=False)
        elif form == "div1":
            inv = _op(b, "Div", b.scalar(1.0, "one", dtype=cdt), root, cdt)
        else:
            inv = b.node("Reciprocal", [root], b.shape(root), dtype=cdt)
        b.mark_inner(inv)
        n = _op(b, "Mul", xm, inv, cdt)
    b.mark_inner(sq, mean)
    y = n
    if cdt != dt:
        b.mark_inner(y)
        y = _cast(b, y, dt)  # .to(input_dtype)
    elif xf != x and b.rng.random() < 0.7:
        b.mark_inner(y)
        y = _cast(b, y, dt)  # an identity Cast back (float32 -> float32)
    if isinstance(h, int) and b.rng.random() < 0.92:
        fresh = b.rng.random() < 0.2  # a freshly initialised norm: weight exactly one
        if fresh:
            b.tags.append("rms_fresh_weight")
        gamma = b.const(np.ones((h,), dtype=dt), "rmsw") if fresh else \
            b.param((1 + b.rand((h,), 0.2)).astype(dt), "rmsw", near_miss=b.miss("rms_weight"))
        b.mark_inner(y)
        y = _op(b, "Mul", y, gamma, dt)  # Hugging Face: weight * hidden; either side here
        if b.miss("rms_weight_read_elsewhere"):
            b.tags.append("nm:rms_weight_read_elsewhere")
            pool.append(_op(b, "Add", x, gamma, dt))
    return y


def add_rmsnorm(b: Builder, x: str, pool: list[str]) -> list[str] | str:
    """A residual Add [+ a [H] bias on one operand first], then the decomposed RMSNorm: SkipSimplifiedLayerNorm's
    pattern. The sum stays live for later patterns (pre-norm blocks read it again) in some models."""
    shape = b.shape(x)
    h = shape[-1]
    if not isinstance(h, int) or len(shape) not in (2, 3):
        return rmsnorm(b, x, pool)
    b.tags.append("add_rmsnorm")
    same = [t for t in pool if b.shape(t) == shape and t != x and b.dtype_of(t) == b.dtype_of(x)]
    if b.miss("rms_skip_is_bias"):
        skip = b.const(b.rand((h,), 0.3), "skipb")
        b.tags.append("nm:skip_is_bias")
    elif same and b.rng.random() < 0.7:
        skip = b.rng.choice(same)
    else:
        skip = b.input(shape, "skip")
    z = x
    if b.rng.random() < 0.3:
        b.tags.append("rms_bias")
        z = b.binary("Add", x, b.const(b.rand((h,), 0.3), "bias"))
        b.mark_inner(z)
    a = b.binary("Add", z, skip)
    y = rmsnorm(b, a, pool)
    if b.rng.random() < 0.4:
        b.tags.append("rms_sum_read_again")
        return [y, a]
    b.mark_inner(a)
    return y


def _normable(b: Builder, x: str) -> bool:
    return len(b.shape(x)) >= 2 and static_last(b, x)


PATTERNS = (
    Pattern(layernorm, lambda b, x: (2.0 if len(b.shape(x)) == 3 else 0.6) if _normable(b, x) else 0.0),
    Pattern(add_layernorm, lambda b, x: (1.2 if len(b.shape(x)) == 3 else 0.3)
            if _normable(b, x) and b.opset >= 17 else 0.0),
    Pattern(rmsnorm, lambda b, x: (1.0 if len(b.shape(x)) == 3 else 0.3) if _normable(b, x) else 0.0),
    Pattern(add_rmsnorm, lambda b, x: (1.2 if len(b.shape(x)) == 3 else 0.3) if _normable(b, x) else 0.0),
)
