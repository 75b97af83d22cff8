"""The fused kernel in numpy, and its registration as an onnxruntime custom op.

The mechanism is onnxruntime-extensions' PyOp bridge: `onnx_op(op_type=..., inputs=..., outputs=...,
attrs=...)` registers a Python function; a session that loads `get_library_path()` runs nodes of that
op type in domain `ai.onnx.contrib` by calling back into Python. What that costs (measured in the
notebook): the GIL is taken for every call, each input tensor is copied into a new numpy array, and
the bridge (`_ocos._on_pyop_invocation`) hands the result back as `flatten().tolist()` - a Python float
object per element - which C++ turns back into an array. A native fused kernel has none of this.

The bridge reads only int64, float and string attributes, so list attributes (strides, pads, ...)
travel as comma-separated strings (`"1,1,2,2"`) on the node; bools travel as int64.
"""

from __future__ import annotations

import os
import threading
from math import erf

import numpy as np

from ..analysis.derive import conv_nd
from .declare import DeclarationError, OpDecl, matmul_operands

__all__ = ["DOMAIN", "run_body", "compute", "register", "encode_attr", "decode_attr", "library_path",
           "registered"]

#: onnxruntime-extensions' domain for Python custom ops
DOMAIN = "ai.onnx.contrib"

_LOCK = threading.Lock()
_REGISTRY: dict[str, tuple] = {}  # op name -> (signature, numpy dtype, decl)


# --------------------------------------------------------------------------------------------------
# attributes on the wire
# --------------------------------------------------------------------------------------------------

def encode_attr(type_: str, value):
    """A declared attribute value as the PyOp bridge can read it (int, float or str)."""
    if type_ == "Int":
        return int(value)
    if type_ == "Bool":
        return int(bool(value))
    if type_ == "Float":
        return float(value)
    if type_ == "String":
        return str(value)
    if type_ in ("ListInt", "ListBool"):
        return ",".join(str(int(v)) for v in value)
    if type_ == "ListFloat":
        return ",".join(repr(float(v)) for v in value)
    if type_ == "ListString":
        if any("," in str(v) for v in value):
            raise ValueError(f"list-of-string value {value!r} contains a comma")
        return ",".join(str(v) for v in value)
    raise ValueError(f"cannot encode attribute type {type_}")


def decode_attr(type_: str, value):
    """Inverse of `encode_attr` (the kernel side)."""
    if type_ == "Int":
        return int(value)
    if type_ == "Bool":
        return bool(int(value))
    if type_ == "Float":
        return float(value)
    if type_ == "String":
        return str(value)
    items = [v for v in str(value).split(",") if v != ""]
    if type_ == "ListInt":
        return [int(v) for v in items]
    if type_ == "ListBool":
        return [bool(int(v)) for v in items]
    if type_ == "ListFloat":
        return [float(v) for v in items]
    return items


# --------------------------------------------------------------------------------------------------
# the computation
# --------------------------------------------------------------------------------------------------

def _conv2d(x, w, b, attrs):
    s, p = attrs["strides"], attrs["pads"]
    d = attrs.get("dilations") or [1, 1, 1, 1]
    if attrs.get("data_format", "NCHW") != "NCHW":
        raise ValueError("only data_format NCHW is supported")
    # CANN: strides/dilations are 4-D in NCHW order, pads are (top, bottom, left, right);
    # ONNX/conv_nd: 2 spatial strides, pads (top, left, bottom, right).
    return conv_nd(x, w, b, strides=s[2:], pads=[p[0], p[2], p[1], p[3]], dilations=d[2:],
                   group=int(attrs.get("groups", 1)))


def _erf(x):
    return np.vectorize(erf, otypes=[np.float64])(x)


_UNARY = {
    "Relu": lambda x, a: np.maximum(x, 0),
    "Sigmoid": lambda x, a: 1.0 / (1.0 + np.exp(-x)),
    "Tanh": lambda x, a: np.tanh(x),
    "Erf": lambda x, a: _erf(x),
    "LeakyRelu": lambda x, a: np.where(x >= 0, x, x * a.get("negative_slope", 0.01)),
}
_BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "MatMul": np.matmul}


def run_body(decl: OpDecl, inputs: dict[str, np.ndarray], attrs: dict) -> dict[str, np.ndarray]:
    """Evaluate the declaration's body on named inputs; returns {output name: array}."""
    env = {k: v for k, v in inputs.items() if v is not None}
    for step in decl.body:
        args = [env.get(n) for n in step.inputs]
        if step.op == "Conv":
            x, w = args[0], args[1]
            b = args[2] if len(args) > 2 else None
            y = _conv2d(x, w, b, attrs)
        elif step.op in _UNARY:
            y = _UNARY[step.op](args[0], attrs)
        elif step.op == "MatMul":
            y = np.matmul(*matmul_operands(args[0], args[1], attrs))
        elif step.op in _BINARY:
            y = _BINARY[step.op](args[0], args[1])
        else:
            raise ValueError(f"{decl.name}: no numpy kernel for {step.op}")
        env[step.output] = y
    return {t.name: env[t.name] for t in decl.outputs}


def compute(decl: OpDecl, *arrays: np.ndarray, **attrs) -> np.ndarray:
    """The fused op on positional inputs (declaration order), as the onnxruntime kernel computes it."""
    names = [t.name for t in decl.inputs]
    values = decl.attr_values(attrs)
    out = run_body(decl, dict(zip(names, arrays)), values)
    dtype = np.result_type(*[a for a in arrays if a is not None])
    return np.asarray(out[decl.outputs[0].name]).astype(dtype, copy=False)


# --------------------------------------------------------------------------------------------------
# onnxruntime registration
# --------------------------------------------------------------------------------------------------

def _extensions():
    """onnxruntime-extensions, imported without its side effect on the environment.

    Importing it sets PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python in `os.environ` (its `cvt` module). This process
    keeps the compiled protobuf it already loaded, but every child process (a notebook kernel started by nbval, a
    fuzz worker) would inherit the variable and run protobuf in pure Python, tens of times slower.
    """
    key = "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"
    before = os.environ.get(key)
    try:
        import onnxruntime_extensions
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
    return onnxruntime_extensions


def library_path() -> str:
    """Path of the onnxruntime-extensions custom-op library (pass to `runtime.session`)."""
    return _extensions().get_library_path()


def registered() -> list[str]:
    """Names of the custom ops registered in this process, sorted."""
    return sorted(_REGISTRY)


def register(decl: OpDecl, dtype=np.float32) -> str:
    """Register `decl` as a Python kernel for onnxruntime (once per process); returns its op type.

    The PyOp bridge registers one kernel per op name for the life of the process, so the same name
    cannot later be declared with a different interface or body: that raises DeclarationError.
    """
    ext = _extensions()
    PyCustomOpDef, onnx_op = ext.PyCustomOpDef, ext.onnx_op

    if len(decl.outputs) != 1:
        raise DeclarationError(decl.name, ["the onnxruntime prototype supports exactly one output"])
    dt = {np.dtype(np.float32): PyCustomOpDef.dt_float, np.dtype(np.float64): PyCustomOpDef.dt_double}.get(
        np.dtype(dtype))
    if dt is None:
        raise DeclarationError(decl.name, [f"the onnxruntime prototype runs float32/float64, not {np.dtype(dtype)}"])
    sig = (decl.signature(), np.dtype(dtype).str)
    with _LOCK:
        if decl.name in _REGISTRY:
            if _REGISTRY[decl.name][0] != sig:
                raise DeclarationError(decl.name, [
                    "an op of this name with a different interface or body is already registered with "
                    "onnxruntime in this process; give the new op another name"])
            return decl.name
        wire = {"Int": PyCustomOpDef.dt_int64, "Bool": PyCustomOpDef.dt_int64, "Float": PyCustomOpDef.dt_float}
        attr_types = {a.name: wire.get(a.type, PyCustomOpDef.dt_string) for a in decl.attrs}
        types = {a.name: a.type for a in decl.attrs}

        def kernel(*arrays, **raw):
            attrs = {k: decode_attr(types[k], v) for k, v in raw.items()}
            return compute(decl, *arrays, **attrs)

        kernel.__name__ = decl.name
        onnx_op(op_type=decl.name, inputs=[dt] * len(decl.inputs), outputs=[dt], attrs=attr_types)(kernel)
        _REGISTRY[decl.name] = (sig, np.dtype(dtype), decl)
    return decl.name
