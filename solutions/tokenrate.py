"""The second exercise of notebook 12: the most tokens per second one chip can generate."""

from fusionlab.lessons import decoding as dec


def tokens_per_second(cfg, context, batch, device):
    """Reference: the weights read once for the batch, each request's own embedding row, cache and new K/V, in fp16
    (2 bytes); the step takes at least max(bytes / one chip's bandwidth, FLOPs / its fp16 peak) and makes `batch`
    tokens."""
    chip = device.one_chip()
    b = dec.token_bytes(cfg, context, 1, dtype_bytes=2)
    nbytes = b["weights"] + batch * (b["total"] - b["weights"])
    flops = batch * dec.step_flops(cfg, context, 1)
    return batch / max(nbytes / chip.bandwidth, flops / chip.peak_flops("float16"))


def tokens_per_second_whole_card(cfg, context, batch, device):
    """WRONG: the card's bandwidth (both chips of a 300I Duo) for one model instance on one chip."""
    b = dec.token_bytes(cfg, context, 1, dtype_bytes=2)
    nbytes = b["weights"] + batch * (b["total"] - b["weights"])
    flops = batch * dec.step_flops(cfg, context, 1)
    return batch / max(nbytes / device.bandwidth, flops / device.one_chip().peak_flops("float16"))


def tokens_per_second_weights_per_request(cfg, context, batch, device):
    """WRONG: each request reads the weights again, so batching buys nothing."""
    chip = device.one_chip()
    nbytes = batch * dec.token_bytes(cfg, context, 1, dtype_bytes=2)["total"]
    flops = batch * dec.step_flops(cfg, context, 1)
    return batch / max(nbytes / chip.bandwidth, flops / chip.peak_flops("float16"))


def tokens_per_second_cache_read_only(cfg, context, batch, device):
    """WRONG: the weights once for the batch plus each request's cache read, the embedding row and the new K/V
    each request writes left out (a reading of "each request reads its own cache" alone)."""
    chip = device.one_chip()
    b = dec.token_bytes(cfg, context, 1, dtype_bytes=2)
    nbytes = b["weights"] + batch * b["KV cache read"]
    flops = batch * dec.step_flops(cfg, context, 1)
    return batch / max(nbytes / chip.bandwidth, flops / chip.peak_flops("float16"))


def tokens_per_second_memory_only(cfg, context, batch, device):
    """WRONG: bytes over bandwidth alone, as if decoding were memory-bound at any batch."""
    b = dec.token_bytes(cfg, context, 1, dtype_bytes=2)
    return batch * device.one_chip().bandwidth / (b["weights"] + batch * (b["total"] - b["weights"]))


def tokens_per_second_stub(cfg, context, batch, device):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "tokenrate"
REFERENCE = tokens_per_second
WRONG = [(tokens_per_second_whole_card, 1, "whole card"),
         (tokens_per_second_weights_per_request, 3, "once per request"),
         (tokens_per_second_cache_read_only, 0, "only the cache read"),
         (tokens_per_second_memory_only, 4, "memory time alone")]
STUB = tokens_per_second_stub
