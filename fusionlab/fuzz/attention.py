"""Generator patterns for attention as exporters write it, with its near misses.

Over x [B, S, H]: Q, K, V projections split into heads (Reshape [0, 0, N, D] -> Transpose, or a Reshape target
computed from Shape as TorchScript writes it); K^T by one Transpose or two; the scale on the scores, split over
Q and K^T (SDPA) or on Q alone; an additive mask (Where(keep, 0, fill) over a run-time bool input: causal or
not, any pattern, or a constant bias as T5 and Swin add it), the NaN guard SDPA writes; the context merged back.
LLaMA's form: fewer K/V heads than Q heads repeated explicitly (Unsqueeze -> Expand -> Reshape), rotary on Q and
K (Mul cos, Slice/Neg/Concat, Mul sin, Add). T5's layer 0: K's head view read by a Transpose whose only reader is
a Shape. Near misses: a mask multiplied in instead of added (nm:mask_mul), a single K/V head broadcast by the
MatMul with no repeat (nm:kv_broadcast), Softmax over the queries (nm:softmax_axis). A per-head scale vector
on Q (scale_per_head) is no scalar scale, but the Q it makes is legal as it is (a value already in heads). A
random bool mask is not causal (tag mask_any): the gqa rule writes GroupQueryAttention with causal=0 and the
graph's own mask as attention_bias, so it must stay exact on any mask. GroupQueryAttention's CPU kernel takes
a head size that is a multiple of 8: most grouped draws whose hidden size gives a smaller head project to
heads x 8 and back with an output projection (tag attention_o_proj), the rest fall back to MultiHeadAttention
after the repeat. A decoder's KV cache (tag attention_cache, static shapes): grouped K and V appended to a past
graph input [B, Nkv, P, D] on the sequence axis, the present a graph output, then repeated: the gqa rule takes
the past as past_key / past_value (at batch 1 or one new token; otherwise MultiHeadAttention after the repeat);
near miss: the new K/V first (nm:cache_new_first).
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from .builder import Builder, Pattern

__all__ = ["attention", "PATTERNS"]


def _split(b: Builder, x: str, heads: int, d: int) -> str:
    """[B, S, heads*d] -> [B, heads, S, d]."""
    bsz, seq, _ = b.shape(x)
    y = b.node("Reshape", [x, b.ints([0, 0, heads, d], "split")], (bsz, seq, heads, d))
    return b.node("Transpose", [y], (bsz, heads, seq, d), perm=[0, 2, 1, 3])


def _rotary(b: Builder, t: str) -> str:
    """Hugging Face's rotate_half rotary on [B, N, S, D]: t * cos + cat(-t2, t1) * sin."""
    shape = b.shape(t)
    d = shape[-1]
    cos = b.const(b.rand((1, 1, 1, d)), "cos")
    sin = b.const(b.rand((1, 1, 1, d)), "sin")
    half = shape[:-1] + (d // 2,)
    if b.opset >= 10:
        lo = b.node("Slice", [t, b.ints([0], "st"), b.ints([d // 2], "en"), b.ints([3], "ax")], half)
        hi = b.node("Slice", [t, b.ints([d // 2], "st"), b.ints([d], "en"), b.ints([3], "ax")], half)
    else:
        lo = b.node("Slice", [t], half, starts=[0], ends=[d // 2], axes=[3])
        hi = b.node("Slice", [t], half, starts=[d // 2], ends=[d], axes=[3])
    rot = b.node("Concat", [b.unary("Neg", hi), lo], shape, axis=-1)
    return b.binary("Add", b.binary("Mul", t, cos), b.binary("Mul", rot, sin))


def _repeat(b: Builder, t: str, group: int) -> str:
    """repeat_kv: [B, KV, S, D] -> Unsqueeze -> Expand [B, KV, group, S, D] -> Reshape [B, KV*group, S, D]."""
    bsz, kv, seq, d = b.shape(t)
    if b.opset >= 13:
        u = b.node("Unsqueeze", [t, b.ints([2], "ax")], (bsz, kv, 1, seq, d))
    else:
        u = b.node("Unsqueeze", [t], (bsz, kv, 1, seq, d), axes=[2])
    if b.opset >= 8:
        e = b.node("Expand", [u, b.ints([1, 1, group, 1, 1], "grow")], (bsz, kv, group, seq, d))
    else:
        e = b.node("Concat", [u] * group, (bsz, kv, group, seq, d), axis=2)
    return b.node("Reshape", [e, b.ints([0, kv * group, -1, d], "rep")], (bsz, kv * group, seq, d))


def attention(b: Builder, x: str, pool: list[str]) -> str:
    bsz, seq, hid = b.shape(x)
    heads = b.rng.choice([n for n in (2, 4) if hid % n == 0 and hid // n >= 2])
    d = hid // heads
    gqa = heads >= 2 and b.rng.random() < 0.5
    if gqa and d % 8 and b.rng.random() < 0.6:  # LLaMA's head size is no divisor of a small hidden size: project
        heads, d = b.rng.choice((2, 4)), 8      # to heads*8 and back (o_proj), so GroupQueryAttention's kernel applies
    kv = b.rng.choice([k for k in (1, heads // 2) if k >= 1 and heads % k == 0]) if gqa else heads
    b.tags.append("attention_gqa" if gqa else "attention")
    broadcast = gqa and kv == 1 and b.miss("kv_broadcast")
    if broadcast:
        b.tags.append("nm:kv_broadcast")
    mask = b.rng.choice(("none", "where", "where", "bias"))
    guard = b.rng.random() < 0.5
    neg_inf = guard and mask == "where" and b.rng.random() < 0.5  # a -inf fill: fully masked rows are NaN
    proj = {}
    # V with columns that are not finite (a Sqrt of an input that can be negative): what a guarded row of P @ V
    # gives there (0 * NaN = NaN) is the case a kept guard must not zero (campaign 25's one wrong)
    v_nan = b.rng.random() < (0.5 if neg_inf else 0.1)
    for p, n in (("q", heads), ("k", kv), ("v", kv)):
        w = b.weight((hid, n * d), f"W{p}", "attn_proj", scale=hid ** -0.5)
        y = b.node("MatMul", [x, w], (bsz, seq, n * d))
        if p == "v" and v_nan:
            b.tags.append("attention_v_nonfinite")
            y = b.node("Div", [y, b.node("Sqrt", [b.input((1, 1, n * d), "vscale")], (1, 1, n * d))], b.shape(y))
        proj[p] = _split(b, y, n, d)
        b.mark_inner(proj[p])
    q, k, v = proj["q"], proj["k"], proj["v"]
    if gqa and d % 2 == 0 and b.rng.random() < 0.6:
        b.tags.append("attention_rotary")
        q, k = _rotary(b, q), _rotary(b, k)
    # a decoder's KV cache (use_cache exports): K and V appended to a past graph input on the sequence axis, the
    # present a graph output, then repeated; static shapes (the key length is past + seq). Near miss: the new
    # K/V first (Concat(new, past)), which is no cache GroupQueryAttention appends to
    cache = gqa and not broadcast and isinstance(seq, int) and isinstance(bsz, int) and b.rng.random() < 0.4
    length = seq
    if cache:
        past = b.rng.choice((1, 3))
        length = seq + past
        order = b.miss("cache_new_first")
        b.tags.append("attention_cache")
        if order:
            b.tags.append("nm:cache_new_first")
        for side in ("k", "v"):
            t = k if side == "k" else v
            pt = b.input((bsz, kv, past, d), f"past_{side}")
            cat = b.node("Concat", [t, pt] if order else [pt, t], (bsz, kv, length, d), axis=2)
            b.extra_outputs.append(cat)
            if side == "k":
                k = cat
            else:
                v = cat
    if gqa and not broadcast:
        k, v = _repeat(b, k, heads // kv), _repeat(b, v, heads // kv)
    if not cache and b.rng.random() < 0.2:  # T5's layer 0: key_states.shape through a Transpose only a Shape reads
        kt_ = b.node("Transpose", [k], (bsz, seq, b.shape(k)[1], d), perm=[0, 2, 1, 3])
        b.extra_outputs.append(b.node("Shape", [kt_], (4,), dtype=np.int64))
        b.tags.append("attention_key_shape")
    kdim = b.shape(k)[1]
    if b.rng.random() < 0.5:
        kt = b.node("Transpose", [k], (bsz, kdim, d, length), perm=[0, 1, 3, 2])
    else:  # through [B, S, N, D] and back, as some exports do
        kt = b.node("Transpose", [b.node("Transpose", [k], (bsz, length, kdim, d), perm=[0, 2, 1, 3])],
                    (bsz, kdim, d, length), perm=[0, 2, 3, 1])
    scale = float(d) ** -0.5
    where = b.rng.choice(("split", "q", "scores", "none"))
    if b.rng.random() < 0.1:
        b.tags.append("scale_per_head")
        q = b.binary("Mul", q, b.const(b.rand((1, heads, 1, 1), 0.3, positive=True), "hscale"))
    if where == "split":
        s = scale ** 0.5
        q, kt = b.binary("Mul", q, b.scalar(s, "sq")), b.binary("Mul", kt, b.scalar(s, "sk"))
    elif where == "q":
        q = b.binary("Mul", q, b.scalar(scale, "sq")) if b.rng.random() < 0.7 else \
            b.node("Div", [q, b.scalar(1 / scale, "sq")], b.shape(q))
    scores = b.node("MatMul", [q, kt], (bsz, heads, seq, length))
    if where == "scores":
        scores = b.binary("Mul", scores, b.scalar(scale, "ss"))
    if mask == "where":
        keep = b.input((bsz, 1, seq, length), "keep", dtype=np.bool_)
        b.tags.append("mask_any")
        if b.miss("mask_mul"):
            b.tags.append("nm:mask_mul")
            scores = b.binary("Mul", scores, b.node("Cast", [keep], (bsz, 1, seq, length), to=_onnx_type(b.dtype)))
        else:
            fill = -np.inf if neg_inf else np.finfo(b.dtype).min
            bias = b.node("Where", [keep, b.scalar(0.0, "zero"), b.scalar(fill, "fill")], (bsz, 1, seq, length))
            scores = b.binary("Add", scores, bias)
    elif mask == "bias":  # a constant additive bias (T5's relative positions, Swin's window bias)
        if isinstance(seq, int):
            b.tags.append("mask_bias")
            scores = b.binary("Add", scores, b.const(b.rand((1, heads, seq, length), 0.5), "bias"))
    axis = -1
    if b.miss("softmax_axis"):
        b.tags.append("nm:softmax_axis")
        axis = 2
    probs = b.node("Softmax", [scores], b.shape(scores), axis=axis) if b.opset >= 13 or axis == 2 else \
        b.node("Softmax", [scores], b.shape(scores), axis=3)
    b.mark_inner(scores, probs)
    if guard:
        nan = b.node("IsNaN", [probs], b.shape(probs), dtype=np.bool_)
        probs = b.node("Where", [nan, b.scalar(0.0, "zero"), probs], b.shape(probs))
    ctx = b.node("MatMul", [probs, v], (bsz, heads, seq, d))
    ctx = b.node("Transpose", [ctx], (bsz, seq, heads, d), perm=[0, 2, 1, 3])
    merged = b.node("Reshape", [ctx, b.ints([0, 0, heads * d], "merge")], (bsz, seq, heads * d))
    if heads * d == hid:
        return merged
    b.tags.append("attention_o_proj")
    return b.node("MatMul", [merged, b.weight((heads * d, hid), "Wo", "attn_proj", scale=(heads * d) ** -0.5)],
                  (bsz, seq, hid))


def _onnx_type(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _fits(b: Builder, x: str) -> float:
    shape = b.shape(x)
    if len(shape) != 3 or not isinstance(shape[-1], int) or shape[-1] < 4 or shape[-1] % 2 or b.dtype_of(x) != b.dtype:
        return 0.0
    return 0.6 if b.opset >= 13 else 0.2


PATTERNS = (Pattern(attention, _fits),)
