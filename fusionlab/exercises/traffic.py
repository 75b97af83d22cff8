"""Exercise: predict a plan's bytes, as fusionlab's cost model counts them (notebook 01).

The model is a small elementwise block on a float32 [1, 16, 32, 32] map x (64 KiB):
``a = x * s + b`` (per-channel s, b of shape (16, 1, 1)), ``y = a * sigmoid(a) + x``. The learner predicts the
bytes moved through device memory when it runs unfused (one kernel per node) and fused (the mixed pass's plan:
one kernel). `check({"unfused": ..., "fused": ...})` compares each number with `fusionlab.cost.plan_cost`, exactly
(the cost model counts whole bytes, so a byte count is right or wrong); a wrong number gets "too high" or "too low" and the tensor the gap most likely is: a second read of a
tensor two nodes read, a tensor a fused kernel keeps on chip, a parameter.

How the cost model counts (`fusionlab.cost.model`, rule 2): a kernel reads each tensor it takes from memory once
and writes each output once; a fused kernel's intermediates stay on chip and move nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from onnx import helper

from ..build import make_model, tensor, value_info
from ..cost.model import plan_cost
from ..passes import plan as make_plan
from .core import AnswerRaised, Case, NotAnswered, Verdict, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "model", "describe", "truth", "check"]

EXERCISE = "predict the bytes a plan moves"
TASK = "your two byte counts"
DEVICE = "Atlas 300I Pro"  # any preset: bytes do not depend on it; precision is fixed at the model's fp32
C, H = 16, 32


def model():
    """The exercise's model: x [1, 16, 32, 32] float32 -> scale, shift, sigmoid, silu, residual -> y."""
    rng = np.random.default_rng(21)
    n = helper.make_node
    nodes = [n("Mul", ["x", "s"], ["a0"], name="scale"), n("Add", ["a0", "b"], ["a"], name="shift"),
             n("Sigmoid", ["a"], ["g"], name="sigmoid"), n("Mul", ["a", "g"], ["h"], name="silu"),
             n("Add", ["h", "x"], ["y"], name="residual")]
    inits = [tensor("s", rng.uniform(0.5, 2.0, (C, 1, 1)).astype(np.float32)),
             tensor("b", rng.standard_normal((C, 1, 1)).astype(np.float32))]
    return make_model(nodes, [value_info("x", np.float32, [1, C, H, H])], [value_info("y", np.float32, [1, C, H, H])],
                      inits, name="silu_block")


def describe() -> str:
    """The model's nodes, one a line, with what each reads and writes."""
    m = model()
    sizes = {"s": "(16, 1, 1)", "b": "(16, 1, 1)"}
    lines = [f"x: float32 [1, {C}, {H}, {H}]; s, b: float32 (16, 1, 1) constants"]
    for node in m.graph.node:
        ins = ", ".join(f"{i} {sizes[i]}" if i in sizes else i for i in node.input)
        lines.append(f"  {node.name:<9} {node.op_type:<8} reads {ins:<22} writes {', '.join(node.output)}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Term:
    """One transfer the cost model counts: `key` moved by kernel `kernel` (an op `op`), `role` in/l1/out."""

    kernel: str
    op: str
    key: str
    role: str
    bytes: int


@lru_cache(maxsize=2)
def _terms(fused: bool) -> tuple[int, tuple[Term, ...], tuple[Term, ...]]:
    """(bytes moved, transfer terms, on-chip intermediates) of the model unfused or under the mixed plan."""
    m = model()
    p = make_plan(m, ("mixed",)) if fused else None
    cost = plan_cost(m, p, DEVICE, precision="fp32")
    terms, mids = [], []
    for k in cost.kernels_detail:
        for b in k.buffers.buffers:
            (mids if b.role == "mid" else terms).append(Term(k.id, b.op, b.key, b.role, b.bytes))
    return cost.bytes_moved, tuple(terms), tuple(mids)


def truth() -> dict[str, int]:
    """What the cost model says: {"unfused": bytes, "fused": bytes}."""
    return {"unfused": _terms(False)[0], "fused": _terms(True)[0]}


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _candidates(fused: bool, low: bool) -> list[tuple[int, str]]:
    """(bytes, what the gap would be) for the mistakes a learner plausibly makes, most likely first."""
    _, terms, mids = _terms(fused)
    _, unfused_terms, _ = _terms(False)
    out: list[tuple[int, str]] = []
    reads: dict[str, list[Term]] = {}
    for t in unfused_terms:
        if t.role != "out":
            reads.setdefault(t.key, []).append(t)
    twice = [(k, ts) for k, ts in reads.items() if len(ts) > 1]
    if low and not fused:
        for size in sorted({ts[0].bytes for _, ts in twice}, reverse=True):
            said = [f"{k} is read by {ts[0].kernel} and again by {ts[1].kernel}"
                    for k, ts in twice if ts[0].bytes == size]
            out.append((size, "a second read of a tensor two nodes read (" + _join(said) + "): each read is a "
                        "transfer of its own"))
        if len(twice) > 1:
            out.append((sum(ts[1].bytes for _, ts in twice), "the second reads of " + _join([k for k, _ in twice])
                        + " (each is read by two nodes, and each read is a transfer of its own)"))
    if not low and fused:
        for size in sorted({t.bytes for t in mids}, reverse=True):
            said = sorted({t.key for t in mids if t.bytes == size})
            out.append((size, f"a tensor the fused kernel keeps on chip: {_join(said)} never leave it"))
            out.append((2 * size, f"the write and read back of a tensor the fused kernel keeps on chip: "
                                  f"{_join(said)} never leave it"))
        every = _join(sorted({t.key for t in mids}))
        out.append((sum(2 * t.bytes for t in mids), f"the write and read back of every intermediate ({every}): the "
                                                     "fused kernel keeps them on chip"))
        out.append((sum(t.bytes for t in mids), f"a write of every intermediate ({every}): the fused kernel keeps "
                                                "them on chip"))
        kept = {t.key for t in mids}
        for k, ts in twice:
            if k not in kept:
                out.append((ts[0].bytes, f"{k} once per node that reads it; the fused kernel reads it once"))
    params = [t for t in terms if t.key in ("s", "b")]
    if params:
        out.append((sum(t.bytes for t in params), "the per-channel constants s and b"))
    for t in terms:
        verb = "written by" if t.role == "out" else "read by"
        who = "the fused kernel" if fused else t.kernel
        out.append((t.bytes, f"{t.key} ({t.bytes:,} B) {verb} {who}", False))
    return out


def _judge(answer: dict, case: Case) -> str | None:
    which = case.data
    got = answer[which]
    if is_stub(got):
        raise NotAnswered
    if isinstance(got, bool) or not isinstance(got, (int, float, np.integer, np.floating)):
        raise AnswerRaised(f"{which!r} must be a number of bytes, got {type(got).__name__}")
    want = truth()[which]
    gap = want - float(got)
    if gap == 0:
        return None
    low = gap > 0
    word = "too low" if low else "too high"
    said = f"{float(got):,.0f} B is {word}: the cost model counts {'more' if low else 'less'} (off by " \
           f"{abs(gap):,.0f} B)"
    fits = [(abs(abs(gap) - c[0]), c[1], c[2] if len(c) > 2 else True) for c in _candidates(which == "fused", low)
            if abs(gap) == c[0]]
    if fits:
        best = min(d for d, _, _ in fits)
        near = [(t, sp) for d, t, sp in fits if d == best]
        if any(sp for _, sp in near):
            near = [(t, sp) for t, sp in near if sp]
        likely = list(dict.fromkeys(t for t, _ in near))[:2]
        said += f"; you probably {'forgot' if low else 'counted'} " + "; or ".join(likely)
    else:
        said += ("; count, kernel by kernel, every tensor it reads and every tensor it writes" if not
                 which == "fused" else "; a fused kernel reads its inputs once and writes only its output")
    return said


CASES = (Case("unfused: one kernel per node, 5 kernels", "unfused"),
         Case("fused: the mixed pass's plan, one kernel for the 5 nodes", "fused"))


def check(answer) -> Verdict:
    """Grade {"unfused": bytes, "fused": bytes} (or a pair) against the cost model, exactly."""
    if isinstance(answer, (tuple, list)) and len(answer) == 2:
        answer = {"unfused": answer[0], "fused": answer[1]}
    if not is_stub(answer) and not (isinstance(answer, dict) and {"unfused", "fused"} <= set(answer)):
        return grade(EXERCISE, answer, CASES, lambda a, c: 'answer with {"unfused": bytes, "fused": bytes}')
    return grade(EXERCISE, answer, CASES, _judge, task=TASK,
                 checked="Each number against fusionlab.cost.plan_cost's bytes moved, exactly.")
