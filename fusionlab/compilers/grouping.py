"""Compare two fusion groupings of one ONNX graph: which producer→consumer edges each fuses.

A grouping is a list of groups of node names (a node in no group runs alone). Two numbers summarise
how far two groupings agree:

* **edge agreement**: over every data edge between two compute nodes (producer → consumer), the share
  on which both groupings make the same decision (fused: both ends in one group; or not);
* **pair Jaccard**: of the node pairs that either grouping puts together, the share both put together.

Edge agreement reads directly as "fusion decisions made alike"; the disagreeing edges are listed
(`Agreement.disagreements`) so each can be explained. Nodes one grouping does not cover (constants,
shape arithmetic a compiler folds away) are left out of both numbers and listed in `excluded`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import combinations
from typing import Iterable, Sequence

from ..text import text_table

__all__ = ["Edge", "Agreement", "compare_groupings", "plan_groups", "edges"]


@dataclass(frozen=True)
class Edge:
    """One data edge and how each grouping treats it."""

    producer: str
    consumer: str
    producer_op: str
    consumer_op: str
    fused_a: bool
    fused_b: bool

    @property
    def pattern(self) -> str:
        return f"{self.producer_op} -> {self.consumer_op}"


@dataclass
class Agreement:
    """How two groupings of one graph agree (see the module docstring for the two measures)."""

    name_a: str
    name_b: str
    edges: list[Edge]
    pairs_a: int
    pairs_b: int
    pairs_both: int
    excluded: list[str] = field(default_factory=list)

    @property
    def edge_agreement(self) -> float:
        return sum(e.fused_a == e.fused_b for e in self.edges) / len(self.edges) if self.edges else 1.0

    @property
    def pair_jaccard(self) -> float:
        either = self.pairs_a + self.pairs_b - self.pairs_both
        return self.pairs_both / either if either else 1.0

    @property
    def disagreements(self) -> list[Edge]:
        return [e for e in self.edges if e.fused_a != e.fused_b]

    def by_pattern(self) -> list[tuple[str, str, int]]:
        """(who fuses it, producer op -> consumer op, count) for the disagreeing edges, most common first."""
        counts = Counter((self.name_a if e.fused_a else self.name_b, e.pattern) for e in self.disagreements)
        return [(who, pattern, n) for (who, pattern), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]

    def summary(self) -> str:
        agree = sum(e.fused_a == e.fused_b for e in self.edges)
        return (f"{self.name_a} vs {self.name_b}: {agree}/{len(self.edges)} edges decided alike "
                f"({self.edge_agreement:.1%}); pair Jaccard {self.pair_jaccard:.2f}; "
                f"{len(self.excluded)} nodes left out")

    def table(self) -> str:
        """The disagreements grouped by op pattern (plain text)."""
        rows = [[f"only {who}", pattern, str(n)] for who, pattern, n in self.by_pattern()]
        return "\n".join(text_table(["fused by", "edge", "edges"], rows)) if rows else "(no disagreement)"


def plan_groups(plan) -> list[list[str]]:
    """The groups of a FusionPlan as lists of node names."""
    return [list(g.nodes) for g in plan]


def _membership(groups: Iterable[Sequence[str]]) -> dict[str, set[int]]:
    member: dict[str, set[int]] = {}
    for i, g in enumerate(groups):
        for n in g:
            member.setdefault(n, set()).add(i)
    return member


def edges(graph) -> list[tuple[str, str, str, str]]:
    """(producer, consumer, producer op, consumer op) for every data edge between non-Constant nodes."""
    out = []
    for node in graph:
        if node.op_type == "Constant":
            continue
        seen = set()
        for v in node.inputs:
            p = v.producer() if v is not None else None
            if p is None or p.op_type == "Constant" or p.name in seen:
                continue
            seen.add(p.name)
            out.append((p.name, node.name, p.op_type, node.op_type))
    return out


def compare_groupings(graph, groups_a: Sequence[Sequence[str]], groups_b: Sequence[Sequence[str]], *,
                      name_a: str = "A", name_b: str = "B", covered_a: Iterable[str] | None = None) -> Agreement:
    """Edge agreement and pair Jaccard of two groupings of `graph` (a fusionlab Graph).

    `covered_a`: the nodes grouping A saw (default: every node it groups plus every node of the graph);
    nodes outside it, and Constant nodes, are excluded from both measures.
    """
    ma, mb = _membership(groups_a), _membership(groups_b)
    names = [n.name for n in graph if n.op_type != "Constant"]
    covered = set(covered_a) if covered_a is not None else set(names)
    excluded = [n for n in names if n not in covered]
    keep = set(names) - set(excluded)
    together = lambda m, x, y: bool(m.get(x, set()) & m.get(y, set()))  # noqa: E731
    es = [Edge(p, c, po, co, together(ma, p, c), together(mb, p, c))
          for p, c, po, co in edges(graph) if p in keep and c in keep]

    def pairs(m) -> set[tuple[str, str]]:
        out = set()
        for g in (groups_a if m is ma else groups_b):
            members = sorted({n for n in g if n in keep})
            out.update(combinations(members, 2))
        return out

    pa, pb = pairs(ma), pairs(mb)
    return Agreement(name_a, name_b, es, len(pa), len(pb), len(pa & pb), excluded)
