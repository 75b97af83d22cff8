"""The exercise of notebook 00: the bytes fusing a Conv chain into one kernel saves."""

import math


def saved_bytes(shape, dtype_bytes, ops):
    """Reference: a chain of n operators has n - 1 intermediates, each written once and read back once unfused."""
    intermediate = math.prod(shape) * dtype_bytes
    return (len(ops) - 1) * 2 * intermediate


def saved_bytes_writes_only(shape, dtype_bytes, ops):
    """WRONG: counts each intermediate written, but not read back by the next operator."""
    return (len(ops) - 1) * math.prod(shape) * dtype_bytes


def saved_bytes_notebook_block(shape, dtype_bytes, ops):
    """WRONG: copies notebook 00's two intermediates whatever the chain (right only for three operators)."""
    return 2 * 2 * math.prod(shape) * dtype_bytes


def saved_bytes_stub(shape, dtype_bytes, ops):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "savings"
REFERENCE = saved_bytes
WRONG = [(saved_bytes_writes_only, 0, "the writes only"), (saved_bytes_notebook_block, 3, "n - 1")]
STUB = saved_bytes_stub
