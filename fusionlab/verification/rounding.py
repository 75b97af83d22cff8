"""The original's own rounding, replayed at random: where else its float32 (or float16) evaluation may land.

A part of the original graph (the ops one rewrite replaced) rounds at every op. One evaluation lands at
one point of the set its rounding allows; a rewrite that evaluates the same function in another order
lands at another point of that set. Judged element by element against float64, one of the two can simply
be luckier on an element (a LayerNorm of rows whose mean sits far from 0: both miss float64 by the same
amount in general, and the original happens to be 3x nearer on one element).

`rounded_runs(model, feeds, rng, dtypes)` evaluates `model` once per feeds, each time with every op's float
result multiplied by ``1 + eps·U(-1, 1)``: moved by up to one ulp of the dtype the original computes that
value in. That is the standard model of floating-point arithmetic, fl(x op y) = (x op y)(1 + d) with
|d| <= u = eps/2 (Higham, *Accuracy and Stability of Numerical Algorithms*, ch. 2), with a factor 2 for
library functions (exp, erf) that are not correctly rounded. A reduction rounds more than once, but
onnxruntime accumulates float16 in float32 and float32 in blocks, so its error stays within an ulp or two
of the result (measured: float16 MatMul over K = 1024 terms 0.5 ulp, K = 4096 1.7 ulp); one ulp per op
under-estimates there, which can only make the judge stricter. Ops that only move, select or compare
values (Reshape, Concat, Pad, Relu, Max, MaxPool, ...) round nothing and are left alone.

The spread of these runs around the plain run is the original's rounding envelope per element: a fused
value within twice that of the original's value is one its own evaluation could have produced.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper

from ..graph.names import fresh_name
from .feeds import session as _session

__all__ = ["EXACT_OPS", "rounded_runs"]

EXACT_OPS = frozenset({
    "Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Concat", "Split",
    "Slice", "Gather", "GatherElements", "GatherND", "Pad", "Tile", "DepthToSpace", "SpaceToDepth", "Relu",
    "Abs", "Neg", "Max", "Min", "MaxPool", "GlobalMaxPool", "ReduceMax", "ReduceMin", "Where", "Sign",
    "Floor", "Ceil", "Round", "Clip", "Dropout", "Shape", "Size", "Constant", "ConstantOfShape", "Less",
    "Greater", "Equal", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor", "ArgMax", "ArgMin",
    "TopK", "Hardmax", "Trilu", "EyeLike", "Mod", "ScatterElements", "ScatterND", "Scatter", "OneHot",
    "Compress", "ReverseSequence", "NonZero", "Unique", "IsNaN", "IsInf", "MaxRoiPool", "Optional",
    "OptionalGetElement", "SequenceAt", "SequenceConstruct", "SplitToSequence", "ConcatFromSequence",
})


def rounded_runs(model: onnx.ModelProto, feeds: list[dict], rng, dtypes: dict | None = None) -> list[dict]:
    """{value: array} of the top-level values of `model`, one evaluation per element of `feeds`, each with
    every op's float result moved by up to one ulp (see the module's docstring) of ``dtypes[value]`` (a numpy
    dtype: the one the original computes it in; default: the value's own). Raises what onnxruntime raises
    when the model cannot run so."""
    dtypes = dtypes or {}
    names = [o for n in model.graph.node for o in n.output if o]
    full = onnx.ModelProto()
    full.CopyFrom(model)
    have = {o.name for o in full.graph.output}
    full.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in have)
    sess = _session(full)
    values = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds[0])))
    taken = set(names) | {i.name for i in full.graph.input} | {t.name for t in full.graph.initializer}
    taken |= {n.name for n in full.graph.node}
    out = []
    for run_feeds in feeds:
        m = onnx.ModelProto()
        m.CopyFrom(full)
        nodes, used = [], set(taken)
        for node in m.graph.node:
            nodes.append(node)
            if node.op_type in EXACT_OPS or node.domain not in ("", "ai.onnx", "com.microsoft"):
                continue
            for i, name in enumerate(node.output):
                v = values.get(name)
                if not isinstance(v, np.ndarray) or v.dtype.kind != "f" or not v.size:
                    continue
                eps = float(np.finfo(dtypes.get(name, v.dtype)).eps)
                exact, scale = fresh_name(f"{name}__exact", used), fresh_name(f"{name}__rounding", used)
                node.output[i] = exact
                m.graph.initializer.append(onnx.numpy_helper.from_array(
                    (1 + eps * rng.uniform(-1, 1, v.shape)).astype(v.dtype), scale))
                nodes.append(onnx.helper.make_node("Mul", [exact, scale], [name], name=fresh_name(scale, used)))
        del m.graph.node[:]
        m.graph.node.extend(nodes)
        s = _session(m)
        out.append(dict(zip([o.name for o in s.get_outputs()], s.run(None, run_feeds))))
    return out
