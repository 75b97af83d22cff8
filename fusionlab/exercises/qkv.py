"""Exercise: fuse Q, K and V into one wide MatMul + Add + Split, by hand (notebook 05).

The learner writes ``fuse_qkv(Wq, bq, Wk, bk, Wv, bv) -> (W, b, split)``: each W* is a projection's (K, N*) weight,
each b* its (N*,) bias or None (no bias: a MatMul without an Add), and the answer is the wide weight, the wide bias
(or None when no projection has one) and the Split's sizes. `check(fuse_qkv)` builds each hidden case's three
MatMul (+ Add) projections, runs them in onnxruntime with graph optimisations off, runs one MatMul (+ Add) + Split
with the learner's (W, b, split) on the same input, and compares the three outputs at the project's tolerances for
the dtype (`fusionlab.verification.runtime.TOLERANCES`, atol scaled by the output's magnitude). Before running, it
checks the shapes and dtype and names the likely mistake: the weights stacked on the input axis (axis 0), split
sizes all equal (K/V narrower than Q, as with grouped-query attention), a missing bias filled with nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import helper

from ..build import make_model, tensor, value_info
from ..verification.runtime import TOLERANCES, run
from .core import Case, NotAnswered, Verdict, attempt, first_difference, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "unfused_model", "fused_model"]

EXERCISE = "fuse Q, K and V into one MatMul + Split"
TASK = "fuse_qkv(Wq, bq, Wk, bk, Wv, bv) returning (W, b, split)"
BRANCHES = ("q", "k", "v")


@dataclass(frozen=True)
class QKVCase:
    """Input x of shape `x_shape` (last axis K), three projections of widths `widths`; `bias` says which have one."""

    x_shape: tuple
    widths: tuple
    bias: tuple = (True, True, True)
    dtype: str = "float32"
    seed: int = 0

    def arrays(self):
        rng = np.random.default_rng(2000 + self.seed)
        dt, k = np.dtype(self.dtype), self.x_shape[-1]
        ws = [(rng.standard_normal((k, n)) / np.sqrt(k)).astype(dt) for n in self.widths]
        bs = [rng.standard_normal(n).astype(dt) if has else None for n, has in zip(self.widths, self.bias)]
        x = rng.standard_normal(self.x_shape).astype(dt)
        return ws, bs, x


#: the hidden cases, in the order they are graded
CASES = (
    Case("notebook 05's block: hidden 64, Q, K and V 64 wide each, with biases", QKVCase((2, 8, 64), (64, 64, 64))),
    Case("grouped-query attention: Q 64 wide, K and V 16 wide (one K/V head per 4 query heads)",
         QKVCase((1, 6, 64), (64, 16, 16), seed=1)),
    Case("no biases at all (three bare MatMuls)", QKVCase((2, 5, 32), (32, 32, 32), (False, False, False), seed=2)),
    Case("K without a bias, Q and V with one (as in Whisper's attention)",
         QKVCase((1, 7, 48), (48, 48, 48), (True, False, True), seed=3)),
    Case("float16 weights and input, multi-query attention: Q 64 wide, K and V 16 (one K/V head)",
         QKVCase((2, 4, 64), (64, 16, 16), dtype="float16", seed=4)),
    Case("a 2-D input (4 tokens, no batch axis), widths 24, 8, 16", QKVCase((4, 24), (24, 8, 16), seed=5)),
)


def unfused_model(c: QKVCase):
    """The three projections: MatMul (+ Add where the branch has a bias), outputs q, k, v."""
    ws, bs, x = c.arrays()
    nodes, inits = [], []
    for p, w, b in zip(BRANCHES, ws, bs):
        inits.append(tensor(f"W_{p}", w))
        if b is None:
            nodes.append(helper.make_node("MatMul", ["x", f"W_{p}"], [p], name=f"{p}/MatMul"))
        else:
            inits.append(tensor(f"b_{p}", b))
            nodes += [helper.make_node("MatMul", ["x", f"W_{p}"], [f"{p}_mm"], name=f"{p}/MatMul"),
                      helper.make_node("Add", [f"{p}_mm", f"b_{p}"], [p], name=f"{p}/Add")]
    return _model(c, x, nodes, inits)


def fused_model(c: QKVCase, w: np.ndarray, b: np.ndarray | None, split):
    """One MatMul (+ Add when `b` is not None) + Split on the last axis, outputs q, k, v."""
    x = c.arrays()[2]
    inits = [tensor("W", w), tensor("split", np.asarray(split, np.int64))]
    mm = "wide" if b is None else "wide_mm"
    nodes = [helper.make_node("MatMul", ["x", "W"], [mm], name="wide/MatMul")]
    if b is not None:
        inits.append(tensor("b", b))
        nodes.append(helper.make_node("Add", [mm, "b"], ["wide"], name="wide/Add"))
    nodes.append(helper.make_node("Split", ["wide", "split"], list(BRANCHES), name="wide/Split", axis=-1))
    return _model(c, x, nodes, inits)


def _model(c: QKVCase, x, nodes, inits):
    dt = np.dtype(c.dtype)
    outs = [value_info(p, dt, list(c.x_shape[:-1]) + [n]) for p, n in zip(BRANCHES, c.widths)]
    return make_model(nodes, [value_info("x", dt, list(x.shape))], outs, inits)


def _shape(a) -> str:
    return f"({a.shape[0]},)" if a.ndim == 1 else f"({', '.join(map(str, a.shape))})"


def _problem(c: QKVCase, w, b, split) -> str | None:
    """What is wrong with the answer's shapes, dtypes or sizes before anything runs, or None."""
    dt, k, total = np.dtype(c.dtype), c.x_shape[-1], sum(c.widths)
    if w.ndim != 2 or w.shape != (k, total):
        hint = ""
        if w.ndim == 2 and w.shape == (3 * k, c.widths[0]):
            hint = " (that is the weights stacked on axis 0, the input axis: stack them on the output axis, 1)"
        return f"W has shape {_shape(w)}; x @ W needs ({k}, {total}): K rows, Q, K and V's columns side by side{hint}"
    if w.dtype != dt:
        return f"W is {w.dtype}; the model is {dt}: keep the weights' dtype"
    if b is None and any(c.bias):
        return "b is None, but some projections have a bias: the wide Add needs one value per output column"
    if b is not None:
        if b.shape != (total,):
            with_bias = sum(n for n, has in zip(c.widths, c.bias) if has)
            hint = " (a branch without a bias adds zeros to its columns)" if b.shape == (with_bias,) else ""
            return f"b has shape {_shape(b)}; the wide Add needs one value per output column: ({total},){hint}"
        if b.dtype != dt:
            why = " (np.zeros makes float64 unless given a dtype)" if b.dtype == np.float64 else ""
            return f"b is {b.dtype}; the model is {dt}: keep the biases' dtype{why}"
    sizes = [int(s) for s in split]
    if sizes != list(c.widths):
        hint = " (all equal: but each size is its own branch's width)" if len(set(sizes)) == 1 else ""
        wrong = next((i for i, (s, n) in enumerate(zip(sizes, c.widths)) if s != n), min(len(sizes), 2))
        return (f"split {sizes} does not hand each projection its own columns: {BRANCHES[wrong].upper()} is "
                f"{c.widths[wrong]} wide{hint}")
    return None


def _judge(fuse_qkv, case: Case) -> str | None:
    c: QKVCase = case.data
    ws, bs, x = c.arrays()
    got = attempt(fuse_qkv, ws[0].copy(), _copy(bs[0]), ws[1].copy(), _copy(bs[1]), ws[2].copy(), _copy(bs[2]))
    if got is None:
        raise NotAnswered
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return f"fuse_qkv must return (W, b, split); it returned {type(got).__name__}"
    w, b, split = got
    if is_stub(w):
        raise NotAnswered
    w, b = np.asarray(w), None if b is None else np.asarray(b)
    try:
        split = [int(s) for s in split]
    except (TypeError, ValueError):
        return f"split must be a list of three ints, got {split!r}"[:200]
    problem = _problem(c, w, b, split)
    if problem:
        return problem
    want = run(unfused_model(c), {"x": x})
    have = run(fused_model(c, w, b, split), {"x": x})
    rtol, atol = TOLERANCES[np.dtype(c.dtype)]
    for p in BRANCHES:
        scale = max(1.0, float(np.max(np.abs(want[p].astype(np.float64)))))
        out = first_difference(have[p], want[p], rtol, atol * scale)
        if out is not None:
            err, idx = out
            order = " (are W's blocks in the order Q, K, V?)" if len(set(c.widths)) == 1 else ""
            return (f"your {p.upper()} differs from onnxruntime's {p.upper()} projection by {err:.3g} at "
                    f"[{','.join(map(str, idx))}]{order}")
    return None


def _copy(a):
    return None if a is None else a.copy()


def check(fuse_qkv) -> Verdict:
    """Grade `fuse_qkv(Wq, bq, Wk, bk, Wv, bv) -> (W, b, split)` on the hidden cases (onnxruntime, optimisations
    off)."""
    return grade(EXERCISE, fuse_qkv, CASES, _judge, task=TASK,
                 checked="Each case: one MatMul (+ Add) + Split with your (W, b, split) against onnxruntime "
                         f"running the three projections, at the dtype's tolerance ({_TOL}).")


_TOL = ", ".join(f"{name} rtol {TOLERANCES[np.dtype(t)][0]:.0e}".replace("e-0", "e-")
                 for name, t in (("fp32", "float32"), ("fp16", "float16")))
