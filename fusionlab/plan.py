"""The fusion plan: which nodes fuse into which group, why, and what it saves.

Plain data shared by passes, lowering, the cost model, pictures, widgets and reports. A plan prints as
a table, renders as HTML in a notebook, round-trips through JSON, and compares with `==` in tests.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Iterable, Iterator

from .text import text_table

__all__ = ["FusionGroup", "FusionPlan", "VERTICAL", "HORIZONTAL", "MIXED", "KINDS"]

VERTICAL = "vertical"
HORIZONTAL = "horizontal"
MIXED = "mixed"
KINDS = (VERTICAL, HORIZONTAL, MIXED)


@dataclass
class FusionGroup:
    """One group of nodes that becomes one kernel.

    - `nodes`: member node names in execution order.
    - `kind`: vertical (a producer-consumer chain), horizontal (siblings sharing an input), mixed.
    - `rule`: the pattern or pass that formed it, e.g. ``"conv_bn"`` or ``"fuse_ops"``.
    - `op_types`: member op types, parallel to `nodes`.
    - `saved_bytes`: intermediate bytes no longer written and read back (write + read counted).
    - `saved_launches`: kernels no longer launched (members - 1 for a single fused kernel).
    - `lowered_to`: what the group became (``"Conv"``, ``"com.microsoft:FusedConv"``, a function name...).
    - `reason`: why the group stopped growing or why it is legal, in words.
    """

    id: str
    kind: str
    rule: str
    nodes: list[str]
    op_types: list[str] = field(default_factory=list)
    saved_bytes: int = 0
    saved_launches: int = 0
    lowered_to: str = ""
    reason: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown fusion kind {self.kind!r}; expected one of {KINDS}")
        if not self.nodes:
            raise ValueError(f"fusion group {self.id!r} has no nodes")
        if self.op_types and len(self.op_types) != len(self.nodes):
            raise ValueError(f"fusion group {self.id!r}: op_types and nodes differ in length")

    @property
    def size(self) -> int:
        return len(self.nodes)

    @property
    def pattern(self) -> str:
        """Member op types joined with '+', e.g. 'Conv+BatchNormalization+Relu'."""
        return "+".join(self.op_types) if self.op_types else "?"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "FusionGroup":
        return cls(**d)


@dataclass
class FusionPlan:
    """An ordered list of fusion groups over one model."""

    groups: list[FusionGroup] = field(default_factory=list)
    model: str = ""
    notes: list[str] = field(default_factory=list)

    # -- container behaviour -----------------------------------------------------------------------
    def __iter__(self) -> Iterator[FusionGroup]:
        return iter(self.groups)

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, key: int | str) -> FusionGroup:
        if isinstance(key, str):
            for g in self.groups:
                if g.id == key:
                    return g
            raise KeyError(key)
        return self.groups[key]

    def add(self, group: FusionGroup) -> FusionGroup:
        taken = self.node_to_group()
        clash = [n for n in group.nodes if n in taken]
        if clash:
            raise ValueError(f"node(s) {clash} already belong to group {taken[clash[0]]!r}")
        if any(g.id == group.id for g in self.groups):
            raise ValueError(f"duplicate group id {group.id!r}")
        self.groups.append(group)
        return group

    def extend(self, groups: Iterable[FusionGroup]) -> None:
        for g in groups:
            self.add(g)

    def node_to_group(self) -> dict[str, str]:
        return {n: g.id for g in self.groups for n in g.nodes}

    def by_kind(self, kind: str) -> "FusionPlan":
        return FusionPlan([g for g in self.groups if g.kind == kind], model=self.model)

    # -- summaries ---------------------------------------------------------------------------------
    @property
    def saved_bytes(self) -> int:
        return sum(g.saved_bytes for g in self.groups)

    @property
    def saved_launches(self) -> int:
        return sum(g.saved_launches for g in self.groups)

    def rule_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.groups:
            out[g.rule] = out.get(g.rule, 0) + 1
        return dict(sorted(out.items()))

    def rows(self) -> list[dict]:
        """One dict per group with the columns the table shows."""
        return [
            {
                "id": g.id,
                "kind": g.kind,
                "rule": g.rule,
                "pattern": g.pattern,
                "nodes": len(g.nodes),
                "saved KiB": round(g.saved_bytes / 1024, 1),
                "launches saved": g.saved_launches,
                "lowered to": g.lowered_to,
            }
            for g in self.groups
        ]

    def table(self, max_rows: int | None = None) -> str:
        """A plain-text table (deterministic: nbval compares it)."""
        rows = self.rows()
        if max_rows is not None and len(rows) > max_rows:
            shown = rows[:max_rows]
        else:
            shown = rows
        header = ["id", "kind", "rule", "pattern", "nodes", "saved KiB", "launches saved", "lowered to"]
        cells = [[str(r[h]) for h in header] for r in shown]
        out = text_table(header, cells)
        if len(shown) < len(rows):
            out.append(f"... {len(rows) - len(shown)} more groups")
        out.append(
            f"{len(self.groups)} groups, {sum(g.size for g in self.groups)} nodes fused, "
            f"{self.saved_launches} launches and {self.saved_bytes / 2**20:.2f} MiB of intermediate traffic saved"
        )
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()

    def _repr_html_(self) -> str:
        import html

        header = ["id", "kind", "rule", "pattern", "nodes", "saved KiB", "launches saved", "lowered to"]
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(r[h]))}</td>" for h in header) + "</tr>" for r in self.rows()
        )
        foot = html.escape(self.table().splitlines()[-1])
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table><p>{foot}</p>"

    # -- serialisation -----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"model": self.model, "notes": list(self.notes), "groups": [g.to_dict() for g in self.groups]}

    def to_json(self, **kw) -> str:
        kw.setdefault("indent", 2)
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_dict(cls, d: dict) -> "FusionPlan":
        return cls([FusionGroup.from_dict(g) for g in d.get("groups", [])], model=d.get("model", ""),
                   notes=list(d.get("notes", [])))

    @classmethod
    def from_json(cls, text: str) -> "FusionPlan":
        return cls.from_dict(json.loads(text))
