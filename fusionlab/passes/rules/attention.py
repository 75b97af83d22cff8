"""Scaled dot-product attention, as exporters write it, -> one com.microsoft MultiHeadAttention.

The pattern, anchored on the Softmax (every arrangement of the views is proved by `layout`, not listed):

    Q = view(q)      [B,N,S,D]   (q, k, v: [B,S,N*D] projections; `view` = Reshape/Transpose chains)
    K^T = view(k)    [B,N,D,L]
    P = Softmax(Q·s1 @ K^T·s2 · s3 [+ mask])      (s1, s2, s3 scalar constants, any of them absent)
    [P = Where(IsNaN(P), 0, P)]                   (SDPA's guard for fully masked rows)
    out = view(P @ view(v)) [B,S,N*D]

becomes MultiHeadAttention(q, k, v, attention_bias=mask, num_heads=N, scale=s1·s2·s3). Legality: fp32 or fp16
(all alike); the layouts prove Q, K, V split their last axis into the same N heads of D; the mask has the shape
MultiHeadAttention accepts ([B or 1, 1 or N, S, L]); every intermediate has one consumer. SDPA's NaN guard
zeroes rows whose keys are all masked (-inf); MultiHeadAttention returns NaN there instead, so when the mask
can hold -inf the guard is kept after the fused op as Where(IsNaN(out), F, out), where F = ReduceSum(V - V) over
the key axis is what a zeroed row of P gives in P @ V: 0 in a column of V whose values are all finite, NaN in one
that holds an inf or NaN (0 * inf = NaN), so a NaN that comes from V stays NaN as in the original (filling 0, as
the graph's guard does before the MatMul, would zero it: fuzz campaign 25). With a finite mask (finfo.min) or
none, no row can be NaN and the guard is dropped.

Q, K or V may also come already split into heads, [B, N, S, D], from any producer: a rotary embedding (written
out or com.microsoft RotaryEmbedding), or LLaMA's grouped-query repeat_kv (Unsqueeze -> Expand -> Reshape of
fewer K/V heads). Such K and V go in MultiHeadAttention's 4-D key/value form ([B, N, L, D]) and the repeat is
kept; such a Q goes back to [B, S, N*D] by Transpose + Reshape. A K/V head count the MatMul broadcasts instead
(no explicit repeat) is refused. With rule `gqa` (on by default) a repeat_kv of Nkv < N heads, proved by shapes
(Unsqueeze at axis 2, Expand to [B, Nkv, G, L, D], Reshape to [B, Nkv*G, L, D]: head h reads K/V head h // G),
becomes com.microsoft GroupQueryAttention on the unrepeated K/V instead, the repeat removed: causal=0 with the
graph's own mask as attention_bias (so a padding mask stays exact: GQA's built-in causal mask is not used and no
proof of causality is needed), no past, seqlens_k = S - 1 per batch, total_sequence_length = S (from q's shape);
self-attention only (query length provably the key length), head size a multiple of 8 (the CPU kernel's
condition). With a KV cache, K and V repeated from Concat(past, new) on the sequence axis (the past a graph input
[B, Nkv, P, D], one past length for K and V, the new K/V this step's), GroupQueryAttention takes the past as
past_key / past_value and its outputs 1 and 2, the present cache, replace the Concats' outputs: seqlens_k =
P + S - 1, total_sequence_length = P + S; the query length must be the new keys' length, and batch or query
length provably 1 (onnxruntime 1.31's CPU kernel: "batch_size must be 1 when sequence_length > 1 and past context
is given"); not with a NaN guard that must stay (its fill would read the whole cache). Measured against
MultiHeadAttention after the repeat on one LLaMA-style decode step, faster at every context measured, the more
the longer the cache (benchmarks/results/gqa_cache.md; notebook 12 times it at 4096).
onnxruntime 1.31's CPU kernel runs float32 and float16. It measured no slower than MultiHeadAttention after the
repeat, faster on the TorchScript LLaMA exports (benchmarks/results/gqa.md); without `gqa` the MultiHeadAttention
form is written.
A head view read elsewhere only for its shape (T5's layer 0 reads
key_states.shape) stays outside the group for that reader.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import onnx_ir as ir

from ...analysis.layout import Atom, base_layout, names, shape_branch, step, trace_back, trace_forward
from ...analysis.shape_values import ShapeValues
from ..engine import Match, Refused, Rule, attr, consumers, exact, is_op, scalar, sole_consumer
from ..lowering import attention_target, gqa_target
from ..options import Lowering
from .common import F32

__all__ = ["Attention", "ATTENTION_DTYPES", "GQA_OPT_IN"]

#: why a grouped-query attention became MultiHeadAttention after the repeat (rule `gqa` off): --why-not says it
GQA_OPT_IN = ("K/V repeated from fewer heads: MultiHeadAttention after the repeat, since rule gqa is off (it is on "
              "by default: GroupQueryAttention on the unrepeated K/V measured no slower, faster on LLaMA's "
              "TorchScript exports; benchmarks/results/gqa.md)")


@dataclass(frozen=True, eq=False)
class GroupedKV:
    """GroupQueryAttention's view of K and V: their heads, whether each is in heads [B, Nkv, L, D] (then
    transposed back), the head size, and the query's (batch, sequence) as matched."""

    kv_heads: int
    k4: tuple[bool, bool]
    head_size: int
    bs: tuple
    #: the KV cache GroupQueryAttention takes itself: (past_key, past_value, the K Concat, the V Concat), whose
    #: Concat outputs (the present cache) become its outputs 1 and 2; None: no past
    past: tuple | None = None


@dataclass(frozen=True, eq=False)
class AttentionData:
    """What the rewrite needs: K, V (as the fused op reads them), Q, the mask, heads, the scale, whether the NaN
    guard stays (and what fills it), the flatten size for a Gemm after it, Q's [B, S, N*D] size when it is in
    heads, and GroupQueryAttention's K/V view (None: MultiHeadAttention)."""

    k: ir.Value
    v: ir.Value
    q: ir.Value
    mask: ir.Value | None
    heads: int
    scale: float
    guard: bool
    fill: tuple
    flatten: int
    q4: int
    gqa: GroupedKV | None

#: dtypes onnxruntime 1.31's CPU MultiHeadAttention kernel runs (float16 checked on a built model: it loads, runs
#: and is within float16 rounding of a float64 reference, max error 6e-4 at 2x5x16; float64 has no kernel)
ATTENTION_DTYPES = (F32, np.dtype(np.float16))


def _scaled(cx, v: ir.Value):
    """(inner value, scale, node) when v = inner * c or inner / c with a scalar constant c, else (v, 1.0, None)."""
    n = v.producer()
    if is_op(n, "Mul", "Div") and cx.free(n) and sole_consumer(v) is not None:
        for inner, c_v in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
            c = cx.constant(c_v)
            if c is not None and scalar(c) is not None and not cx.broadcasts_up(c, inner) and \
                    (n.op_type == "Mul" or inner is n.inputs[0]) and cx.constant(inner) is None:
                k = scalar(c)
                if k == 0.0 or not math.isfinite(k):
                    return v, 1.0, None
                return inner, (k if n.op_type == "Mul" else 1.0 / k), n
    return v, 1.0, None


#: the base [B, S, H] traced by `layout`: atoms x0 (B), x1 (S), and x2.0 x x2.1 = H split into heads
_ATOMS = {"b": "x0", "s": "x1", "n": "x2.0", "d": "x2.1"}
#: the base [B, N, S, D] of a value already split into heads (rotary output, repeat_kv's result)
_ATOMS4 = {"b": "x0", "n": "x1", "s": "x2", "d": "x3"}


def _heads(layout, want: str, base: tuple | None) -> tuple[int, int] | None:
    """(N, D) when `layout` is the base [B, S, H] with H split into N x D, arranged as `want` (e.g. "bnsd").

    Unit atoms are left out of the comparison (a batch of 1 holds no order), so a model bound to batch 1
    proves the same as one with a symbolic batch.
    """
    if layout is None or base is None or len(layout) != 4 or len(base) not in (3, 4):
        return None
    if len(base) == 4:  # a value already split into heads, [B, N, S, D]
        sizes = {a.name: a.size for ax in layout for a in ax}
        expect = [(_ATOMS4[w],) if not (w in "bs" and base["b.s".index(w)] == 1) and sizes.get(_ATOMS4[w], 0) != 1
                  else () for w in want]
        if names(layout) != expect:
            return None
        n, d = sizes.get("x1"), sizes.get("x3")
        return (n, d) if isinstance(n, int) and isinstance(d, int) else None
    split = [ax for ax in layout if any(a.name.startswith("x2.") for a in ax)]
    sizes = {a.name: a.size for ax in layout for a in ax}
    expect = [(_ATOMS[w],) if not (w in "bs" and base["bs".index(w)] == 1) and sizes.get(_ATOMS[w], 0) != 1 else ()
              for w in want]
    if names(layout) != expect or len(split) != 2:
        return None
    n, d = sizes.get("x2.0"), sizes.get("x2.1")
    return (n, d) if isinstance(n, int) and isinstance(d, int) else None


def _side(cx, values, operand: ir.Value, want: str, reader: ir.Node | None = None):
    """(value, views, (N, D), split) for one of Q, K^T, V: the views from a [B, S, N*D] projection (split False),
    else from the nearest value already in heads [B, N, S, D] (split True: a rotary output, an explicit repeat
    of K/V heads), arranged as `want`; (operand, [], None, False) when neither proves."""
    base, layout, views = trace_back(cx, values, operand, reader=reader)
    nd = _heads(layout, want, cx.shape(base))
    if nd is not None and cx.rank(base) == 3:
        return base, views, nd, False
    for i in range(len(views) + 1):
        start = views[i].inputs[0] if i < len(views) else operand
        if cx.rank(start) != 4:
            continue
        lay = base_layout(cx.shape(start), "x")
        for node in views[i:]:
            lay = step(values, node, lay) if lay is not None else None
        nd = _heads(lay, want, cx.shape(start))
        if nd is not None:
            return start, views[i:], nd, True
    return operand, [], None, False


def _repeat(cx, rep: ir.Value):
    """(x, kv heads, nodes) when `rep` [B, N, L, D] is LLaMA's repeat_kv of x [B, Nkv, L, D]:
    Reshape(Expand(Unsqueeze(x, [2]), [B, Nkv, G, L, D]), [B, N, L, D]) with N = Nkv * G, each intermediate read
    once; None otherwise. Row-major order makes query head h read K/V head h // G, as GroupQueryAttention does
    (the shapes prove it: B, L, D unchanged, axes 1 and 2 merged).

    Like the head views, the repeat is matched whether or not its nodes are free: a repeat that something
    outside reads stays as a kept view (`_kept_views`), and the caller checks freeness of the members only.
    (Checking it here made planning and `recheck` disagree: at recheck a kept repeat is outside the group.)"""
    r = rep.producer()
    if not is_op(r, "Reshape"):
        return None
    e = r.inputs[0].producer()
    if not is_op(e, "Expand") or sole_consumer(r.inputs[0]) is not r:
        return None
    u = e.inputs[0].producer()
    if not is_op(u, "Unsqueeze") or e.inputs[0].is_graph_output() or \
            any(n is not e and not is_op(n, "Shape") for n in consumers(e.inputs[0])):
        return None  # a Shape of the Unsqueeze may compute the Expand's target (it goes with the group)
    axes = cx.constant(u.inputs[1]) if len(u.inputs) > 1 else attr(u, "axes")
    if axes is None or [int(a) for a in np.asarray(axes).reshape(-1)] not in ([2], [-4]):
        return None
    xs, es, rs = cx.shape(u.inputs[0]), cx.shape(e.outputs[0]), cx.shape(rep)
    if xs is None or es is None or rs is None or len(xs) != 4 or len(es) != 5 or len(rs) != 4 or None in xs + es + rs:
        return None
    nkv, g, n = es[1], es[2], rs[1]
    if not all(isinstance(v, int) for v in (nkv, g, n)) or nkv != xs[1] or nkv * g != n or g < 2 or \
            (es[0], es[3], es[4]) != (xs[0], xs[2], xs[3]) or (rs[0], rs[2], rs[3]) != (xs[0], xs[2], xs[3]):
        return None
    return u.inputs[0], nkv, [u, e, r]


def _cache(cx, xk: ir.Value, xv: ir.Value):
    """(past_key, past_value, new K, new V, K Concat, V Concat) when the repeated K and V [B, Nkv, P+S, D] are
    each Concat(past [B, Nkv, P, D], new [B, Nkv, S, D]) on the sequence axis (the KV cache, appended to), with
    one past length for K and V; None when neither is a Concat; Refused for a Concat that is not this form."""
    ck, cv = xk.producer(), xv.producer()
    if not is_op(ck, "Concat") and not is_op(cv, "Concat"):
        return None
    if not (is_op(ck, "Concat") and is_op(cv, "Concat")):
        raise Refused("only one of K and V is concatenated with a past (GroupQueryAttention takes both or neither)")
    out = []
    for name, c in (("K", ck), ("V", cv)):
        rank = cx.rank(c.outputs[0])
        axis = int(attr(c, "axis", 0))
        if rank != 4 or len(c.inputs) != 2 or axis % 4 != 2:
            raise Refused(f"{name} is Concat {c.name} of {len(c.inputs)} inputs on axis {axis}, not Concat(past, new) "
                          "on the sequence axis of [B, Nkv, L, D]")
        past, new = c.inputs
        ps, ns = cx.shape(past), cx.shape(new)
        if ps is None or ns is None or len(ps) != 4 or len(ns) != 4 or ps[0] != ns[0] or ps[1] != ns[1] or \
                ps[3] != ns[3] or None in (ps[0], ps[1], ps[2], ps[3]):
            raise Refused(f"{name}'s Concat {c.name}: past {ps} and new {ns} are not provably [B, Nkv, P, D] and "
                          "[B, Nkv, S, D]")
        if not past.is_graph_input() or new.is_graph_input() or cx.constant(past) is not None:
            # the cache comes in as a graph input and this step's K/V are computed: anything else (Concat(new,
            # past), a past computed in the graph) is not provably the cache appended to
            raise Refused(f"{name}'s Concat {c.name} is not Concat(past, new) with the past a graph input and the "
                          "new keys computed")
        out.append((past, new, c))
    (pk, nk, ck), (pv, nv, cv) = out
    if cx.shape(pk)[2] != cx.shape(pv)[2]:
        raise Refused(f"the K and V pasts have lengths {cx.shape(pk)[2]} and {cx.shape(pv)[2]}, not provably one")
    return pk, pv, nk, nv, ck, cv


def _scores(cx, sm: ir.Node):
    """(MatMul, mask or None, scale of the scores, nodes) of Softmax(s3 * MatMul(..) [+ mask])."""
    x, nodes, mask = sm.inputs[0], [], None
    add = x.producer()
    if is_op(add, "Add") and cx.free(add) and sole_consumer(x) is sm:
        for s, m in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
            inner = _scaled(cx, s)[0]
            if is_op(inner.producer(), "MatMul") and not is_op(m.producer(), "MatMul"):
                x, mask = s, m
                nodes.append(add)
                break
        else:
            return None
    inner, s3, scale_node = _scaled(cx, x)
    mm = inner.producer()
    if not is_op(mm, "MatMul") or not cx.free(mm) or sole_consumer(inner) is None:
        _not_additive(cx, inner)
        return None
    nodes += [scale_node] if scale_node is not None else []
    return mm, mask, s3, nodes + [mm]


def _not_additive(cx, x: ir.Value) -> None:
    """Refused when the scores (a rank-4 MatMul, maybe scaled) reach the Softmax through another elementwise op
    with a computed operand: a mask that is not added (Mul by a 0/1 mask, Sub, Where) is no attention_bias."""
    n = x.producer()
    if not is_op(n, "Mul", "Div", "Sub", "Where", "Max", "Min") or not cx.free(n):
        return
    for i, v in enumerate(n.inputs):
        inner = _scaled(cx, v)[0] if v is not None else None
        mm = inner.producer() if inner is not None else None
        if is_op(mm, "MatMul") and cx.rank(inner) == 4:
            others = [o for j, o in enumerate(n.inputs) if j != i and o is not None]
            if all(cx.constant(o) is not None and scalar(cx.constant(o)) is not None for o in others):
                return  # a scale the Softmax reads through another scale: not a mask
            raise Refused(f"the scores {mm.name} reach the Softmax through {n.op_type} {n.name}: a mask that is not "
                          "added (MultiHeadAttention only adds attention_bias)",
                          condition="Softmax(scale * Q@K^T [+ additive mask])",
                          found=f"{n.op_type} {n.name} of the scores and {others[0].name if others else '?'}",
                          matched=2)


def _guard(cx, p: ir.Value):
    """(value the context MatMul reads, guard nodes) for P or Where(IsNaN(P), 0, P)."""
    readers = consumers(p)
    if len(readers) == 1:
        return p, []
    isnan = next((n for n in readers if is_op(n, "IsNaN")), None)
    where = next((n for n in readers if is_op(n, "Where")), None)
    if len(readers) != 2 or isnan is None or where is None or not cx.free(isnan, where) or \
            list(where.inputs) != [isnan.outputs[0], where.inputs[1], p] or \
            not exact(cx.constant(where.inputs[1]), 0.0) or sole_consumer(isnan.outputs[0]) is not where:
        return None
    return where.outputs[0], [isnan, where]


def _mask_finite(cx, mask: ir.Value) -> bool:
    """Whether the additive mask is provably finite (no -inf: no fully masked row can give NaN)."""
    c = cx.constant(mask)
    if c is not None:
        return bool(np.all(np.isfinite(c)))
    w = mask.producer()
    if is_op(w, "Where") and len(w.inputs) == 3:
        a, b = cx.constant(w.inputs[1]), cx.constant(w.inputs[2])
        return a is not None and b is not None and bool(np.all(np.isfinite(a)) and np.all(np.isfinite(b)))
    return False


def _mask_ok(cx, mask: ir.Value, b, s, length, heads: int) -> str | None:
    """Why the mask cannot be MultiHeadAttention's attention_bias ([B or 1, 1 or N, S, L]), or None."""
    ms = cx.shape(mask)
    if ms is None or len(ms) != 4:
        return f"mask shape {ms} is not a known rank-4 shape"
    if ms[0] not in (1, b) or ms[1] not in (1, heads) or ms[2] != s or ms[3] != length or None in ms:
        return f"mask shape {list(ms)} is not [B or 1, 1 or N, S, L] = [{b} or 1, 1 or {heads}, {s}, {length}]"
    return None


_SHAPE_OPS = ("Shape", "Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Cast", "Identity", "Mul", "Reshape",
              "Equal", "Where")  # the TorchScript exporter writes an Expand target as Where(Equal(s, -1), 1, s)


def _support(cx, members: list[ir.Node]) -> list[ir.Node]:
    """The shape arithmetic computing the group's Reshape targets that nothing outside the group reads.

    Dynamo exports take `Shape` of an intermediate (K after its head split) to build the next Reshape's target;
    those nodes go with the group, or the intermediate would escape it.
    """
    inside = {id(n) for n in members}
    frontier = [n.inputs[1] for n in members if is_op(n, "Reshape", "Expand") and len(n.inputs) > 1]
    cand, seen = [], set()
    while frontier:
        v = frontier.pop()
        p = v.producer() if v is not None else None
        if p is None or id(p) in inside or id(p) in seen or not is_op(p, *_SHAPE_OPS) or not cx.free(p):
            continue
        seen.add(id(p))
        cand.append(p)
        if p.op_type != "Shape":
            frontier.extend(i for i in p.inputs if i is not None)
    keep = {id(p) for p in cand}
    changed = True
    while changed:
        changed = False
        for p in cand:
            if id(p) in keep and any(o.is_graph_output() or any(id(u.node) not in inside | keep for u in o.uses())
                                     for o in p.outputs):
                keep.discard(id(p))
                changed = True
    return [p for p in cand if id(p) in keep]


def _kept_views(views: list[ir.Node], members: list[ir.Node]) -> list[ir.Node]:
    """The leading views of one side that something outside the group reads (only their shapes: `trace_back`
    allows no other reader): they stay, the group takes the views after them.

    T5's layer 0 reads `key_states.shape` for its position bias through a Transpose of K's head view; that view
    (a Reshape, which onnxruntime runs as an alias) stays for it, and the fused op reads the projection itself.
    Taking the Shape into the group instead would make the group feed its own mask (a cycle)."""
    inside = {id(n) for n in members}
    last = -1
    for i, view in enumerate(views):
        if any(id(u.node) not in inside for u in view.outputs[0].uses()) and shape_branch(view.outputs[0], members):
            last = i
    return views[:last + 1]


def _fill_kernels(four: bool, group: int) -> int:
    """Kernels `_nan_fill` writes: Sub and ReduceSum; for grouped K/V heads a Reshape to [B, Nkv, 1, D] (none
    when V is already in heads), the Expand over the group and the flatten; for V in heads without a group the
    flatten alone."""
    return 2 + ((0 if four else 1) + 2 if group > 1 else (1 if four else 0))


def _nan_fill(cx, m: Match) -> list[ir.Node]:
    """Nodes computing what the guarded P' @ V gives in a row P' zeroed, per output column: ReduceSum(V - V)
    over the key axis, 0 where every value of that V column is finite, NaN where one is not (0 * inf and
    0 * NaN are NaN). Brought to [B, 1, N*D], which broadcasts over the output's [B, S, N*D]; for grouped K/V
    heads the flag of K/V head h // G fills output head h."""
    d, name = m.data, m.anchor.name
    four, kv, group, size = d.fill
    v = d.v
    sub = cx.node("Sub", [v, v], base=f"{name}_v_finite")
    axis = 2 if four else 1  # the key axis: [B, Nkv, L, D] or [B, L, Nkv*D]
    if cx.graph.opset >= 13:
        red = cx.node("ReduceSum", [sub.outputs[0], cx.initializer(f"{name}_key_axis", np.array([axis], np.int64))],
                      base=f"{name}_v_nan")
    else:
        red = cx.node("ReduceSum", [sub.outputs[0]], {"axes": [axis]}, base=f"{name}_v_nan")
    nodes = [sub, red]  # [B, Nkv, 1, D] or [B, 1, Nkv*D]
    if group > 1:
        if not four:
            shape = cx.initializer(f"{name}_fill_kv", np.array([0, kv, 1, size], np.int64))
            nodes.append(cx.node("Reshape", [nodes[-1].outputs[0], shape], base=f"{name}_fill_kv"))
        grow = cx.initializer(f"{name}_fill_group", np.array([1, 1, group, 1], np.int64))
        nodes.append(cx.node("Expand", [nodes[-1].outputs[0], grow], base=f"{name}_fill_group"))
    if group > 1 or four:
        shape = cx.initializer(f"{name}_fill_flat", np.array([0, 1, -1], np.int64))
        nodes.append(cx.node("Reshape", [nodes[-1].outputs[0], shape], base=f"{name}_fill"))
    return nodes


@dataclass(frozen=True, eq=False)
class _Repeated:
    """K and V as GroupQueryAttention reads them, before their repeat_kv: the values, the views (and the repeat)
    that go with the fusion, how many kernels transposing K/V back from heads adds, and what the plan says of it."""
    kv: GroupedKV
    k: ir.Value
    v: ir.Value
    k_views: list
    v_views: list
    extra: int
    note: str


@dataclass(frozen=True, eq=False)
class _Found:
    """What `Attention._found` saw around one Softmax: each side (the tensor the fused op reads, the views on the
    way, in heads or not), the heads (N, D) of Q/K and of V, the mask, the scale, and the nodes between."""
    sm: ir.Node
    values: ShapeValues
    q: ir.Value
    k: ir.Value
    v: ir.Value
    q_views: list
    k_views: list
    v_views: list
    q4: bool
    k4: bool
    nd: tuple
    vd: tuple
    mask: ir.Value | None
    scale: float
    pre: list  # the scaling Muls/Divs on Q and K
    nodes: list  # the score nodes between Q@K^T and the Softmax
    guarded: tuple  # (the probabilities @V reads, the NaN-guard nodes)
    ctx_mm: ir.Node
    out: tuple  # (the output value, its views, flattened for a Gemm)
    target: object  # the attention op for this lowering


class Attention(Rule):
    """Q·K^T scaled, masked, Softmax, @V, with the head views -> com.microsoft MultiHeadAttention."""

    names = ("attention", "gqa")
    anchors = ("Softmax",)
    fixed = True
    same_shape = False

    def match(self, cx, sm: ir.Node) -> Match | None:
        """Find the whole pattern around the Softmax, prove it legal, and write it both ways: GroupQueryAttention
        on the K/V heads before their repeat (when K and V are repeats) with MultiHeadAttention as its fallback;
        `cut` keeps the one the enabled rules ask for."""
        f = self._found(cx, sm)
        if f is None:
            return None
        gqa, why = self._grouped(cx, f.values, sm, f.q, f.q4, f.k, f.v, f.k4, f.nd) if f.k4 else (None, None)
        if gqa is not None and gqa.kv.past is not None and f.guarded[1] and \
                (f.mask is not None and not _mask_finite(cx, f.mask)):
            gqa, why = None, Refused("GroupQueryAttention not written: a NaN guard that must stay, with a KV cache "
                                     "(its fill reads the whole cache); MultiHeadAttention after the repeat").at("gqa", sm)
        mha = self._written_as(cx, f, None)
        if why is not None and mha is not None:
            mha = replace(mha, refusals=[why])
        if gqa is None:
            return mha if mha is not None or why is None else Match("attention", sm, [sm], refusals=[why])
        grouped = self._written_as(cx, f, gqa) or Match("gqa", sm, [sm])  # (its members taken: nothing while gqa is on)
        return replace(grouped, fallback=mha if mha is not None else Match("attention", sm, [sm]))

    def _found(self, cx, sm: ir.Node) -> "_Found | None":
        """Q·K^T (scaled, masked) -> Softmax -> @V with the views of each side, or None; a near miss raises."""
        if cx.rank(sm.inputs[0]) != 4:
            return None
        axis = int(attr(sm, "axis", -1 if cx.graph.opset >= 13 else 1))
        if axis not in (-1, 3):
            if _scores(cx, sm) is not None:
                raise Refused(f"the Softmax normalises axis {axis} of the scores, not the keys' (last) axis",
                              condition="Softmax over the last axis of Q@K^T", found=f"axis {axis}", matched=2)
            return None
        scores = _scores(cx, sm)
        if scores is None:
            return None
        mm, mask, s3, nodes = scores
        values = ShapeValues(cx.graph, cx.info)
        (q_in, s1, q_scale), (k_in, s2, k_scale) = _scaled(cx, mm.inputs[0]), _scaled(cx, mm.inputs[1])
        q, q_views, nd, q4 = _side(cx, values, q_in, "bnsd")
        k, k_views, kd, k4 = _side(cx, values, k_in, "bnds")
        if nd is None or kd is None:
            return None
        if kd != nd:
            raise Refused(f"K has {kd[0]} heads of {kd[1]} where Q has {nd[0]} of {nd[1]} (a K/V head count "
                          "broadcast by the MatMul, not repeated explicitly, is not MultiHeadAttention)",
                          matched=len(nodes) + 1)
        guarded = _guard(cx, sm.outputs[0])
        ctx_mm = sole_consumer(guarded[0]) if guarded is not None else None
        if guarded is None or not is_op(ctx_mm, "MatMul") or ctx_mm.inputs[0] is not guarded[0] or not cx.free(ctx_mm):
            return None
        v, v_views, vd, v4 = _side(cx, values, ctx_mm.inputs[1], "bnsd")
        if vd is None:
            return None
        if vd[0] != nd[0]:
            raise Refused(f"V has {vd[0]} heads where Q has {nd[0]}")
        if k4 != v4:
            raise Refused(f"key and value come in different forms (K {'[B,N,L,D]' if k4 else '[B,L,N*D]'}, "
                          f"V {'[B,N,L,D]' if v4 else '[B,L,N*D]'}): MultiHeadAttention takes both alike")
        out = self._output(cx, values, ctx_mm, q, q4, nd[0], vd[1])
        if out is None:
            raise Refused("the context does not return to [B, S, N*D] through views")
        self._legal(cx, q, k, v, mask, nd[0], q4, k4)
        target = attention_target(cx.lower)
        if target is None:  # (GroupQueryAttention has a target exactly when MultiHeadAttention has one)
            raise Refused(f"no attention op for lower={cx.lower.value!r}")
        return _Found(sm, values, q, k, v, q_views, k_views, v_views, q4, k4, nd, vd, mask, s1 * s2 * s3,
                      [n for n in (q_scale, k_scale) if n is not None], nodes, guarded, ctx_mm, out, target)

    @staticmethod
    def _written_as(cx, f: "_Found", gqa: "_Repeated | None") -> Match | None:
        """The match as MultiHeadAttention (gqa None) or as GroupQueryAttention on the K/V heads before the
        repeat (the repeat goes too); None when another group has some of its members."""
        nd, vd, mask, out = f.nd, f.vd, f.mask, f.out
        kk, vv, kv_views, vv_views = f.k, f.v, f.k_views, f.v_views
        if gqa is not None:
            kk, vv = gqa.k, gqa.v
            kv_views, vv_views = gqa.k_views + f.k_views, gqa.v_views + f.v_views
        members = f.q_views + kv_views + vv_views + f.pre + f.nodes + [f.sm] + f.guarded[1] + [f.ctx_mm] + out[1]
        whole = members + _support(cx, members)
        kept = [n for views in (f.q_views, kv_views, vv_views) for n in _kept_views(views, whole)]
        members = [n for n in members if n not in kept]
        members += _support(cx, members)  # the shape arithmetic of kept views (a kept repeat's Expand target) stays
        if not cx.free(*members):
            return None
        keep_guard = bool(f.guarded[1]) and mask is not None and not _mask_finite(cx, mask)
        # what the kept guard fills a NaN with comes from V as the fused op reads it: (in heads, K/V heads, group,
        # head size)
        fill = (gqa.kv.k4[1], gqa.kv.kv_heads, nd[0] // gqa.kv.kv_heads, nd[1]) if gqa is not None else \
            (f.k4, nd[0], 1, vd[1])
        op = gqa_target(cx.lower) if gqa is not None else f.target
        heads = (f"{nd[0]} heads of {nd[1]}, K/V {gqa.kv.kv_heads} heads (GroupQueryAttention, causal=0, the "
                 "repeat removed: measured faster than MultiHeadAttention after it, benchmarks/results/gqa.md)"
                 if gqa is not None else f"{nd[0]} heads of {nd[1]}") + ", layouts proved"
        # the kernels `rewrite` writes besides the attention op: a query in heads goes back to [B, S, N*D]
        # (Transpose + Reshape), the flatten for a Gemm, the NaN guard, GQA's K/V transposed back
        extra = (2 if f.q4 else 0) + (1 if out[2] else 0) + (2 + _fill_kernels(fill[0], fill[2]) if keep_guard else 0) \
            + (gqa.extra if gqa is not None else 0)
        grouped = gqa.kv if gqa is not None else None
        return Match("gqa" if gqa is not None else "attention", f.sm, members,
                     f"{heads}; mask {'none' if mask is None else 'as attention_bias'}; "
                     f"guard {'kept' if keep_guard else 'none'}" + (f"; {gqa.note}" if gqa is not None and gqa.note else ""),
                     op.op, op.kernels + extra,
                     outputs=[out[0]] + ([c.outputs[0] for c in gqa.kv.past[2:]] if gqa is not None and gqa.kv.past
                                         else []),
                     data=AttentionData(kk, vv, f.q, mask, nd[0], f.scale, keep_guard, fill,
                                        out[2] and nd[0] * vd[1], f.q4 and nd[0] * nd[1], grouped))

    def cut(self, m: Match, rules: frozenset[str], limit: int | None) -> Match | None:
        """GroupQueryAttention while `gqa` is on; else MultiHeadAttention after the repeat, with `attention` on,
        and the refusal saying why GroupQueryAttention was not written (rule gqa off, or its near miss)."""
        if m.rule == "gqa" and "gqa" in rules:
            return m
        mha = m.fallback if m.rule == "gqa" else m
        repeat = m.rule == "gqa" or bool(m.refusals)  # K/V repeated from fewer heads
        refusals = list(mha.refusals) if "gqa" in rules else [Refused(GQA_OPT_IN).at("gqa", m.anchor)] if repeat else []
        if "attention" not in rules:
            return replace(mha, nodes=[m.anchor], refusals=refusals)
        return replace(mha, refusals=refusals)

    @staticmethod
    def _grouped(cx, values, sm: ir.Node, q, q4: bool, k, v, k4: bool, nd) -> tuple["_Repeated | None", Refused | None]:
        """GroupQueryAttention's K and V when both are repeat_kv results of the same Nkv < N heads: V (and K
        without a rotary) as their [B, L, Nkv*D] projections, a rotated K [B, Nkv, L, D] as it is (the rewrite
        transposes it back); and None. (None, the near miss of rule `gqa`) when they are repeats but GroupQuery-
        Attention cannot be written; (None, None) when they are no repeats."""
        rk, rv = _repeat(cx, k), _repeat(cx, v)
        if rk is None or rv is None:
            return None, None
        (xk, nkv, k_rep), (xv, nkv_v, v_rep) = rk, rv
        try:
            cache = _cache(cx, xk, xv)
        except Refused as exc:
            return None, Refused(f"GroupQueryAttention not written: {exc}; MultiHeadAttention after the repeat").at("gqa", sm)
        if cache is not None:  # the repeat reads the present cache: GroupQueryAttention appends to the past itself
            pk, pv, xk, xv, ck, cv = cache
            k_rep, v_rep = [ck] + list(k_rep), [cv] + list(v_rep)
        why = None
        qs, ks = cx.shape(q), cx.shape(xk)
        if nkv != nkv_v:
            why = f"K repeats {nkv} heads, V {nkv_v}"
        elif nd[0] % nkv:
            why = f"{nd[0]} query heads are no multiple of {nkv} K/V heads"
        elif qs is None or ks is None or qs[2 if q4 else 1] != ks[2] or qs[2 if q4 else 1] is None:
            why = (f"query length {qs and qs[2 if q4 else 1]} is not provably the "
                   f"{'new keys' if cache is not None else 'key'} length {ks and ks[2]} "
                   "(self-attention only, with or without a cache)")
        elif cache is not None and qs[0] != 1 and qs[2 if q4 else 1] != 1:
            # onnxruntime 1.31's CPU kernel: "batch_size must be 1 when sequence_length > 1 and past context is given"
            why = (f"batch ({qs[0]}) and query length ({qs[2 if q4 else 1]}) with a KV cache: onnxruntime's kernel "
                   "takes a past with more than one new token only at batch 1 (neither is provably 1)")
        elif nd[1] % 8:  # onnxruntime 1.31's CPU kernel: "head_size must be a multiple of 8"
            why = f"head size {nd[1]} is not a multiple of 8 (onnxruntime's CPU kernel needs one)"
        elif cx.graph.opset < 15:
            why = f"opset {cx.graph.opset} < 15 (Shape with start/end builds seqlens_k)"
        elif cx.dtype(q) not in (F32, np.dtype(np.float16)):
            why = f"dtype {cx.dtype(q)}"
        if why:
            return None, Refused(f"GroupQueryAttention not written: {why}; MultiHeadAttention after the repeat").at("gqa", sm)
        sides, extra = {}, 0
        for name, x, rep in (("k", xk, k_rep), ("v", xv, v_rep)):
            base, views, kvd, split = _side(cx, values, x, "bnsd", reader=rep[0] if rep else None)
            if kvd == (nkv, nd[1]) and not split and cx.rank(base) == 3:
                sides[name] = (base, views + list(rep), False)
            else:  # a value already in heads (the rotary's output): Transpose + Reshape to [B, L, Nkv*D]
                sides[name] = (x, list(rep), True)
                extra += 2
        # seqlens_k and total_sequence_length come from q's shape at run time (see `_gqa`) when (B, S) are not
        # ints: host-side shape arithmetic that launches no kernel (the cost model's `host`), so no extra kernel
        (k, k_views, k4), (v, v_views, v4) = sides["k"], sides["v"]
        back = [n for n, four in zip("KV", (k4, v4)) if four]
        note = "; ".join(([f"{' and '.join(back)} transposed back to [B, L, Nkv*D]"] if back else []) +
                         (["the past K/V taken as past_key/past_value, the present cache its outputs"]
                          if cache is not None else []))
        return _Repeated(GroupedKV(nkv, (k4, v4), nd[1], (qs[0], qs[2 if q4 else 1]),
                                   (pk, pv, ck, cv) if cache is not None else None), k, v, k_views, v_views, extra,
                         note), None

    @staticmethod
    def _output(cx, values, ctx_mm: ir.Node, q: ir.Value, q4: bool, heads: int, dv: int):
        qs = cx.shape(q)
        start = [(Atom("c0", qs[0]),), (Atom("c1", heads),), (Atom("c2", qs[2 if q4 else 1]),), (Atom("c3", dv),)]
        found = None
        unit = {a.name for ax in start for a in ax if a.size == 1}
        want3 = [tuple(n for n in ax if n not in unit) for ax in (("c0",), ("c2",), ("c1", "c3"))]
        want2 = [tuple(n for n in ax if n not in unit) for ax in (("c0", "c2"), ("c1", "c3"))]
        for value, layout, chain in trace_forward(cx, values, ctx_mm.outputs[0], start):
            got = names(layout)
            if got == want3 and len(layout) == 3:
                found = (value, chain, False)
            elif got == want2 and len(layout) == 2:  # flattened to [B*S, N*D] for a Gemm (GPT-2's Conv1D)
                found = (value, chain, True)
        return found

    @staticmethod
    def _legal(cx, q: ir.Value, k: ir.Value, v: ir.Value, mask, heads: int, q4: bool, k4: bool) -> None:
        for name, t, four in (("q", q, q4), ("k", k, k4), ("v", v, k4)):
            if cx.dtype(t) not in ATTENTION_DTYPES or cx.rank(t) != (4 if four else 3):
                raise Refused(f"{name} is not a rank-{4 if four else 3} float32 or float16 tensor "
                              f"(found {cx.dtype(t)}, rank {cx.rank(t)})")
        if len({cx.dtype(t) for t in (q, k, v)}) != 1:
            raise Refused("q, k and v differ in dtype")
        length = 2 if k4 else 1
        if cx.shape(k)[length] != cx.shape(v)[length]:
            raise Refused("key and value lengths differ")
        batches = [cx.shape(t)[0] for t in (q, k, v)]
        if len(set(batches)) != 1:  # a MatMul broadcasts a batch of 1; the fused op does not
            raise Refused(f"query, key and value batches are {', '.join(map(str, batches))} (the MatMuls broadcast "
                          "them; MultiHeadAttention needs one batch)")
        if mask is not None:
            why = _mask_ok(cx, mask, cx.shape(q)[0], cx.shape(q)[2 if q4 else 1], cx.shape(k)[length], heads)
            if why:
                raise Refused(why)

    def rewrite(self, cx, m: Match) -> list[ir.Node]:
        d = m.data
        out, q = [], d.q
        if d.q4:  # MultiHeadAttention's query is [B, S, N*D]: a Q already in heads goes back
            t = cx.node("Transpose", [q], {"perm": [0, 2, 1, 3]}, base=f"{m.anchor.name}_q_bsnd")
            shape = cx.initializer(f"{m.anchor.name}_q_bsh", np.array([0, 0, d.q4], np.int64))
            out += [t, cx.node("Reshape", [t.outputs[0], shape], base=f"{m.anchor.name}_q_bsh")]
            q = out[-1].outputs[0]
        if d.gqa:
            out += self._gqa(cx, m, q)
        else:
            ins = [q, d.k, d.v, None, None] + ([d.mask] if d.mask is not None else [])
            out += [cx.node("MultiHeadAttention", ins, {"num_heads": int(d.heads), "scale": float(d.scale)},
                           domain="com.microsoft", base=f"{m.anchor.name}_mha")]
        mha = len(out) - 1
        if d.guard:
            fill = _nan_fill(cx, m)
            isnan = cx.node("IsNaN", [out[mha].outputs[0]], base=f"{m.anchor.name}_isnan")
            out += fill + [isnan, cx.node("Where", [isnan.outputs[0], fill[-1].outputs[0], out[mha].outputs[0]],
                                          base=f"{m.anchor.name}_guard")]
        if d.flatten:
            shape = cx.initializer(f"{m.anchor.name}_flat", np.array([-1, d.flatten], np.int64))
            out.append(cx.node("Reshape", [out[-1].outputs[0], shape], base=f"{m.anchor.name}_flatten"))
        return out

    @staticmethod
    def _gqa(cx, m: Match, q: ir.Value) -> list[ir.Node]:
        """GroupQueryAttention(q, k, v, seqlens_k=S-1 per batch, total_sequence_length=S, attention_bias=mask,
        causal=0): no past, every key position valid, the graph's own mask added as it is (so the causal part
        and any padding stay exactly what the graph computes)."""
        d, g, name = m.data, m.data.gqa, m.anchor.name
        nodes, kv = [], []
        for side, four in (("k", g.k4[0]), ("v", g.k4[1])):
            x = getattr(d, side)
            if four:  # [B, Nkv, L, D] -> [B, L, Nkv*D]
                t = cx.node("Transpose", [x], {"perm": [0, 2, 1, 3]}, base=f"{name}_{side}_bsnd")
                shape = cx.initializer(f"{name}_{side}_bsh", np.array([0, 0, g.kv_heads * g.head_size], np.int64))
                nodes += [t, cx.node("Reshape", [t.outputs[0], shape], base=f"{name}_{side}_bsh")]
                x = nodes[-1].outputs[0]
            kv.append(x)
        qs = g.bs  # (batch, sequence) of the query, as the match saw them
        plen = cx.shape(g.past[0])[2] if g.past is not None else 0  # the past's length: total = past + S
        if isinstance(qs[0], int) and isinstance(qs[1], int) and isinstance(plen, int):
            seqlens = cx.initializer(f"{name}_seqlens_k", np.full(qs[0], plen + qs[1] - 1, np.int32))
            total = cx.initializer(f"{name}_total_seq", np.array(plen + qs[1], np.int32))
        else:  # from the shapes at run time: Shape -> Cast -> [S] (+ [P]) -> scalar, minus 1 expanded to [B]
            s1 = cx.node("Shape", [q], {"start": 1, "end": 2}, base=f"{name}_seq")
            length = [s1]
            if g.past is not None:
                p1 = cx.node("Shape", [g.past[0]], {"start": 2, "end": 3}, base=f"{name}_past_len")
                length += [p1, cx.node("Add", [s1.outputs[0], p1.outputs[0]], base=f"{name}_total_len")]
            c = cx.node("Cast", [length[-1].outputs[0]], {"to": int(ir.DataType.INT32)}, base=f"{name}_seq32")
            scalar_shape = cx.initializer(f"{name}_scalar", np.array([], np.int64))
            tot = cx.node("Reshape", [c.outputs[0], scalar_shape], base=f"{name}_total_seq")
            one = cx.initializer(f"{name}_one", np.array(1, np.int32))
            last = cx.node("Sub", [tot.outputs[0], one], base=f"{name}_last")
            b = cx.node("Shape", [q], {"start": 0, "end": 1}, base=f"{name}_batch")
            sk = cx.node("Expand", [last.outputs[0], b.outputs[0]], base=f"{name}_seqlens_k")
            nodes += length + [c, tot, last, b, sk]
            seqlens, total = sk.outputs[0], tot.outputs[0]
        past = list(g.past[:2]) if g.past is not None else [None, None]
        ins = [q, kv[0], kv[1], *past, seqlens, total, None, None, None,
               d.mask if d.mask is not None else None]
        while ins[-1] is None:
            ins.pop()
        attrs = {"num_heads": int(d.heads), "kv_num_heads": int(g.kv_heads), "scale": float(d.scale),
                 "causal": 0}
        nodes.append(cx.node("GroupQueryAttention", ins, attrs, domain="com.microsoft", base=f"{name}_gqa",
                             num_outputs=3 if g.past is not None else 1))
        return nodes

    def outputs(self, m: Match, new_nodes: list[ir.Node]) -> list[tuple[ir.Value, ir.Value]]:
        """The context from the last new node; with a KV cache, the present K and V (the Concats' outputs) from
        GroupQueryAttention's outputs 1 and 2."""
        pairs = Rule.outputs(self, m, new_nodes)
        g = m.data.gqa if isinstance(m.data, AttentionData) else None
        if g is not None and g.past is not None:
            op = next(n for n in new_nodes if n.op_type == "GroupQueryAttention")
            pairs += [(g.past[2].outputs[0], op.outputs[1]), (g.past[3].outputs[0], op.outputs[2])]
        return pairs
