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
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnx.reference.op_run import OpRun
from onnx.reference.ops._op import OpRunUnaryNum
from onnx.reference.ops.op_batch_normalization import BatchNormalization_14, _batchnorm_test_mode

from ..graph import onnx_opset
from ..graph.names import fresh_name

__all__ = ["to_float64", "convert", "run_float64", "Reference", "ReferenceUnavailable"]


class ReferenceUnavailable(RuntimeError):
    """onnx.reference, the fallback where onnxruntime has no float64 kernel, cannot run the model (an op it lacks
    or implements wrongly, e.g. its BatchNormalization-6 returning a tuple): no float64 reference for it."""

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


def _batchnorm64():
    """Inference BatchNormalization for onnx.reference at every opset: its BatchNormalization_6, which also serves
    opsets 7 and 8, takes the training path when `is_test` is absent (it is, from opset 7 on) and returns a tuple
    (seed 26's one 'wrong' was this: no float64 reference for an opset-7 BN, the judge fell back to the original)."""

    class BatchNormalization(OpRun):
        def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None, spatial=None, is_test=None,
                 training_mode=None):
            if training_mode:
                return BatchNormalization_14._run(self, x, scale, bias, mean, var, epsilon=epsilon,
                                                  momentum=momentum, training_mode=training_mode)
            return (_batchnorm_test_mode(x, scale, bias, mean, var, epsilon=1e-5 if epsilon is None else epsilon),)

    return BatchNormalization


def _erf64():
    class Erf(OpRunUnaryNum):
        def _run(self, x):
            return (np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype),)

    return Erf


def _names(g: onnx.GraphProto) -> set[str]:
    return {o for n in g.node for o in n.output} | {i.name for i in g.input} | {t.name for t in g.initializer}


def _clamp_maxpools(original: onnx.ModelProto, wide: onnx.ModelProto, elem_type: int) -> None:
    """After each MaxPool that is float32 in the original, `Max(y, lowest)`: -inf becomes float32's lowest.

    onnxruntime's float32 MaxPool gives float32's lowest (-3.4028235e38) instead of -inf for some windows
    that hold only -inf (or only its own padding): which ones depends on its vectorised code path (measured
    on 2x2 and 3x3 inputs of -inf: whole windows give lowest, some edge columns -inf). Downstream, lowest
    overflows where -inf gives NaN, or the other way round. The reference cannot know which windows the
    engine treats which way, so it takes lowest everywhere: where the engine gave -inf, the reference is
    finite and the judge then accepts any result for those elements (it is lenient there, knowingly).
    """
    try:
        typed = onnx.shape_inference.infer_shapes(original)
    except Exception:  # noqa: BLE001 - no types: leave the copy as it is
        return
    elem = {vi.name: vi.type.tensor_type.elem_type
            for vi in list(typed.graph.input) + list(typed.graph.value_info) + list(typed.graph.output)}
    elem.update({t.name: t.data_type for t in typed.graph.initializer})
    g = wide.graph
    nodes = list(g.node)
    if not any(n.op_type == "MaxPool" and n.domain in ("", "ai.onnx") for n in nodes):
        return
    taken = _names(g)
    lowest = fresh_name("fusionlab_reference_float32_lowest", taken)
    out = []
    for orig_node, n in zip(original.graph.node, nodes):
        out.append(n)
        if (n.op_type != "MaxPool" or n.domain not in ("", "ai.onnx") or not n.input
                or elem.get(orig_node.input[0]) != TensorProto.FLOAT or not n.output[0]):
            continue
        y = n.output[0]
        raw = fresh_name(y + "__before_clamp", taken)
        n.output[0] = raw
        out.append(helper.make_node("Max", [raw, lowest], [y]))
    if len(out) == len(nodes):
        return
    dt = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    g.initializer.append(numpy_helper.from_array(np.array(np.finfo(np.float32).min, dtype=dt), lowest))
    g.ClearField("node")
    g.node.extend(out)


def _explicit_maxpool_pads(wide: onnx.ModelProto, elem_type: int) -> None:
    """Give every MaxPool with unequal begin/end pads an explicit -inf `Pad` (the same function).

    onnx.reference's MaxPool reads asymmetric pads wrongly (pads [0, 0, 1, 1] on a 5x3 input give a 3x3
    output instead of 4x2; onnx 1.19); padding with -inf first and pooling without pads is the definition.
    Only single-output MaxPools are changed (explicit padding would move the indices output).
    """
    g = wide.graph
    opset = onnx_opset(wide)
    taken = _names(g)
    dt = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    out, extra = [], []
    for n in g.node:
        pads = next((list(a.ints) for a in n.attribute if a.name == "pads"), None)
        auto = next((a.s for a in n.attribute if a.name == "auto_pad"), b"NOTSET")
        k = len(pads or []) // 2
        if (n.op_type != "MaxPool" or n.domain not in ("", "ai.onnx") or not pads or auto not in (b"", b"NOTSET")
                or pads[:k] == pads[k:] or len([o for o in n.output if o]) != 1):
            out.append(n)
            continue
        padded = fresh_name(n.input[0] + "__explicit_pads", taken)
        full = [0, 0] + pads[:k] + [0, 0] + pads[k:]
        if opset >= 11:
            p_name, v_name = fresh_name(padded + "_pads", taken), fresh_name(padded + "_value", taken)
            extra += [numpy_helper.from_array(np.array(full, dtype=np.int64), p_name),
                      numpy_helper.from_array(np.array(-np.inf, dtype=dt), v_name)]
            out.append(helper.make_node("Pad", [n.input[0], p_name, v_name], [padded], mode="constant"))
        else:
            out.append(helper.make_node("Pad", [n.input[0]], [padded], mode="constant", pads=full, value=-np.inf))
        n.input[0] = padded
        for a in n.attribute:
            if a.name == "pads":
                del a.ints[:]
                a.ints.extend([0] * (2 * k))
        out.append(n)
    if extra or len(out) != len(g.node):
        g.initializer.extend(extra)
        g.ClearField("node")
        g.node.extend(out)


class Reference:
    """A runnable higher-precision copy of a model (onnxruntime if it can, else onnx.reference).

    `elem_type` is the float type it computes in: float64 by default, TensorProto.FLOAT for a float32
    reference of a half-precision model (better supported by onnxruntime's kernels, and enough there).
    """

    def __init__(self, model: onnx.ModelProto, elem_type: int = TensorProto.DOUBLE):
        self.model = convert(model, elem_type)
        if elem_type != TensorProto.FLOAT:
            _clamp_maxpools(model, self.model, elem_type)
        self.dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
        self.names = [o.name for o in self.model.graph.output]
        self.engine = None
        self._sess = None

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.log_severity_level = 4
        so.intra_op_num_threads = 1
        try:
            self._sess = ort.InferenceSession(self.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            self.engine = "onnxruntime"
        except Exception:  # noqa: BLE001 - no double kernel for some op: fall back to the reference evaluator
            from onnx.reference import ReferenceEvaluator

            _explicit_maxpool_pads(self.model, elem_type)
            try:
                self._sess = ReferenceEvaluator(self.model, new_ops=[_erf64(), _batchnorm64()])
            except Exception as exc:  # noqa: BLE001 - a third-party evaluator's failure, named once here
                raise ReferenceUnavailable(f"onnx.reference cannot load the float64 model: {type(exc).__name__}: "
                                           f"{exc}") from exc
            self.engine = "onnx.reference"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        wide = {k: (v.astype(self.dtype) if v.dtype.kind == "f" else v) for k, v in feeds.items()}
        with np.errstate(all="ignore"):  # onnx.reference computes in numpy: overflow to inf is a result here
            if self.engine == "onnxruntime":
                return dict(zip(self.names, self._sess.run(None, wide)))
            try:
                return dict(zip(self.names, self._sess.run(None, wide)))
            except Exception as exc:  # noqa: BLE001 - a third-party evaluator's failure, named once here
                raise ReferenceUnavailable(f"onnx.reference cannot run the float64 model: {type(exc).__name__}: "
                                           f"{exc}") from exc


def run_float64(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The float64 outputs of `model` on `feeds` (float feeds are widened)."""
    return Reference(model).run(feeds)
