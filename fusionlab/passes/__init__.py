"""Fusion passes: each decides *what* may fuse (a plan) and then rewrites a copy of the graph.

A pass module exposes two functions:

- ``plan(graph, **options) -> FusionPlan``: pure analysis, the graph is not touched;
- ``apply(graph, plan, **options) -> None``: rewrites `graph` in place according to `plan`.

`fuse` runs passes in order on a copy of the model, so the caller's model is never modified.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..graph import Graph, load
from ..plan import FusionPlan

__all__ = ["PASSES", "FusionResult", "fuse", "plan_only", "get_pass"]

#: pass name -> module (imported lazily so a missing optional pass never breaks the others)
PASSES = {
    "cleanup": "fusionlab.passes.cleanup",
    "vertical": "fusionlab.passes.vertical",
    "horizontal": "fusionlab.passes.horizontal",
    "mixed": "fusionlab.passes.mixed",
}


@dataclass
class FusionResult:
    """The fused graph and the plan that produced it."""

    graph: Graph
    plan: FusionPlan
    before: dict
    after: dict

    def summary(self) -> str:
        lines = [f"nodes: {sum(self.before.values())} -> {sum(self.after.values())}"]
        for rule, n in self.plan.rule_counts().items():
            lines.append(f"  {rule:<28} {n} group(s)")
        return "\n".join(lines)


def get_pass(name: str):
    if name not in PASSES:
        raise ValueError(f"unknown pass {name!r}; choose from {', '.join(PASSES)}")
    return importlib.import_module(PASSES[name])


def _as_graph(model) -> Graph:
    return model if isinstance(model, Graph) else load(model)


def fuse(model, passes=("vertical",), **options) -> FusionResult:
    """Run the named passes in order on a copy of `model`; returns the fused graph and the combined plan."""
    original = _as_graph(model)
    graph = original.copy()
    before = original.op_counts()
    combined = FusionPlan(model=original.name)
    for name in passes:
        module = get_pass(name)
        plan = module.plan(graph, **options)
        module.apply(graph, plan, **options)
        for group in plan:
            combined.add(group)
        combined.notes.extend(plan.notes)
    return FusionResult(graph, combined, before, graph.op_counts())


def plan_only(model, passes=("vertical",), **options) -> FusionPlan:
    """The plans the passes would make on the unchanged graph, merged (for the cost model and explorers).

    Each pass plans on the original graph; a group that overlaps one from an earlier pass is left out
    and noted (in `fuse`, the later pass would see the rewritten graph instead).
    """
    graph = _as_graph(model)
    combined = FusionPlan(model=graph.name)
    for name in passes:
        taken = combined.node_to_group()
        plan = get_pass(name).plan(graph, **options)
        combined.notes.extend(plan.notes)
        for group in plan:
            clash = [n for n in group.nodes if n in taken]
            if clash:
                combined.notes.append(f"{name}: group {group.id} left out, {clash[0]} is already in {taken[clash[0]]}")
                continue
            combined.add(group)
    return combined
