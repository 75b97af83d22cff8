"""The fusion plan: which nodes fuse into which group, why, and what it saves.

Plain data shared by passes, lowering, the cost model, pictures, widgets and reports. A plan prints as
a table, renders as HTML in a notebook, round-trips through JSON, and compares with `==` in tests.
"""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, field
from typing import Iterable, Iterator

from .text import MAX_WIDTH, text_table, wrap as wrap_text, wrap_cell

__all__ = ["FusionGroup", "FusionPlan", "PlanCounts", "Refusal", "MissGroup", "PlanError", "VERTICAL", "HORIZONTAL", "MIXED", "KINDS",
           "DEFAULT_PASSES"]

VERTICAL = "vertical"
HORIZONTAL = "horizontal"
MIXED = "mixed"
KINDS = (VERTICAL, HORIZONTAL, MIXED)
#: the passes every entry point runs unless told otherwise (`fuse`, `plan`, the `fuse`/`explain`/`show`/
#: `customop`/`profile` commands, the explorer): the ones that measure no slower on the corpus at onnxruntime's
#: ALL level (benchmarks/). One default, so a prediction describes the model `fuse` writes.
DEFAULT_PASSES = (VERTICAL,)


class PlanError(ValueError):
    """A plan that cannot be read or applied (malformed JSON, a stale group); the message is one line."""


@dataclass(frozen=True)
class Refusal:
    """A candidate a rule looked at and refused: the rule, the node it was anchored on, and why.

    `reason` is the whole sentence. Where the rule can say it in parts, `condition` is what it needs (the same
    words for every candidate it refuses for that reason, so refusals group), `found` the value that failed it
    (a shape, a constant, a dtype, a second reader, a graph output), and `matched` how many nodes of its
    pattern were in place when it refused (a near miss matched more; 0 when the rule does not say).
    """

    rule: str
    node: str
    reason: str
    condition: str = ""
    found: str = ""
    matched: int = 0

    def __str__(self) -> str:
        return f"{self.rule} {self.node}: {self.reason}"


@dataclass
class MissGroup:
    """Refusals of one rule for one reason: `condition` (what the rule needs; the whole reason when the rule
    does not say it in parts) and the candidates it refused. `nearest` is the most pattern nodes any of them
    had in place: the larger, the nearer the miss."""

    rule: str
    condition: str
    structured: bool
    refusals: list[Refusal]

    @property
    def nearest(self) -> int:
        return max((r.matched for r in self.refusals), default=0)

    def found(self) -> list[tuple[str, int]]:
        """The distinct values that failed the condition, most frequent first, with their counts."""
        counts: dict[str, int] = {}
        for r in self.refusals:
            if r.found:
                counts[r.found] = counts.get(r.found, 0) + 1
        return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


@dataclass
class FusionGroup:
    """One group of nodes that becomes one kernel.

    - `nodes`: member node names in execution order.
    - `kind`: vertical (a producer-consumer chain), horizontal (siblings sharing an input), mixed.
    - `rule`: the pattern or pass that formed it, e.g. ``"conv_bn"`` or ``"fuse_ops"``.
    - `op_types`: member op types, parallel to `nodes`.
    - `saved_bytes`: intermediate traffic the emitted lowering removes (each intermediate counted written once
      and read once; an intermediate read by two members is read twice unfused, so this is a lower bound).
    - `saved_launches`: kernels no longer launched: members - `kernels`.
    - `lowered_to`: what the group became (``"Conv"``, ``"com.microsoft:FusedConv"``, a function name...).
    - `reason`: why the group stopped growing or why it is legal, in words.
    - `anchor`: the node the rule is anchored on; `apply` re-checks the rule there (default: the first node).
    - `covers`: names of the *loaded model's* nodes the group's kernel stands for (differs from `nodes` when an
      earlier pass rewrote some members, e.g. a mixed group over a vertically fused Conv).
    - `recompute`: members copied into this group rather than moved (a cheap op several groups recompute).
    - `kernels`: kernels the emitted lowering launches (1 for FusedConv, 2 for Conv + QuickGelu).
    - `runs`: the kernels of this group's rewrite still in the fused model after every pass, measured by `fuse`
      (None in a plan it did not make: then `kernels`). Less than `kernels` when a later group took some in
      (a mixed group over the IsNaN + Where guard after a MultiHeadAttention): the MultiHeadAttention still
      runs on its own, and the plan counts it (`FusionPlan.left_over`).
    - `extra`: descriptive data for reports and lessons (never read by `apply`).
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
    anchor: str = ""
    covers: list[str] = field(default_factory=list)
    recompute: list[str] = field(default_factory=list)
    kernels: int = 1
    runs: int | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown fusion kind {self.kind!r}; expected one of {KINDS}")
        if not self.nodes:
            raise ValueError(f"fusion group {self.id!r} has no nodes")
        if self.op_types and len(self.op_types) != len(self.nodes):
            raise ValueError(f"fusion group {self.id!r}: op_types and nodes differ in length")
        if not self.anchor:
            self.anchor = self.nodes[0]
        elif self.anchor not in self.nodes:
            raise ValueError(f"fusion group {self.id!r}: anchor {self.anchor!r} is not one of its nodes")
        if not self.covers:
            self.covers = list(self.nodes)

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
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(d) - known)
        if unknown:
            raise PlanError(f"group {d.get('id', '?')!r}: unknown field(s) {unknown}; known: {', '.join(sorted(known))}")
        missing = [k for k in ("id", "kind", "rule", "nodes") if k not in d]
        if missing:
            raise PlanError(f"group {d.get('id', '?')!r}: missing field(s) {missing}")
        return cls(**d)


@dataclass(frozen=True)
class PlanCounts:
    """The plan's accounting, computed once (`FusionPlan.counts`) and printed the same way everywhere.

    - `groups`: groups whose kernel runs. A group a later one absorbed (a vertical FusedConv inside a mixed
      group: their `covers` overlap) is no kernel of its own and is not counted; `formed` counts every group.
    - `nodes`: the loaded model's nodes those groups run, each counted once.
    - `kernels`: the kernels those nodes run as (a group's lowering may launch two: Conv + QuickGelu), with
      `left_over`: the kernels of absorbed groups that the absorbing group did not take in (`left_over`).
      `nodes - kernels` is the launches the plan saves, the sum of its table's column.
    - `unfused_kernels`, `fused_kernels`: given the cost model's prices of the model unfused and under this
      plan (`cost.plan_cost`), the kernels the whole model launches: the "kernels A -> B" the explorer and
      `explain` print. Nodes outside groups launch one kernel each (host-side shape arithmetic none).
    """

    groups: int
    formed: int
    nodes: int
    kernels: int
    unfused_kernels: int | None = None
    fused_kernels: int | None = None
    left_over: int = 0

    @property
    def absorbed(self) -> int:
        return self.formed - self.groups

    @property
    def launches_saved(self) -> int:
        return self.nodes - self.kernels

    def line(self) -> str:
        """One line, e.g. "24 groups: 69 nodes run as 24 kernels (4 group(s) inside later ones counted once)"."""
        text = f"{self.groups} groups: {self.nodes} nodes run as {self.kernels} kernels"
        if self.absorbed:
            text += f" ({self.absorbed} group(s) inside later ones counted once"
            text += f"; {self.left_over} of their kernels still run on their own)" if self.left_over else ")"
        if self.fused_kernels is not None:
            text += (f"; with {self.fused_kernels - self.kernels} kernel(s) outside groups the model launches "
                     f"{self.unfused_kernels} -> {self.fused_kernels}{self.prepared_text()}")
        return text

    @property
    def prepared_away(self) -> int | None:
        """Kernels of the loaded model that preparation (clean-up, constant folding) removed before planning:
        `unfused_kernels - (nodes - kernels) - fused_kernels`, so the three numbers printed add up."""
        if self.fused_kernels is None or self.unfused_kernels is None:
            return None
        return self.unfused_kernels - (self.nodes - self.kernels) - self.fused_kernels

    def prepared_text(self) -> str:
        n = self.prepared_away
        return f" (preparation removed {n} kernel(s) before planning)" if n else ""


@dataclass
class FusionPlan:
    """An ordered list of fusion groups over one model."""

    groups: list[FusionGroup] = field(default_factory=list)
    model: str = ""
    notes: list[str] = field(default_factory=list)
    #: how the plan was made: {"passes": [...], "prepare": bool, "fold": bool, "<pass>": {option: value}}; `apply` reuses it
    options: dict = field(default_factory=dict)
    #: every candidate a rule refused, with the reason ("why was this not fused?")
    refusals: list[Refusal] = field(default_factory=list)

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
        clash = [n for n in group.nodes if n in taken and n not in group.recompute]
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
        return {n: g.id for g in self.groups for n in g.nodes if n not in g.recompute}

    def kernel_of(self) -> dict[str, str]:
        """{loaded model's node: id of the group whose kernel runs it}; a later group absorbs an earlier one."""
        out: dict[str, str] = {}
        for g in self.groups:
            for n in g.covers:
                out[n] = g.id
        return out

    def by_kind(self, kind: str) -> "FusionPlan":
        keep = {g.id for g in self.groups if g.kind == kind}
        return FusionPlan(self._kept(keep), model=self.model, options=dict(self.options))

    def _kept(self, keep: set[str]) -> list[FusionGroup]:
        """Copies of the groups in `keep`. A kept group that a left-out later group took from (their `covers`
        overlap) runs its whole lowering again: its measured `runs` no longer holds and is dropped (`kernels`)."""
        out, later = [], set()
        for g in reversed(self.groups):
            if g.id in keep:
                out.append(FusionGroup.from_dict({**g.to_dict(), "runs": None if later & set(g.covers) else g.runs}))
            else:
                later |= set(g.covers)
        return out[::-1]

    def without(self, *group_ids: str) -> "FusionPlan":
        """A copy of the plan without the named groups (their nodes stay unfused when it is applied).

        A later group built on a dropped one (a mixed group over its fused Conv: their `covers` overlap) goes
        too, since the node it starts from will not exist; the copy's notes say so.
        """
        unknown = [g for g in group_ids if g not in {x.id for x in self.groups}]
        if unknown:
            raise KeyError(unknown[0])
        drop, gone, notes = set(group_ids), set(), []
        for g in self.groups:
            if g.id in drop:
                gone |= set(g.covers)
            elif gone & set(g.covers):
                drop.add(g.id)
                gone |= set(g.covers)
                notes.append(f"edit: group {g.id} dropped too: it was built on a dropped group")
        d = self.to_dict()
        kept = self._kept({g.id for g in self.groups if g.id not in drop})
        return FusionPlan.from_dict({**d, "notes": d["notes"] + notes, "groups": [g.to_dict() for g in kept]})

    def why_not(self, node: str | None = None) -> list[Refusal]:
        """Refusals, all or those anchored on one node."""
        return [r for r in self.refusals if node is None or r.node == node]

    def near_misses(self, node: str | None = None) -> list["MissGroup"]:
        """The refusals grouped by rule and condition, nearest misses first (see `MissGroup`)."""
        groups: dict[tuple[str, str], MissGroup] = {}
        for r in dict.fromkeys(self.why_not(node)):  # the same refusal met twice counts once
            key = (r.rule, r.condition or r.reason)
            groups.setdefault(key, MissGroup(r.rule, r.condition or r.reason, bool(r.condition), [])).refusals.append(r)
        per_rule: dict[str, list[MissGroup]] = {}
        for g in groups.values():
            per_rule.setdefault(g.rule, []).append(g)
        for gs in per_rule.values():
            gs.sort(key=lambda g: (-g.nearest, -len(g.refusals), g.condition))
        rules = sorted(per_rule, key=lambda r: (-per_rule[r][0].nearest, -sum(len(g.refusals) for g in per_rule[r]), r))
        return [g for r in rules for g in per_rule[r]]

    # -- summaries ---------------------------------------------------------------------------------
    def left_over(self) -> dict[str, int]:
        """{id of a running group: kernels of groups it absorbed that still run on their own}.

        A group that a later one absorbed keeps the kernels of its rewrite the later group did not take in
        (`FusionGroup.runs`): BERT's attention group emits MultiHeadAttention + IsNaN + Where, a mixed group
        takes the IsNaN + Where, and the MultiHeadAttention still launches. Those launches are counted with the
        running group that now owns the absorbed group's first node (`kernel_of`). An absorbed group without a
        measured `runs` (a hand-made plan) is taken whole."""
        owner = self.kernel_of()
        live = set(owner.values())
        out: dict[str, int] = {}
        for g in self.groups:
            if g.id not in live and g.runs:
                home = owner[g.covers[0]]
                out[home] = out.get(home, 0) + g.runs
        return out

    def launches_of(self, group: FusionGroup, left_over: dict[str, int] | None = None) -> int:
        """Kernels a running group's nodes run as: its own still in the model, and those `left_over` homes here
        (pass `left_over()` when asking for many groups)."""
        own = group.kernels if group.runs is None else group.runs
        return own + (self.left_over() if left_over is None else left_over).get(group.id, 0)

    def running(self) -> list[FusionGroup]:
        """The groups whose kernel runs: all but those a later group absorbed (see `kernel_of`)."""
        live = set(self.kernel_of().values())
        return [g for g in self.groups if g.id in live]

    def counts(self, fused=None, unfused=None) -> PlanCounts:
        """Groups, nodes, kernels and launches, each node and kernel counted once (see `PlanCounts`).

        `fused`, `unfused`: the cost model's `PlanCost` of the model under this plan and without one, for the
        whole model's kernels."""
        running = self.running()
        live = {g.id for g in running}
        # A group over an earlier group's product (a horizontal stack of FusedConvs, a mixed group over a fused
        # Conv) covers the loaded model's nodes behind its members. Those are this plan's nodes when the earlier
        # group is in this plan too (absorbed here). In a plan without it (the horizontal groups of a vertical +
        # horizontal plan, shown on their own) the earlier group's saving is not this plan's: each member counts
        # as one node, or its launches would be claimed twice.
        absorbed = [set(g.covers) for g in self.groups if g.id not in live]
        loaded: set[str] = set()
        members = 0
        for g in running:
            products = set(g.nodes) - set(g.covers)
            if products and not any(a & set(g.covers) for a in absorbed):
                members += len(g.nodes)
            else:
                loaded |= set(g.covers)
        nodes = len(loaded) + members
        left = sum(self.left_over().values())
        own = sum(g.kernels if g.runs is None else g.runs for g in running)
        return PlanCounts(groups=len(running), formed=len(self.groups), nodes=nodes,
                          kernels=own + left, left_over=left,
                          unfused_kernels=unfused.kernels if unfused is not None else None,
                          fused_kernels=fused.kernels if fused is not None else None)

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
                "kernels": g.kernels,
                "launches saved": g.saved_launches,
                "saved KiB": round(g.saved_bytes / 1024, 1),
                "lowered to": g.lowered_to,
            }
            for g in self.groups
        ]

    def table(self, max_rows: int | None = None, *, wrap: bool = False) -> str:
        """A plain-text table (deterministic: nbval compares it) within `text.MAX_WIDTH` columns.

        With `wrap`, a pattern too long for its column continues on the next lines instead of being clipped
        (the command line's tables; the notebooks' stored tables are rebuilt with it when they next change).
        """
        rows = self.rows()
        if max_rows is not None and len(rows) > max_rows:
            shown = rows[:max_rows]
        else:
            shown = rows
        header = ["id", "kind", "rule", "pattern", "nodes", "kernels", "launches saved", "saved KiB", "lowered to"]
        cells = [[_compact(str(r[h])) if h in ("pattern", "lowered to") else str(r[h]) for h in header]
                 for r in shown]
        out = text_table(header, cells)
        if wrap and any("…" in line for line in out[2:]):  # a clipped cell: each pattern on lines of its own
            out = _pattern_lines(header, cells)
        if len(shown) < len(rows):
            out.append(f"... {len(rows) - len(shown)} more groups")

        out += wrap_text(self.footer()).split("\n")
        return "\n".join(out)

    def footer(self) -> str:
        """The table's last line, unwrapped: the plan's counts (`counts`) and the traffic it saves."""
        c = self.counts()
        return (f"{c.line()}, {c.launches_saved} launches and {self.saved_bytes / 2**20:.2f} MiB of intermediate "
                "traffic saved")

    def __str__(self) -> str:
        return self.table()

    def _repr_html_(self) -> str:
        header = ["id", "kind", "rule", "pattern", "nodes", "kernels", "launches saved", "saved KiB", "lowered to"]
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(r[h]))}</td>" for h in header) + "</tr>" for r in self.rows()
        )
        foot = html.escape(self.footer())
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table><p>{foot}</p>"

    # -- serialisation -----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"model": self.model, "options": _jsonable(self.options), "notes": list(self.notes),
                "groups": [g.to_dict() for g in self.groups], "refusals": [asdict(r) for r in self.refusals]}

    def to_json(self, **kw) -> str:
        kw.setdefault("indent", 2)
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_dict(cls, d: dict) -> "FusionPlan":
        if not isinstance(d, dict) or not isinstance(d.get("groups", []), list):
            raise PlanError("a plan is a JSON object with a list of groups")
        plan = cls(model=d.get("model", ""), notes=list(d.get("notes", [])), options=dict(d.get("options", {})),
                   refusals=[Refusal(**r) for r in d.get("refusals", [])])
        for g in d.get("groups", []):
            if not isinstance(g, dict):
                raise PlanError("every group of a plan is a JSON object")
            try:
                plan.add(FusionGroup.from_dict(g))
            except PlanError:
                raise
            except (TypeError, ValueError) as exc:
                raise PlanError(str(exc)) from None
        return plan

    @classmethod
    def from_json(cls, text: str) -> "FusionPlan":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanError(f"not a JSON plan ({exc})") from None
        return cls.from_dict(data.get("plan", data) if isinstance(data, dict) else data)


def _pattern_lines(header: list[str], cells: list[list[str]]) -> list[str]:
    """The plan table without its pattern column, each row followed by its pattern, indented, broken after
    a '+' within the width: nothing clipped."""

    k = header.index("pattern")
    table = text_table(header[:k] + header[k + 1:], [c[:k] + c[k + 1:] for c in cells])
    n_head = len(table) - len(cells)
    out = table[:n_head]
    for line, c in zip(table[n_head:], cells):
        out.append(line)
        out += ["    " + piece for piece in wrap_cell(c[k], MAX_WIDTH - 4)]
    return out


def _jsonable(value):
    """Options as plain JSON data (tuples and sets become sorted/ordered lists)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(_jsonable(v) for v in value)
    return value


def _compact(ops: str) -> str:
    """An op sequence as the text table shows it: runs of one op as 'Op×n', contrib ops without their domain,
    BatchNormalization as BN ("Conv+BN+Relu", "FusedConv×3")."""
    names = [p.split(":")[-1].replace("BatchNormalization", "BN") for p in ops.split("+")]
    runs: list[list] = []
    for n in names:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return "+".join(n if k == 1 else f"{n}×{k}" for n, k in runs)
