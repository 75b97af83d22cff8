"""Node identity and fresh names: every node named, unique names for what a rewrite adds."""

from __future__ import annotations

import onnx_ir as ir


__all__ = ["Names", "fresh_name", "name_nodes"]


# --------------------------------------------------------------------------------------------------
# node identity and fresh names
# --------------------------------------------------------------------------------------------------

def name_nodes(body: ir.Graph) -> list[str]:
    """Give every unnamed or duplicate-named node of `body` a unique name `<op>_<position>`; returns the new names.

    This is the one identity of a node everywhere in fusionlab (plans, cost, pictures, widgets, custom ops).
    The first holder of a repeated name keeps it; deterministic: the same model gets the same names.
    """
    nodes = list(body)
    counts: dict[str, int] = {}
    for n in nodes:
        if n.name:
            counts[n.name] = counts.get(n.name, 0) + 1
    used = set(counts)
    kept: set[str] = set()
    made: list[str] = []
    for i, node in enumerate(nodes):
        if node.name and (counts[node.name] == 1 or node.name not in kept):
            kept.add(node.name)
            continue
        base = f"{node.op_type}_{i}"
        name, k = base, 0
        while name in used:
            k += 1
            name = f"{base}_{k}"
        node.name = name
        used.add(name)
        made.append(name)
    return made


def _all_value_names(body: ir.Graph) -> set[str]:
    names = {v.name for v in body.inputs if v.name} | set(body.initializers)
    for node in ir.traversal.RecursiveGraphIterator(body):
        names.update(v.name for v in node.outputs if v.name)
        names.update(v.name for v in node.inputs if v is not None and v.name)
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                names.update(v.name for v in attr.value.inputs if v.name)
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub in attr.value:
                    names.update(v.name for v in sub.inputs if v.name)
    return names


def fresh_name(base: str, taken: set[str]) -> str:
    """`base`, or `base_1`, `base_2`, ... : the first that `taken` does not hold (then it is taken)."""
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


class Names:
    """Every name a graph uses, and fresh ones that clash with none of them (one service for every pass).

    Node names and tensor (value) names are separate namespaces in ONNX; a fresh value name is checked
    against graph inputs, initializers and every node output, subgraphs included, not only initializers.
    """

    def __init__(self, model: ir.Model, retired: set[str] | None = None):
        graph = model.graph
        self._nodes = {n.name for n in ir.traversal.RecursiveGraphIterator(graph) if n.name}
        if retired is not None:  # node names used before (removed by a rewrite): never handed out again
            retired.update(self._nodes)
            self._nodes = retired
        self._values = _all_value_names(graph)
        self._functions = {f.name for f in model.functions.values()}

    _fresh = staticmethod(fresh_name)

    def node(self, base: str) -> str:
        """A node name no node uses (base, else base_1, base_2, ...)."""
        return self._fresh(base or "node", self._nodes)

    def value(self, base: str) -> str:
        """A tensor name no input, initializer or node output uses."""
        return self._fresh(base or "value", self._values)

    def function(self, base: str) -> str:
        """A model-local function name not yet taken: base_0, base_1, ..."""
        k = 0
        while f"{base}_{k}" in self._functions:
            k += 1
        self._functions.add(f"{base}_{k}")
        return f"{base}_{k}"
