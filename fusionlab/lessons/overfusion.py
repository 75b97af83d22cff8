"""A group too large for the Unified Buffer: the chain of Adds notebook 08 §1 costs, and its split into parts.

`add_chain(k)` is k elementwise Adds in a row, each bringing in one more input (x0 + x1 + ... + xk): every added
input costs a fused kernel two more UB tiles, so a long enough chain no longer fits one AI core's UB at 16 KiB
tiles and its transfers slow down (`fusionlab.analysis.working_set`). `chain_plan(chain, parts)` cuts the chain
into that many consecutive fusion groups, as a hand-made plan the cost model prices like any other
(`fusionlab.cost.plan_cost`): one part is the whole chain fused, `k` parts the chain unfused. Between two parts
the running sum is written to device memory and read back; that is the traffic a split adds back.

The tensors are two-dimensional on purpose: onnx's data propagation treats a one-dimensional tensor as a possible
shape and spends seconds on long chains of them.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from ..build import make_model, value_info
from ..graph import load
from ..plan import FusionGroup, FusionPlan

__all__ = ["SHAPE", "add_chain", "chain_plan"]

#: each input's shape: 2 MiB of float32 (1 MiB at the fp16 the Ascend presets run a float model at)
SHAPE = (512, 1024)


def add_chain(k: int, shape: tuple[int, ...] = SHAPE):
    """The loaded graph of k Adds, a1 .. ak: a_i adds input x_i to the running sum (inputs x0 .. xk, output y)."""
    if k < 1:
        raise ValueError(f"a chain needs at least one Add, got k={k}")
    names = [f"x{i}" for i in range(k + 1)]
    nodes, running = [], names[0]
    for i in range(1, k + 1):
        out = f"s{i}" if i < k else "y"
        nodes.append(helper.make_node("Add", [running, names[i]], [out], name=f"a{i}"))
        running = out
    return load(make_model(nodes, [value_info(x, np.float32, list(shape)) for x in names],
                           [value_info("y", np.float32, list(shape))], name=f"add_chain_{k}"))


def chain_plan(chain, parts: int) -> FusionPlan:
    """`chain`'s Adds cut into `parts` consecutive groups of near-equal size (the first ones one Add larger)."""
    adds = [n.name for n in chain]
    if not 1 <= parts <= len(adds):
        raise ValueError(f"a chain of {len(adds)} Adds splits into 1 to {len(adds)} parts, not {parts}")
    groups, start = [], 0
    for i, size in enumerate(len(a) for a in np.array_split(np.arange(len(adds)), parts)):
        members = adds[start:start + size]
        groups.append(FusionGroup(f"g{i}", "mixed", "hand", members, ["Add"] * len(members)))
        start += size
    return FusionPlan(groups)
