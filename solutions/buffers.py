"""The exercise of notebook 19: the largest double-buffered tile that fits the Unified Buffer."""

import math


def largest_tile(ub_bytes, in_bytes, out_bytes, inputs=1, outputs=1):
    """Reference: two buffers per queue, each a whole number of 32-byte blocks of the narrower dtype."""
    per_elem = 2 * (inputs * in_bytes + outputs * out_bytes)
    step = 32 // math.gcd(32, min(in_bytes, out_bytes))
    return ub_bytes // per_elem // step * step


def largest_tile_one_buffer(ub_bytes, in_bytes, out_bytes, inputs=1, outputs=1):
    """WRONG (off by one buffer): sizes one buffer per queue, so two of them overflow the UB."""
    per_elem = inputs * in_bytes + outputs * out_bytes
    step = 32 // math.gcd(32, min(in_bytes, out_bytes))
    return ub_bytes // per_elem // step * step


def largest_tile_unaligned(ub_bytes, in_bytes, out_bytes, inputs=1, outputs=1):
    """WRONG: the right count of buffers, but not rounded down to whole 32-byte blocks."""
    return ub_bytes // (2 * (inputs * in_bytes + outputs * out_bytes))


def largest_tile_wide_step(ub_bytes, in_bytes, out_bytes, inputs=1, outputs=1):
    """WRONG: aligned to 32 bytes of the wider dtype (or of the input's), so with fp32 in and fp16 out the fp16
    buffer can end half-way through a block."""
    per_elem = 2 * (inputs * in_bytes + outputs * out_bytes)
    step = 32 // max(in_bytes, out_bytes)
    return ub_bytes // per_elem // step * step


def largest_tile_stub(ub_bytes, in_bytes, out_bytes, inputs=1, outputs=1):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades: the checker, the reference, each planted wrong answer with the index of the
#: case it must fail on and words its hint must hold, and the notebook's stub.
CHECKER = "buffers"
REFERENCE = largest_tile
WRONG = [(largest_tile_one_buffer, 0, "ONE buffer per queue"), (largest_tile_unaligned, 3, "32-byte blocks"),
         (largest_tile_wide_step, 6, "the wider dtype")]
STUB = largest_tile_stub
