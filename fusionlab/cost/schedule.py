"""Which kernels a plan launches, in what order, and how long each materialised tensor lives.

The cost model's bookkeeping, kept apart from its arithmetic:

- `kernels_of`: the members of every kernel. A fusion group is one kernel (its lowering may launch several,
  `FusionGroup.kernels`); an ungrouped node is one kernel. A group that absorbed an earlier group (a mixed
  group over a vertically fused Conv) wins its nodes. A node a group **recomputes** runs inside every group
  that recomputes it, and in a kernel of its own only if something outside those groups still reads it.
- `Kernels.order`: a topological order of the contracted graph (ties broken by the first member).
- `Kernels.readers`: the kernels that read a tensor from device memory (it was made elsewhere).
- `peak_live`: the largest total of live tensors (plus per-step workspace) over the order; a tensor lives
  from the kernel that writes it to the last kernel that reads it, graph inputs from the start, graph
  outputs to the end.
- `Run`, `Step`: a model's run as that schedule sees it (graph inputs, kernels in order, graph outputs), what each
  kernel reads and writes with the bytes; `fusionlab.cost.run_of` (in `model`, which knows the bytes) builds one,
  the form notebook 18 §2 and its workspace exercise read.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import onnx_ir as ir

from ..plan import FusionPlan

__all__ = ["Kernels", "kernels_of", "peak_live", "Step", "Run"]


@dataclass
class Kernels:
    """Members of every kernel and where each node's outputs are written."""

    members: dict[str, list[ir.Node]]
    home: dict[int, str]  # id(node) -> the kernel that writes its outputs
    runs_in: dict[int, list[str]]  # id(node) -> every kernel that computes it
    order: list[str]

    def inside(self, k: str) -> set[int]:
        return {id(n) for n in self.members[k]}

    def readers(self, v: ir.Value) -> set[str]:
        """Kernels that read `v` from device memory: they use it and do not compute its producer themselves."""
        p = v.producer()
        out = set()
        for use in v.uses():
            for k in self.runs_in.get(id(use.node), ()):
                if p is None or k not in self.runs_in.get(id(p), ()):
                    out.add(k)
        return out

    def written(self, k: str, v: ir.Value) -> bool:
        """Whether kernel `k` writes `v` to device memory (it is its home, and v is an output or read elsewhere)."""
        p = v.producer()
        return p is not None and self.home.get(id(p)) == k and (v.is_graph_output() or bool(self.readers(v)))


def kernels_of(order: list[ir.Node], plan: FusionPlan) -> Kernels:
    """The kernels `plan` launches over nodes in topological `order` (ValueError for a plan that does not fit)."""
    by_name = {n.name: n for n in order}
    owner: dict[str, str] = {}
    recomputed: dict[str, list[str]] = {}
    for g in plan:
        for name in g.covers:
            if name not in by_name:
                raise ValueError(f"plan group {g.id!r} names node {name!r}, which is not in the model")
        rc = {r for r in g.recompute if r in by_name}
        for name in g.covers:
            if name in rc:
                recomputed.setdefault(name, []).append(g.id)
            else:
                owner[name] = g.id  # a group that absorbed an earlier group wins its nodes

    def groups_of(name: str) -> list[str]:
        return ([owner[name]] if name in owner else []) + recomputed.get(name, [])

    members: dict[str, list[ir.Node]] = {}
    home: dict[int, str] = {}
    runs_in: dict[int, list[str]] = {}
    for n in order:
        if n.op_type == "Constant" and n.name not in owner and n.name not in recomputed:
            continue
        ks = groups_of(n.name)
        if n.name not in owner:
            rc = set(recomputed.get(n.name, ()))
            needed = not rc or any(o.is_graph_output() for o in n.outputs) or any(
                not rc.intersection(groups_of(u.node.name) or [u.node.name]) for o in n.outputs for u in o.uses())
            if needed:
                ks = [n.name] + ks
        for k in ks:
            members.setdefault(k, []).append(n)
        runs_in[id(n)] = ks
        if ks and (n.name in owner or ks[0] == n.name):
            home[id(n)] = ks[0]
    kernels = Kernels(members, home, runs_in, [])
    kernels.order = _order(kernels, order)
    return kernels


def _order(kernels: Kernels, order: list[ir.Node]) -> list[str]:
    pos = {id(n): i for i, n in enumerate(order)}
    members = kernels.members
    first = {k: min(pos[id(n)] for n in ns) for k, ns in members.items()}
    preds: dict[str, set[str]] = {k: set() for k in members}
    for k, ns in members.items():
        inside = kernels.inside(k)
        for n in ns:
            for v in n.inputs:
                p = v.producer() if v is not None else None
                if p is not None and id(p) not in inside and id(p) in kernels.home:
                    preds[k].add(kernels.home[id(p)])
    succ: dict[str, list[str]] = {k: [] for k in members}
    for k, ps in preds.items():
        for p in ps:
            succ[p].append(k)
    indeg = {k: len(ps) for k, ps in preds.items()}
    ready = [(first[k], k) for k in members if indeg[k] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, k = heapq.heappop(ready)
        out.append(k)
        for s in succ[k]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (first[s], s))
    if len(out) != len(members):
        stuck = sorted(k for k in members if k not in out)
        raise ValueError(f"plan groups {stuck[:3]} form a cycle with the rest of the graph: not schedulable")
    return out


def peak_live(kernels: Kernels, graph_inputs, nbytes, workspace: list[int]) -> tuple[int, int]:
    """(peak bytes of live materialised tensors plus the step's workspace, the step where it is reached)."""
    index = {k: i for i, k in enumerate(kernels.order)}
    last = len(kernels.order) - 1
    delta = [0] * (len(kernels.order) + 1)
    values: dict[str, tuple[int, int, int]] = {}

    def interval(v: ir.Value, start: int) -> None:
        end = last if v.is_graph_output() else start
        for k in kernels.readers(v):
            end = max(end, index[k])
        values[v.name] = (start, end, nbytes(v) or 0)

    for v in graph_inputs:
        interval(v, 0)
    for step, k in enumerate(kernels.order):
        for n in kernels.members[k]:
            for o in n.outputs:
                if kernels.written(k, o):
                    interval(o, step)
    for start, end, size in values.values():
        delta[start] += size
        delta[end + 1] -= size
    peak = peak_step = running = 0
    for step in range(len(kernels.order)):
        running += delta[step]
        if running + workspace[step] > peak:
            peak, peak_step = running + workspace[step], step
    return peak, peak_step


@dataclass(frozen=True)
class Step:
    """One kernel of a run: the tensors it reads from memory, and those it writes with their bytes."""

    kernel: str
    reads: tuple[str, ...]
    writes: dict[str, int]


@dataclass(frozen=True)
class Run:
    """A model's run as the cost model schedules it: graph inputs {name: bytes}, kernels in order, graph outputs."""

    inputs: dict[str, int]
    steps: tuple[Step, ...]
    outputs: tuple[str, ...]

