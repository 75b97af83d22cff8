"""The second exercise of notebook 10: the largest FlashAttention tile one Ascend AI core holds."""


def flash_block(ub_kb, l1_kb, head_dim):
    """Reference: grow b by 16 while both buffers still fit. L1 holds the fp16 Q tile and two fp16 tiles each of K
    and V (double-buffered); UB holds the fp32 scores and fp16 probabilities (b x b), the fp32 output accumulator
    (b x d) and the fp32 running max and sum (b each)."""
    d, b = head_dim, 0
    while True:
        n = b + 16
        l1 = (n * d + 2 * 2 * n * d) * 2
        ub = n * n * (4 + 2) + n * d * 4 + 2 * n * 4
        if l1 > l1_kb * 1024 or ub > ub_kb * 1024:
            return b
        b = n


def flash_block_no_probabilities(ub_kb, l1_kb, head_dim):
    """WRONG: the fp16 probabilities are forgotten in UB (only the fp32 scores counted for the b x b tile)."""
    d, b = head_dim, 0
    while (((b + 16) * d * 5) * 2 <= l1_kb * 1024
           and (b + 16) ** 2 * 4 + (b + 16) * d * 4 + 2 * (b + 16) * 4 <= ub_kb * 1024):
        b += 16
    return b


def flash_block_no_row_stats(ub_kb, l1_kb, head_dim):
    """WRONG: the fp32 running max and sum left out of UB (right on every preset, one tile too large where they
    decide)."""
    d, b = head_dim, 0
    while (((b + 16) * d * 5) * 2 <= l1_kb * 1024
           and (b + 16) ** 2 * 6 + (b + 16) * d * 4 <= ub_kb * 1024):
        b += 16
    return b


def flash_block_ub_only(ub_kb, l1_kb, head_dim):
    """WRONG: checks the UB and never L1 (right on every preset, wrong where L1 is the tighter)."""
    d, b = head_dim, 0
    while (b + 16) ** 2 * 6 + (b + 16) * d * 4 + 2 * (b + 16) * 4 <= ub_kb * 1024:
        b += 16
    return b


def flash_block_exact(ub_kb, l1_kb, head_dim):
    """WRONG: the largest b that fits, not rounded down to a multiple of 16."""
    d, b = head_dim, 0
    while (b + 1) * d * 5 * 2 <= l1_kb * 1024 and (b + 1) ** 2 * 6 + (b + 1) * d * 4 + 2 * (b + 1) * 4 <= ub_kb * 1024:
        b += 1
    return b


def flash_block_stub(ub_kb, l1_kb, head_dim):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "flashtile"
REFERENCE = flash_block
WRONG = [(flash_block_no_probabilities, 0, "probabilities left out"), (flash_block_ub_only, 5, "only UB checked"),
         (flash_block_no_row_stats, 6, "running max and sum left out"), (flash_block_exact, 0, "multiple of 16")]
STUB = flash_block_stub
