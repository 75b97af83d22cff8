"""The original's own rounding, replayed at random: how far a float32 (or float16) evaluation may land.

A part of the original graph (the ops one rewrite replaced) computes its values with rounding at every op.
One evaluation lands at one point of the set its rounding allows; a rewrite that evaluates the same function
in another order lands at another point of that set. Judged element by element against float64, one of the
two may simply be luckier on an element (a LayerNorm of rows whose mean sits far from 0: both miss float64
by the same amount in general, and the original happens to be 4x nearer on one element).

`rounded_runs(model, feeds, ...)` runs `model` several times, each time with every op's float result moved
by a random amount within what its evaluation in that dtype can be off by (the standard model of floating
point arithmetic, Higham, *Accuracy and Stability of Numerical Algorithms*, ch. 2-4):

- an element-wise op: up to one ulp of its result (correct rounding is half an ulp; one covers a library
  `exp` or `erf` that is not correctly rounded);
- a reduction over n terms (ReduceSum/Mean/SumSquare/L2/LogSumExp, MatMul and Gemm over K, Conv over
  C/group·kH·kW, the pooling averages over the window, Softmax and LayerNormalization over their axis):
  up to sqrt(n) ulps, the probabilistic bound of recursive summation (the worst case is n);
- ops that only move, select or compare values (Reshape, Transpose, Concat, Pad, Relu, Max, MaxPool, ...)
  round nothing and are left alone.

The spread of these runs around the plain run is the original's rounding envelope per element: a fused
value within twice that of the original's value is one its own evaluation could have produced.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx.numpy_helper

from .feeds import session as _session

__all__ = ["EXACT_OPS", "rounded_runs", "terms"]

EXACT_OPS = frozenset({
    "Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Concat", "Split",
    "Slice", "Gather", "GatherElements", "GatherND", "Pad", "Tile", "DepthToSpace", "SpaceToDepth", "Relu",
    "Abs", "Neg", "Max", "Min", "MaxPool", "GlobalMaxPool", "ReduceMax", "ReduceMin", "Where", "Sign",
    "Floor", "Ceil", "Round", "Clip", "Dropout", "Shape", "Size", "Constant", "ConstantOfShape", "Cast",
    "CastLike", "Less", "Greater", "Equal", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "ArgMax",
    "ArgMin", "TopK", "Resize", "Upsample",
})
_REDUCE = {"ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL2", "ReduceL1", "ReduceLogSumExp",
           "ReduceProd", "AveragePool", "GlobalAveragePool", "LpPool", "Softmax", "LogSoftmax",
           "LayerNormalization", "InstanceNormalization", "GroupNormalization", "ReduceLogSum"}


def terms(node: onnx.NodeProto, values: dict) -> int:
    """How many terms one element of `node`'s first output sums (1 for an element-wise op)."""
    def size(name):
        v = values.get(name)
        return int(np.size(v)) if v is not None else 0

    def shape(name):
        v = values.get(name)
        return np.shape(v) if v is not None else ()

    op, out = node.op_type, (node.output[0] if node.output else "")
    if op in ("MatMul", "Gemm", "FusedMatMul") and len(node.input) > 1:
        a = shape(node.input[0])
        trans = any(x.name in ("transA",) and x.i for x in node.attribute)
        return int(a[-2] if trans and len(a) >= 2 else a[-1]) if a else 1
    if op in ("Conv", "ConvTranspose") and len(node.input) > 1:
        w = shape(node.input[1])
        return int(np.prod(w[1:])) if len(w) > 1 else 1
    if op in _REDUCE and size(out):
        n = size(node.input[0]) // size(out) if size(out) else 1
        if op in ("Softmax", "LogSoftmax", "LayerNormalization", "InstanceNormalization", "GroupNormalization"):
            x = shape(node.input[0])
            n = int(x[-1]) if x else 1  # the last axis: the usual one, and a lower bound otherwise
        return max(1, n)
    return 1


def rounded_runs(model: onnx.ModelProto, feeds: list[dict], rng, eps_dtype=None) -> list[dict]:
    """{value: array} of every top-level value of `model`, one evaluation per element of `feeds`, each with
    every op's float result moved within its rounding budget (see the module's docstring); `eps_dtype` sets
    the ulp (default: each value's own dtype). Raises what onnxruntime raises when the model cannot run so."""
    names = [o for n in model.graph.node for o in n.output if o]
    full = onnx.ModelProto()
    full.CopyFrom(model)
    have = {o.name for o in full.graph.output}
    del full.graph.value_info[:]
    for name in names:
        if name not in have:
            full.graph.output.append(onnx.ValueInfoProto(name=name))
    sess = _session(full)
    values = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds[0])))
    out = []
    for run_feeds in feeds:
        m = onnx.ModelProto()
        m.CopyFrom(full)
        nodes = []
        for node in m.graph.node:
            nodes.append(node)
            if node.op_type in EXACT_OPS or node.domain not in ("", "ai.onnx", "com.microsoft"):
                continue
            for i, name in enumerate(node.output):
                v = values.get(name)
                if v is None or v.dtype.kind != "f" or not v.size:
                    continue
                ulps = math.sqrt(terms(node, values)) if i == 0 else 1.0
                eps = float(np.finfo(eps_dtype or v.dtype).eps)
                scale = (1 + ulps * eps * rng.uniform(-1, 1, v.shape)).astype(v.dtype)
                exact = f"{name}__exact"
                node.output[i] = exact
                m.graph.initializer.append(onnx.numpy_helper.from_array(scale, f"{name}__rounding"))
                nodes.append(onnx.helper.make_node("Mul", [exact, f"{name}__rounding"], [name],
                                                   name=f"{name}__rounding"))
        del m.graph.node[:]
        m.graph.node.extend(nodes)
        s = _session(m)
        out.append(dict(zip([o.name for o in s.get_outputs()], s.run(None, run_feeds))))
    return out
