"""Lowering fusion groups to ONNX model-local functions.

A group that onnxruntime has no fused kernel for can still be *shown* as one node: its member nodes
move into a model-local function (domain ``fusionlab.fused``, named from the member ops, e.g.
``ConvBnRelu_0``) and the graph calls that function once. Netron draws one node you can expand, and
onnxruntime inlines the function when it loads the model, so the model still runs and computes the same.

Only groups whose members form a convex set are wrapped (no path leaves the group and comes back:
wrapping such a group would create a cycle); others are left alone with a note in the plan.
"""

from __future__ import annotations

from typing import Iterable

import onnx_ir as ir

from ..graph import Graph
from ..plan import FusionGroup, FusionPlan
from .engine import ensure_sorted

__all__ = ["DOMAIN", "to_functions", "function_name"]

#: the domain of the functions `to_functions` writes
DOMAIN = "fusionlab.fused"

_SHORT = {
    "BatchNormalization": "Bn", "LayerNormalization": "LayerNorm", "SkipLayerNormalization": "SkipLayerNorm",
    "ConvTranspose": "ConvT", "InstanceNormalization": "InstanceNorm", "ReduceMean": "Mean",
}


def function_name(op_types: Iterable[str], taken: Iterable[str] = ()) -> str:
    """A readable unique function name from member op types, e.g. ['Conv', 'BatchNormalization', 'Relu'] -> 'ConvBnRelu_0'."""
    parts: list[str] = []
    for op in op_types:
        short = _SHORT.get(op.split(":")[-1], op.split(":")[-1])
        if not parts or parts[-1] != short:
            parts.append(short)
    base = "".join(parts)[:60] or "Fused"
    taken = set(taken)
    k = 0
    while f"{base}_{k}" in taken:
        k += 1
    return f"{base}_{k}"


def _convex(members: list[ir.Node], outputs: list[ir.Value]) -> bool:
    """No path from a group output through outside nodes back into the group."""
    inside = set(map(id, members))
    stack = [u.node for v in outputs for u in v.uses() if id(u.node) not in inside]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for out in node.outputs:
            for use in out.uses():
                if id(use.node) in inside:
                    return False
                stack.append(use.node)
    return True


def _has_subgraph(node: ir.Node) -> bool:
    return any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values())


def _wrap(graph: Graph, members: list[ir.Node], name: str, domain: str, names) -> ir.Node | None:
    g = graph.graph
    inside = set(map(id, members))
    order = [n for n in g if id(n) in inside]
    if len(order) != len(members) or any(_has_subgraph(n) for n in order):
        return None
    produced = {id(v) for n in order for v in n.outputs}
    inputs: list[ir.Value] = []
    for n in order:
        for v in n.inputs:
            if v is not None and id(v) not in produced and all(v is not w for w in inputs):
                inputs.append(v)
    outputs = [v for n in order for v in n.outputs
               if v.is_graph_output() or any(id(u.node) not in inside for u in v.uses())]
    if not outputs or not _convex(order, outputs):
        return None
    # the function body: copies of the members over fresh values
    mapping: dict[int, ir.Value] = {}
    f_inputs = []
    for i, v in enumerate(inputs):
        fv = ir.Value(name=v.name or f"in{i}", type=v.type, shape=v.shape)
        mapping[id(v)] = fv
        f_inputs.append(fv)
    body = []
    domains: dict[str, int] = {"": graph.opset}
    for n in order:
        new = ir.Node(n.domain, n.op_type, [mapping[id(v)] if v is not None else None for v in n.inputs],
                      attributes=list(n.attributes.values()), num_outputs=len(n.outputs), name=n.name,
                      overload=n.overload)
        for old, nv in zip(n.outputs, new.outputs):
            nv.name, nv.type, nv.shape = old.name, old.type, old.shape
            mapping[id(old)] = nv
        if n.domain not in ("", "ai.onnx"):
            domains[n.domain] = g.opset_imports.get(n.domain, 1)
        body.append(new)
    f_graph = ir.Graph(f_inputs, [mapping[id(v)] for v in outputs], nodes=body, opset_imports=domains, name=name)
    function = ir.Function(domain, name, graph=f_graph, attributes=[])
    graph.model.functions[function.identifier()] = function
    g.opset_imports.setdefault(domain, 1)
    # the call, then every use of a member output reads the call's output (names kept)
    call = ir.Node(domain, name, inputs, num_outputs=len(outputs), name=names.node(f"{name}_call"))
    g.insert_before(order[-1], call)
    for old, new in zip(outputs, call.outputs):
        keep = old.name
        new.type, new.shape = old.type, old.shape
        old.name = names.value(f"{keep}__in_{name}")
        old.replace_all_uses_with(new, replace_graph_outputs=True)
        new.name = keep
    g.remove(order, safe=True)
    ensure_sorted(g)
    return call


def to_functions(graph: Graph, plan: FusionPlan, groups: Iterable[str | FusionGroup] | None = None, *,
                 domain: str = DOMAIN, members: dict[str, list[str]] | None = None) -> list[str]:
    """Replace each chosen group's nodes by one call to a model-local function; returns the function names.

    A group's nodes are `members[group.id]` when given (the nodes a pass's rewrite left, e.g. folded BN, kept
    the activation), else `group.nodes`. Groups that cannot be wrapped (nodes missing, not convex, subgraphs
    inside) are left alone and noted in `plan.notes`.
    """
    chosen = list(plan) if groups is None else [plan[g] if isinstance(g, str) else g for g in groups]
    by_name = {n.name: n for n in graph.graph if n.name}
    names = graph.names()
    made: list[str] = []
    for group in chosen:
        wanted = (members or {}).get(group.id) or group.nodes
        found = [by_name[n] for n in wanted if n in by_name]
        if len(found) != len(wanted) or not found:
            plan.notes.append(f"lower: group {group.id}: nodes not found; not wrapped")
            continue
        name = names.function(function_name(group.op_types or [m.op_type for m in found]).rsplit("_", 1)[0])
        call = _wrap(graph, found, name, domain, names)
        if call is None:
            plan.notes.append(f"lower: group {group.id}: not a convex single-graph set; not wrapped")
            continue
        made.append(name)
        group.lowered_to = f"{domain}:{name}"
        group.extra["function"] = name
        for m in found:
            by_name.pop(m.name, None)
        by_name[call.name] = call
        graph.origin[call.name] = tuple(c for m in found for c in graph.covers(m.name))
        graph.made_by[call.name] = group.id
    return made
