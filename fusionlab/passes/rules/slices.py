"""Slices that tile an axis: ``torch.chunk`` as TorchScript exports it -> one Split [slice_split].

TorchScript writes ``x.chunk(2, dim)`` as two Slices of x with starts and ends computed from ``Shape(x)``
(constants once the shape arithmetic is folded); the dynamo exporter writes a Split. Slices of one tensor on
one axis, step 1, whose [start, end) ranges tile the axis exactly (the dimension known), become one Split
with those sizes. Reading x once instead of once per slice is what onnxruntime's own graph does too.

Not on shape arithmetic: the dynamo exporter slices a shape vector into its leading dims, one dim and the last
(``Shape(x)[:-2]``, ``[-2:-1]``, ``[-1:]``, for LLaMA's ``repeat_kv``), and those Slices tile it too. Slices of an
integer vector are host-side shape computations, no kernel to save, and onnx's shape inference propagates
values through Slice but not through Split: the rewrite left every dimension computed from them unknown
(``[B, 1, S, T]`` became ``[unk, 1, unk, unk]``) and, with the exporter's declared shapes, the model
contradictory (issue 19's LLaMA export failed the full checker). They are refused with that reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from ..engine import Match, Refused, Rule, consumers, is_op

__all__ = ["SliceSplit"]


@dataclass(frozen=True, eq=False)
class SplitData:
    """One Split of `x` along `axis` into pieces of `sizes`."""

    x: ir.Value
    axis: int
    sizes: tuple[int, ...]


def _range(cx, s: ir.Node, dims: tuple) -> tuple[int, int | None, int | None] | None:
    """(axis, start, end) of a one-axis, step-1 Slice with constant parameters, clamped to the dimension
    (start and end None when the axis length is not known)."""
    if len(s.inputs) < 3 or any(v is None for v in s.inputs[:3]):
        return None
    ins = list(s.inputs[1:5]) + [None] * (5 - len(s.inputs))
    vals = [cx.constant(v) if v is not None else None for v in ins]
    if vals[0] is None or vals[1] is None or any(v is not None and c is None for v, c in zip(ins, vals)):
        return None
    starts, ends = vals[0].reshape(-1), vals[1].reshape(-1)
    axes = vals[2].reshape(-1) if vals[2] is not None else np.arange(len(starts))
    steps = vals[3].reshape(-1) if vals[3] is not None else np.ones(len(starts))
    if len(starts) != 1 or len(ends) != 1 or len(axes) != 1 or int(steps[0]) != 1:
        return None
    axis = int(axes[0]) % len(dims)
    d = dims[axis]
    if not isinstance(d, int):
        return axis, None, None
    start, end = (int(np.clip(v + d if v < 0 else v, 0, d)) for v in (int(starts[0]), int(ends[0])))
    return axis, start, end


class SliceSplit(Rule):
    """Slices of one tensor whose ranges tile an axis -> one Split (anchored on the slice that starts at 0)."""

    names = ("slice_split",)
    anchors = ("Slice",)
    fixed = True
    same_shape = False

    def match(self, cx, first: ir.Node) -> Match | None:
        x = first.inputs[0] if first.inputs else None
        dims = cx.shape(x) if x is not None else None
        if dims is None or cx.graph.opset < 13:
            return None
        found = {}
        for s in consumers(x):
            r = _range(cx, s, dims) if is_op(s, "Slice") and s.inputs[0] is x and cx.free(s) else None
            if r is not None and (r[1] is None or r[1] < r[2]):
                found[s] = r
        if first in found and found[first][1] is None:
            if sum(r[0] == found[first][0] for r in found.values()) >= 2:
                raise Refused(f"the length of axis {found[first][0]} of {x.name} is not known")
            return None
        if found.get(first, (None, None))[1] != 0:
            return None
        axis = found[first][0]
        parts = [(r[1], r[2], s) for s, r in found.items() if r[0] == axis]
        parts.sort(key=lambda p: p[:2])  # stable: Slices of one range keep graph order (nodes do not compare)
        chosen, at = [], 0
        for start, end, s in parts:
            if start == at:
                chosen.append((start, end, s))
                at = end
        if len(chosen) < 2 or at != dims[axis]:
            if len(parts) >= 2:
                raise Refused(f"the Slices' ranges {[(a, b) for a, b, _ in parts]} do not tile axis {axis} "
                              f"of length {dims[axis]}")
            return None
        nodes = [s for _, _, s in chosen]
        dt = cx.dtype(x)
        if dt is not None and dt.kind in "iu" and len(dims) == 1:
            raise Refused(f"{x.name} is a shape vector: Slices of it are shape arithmetic, which shape inference "
                          "follows through Slice and not through Split")
        return Match("slice_split", first, nodes, f"{len(nodes)} Slices tile axis {axis} of {x.name}", "Split",
                     outputs=[s.outputs[0] for s in nodes],
                     data=SplitData(x, axis, tuple(end - start for start, end, _ in chosen)))

    def rewrite(self, cx, m: Match) -> list[ir.Node]:
        d: SplitData = m.data
        sizes = cx.initializer(f"{m.anchor.name}_split", np.array(d.sizes, np.int64))
        return [cx.node("Split", [d.x, sizes], {"axis": d.axis}, base=f"{m.anchor.name}_split",
                        num_outputs=len(d.sizes))]

    def outputs(self, m: Match, new_nodes: list[ir.Node]) -> list[tuple[ir.Value, ir.Value]]:
        return list(zip(m.handed_on(), new_nodes[0].outputs))
