"""Rotary position embeddings as exporters write them -> one com.microsoft RotaryEmbedding [rotary].

The half form (LLaMA's ``rotate_half``), anchored on the Add, x of shape [B, N, S, D] (after the heads
Transpose; [B, S, N, D] before it, see Layouts):

    out = x * C + Concat(Neg(x[..., h:]), x[..., :h]) * S          (h = D/2; C, S of shape [1, 1, S, D])

the interleaved form (GPT-J's ``rotate_every_two``): the rotated term is
``Reshape(Concat(Unsqueeze(Neg(x[..., 1::2]), -1), Unsqueeze(x[..., 0::2], -1)), x's shape)``; and partial
rotary (only the first r channels turn): x = X[..., :r] and the Add is followed by ``Concat(out, X[..., r:])``,
which becomes ``rotary_embedding_dim=r`` on X.

The cache is the model's own cos and sin, not a recomputation. The kernel computes, for token s of row b,
``x[i] * cos_cache[p, i mod h] -/+ x[j] * sin_cache[p, i mod h]`` with p = position_ids[0] + s when
position_ids holds one element; with position_ids = [0] the cache row read for token s is row s, which is
exactly the row of C (and S) the written-out Mul broadcasts onto token s. So the rewrite is the same function
whenever:

- C and S have shape [1, 1, S, D] (padded; [1, S, 1, D] for [B, S, N, D]): one row per token, the same for every batch row and head, S the
  token axis of x (the same dimension, proved by shape inference) — a cos that differs per batch row (the
  position_ids a graph input) is refused: the kernel would need a cache indexed by position, whose largest
  value the graph does not bound (onnxscript's cos_sin_cache takes the maximum from model metadata or a
  ReduceMax; the CPU kernel reads cache rows past the end unchecked);
- each row of C and S is two equal halves (interleaved: equal pairs), so [:h] (or [::2]) is all of it: a
  constant is compared exactly; a computed one is proved by its producers: ``Concat(f, f)`` on the last axis
  followed by elementwise ops (Cos, Sin, Cast, a Mul by the scalar attention scaling, Unsqueeze off the last
  axis) — LLaMA's ``emb = cat((freqs, freqs))``;
- the rotation is the kernel's: rotate_half negates the second half and puts it first, the halves of equal
  length; anything else (Neg on the first half, the halves' order, unequal halves) is refused with that reason.

Which tensor holds cosines and which sines does not matter: the kernel multiplies x by the first cache and the
rotated x by the second, whatever they hold, so C and S are passed exactly as the graph uses them. The cache
inputs are ``Reshape(Slice(C, 0:h on the last axis), [-1, h])`` (a constant C is sliced at planning time), made
once per C and shared by the groups that read it; no float64 recomputation, so the cache is bit-identical to
what the unfused graph multiplies by, and it has exactly S rows (the kernel's S <= rows check always holds).
Not where the rotated heads are only transposed back (x a Transpose, every reader of the result its inverse):
onnxruntime cancels that pair around the written-out form and the fused op measured slower (see
`_not_transposed_back`). In a decoder the heads go on to attention's MatMuls, where it measured faster.

Layouts: x [B, N, S, D] with C [1, 1, S, D] (LLaMA, after the heads Transpose: the kernel's 4-D input), or
[B, S, N, D] with C [1, S, 1, D] (GPT-J, before it: reshaped to the kernel's [B, S, N*D] with num_heads, and
back); float32 or float16 (the CPU kernel's types).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx_ir as ir

from ..engine import Match, Refused, Rule, attr, consumers, is_op, sole_consumer
from ..lowering import contrib_target
from ..options import Lowering
from .common import F32

__all__ = ["Rotary"]


@dataclass(frozen=True, eq=False)
class RotaryData:
    """What the rewrite needs: the rotated input, the cos/sin tables, the form, the rotated channels (None: all),
    the heads, and the input's layout ("bnsd" or "bsnd")."""

    x: ir.Value
    cos: ir.Value
    sin: ir.Value
    interleaved: bool
    rotary_dim: int | None
    heads: int
    layout: str

_FLOATS = (F32, np.dtype(np.float16))
_BIG = np.iinfo(np.int64).max
#: elementwise ops that keep equal halves (pairs) of the last axis equal when their other operands are scalars
_ELEMENTWISE = ("Cos", "Sin", "Cast", "Identity", "Neg", "Mul", "Div", "Add", "Sub")


def _slice(cx, s: ir.Node, dim) -> tuple[int, int, int, int] | None:
    """(axis, start, end, step) of a one-axis Slice with constant parameters, clamped to `dim` (an int)."""
    if not is_op(s, "Slice") or len(s.inputs) < 3 or any(v is None for v in s.inputs[:3]):
        return None
    x = s.inputs[0]
    rank = cx.rank(x)
    ins = list(s.inputs[1:5]) + [None] * (5 - len(s.inputs))
    vals = [cx.constant(v) if v is not None else None for v in ins]
    if rank is None or vals[0] is None or vals[1] is None or any(v is not None and c is None
                                                                 for v, c in zip(ins, vals)):
        return None
    starts, ends = vals[0].reshape(-1), vals[1].reshape(-1)
    axes = vals[2].reshape(-1) if vals[2] is not None else np.arange(len(starts))
    steps = vals[3].reshape(-1) if vals[3] is not None else np.ones(len(starts), np.int64)
    if not (len(starts) == len(ends) == len(axes) == len(steps) == 1) or int(steps[0]) <= 0:
        return None
    if not isinstance(dim, int):
        return None
    start, end = (int(np.clip(v + dim if v < 0 else v, 0, dim)) for v in (int(starts[0]), int(ends[0])))
    return int(axes[0]) % rank, start, end, int(steps[0])


def _last(cx, s: ir.Node, x: ir.Value) -> tuple[int, int, int] | None:
    """(start, end, step) when `s` slices the last axis of `x`."""
    dims = cx.shape(x)
    if s.inputs[0] is not x or dims is None:
        return None
    r = _slice(cx, s, dims[-1])
    return r[1:] if r is not None and r[0] == len(dims) - 1 else None


def _pairs_equal(arr: np.ndarray, interleaved: bool) -> bool:
    d = arr.shape[-1]
    if d % 2:
        return False
    a, b = (arr[..., 0::2], arr[..., 1::2]) if interleaved else (arr[..., : d // 2], arr[..., d // 2:])
    return bool(np.array_equal(a, b))


def _proved_halves(cx, v: ir.Value, interleaved: bool) -> str | None:
    """None when every row of `v` is provably two equal halves (pairs); else what stops the proof."""
    for _ in range(16):
        c = cx.constant(v)
        if c is not None:
            return None if _pairs_equal(c, interleaved) else f"constant {v.name} has unequal " + \
                ("pairs" if interleaved else "halves")
        n = v.producer()
        if n is None:
            return f"{v.name} is a graph input"
        if is_op(n, "Concat") and not interleaved:
            rank = cx.rank(n.outputs[0])
            if rank is not None and int(attr(n, "axis", 0)) % rank == rank - 1 and len(n.inputs) == 2 and \
                    n.inputs[0] is n.inputs[1]:
                return None
            return f"Concat {n.name} is not Concat(f, f) on the last axis"
        if is_op(n, "Unsqueeze"):
            axes = cx.constant(n.inputs[1]) if len(n.inputs) > 1 else None
            rank = cx.rank(n.outputs[0])
            if axes is None or rank is None or (rank - 1) in {int(a) % rank for a in axes.reshape(-1)}:
                return f"Unsqueeze {n.name} adds the last axis"
            v = n.inputs[0]
            continue
        if is_op(n, *_ELEMENTWISE):
            vary = [i for i in n.inputs if i is not None and cx.constant(i) is None]
            rest = [cx.constant(i) for i in n.inputs if i is not None and cx.constant(i) is not None]
            if len(vary) != 1 or any(r.size != 1 for r in rest):
                return f"{n.op_type} {n.name} is not elementwise in one tensor"
            v = vary[0]
            continue
        return f"{v.name} is computed by {n.op_type} {n.name}"
    return f"{v.name}: too long a chain to prove"


def _rotated(cx, v: ir.Value) -> tuple[str, ir.Value, list[ir.Node]] | None:
    """(form, x, nodes) when `v` is rotate_half(x) or rotate_every_two(x) of slices of one x; Refused for a
    near miss (the slices are there but do not rotate); None when `v` is no rotation at all."""
    cat = v.producer()
    if is_op(cat, "Reshape"):
        return _every_two(cx, cat)
    if not is_op(cat, "Concat") or len(cat.inputs) != 2:
        return None
    a, b = cat.inputs
    pa, pb = a.producer(), b.producer()
    neg_first = is_op(pa, "Neg")
    neg_node = pa if neg_first else pb if is_op(pb, "Neg") else None
    if neg_node is None:
        return None
    sl_neg = neg_node.inputs[0].producer()
    sl_pos = pb if neg_first else pa
    if not is_op(sl_neg, "Slice") or not is_op(sl_pos, "Slice") or sl_neg.inputs[0] is not sl_pos.inputs[0]:
        return None
    x = sl_neg.inputs[0]
    rank, dims = cx.rank(x), cx.shape(x)
    if rank is None or int(attr(cat, "axis", 0)) % rank != rank - 1:
        return None
    rn, rp = _last(cx, sl_neg, x), _last(cx, sl_pos, x)
    if rn is None or rp is None:
        return None
    d = dims[-1]
    if rn[2] != 1 or rp[2] != 1:
        return None
    (ns, ne, _), (ps, pe, _) = rn, rp
    lo, hi = sorted([(ns, ne), (ps, pe)])
    if lo[0] != 0 or lo[1] != hi[0] or hi[1] != d:
        raise Refused(f"the Slices {sl_pos.name}, {sl_neg.name} of {x.name} ({(ps, pe)}, {(ns, ne)}) do not split "
                      f"its last axis of {d} in two")
    h = lo[1]
    if 2 * h != d:
        raise Refused(f"the halves of {x.name} are unequal ({h} and {d - h} of {d} channels): rotate_half "
                      "splits the last axis in the middle")
    if ns == 0:
        raise Refused(f"Neg {neg_node.name} negates the first half of {x.name}: rotate_half negates the second")
    if not neg_first:
        raise Refused(f"Concat {cat.name} puts the first half of {x.name} first: rotate_half is "
                      "cat(-second, first)")
    return "half", x, [sl_pos, sl_neg, neg_node, cat]


def _every_two(cx, reshape: ir.Node) -> tuple[str, ir.Value, list[ir.Node]] | None:
    """stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2): Reshape(Concat(Unsqueeze(Neg(odd)), Unsqueeze(even)))."""
    cat = reshape.inputs[0].producer()
    if not is_op(cat, "Concat") or len(cat.inputs) != 2:
        return None
    ups = [i.producer() for i in cat.inputs]
    if not all(is_op(u, "Unsqueeze") for u in ups):
        return None
    inner = [u.inputs[0].producer() for u in ups]
    neg_i = next((k for k, n in enumerate(inner) if is_op(n, "Neg")), None)
    if neg_i is None:
        return None
    sl = [inner[k].inputs[0].producer() if k == neg_i else inner[k] for k in range(2)]
    if not all(is_op(s, "Slice") for s in sl) or sl[0].inputs[0] is not sl[1].inputs[0]:
        return None
    x = sl[0].inputs[0]
    dims = cx.shape(x)
    rank = cx.rank(x)
    r = [_last(cx, s, x) for s in sl]
    if rank is None or any(v is None for v in r) or cx.shape(reshape.outputs[0]) != dims:
        return None
    if int(attr(cat, "axis", 0)) % (rank + 1) != rank or any(
            cx.constant(u.inputs[1]) is None or int(cx.constant(u.inputs[1]).reshape(-1)[0]) % (rank + 1) != rank
            for u in ups):
        return None
    d = dims[-1]
    starts = [v[0] for v in r]
    if any(v[2] != 2 or v[1] != d for v in r) or sorted(starts) != [0, 1] or d % 2:
        raise Refused(f"the strided Slices of {x.name} are not its even and odd channels")
    if starts[neg_i] != 1:
        raise Refused(f"Neg {inner[neg_i].name} negates the even channels of {x.name}: rotate_every_two "
                      "negates the odd ones")
    if neg_i != 0:
        raise Refused(f"Concat {cat.name} stacks the even channels of {x.name} first: rotate_every_two is "
                      "stack(-odd, even)")
    return "interleaved", x, [sl[0], sl[1], inner[neg_i], ups[0], ups[1], cat, reshape]


def _per_token(cx, c: ir.Value, x: ir.Value, what: str) -> str:
    """The layout of x, "bnsd" ([B, N, S, D] with c [1, 1, S, D]) or "bsnd" ([B, S, N, D] with c [1, S, 1, D]):
    one row of c per token, the same for every batch row and head; Refused otherwise."""
    xs, cs = cx.shape(x), cx.shape(c)
    if cs is None or len(cs) > 4:
        raise Refused(f"the {what} {c.name} has no known shape of rank <= 4")
    cs = (1,) * (4 - len(cs)) + tuple(cs)
    if cs[0] == 1 and cs[1] == 1 and cs[2] is not None and cs[2] == xs[2] and cs[3] == xs[3]:
        return "bnsd"
    if cs[0] == 1 and cs[2] == 1 and cs[1] is not None and cs[1] == xs[1] and cs[3] == xs[3] and xs[1] != 1:
        return "bsnd"
    if cs[0] != 1:
        raise Refused(f"the {what} {c.name} of shape {list(cs)} differs per batch row: the kernel would need a "
                      "cache indexed by position, and no bound on the positions is known",
                      condition=f"a {what} the same for every batch row ([1, 1, S, D] or [1, S, 1, D]; one per row "
                                "needs a cache indexed by position, and no bound on the positions is known)",
                      found=f"{c.name} of shape {list(cs)}")
    raise Refused(f"the {what} {c.name} of shape {list(cs)} is not one row per token of {x.name} {list(xs)}",
                  condition=f"a {what} of shape [1, 1, S, D] ([B, N, S, D] heads) or [1, S, 1, D] ([B, S, N, D])",
                  found=f"{c.name} of shape {list(cs)}")


def _not_transposed_back(x: ir.Value, out: ir.Value) -> None:
    """Refused when x is a Transpose and every reader of the rotated result transposes it back: onnxruntime
    (EXTENDED) then cancels the pair around the written-out form, and the fused op, which it cannot see
    through, measured slower (0.63x (0.54-0.72) at EXTENDED, 0.59x at ALL, 1x32x512x128; 1.50x off)."""
    t = x.producer()
    readers = consumers(out)
    if not is_op(t, "Transpose") or not readers or out.is_graph_output():
        return
    p = list(attr(t, "perm", []) or [])
    for r in readers:
        q = list(attr(r, "perm", []) or []) if is_op(r, "Transpose") else None
        if q is None or len(q) != len(p) or any(p[q[i]] != i for i in range(len(p))):
            return
    raise Refused(f"the rotated {x.name} is only transposed back ({readers[0].op_type} {readers[0].name}): "
                  "onnxruntime cancels that Transpose pair around the written-out form, and the fused op measured "
                  "slower there (0.63x at EXTENDED)")


class Rotary(Rule):
    """x * C + rotate(x) * S (rotate_half or rotate_every_two; partial rotary) -> com.microsoft:RotaryEmbedding."""

    names = ("rotary",)
    anchors = ("Add",)
    fixed = True
    same_shape = False

    def match(self, cx, add: ir.Node) -> Match | None:
        if len(add.inputs) != 2 or not all(is_op(i.producer(), "Mul") for i in add.inputs):
            return None
        muls = [i.producer() for i in add.inputs]
        found = None
        for k, mul in enumerate(muls):
            for j in (0, 1):
                rot = _rotated(cx, mul.inputs[j])
                if rot is not None:
                    found = (muls[1 - k], mul, mul.inputs[1 - j], rot)
                    break
            if found:
                break
        if found is None:
            return None
        cos_mul, sin_mul, sin_v, (form, x, rot_nodes) = found
        if cos_mul is sin_mul or x not in cos_mul.inputs or sum(i is x for i in cos_mul.inputs) != 1:
            raise Refused(f"the other term {cos_mul.name} does not multiply {x.name}, the tensor rotated")
        cos_v = cos_mul.inputs[1] if cos_mul.inputs[0] is x else cos_mul.inputs[0]
        target = contrib_target("RotaryEmbedding", cx.lower)
        if target is None:
            raise Refused(f"RotaryEmbedding is a com.microsoft op: none for lower={cx.lower.value!r}")
        dims, dt = cx.shape(x), cx.dtype(x)
        if dims is None or len(dims) != 4 or not isinstance(dims[3], int):
            raise Refused(f"{x.name} is not 4-D heads with D known (shape {dims})")
        if dt not in _FLOATS or cx.dtype(cos_v) != dt or cx.dtype(sin_v) != dt:
            raise Refused(f"{x.name} {dt}, cos {cx.dtype(cos_v)}, sin {cx.dtype(sin_v)}: the CPU kernel takes one "
                          "float32 or float16 type")
        layouts = set()
        for v, what in ((cos_v, "cos"), (sin_v, "sin")):
            layouts.add(_per_token(cx, v, x, what))
            why = _proved_halves(cx, v, form == "interleaved")
            if why is not None:
                raise Refused(f"the {what} {v.name} is not provably " + ("equal pairs" if form == "interleaved"
                              else "two equal halves") + f" (the cache holds one of them): {why}")
        if len(layouts) != 1:
            raise Refused(f"cos {cos_v.name} and sin {sin_v.name} broadcast onto {x.name} along different axes")
        layout = layouts.pop()
        heads = dims[1] if layout == "bnsd" else dims[2]
        if not isinstance(heads, int):
            raise Refused(f"the number of heads of {x.name} {list(dims)} is not known")
        nodes = [cos_mul] + rot_nodes + [sin_mul, add]
        data = RotaryData(x, cos_v, sin_v, form == "interleaved", None, heads, layout)
        out = add.outputs[0]
        partial = self._partial(cx, x, add)
        if partial is not None:
            outer, more = partial
            nodes = more[:2] + nodes + more[2:]
            data = replace(data, x=outer, rotary_dim=dims[3])
            out = more[2].outputs[0]
        if cx.only is None:  # a cost condition, judged on the graph as planned: re-checked after another group
            _not_transposed_back(data.x, out)  # (attention) wrote its own Transpose after it, it is no pair
        if not cx.free(*nodes):
            return None
        why = f"{form} rotary embedding of {data.x.name}" + (f", first {dims[3]} channels" if partial else "")
        kernels, emitted = self._emits(cx, data, out)
        return Match("rotary", add, nodes, why, target.op, kernels=target.kernels + kernels, outputs=[out],
                     data=data, emitted_bytes=emitted)

    @staticmethod
    def _emits(cx, data: "RotaryData", out: ir.Value) -> tuple[int, int]:
        """(kernels, bytes written) the rewrite writes besides RotaryEmbedding, as `rewrite` will: a computed cos/sin
        table's cache (Slice + Reshape, each writing half the table) once per table, by the first group that reads it
        (the same memo order), and the Reshapes to and from [B, S, N*D] of a [B, S, N, D] input (each the size of
        the output). The bytes are what the plan's saving charges for them, each tensor at its own size."""
        memo = cx.__dict__.setdefault("_rotary_plan_memo", set())
        n, written = (2, 2 * cx.nbytes(out)) if data.layout == "bsnd" else (0, 0)
        for v in (data.cos, data.sin):
            key = (id(v), data.interleaved)
            if cx.constant(v) is None and key not in memo:
                n += 2
                written += cx.nbytes(v)  # the Slice's half of the table, then the Reshape's copy of it
                if cx.only is None:  # planning: a later group of this pass reuses the cache
                    memo.add(key)
        return n, written

    def _partial(self, cx, x: ir.Value, add: ir.Node):
        """(X, [slice rot, slice pass, Concat]) when x = X[..., :r] and the Add is followed by cat(out, X[..., r:])."""
        sl = x.producer()
        cat = sole_consumer(add.outputs[0])
        if not is_op(sl, "Slice") or not is_op(cat, "Concat") or len(cat.inputs) != 2 or cat.inputs[0] is not \
                add.outputs[0] or sole_consumer(x) is not None:
            return None
        big = sl.inputs[0]
        bdims = cx.shape(big)
        rest = cat.inputs[1].producer()
        if bdims is None or len(bdims) != 4 or not is_op(rest, "Slice") or rest.inputs[0] is not big:
            return None
        r, p = _last(cx, sl, big), _last(cx, rest, big)
        if r is None or p is None or int(attr(cat, "axis", 0)) % 4 != 3:
            return None
        if r[2] != 1 or p[2] != 1 or r[0] != 0 or p != (r[1], bdims[3], 1) or r[1] % 2:
            raise Refused(f"{sl.name} and {rest.name} do not split {big.name} into the first r (even) channels and "
                          "the rest")
        return big, [sl, rest, cat]

    def rewrite(self, cx, m: Match) -> list[ir.Node]:
        d = m.data
        new: list[ir.Node] = []
        caches = []
        for v in (d.cos, d.sin):
            cache, made = self._cache(cx, v, d.interleaved, m.anchor.name)
            caches.append(cache)
            new += made
        memo = cx.__dict__.setdefault("_rotary_memo", {})
        pos = memo.get("pos")
        if pos is None:
            pos = memo["pos"] = cx.initializer("rotary_position_offset", np.array([0], np.int64))
        attrs = {"interleaved": int(d.interleaved)}
        if d.rotary_dim is not None or d.layout == "bsnd":
            attrs["num_heads"] = int(d.heads)
        if d.rotary_dim is not None:
            attrs["rotary_embedding_dim"] = int(d.rotary_dim)
        x = d.x
        if d.layout == "bsnd":  # [B, S, N, D] -> the kernel's [B, S, N*D] and back
            flat = cx.node("Reshape", [x, cx.initializer(f"{m.anchor.name}_flat", np.array([0, 0, -1], np.int64))],
                           base=f"{m.anchor.name}_rotary_flat")
            new.append(flat)
            x = flat.outputs[0]
        new.append(cx.node("RotaryEmbedding", [x, pos] + caches, attrs, domain="com.microsoft",
                           base=f"{m.anchor.name}_rotary"))
        if d.layout == "bsnd":
            dims = [int(v) for v in (0, 0, d.heads, -1)]
            new.append(cx.node("Reshape", [new[-1].outputs[0], cx.initializer(f"{m.anchor.name}_heads",
                                                                              np.array(dims, np.int64))],
                               base=f"{m.anchor.name}_rotary_heads"))
        return new

    def _cache(self, cx, v: ir.Value, interleaved: bool, base: str) -> tuple[ir.Value, list[ir.Node]]:
        """The [S, D/2] cache of a [1, 1, S, D] or [1, S, 1, D] cos/sin `v`: its first half (even channels), rows =
        tokens (the unit axes dropped by the Reshape)."""
        memo = cx.__dict__.setdefault("_rotary_memo", {})
        key = (id(v), interleaved)
        if key in memo:
            return memo[key], []
        c = cx.constant(v)
        if c is not None:
            d = c.shape[-1]
            half = c[..., 0::2] if interleaved else c[..., : d // 2]
            memo[key] = cx.initializer(f"{v.name}_cache", np.ascontiguousarray(half.reshape(-1, d // 2)))
            return memo[key], []
        d = cx.shape(v)[-1]
        ints = [cx.initializer(f"{v.name}_cache_{k}", np.array(a, np.int64)) for k, a in
                (("start", [0]), ("end", [_BIG]), ("axis", [-1]), ("step", [2]))] if interleaved else \
            [cx.initializer(f"{v.name}_cache_{k}", np.array(a, np.int64)) for k, a in
             (("start", [0]), ("end", [d // 2]), ("axis", [-1]))]
        sl = cx.node("Slice", [v] + ints, base=f"{base}_cache_slice")
        shape = cx.initializer(f"{v.name}_cache_shape", np.array([-1, d // 2], np.int64))
        rs = cx.node("Reshape", [sl.outputs[0], shape], base=f"{base}_cache")
        memo[key] = rs.outputs[0]
        return memo[key], [sl, rs]

    def outputs(self, m: Match, new_nodes: list[ir.Node]) -> list[tuple[ir.Value, ir.Value]]:
        return [(m.handed_on()[0], new_nodes[-1].outputs[0])]
