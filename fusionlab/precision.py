"""The higher-precision reference: the original model converted to float64 (or float32) and run.

Used by the fuzzer's oracle (float64) and by `fusionlab.verify` (float32, for fp16/bf16 models) to tell a
rewrite that only rounds differently from one that computes something else.

`to_float64` rewrites every floating-point tensor type in the model to double: initializers, `Constant`
values (including ``value_float(s)``), `Cast`/`EyeLike`/`ConstantOfShape`/random-op target types, graph
inputs and outputs (value_info is dropped and re-inferred by the runtime). `run_float64` runs it with
onnxruntime when onnxruntime has double kernels for every op, and otherwise with `onnx.reference` (whose
Erf is replaced by a float64 one: the stock implementation rounds through float32).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["to_float64", "convert", "run_float64", "Reference"]

_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
_DTYPE_ATTRS = {"Cast": "to", "EyeLike": "dtype", "RandomNormal": "dtype", "RandomUniform": "dtype",
                "RandomNormalLike": "dtype", "RandomUniformLike": "dtype", "Bernoulli": "dtype"}


_TARGET = [TensorProto.DOUBLE]  # the float type `convert` is writing (set for the duration of one call)


def _tensor64(t: onnx.TensorProto) -> onnx.TensorProto:
    if t.data_type not in _FLOATS or t.data_type == _TARGET[0]:
        return t
    dt = onnx.helper.tensor_dtype_to_np_dtype(_TARGET[0])
    return numpy_helper.from_array(numpy_helper.to_array(t).astype(dt), t.name)


def _type64(tp: onnx.TypeProto) -> None:
    if tp.HasField("tensor_type") and tp.tensor_type.elem_type in _FLOATS:
        tp.tensor_type.elem_type = _TARGET[0]


def _nodes64(nodes) -> None:
    for node in nodes:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                a.t.CopyFrom(_tensor64(a.t))
            elif a.type == onnx.AttributeProto.GRAPH:
                _graph64(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    _graph64(g)
            elif node.op_type in _DTYPE_ATTRS and a.name == _DTYPE_ATTRS[node.op_type] and a.i in _FLOATS:
                a.i = _TARGET[0]
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for a in list(node.attribute):
                if a.name in ("value_float", "value_floats"):
                    vals = [a.f] if a.name == "value_float" else list(a.floats)
                    dt = onnx.helper.tensor_dtype_to_np_dtype(_TARGET[0])
                    arr = np.array(vals[0] if a.name == "value_float" else vals, dtype=dt)
                    node.attribute.remove(a)
                    node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(arr)))


def _graph64(g: onnx.GraphProto) -> None:
    inits = [_tensor64(t) for t in g.initializer]
    g.ClearField("initializer")
    g.initializer.extend(inits)
    for vi in list(g.input) + list(g.output):
        _type64(vi.type)
    g.ClearField("value_info")
    _nodes64(g.node)


def convert(model: onnx.ModelProto, elem_type: int) -> onnx.ModelProto:
    """A copy of `model` with every floating-point tensor type changed to `elem_type`."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    _TARGET[0] = elem_type
    try:
        _graph64(m.graph)
        for f in m.functions:
            _nodes64(f.node)
            if "value_info" in f.DESCRIPTOR.fields_by_name:
                f.ClearField("value_info")
    finally:
        _TARGET[0] = TensorProto.DOUBLE
    return m


def to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` computing in float64 throughout."""
    return convert(model, TensorProto.DOUBLE)


def _erf64():
    from onnx.reference.ops._op import OpRunUnaryNum

    class Erf(OpRunUnaryNum):
        def _run(self, x):
            return (np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype),)

    return Erf


class Reference:
    """A runnable higher-precision copy of a model (onnxruntime if it can, else onnx.reference).

    `elem_type` is the float type it computes in: float64 by default, TensorProto.FLOAT for a float32
    reference of a half-precision model (better supported by onnxruntime's kernels, and enough there).
    """

    def __init__(self, model: onnx.ModelProto, elem_type: int = TensorProto.DOUBLE):
        self.model = convert(model, elem_type)
        self.dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
        self.names = [o.name for o in self.model.graph.output]
        self.engine = None
        self._sess = None
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.log_severity_level = 4
        so.intra_op_num_threads = 1
        try:
            self._sess = ort.InferenceSession(self.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            self.engine = "onnxruntime"
        except Exception:  # noqa: BLE001 - no double kernel for some op: fall back to the reference evaluator
            from onnx.reference import ReferenceEvaluator

            self._sess = ReferenceEvaluator(self.model, new_ops=[_erf64()])
            self.engine = "onnx.reference"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        wide = {k: (v.astype(self.dtype) if v.dtype.kind == "f" else v) for k, v in feeds.items()}
        return dict(zip(self.names, self._sess.run(None, wide)))


def run_float64(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The float64 outputs of `model` on `feeds` (float feeds are widened)."""
    return Reference(model).run(feeds)
