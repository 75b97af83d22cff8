"""Static shapes for every value: what byte counts and FLOP counts are computed from.

Symbolic dimensions (``batch``, ``sequence``) are bound to concrete sizes first (defaults: batch 1,
sequence 8), then onnx shape inference fills in every intermediate value.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

from .graph import Graph

__all__ = ["Shapes", "bind_dims", "infer_shapes", "shape_of", "nbytes", "DEFAULT_DIMS"]

DEFAULT_DIMS = {"batch": 1, "sequence": 8}


def dim_value(name: str, dims: dict[str, int]) -> int:
    """Size for a symbolic dimension: `dims[name]`, else by its name (batch -> 1, sequence -> 8), else 1."""
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
                d.dim_value = dim_value(d.dim_param, dims)
    return out


class Shapes(dict):
    """{value name: concrete shape}, plus `.dtypes` {value name: numpy dtype}."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.dtypes: dict[str, np.dtype] = {}


def _collect(model: onnx.ModelProto, out: Shapes) -> None:
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            continue
        if tt.elem_type:
            try:
                out.dtypes.setdefault(vi.name, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)))
            except Exception:
                pass
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            out.setdefault(vi.name, tuple(int(d.dim_value) for d in tt.shape.dim))
    for init in model.graph.initializer:
        out.setdefault(init.name, tuple(init.dims))
        out.dtypes.setdefault(init.name, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(init.data_type)))


def _symbolic_infer(proto: onnx.ModelProto, auto_merge: bool = True) -> onnx.ModelProto | None:
    """onnxruntime's symbolic shape inference, keeping partial results.

    Its public `infer_shapes` saves `sym_shape_infer_temp.onnx` into the current directory whenever
    inference is incomplete (e.g. a custom op), so the same steps are run here without that write.
    """
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        sym = SymbolicShapeInference(2**31 - 1, auto_merge, False, 0)
        sym._preprocess(proto)
        while sym.run_:
            sym._infer_impl()
        sym._update_output_from_vi()
        return sym.out_mp_
    except Exception:
        return None  # unsupported patterns: keep what onnx inferred


def infer_shapes(graph: Graph, dims: dict[str, int] | None = None) -> Shapes:
    """Concrete shapes (and dtypes) for inputs, initializers and every node output that can be inferred.

    onnx's shape inference runs first; where it leaves gaps (e.g. a Slice whose end comes from
    Shape→Gather, as in exported BERT position ids), onnxruntime's symbolic shape inference fills them.
    The graph itself is not modified.
    """
    proto = bind_dims(graph.to_proto(), dims)
    shapes = Shapes()
    try:
        _collect(onnx.shape_inference.infer_shapes(proto, data_prop=True), shapes)
    except Exception:
        _collect(proto, shapes)
    wanted = {v.name for n in graph for v in n.outputs if v is not None and v.name}
    if wanted - set(shapes):
        partial = _symbolic_infer(proto)
        if partial is not None:
            _collect(partial, shapes)
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
    if shape is None:
        return None
    itemsize = None
    if value.dtype is not None:
        try:
            itemsize = int(value.dtype.itemsize)
        except Exception:
            itemsize = None
    if itemsize is None and isinstance(shapes, Shapes) and value.name in shapes.dtypes:
        itemsize = shapes.dtypes[value.name].itemsize
    if itemsize is None:
        return None
    return int(np.prod(shape, dtype=np.int64)) * itemsize
