"""Generator patterns around MatMul and Gemm, and sibling (horizontal) branches reading one tensor.

MatMul + Add (2-D and rank-3, bias of every broadcastable shape), Gemm with its transB/alpha/beta/C
forms, BatchNormalization after either, and activations FusedGemm takes; horizontal groups of 2-3
Conv/MatMul/Gemm siblings with the same or (near miss) different followers.
"""

from __future__ import annotations

import numpy as np

from .builder import Builder, Pattern, is_map, static_last
from .convs import activation, batchnorm, conv_apply, conv_spec

__all__ = ["linear_chain", "horizontal", "PATTERNS"]


def _bias_shape(b: Builder, out_shape: tuple) -> tuple[tuple, str]:
    n = int(out_shape[-1])
    choices = [((n,), "vector"), ((1, n), "row")]
    if b.miss("bias_shape"):
        kinds = [((1,) * (len(out_shape) + 1) + (n,), "rank_up")]
        if all(isinstance(d, int) for d in out_shape[-2:]):
            kinds.append((tuple(out_shape[-2:]), "full"))
        if len(out_shape) == 2 and isinstance(out_shape[0], int):
            kinds.append(((out_shape[0], 1), "column"))
        shape, kind = b.rng.choice(kinds)
        b.tags.append(f"nm:bias_{kind}")
        return shape, kind
    return b.rng.choice(choices)


def _matmul(b: Builder, x: str, n: int) -> str:
    shape = b.shape(x)
    k = int(shape[-1])
    wshape = (k, n)
    if b.miss("matmul_batched_weight"):
        wshape = (1, k, n)
        b.tags.append("nm:matmul_batched_weight")
    w = b.weight(wshape, "W", "MatMul", near_miss=b.miss("matmul_weight"))
    out = tuple(shape[:-1]) + (n,)
    if len(wshape) > len(shape):
        out = (1,) * (len(wshape) - len(shape)) + out
    return b.node("MatMul", [x, w], out)


def _gemm_spec(b: Builder, m) -> dict:
    spec = {"transB": b.rng.choice((None, None, 0, 1, 1)), "alpha": None, "beta": None,
            "c": b.opset < 11 or b.rng.random() < 0.75, "cfull": isinstance(m, int) and b.rng.random() < 0.15,
            "crow": b.rng.random() < 0.3}
    if b.rng.random() < 0.2:
        spec["alpha"] = b.rng.choice((0.5, 2.0))
    if b.rng.random() < 0.2:
        spec["beta"] = b.rng.choice((0.5, 2.0, 0.0))
    return spec


def _gemm(b: Builder, x: str, n: int, spec: dict | None = None) -> str:
    m, k = b.shape(x)
    k = int(k)
    spec = spec or _gemm_spec(b, m)
    attrs = {name: spec[name] for name in ("transB", "alpha", "beta") if spec[name] is not None}
    trans_b = bool(spec["transB"])
    w = b.weight((n, k) if trans_b else (k, n), "W", f"Gemm{int(trans_b)}", near_miss=b.miss("gemm_weight"))
    ins = [x, w]
    if spec["c"]:
        cshape = (m, n) if spec["cfull"] else (1, n) if spec["crow"] and b.opset >= 9 else (n,)
        ins.append(b.weight(cshape, "C", "Gemm_C", scale=0.3, near_miss=b.miss("gemm_c")))
    return b.node("Gemm", ins, (m, n), **attrs)


def linear_chain(b: Builder, x: str, pool: list[str]) -> str:
    """MatMul [+ bias Add] or Gemm, then [BN (2-D only)] and [activation]."""
    shape = b.shape(x)
    n = b.rng.choice((2, 4, 6, 8, 12, 16))
    gemm = len(shape) == 2 and b.rng.random() < 0.4
    if gemm:
        y = _gemm(b, x, n)
        b.tags.append("gemm")
    else:
        y = _matmul(b, x, n)
        b.tags.append(f"matmul{len(shape)}d")
        if b.rng.random() < 0.7:
            b.mark_inner(y)
            bshape, _ = _bias_shape(b, b.shape(y))
            if b.miss("bias_runtime"):
                bias = b.input(bshape, "bias")
                b.tags.append("nm:bias_runtime")
            else:
                bias = b.weight(bshape, "bias", "MatMul_bias", scale=0.3, near_miss=b.miss("bias_overridable"))
            y = b.binary("Add", y, bias)
            b.tags.append("matmul_add")
    if len(b.shape(y)) == 2 and b.rng.random() < 0.3:
        b.mark_inner(y)
        y = batchnorm(b, y)
        b.tags.append("bn")
    if b.rng.random() < 0.45:
        b.mark_inner(y)
        y = activation(b, y, family="gemm" if gemm else "conv")
        b.tags.append("act")
    if b.rng.random() < 0.15:
        same = [t for t in pool if b.shape(t) == b.shape(y) and t != y]
        if same:
            y = b.binary("Add", y, b.rng.choice(same))
            b.tags.append("residual")
    return y


def _follower(b: Builder, y: str, kind: str, alpha: float) -> str:
    if kind == "bias":
        shape = b.shape(y)
        c = int(shape[1]) if len(shape) == 4 else int(shape[-1])
        cshape = (c, 1, 1) if len(shape) == 4 else (c,)
        return b.binary("Add", y, b.const(b.rand(cshape, 0.3), "hb"))
    if kind == "bn":
        shape = b.shape(y)
        if len(shape) == 4 or (len(shape) == 2 and isinstance(shape[1], int)):
            return batchnorm(b, y)
        kind = "Relu"
    if kind == "LeakyRelu":
        return b.unary("LeakyRelu", y, alpha=alpha)
    return b.unary(kind, y)


def horizontal(b: Builder, x: str, pool: list[str]) -> list[str]:
    """2-3 sibling Conv / MatMul / Gemm reading `x`, each with the same (or, near miss, different) followers."""
    shape = b.shape(x)
    k = b.rng.choice((2, 2, 3))
    if len(shape) == 4:
        family = "conv"
    elif len(shape) == 2 and b.rng.random() < 0.4:
        family = "gemm"
    else:
        family = "matmul"
    b.tags.append(f"horizontal_{family}")
    followers = [b.rng.choice(("bias", "bn", "Relu", "LeakyRelu", "Sigmoid", "Tanh"))
                 for _ in range(b.rng.choice((0, 1, 1, 2)))]
    alpha = b.rng.choice((0.1, 0.2))
    spec = conv_spec(b, x, False) if family == "conv" else _gemm_spec(b, shape[0]) if family == "gemm" else None
    outs = []
    for i in range(k):
        if family == "conv":
            mine_spec = spec
            if i and b.miss("horizontal_attrs"):
                mine_spec = conv_spec(b, x, False)
                b.tags.append("nm:horizontal_attrs")
            y = conv_apply(b, x, mine_spec, cout=b.rng.choice((2, 3, 4, 6)))
        elif family == "gemm":
            y = _gemm(b, x, b.rng.choice((2, 3, 4, 8)), spec)
        else:
            y = _matmul(b, x, b.rng.choice((2, 3, 4, 8)))
        mine = list(followers)
        if mine and b.miss("horizontal_followers"):
            mine[-1] = b.rng.choice(("Relu", "Sigmoid", "bias"))
            b.tags.append("nm:horizontal_followers")
        a = alpha if not b.miss("horizontal_alpha") else alpha * 2
        for f in mine:
            b.mark_inner(y)
            y = _follower(b, y, f, a)
        outs.append(y)
    if family == "conv" and b.rng.random() < 0.3 and len({b.shape(o)[2:] for o in outs}) == 1:
        n, _, hh, ww = b.shape(outs[0])
        c = sum(int(b.shape(o)[1]) for o in outs)
        return [b.node("Concat", outs, (n, c, hh, ww), axis=1)]
    return outs


def _rows(b: Builder, x: str) -> bool:
    """[batch, features] or [batch, seq, hidden] with a static last dimension."""
    return len(b.shape(x)) in (2, 3) and static_last(b, x)


PATTERNS = (
    Pattern(linear_chain, lambda b, x: 4.0 if _rows(b, x) else 0.0),
    Pattern(horizontal, lambda b, x: 1.5 if _rows(b, x) else 1.8 if is_map(b, x) and b.dtype != np.float64 else 0.0),
)
