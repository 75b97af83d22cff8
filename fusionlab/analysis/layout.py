"""Where the elements of a tensor come from after a chain of Reshape and Transpose: a small layout prover.

Exporters move attention heads around in many ways: `Reshape [B,S,H] -> [B,S,N,D]` then `Transpose`,
or (dynamo's K^T) `Transpose -> Reshape [B*N,S,D] -> Transpose [0,2,1] -> Reshape [B,N,D,S]`. Instead of a
pattern per arrangement, each axis is tracked as a tuple of *atoms* (pieces of the base tensor's axes, with
sizes that are ints or dim names); a Reshape regroups atoms (splitting an int atom when a target dim divides
it) and a Transpose permutes axes. Two chains that end in the same layout compute the same tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from ..graph import attr, consumers, is_op, sole_consumer
from .shape_values import ShapeValues

__all__ = ["Atom", "Layout", "trace_back", "trace_forward", "base_layout", "size_of", "names", "shape_branch", "step"]


@dataclass(frozen=True)
class Atom:
    name: str
    size: int | str


Layout = list  # list[tuple[Atom, ...]]: one tuple of atoms per axis


def size_of(atoms) -> tuple[int, tuple]:
    """(int factor, sorted dim names): the size of a group of atoms, comparable whatever the grouping."""
    k, names = 1, []
    for a in atoms:
        if isinstance(a.size, int):
            k *= a.size
        else:
            names.append(a.size)
    return k, tuple(sorted(names))


def names(layout: Layout) -> list[tuple[str, ...]]:
    """Per axis, the names of the atoms it holds, unit atoms left out (a size-1 axis holds none)."""
    return [tuple(a.name for a in axis if a.size != 1) for axis in layout]


def base_layout(shape: tuple, tag: str) -> Layout | None:
    if shape is None or any(d is None for d in shape):
        return None
    return [(Atom(f"{tag}{i}", d),) for i, d in enumerate(shape)]


def _target_sizes(layout: Layout, target: list, allowzero: bool) -> list | None:
    """Each target dim as a size (int factor, names), resolving 0 (copy) and -1 (the rest)."""
    total = size_of([a for axis in layout for a in axis])
    sizes, infer = [], None
    for j, t in enumerate(target):
        if t is None:
            return None
        if t == 0 and not allowzero:
            if j >= len(layout):
                return None
            sizes.append(size_of(layout[j]))
        elif t == -1:
            if infer is not None:
                return None
            infer = j
            sizes.append(None)
        elif isinstance(t, int):
            sizes.append((t, ()))
        else:
            sizes.append((1, (t,)))
    if infer is not None:
        k, names = 1, []
        for s in sizes:
            if s is not None:
                k *= s[0]
                names += list(s[1])
        rest = list(total[1])
        for n in names:
            if n not in rest:
                return None
            rest.remove(n)
        if k == 0 or total[0] % k:
            return None
        sizes[infer] = (total[0] // k, tuple(sorted(rest)))
    return sizes


def reshape(layout: Layout, target: list, allowzero: bool = False) -> Layout | None:
    """The layout after Reshape to `target` (ints, dim names, 0, -1), or None if atoms cannot be regrouped."""
    sizes = _target_sizes(layout, target, allowzero)
    if sizes is None:
        return None
    atoms = [a for axis in layout for a in axis if a.size != 1]  # unit atoms hold no data: dropped
    out, i = [], 0
    for want in sizes:
        group: list[Atom] = []
        while size_of(group) != want:
            if i >= len(atoms):
                return None
            a, (k, names) = atoms[i], size_of(group)
            missing = list(want[1])
            for n in names:
                if n not in missing:
                    return None
                missing.remove(n)
            if isinstance(a.size, str):
                if a.size not in missing:
                    return None
                group.append(a)
                i += 1
                continue
            if want[0] % k:
                return None
            need = want[0] // k
            if need % a.size == 0:  # the whole atom fits
                group.append(a)
                i += 1
            elif a.size % need == 0:  # split it: the first part completes this dim
                group.append(Atom(f"{a.name}.0", need))
                atoms[i] = Atom(f"{a.name}.1", a.size // need)
            else:
                return None
        out.append(tuple(group))
    return out if i == len(atoms) else None


def step(values: ShapeValues, node: ir.Node, layout: Layout) -> Layout | None:
    if node.op_type == "Transpose":
        perm = attr(node, "perm", None)
        perm = list(perm) if perm is not None else list(reversed(range(len(layout))))
        return [layout[p] for p in perm] if sorted(perm) == list(range(len(layout))) else None
    target = values.of(node.inputs[1]) if len(node.inputs) > 1 else None
    if target is None or len(target[1]) != 1:
        return None
    return reshape(layout, target[0], bool(attr(node, "allowzero", 0)))


def shape_branch(value: ir.Value, besides=None, depth: int = 4) -> list[ir.Node] | None:
    """The readers of `value` other than `besides` when they only read its shape, else None.

    A reader reads only the shape when it is a Shape node, or a Reshape/Transpose whose own readers only read
    the shape (T5's layer 0 takes `key_states.shape` through a Transpose of the head view that nothing else
    reads). `besides`: a node, or a collection of nodes, whose reads are not asked about. Returned in reading
    order: each view, then the nodes after it.
    """
    if value.is_graph_output():
        return None
    skip = {id(besides)} if isinstance(besides, ir.Node) else {id(n) for n in besides or ()}
    out: list[ir.Node] = []
    for n in consumers(value):
        if id(n) in skip:
            continue
        if is_op(n, "Shape"):
            out.append(n)
        elif is_op(n, "Reshape", "Transpose") and n.inputs[0] is value and depth > 0 and \
                all(u.node is not n or u.idx == 0 for u in value.uses()):
            more = shape_branch(n.outputs[0], None, depth - 1)
            if more is None or not more:
                return None
            out += [n] + more
        else:
            return None
    return out


def _read_by(value: ir.Value, node: ir.Node) -> bool:
    """`node` is the only reader of `value` apart from readers of its shape alone (`shape_branch`)."""
    return shape_branch(value, node) is not None


def trace_back(cx, values: ShapeValues, v: ir.Value, limit: int = 8, reader: ir.Node | None = None):
    """(base value, layout of `v` in the base's atoms, view nodes in order) through single-reader views.

    A view that something else reads only the shape of (`shape_branch`) is traced through even when no rule may
    take it: a rule keeps such a view for its Shape and reads the base itself. `reader`: the node that reads `v`
    (LLaMA's repeat_kv Unsqueeze, whose Expand target is the Shape of the same view), so that the first view is
    traced the same way while planning, when it is free, and at `recheck`, when as a kept view it is not a
    member."""
    chain, kept = [], False
    while len(chain) < limit:
        p = v.producer()
        if not is_op(p, "Reshape", "Transpose") or (chain and not _read_by(p.outputs[0], chain[0])):
            break
        if not cx.free(p):  # a view kept for a shape, and the views before it (kept with it)
            if not (kept or (chain and shape_branch(p.outputs[0], chain[0]))
                    or (not chain and reader is not None and shape_branch(p.outputs[0], reader))):
                break
            kept = True
        chain.insert(0, p)
        v = p.inputs[0]
    layout = base_layout(cx.shape(v), "x")
    for node in chain:
        layout = step(values, node, layout) if layout is not None else None
    return v, layout, chain


def trace_forward(cx, values: ShapeValues, v: ir.Value, layout: Layout, limit: int = 8):
    """[(value, layout, nodes so far)] after each single-consumer Reshape/Transpose following `v`."""
    out, chain = [], []
    while len(chain) < limit:
        n = sole_consumer(v)
        if not is_op(n, "Reshape", "Transpose") or not cx.free(n) or n.inputs[0] is not v:
            break
        layout = step(values, n, layout)
        if layout is None:
            break
        chain.append(n)
        v = n.outputs[0]
        out.append((v, layout, list(chain)))
    return out
