"""Generator patterns for what exporters write around the fusable ops (issue 19): the idioms a pass must see through.

- **neutral constants on either side** (`neutral`): ``ones * x``, ``x * ones``, ``x / ones`` with ones of
  shape ``()``, ``[1]``, ``[H]`` or ``[1, .., H]`` (Hugging Face writes a norm as ``weight * hidden``, and a
  freshly initialised weight is all ones); near misses that must not fold: ones that broadcast x *up* (one
  rank more, or a dimension > 1 where x has 1), a value one ulp away from one, and ones held in an
  overridable initializer (a user may feed other values);
- **integer neutral arithmetic** (`int_neutral`): ``ids + 0``, ``0 + ids``, ``ids - 0``, ``ids * 1``, ``ids / 1``
  on an int64/int32 input, cast to the float dtype and added to x (the dynamo exporter's index arithmetic);
- **TorchScript's dynamic Reshape** (`dynamic_reshape`): the target computed at run time through
  ``Shape -> Gather -> Unsqueeze -> Concat`` (or ``Shape -> Slice -> Concat``), sometimes with ``+ 0`` / ``* 1`` on
  a gathered dimension: split the last axis into heads and merge it back, or flatten a map to [N, C*H*W];
- **tied weights through Identity** (`tied_linear`): one [H, H] weight read by a MatMul directly and by a second
  one through an ``Identity`` (TorchScript's form of a tied parameter).

- **gated MLPs** (`gated_mlp`): LLaMA's ``down(silu(gate(x)) * up(x))`` and T5's gated-gelu
  ``wo(gelu(wi_0 x) * wi_1 x)`` (erf or tanh GELU written out, or the opset-20 Gelu op), the gating Mul's
  operands in either order; near misses: the up projection reads another tensor, the SiLU's Mul reads
  another tensor (no SiLU), the gate's activation read elsewhere.

Norm weights of exactly one (LayerNorm gamma of ones, beta of zeros) are drawn by `norms`.
"""

from __future__ import annotations

import numpy as np

from .builder import Builder, DTYPES, Pattern, is_map, static_last
from .gelus import erf_gelu, tanh_gelu

__all__ = ["neutral", "int_neutral", "dynamic_reshape", "tied_linear", "gated_mlp", "PATTERNS"]


def _ones_shape(b: Builder, shape: tuple) -> tuple[tuple, bool]:
    """A shape for a constant of ones times x: one that leaves x's shape, or (near miss) one that broadcasts it up."""
    rank = len(shape)
    if b.miss("ones_broadcast_up"):
        ups = [(1,) * (rank + 1), (2,) + (1,) * rank]
        ups += [tuple(2 if i == j else 1 for j in range(rank)) for i, d in enumerate(shape) if d == 1]
        b.tags.append("nm:ones_broadcast_up")
        return b.rng.choice(ups), True
    options = [(), (1,)]
    if rank and isinstance(shape[-1], int):
        options += [(shape[-1],), (1,) * (rank - 1) + (shape[-1],)]
    if rank >= 2 and isinstance(shape[-2], int):
        options.append((shape[-2], 1))
    return b.rng.choice(options), False


def neutral(b: Builder, x: str, pool: list[str]) -> str:
    """x times ones (either side) or x / ones; near misses broadcast up, are not exactly one, or are overridable."""
    shape = b.shape(x)
    op = b.rng.choice(("Mul", "Mul", "Div"))
    cshape, _ = _ones_shape(b, shape)
    value = np.ones(cshape, dtype=b.dtype)
    if b.miss("almost_one"):
        value = np.full(cshape, np.nextafter(b.dtype.type(1), b.dtype.type(2)), dtype=b.dtype)
        b.tags.append("nm:almost_one")
    overridable = b.miss("ones_overridable")
    if overridable:
        b.tags.append("nm:ones_overridable")
        ones = b.const(value, "ones", form="overridable")
    else:
        ones = b.const(value, "ones", form="constant" if b.rng.random() < 0.25 else "init")
    first = op == "Mul" and b.rng.random() < 0.5
    b.tags.append(f"neutral_{op.lower()}" + ("_first" if first else ""))
    return b.binary(op, x, ones, swap=first)


def int_neutral(b: Builder, x: str, pool: list[str]) -> str:
    """An integer input through + 0, - 0, * 1 or / 1 (the constant on either side where the op commutes),
    cast to the float dtype and added to x."""
    shape = b.shape(x)
    idt = np.dtype(np.int64) if b.rng.random() < 0.7 else np.dtype(np.int32)
    ids = b.input(shape, "ids", dtype=idt)
    op = b.rng.choice(("Add", "Sub", "Mul", "Div"))
    k = np.full(b.rng.choice(((), (1,))), 0 if op in ("Add", "Sub") else 1, dtype=idt)
    if b.miss("int_not_neutral"):
        k = k + 1  # + 1, - 1, * 2, / 2: arithmetic, not a no-op
        b.tags.append("nm:int_not_neutral")
    first = op in ("Add", "Mul") and b.rng.random() < 0.5
    b.tags.append(f"int_{op.lower()}" + ("_first" if first else ""))
    kc = b.const(k, "k")
    y = b.node(op, [kc, ids] if first else [ids, kc], shape, dtype=idt)
    b.mark_inner(y)
    f = b.node("Cast", [y], shape, to=DTYPES[b.dtype])
    return b.binary("Add", x, f)


def _unsqueeze0(b: Builder, v: str) -> str:
    """A scalar int64 made [1] (axes as an input from opset 13, as an attribute before)."""
    if b.opset >= 13:
        return b.node("Unsqueeze", [v, b.ints([0], "ax")], (1,), dtype=np.int64)
    return b.node("Unsqueeze", [v], (1,), dtype=np.int64, axes=[0])


def _dims_of(b: Builder, x: str, keep: int) -> list[str]:
    """[1]-shaped int64 tensors holding dims 0..keep-1 of x at run time: Shape -> Gather -> Unsqueeze, or one Slice."""
    s = b.node("Shape", [x], (len(b.shape(x)),), dtype=np.int64)
    if b.opset >= 10 and b.rng.random() < 0.3:
        return [b.node("Slice", [s, b.ints([0], "st"), b.ints([keep], "en")], (keep,), dtype=np.int64)]
    out = []
    for i in range(keep):
        g = b.node("Gather", [s, b.const(np.array(i, dtype=np.int64), "idx")], (), dtype=np.int64, axis=0)
        if b.rng.random() < 0.25:  # the dynamo exporter's index arithmetic: + 0 or * 1 on a dimension
            op, k = b.rng.choice((("Add", 0), ("Mul", 1)))
            g = b.node(op, [g, b.const(np.array(k, dtype=np.int64), "k")], (), dtype=np.int64)
            b.tags.append("shape_noop")
        out.append(_unsqueeze0(b, g))
    return out


def _reshape(b: Builder, x: str, keep: int, tail: list[int], out: tuple) -> str:
    parts = _dims_of(b, x, keep)
    target = b.node("Concat", parts + [b.ints(tail, "tail")], (keep + len(tail),), dtype=np.int64, axis=0)
    return b.node("Reshape", [x, target], out)


def dynamic_reshape(b: Builder, x: str, pool: list[str]) -> str:
    """TorchScript's Reshape with a target computed from Shape(x): heads split off the last axis and merged back
    (a Transpose between, sometimes), or an NCHW map flattened to [N, C*H*W]."""
    shape = b.shape(x)
    rank = len(shape)
    b.tags.append("dynamic_reshape")
    if is_map(b, x) and b.rng.random() < 0.6:
        n, c, hh, ww = shape
        b.tags.append("dynamic_flatten")
        return _reshape(b, x, 1, [-1], (n, c * hh * ww))
    h = shape[-1]
    heads = b.rng.choice([k for k in (2, 4) if h % k == 0] or [1])
    split = tuple(shape[:-1]) + (heads, h // heads)
    y = _reshape(b, x, rank - 1, [heads, h // heads], split)
    b.mark_inner(y)
    if rank >= 2 and b.rng.random() < 0.4:
        perm = list(range(rank + 1))
        perm[-3], perm[-2] = perm[-2], perm[-3]
        y = b.node("Transpose", [y], tuple(split[p] for p in perm), perm=perm)
        b.mark_inner(y)
        y = b.node("Transpose", [y], split, perm=perm)  # back: the merge needs [.., heads, h/heads] again
        b.mark_inner(y)
    return _reshape(b, y, rank - 1, [h] if b.rng.random() < 0.5 else [-1], tuple(shape))


def tied_linear(b: Builder, x: str, pool: list[str]) -> str:
    """Two MatMuls by one [H, H] weight, the second reading it through Identity (once or twice)."""
    h = b.shape(x)[-1]
    w = b.const(b.rand((h, h), 0.5), "W_tied")
    b.tags.append("tied_weight")
    y = b.node("MatMul", [x, w], b.shape(x))
    b.mark_inner(y)
    w2 = b.node("Identity", [w], (h, h))
    if b.rng.random() < 0.3:
        w2 = b.node("Identity", [w2], (h, h))
    return b.node("MatMul", [y, w2], b.shape(x))


def gated_mlp(b: Builder, x: str, pool: list[str]) -> str:
    """act(x W_gate) * (x W_up), then the down projection: SwiGLU / GeGLU as Hugging Face models write them."""

    shape = b.shape(x)
    h = shape[-1]
    inter = b.rng.choice((h, 2 * h, 3 * h))
    w_gate = b.weight((h, inter), "W_gate", "gate")
    w_up = b.weight((h, inter), "W_up", "up")
    g = b.node("MatMul", [x, w_gate], tuple(shape[:-1]) + (inter,))
    src = x
    if b.miss("glu_up_other_input"):
        same = [t for t in pool if b.shape(t) == shape and t != x and b.dtype_of(t) == b.dtype_of(x)]
        if same:
            src = b.rng.choice(same)
            b.tags.append("nm:glu_up_other_input")
    u = b.node("MatMul", [src, w_up], tuple(shape[:-1]) + (inter,))
    kind = b.rng.choice(("silu", "silu", "erf", "tanh", "gelu_op"))
    b.tags.append(f"gated_mlp_{kind}")
    if kind == "silu":
        s = b.unary("Sigmoid", g)
        other = g
        if b.miss("glu_silu_other"):
            other, _ = u, b.tags.append("nm:glu_silu_other_operand")
        b.mark_inner(s)
        act = b.binary("Mul", other, s)
    elif kind == "erf":
        act = erf_gelu(b, g, pool)
    elif kind == "tanh":
        act = tanh_gelu(b, g, pool)
    elif b.opset >= 20:
        act = b.node("Gelu", [g], b.shape(g), **({"approximate": "tanh"} if b.rng.random() < 0.5 else {}))
    else:
        act = erf_gelu(b, g, pool)
    b.mark_inner(g, u, act)
    y = b.binary("Mul", act, u)
    b.mark_inner(y)
    # the product's shape, not x's: a near-miss constant of rank 3 in the GELU broadcasts a rank-2 x up
    return b.node("MatMul", [y, b.weight((inter, h), "W_down", "down")], tuple(b.shape(y)[:-1]) + (h,))


def _rows(b: Builder, x: str) -> bool:
    return len(b.shape(x)) in (2, 3) and static_last(b, x)


PATTERNS = (
    Pattern(neutral, lambda b, x: 1.0 if b.shape(x) else 0.0),
    Pattern(int_neutral, lambda b, x: 0.4 if b.shape(x) and b.opset >= 7 else 0.0),
    Pattern(dynamic_reshape, lambda b, x: (0.8 if is_map(b, x) or (static_last(b, x) and len(b.shape(x)) >= 2)
                                           else 0.0) if b.opset >= 5 else 0.0),
    Pattern(tied_linear, lambda b, x: 0.5 if _rows(b, x) else 0.0),
    Pattern(gated_mlp, lambda b, x: 0.8 if _rows(b, x) else 0.0),
)
