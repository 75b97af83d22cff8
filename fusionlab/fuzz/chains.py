"""Generator patterns for the mixed pass: elementwise, broadcast, injective and reduction chains; layout bridges.

A chain is 2-5 ops drawn from unary elementwise ops, binary ops with a broadcast constant or with another
live tensor, injective ops (Transpose, Reshape, Unsqueeze/Squeeze, Slice, Concat, Expand) and reductions
(ReduceSum/Max/Mean with or without keepdims, Softmax). Bridges turn NCHW maps into [N, C] vectors so
Gemm/MatMul patterns can follow convolutions.
"""

from __future__ import annotations

import numpy as np

from .builder import Builder, Pattern, broadcast, is_map
from .norms import reduce

__all__ = ["chain", "to_vector", "reduction", "PATTERNS"]

_UNARY = ("Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "Softplus", "Erf", "Identity")


def _unary(b: Builder, x: str) -> str:
    ops = [o for o in _UNARY if not (o == "Erf" and (b.dtype == np.float64 or b.opset < 9))]
    op = b.rng.choice(ops)
    if op == "Exp":
        x = b.unary("Tanh", x)  # keep Exp's input small: an overflow says nothing about fusion
    return b.unary(op, x)


def _binary_const(b: Builder, x: str) -> str:
    shape = b.shape(x)
    op = b.rng.choice(("Add", "Mul", "Sub", "Div", "Max", "Min", "Pow"))
    if op == "Pow":
        return b.binary("Pow", b.unary("Abs", x), b.scalar(b.rng.choice((2.0, 0.5, 1.5)), "p"), swap=False)
    rank = len(shape)
    options = [(), (1,)]
    if isinstance(shape[-1], int):
        options.append((shape[-1],))
    if rank >= 2 and isinstance(shape[-2], int):
        options.append((shape[-2], 1))
    if b.miss("rank_up_chain"):
        options = [(1,) * (rank + 1)]
        b.tags.append("nm:rank_up")
    k = b.rand(b.rng.choice(options), 1.0)
    if op == "Div":
        k = (np.abs(k) + 0.5).astype(b.dtype)
    return b.binary(op, x, b.const(k, "k", form="constant" if b.rng.random() < 0.2 else "init"),
                    swap=op in ("Sub",) and b.rng.random() < 0.3 or None)


def _binary_live(b: Builder, x: str, pool: list[str]) -> str | None:
    shape = b.shape(x)
    ok = []
    for t in pool:
        if t == x:
            continue
        try:
            if broadcast(shape, b.shape(t)) == shape:
                ok.append(t)
        except ValueError:
            pass
    if not ok:
        return None
    return b.binary(b.rng.choice(("Add", "Mul", "Sub", "Max")), x, b.rng.choice(ok))


def _injective(b: Builder, x: str) -> str:
    shape = b.shape(x)
    rank = len(shape)
    kind = b.rng.choice(("transpose", "reshape", "unsqueeze", "slice", "concat", "expand"))
    if kind == "transpose" and rank >= 2:
        perm = list(range(rank))
        i, j = sorted(b.rng.sample(range(rank), 2))
        perm[i], perm[j] = perm[j], perm[i]
        return b.node("Transpose", [x], tuple(shape[p] for p in perm), perm=perm)
    if kind == "reshape" and rank >= 2 and all(isinstance(d, int) for d in shape[-2:]):
        new = list(shape[:-2]) + [shape[-2] * shape[-1]]
        spec = [0 if not isinstance(d, int) else d for d in shape[:-2]] + [-1]
        return b.node("Reshape", [x, b.ints(spec, "shape")], tuple(new))
    if kind == "unsqueeze":
        axis = b.rng.randrange(rank + 1)
        out = tuple(shape[:axis]) + (1,) + tuple(shape[axis:])
        u = b.node("Unsqueeze", [x, b.ints([axis], "ax")] if b.opset >= 13 else [x], out,
                   **({} if b.opset >= 13 else {"axes": [axis]}))
        b.mark_inner(u)
        return b.node("Squeeze", [u, b.ints([axis], "ax")] if b.opset >= 13 else [u], shape,
                      **({} if b.opset >= 13 else {"axes": [axis]}))
    if kind == "slice" and b.opset >= 10 and isinstance(shape[-1], int) and shape[-1] >= 2:
        end = shape[-1] - 1
        return b.node("Slice", [x, b.ints([0], "st"), b.ints([end], "en"), b.ints([-1], "ax")],
                      tuple(shape[:-1]) + (end,))
    if kind == "concat" and isinstance(shape[-1], int):
        return b.node("Concat", [x, x], tuple(shape[:-1]) + (2 * shape[-1],), axis=-1 if b.opset >= 11 else rank - 1)
    if kind == "expand" and b.opset >= 8 and rank >= 1 and shape[0] == 1:
        return b.node("Expand", [x, b.ints([2] + [1] * (rank - 1), "shape")], (2,) + tuple(shape[1:]))
    return b.unary("Relu", x)


def reduction(b: Builder, x: str, pool: list[str]) -> str:
    """A Reduce* (keepdims 1 or 0) or Softmax, then an elementwise op."""
    shape = b.shape(x)
    rank = len(shape)
    b.tags.append("reduction")
    if b.rng.random() < 0.4:
        y = b.unary("Softmax", x, axis=-1) if b.opset >= 13 or b.rng.random() < 0.5 else b.unary("Softmax", x, axis=rank - 1)
    else:
        op = b.rng.choice(("ReduceSum", "ReduceMax", "ReduceMean"))
        keep = b.rng.choice((0, 1, 1)) if rank > 1 else 1
        y = reduce(b, op, x, [b.rng.randrange(rank)], keep)
    return b.binary("Mul", y, b.scalar(0.5, "k")) if b.rng.random() < 0.5 else b.unary("Relu", y)


def chain(b: Builder, x: str, pool: list[str]) -> str:
    """2-5 elementwise / broadcast / injective ops (what the mixed pass groups)."""
    b.tags.append("chain")
    y = x
    for _ in range(b.rng.randint(2, 5)):
        r = b.rng.random()
        if r < 0.35:
            y2 = _unary(b, y)
        elif r < 0.65:
            y2 = _binary_const(b, y)
        elif r < 0.8:
            y2 = _binary_live(b, y, pool) or _unary(b, y)
        else:
            y2 = _injective(b, y)
        b.mark_inner(y)
        y = y2
    return y


def to_vector(b: Builder, x: str, pool: list[str] | None = None) -> str:
    """NCHW -> [N, C]: GlobalAveragePool + Flatten, or ReduceMean over H, W without keepdims."""
    n, c = b.shape(x)[:2]
    if b.dtype != np.float64 and b.rng.random() < 0.5:
        g = b.node("GlobalAveragePool", [x], (n, c, 1, 1))
        b.mark_inner(g)
        if b.rng.random() < 0.5:
            return b.node("Flatten", [g], (n, c), axis=1)
        spec = [0, -1] if isinstance(n, str) or b.rng.random() < 0.5 else [n, c]
        return b.node("Reshape", [g, b.ints(spec, "shape")], (n, c))
    return reduce(b, "ReduceMean", x, [2, 3], keepdims=0)


PATTERNS = (
    Pattern(chain, lambda b, x: 0.8),
    Pattern(reduction, lambda b, x: 0.3 if len(b.shape(x)) >= 2 else 0.0),
    Pattern(to_vector, lambda b, x: 0.6 if is_map(b, x) and b.dtype != np.float64 else 0.0),
)
