"""Pictures of graphs and fusion plans, with nothing beyond pip: DOT text, matplotlib drawings, netron.

- `to_dot` writes Graphviz DOT text (fusion groups as coloured clusters). It is plain text, so tests and
  nbval can compare it; render it with any Graphviz you have, none is needed here.
- `layered_layout` + `draw` lay a graph out in layers (a small Sugiyama: longest-path layers, every node as
  late as its readers allow, barycenter ordering, dummy points for long edges) and draw it with matplotlib;
  fusion groups are coloured rounded rectangles behind their members, fused ops are filled and say which
  original ops they replace, the legend is on top. Any size: a tall graph goes in bands of layers side by
  side (`wrap="auto"`) and text is never scaled below readable. Deterministic: the same model gives the same
  picture, byte for byte through `save_picture`. Constant nodes, like initializers, are weights, not boxes.
- `netron_view` serves one model with netron on 127.0.0.1 for interactive exploration in an iframe; under
  a Jupyter server with jupyter-server-proxy the iframe goes through the server (`/proxy/127.0.0.1:PORT/`),
  so it works wherever the lab itself is reached (an SSH tunnel, a remote host, a hub).

Weights (initializers) are never drawn as boxes; their shapes are noted in the DOT labels instead.
"""

from __future__ import annotations

import atexit
import base64
import html
import importlib.util
import io
import logging
import math
import os
import re
import shutil
import tempfile
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import onnx
import onnx_ir as ir

from .files import atomic_write
from .graph import as_graph
from .plan import FusionGroup, FusionPlan, HORIZONTAL, MIXED, VERTICAL, _compact
from .runtime import model_bytes

__all__ = [
    "to_dot", "Layout", "layered_layout", "draw", "save_picture", "before_after", "neighbourhood",
    "NetronView", "netron_view", "jupyter_base_url", "NETRON_NOTICE", "GROUP_COLORS",
]

#: Colours per fusion kind; groups of one kind cycle through its list (one colour per rule).
GROUP_COLORS = {
    VERTICAL: ["#2f6fb0", "#1f9e89", "#5b4bb7", "#4a90c2"],
    HORIZONTAL: ["#e07b39", "#c9a227", "#c0392b", "#d35d90"],
    MIXED: ["#3a9a4a", "#8e44ad", "#7f6a3a", "#607d8b"],
}
_FONT = "DejaVu Sans"  # ships with matplotlib: the same glyphs on every machine


# --------------------------------------------------------------------------------------------------
# the scene: which boxes and edges a picture has
# --------------------------------------------------------------------------------------------------

@dataclass
class _Item:
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
class _Scene:
    name: str
    items: list[_Item]
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


def _terminal(kind: str, v: ir.Value, order: int, readers: int = 0) -> _Item:
    """The ellipse of a graph input ("input") or output ("output") at the drawn part's edge; for "cut" (a value
    that is no graph output, read only by nodes left out of the picture) and "from" (a value made by a node left
    out) a plain label on a short dashed stub arrow: neither is an input or output of the model."""
    shape = _shape_text(v)
    if kind == "cut":
        title = f"→ {readers} more consumer{'s' if readers != 1 else ''}"
        return _Item(f"{kind}:{v.name}", kind, title, "not drawn", [], order=order)
    if kind == "from":
        producer = v.producer()
        return _Item(f"{kind}:{v.name}", kind, f"from {producer.op_type if producer is not None else '?'}",
                     "not drawn", [], order=order)
    return _Item(f"{kind}:{v.name}", kind, kind, _clip(v.name), [shape] if shape else [], order=order)


class _SceneBuilder:
    """Collects op boxes, input/output ellipses and de-duplicated edges, one chosen node at a time."""

    def __init__(self, g, order: list[ir.Node], keys: list[str], chosen: set[str], source=None):
        self.g, self.chosen = g, chosen
        #: op types of the model a fused graph was made from (to say what its fused ops stand for)
        self.source_ops = {n.name: n.op_type for n in (source.graph if source is not None else g.graph)}
        self.key_of = {id(n): k for k, n in zip(keys, order)}
        self.owner, self.captured = _subgraph_reads(g, order, self.key_of)
        self.items: list[_Item] = []
        self.terminals: dict[str, dict[str, _Item]] = {"input": {}, "from": {}, "output": {}, "cut": {}}
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
        self.items.append(_Item(k, "op", title, _short_name(n.name, n.op_type), _merge_weights(weights), order=i,
                                group=group, fused=self.fused_text(n)))

    def all_items(self) -> list[_Item]:
        """Input ellipses, "from" stubs, op boxes, output ellipses and cut-edge stubs, in that order."""
        return (list(self.terminals["input"].values()) + list(self.terminals["from"].values()) + self.items
                + list(self.terminals["output"].values()) + list(self.terminals["cut"].values()))


def _is_constant_node(n: ir.Node | None) -> bool:
    return n is not None and n.op_type == "Constant" and n.domain in ("", "ai.onnx")


def _visible_groups(plan: FusionPlan | None, items: list[_Item], member_of: dict[str, str]):
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


def _scene(model, plan: FusionPlan | None, nodes, hops: int = 0, source=None) -> _Scene:
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
    return _Scene(name=g.graph.name or "model", items=b.all_items(), edges=b.edges,
                  groups=_visible_groups(plan, b.items, member_of))


def _group_colors(groups: Sequence[FusionGroup]) -> dict[str, str]:
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


# --------------------------------------------------------------------------------------------------
# DOT text
# --------------------------------------------------------------------------------------------------

def _dot_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _dot_id(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def to_dot(model, plan: FusionPlan | None = None, *, nodes=None, title: str | None = None, hops: int = 0,
           direction: str = "TB") -> str:
    """Graphviz DOT text of a model; fusion groups become coloured `subgraph cluster_<id>` blocks."""
    sc = _scene(model, plan, nodes, hops)
    ids = {}
    n_in = n_op = n_out = n_cut = n_from = 0
    for it in sc.items:
        if it.kind == "cut":
            ids[it.key], n_cut = f"cut{n_cut}", n_cut + 1
        elif it.kind == "from":
            ids[it.key], n_from = f"from{n_from}", n_from + 1
        elif it.kind == "input":
            ids[it.key], n_in = f"in{n_in}", n_in + 1
        elif it.kind == "output":
            ids[it.key], n_out = f"out{n_out}", n_out + 1
        else:
            ids[it.key], n_op = f"n{n_op}", n_op + 1
    colors = _group_colors([g for g, _ in sc.groups])
    lines = [f"digraph {_dot_str(title or sc.name)} {{"]
    graph_attrs = [f"rankdir={direction}", 'fontname="Helvetica"', "newrank=true"]
    if title:
        graph_attrs += [f"label={_dot_str(title)}", "labelloc=t"]
    lines.append(f"  graph [{', '.join(graph_attrs)}];")
    lines.append('  node [shape=box, style="rounded,filled", fillcolor="#ffffff", fontname="Helvetica", fontsize=10];')
    lines.append('  edge [color="#555555", fontname="Helvetica", fontsize=8];')

    def node_line(it: _Item, indent: str) -> str:
        if it.kind == "op":
            label = "\n".join([it.title] + ([it.subtitle] if it.subtitle and it.subtitle != it.title else []) + it.detail)
            return f"{indent}{ids[it.key]} [label={_dot_str(label)}];"
        if it.kind in ("cut", "from"):  # no pill: a plain label at the end of a dashed stub (no graph output/input)
            return f'{indent}{ids[it.key]} [label={_dot_str(it.title)}, shape=plaintext, style="", fontsize=8];'
        label = "\n".join([f"{it.title} {it.subtitle}"] + it.detail)
        return f'{indent}{ids[it.key]} [label={_dot_str(label)}, shape=ellipse, fillcolor="#eeeeee"];'

    members = {k: g.id for g, ks in sc.groups for k in ks}
    group_keys = {g.id: (g, ks) for g, ks in sc.groups}
    by_key = {it.key: it for it in sc.items}
    emitted: set[str] = set()
    used_cluster: set[str] = set()
    for it in sc.items:
        gid = members.get(it.key)
        if gid is None:
            lines.append(node_line(it, "  "))
            continue
        if gid in emitted:
            continue
        emitted.add(gid)
        grp, ks = group_keys[gid]
        cid = f"cluster_{_dot_id(gid)}"
        while cid in used_cluster:
            cid += "_"
        used_cluster.add(cid)
        col = colors[gid]
        lines.append(f"  subgraph {cid} {{")
        lines.append(f"    label={_dot_str(f'{gid}: {grp.kind} · {grp.rule}')};")
        lines.append(f'    style="rounded,filled"; color="{col}"; fillcolor="{col}26"; penwidth=1.5;')
        for k in ks:
            lines.append(node_line(by_key[k], "    "))
        lines.append("  }")
    for a, b, label in sc.edges:
        attrs = f" [label={_dot_str(label)}]" if label else ""
        if b.startswith("cut:") or a.startswith("from:"):
            attrs = ' [style=dashed, color="#999999"]'

        lines.append(f"  {ids[a]} -> {ids[b]}{attrs};")
    lines.append("}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# layered layout (Sugiyama-lite)
# --------------------------------------------------------------------------------------------------

_CHAR_TITLE = 0.074  # inches per character at 9 pt
_CHAR_SUB = 0.056  # at 7 pt
_GAP_ORDER = 0.22  # between boxes in one layer
_GAP_RANK = {"TB": 0.42, "LR": 0.55}  # between layers


@dataclass
class Layout:
    """Box centres and sizes (inches at scale 1), layers, and edge polylines of a layered drawing."""

    positions: dict[str, tuple[float, float]]
    sizes: dict[str, tuple[float, float]]
    layers: list[list[str]]
    edges: list[tuple[str, str, list[tuple[float, float]]]]
    kinds: dict[str, str]
    labels: dict[str, tuple[str, str]]
    groups: list[tuple[FusionGroup, list[str]]]
    direction: str = "TB"
    crossings: int = 0
    name: str = "model"
    #: keys of fused ops (drawn as such)
    fused: set = field(default_factory=set)
    #: the band (column of wrapped layers, left to right) of every key; all 0 when the layers are not wrapped
    band_of: dict = field(default_factory=dict)

    @property
    def bands(self) -> int:
        return 1 + max(self.band_of.values(), default=0)

    def box(self, key: str) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1) of one box."""
        (x, y), (w, h) = self.positions[key], self.sizes[key]
        return (x - w / 2, y - h / 2, x + w / 2, y + h / 2)

    def extent(self) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1) around every box."""
        boxes = [self.box(k) for k in self.positions] or [(0.0, 0.0, 0.0, 0.0)]
        return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))

    @property
    def width(self) -> float:
        x0, _, x1, _ = self.extent()
        return x1 - x0

    @property
    def height(self) -> float:
        _, y0, _, y1 = self.extent()
        return y1 - y0


def _item_label(it: _Item) -> tuple[str, str]:
    """(head, sub) lines of a box: op type and short name, or "input x" and the value's shape."""
    if it.kind == "op":
        if it.fused:
            return it.title, f"= {it.fused}"
        return it.title, (it.subtitle if it.subtitle != it.title else "")
    if it.kind == "cut":  # the dashed stub is the arrow: the label says where it goes
        return it.title.removeprefix("→ "), it.subtitle
    if it.kind == "from":  # and here where it comes from
        return it.title, it.subtitle
    return it.title + " " + it.subtitle, (it.detail[0] if it.detail else "")


def _item_size(it: _Item) -> tuple[float, float]:
    """(width, height) of a box, from the lengths of its two lines."""
    title, sub = _item_label(it)
    w = max(0.7, len(title) * _CHAR_TITLE + 0.26, len(sub) * _CHAR_SUB + 0.26)
    h = 0.44 if sub else 0.30
    return w, h


def _crossings(upper: list[str], lower: list[str], edges: list[tuple[str, str]]) -> int:
    pu = {k: i for i, k in enumerate(upper)}
    pl = {k: i for i, k in enumerate(lower)}
    segs = sorted((pu[a], pl[b]) for a, b in edges if a in pu and b in pl)
    count = 0
    for i in range(len(segs)):
        for j in range(i + 1, len(segs)):
            if segs[i][0] < segs[j][0] and segs[i][1] > segs[j][1]:
                count += 1
    return count


def _place(order: list[str], desired: dict[str, float], size: dict[str, float]) -> dict[str, float]:
    """Positions as close to `desired` as the order and the minimum gaps allow (average of two sweeps)."""
    n = len(order)
    if n == 0:
        return {}
    gap = [(size[order[i]] + size[order[i + 1]]) / 2 + _GAP_ORDER for i in range(n - 1)]
    left = [0.0] * n
    for i, k in enumerate(order):
        left[i] = desired[k] if i == 0 else max(desired[k], left[i - 1] + gap[i - 1])
    right = [0.0] * n
    for i in range(n - 1, -1, -1):
        k = order[i]
        right[i] = desired[k] if i == n - 1 else min(desired[k], right[i + 1] - gap[i])
    return {k: (left[i] + right[i]) / 2 for i, k in enumerate(order)}


def _longest_path_layers(sc: _Scene) -> dict[str, int]:
    """Layer of each item: longest path from the sources; then sources sink to just above their first consumer."""
    keys = [it.key for it in sc.items]
    preds: dict[str, list[str]] = {k: [] for k in keys}
    succs: dict[str, list[str]] = {k: [] for k in keys}
    for a, b, _ in sc.edges:
        preds[b].append(a)
        succs[a].append(b)
    layer: dict[str, int] = {}
    for k in keys:  # items are in topological order
        layer[k] = max((layer[p] + 1 for p in preds[k]), default=0)
    for k in reversed(keys):  # every node as late as its readers allow: side computations sit where they are used
        if succs[k]:
            layer[k] = max(layer[k], min(layer[s] for s in succs[k]) - 1)
    return layer


@dataclass
class _Ranked:
    """Items and dummy points (which split edges spanning several layers) by layer, and their links."""

    rank_of: dict[str, int]
    size: dict[str, tuple[float, float]]
    up: dict[str, list[str]]  # neighbours in the layer above
    down: dict[str, list[str]]  # neighbours in the layer below
    chains: list[tuple[str, str, list[str]]]  # each edge: (from, to, its path through dummy points)
    layers: list[list[str]]
    pair_edges: list[list[tuple[str, str]]]  # links between layer r and r + 1

    def crossings(self, layers: list[list[str]]) -> int:
        """Edge crossings of an ordering of the layers."""
        return sum(_crossings(layers[r], layers[r + 1], self.pair_edges[r]) for r in range(len(layers) - 1))


def _ranked(sc: _Scene, layer: dict[str, int]) -> _Ranked:
    """Split every edge that spans several layers with dummy points; list each layer's keys in item order."""
    keys = [it.key for it in sc.items]
    order_of = {it.key: idx for idx, it in enumerate(sc.items)}
    size: dict[str, tuple[float, float]] = {it.key: _item_size(it) for it in sc.items}
    rank_of = dict(layer)
    up: dict[str, list[str]] = {k: [] for k in keys}
    down: dict[str, list[str]] = {k: [] for k in keys}
    chains: list[tuple[str, str, list[str]]] = []
    for a, b, _ in sc.edges:
        path = [a]
        for r in range(layer[a] + 1, layer[b]):
            d = f"~{order_of[a]}>{order_of[b]}@{r}"
            rank_of[d] = r
            order_of[d] = order_of[a] + 0.5
            size[d] = (0.02, 0.02)
            up[d], down[d] = [], []
            path.append(d)
        path.append(b)
        for u, v in zip(path, path[1:]):
            down[u].append(v)
            up[v].append(u)
        chains.append((a, b, path))
    nodes_in: dict[int, list[str]] = {}
    for k, r in sorted(rank_of.items(), key=lambda kv: (kv[1], order_of[kv[0]], kv[0])):
        nodes_in.setdefault(r, []).append(k)
    n_layers = max(nodes_in) + 1 if nodes_in else 0
    layers = [nodes_in.get(r, []) for r in range(n_layers)]
    pair_edges = [[(u, v) for u in layers[r] for v in down[u]] for r in range(max(0, n_layers - 1))]
    return _Ranked(rank_of, size, up, down, chains, layers, pair_edges)


def _by_barycenter(layer: list[str], ref: list[str], neigh: dict[str, list[str]]) -> list[str]:
    """A layer sorted by the mean position of each key's neighbours in `ref` (its own index where it has none)."""
    pos = {k: i for i, k in enumerate(ref)}

    def bary(k: str, i: int) -> tuple[float, int]:
        ps = [pos[p] for p in neigh[k] if p in pos]
        return (sum(ps) / len(ps) if ps else float(i), i)

    return [k for _, k in sorted((bary(k, i), k) for i, k in enumerate(layer))]


def _groups_together(layer_keys: list[str], member_of: dict[str, str]) -> list[str]:
    """A layer reordered so that members of one group sit next to each other, where the group first appears."""
    first: dict[str, int] = {}
    for i, k in enumerate(layer_keys):
        gid = member_of.get(k)
        if gid is not None:
            first.setdefault(gid, i)
    return sorted(layer_keys, key=lambda k: (first.get(member_of.get(k), layer_keys.index(k)), layer_keys.index(k)))


def _ordered_layers(rk: _Ranked, member_of: dict[str, str]) -> list[list[str]]:
    """Barycenter sweeps down and up (six rounds) keeping the best ordering; then groups kept together if no worse."""
    n_layers = len(rk.layers)
    best = [list(l) for l in rk.layers]
    best_cross = rk.crossings(best)
    current = [list(l) for l in rk.layers]
    sweeps = [(r, True) for r in range(1, n_layers)] + [(r, False) for r in range(n_layers - 2, -1, -1)]
    for _ in range(6):
        for r, down in sweeps:
            current[r] = _by_barycenter(current[r], current[r - 1] if down else current[r + 1],
                                        rk.up if down else rk.down)
        c = rk.crossings(current)
        if c < best_cross:
            best, best_cross = [list(l) for l in current], c
    final = [_groups_together(l, member_of) for l in best]
    return best if rk.crossings(final) > best_cross else final  # grouping must not make it messier


def _pulled(layer: list[str], x: dict[str, float], neigh: dict[str, list[str]]) -> dict[str, float]:
    """Where each key of a layer would like to be: the mean position of its neighbours (else where it is)."""
    return {k: (sum(x[p] for p in neigh[k]) / len(neigh[k]) if neigh[k] else x[k]) for k in layer}


def _along_positions(layers: list[list[str]], rk: _Ranked, along) -> dict[str, float]:
    """Centres along the layers: packed and centred, pulled toward their neighbours (4 rounds), from 0."""
    x: dict[str, float] = {}
    for l in layers:
        cur = 0.0
        for k in l:
            x[k] = cur + along(k) / 2
            cur += along(k) + _GAP_ORDER
        shift = (cur - _GAP_ORDER) / 2
        for k in l:
            x[k] -= shift
    sizes_along = {k: along(k) for k in x}
    for _ in range(4):
        for r in range(1, len(layers)):
            x.update(_place(layers[r], _pulled(layers[r], x, rk.up), sizes_along))
        for r in range(len(layers) - 2, -1, -1):
            x.update(_place(layers[r], _pulled(layers[r], x, rk.down), sizes_along))
    lo = min((x[k] - along(k) / 2 for k in x), default=0.0)
    for k in x:
        x[k] -= lo
    return x


def _rank_positions(layers: list[list[str]], across, gap: float) -> list[float]:
    """Centre of each layer across the layers: each as deep as its deepest box, `gap` apart."""
    rank_pos: list[float] = []
    cur = 0.0
    for l in layers:
        depth = max((across(k) for k in l), default=0.0)
        rank_pos.append(cur + depth / 2)
        cur += depth + gap
    return rank_pos


def _edge_points(a: str, b: str, path: list[str], centre: dict, size: dict, direction: str) -> list:
    """An edge's polyline: from the side of box `a`, through its dummy points, to the side of box `b`."""
    (ax_, ay), (bx, by) = centre[a], centre[b]
    (aw, ah), (bw, bh) = size[a], size[b]
    inner = [centre[d] for d in path[1:-1]]
    if direction == "TB":
        return [(ax_, ay - ah / 2)] + inner + [(bx, by + bh / 2)]
    return [(ax_ + aw / 2, ay)] + inner + [(bx - bw / 2, by)]


#: gap between two bands of wrapped layers (inches): room for the edges that go on in the next band
_GUTTER = 0.6
#: the height / width a wrapped picture aims at (a little taller than wide: a page, a notebook column)
_ASPECT = 1.25


def _band_breaks(depths: list[float], k: int, gap: float) -> list[int]:
    """First layer of each of `k` bands of consecutive layers, cut where the running depth passes i/k."""
    total = sum(depths) + gap * (len(depths) - 1)
    starts, cur = [0], 0.0
    for r, d in enumerate(depths):
        if len(starts) < k and r > starts[-1] and cur >= total * len(starts) / k:
            starts.append(r)
        cur += d + gap
    return starts


def _bands(final: list[list[str]], x: dict, rank_pos: list[float], along, across, k: int, gap: float):
    """(band of each layer, x offset per band, top per band, width and height of the whole) for `k` bands."""
    depths = [max((across(key) for key in l), default=0.0) for l in final]
    starts = _band_breaks(depths, k, gap)
    band = [0] * len(final)
    for b, st in enumerate(starts):
        for r in range(st, len(final)):
            band[r] = b
    offs, tops, width, height = [], [], 0.0, 0.0
    for b, st in enumerate(starts):
        layers = [r for r in range(len(final)) if band[r] == b]
        keys = [key for r in layers for key in final[r]]
        lo = min((x[key] - along(key) / 2 for key in keys), default=0.0)
        hi = max((x[key] + along(key) / 2 for key in keys), default=0.0)
        offs.append(width + (_GUTTER if b else 0.0) - lo)
        width += (hi - lo) + (_GUTTER if b else 0.0)
        tops.append(rank_pos[layers[0]] - depths[layers[0]] / 2)
        height = max(height, rank_pos[layers[-1]] + depths[layers[-1]] / 2 - tops[-1])
    return band, offs, tops, width, height


def _choose_bands(final, x, rank_pos, along, across, gap: float, wrap) -> int:
    """How many bands: `wrap` itself when it is a number; for "auto" the count whose picture is nearest
    `_ASPECT` (height / width), one band when the picture is not tall."""
    if wrap in (None, False, 1):
        return 1
    if wrap != "auto":
        return max(1, min(int(wrap), len(final)))
    best, best_err = 1, None
    for k in range(1, min(len(final), 40) + 1):
        *_, w, h = _bands(final, x, rank_pos, along, across, k, gap)
        err = abs(math.log(max(h, 1e-6) / max(w, 1e-6) / _ASPECT))
        if best_err is None or err < best_err - 1e-9:
            best, best_err = k, err
    return best


def _banded_edge(pts: list, bands: list[int], bottoms: list[float], gutters: list[float], lane: float) -> list:
    """An edge's polyline with a detour wherever it goes on in the next band: down below its band, along
    the gutter, up above the next band's top, then on (TB drawings)."""
    out = [pts[0]]
    for (p, q), (bp, bq) in zip(zip(pts, pts[1:]), zip(bands, bands[1:])):
        if bq != bp:
            yb, xg = bottoms[bp] - 0.12 - lane, gutters[bq] + lane
            out += [(p[0], yb), (xg, yb), (xg, 0.12 + lane), (q[0], 0.12 + lane)]
        out.append(q)
    return out


def _layout_scene(sc: _Scene, direction: str = "TB", wrap=None) -> Layout:
    """Lay a scene out in layers: rank, split long edges, order to cut crossings, then place the boxes.

    `wrap` (TB only): None/1 one column of layers; an int that many bands of consecutive layers side by side;
    "auto" as many as bring the picture nearest a page's proportions (a long chain becomes columns).
    """
    if direction not in ("TB", "LR"):
        raise ValueError(f"direction must be 'TB' or 'LR', not {direction!r}")
    rk = _ranked(sc, _longest_path_layers(sc))
    final = _ordered_layers(rk, {k: g.id for g, ks in sc.groups for k in ks})
    # coordinates: along the layer (order axis) and across layers (rank axis)
    along_i, across_i = (0, 1) if direction == "TB" else (1, 0)

    def along(k):
        return rk.size[k][along_i]

    def across(k):
        return rk.size[k][across_i]

    x = _along_positions(final, rk, along)
    gap = _GAP_RANK[direction]
    rank_pos = _rank_positions(final, across, gap)
    n_bands = _choose_bands(final, x, rank_pos, along, across, gap, wrap) if direction == "TB" else 1
    layer_band = [0] * len(final)
    if n_bands > 1:
        layer_band, offs, tops, _, _ = _bands(final, x, rank_pos, along, across, n_bands, gap)
        centre = {k: (x[k] + offs[layer_band[r]], -(rank_pos[r] - tops[layer_band[r]])) for k, r in rk.rank_of.items()}
    else:
        centre = {k: ((x[k], -rank_pos[r]) if direction == "TB" else (rank_pos[r], -x[k]))
                  for k, r in rk.rank_of.items()}
    keys = [it.key for it in sc.items]
    real = set(keys)
    edges = [(a, b, _edge_points(a, b, path, centre, rk.size, direction)) for a, b, path in rk.chains]
    if n_bands > 1:
        band_of_key = {k: layer_band[r] for k, r in rk.rank_of.items()}
        bottoms = [min(centre[k][1] - rk.size[k][1] / 2 for k in centre if band_of_key[k] == b) for b in range(n_bands)]
        gutters = [min(centre[k][0] - rk.size[k][0] / 2 for k in centre if band_of_key[k] == b) - _GUTTER / 2
                   for b in range(n_bands)]
        crossing = 0
        for i, (a, b, path) in enumerate(rk.chains):
            bands = [band_of_key[k] for k in path]
            if len(set(bands)) > 1:
                lane = 0.04 * (crossing % 6)  # edges that go on in the next band keep apart
                crossing += 1
                edges[i] = (a, b, _banded_edge(edges[i][2], bands, bottoms, gutters, lane))
    return Layout(
        positions={k: centre[k] for k in keys},
        sizes={k: rk.size[k] for k in keys},
        layers=[[k for k in l if k in real] for l in final],
        edges=edges,
        kinds={it.key: it.kind for it in sc.items},
        labels={it.key: _item_label(it) for it in sc.items},
        groups=sc.groups,
        direction=direction,
        crossings=rk.crossings(final),
        name=sc.name,
        fused={it.key for it in sc.items if it.fused},
        band_of={k: layer_band[r] for k, r in rk.rank_of.items() if k in real},
    )


def layered_layout(model, plan: FusionPlan | None = None, nodes=None, *, hops: int = 0,
                   direction: str = "TB", wrap=None, source=None) -> Layout:
    """Deterministic layered layout of a model (or of `nodes`, plus `hops` neighbours); see `_layout_scene`
    for `wrap`, `_scene` for `source`."""
    return _layout_scene(_scene(model, plan, nodes, hops, source), direction, wrap)


# --------------------------------------------------------------------------------------------------
# matplotlib drawing
# --------------------------------------------------------------------------------------------------

_MAX_INCHES = 40.0
#: a drawing is never scaled below this (fonts stay readable: 9 pt x 0.7 at 120 dpi is 10 px); a bigger
#: model makes a bigger picture, in bands of layers (`wrap="auto"`) so it is not one tall strip
_MIN_SCALE = 0.7
_MARGIN = 0.2
_FUSED_FACE, _FUSED_EDGE = "#fff3d1", "#b7791f"
_LEGEND_ROW = 0.24  # inches per legend row


def _legend_entries(groups: list[tuple[FusionGroup, list[str]]]) -> list[tuple[str, str, int]]:
    colors = _group_colors([g for g, _ in groups])
    seen: dict[tuple[str, str], list] = {}
    for g, _ in groups:
        seen.setdefault((g.kind, g.rule), [colors[g.id], 0])[1] += 1
    return [(f"{kind} · {rule} ({n} group{'s' if n != 1 else ''})", col, n) for (kind, rule), (col, n) in seen.items()]


def _legend_columns(n: int) -> int:
    return min(3, n) if n else 1


def _group_parts(lay: Layout, ks: list[str]) -> list[list[str]]:
    """A group's members by band (one rectangle per band, so a group cut by a wrap draws no giant box)."""
    by_band: dict[int, list[str]] = {}
    for k in ks:
        by_band.setdefault(lay.band_of.get(k, 0), []).append(k)
    return [by_band[b] for b in sorted(by_band)]


def _render(lay: Layout, ax, *, title: str | None, scale: float) -> None:
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch
    from matplotlib.path import Path as MplPath

    colors = _group_colors([g for g, _ in lay.groups])
    member_color = {k: colors[g.id] for g, ks in lay.groups for k in ks}
    pad = 0.09
    label_strip = 0.14  # room above the members for the group's id, so no box hides it
    # fusion groups: one rounded rectangle per group (per band it spans), behind its members
    for g, ks in lay.groups:
        col = colors[g.id]
        for part_no, part in enumerate(_group_parts(lay, ks)):
            boxes = [lay.box(k) for k in part]
            x0, y0 = min(b[0] for b in boxes) - pad, min(b[1] for b in boxes) - pad
            x1, y1 = max(b[2] for b in boxes) + pad, max(b[3] for b in boxes) + pad + label_strip
            suffix = "" if part_no == 0 else f":part{part_no}"
            rect = FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0,rounding_size=0.1",
                                  facecolor=col, alpha=0.16, edgecolor="none", zorder=1)
            rect.set_gid(f"group:{g.id}" if part_no == 0 else f"group-part:{g.id}{suffix}")
            ax.add_patch(rect)
            outline = FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0,rounding_size=0.1",
                                     facecolor="none", edgecolor=col, linewidth=1.2 * scale, linestyle="--", zorder=1)
            outline.set_gid(f"group-outline:{g.id}{suffix}")
            ax.add_patch(outline)
            ax.text(x0 + 0.07, y1 - 0.025, g.id if part_no == 0 else f"{g.id} (cont.)", ha="left", va="top",
                    fontsize=7.5 * scale, color=col, zorder=6, fontfamily=_FONT, fontweight="bold", clip_on=False,
                    bbox={"boxstyle": "round,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})
    # edges
    for a, b, pts in lay.edges:
        codes = [MplPath.MOVETO] + [MplPath.LINETO] * (len(pts) - 1)
        # a value read by nodes not drawn, or made by one: a dashed grey stub, no output or input pill
        cut = lay.kinds.get(b) == "cut" or lay.kinds.get(a) == "from"
        arrow = FancyArrowPatch(path=MplPath(pts, codes), arrowstyle="-|>", mutation_scale=9 * scale,
                                linewidth=0.9 * scale, color="#999999" if cut else "#555555", shrinkA=0, shrinkB=0,
                                zorder=2, linestyle="--" if cut else "-")
        arrow.set_gid(f"edge:{a}->{b}")
        ax.add_patch(arrow)
    # boxes
    for k, (xc, yc) in lay.positions.items():
        w, h = lay.sizes[k]
        kind = lay.kinds[k]
        head, sub = lay.labels[k]
        fused = k in lay.fused
        if kind in ("cut", "from"):  # plain grey text at the stub's end: no box, never read as a graph output/input
            ax.text(xc, yc + (0.075 if sub else 0), head, ha="center", va="center", fontsize=8 * scale, zorder=4,
                    fontfamily=_FONT, color="#666666", style="italic", gid=f"{kind}:{k}")
            if sub:
                ax.text(xc, yc - 0.095, sub, ha="center", va="center", fontsize=7 * scale, color="#888888",
                        zorder=4, fontfamily=_FONT, style="italic")
            continue
        if kind == "op":
            face, edge, lw, rounding = "#ffffff", member_color.get(k, "#444444"), (1.6 if k in member_color else 0.9), 0.06
            if fused:
                face, edge, lw = _FUSED_FACE, member_color.get(k, _FUSED_EDGE), 2.2
        else:
            face, edge, lw, rounding = "#eeeeee", "#888888", 0.8, min(h / 2, 0.15)
        box = FancyBboxPatch((xc - w / 2, yc - h / 2), w, h, boxstyle=f"round,pad=0,rounding_size={rounding}",
                             facecolor=face, edgecolor=edge, linewidth=lw * scale, zorder=3)
        box.set_gid(f"node:{k}")
        ax.add_patch(box)
        if sub:
            ax.text(xc, yc + 0.075, head, ha="center", va="center", fontsize=9 * scale, zorder=4, fontfamily=_FONT,
                    fontweight="bold" if kind == "op" else "normal")
            ax.text(xc, yc - 0.095, sub, ha="center", va="center", fontsize=7 * scale,
                    color="#7a4b00" if fused else "#555555", zorder=4, fontfamily=_FONT)
        else:
            ax.text(xc, yc, head, ha="center", va="center", fontsize=9 * scale, zorder=4, fontfamily=_FONT,
                    fontweight="bold" if kind == "op" else "normal")
    x0, y0, x1, y1 = lay.extent()
    m = _MARGIN
    ax.set_xlim(x0 - m, x1 + m)
    ax.set_ylim(y0 - m, y1 + m)
    ax.set_aspect("equal", adjustable="box")
    ax.axis("off")
    entries = _legend_entries(lay.groups)
    handles = [Patch(facecolor=col + "29", edgecolor=col, label=text) for text, col, _ in entries]
    if lay.fused:
        handles.append(Patch(facecolor=_FUSED_FACE, edgecolor=_FUSED_EDGE, linewidth=2,
                             label=f"fused op ({len(lay.fused)}): '= …' names the original ops it replaces"))
    if title:
        ax.set_title(title, fontsize=11 * scale, fontfamily=_FONT, pad=(6 + _LEGEND_ROW * 72 * scale *
                     math.ceil(len(handles) / _legend_columns(len(handles))) if handles else 6))
    if handles:  # at the top, where a reader starts (below a tall drawing it was off screen)
        ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=_legend_columns(len(handles)),
                  frameon=False, prop={"family": _FONT, "size": 8 * scale}, handlelength=1.6, borderaxespad=0.3)


def _check_size(lay_or_scene_ops: int, max_nodes: int | None) -> None:
    if max_nodes is not None and lay_or_scene_ops > max_nodes:
        raise ValueError(
            f"graph has {lay_or_scene_ops} nodes, more than max_nodes={max_nodes}: draw a part with "
            f"nodes=[...] (e.g. nodes=viz.neighbourhood(model, ['some_node'], hops=3)) or raise max_nodes"
        )


def _legend_rows(lay: Layout) -> int:
    n = len(_legend_entries(lay.groups)) + (1 if lay.fused else 0)
    return math.ceil(n / _legend_columns(n)) if n else 0


def _figure_inches(lay: Layout, n_legend: int, title: bool) -> tuple[float, float, float, float]:
    """(width, height, extra height for title and legend, scale): 1 up to _MAX_INCHES, then smaller, never
    below _MIN_SCALE (a bigger model makes a bigger picture rather than unreadable text)."""
    w = lay.width + 2 * _MARGIN
    h = lay.height + 2 * _MARGIN
    extra_h = (0.35 if title else 0) + (_LEGEND_ROW * n_legend + 0.1 if n_legend else 0)
    scale = max(_MIN_SCALE, min(1.0, _MAX_INCHES / max(w, h + extra_h)))
    return w, h, extra_h, scale


def draw(model, plan: FusionPlan | None = None, *, nodes=None, ax=None, title: str | None = None,
         max_nodes: int | None = None, direction: str = "TB", hops: int = 0, wrap="auto", source=None):
    """A matplotlib Figure of a model: op boxes, arrows, fusion groups as coloured rounded rectangles, fused
    ops (a `source`'s nodes they stand for, or contrib ops) filled, the legend on top.

    Any size: a tall graph is laid out in bands of consecutive layers side by side (`wrap="auto"`; an int
    forces that many, None one column), and text is never scaled below `_MIN_SCALE`. `max_nodes` refuses
    bigger drawings when given."""
    sc = _scene(model, plan, nodes, hops, source)
    _check_size(sc.op_count, max_nodes)
    lay = _layout_scene(sc, direction, wrap if ax is None else None)
    rows = _legend_rows(lay)
    w, h, extra_h, scale = _figure_inches(lay, rows, bool(title))
    if ax is None:
        import matplotlib.pyplot as plt

        fw, fh = max(w, 2.5) * scale, (h + extra_h) * scale
        fig = plt.figure(figsize=(fw, fh))
        plt.close(fig)  # not managed by pyplot: a notebook shows the returned figure once, not twice
        ax = fig.add_axes((0, 0, 1, h * scale / fh))  # the legend and the title above it
    else:
        fig = ax.figure
        bbox = ax.get_position()
        fw, fh = fig.get_size_inches()
        scale = min(1.0, bbox.width * fw / w, bbox.height * fh / h)
        scale = max(scale, 0.35)
    _render(lay, ax, title=title, scale=scale)
    return fig


def before_after(model_a, model_b, plan: FusionPlan | None = None, *, nodes_a=None, nodes_b=None,
                 titles: Sequence[str] = ("before", "after"), plan_b: FusionPlan | None = None,
                 direction: str = "TB", max_nodes: int | None = None):
    """Two models side by side (e.g. before and after fusion); `plan` colours the first one, and the second's
    fused ops say which of the first one's ops they stand for."""
    import matplotlib.pyplot as plt

    sa, sb = _scene(model_a, plan, nodes_a), _scene(model_b, plan_b, nodes_b, source=model_a)
    _check_size(sa.op_count, max_nodes)
    _check_size(sb.op_count, max_nodes)
    la, lb = _layout_scene(sa, direction), _layout_scene(sb, direction)
    wa, ha, xa, _ = _figure_inches(la, _legend_rows(la), True)
    wb, hb, xb, _ = _figure_inches(lb, _legend_rows(lb), True)
    wa, wb = max(wa, 2.2), max(wb, 2.2)
    gap = 0.4
    fw, body = wa + wb + gap, max(ha, hb)
    extra = max(xa, xb)
    scale = max(_MIN_SCALE, min(1.0, _MAX_INCHES / max(fw, body + extra)))
    fig = plt.figure(figsize=(fw * scale, (body + extra) * scale))
    plt.close(fig)
    axa = fig.add_axes((0, 0, wa / fw, body / (body + extra)))
    axb = fig.add_axes(((wa + gap) / fw, 0, wb / fw, body / (body + extra)))
    _render(la, axa, title=titles[0] if titles else None, scale=scale)
    _render(lb, axb, title=titles[1] if titles and len(titles) > 1 else None, scale=scale)
    return fig


def save_picture(model, path, plan: FusionPlan | None = None, **kw) -> Path:
    """Write a drawing (or an existing Figure) to .png or .svg atomically; SVG output is byte-stable."""
    import matplotlib
    from matplotlib.figure import Figure

    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in ("png", "svg"):
        raise ValueError(f"{path}: save_picture writes .png or .svg, not {path.suffix or 'no suffix'!r}")
    fig = model if isinstance(model, Figure) else draw(model, plan, **kw)
    metadata = {"Date": None} if fmt == "svg" else {"Software": None}
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": "fusionlab", "svg.fonttype": "path"}):
        big = fmt == "png" and max(fig.get_size_inches()) > 12  # a big drawing: one render, faster compression
        fig.savefig(buf, format=fmt, metadata=metadata, bbox_inches=None if big else "tight", dpi=120,
                    facecolor="white", **({"pil_kwargs": {"compress_level": 3}} if big else {}))
    return atomic_write(path, buf.getvalue())


# --------------------------------------------------------------------------------------------------
# netron
# --------------------------------------------------------------------------------------------------

_LIVE: set["NetronView"] = set()
_LIVE_LOCK = threading.Lock()

#: What netron shows on its first visit, and what to do about it (its page has no switch to skip it).
NETRON_NOTICE = ("The first time, netron's page asks you to accept its cookie notice ('This app uses cookies "
                 "to report errors and anonymous usage information'): click Accept once; netron remembers it "
                 "for 30 days. The static pictures (viz.draw) need no server.")


def jupyter_base_url() -> str | None:
    """The base URL of the Jupyter server running this kernel, if it serves jupyter-server-proxy; else None."""

    pid = os.environ.get("JPY_PARENT_PID")  # jupyter_client sets it for the kernels it launches
    if not pid or importlib.util.find_spec("jupyter_server_proxy") is None:
        return None
    try:
        from jupyter_server.serverapp import list_running_servers

        for info in list_running_servers():
            if str(info.get("pid")) == pid:
                return info.get("base_url") or "/"
    except Exception:  # no server files we can read: fall back to the direct address
        return None
    return None


class NetronView:
    """One model served by netron on 127.0.0.1 from a private temporary folder; shows as an iframe."""

    def __init__(self, model, *, port: int | None = None, height: int = 600, filename: str = "model.onnx"):
        import netron
        from netron import server as netron_server


        data = model_bytes(model)
        self.model = model  # what the stored view draws
        self.height = height
        self.dir = Path(tempfile.mkdtemp(prefix="fusionlab-netron-"))
        os.chmod(self.dir, 0o700)
        self.path = self.dir / filename
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        log = logging.getLogger("netron.server")
        log.setLevel(logging.WARNING)  # its "Serving ... at http://localhost:PORT" would be noisy, varying stderr
        root = logging.getLogger()
        guard = None
        if not root.hasHandlers():  # else netron calls logging.basicConfig(INFO) on the caller's root logger
            guard = logging.NullHandler()
            root.addHandler(guard)
        try:
            self.address = netron.serve(str(self.path), browse=False, address=("127.0.0.1", port or 0))
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        finally:
            if guard is not None:
                root.removeHandler(guard)
        self._threads = list(netron_server._threads(self.address))
        # netron keeps the served content on the handler *class*, so a second server would make the first
        # serve the second's model; give each of our servers its own handler subclass.
        for t in self._threads:
            cls = t.server.RequestHandlerClass
            t.server.RequestHandlerClass = type("FusionlabNetronHandler", (cls,), {"content": cls.content})
        self.host, self.port = self.address
        self.url = f"http://{self.host}:{self.port}/"
        base = jupyter_base_url()
        #: the same page through the Jupyter server (None outside one): reachable wherever the lab is
        self.proxy_url = f"{base.rstrip('/')}/proxy/{self.host}:{self.port}/" if base else None
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def alive(self) -> bool:
        """Whether the server is still running."""
        return any(t.alive() for t in self._threads)

    @property
    def src(self) -> str:
        """The address the iframe uses: through the Jupyter server when possible, else 127.0.0.1 directly."""
        return self.proxy_url or self.url

    def iframe(self, width: str | int = "100%", height: int | None = None):
        """An IPython IFrame showing the model (through the Jupyter server when it has jupyter-server-proxy)."""
        from IPython.display import IFrame

        return IFrame(self.src, width=width, height=height or self.height)

    def _repr_html_(self) -> str:
        if not self.alive:
            return "<p>netron view stopped</p>"
        if not self.proxy_url:
            return self.static_html()
        src = html.escape(self.src)
        return (f'<p>netron through this Jupyter server: <a href="{src}" target="_blank" rel="noopener">open in a '
                f'new tab</a>. {html.escape(NETRON_NOTICE)}</p>'
                f'<iframe src="{src}" width="100%" height="{int(self.height)}" frameborder="0" '
                'allowfullscreen></iframe>')

    #: how many of the model's first ops the stored view draws
    STATIC_OPS = 10

    def static_html(self) -> str:
        """Outside a Jupyter server that proxies (a notebook built or viewed without a lab): no frame that cannot
        load, but a picture of the model's first ops and one sentence on how to open the live view."""

        graph = as_graph(self.model, check=False)
        first = [n.name for n in graph.topological_order()][: self.STATIC_OPS]
        fig = draw(graph, nodes=first, title=f"the served model's first {len(first)} of {len(graph)} ops")
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        png = base64.b64encode(buf.getvalue()).decode()
        return (f'<img alt="the first ops of the served model" src="data:image/png;base64,{png}" '
                f'style="max-width: 100%; max-height: {int(self.height)}px">'
                "<p>Run this cell in the lab <code>make lab</code> starts and netron's live view of the whole model "
                f"opens here (in another Jupyter, open {html.escape(self.url)} on the machine running the kernel)."
                "</p>")

    def __repr__(self) -> str:
        return f"NetronView({self.src if self.alive else 'stopped'})"

    def stop(self) -> None:
        """Stop the server and delete the temporary folder."""
        for t in self._threads:
            t.stop()
        for t in self._threads:
            t.join(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def __enter__(self) -> "NetronView":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def netron_view(model, *, port: int | None = None, height: int = 600) -> NetronView:
    """Serve `model` with netron on 127.0.0.1 (a free port unless `port`); display the result for an iframe."""
    return NetronView(model, port=port, height=height)


@atexit.register
def _stop_all_views() -> None:
    with _LIVE_LOCK:
        views = list(_LIVE)
    for v in views:
        try:
            v.stop()
        except Exception:
            pass
