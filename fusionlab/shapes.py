"""The one shape / dtype / bytes service: what legality checks, byte counts and FLOP counts are computed from.

`ShapeInfo(graph, dims)` is built once per pass run. It answers, for any value of the graph:

- `shape(v)`: the shape with symbolic dimensions kept as their names (``("batch", 128, 768)``), for legality
  checks that must hold for every size ("the residual has exactly the conv output's shape");
- `concrete(v)` / `nbytes(v)`: the shape with symbolic dimensions bound (``dims``, else by name: batch -> 1,
  sequence -> 8, anything else -> 1), for byte and FLOP counts;
- `dtype(v)`: the element type, from the value itself or from shape inference.

onnx shape inference runs first (on a copy without weight bytes, so it is fast); where it leaves gaps (e.g. a
Slice whose end comes from Shape -> Gather, as in exported BERT position ids), onnxruntime's symbolic shape
inference fills them. The graph itself is never modified.
"""

from __future__ import annotations

import weakref

import numpy as np
import onnx
import onnx_ir as ir

from .graph import Graph

__all__ = ["ShapeInfo", "Shapes", "bind_dims", "dim_value", "infer_shapes", "shape_of", "nbytes", "DEFAULT_DIMS"]

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


_INDEX_TYPES = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)


def _light_proto(graph: Graph) -> onnx.ModelProto:
    """The graph as a proto whose big float initializers are graph inputs of known type and shape (no bytes).

    Integer initializers stay (up to 1 MiB): shape inference reads them (position ids, Expand shapes). A weight
    declared as an input keeps its shape for inference, and no inference engine tries to read its values.
    """
    proto = graph.to_proto()
    keep, moved = [], []
    for init in proto.graph.initializer:
        n = int(np.prod(init.dims, dtype=np.int64)) if init.dims else 1
        if n * 4 > (2**20 if init.data_type in _INDEX_TYPES else 4096):
            moved.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        else:
            keep.append(init)
    if moved:
        inputs = {i.name for i in proto.graph.input}
        proto.graph.ClearField("initializer")
        proto.graph.initializer.extend(keep)
        proto.graph.input.extend(v for v in moved if v.name not in inputs)
    return proto


def _symbolic(proto: onnx.ModelProto) -> tuple[dict[str, tuple], dict[str, int]]:
    """{value: shape with dim names kept}, {value: elem type} by shape inference on the unbound model.

    onnx's inference first; where it leaves a value without a shape or with an anonymous `unk__` dimension
    (TorchScript exports: Range, Expand and Shape arithmetic over the batch and sequence), onnxruntime's
    symbolic inference, which carries `batch` and `sequence` through them, fills in.
    """
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception:
        inferred = proto
    shapes, types = _read_shapes(inferred)
    wanted = {o for n in proto.graph.node for o in n.output if o}
    vague = [v for v in wanted if v not in shapes or any(isinstance(d, str) and d.startswith("unk__") for d in shapes[v])]
    if vague:
        better = _symbolic_infer(proto)
        if better is not None:
            more, more_types = _read_shapes(better)
            for v in vague:
                if v in more and not any(isinstance(d, str) and d.startswith("unk__") for d in more[v]):
                    shapes[v] = more[v]
                    types.setdefault(v, more_types.get(v, 0))
    return shapes, types


def _read_shapes(inferred: onnx.ModelProto) -> tuple[dict[str, tuple], dict[str, int]]:
    shapes: dict[str, tuple] = {}
    types: dict[str, int] = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            continue
        if tt.elem_type:
            types[vi.name] = tt.elem_type
        if tt.HasField("shape"):
            shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                    for d in tt.shape.dim)
    for init in inferred.graph.initializer:
        shapes[init.name] = tuple(init.dims)
        types[init.name] = init.data_type
    return shapes, types


class ShapeInfo:
    """Shapes (symbolic and bound), dtypes and sizes of every value of one graph, computed once.

    `ShapeInfo.of(graph, dims)` returns the one already computed for this graph when nothing in it changed
    since (same nodes, same wiring, same initializers): passes that plan and then apply on an unchanged graph,
    and the cost model after them, share one inference.
    """

    _cache = None  # weakref.WeakKeyDictionary: graph.model -> (fingerprint, ShapeInfo)

    @classmethod
    def of(cls, graph: Graph, dims: dict[str, int] | None = None) -> "ShapeInfo":
        if cls._cache is None:
            cls._cache = weakref.WeakKeyDictionary()
        key = (_fingerprint(graph), tuple(sorted((dims or {}).items())))
        hit = cls._cache.get(graph.model)
        if hit is not None and hit[0] == key:
            return hit[1]
        info = cls(graph, dims)
        cls._cache[graph.model] = (key, info)
        return info

    def __init__(self, graph: Graph, dims: dict[str, int] | None = None):
        self.graph = graph
        self.dims = {**DEFAULT_DIMS, **(dims or {})}
        self._proto = _light_proto(graph)
        self._symbolic, self._types = _symbolic(self._proto)
        self._concrete: Shapes | None = None

    # -- symbolic ----------------------------------------------------------------------------------
    def shape(self, value: ir.Value | None) -> tuple | None:
        """Shape with ints and dim names (str); None entries are unknown dims; None if the rank is unknown."""
        if value is None:
            return None
        if value.const_value is not None:
            return tuple(value.const_value.shape)
        if value.shape is not None:
            dims = tuple((d if d >= 0 else None) if isinstance(d, int) else (d.value if getattr(d, "value", None) else None)
                         for d in value.shape)  # a negative dim_value (some test models write -1) is unknown
            if all(d is not None for d in dims):
                return dims
        got = self._symbolic.get(value.name)
        return None if got is None else tuple(d if not isinstance(d, int) or d >= 0 else None for d in got)

    def rank(self, value: ir.Value | None) -> int | None:
        s = self.shape(value)
        return None if s is None else len(s)

    @property
    def symbolic_shapes(self) -> dict[str, tuple]:
        """{value name: shape with dim names kept}, as inferred (values without an inferred shape absent)."""
        return self._symbolic

    def dtype(self, value: ir.Value | None) -> np.dtype | None:
        """Element type of a value: its own, else from shape inference; None if unknown."""
        if value is None:
            return None
        try:
            if value.dtype is not None:
                return np.dtype(value.dtype.numpy())
        except Exception:
            pass
        code = self._types.get(value.name)
        try:
            if code:
                return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code))
        except Exception:
            return None
        node = value.producer()
        if node is not None and node.domain == "com.microsoft" and node.inputs and node.inputs[0] is not None:
            # onnx has no schemas for onnxruntime's contrib ops; the fused ops fusionlab writes keep input 0's type
            return self.dtype(node.inputs[0])
        return self.concrete_shapes.dtypes.get(value.name) if self._concrete is not None else None

    # -- bound dims --------------------------------------------------------------------------------
    @property
    def concrete_shapes(self) -> "Shapes":
        """{value name: concrete shape} with symbolic dims bound (inferred on first use)."""
        if self._concrete is None:
            self._concrete = _infer_bound(self._proto, self.graph, self.dims)
        return self._concrete

    def concrete(self, value: ir.Value | None) -> tuple[int, ...] | None:
        """Shape with symbolic dimensions bound to sizes; None if unknown."""
        if value is None:
            return None
        got = self.concrete_shapes.get(value.name)
        if got is not None:
            return got
        s = self.shape(value)
        if s is None or any(d is None for d in s):
            return None
        return tuple(d if isinstance(d, int) else dim_value(d, self.dims) for d in s)

    def nbytes(self, value: ir.Value | None) -> int | None:
        """Bytes of a value's tensor with symbolic dims bound; None if its shape or dtype is unknown."""
        shape, dt = self.concrete(value), self.dtype(value)
        if shape is None or dt is None:
            return None
        return int(np.prod(shape, dtype=np.int64)) * dt.itemsize


def _fingerprint(graph: Graph) -> int:
    """A hash of the graph's nodes and wiring (which value feeds which node) and its initializer names."""
    g = graph.graph
    parts = [(n.name, n.op_type, tuple(id(v) for v in n.inputs), tuple(id(v) for v in n.outputs)) for n in g]
    return hash((tuple(parts), tuple(g.initializers), tuple(id(v) for v in g.inputs)))


def _infer_bound(proto: onnx.ModelProto, graph: Graph, dims: dict[str, int]) -> Shapes:
    bound = bind_dims(proto, dims)
    shapes = Shapes()
    try:
        _collect(onnx.shape_inference.infer_shapes(bound, data_prop=True), shapes)
    except Exception:
        _collect(bound, shapes)
    wanted = {v.name for n in graph for v in n.outputs if v is not None and v.name}
    if wanted - set(shapes):
        partial = _symbolic_infer(bound)
        if partial is not None:
            _collect(partial, shapes)
    return shapes


def infer_shapes(graph: Graph, dims: dict[str, int] | None = None) -> Shapes:
    """Concrete shapes (and dtypes) for inputs, initializers and every node output that can be inferred."""
    return ShapeInfo(graph, dims).concrete_shapes


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
