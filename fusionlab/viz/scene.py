"""The scene: which nodes, values and groups a picture shows (shared by DOT and matplotlib)."""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import onnx
import onnx_ir as ir

from ..graph import as_graph
from ..plan import FusionGroup, FusionPlan, HORIZONTAL, MIXED, VERTICAL, _compact

__all__ = ["FONT", "GROUP_COLORS", "Item", "Scene", "group_colors", "neighbourhood", "scene_of"]


#: Colours per fusion kind; groups of one kind cycle through its list (one colour per rule).
GROUP_COLORS = {
    VERTICAL: ["#2f6fb0", "#1f9e89", "#5b4bb7", "#4a90c2"],
    HORIZONTAL: ["#e07b39", "#c9a227", "#c0392b", "#d35d90"],
    MIXED: ["#3a9a4a", "#8e44ad", "#7f6a3a", "#607d8b"],
}
FONT = "DejaVu Sans"  # ships with matplotlib: the same glyphs on every machine


# --------------------------------------------------------------------------------------------------
# the scene: which boxes and edges a picture has
# --------------------------------------------------------------------------------------------------

@dataclass
class Item:
    key: str
    kind: str  # "op", "input" (a graph input), "output" (a graph output), "cut" (a value read by nodes not drawn)
    #: or "from" (a value made by a node not drawn)
    title: str  # op type, "input"/"output", "→ N more consumers" for a cut edge, "from Op" for a "from" stub
    subtitle: str  # short node name, or the value name
    detail: list[str] = field(default_factory=list)  # weight shapes / value shape
    order: int = 0
    group: str | None = None
    #: for an op that stands for several of the loaded model's ops (a fused op): what it fuses, e.g.
    #: "Conv+BN+Relu" ("" for an op that is no fusion)
    fused: str = ""


@dataclass
class Scene:
    name: str
    items: list[Item]
    edges: list[tuple[str, str, str]]  # (from key, to key, shape text of the value)
    groups: list[tuple[FusionGroup, list[str]]]  # visible groups and their member keys

    @property
    def op_count(self) -> int:
        return sum(1 for i in self.items if i.kind == "op")


def _shape_text(value: ir.Value | None) -> str:
    if value is None or value.shape is None:
        return ""
    dims = [str(d) if d is not None and str(d) else "?" for d in value.shape]
    return "×".join(dims) if dims else "scalar"


def _short_name(name: str, op_type: str) -> str:
    """A node name cut to what helps a reader: '/layer1/layer1.0/conv1/Conv' -> 'layer1.0/conv1'.

    A scope repeated by the next one ('/features/features.1/features.1.0/block') counts once."""
    parts = [p for p in re.split(r"[/:]", name) if p]
    if parts and parts[-1] == op_type:
        parts = parts[:-1]
    parts = [p for i, p in enumerate(parts) if i + 1 == len(parts) or not parts[i + 1].startswith(p)]
    text = "/".join(parts[-2:]) if parts else ""
    return text if len(text) <= 24 else "…" + text[-23:]


def _clip(text: str, n: int = 22) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _input_names(node: ir.Node, opset: int) -> list[str]:
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain or "")
        names = [i.name for i in schema.inputs]
        if names and len(node.inputs) > len(names):  # variadic tail
            names += [names[-1]] * (len(node.inputs) - len(names))
        return names
    except Exception:
        return []


def _merge_weights(weights: list[str]) -> list[str]:
    """'scale 64', 'B 64', 'mean 64' -> 'scale, B, mean 64' (one line per distinct shape, in order)."""
    by_shape: dict[str, list[str]] = {}
    for w in weights:
        name, _, shape = w.partition(" ")
        by_shape.setdefault(shape, []).append(name)
    return [f"{', '.join(names)} {shape}".rstrip() for shape, names in by_shape.items()]


def _node_keys(order: list[ir.Node]) -> list[str]:
    """Node names: unique from load on (`fusionlab.graph.name_nodes`), the one identity plans use too."""
    return [n.name for n in order]


def neighbourhood(model, names: Iterable[str] | str, hops: int = 1) -> list[str]:
    """Node names within `hops` edges (either direction) of `names`, in topological order."""
    g = as_graph(model, check=False)
    order = g.topological_order()
    keys = _node_keys(order)
    by_key = dict(zip(keys, order))
    wanted = _resolve_names(names, keys, order)
    adj: dict[str, set[str]] = {k: set() for k in keys}
    key_of = {id(n): k for k, n in zip(keys, order)}
    for k, n in zip(keys, order):
        for v in n.inputs:
            p = v.producer() if v is not None else None
            if p is not None and id(p) in key_of:
                adj[k].add(key_of[id(p)])
                adj[key_of[id(p)]].add(k)
    seen = set(wanted)
    frontier = deque((k, 0) for k in wanted)
    while frontier:
        k, d = frontier.popleft()
        if d >= hops:
            continue
        for m in sorted(adj[k]):
            if m not in seen:
                seen.add(m)
                frontier.append((m, d + 1))
    return [k for k in keys if k in seen and by_key[k] is not None]


def _resolve_names(names, keys: list[str], order: list[ir.Node]) -> list[str]:
    if isinstance(names, str):
        names = [names]
    elif hasattr(names, "covers") and not callable(getattr(names, "covers")):  # a FusionGroup
        names = list(names.covers)
    names = list(names)
    by_name: dict[str, str] = {}
    for k, n in zip(keys, order):
        by_name.setdefault(k, k)
        if n.name:
            by_name.setdefault(n.name, k)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        shown = ", ".join(repr(u) for u in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise ValueError(f"no node named {shown} in this model")
    out: list[str] = []
    for n in names:
        if by_name[n] not in out:
            out.append(by_name[n])
    return out


def _subgraph_nodes(node: ir.Node) -> list[ir.Node]:
    """Every node inside the subgraphs (If/Loop/Scan bodies) of a node, recursively."""
    out: list[ir.Node] = []
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            graphs = [attr.value]
        elif attr.type == ir.AttributeType.GRAPHS:
            graphs = list(attr.value)
        else:
            continue
        for g in graphs:
            out.extend(ir.traversal.RecursiveGraphIterator(g))
    return out


def _chosen_keys(g, nodes, hops: int, keys: list[str], order: list[ir.Node]) -> set[str]:
    """The node keys a picture shows: all, the named ones, or the named ones and their neighbours."""
    if nodes is None:
        return set(keys)
    return set(neighbourhood(g, nodes, hops) if hops else _resolve_names(nodes, keys, order))


def _subgraph_reads(g, order: list[ir.Node], key_of: dict[int, str]):
    """(owner, captured): each If/Loop/Scan body node -> its node; each such node -> the outer values its bodies read.

    A value read inside a body counts as read by the If/Loop node itself.
    """
    owner: dict[int, ir.Node] = {}
    captured: dict[int, list[ir.Value]] = {}
    main_inputs = {id(v) for v in g.graph.inputs}
    for n in order:
        inner = _subgraph_nodes(n)
        if not inner:
            continue
        own_outputs = {id(v) for m in inner for v in m.outputs}
        seen_ids: set[int] = set()
        for m in inner:
            owner[id(m)] = n
            for v in m.inputs:
                if v is None or id(v) in own_outputs or id(v) in seen_ids:
                    continue
                p = v.producer()
                if (p is not None and id(p) in key_of) or id(v) in main_inputs:
                    seen_ids.add(id(v))
                    captured.setdefault(id(n), []).append(v)
    return owner, captured


def _terminal(kind: str, v: ir.Value, order: int, readers: int = 0) -> Item:
    """The ellipse of a graph input ("input") or output ("output") at the drawn part's edge; for "cut" (a value
    that is no graph output, read only by nodes left out of the picture) and "from" (a value made by a node left
    out) a plain label on a short dashed stub arrow: neither is an input or output of the model."""
    shape = _shape_text(v)
    if kind == "cut":
        title = f"→ {readers} more consumer{'s' if readers != 1 else ''}"
        return Item(f"{kind}:{v.name}", kind, title, "not drawn", [], order=order)
    if kind == "from":
        producer = v.producer()
        return Item(f"{kind}:{v.name}", kind, f"from {producer.op_type if producer is not None else '?'}",
                     "not drawn", [], order=order)
    return Item(f"{kind}:{v.name}", kind, kind, _clip(v.name), [shape] if shape else [], order=order)


class _SceneBuilder:
    """Collects op boxes, input/output ellipses and de-duplicated edges, one chosen node at a time."""

    def __init__(self, g, order: list[ir.Node], keys: list[str], chosen: set[str], source=None):
        self.g, self.chosen = g, chosen
        #: op types of the model a fused graph was made from (to say what its fused ops stand for)
        self.source_ops = {n.name: n.op_type for n in (source.graph if source is not None else g.graph)}
        self.key_of = {id(n): k for k, n in zip(keys, order)}
        self.owner, self.captured = _subgraph_reads(g, order, self.key_of)
        self.items: list[Item] = []
        self.terminals: dict[str, dict[str, Item]] = {"input": {}, "from": {}, "output": {}, "cut": {}}
        self.edges: list[tuple[str, str, str]] = []
        self._edge_seen: set[tuple[str, str]] = set()

    def edge(self, a: str, b: str, label: str) -> None:
        """Add an edge once."""
        if (a, b) not in self._edge_seen:
            self._edge_seen.add((a, b))
            self.edges.append((a, b, label))

    def terminal(self, kind: str, v: ir.Value, i: int, readers: int = 0) -> str:
        """The key of the input/output ellipse (or cut-edge stub) for `v`, made on first use."""
        tk = f"{kind}:{v.name}"
        self.terminals[kind].setdefault(tk, _terminal(kind, v, i, readers))
        return tk

    def _reads(self, i: int, k: str, n: ir.Node) -> list[str]:
        """Edges into node `n` (from a drawn producer or an input ellipse); returns its weight labels."""
        slot_names = _input_names(n, self.g.opset)
        initializers = self.g.graph.initializers
        weights = []
        for slot, v in enumerate(list(n.inputs) + self.captured.get(id(n), [])):
            if v is None:
                continue
            if slot >= len(n.inputs) and v.const_value is not None:
                continue  # a weight read inside a subgraph: not worth a label
            if v.const_value is not None or (v.name in initializers and v.producer() is None) or _is_constant_node(
                    v.producer()):
                slot_name = slot_names[slot] if slot < len(slot_names) else _clip(v.name or "const", 12)
                weights.append(f"{slot_name} {_shape_text(v)}".rstrip())
                continue
            p = v.producer()
            if p is not None and self.key_of.get(id(p)) in self.chosen:
                self.edge(self.key_of[id(p)], k, _shape_text(v))
            elif p is None:
                self.edge(self.terminal("input", v, i), k, "")
            else:  # made by a node left out of the picture: no graph input, so a dashed stub, not an input pill
                self.edge(self.terminal("from", v, i), k, "")
        return weights

    def _writes(self, i: int, k: str, n: ir.Node) -> None:
        """Edges to an output ellipse for each output of `n` that is a graph output, and to a cut-edge stub
        ("→ N more consumers") for each other output read by nodes outside the part: that value is no output."""
        for v in n.outputs:
            users = [self.owner.get(id(u), u) for u in self.g.consumers(v)]
            external = list({id(u): u for u in users if self.key_of.get(id(u)) not in self.chosen}.values())
            if v.is_graph_output():
                self.edge(k, self.terminal("output", v, i), "")
            elif external:
                self.edge(k, self.terminal("cut", v, i, len(external)), "")

    def fused_text(self, n: ir.Node) -> str:
        """What a fused op stands for: the op types of the loaded nodes it covers ("Conv+BN+Relu"), "fused op"
        for a contrib or model-local-function op whose origin this graph does not record, else ""."""

        covers = self.g.covers(n.name) if hasattr(self.g, "covers") else (n.name,)
        if len(covers) > 1:
            ops = [self.source_ops.get(c, "?") for c in covers]
            return _compact("+".join(ops)) if "?" not in ops else f"{len(covers)} ops"
        if n.domain not in ("", "ai.onnx"):
            return "fused op"
        return ""

    def add_op(self, i: int, k: str, n: ir.Node, group: str | None) -> None:
        """The box of node `n` (op type, short name, merged weight shapes) and its edges."""
        weights = self._reads(i, k, n)
        self._writes(i, k, n)
        title = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}"
        if n.domain == "com.microsoft":
            title = n.op_type  # the contrib domain is said once, in the legend
        self.items.append(Item(k, "op", title, _short_name(n.name, n.op_type), _merge_weights(weights), order=i,
                                group=group, fused=self.fused_text(n)))

    def all_items(self) -> list[Item]:
        """Input ellipses, "from" stubs, op boxes, output ellipses and cut-edge stubs, in that order."""
        return (list(self.terminals["input"].values()) + list(self.terminals["from"].values()) + self.items
                + list(self.terminals["output"].values()) + list(self.terminals["cut"].values()))


def _is_constant_node(n: ir.Node | None) -> bool:
    return n is not None and n.op_type == "Constant" and n.domain in ("", "ai.onnx")


def _visible_groups(plan: FusionPlan | None, items: list[Item], member_of: dict[str, str]):
    """Each plan group with at least one drawn member, and those members' keys in drawing order."""
    if plan is None:
        return []
    op_keys = [it.key for it in items]
    groups: list[tuple[FusionGroup, list[str]]] = []
    for grp in plan:
        members = [k for k in op_keys if member_of.get(k) == grp.id]
        if members:
            groups.append((grp, members))
    return groups


def scene_of(model, plan: FusionPlan | None, nodes, hops: int = 0, source=None) -> Scene:
    """The boxes, edges and visible groups of a picture of `model` (or of `nodes` plus `hops` neighbours).

    `source`: the model a fused `model` was made from, so its fused ops say what they stand for."""
    g = as_graph(model, check=False)
    order = g.topological_order()
    keys = _node_keys(order)
    chosen = _chosen_keys(g, nodes, hops, keys, order)
    member_of: dict[str, str] = {}
    if plan is not None:  # a node drawn in the group whose kernel runs it (a later group absorbs an earlier one)
        member_of = {k: gid for k, gid in plan.kernel_of().items() if k in chosen}
    b = _SceneBuilder(g, order, keys, chosen, as_graph(source, check=False) if source is not None else None)
    for i, (k, n) in enumerate(zip(keys, order)):
        if k in chosen and not _is_constant_node(n):  # a Constant is a weight: a label of its reader, no box
            b.add_op(i, k, n, member_of.get(k))
    return Scene(name=g.graph.name or "model", items=b.all_items(), edges=b.edges,
                  groups=_visible_groups(plan, b.items, member_of))


def group_colors(groups: Sequence[FusionGroup]) -> dict[str, str]:
    """Colour per group id: by kind, one colour per rule within the kind (first come, first served)."""
    rule_color: dict[tuple[str, str], str] = {}
    per_kind: dict[str, int] = {}
    out = {}
    for g in groups:
        key = (g.kind, g.rule)
        if key not in rule_color:
            palette = GROUP_COLORS.get(g.kind, GROUP_COLORS[MIXED])
            rule_color[key] = palette[per_kind.get(g.kind, 0) % len(palette)]
            per_kind[g.kind] = per_kind.get(g.kind, 0) + 1
        out[g.id] = rule_color[key]
    return out
