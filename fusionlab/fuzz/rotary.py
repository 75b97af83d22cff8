"""Generator patterns for rotary position embeddings, as LLaMA (TorchScript and dynamo) and GPT-J write them.

A [B, S, H] tensor is split into N heads of D (Reshape, Transpose to [B, N, S, D]), rotated, and merged back:

- the cos/sin: computed as the exporters write it (positions ``Range(0, Shape(x)[1])`` -> Unsqueeze -> Cast ->
  ``* inv_freq`` -> ``Concat(f, f)`` -> Cos / Sin [-> ``* attention_scaling``] [-> Cast to the dtype] ->
  Unsqueeze to [1, 1, S, D]), or folded to constants (static S: what constant folding leaves);
- the layout: after the heads Transpose ([B, N, S, D], LLaMA) or before it ([B, S, N, D], GPT-J);
- the rotation: rotate_half (``Concat(Neg(x[..., h:]), x[..., :h])``) or rotate_every_two (strided Slices,
  ``stack(-odd, even).flatten(-2)``, the cos repeated pairwise, constant), over all channels or the first r
  (partial rotary: ``cat(rotated, x[..., r:])``);
- cos and sin sometimes swapped (the same function for the fused op: it fuses).

The heads go on to attention's MatMuls mostly; transposed straight back, the rule leaves them to onnxruntime
(it cancels the Transpose pair; measured faster than the fused op), tagged ``rotary_transposed_back``.

Near misses (refused): Neg on the wrong half, the halves in the wrong order, unequal halves, a constant cos
whose halves differ, and a cos per batch row from a position_ids graph input (no bound on the positions).
"""

from __future__ import annotations

import numpy as np

from .builder import Builder, DTYPES, Pattern

__all__ = ["rotary", "PATTERNS"]

_BIG = np.iinfo(np.int64).max


def _freqs(b: Builder, d: int) -> np.ndarray:
    base = b.rng.choice((10000.0, 500.0))
    return (1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)).astype(np.float32)


def _computed(b: Builder, x: str, s, d: int, per_batch: bool, tok: int) -> tuple[str, str]:
    """cos, sin [1, 1, S, d] (tok 1; [1, S, 1, d]: tok 2) computed in the graph (float32, cast to the dtype);
    per_batch: from a [B, S] position_ids input (a near miss)."""
    bsz = b.shape(x)[0]
    if per_batch:
        pos = b.input((bsz, s), "position_ids", dtype=np.int64)
        lead = (bsz, s)
    else:
        shp = b.node("Shape", [x], (3,), dtype=np.int64)
        n = b.node("Gather", [shp, b.const(np.array(1, np.int64), "one")], (), dtype=np.int64, axis=0)
        r = b.node("Range", [b.const(np.array(0, np.int64), "zero"), n, b.const(np.array(1, np.int64), "step")],
                   (s,), dtype=np.int64)
        pos = b.node("Unsqueeze", [r, b.ints([0], "ax")], (1, s), dtype=np.int64)
        lead = (1, s)
    p3 = b.node("Unsqueeze", [pos, b.ints([2], "ax")], lead + (1,), dtype=np.int64)
    pf = b.node("Cast", [p3], lead + (1,), dtype=np.float32, to=DTYPES[np.dtype(np.float32)])
    inv = b.const(_freqs(b, d), "inv_freq")
    f = b.node("Mul", [pf, inv], lead + (d // 2,), dtype=np.float32)
    emb = b.node("Concat", [f, f], lead + (d,), dtype=np.float32, axis=-1)
    out = []
    for op in ("Cos", "Sin"):
        t = b.node(op, [emb], lead + (d,), dtype=np.float32)
        if b.rng.random() < 0.3:  # attention_scaling (1.0 for default rope: usually folded; here 0.9)
            t = b.node("Mul", [t, b.const(np.array(0.9, np.float32), "scaling")], lead + (d,), dtype=np.float32)
        if b.dtype != np.float32:
            t = b.node("Cast", [t], lead + (d,), to=DTYPES[b.dtype])
        out.append(b.node("Unsqueeze", [t, b.ints([tok], "ax")], (lead[0], 1, s, d) if tok == 1 else (lead[0], s, 1, d)))
    return out[0], out[1]


def _constant(b: Builder, s: int, d: int, interleaved: bool, unequal: bool, tok: int) -> tuple[str, str]:
    ang = np.arange(s, dtype=np.float64)[:, None] * _freqs(b, d).astype(np.float64)[None, :]
    emb = np.repeat(ang, 2, axis=-1) if interleaved else np.concatenate([ang, ang], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)
    if unequal:
        cos = cos.copy()
        cos[:, -1] += 0.25
    shape = ((1, 1, s, d) if b.rng.random() < 0.7 else (s, d)) if tok == 1 else (1, s, 1, d)
    return (b.const(cos.reshape(shape).astype(b.dtype), "cos_cached"),
            b.const(sin.reshape(shape).astype(b.dtype), "sin_cached"))


def _half(b: Builder, q: str, shape: tuple, d: int) -> str:
    h = d // 2
    axis = b.rng.choice((-1, 3))
    split = h
    if b.miss("rotary_unequal_halves"):
        split = h - 1
        b.tags.append("nm:rotary_unequal_halves")
    first = b.node("Slice", [q, b.ints([0], "st"), b.ints([split], "en"), b.ints([axis], "ax")],
                   shape[:3] + (split,))
    second = b.node("Slice", [q, b.ints([split], "st"), b.ints([b.rng.choice((_BIG, d))], "en"), b.ints([axis], "ax")],
                    shape[:3] + (d - split,))
    if b.miss("rotary_neg_first_half"):
        b.tags.append("nm:rotary_neg_first_half")
        parts = [b.node("Neg", [first], b.shape(first)), second]
    elif b.miss("rotary_concat_order"):
        b.tags.append("nm:rotary_concat_order")
        parts = [first, b.node("Neg", [second], b.shape(second))]
    else:
        parts = [b.node("Neg", [second], b.shape(second)), first]
    return b.node("Concat", parts, shape, axis=-1)


def _every_two(b: Builder, q: str, shape: tuple, d: int) -> str:
    half = shape[:3] + (d // 2,)
    even = b.node("Slice", [q, b.ints([0], "st"), b.ints([_BIG], "en"), b.ints([-1], "ax"), b.ints([2], "sp")], half)
    odd = b.node("Slice", [q, b.ints([1], "st"), b.ints([_BIG], "en"), b.ints([-1], "ax"), b.ints([2], "sp")], half)
    if b.miss("rotary_neg_even"):
        b.tags.append("nm:rotary_neg_even")
        even, odd = odd, even
    neg = b.node("Neg", [odd], half)
    parts = [b.node("Unsqueeze", [t, b.ints([-1], "ax")], half + (1,)) for t in (neg, even)]
    stacked = b.node("Concat", parts, half + (2,), axis=-1)
    return b.node("Reshape", [stacked, b.ints([0, 0, 0, d], "flat")], shape)


def rotary(b: Builder, x: str, pool: list[str]) -> str:
    """x [B, S, H] -> heads [B, N, S, D] -> rotary embedding (half or interleaved; partial sometimes) -> [B, S, H]."""
    bsz, s, hid = b.shape(x)
    heads = b.rng.choice([n for n in (1, 2, 4) if hid % n == 0 and (hid // n) % 4 == 0])
    dh = hid // heads
    b.tags.append("rotary")
    split = b.node("Reshape", [x, b.ints([0, 0, heads, dh], "heads")], (bsz, s, heads, dh))
    bsnd = b.rng.random() < 0.25  # rotated before the heads Transpose (GPT-J): [B, S, N, D], tables [1, S, 1, D]
    if bsnd:
        b.tags.append("rotary_bsnd")
    lead = (bsz, s, heads) if bsnd else (bsz, heads, s)
    q = split if bsnd else b.node("Transpose", [split], lead + (dh,), perm=[0, 2, 1, 3])
    full = q
    partial = b.rng.random() < 0.25
    d = dh // 2 if partial else dh
    if partial:
        b.tags.append("rotary_partial")
        q = b.node("Slice", [full, b.ints([0], "st"), b.ints([d], "en"), b.ints([-1], "ax")], lead + (d,))
        rest = b.node("Slice", [full, b.ints([d], "st"), b.ints([_BIG], "en"), b.ints([-1], "ax")], lead + (dh - d,))
    shape = lead + (d,)
    tok = 2 if bsnd else 1
    interleaved = isinstance(s, int) and b.rng.random() < 0.3
    if interleaved:
        b.tags.append("rotary_interleaved")
    if isinstance(s, int) and (interleaved or b.rng.random() < 0.4):
        unequal = b.miss("rotary_cache_halves")
        if unequal:
            b.tags.append("nm:rotary_cache_halves")
        cos, sin = _constant(b, s, d, interleaved, unequal, tok)
    else:
        per_batch = b.miss("rotary_per_batch")
        if per_batch:  # a near miss unless the batch is 1 (one row per token again: it fuses, any positions)
            b.tags.append("nm:rotary_per_batch" if bsz != 1 else "rotary_position_ids_batch1")
        cos, sin = _computed(b, x, s, d, per_batch, tok)
    if b.rng.random() < 0.15:
        b.tags.append("rotary_swapped")
        cos, sin = sin, cos
    rot = _every_two(b, q, shape, d) if interleaved else _half(b, q, shape, d)
    b.mark_inner(rot)
    y = b.binary("Add", b.binary("Mul", q, cos), b.binary("Mul", rot, sin))
    if partial:
        y = b.node("Concat", [y, rest], lead + (dh,), axis=-1)
    if not bsnd and b.rng.random() < 0.75:  # the heads go on to attention (scores y @ y^T, then @ y), as in a decoder
        b.tags.append("rotary_attention")
        yt = b.node("Transpose", [y], (bsz, heads, dh, s), perm=[0, 1, 3, 2])
        sc = b.node("MatMul", [y, yt], (bsz, heads, s, s))
        y = b.node("MatMul", [sc, y], (bsz, heads, s, dh))
    elif not bsnd:
        b.tags.append("rotary_transposed_back")  # refused: onnxruntime cancels the Transpose pair (measured)
    back = y if bsnd else b.node("Transpose", [y], (bsz, s, heads, dh), perm=[0, 2, 1, 3])
    return b.node("Reshape", [back, b.ints([0, 0, hid], "merge")], (bsz, s, hid))


def _fits(b: Builder, x: str) -> float:
    shape = b.shape(x)
    if len(shape) != 3 or not isinstance(shape[-1], int) or shape[-1] % 4 or b.opset < 13:
        return 0.0
    return 1.0


PATTERNS = (Pattern(rotary, _fits),)
