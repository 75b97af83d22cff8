"""Exercise: choose a `max_group_ops` that meets an on-chip memory budget (notebook 06).

The model is a chain of ten elementwise ops on float32 [1, 16, 32, 32] maps (64 KB each; KB here is 1024 bytes, as in the notebook); five of them read
another full-size input (y1..y5). The mixed pass (`fusionlab.passes.mixed`) groups the chain; each group's
working set at 16 KB tiles (`fusionlab.analysis.working_set`: two tiles for each tensor read from or written to
memory, one for each live intermediate) must fit the Unified Buffer of one Atlas 800I A2 core. The learner
answers the largest `max_group_ops` whose plan has every group within the budget; `check(n)` plans the model at
every cap from 1 to the chain's length, so it knows which caps fit and which is the largest.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from onnx import helper

from ..analysis.working_set import DEFAULT_TILE_KB
from ..build import make_model, value_info
from ..cost.devices import get as get_device
from ..graph import load
from ..passes import mixed, plan as make_plan
from .core import AnswerRaised, Case, NotAnswered, Verdict, grade, is_stub

__all__ = ["EXERCISE", "TASK", "DEVICE", "BUDGET_KB", "model", "largest_group", "fits", "best", "check"]

EXERCISE = "choose max_group_ops for a UB budget"
DEVICE = "Atlas 800I A2"
#: one core's Unified Buffer on the device, KB
BUDGET_KB = float(get_device(DEVICE).ub_kb)
TASK = "max_group_ops (an int)"
SHAPE = [1, 16, 32, 32]
#: the chain: (op, other input or None)
CHAIN = (("Mul", "y1"), ("Sigmoid", None), ("Add", "y2"), ("Tanh", None), ("Mul", "y3"), ("Relu", None),
         ("Sub", "y4"), ("Abs", None), ("Mul", "y5"), ("Sigmoid", None))


def model():
    """x -> Mul(y1) -> Sigmoid -> Add(y2) -> Tanh -> Mul(y3) -> Relu -> Sub(y4) -> Abs -> Mul(y5) -> Sigmoid."""
    nodes, cur, inputs = [], "x", ["x"]
    for i, (op, other) in enumerate(CHAIN):
        out = f"t{i + 1}" if i + 1 < len(CHAIN) else "out"
        ins = [cur] if other is None else [cur, other]
        inputs += [other] if other else []
        nodes.append(helper.make_node(op, ins, [out], name=f"{op.lower()}{i + 1}"))
        cur = out
    return make_model(nodes, [value_info(n, np.float32, SHAPE) for n in inputs],
                      [value_info("out", np.float32, SHAPE)], name="chain")


@lru_cache(maxsize=None)
def largest_group(cap: int) -> tuple[float, str, int, str]:
    """At `max_group_ops=cap`: (largest working set in KB, its group's ops, its size, what fills its UB)."""
    m = model()
    g = load(m)
    worst = (0.0, "", 0, "")
    for group in make_plan(m, ("mixed",), max_group_ops=cap):
        kb = mixed.working_set(g, group.nodes)
        if kb > worst[0]:
            detail = _account(mixed.working_set_detail(g, group.nodes))
            worst = (kb, "+".join(group.op_types), len(group.nodes), detail)
    return worst


def _account(ws) -> str:
    """What fills a working set at the 16 KiB tile, counted by kind of tensor."""
    tile = int(DEFAULT_TILE_KB * 1024)
    rows = ws.account(tile)
    total = sum(n for _, _, n in rows)
    kinds = []
    for role, one, many, where in (("in", "input", "inputs", "read from memory"),
                                   ("mid", "intermediate", "intermediates", "live at once"),
                                   ("out", "output", "outputs", "written to memory")):
        mine = [c for b, c, _ in rows if b.role == role]
        if mine:
            kinds.append(f"{len(mine)} {one if len(mine) == 1 else many} {where} x {mine[0]} "
                         f"tile{'s' if mine[0] > 1 else ''}")
    return f"{total / tile:g} tiles of {DEFAULT_TILE_KB:g} KB = " + " + ".join(kinds)


def fits(cap: int) -> bool:
    return largest_group(cap)[0] <= BUDGET_KB


def best() -> int:
    """The largest cap (1 .. the chain's length; a larger cap plans as the chain's length) that fits."""
    return max(k for k in range(1, len(CHAIN) + 1) if fits(k))


def _cap(answer) -> int:
    if is_stub(answer):
        raise NotAnswered
    if isinstance(answer, bool) or not isinstance(answer, (int, np.integer)) or answer < 1:
        raise AnswerRaised(f"max_group_ops must be an int >= 1, got {answer!r}")
    return min(int(answer), len(CHAIN))


def _meets(answer, case: Case) -> str | None:
    cap = _cap(answer)
    if fits(cap):
        return None
    kb, ops, size, detail = largest_group(cap)
    return (f"at max_group_ops={int(answer)} a group of {size} ops ({ops}) needs {kb:.1f} KB > {BUDGET_KB:g} KB: "
            f"{detail}")


def _largest(answer, case: Case) -> str | None:
    cap = _cap(answer)
    larger = [k for k in range(cap + 1, len(CHAIN) + 1) if fits(k)]
    if not larger:
        return None
    nxt = cap + 1
    kb = largest_group(nxt)[0]
    return (f"max_group_ops={int(answer)} meets the budget, and so does a larger cap (at {nxt} the largest group "
            f"needs {kb:.1f} KB{', within' if fits(nxt) else ' >'} {BUDGET_KB:g} KB): a larger cap fuses more, "
            f"so it moves fewer bytes")


CASES = (Case(f"every group of the plan fits {BUDGET_KB:g} KB (a working set equal to it fits)", _meets),
         Case("no larger max_group_ops fits", _largest))


def check(answer) -> Verdict:
    """Grade an int: the plan at max_group_ops=answer meets the budget, and no larger cap does."""
    return grade(EXERCISE, answer, CASES, lambda a, c: c.data(a, c), task=TASK,
                 checked=f"The mixed plan at every max_group_ops from 1 to {len(CHAIN)}, each group's working set at "
                         f"{DEFAULT_TILE_KB:g} KB tiles against {BUDGET_KB:g} KB.")
