"""The exercise of notebook 05: Q, K and V fused into one wide MatMul + Add + Split."""

import numpy as np


def fuse_qkv(Wq, bq, Wk, bk, Wv, bv):
    """Reference: weights side by side on the output axis (1), biases likewise (zeros for a branch without one),
    the Split cutting each branch's own width back out."""
    ws = [Wq, Wk, Wv]
    split = [w.shape[1] for w in ws]
    W = np.concatenate(ws, axis=1)
    if bq is None and bk is None and bv is None:
        return W, None, split
    b = np.concatenate([np.zeros(n, W.dtype) if bb is None else bb for n, bb in zip(split, (bq, bk, bv))])
    return W, b, split


def fuse_qkv_input_axis(Wq, bq, Wk, bk, Wv, bv):
    """WRONG: stacks the weights on axis 0 (the input axis), as if x were three inputs side by side."""
    W, b, split = fuse_qkv(Wq, bq, Wk, bk, Wv, bv)
    return np.concatenate([Wq, Wk, Wv], axis=0), b, split


def fuse_qkv_equal_split(Wq, bq, Wk, bk, Wv, bv):
    """WRONG: cuts the wide output into three equal parts (right only when K and V are as wide as Q)."""
    W, b, _ = fuse_qkv(Wq, bq, Wk, bk, Wv, bv)
    return W, b, [W.shape[1] // 3] * 3


def fuse_qkv_skip_missing_bias(Wq, bq, Wk, bk, Wv, bv):
    """WRONG: concatenates only the biases that exist, so V's bias lands on K's columns."""
    W, _, split = fuse_qkv(Wq, bq, Wk, bk, Wv, bv)
    bs = [bb for bb in (bq, bk, bv) if bb is not None]
    return W, (np.concatenate(bs) if bs else None), split


def fuse_qkv_stub(Wq, bq, Wk, bk, Wv, bv):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "qkv"
REFERENCE = fuse_qkv
WRONG = [(fuse_qkv_input_axis, 0, "stacked on axis 0"), (fuse_qkv_equal_split, 1, "all equal"),
         (fuse_qkv_skip_missing_bias, 3, "adds zeros")]
STUB = fuse_qkv_stub
