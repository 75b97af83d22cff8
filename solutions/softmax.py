"""The exercise of notebook 09: the online-softmax update over key blocks."""

import numpy as np


def update(m, l, acc, scores, v):
    """Reference: new max; rescale what was summed under the old max; add this block. A row whose max is still
    -inf (every score so far masked) uses 0 in its place, so exp(-inf - 0) = 0 instead of NaN."""
    m_new = np.maximum(m, scores.max(axis=1, keepdims=True))
    safe = np.where(np.isneginf(m_new), 0.0, m_new).astype(m.dtype)
    p = np.exp(scores - safe)
    alpha = np.exp(m - safe)
    return m_new, alpha * l + p.sum(axis=1, keepdims=True), alpha * acc + p @ v


def update_no_rescale(m, l, acc, scores, v):
    """WRONG: rescales the running sum l but not the accumulator acc when the max rises."""
    m_new = np.maximum(m, scores.max(axis=1, keepdims=True))
    safe = np.where(np.isneginf(m_new), 0.0, m_new).astype(m.dtype)
    p = np.exp(scores - safe)
    return m_new, np.exp(m - safe) * l + p.sum(axis=1, keepdims=True), acc + p @ v


def update_unguarded(m, l, acc, scores, v):
    """WRONG: the textbook update without the -inf guard (NaN once a whole block of a row is masked first)."""
    m_new = np.maximum(m, scores.max(axis=1, keepdims=True))
    p = np.exp(scores - m_new)
    alpha = np.exp(m - m_new)
    return m_new, alpha * l + p.sum(axis=1, keepdims=True), alpha * acc + p @ v


def update_stub(m, l, acc, scores, v):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "softmax"
REFERENCE = update
WRONG = [(update_no_rescale, 1, "rescale both"), (update_unguarded, 4, "NaN")]
STUB = update_stub
