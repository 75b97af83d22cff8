"""Probes that say what a failure depends on: change one property of the model, see if the failure goes.

Each probe rewrites a (shrunk) failing model in one respect that a class of bugs depends on:

- ``name every node``: unnamed nodes get unique names (bugs that look nodes up by name);
- ``neutral names``: tensor and node names that look like names a pass makes up (``*_W_fused``,
  ``horizontal0*``, ``*__h``, ``Conv_3``...) are renamed (fresh-name collisions);
- ``scalar constants``: float constants holding one value in a tensor of rank >= 1 become rank 0
  (a size-1 constant of higher rank taken for a scalar);
- ``exact constants``: float scalars within 1% of a GELU/LayerNorm constant (0.5, 1, 2, 3, sqrt 2,
  1/sqrt 2, 0.044715, sqrt(2/pi)) are set to it exactly (near-miss constants matched loosely);
- ``plain initializers``: overridable initializers stop being graph inputs;
- ``float32``: a float16 or float64 model is converted to float32 (a precision problem).

`diagnose` returns the probes after which the model is still valid but no longer fails: the failure
depends on that property. An empty list means no probe explains it (or the model does not fail so).
"""

from __future__ import annotations

import math
import re

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ..verification.judge import Case
from ..verification.precision import convert
from .generator import validate
from .names import rename_tensor, tensor_names
from .oracle import judge
from .shrink import _finish

__all__ = ["PROBES", "diagnose"]

_EXACT = (0.5, 1.0, 2.0, 3.0, math.sqrt(2), 1 / math.sqrt(2), 0.044715, math.sqrt(2 / math.pi))
_PASSLIKE_TENSOR = re.compile(r"(_W_fused|_B_fused|_C_fused|_B_zero|^horizontal\d|__|#rc)")
_PASSLIKE_NODE = re.compile(r"(^[A-Z][A-Za-z]*_\d+$|horizontal\d|_fused$|_gelu$|_silu$|_layernorm$|^mixed\d|_call$)")
_FLOAT = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)


def _copy(m: onnx.ModelProto) -> onnx.ModelProto:
    c = onnx.ModelProto()
    c.CopyFrom(m)
    return c


def _name_nodes(m: onnx.ModelProto) -> onnx.ModelProto:
    taken = {n.name for n in m.graph.node}
    for i, n in enumerate(m.graph.node):
        if not n.name:
            name = f"probe_node{i}"
            while name in taken:
                name += "_"
            n.name = name
            taken.add(name)
    return m


def _neutral_names(m: onnx.ModelProto) -> onnx.ModelProto:
    for i, t in enumerate(sorted(tensor_names(m.graph))):
        if _PASSLIKE_TENSOR.search(t):
            rename_tensor(m.graph, t, f"probe_t{i}")
    for i, n in enumerate(m.graph.node):
        if _PASSLIKE_NODE.search(n.name):
            n.name = f"probe_n{i}"
    return m


def _constant_tensors(m: onnx.ModelProto):
    for t in m.graph.initializer:
        yield t
    for n in m.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    yield a.t


def _replace(t: onnx.TensorProto, array: np.ndarray) -> None:
    t.CopyFrom(numpy_helper.from_array(array, t.name))


def _scalar_constants(m: onnx.ModelProto) -> onnx.ModelProto:
    for t in list(_constant_tensors(m)):
        if t.data_type in _FLOAT and len(t.dims) >= 1 and int(np.prod(t.dims)) == 1:
            _replace(t, numpy_helper.to_array(t).reshape(()))
    inputs = {i.name for i in m.graph.input}
    for vi in m.graph.input:  # overridable copies must keep the initializer's shape
        init = next((t for t in m.graph.initializer if t.name == vi.name), None)
        if init is not None and vi.name in inputs and not init.dims:
            vi.type.tensor_type.shape.ClearField("dim")
    return m


def _exact_constants(m: onnx.ModelProto) -> onnx.ModelProto:
    for t in list(_constant_tensors(m)):
        if t.data_type in _FLOAT and int(np.prod(t.dims)) == 1:
            a = numpy_helper.to_array(t)
            v = float(a.reshape(-1)[0])
            for exact in _EXACT:
                if v != exact and abs(v - exact) <= 0.01 * exact:
                    _replace(t, np.full(a.shape, exact, dtype=a.dtype))
                    break
    return m


def _plain_initializers(m: onnx.ModelProto) -> onnx.ModelProto:
    inits = {t.name for t in m.graph.initializer}
    keep = [i for i in m.graph.input if i.name not in inits]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    return m


def _float32(m: onnx.ModelProto) -> onnx.ModelProto:
    kinds = {i.type.tensor_type.elem_type for i in m.graph.input}
    if TensorProto.FLOAT16 not in kinds and TensorProto.DOUBLE not in kinds:
        return m
    return convert(m, TensorProto.FLOAT)


PROBES = {
    "name every node": _name_nodes,
    "neutral names": _neutral_names,
    "scalar constants": _scalar_constants,
    "exact constants": _exact_constants,
    "plain initializers": _plain_initializers,
    "float32": _float32,
}


def diagnose(model: onnx.ModelProto, passes, outcome, *, options: dict | None = None, n_draws: int = 3) -> list[str]:
    """The probes after which `model` is still valid but fusing it with `passes` no longer fails as `outcome` did."""

    found: list[str] = []
    if not judge(Case(model, n_draws, options), passes).same_failure(outcome):
        return found  # it does not fail that way to begin with: nothing to explain
    before = model.SerializeToString()
    for name, probe in PROBES.items():
        m = probe(_copy(model))
        if m.SerializeToString() == before:
            continue
        m = _finish(m)
        if validate(m, n_draws) is not None:
            continue
        try:
            out = judge(Case(m, n_draws, options), passes)
        except Exception:  # noqa: BLE001 - a probe the oracle cannot judge explains nothing
            continue
        if not out.failed:
            found.append(name)
    return found
