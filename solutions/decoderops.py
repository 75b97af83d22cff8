"""The first exercise of notebook 12: the fused operators the vertical pass writes into a LLaMA-style decoder."""


def fused_ops(layers, heads, kv_heads, batch, past):
    """Reference: per layer two norms after a residual Add (the very first norm has none), two rotations (Q and K),
    one SiLU; attention is GroupQueryAttention on the cache only with a cache, batch 1 and K/V heads shared,
    MultiHeadAttention after the repeat otherwise, and nothing where the present V is a graph output (no cache)."""
    ops = {"RMSNormalization": 1, "SkipSimplifiedLayerNormalization": 2 * layers, "RotaryEmbedding": 2 * layers,
           "QuickGelu": layers}
    if past and batch == 1 and kv_heads < heads:
        ops["GroupQueryAttention"] = layers
    elif past:
        ops["MultiHeadAttention"] = layers
    return ops


def fused_ops_always_gqa(layers, heads, kv_heads, batch, past):
    """WRONG: GroupQueryAttention whenever there is a cache, whatever the batch."""
    return fused_ops(layers, heads, kv_heads, 1, past)


def fused_ops_every_norm_skip(layers, heads, kv_heads, batch, past):
    """WRONG: every norm a SkipSimplifiedLayerNormalization, the first one (no residual before it) too."""
    ops = fused_ops(layers, heads, kv_heads, batch, past)
    ops["SkipSimplifiedLayerNormalization"] += ops.pop("RMSNormalization")
    return ops


def fused_ops_one_rotary(layers, heads, kv_heads, batch, past):
    """WRONG: one RotaryEmbedding per layer, as if only the queries were rotated."""
    return fused_ops(layers, heads, kv_heads, batch, past) | {"RotaryEmbedding": layers}


def fused_ops_stub(layers, heads, kv_heads, batch, past):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "decoderops"
REFERENCE = fused_ops
WRONG = [(fused_ops_always_gqa, 4, "batch"), (fused_ops_every_norm_skip, 0, "no residual Add before it"),
         (fused_ops_one_rotary, 0, "queries and its keys")]
STUB = fused_ops_stub
