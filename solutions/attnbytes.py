"""The first exercise of notebook 10: the bytes one attention head moves, unfused and tiled."""

import math


def attention_traffic(seq, head_dim, item, block):
    """Reference: unfused, Q, K, V read and O written, plus the N x N scores six times (written by the first MatMul,
    read and written by the scale and by the softmax, read by the second MatMul). Tiled, Q read and O written once,
    K and V read once per query tile (the last tile may be partial: round up)."""
    n, d = seq, head_dim
    unfused = (4 * n * d + 6 * n * n) * item
    tiled = (2 * n * d + math.ceil(n / block) * 2 * n * d) * item
    return unfused, tiled


def attention_traffic_scores_twice(seq, head_dim, item, block):
    """WRONG: the scores written once and read once, as if the scale and the softmax were already fused."""
    n, d = seq, head_dim
    return (4 * n * d + 2 * n * n) * item, (2 * n * d + math.ceil(n / block) * 2 * n * d) * item


def attention_traffic_no_output(seq, head_dim, item, block):
    """WRONG: unfused, Q, K and V read but O's write left out (the inputs plus the scores six times)."""
    n, d = seq, head_dim
    return (3 * n * d + 6 * n * n) * item, (2 * n * d + math.ceil(n / block) * 2 * n * d) * item


def attention_traffic_kv_once(seq, head_dim, item, block):
    """WRONG: the tiled kernel reads K and V once, as if every query tile shared one pass over them."""
    n, d = seq, head_dim
    return (4 * n * d + 6 * n * n) * item, 4 * n * d * item


def attention_traffic_floor(seq, head_dim, item, block):
    """WRONG: seq // block query tiles, dropping the partial last one."""
    n, d = seq, head_dim
    return (4 * n * d + 6 * n * n) * item, (2 * n * d + (n // block) * 2 * n * d) * item


def attention_traffic_stub(seq, head_dim, item, block):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "attnbytes"
REFERENCE = attention_traffic
WRONG = [(attention_traffic_scores_twice, 0, "2 times"), (attention_traffic_no_output, 0, "O written left out"),
         (attention_traffic_kv_once, 0, "K and V read once"),
         (attention_traffic_floor, 0, "round up")]
STUB = attention_traffic_stub
