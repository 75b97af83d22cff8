"""Constant folding and shape simplification: what every real optimiser does before it fuses anything.

Exporters leave work in the graph that no kernel should do at run time:

- **weight-only subgraphs** (`torch.onnx.export(..., do_constant_folding=False)`): `Transpose`, `Cast`,
  `Reshape`, `Unsqueeze` ... of initializers. A node whose inputs are all constants (not overridable
  initializers) is evaluated once with `onnx.reference` and replaced by an initializer;
- **no-op arithmetic** (onnxruntime's NoopElimination): ``x + 0``, ``x - 0`` on integers and ``x * 1``, ``x / 1`` on
  any type, with a constant that does not broadcast x (the dynamo exporter's index arithmetic adds zeros);
  ``x + 0.0`` on floats stays (it turns -0.0 into +0.0);
- **identity casts** (onnxruntime's CastElimination): a ``Cast`` to the type its input already has, or a
  ``CastLike`` of two values of one type. TorchScript writes LLaMA's and T5's ``hidden.to(torch.float32)`` of a
  float32 tensor as such a Cast, and its output, not its input, is the residual the next block adds: left in, it
  hides the residual Add from the RMSNorm rules. The input's type must be known from the model or onnx shape
  inference (never guessed from an onnxruntime contrib op's inputs);
- **shape arithmetic over static dimensions**: `Shape -> Gather -> Unsqueeze -> Concat -> Reshape` chains
  computing a shape the model already knows. Shape values are evaluated symbolically (each element an int or
  unknown, from `ShapeInfo`), and an int64 value whose every element is known becomes a constant, even when
  the tensor it measures has other, dynamic dimensions.

Limits, so a fold never balloons the model or changes what it computes: only default-domain, deterministic
ops without subgraphs; a folded output may not be larger than twice its inputs plus 4 KiB (no `Expand` or
`ConstantOfShape` materialising activations) nor over `MAX_FOLD_BYTES`, nor empty; it must have the dtype and
shape shape inference gives it; graph outputs are never folded.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator

from ..analysis.shape_values import ShapeValues
from ..graph import Graph
from ..shapes import ShapeInfo
from .cleanup import bypass

__all__ = ["fold", "needed", "MAX_FOLD_BYTES", "HOST_OPS", "is_host_side"]

#: the largest tensor a fold may create
MAX_FOLD_BYTES = 64 * 2**20
_SLACK = 4096
_RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
           "Dropout"}
#: ops that compute shapes on the host when their values are small int64 vectors (never a device kernel)
HOST_OPS = {"Shape", "Size", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Add", "Sub", "Mul",
            "Div", "Mod", "Equal", "Where", "Reshape", "ConstantOfShape", "Range", "Min", "Max", "Neg", "Abs",
            "Expand", "Identity", "ReduceProd", "Not", "Less", "Greater"}
_INT = (np.dtype(np.int64), np.dtype(np.int32))
_COMPARE = frozenset({"Equal", "Not", "Less", "Greater"})


def _foldable_op(node: ir.Node) -> bool:
    if node.domain not in ("", "ai.onnx") or node.op_type in _RANDOM or node.op_type == "Constant":
        return False
    if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
        return False
    return bool(node.outputs) and not any(o.is_graph_output() for o in node.outputs)


def _evaluate(graph: Graph, node: ir.Node, inputs: list[np.ndarray | None]) -> list[np.ndarray] | None:
    """The node's outputs computed by onnx.reference on constant inputs (None if it cannot)."""

    names = [f"i{k}" if v is not None else "" for k, v in enumerate(inputs)]
    outs = [f"o{k}" for k in range(len(node.outputs))]
    attrs = {}
    for k, a in node.attributes.items():
        if a.type == ir.AttributeType.TENSOR:
            attrs[k] = ir.serde.serialize_tensor(a.value)
        elif a.type in (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS):
            attrs[k] = list(a.value)
        elif a.type in (ir.AttributeType.INT, ir.AttributeType.FLOAT, ir.AttributeType.STRING):
            attrs[k] = a.value
        else:
            return None  # sparse tensors, type protos, references: not worth folding
    try:
        proto = onnx.helper.make_node(node.op_type, names, outs, **attrs)
        g = onnx.helper.make_graph(
            [proto], "fold", [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                              for n, v in zip(names, inputs) if n],
            [onnx.helper.make_empty_tensor_value_info(o) for o in outs])
        model = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", graph.opset)])
        model.ir_version = min(graph.model.ir_version or onnx.IR_VERSION, onnx.IR_VERSION)
        got = ReferenceEvaluator(model).run(None, {n: v for n, v in zip(names, inputs) if n})
    except Exception:
        return None
    return [np.asarray(g) for g in got]


def _agrees(info: ShapeInfo, node: ir.Node, outputs: list[np.ndarray]) -> bool:
    """Every folded output has the dtype and shape shape inference (or the model) gives it, where known."""
    for v, arr in zip(node.outputs, outputs):
        dt, shape = info.dtype(v), info.shape(v)
        if dt is not None and dt != arr.dtype:
            return False
        if shape is not None and (len(shape) != arr.ndim or any(isinstance(d, int) and d != a
                                                                 for d, a in zip(shape, arr.shape))):
            return False
    return True


def _within_limits(inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> bool:
    """Not larger than twice the inputs plus a little, and not empty (an empty constant is a degenerate model's
    run-time failure that folding would turn into a load-time one)."""
    if any(v.size == 0 for v in outputs):
        return False
    size_in = sum(v.nbytes for v in inputs if v is not None)
    size_out = sum(v.nbytes for v in outputs)
    return size_out <= min(MAX_FOLD_BYTES, 2 * size_in + _SLACK)


def _simplify_reshape(cx: "_Folder", node: ir.Node) -> int:
    """Reshape(x, Concat(Shape(x)[0], Shape(x)[1], 4, 32)) -> Reshape(x, [0, 0, 4, 32]): a computed target whose
    dynamic elements copy x's own dims at the same position (`0`, with allowzero=0) or leave one to infer (-1)."""
    if len(node.inputs) != 2 or node.inputs[1] is None or int(node.attributes["allowzero"].value
                                                              if "allowzero" in node.attributes else 0):
        return 0
    target = cx.values.of(node.inputs[1])
    data = cx.info.shape(node.inputs[0])
    if target is None or len(target[1]) != 1 or cx.graph.constant(node.inputs[1]) is not None or data is None:
        return 0
    out = []
    for j, d in enumerate(target[0]):
        if isinstance(d, int):
            out.append(d)
        elif isinstance(d, str) and j < len(data) and data[j] == d:
            out.append(0)
        else:
            out.append(None)
    unknown = [j for j, d in enumerate(out) if d is None]
    if len(unknown) > 1 or (unknown and -1 in out) or any(d == 0 for d in target[0] if isinstance(d, int)):
        return 0  # a literal 0 would change meaning; two unknowns cannot both be inferred
    if unknown:
        out[unknown[0]] = -1
    const = cx.names.value(f"{node.name}_shape")
    value = ir.Value(name=const, shape=ir.Shape([len(out)]), type=ir.TensorType(ir.DataType.INT64),
                     const_value=ir.tensor(np.array(out, dtype=np.int64), name=const))
    cx.graph.graph.register_initializer(value)
    node.replace_input_with(1, value)
    return 1


class _Folder:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.info = ShapeInfo.of(graph)
        self.values = ShapeValues(graph, self.info)
        self.names = graph.names()
        self.folded = 0
        self.shapes = 0
        self.noops = 0
        self.casts = 0


def _replace_by_constants(cx: _Folder, node: ir.Node, arrays: list[np.ndarray]) -> None:
    g = cx.graph.graph
    for out, arr in zip(node.outputs, arrays):
        if not out.name or not (out.uses() or out.is_graph_output()):
            continue
        name = out.name
        out.name = cx.names.value(f"{name}__folded")
        value = ir.Value(name=name, shape=ir.Shape(arr.shape), type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)),
                         const_value=ir.tensor(np.array(arr, order="C", copy=True), name=name))
        g.register_initializer(value)
        out.replace_all_uses_with(value)
    g.remove(node, safe=True)


def noop_operand(cx: "_Folder", node: ir.Node) -> int | None:
    """The index of x when `node` is x + 0, 0 + x, x - 0 (integers), x * 1, 1 * x or x / 1 with a constant that
    leaves x's shape and dtype (it must not broadcast x up, in rank or in any dimension); None otherwise.

    The index, not the value: `bypass` forwards exactly the input this test proved to pass through.
    """
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("Add", "Sub", "Mul", "Div") or len(node.inputs) != 2:
        return None
    for keep, other in ((0, 1), (1, 0)) if node.op_type in ("Add", "Mul") else ((0, 1),):
        x, c_v = node.inputs[keep], node.inputs[other]
        c = cx.graph.constant(c_v) if c_v is not None else None
        if x is None or c is None or cx.graph.constant(x) is not None:
            continue
        neutral = 0 if node.op_type in ("Add", "Sub") else 1
        dt, shape = cx.info.dtype(x), cx.info.shape(x)
        if dt is None or c.dtype != dt or shape is None or c.ndim > len(shape) or not np.all(c == neutral):
            continue
        if neutral == 0 and dt.kind == "f":
            continue  # -0.0 + 0.0 is +0.0: not the identity on floats
        padded = (1,) * (len(shape) - c.ndim) + tuple(c.shape)
        if all(d == 1 or d == s for d, s in zip(padded, shape)):
            return keep
    return None


def identity_cast(cx: "_Folder", node: ir.Node) -> int | None:
    """0 (the input forwarded) when `node` is a Cast to its input's own element type or a CastLike of two values
    of one type; None otherwise, or when a type is not known for sure."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("Cast", "CastLike") or not node.inputs:
        return None
    x = node.inputs[0]
    if x is None or len(node.outputs) != 1:
        return None
    have = _sure_dtype(cx, x)
    if node.op_type == "Cast":
        to = node.attributes.get("to")
        if to is None or have is None:
            return None
        try:
            want = np.dtype(ir.DataType(int(to.value)).numpy())
        except Exception:
            return None
    else:
        want = _sure_dtype(cx, node.inputs[1]) if len(node.inputs) == 2 and node.inputs[1] is not None else None
    if have is not None and (have == np.float16 or have.name == "bfloat16"):
        # A float16/bfloat16 identity Cast stays: onnxruntime's CPU runs most float16 ops in float32 between
        # Casts it inserts and then removes Cast pairs depending on the graph around them, so dropping one
        # changes where it rounds (onnxruntime's propagate_cast/fuse_sibling_casts_float_float16 test model:
        # a float32 output moved by 8.9e-5, one float16 ulp, beyond float32 tolerance).
        return None
    return 0 if have is not None and want == have else None


def _sure_dtype(cx: "_Folder", v: ir.Value) -> np.dtype | None:
    """`v`'s element type from the model or onnx shape inference; None for an undeclared output of a node
    outside the default domain (ShapeInfo would guess it from the node's first input)."""
    p = v.producer()
    if p is not None and p.domain not in ("", "ai.onnx") and v.dtype is None:
        return None
    try:
        return cx.info.dtype(v)
    except Exception:
        return None


def fold(graph: Graph) -> dict[str, int]:
    """Fold constant subgraphs, no-op arithmetic and static shape arithmetic in place; returns the counts."""
    if graph.model.ir_version is not None and graph.model.ir_version < 4:
        return {"folded": 0, "shape values": 0, "no-op arithmetic": 0, "identity casts": 0}  # IR < 4: inits are inputs
    cx = _Folder(graph)
    for node in list(graph.topological_order()):
        if node.op_type == "Reshape" and node.domain in ("", "ai.onnx") and node.inputs and \
                graph.constant(node.inputs[0]) is None:  # a reshape of data; its output may be a graph output
            cx.shapes += _simplify_reshape(cx, node)
            continue
        keep = noop_operand(cx, node) if node.graph is graph.graph else None
        if keep is not None and bypass(graph, node, keep=keep):
            cx.noops += 1
            continue
        if node.graph is graph.graph and identity_cast(cx, node) is not None and bypass(graph, node, keep=0):
            cx.casts += 1
            continue
        if node.graph is not graph.graph or not _foldable_op(node):
            continue
        inputs = [None if v is None else graph.constant(v) for v in node.inputs]
        if all(v is None or a is not None for v, a in zip(node.inputs, inputs)) and any(a is not None for a in inputs):
            out = _evaluate(graph, node, inputs)
            if out is not None and len(out) == len(node.outputs) and _within_limits(inputs, out) and \
                    _agrees(cx.info, node, out):
                _replace_by_constants(cx, node, out)
                cx.folded += 1
                continue
        if node.op_type in HOST_OPS and len(node.outputs) == 1:
            sym = cx.values.of(node.outputs[0])
            if sym is not None:
                dtype = np.dtype(np.int64) if node.op_type == "Shape" else cx.info.dtype(node.outputs[0])
                if all(isinstance(d, int) for d in sym[0]) and dtype in _INT and node.op_type != "Identity":
                    _replace_by_constants(cx, node, [np.array(sym[0], dtype=dtype).reshape(sym[1])])
                    cx.shapes += 1
    return {"folded": cx.folded, "shape values": cx.shapes, "no-op arithmetic": cx.noops, "identity casts": cx.casts}


def needed(graph: Graph) -> bool:
    """Whether `fold` could change the graph: a node reading only constants, or a Shape node."""
    for node in graph.graph:
        if not _foldable_op(node):
            continue
        if node.op_type == "Shape":
            return True
        ins = [v for v in node.inputs if v is not None]
        if ins and all(graph.constant(v) is not None for v in ins):
            return True
    return False


def is_host_side(node: ir.Node, info: ShapeInfo) -> bool:
    """Shape arithmetic: an int64/int32 result of at most 64 elements computed by a shape op (no device kernel),
    or the boolean of a comparison over such values (repeat_kv's `Equal(shape, -1)` before a Where)."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in HOST_OPS or len(node.outputs) != 1:
        return False
    out = node.outputs[0]
    dtype = info.dtype(out)
    if dtype not in _INT and node.op_type != "Shape" and not (node.op_type in _COMPARE and dtype == np.dtype(bool)):
        return False
    shape = info.concrete(out)
    return shape is not None and int(np.prod(shape, dtype=np.int64)) <= 64
