"""Graphviz DOT text of a graph and its fusion groups (plain text: tests and nbval compare it)."""

from __future__ import annotations

import re

from ..plan import FusionPlan
from .scene import Item, group_colors, scene_of

__all__ = ["to_dot"]


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
    sc = scene_of(model, plan, nodes, hops)
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
    colors = group_colors([g for g, _ in sc.groups])
    lines = [f"digraph {_dot_str(title or sc.name)} {{"]
    graph_attrs = [f"rankdir={direction}", 'fontname="Helvetica"', "newrank=true"]
    if title:
        graph_attrs += [f"label={_dot_str(title)}", "labelloc=t"]
    lines.append(f"  graph [{', '.join(graph_attrs)}];")
    lines.append('  node [shape=box, style="rounded,filled", fillcolor="#ffffff", fontname="Helvetica", fontsize=10];')
    lines.append('  edge [color="#555555", fontname="Helvetica", fontsize=8];')

    def node_line(it: Item, indent: str) -> str:
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
