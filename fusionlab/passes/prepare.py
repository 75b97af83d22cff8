"""Preparation before fusion: clean-up (Identity, no-op Dropout, Constant nodes, dead code), then constant folding.

`fuse` and `apply` prepare their working copy first (`prepare=True`, the default), so rules see
`Conv -> BatchNormalization` through an Identity and a Reshape target that is really a constant.
"""

from __future__ import annotations

from ..graph import Graph
from . import cleanup, fold as _fold

__all__ = ["prepare", "needed"]


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
