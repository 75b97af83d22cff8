"""The values of shape arithmetic, evaluated symbolically: each element an int, a dim name or unknown.

`Reshape(x, Concat(Shape(x)[0], Shape(x)[1], 4, 32))` computes its target at run time; its value is known
before anything runs up to the dynamic dims, which keep their names from shape inference
(``["batch", "sequence", 4, 32]``). Folding uses this to turn static parts into constants, and rules use it to
read the layout a Reshape produces.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..graph import Graph
from ..shapes import ShapeInfo

__all__ = ["ShapeValues", "Value"]

#: (elements, shape): elements an int, a dim name (str) or None; shape () for a scalar, (n,) for a vector
Value = tuple[list, tuple]
_INT = (np.dtype(np.int64), np.dtype(np.int32))
_INT_MAX = 2**62


class ShapeValues:
    """Memoised symbolic evaluation of small int64 shape vectors in one graph."""

    def __init__(self, graph: Graph, info: ShapeInfo):
        self.graph, self.info = graph, info
        self._memo: dict[int, Value | None] = {}

    def of(self, v: ir.Value | None, depth: int = 0) -> Value | None:
        """The symbolic value of `v`, or None when it is not a small shape vector or scalar."""
        if v is None or depth > 64:
            return None
        if id(v) in self._memo:
            return self._memo[id(v)]
        c = self.graph.constant(v)
        if c is not None:
            got = ([int(x) for x in c.reshape(-1)], tuple(c.shape)) if c.dtype in _INT and c.ndim <= 1 \
                and c.size <= 64 else None
        else:
            node = v.producer()
            got = self._node(node, depth) if node is not None and node.domain in ("", "ai.onnx") \
                and len(node.outputs) == 1 else None
        self._memo[id(v)] = got
        return got

    def _node(self, node: ir.Node, depth: int) -> Value | None:
        op, attrs = node.op_type, node.attributes
        if op == "Shape":
            return self._shape(node)
        ins = [self.of(v, depth + 1) for v in node.inputs]
        if not ins or ins[0] is None:
            return None
        elems, shape = ins[0]
        if op == "Identity" or (op == "Cast" and int(attrs["to"].value) in (6, 7)):
            return elems, shape
        if op == "Unsqueeze" and shape == ():
            return elems, (1,)
        if op == "Squeeze" and shape == (1,):
            return elems, ()
        if op == "Concat" and all(i is not None and len(i[1]) == 1 for i in ins) and int(attrs["axis"].value) in (0, -1):
            out = [d for i in ins for d in i[0]]
            return out, (len(out),)
        axis = int(attrs["axis"].value) if "axis" in attrs else 0
        if op == "Gather" and len(ins) == 2 and ins[1] is not None and axis == 0:
            return _gather(ins[0], ins[1])
        if op == "Slice" and len(shape) == 1:
            return _slice(elems, ins[1:])
        return None

    def _shape(self, node: ir.Node) -> Value | None:
        s = self.info.shape(node.inputs[0])
        if s is None:
            return None
        dims = [d if isinstance(d, (int, str)) else None for d in s]  # a dim name: equal wherever it appears
        attrs = node.attributes
        start = int(attrs["start"].value) if "start" in attrs else 0
        end = int(attrs["end"].value) if "end" in attrs else len(dims)
        dims = dims[slice(start, end)]
        return dims, (len(dims),)


def _gather(data: Value, idx: Value) -> Value | None:
    (elems, shape), (ids, ishape) = data, idx
    n = len(elems)
    if len(shape) != 1 or any(not isinstance(k, int) or not -n <= k < n for k in ids):
        return None
    return [elems[k if k >= 0 else k + n] for k in ids], ishape


def _slice(elems: list, params: list) -> Value | None:
    """Slice of a 1-D vector with constant starts/ends (axes 0, steps 1); ends past the end are clamped."""
    starts, ends = (params + [None, None])[:2]
    axes = params[2] if len(params) > 2 else None
    steps = params[3] if len(params) > 3 else None
    if starts is None or ends is None or (axes is not None and axes[0] not in ([0], [-1])) or \
            (steps is not None and steps[0] != [1]):
        return None
    s, e = starts[0], ends[0]
    if len(s) != 1 or len(e) != 1 or not isinstance(s[0], int) or not isinstance(e[0], int):
        return None
    n = len(elems)
    lo = max(-n, min(s[0], n)) if abs(s[0]) < _INT_MAX else (0 if s[0] < 0 else n)
    hi = max(-n, min(e[0], n)) if abs(e[0]) < _INT_MAX else (0 if e[0] < 0 else n)
    out = elems[slice(lo, hi)]
    return out, (len(out),)
