"""The exercise of notebook 04: the bytes SkipLayerNormalization saves over Add [+ Add] + LayerNormalization."""


def saved_bytes(batch, seq, hidden, dtype_bytes, bias, sum_read_again):
    """Reference: each intermediate the fused kernel no longer writes and reads back, one tensor each way: the bias
    Add's output (written, read) and the sum (written, read by the LayerNorm); when the next Add reads the sum too,
    the fused kernel still writes it and only the LayerNorm's read goes."""
    tensor = batch * seq * hidden * dtype_bytes
    passes = (2 if bias else 0) + (1 if sum_read_again else 2)
    return passes * tensor


def saved_bytes_elements(batch, seq, hidden, dtype_bytes, bias, sum_read_again):
    """WRONG: counts elements, forgetting the bytes per element."""
    return saved_bytes(batch, seq, hidden, 1, bias, sum_read_again)


def saved_bytes_no_bias(batch, seq, hidden, dtype_bytes, bias, sum_read_again):
    """WRONG: forgets the bias Add's output, an intermediate too."""
    return saved_bytes(batch, seq, hidden, dtype_bytes, False, sum_read_again)


def saved_bytes_sum_gone(batch, seq, hidden, dtype_bytes, bias, sum_read_again):
    """WRONG: counts the sum as gone in the pre-LN form, where the next Add still reads it."""
    return saved_bytes(batch, seq, hidden, dtype_bytes, bias, False)


def saved_bytes_stub(batch, seq, hidden, dtype_bytes, bias, sum_read_again):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "skipln"
REFERENCE = saved_bytes
WRONG = [(saved_bytes_elements, 0, "elements, not bytes"), (saved_bytes_no_bias, 1, "bias Add's output forgotten"),
         (saved_bytes_sum_gone, 3, "the next Add still reads it")]
STUB = saved_bytes_stub
