"""Preparation before fusion: clean-up (Identity, no-op Dropout, Constant nodes, dead code), then constant folding.

`fuse` and `apply` prepare their working copy first (`prepare=True`, the default), so rules see
`Conv -> BatchNormalization` through an Identity and a Reshape target that is really a constant.
"""

from __future__ import annotations

from ..graph import Graph, as_graph
from . import cleanup, fold as _fold

__all__ = ["prepare", "needed", "graph_of"]


def prepare(graph: Graph, *, fold: bool = True) -> dict[str, int]:
    """Clean and (unless fold=False) fold `graph` in place; returns what was done, by kind (non-zero counts)."""
    done = cleanup.clean(graph)
    folded = _fold.fold(graph) if fold else {}
    if any(folded.values()):
        again = cleanup.clean(graph)
        done = {k: done.get(k, 0) + again.get(k, 0) for k in set(done) | set(again)}
    done.update(folded)
    return {k: v for k, v in sorted(done.items()) if v}


def needed(graph: Graph) -> bool:
    return cleanup.needed(graph) or _fold.needed(graph)


def graph_of(model, plan) -> Graph:
    """The graph whose nodes `plan`'s groups name: the prepared copy when the plan was made with `prepare`.

    `fusionlab.passes.plan` and `fuse` plan on a prepared copy (clean-up and constant folding), so a group's
    `covers` are names in that copy, and the copy can differ from the loaded model by more than deleted nodes:
    a Reshape whose target came from `Shape -> Gather -> Concat` of a group member reads a constant there.
    Anything that lays a plan over a graph (the cost model's kernels, their order, peak memory) must use this
    graph; on the loaded model that Shape chain leaves the group and comes back, and the group would be a
    cycle. The model itself is returned when the plan was made without preparation or preparing changes
    nothing; otherwise a prepared copy (the model is never modified).
    """
    graph = as_graph(model)
    how = plan.options.get("prepare", False) if plan is not None else False
    if not how:
        return graph
    work = graph.copy()
    return work if prepare(work, fold=how != "no-fold") else graph
