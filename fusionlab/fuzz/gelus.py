"""Generator patterns for GELU (erf and tanh forms, every operand order, with a bias Add) and SiLU.

Near misses: a constant off by ~0.1% (0.4996 for 0.5, 1.4152 for sqrt 2, 0.7971 for sqrt(2/pi), 0.0447
for 0.044715, Pow 3.001), a size-1 constant of higher rank ([1,1,1]) that broadcasts the output up, the
outer Mul reading a different tensor than the Erf, a bias of higher rank.
"""

from __future__ import annotations

import math

import numpy as np

from .builder import Builder, Pattern

__all__ = ["erf_gelu", "tanh_gelu", "silu", "bias_add", "PATTERNS"]

SQRT2 = math.sqrt(2.0)
SQRT_2_PI = math.sqrt(2.0 / math.pi)


def _k(b: Builder, value: float, near: float, tag: str, base: str) -> str:
    """The constant `value`, or (near miss) `near`; or of rank 3-5 with a single element (broadcasts up)."""
    if b.miss(tag):
        b.tags.append(f"nm:{tag}")
        value = near
    rank_up = b.miss(tag + "_rank")
    if rank_up:
        b.tags.append("nm:rank_up")
    return b.scalar(value, base, rank_up=rank_up)


def bias_add(b: Builder, x: str) -> str:
    """x + bias over the last axis (the bias of BiasGelu / FastGelu); a higher-rank bias as a near miss."""
    n = b.shape(x)[-1]
    if not isinstance(n, int):
        return x
    shape = (n,)
    if b.miss("gelu_bias_rank"):
        shape = (1,) * len(b.shape(x)) + (n,)
        b.tags.append("nm:gelu_bias_rank")
    elif b.rng.random() < 0.2:
        shape = (1, n)
    return b.binary("Add", x, b.weight(shape, "gb", "gelu_bias", scale=0.3, near_miss=b.miss("gelu_bias_const")))


def erf_gelu(b: Builder, x: str, pool: list[str]) -> str:
    """x * 0.5 * (1 + erf(x / sqrt 2)) in one of its arrangements, or opset-20 Gelu; optional bias Add before."""
    if b.rng.random() < 0.4:
        x = bias_add(b, x)
        b.mark_inner(x)
        b.tags.append("bias")
    if b.opset >= 20 and b.rng.random() < 0.2:
        b.tags.append("gelu_op")
        return b.unary("Gelu", x)
    b.tags.append("erf_gelu")
    if b.rng.random() < 0.5:
        a = b.binary("Div", x, _k(b, SQRT2, 1.4152, "gelu_sqrt2", "sqrt2"), swap=False)
    else:
        a = b.binary("Mul", x, _k(b, 1 / SQRT2, 0.7066, "gelu_sqrt2", "isqrt2"))
    e = b.unary("Erf", a)
    p = b.binary("Add", e, _k(b, 1.0, 1.001, "gelu_one", "one"))
    other = x
    if b.miss("gelu_other"):
        same = [t for t in pool if b.shape(t) == b.shape(x) and t != x]
        if same:
            other = b.rng.choice(same)
            b.tags.append("nm:gelu_other_operand")
    half = _k(b, 0.5, 0.4996, "gelu_half", "half")
    form = b.rng.randrange(3)
    if form == 0:
        hx = b.binary("Mul", other, half)
        y = b.binary("Mul", hx, p)
    elif form == 1:
        q = b.binary("Mul", other, p)
        b.mark_inner(q)
        y = b.binary("Mul", q, half)
    else:
        q = b.binary("Mul", p, half)
        b.mark_inner(q)
        y = b.binary("Mul", other, q)
    b.mark_inner(a, e, p)
    return y


def _cube(b: Builder, x: str) -> str:
    form = b.rng.randrange(3)
    if form == 0:
        if b.miss("pow3"):
            b.tags.append("nm:pow_3.001")
            return b.binary("Pow", x, b.scalar(3.001, "three"), swap=False)
        dt = b.dtype if b.opset < 12 or b.rng.random() < 0.6 else np.dtype(b.rng.choice((np.float32, np.int64)))
        return b.binary("Pow", x, b.scalar(3.0 if dt.kind == "f" else 3, "three", dtype=dt), swap=False)
    sq = b.binary("Mul", x, x)
    b.mark_inner(sq)
    return b.binary("Mul", sq, x)


def tanh_gelu(b: Builder, x: str, pool: list[str]) -> str:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in several arrangements, or opset-20 Gelu(tanh)."""
    if b.rng.random() < 0.4:
        x = bias_add(b, x)
        b.mark_inner(x)
        b.tags.append("bias")
    if b.opset >= 20 and b.rng.random() < 0.2:
        b.tags.append("gelu_tanh_op")
        return b.unary("Gelu", x, approximate="tanh")
    b.tags.append("tanh_gelu")
    c3 = _k(b, 0.044715, 0.0447, "fastgelu_c3", "c3")
    if b.rng.random() < 0.6:
        cube = _cube(b, x)
        inner = b.binary("Add", x, b.binary("Mul", cube, c3))
        b.mark_inner(cube)
    else:  # x * (1 + 0.044715 x^2)
        sq = b.binary("Mul", x, x)
        inner = b.binary("Mul", x, b.binary("Add", b.binary("Mul", sq, c3), b.scalar(1.0, "one")))
        b.mark_inner(sq)
    u = b.binary("Mul", inner, _k(b, SQRT_2_PI, 0.7971, "fastgelu_c1", "c1"))
    t = b.unary("Tanh", u)
    p = b.binary("Add", t, _k(b, 1.0, 1.001, "fastgelu_one", "one"))
    half = _k(b, 0.5, 0.4996, "fastgelu_half", "half")
    if b.rng.random() < 0.5:
        y = b.binary("Mul", b.binary("Mul", x, half), p)
    else:
        y = b.binary("Mul", b.binary("Mul", x, p), half)
    b.mark_inner(inner, u, t, p)
    return y


def silu(b: Builder, x: str, pool: list[str]) -> str:
    """x * sigmoid(x) (either operand order); near miss: the Mul reads another tensor."""
    b.tags.append("silu")
    s = b.unary("Sigmoid", x)
    other = x
    if b.miss("silu_other"):
        same = [t for t in pool if b.shape(t) == b.shape(x) and t != x]
        if same:
            other = b.rng.choice(same)
            b.tags.append("nm:silu_other_operand")
    b.mark_inner(s)
    return b.binary("Mul", other, s)


def _rank(b: Builder, x: str) -> int:
    return len(b.shape(x))


PATTERNS = (
    Pattern(silu, lambda b, x: 0.4),
    Pattern(erf_gelu, lambda b, x: (1.5 if _rank(b, x) == 3 else 0.6)
            if _rank(b, x) >= 1 and b.dtype != np.float64 and b.opset >= 9 else 0.0),
    Pattern(tanh_gelu, lambda b, x: (1.5 if _rank(b, x) == 3 else 0.5) if _rank(b, x) >= 1 else 0.0),
)
