"""The first exercise of notebook 11: the bytes of the KV cache one decode step reads."""


def kv_cache_bytes(layers, heads, kv_heads, head_dim, context, dtype_bytes):
    """Reference: K and V, for every layer, of the K/V heads only (the query heads share them), per cached token."""
    return context * layers * 2 * kv_heads * head_dim * dtype_bytes


def kv_cache_bytes_query_heads(layers, heads, kv_heads, head_dim, context, dtype_bytes):
    """WRONG: counts the query heads, as if there were no grouped-query attention."""
    return context * layers * 2 * heads * head_dim * dtype_bytes


def kv_cache_bytes_k_only(layers, heads, kv_heads, head_dim, context, dtype_bytes):
    """WRONG: forgets that the cache holds V beside K."""
    return context * layers * kv_heads * head_dim * dtype_bytes


def kv_cache_bytes_stub(layers, heads, kv_heads, head_dim, context, dtype_bytes):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "kvcache"
REFERENCE = kv_cache_bytes
WRONG = [(kv_cache_bytes_query_heads, 0, "the query heads counted"), (kv_cache_bytes_k_only, 0, "K only")]
STUB = kv_cache_bytes_stub
