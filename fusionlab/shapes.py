"""Static shapes for every value: what byte counts and FLOP counts are computed from.

Symbolic dimensions (``batch``, ``sequence``) are bound to concrete sizes first (defaults: batch 1,
sequence 8), then onnx shape inference fills in every intermediate value.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

from .graph import Graph

__all__ = ["bind_dims", "infer_shapes", "shape_of", "nbytes", "DEFAULT_DIMS"]

DEFAULT_DIMS = {"batch": 1, "sequence": 8}


def _dim_value(name: str, dims: dict[str, int]) -> int:
    if name in dims:
        return dims[name]
    low = name.lower()
    if "batch" in low or low in ("n", "b"):
        return dims.get("batch", 1)
    if "seq" in low or "len" in low or "token" in low:
        return dims.get("sequence", 8)
    return 1


def bind_dims(proto: onnx.ModelProto, dims: dict[str, int] | None = None) -> onnx.ModelProto:
    """A copy of the model whose graph inputs have concrete shapes."""
    dims = {**DEFAULT_DIMS, **(dims or {})}
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for vi in out.graph.input:
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param") or not d.HasField("dim_value"):
                d.dim_value = _dim_value(d.dim_param, dims)
    return out


def infer_shapes(graph: Graph, dims: dict[str, int] | None = None) -> dict[str, tuple[int, ...]]:
    """{value name: concrete shape} for inputs, initializers and every node output it can infer.

    Also writes the inferred shapes onto the graph's values when they had none.
    """
    proto = bind_dims(graph.to_proto(), dims)
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception:
        inferred = proto
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
    for init in inferred.graph.initializer:
        shapes[init.name] = tuple(init.dims)
    return shapes


def shape_of(value: ir.Value, shapes: dict[str, tuple[int, ...]] | None = None) -> tuple[int, ...] | None:
    """A concrete shape for a value, from `shapes` or its own static shape."""
    if shapes is not None and value.name in shapes:
        return shapes[value.name]
    if value.shape is not None and all(isinstance(d, int) for d in value.shape):
        return tuple(value.shape)
    return None


def nbytes(value: ir.Value, shapes: dict[str, tuple[int, ...]] | None = None) -> int | None:
    """Size in bytes of a value's tensor, or None if its shape or dtype is unknown."""
    shape = shape_of(value, shapes)
    if shape is None or value.dtype is None:
        return None
    try:
        itemsize = value.dtype.itemsize
    except Exception:
        return None
    return int(np.prod(shape, dtype=np.int64)) * int(itemsize)
