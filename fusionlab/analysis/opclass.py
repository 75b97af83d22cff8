"""Op classification for fusion, after TVM's `OpPatternKind`.

Every ONNX op gets one pattern kind that says how it may fuse:

- ``ELEMWISE`` (0): each output element depends on the input element at the same index (Relu, Exp, Cast).
- ``BROADCAST`` (1): elementwise after numpy broadcasting (Add, Mul, Where). A broadcast op whose
  inputs all have the output's shape is demoted to ``ELEMWISE`` when shapes are known.
- ``INJECTIVE`` (2): each output element comes from one input element (Reshape, Transpose, Concat, Slice).
- ``REDUCTION`` (3): commutative reduction (ReduceSum, ReduceMean, ArgMax). Only a sink of fusion.
- ``OUT_EWISE_FUSABLE`` (4): a complex op that can take elementwise ops into its output but cannot
  chain another complex op (Conv, MatMul, Gemm, pooling).
- ``OPAQUE`` (8): a fusion barrier (Softmax, control flow, custom-domain ops, anything unknown).

TVM keeps a ``TUPLE`` kind (7) for tuple nodes; ONNX has multi-output nodes instead, so it is unused
here. Combining two kinds takes the larger (``combine``).
"""

from __future__ import annotations

from enum import IntEnum

import onnx_ir as ir

__all__ = ["OpKind", "KIND_OF", "classify", "combine", "table"]


class OpKind(IntEnum):
    """TVM's fusion pattern kinds (same numbers as `tvm.relay.op.OpPattern`)."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    REDUCTION = 3
    OUT_EWISE_FUSABLE = 4
    OPAQUE = 8


_E, _B, _I, _R, _O, _X = (OpKind.ELEMWISE, OpKind.BROADCAST, OpKind.INJECTIVE, OpKind.REDUCTION,
                          OpKind.OUT_EWISE_FUSABLE, OpKind.OPAQUE)

_GROUPS = {
    _E: "Abs Acos Acosh Asin Asinh Atan Atanh Cast CastLike Ceil Celu Clip Cos Cosh Dropout Elu Erf Exp "
        "Floor Gelu HardSigmoid HardSwish Identity IsInf IsNaN LeakyRelu Log Mish Neg Not Reciprocal Relu "
        "Round Selu Shrink Sigmoid Sign Sin Sinh Softplus Softsign Sqrt Tan Tanh ThresholdedRelu",
    _B: "Add And BatchNormalization BitShift BitwiseAnd BitwiseOr BitwiseXor Div Equal Expand Greater "
        "GreaterOrEqual Less LessOrEqual Max Mean Min Mod Mul Or PRelu Pow Sub Sum Where Xor",
    _I: "Concat DepthToSpace Flatten Gather GatherElements Pad Reshape Slice SpaceToDepth Split Squeeze "
        "Tile Transpose Unsqueeze",
    _R: "ArgMax ArgMin ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin "
        "ReduceProd ReduceSum ReduceSumSquare",
    _O: "AveragePool Conv ConvTranspose Gemm GlobalAveragePool GlobalMaxPool LpPool MatMul MaxPool",
}

#: default-domain op type -> kind (anything absent is OPAQUE)
KIND_OF: dict[str, OpKind] = {op: kind for kind, ops in _GROUPS.items() for op in ops.split()}

#: onnxruntime contrib ops that behave like their default-domain counterparts
_MS_KIND = {"FusedConv": _O, "FusedGemm": _O, "FusedMatMul": _O, "Gelu": _E, "FastGelu": _E,
            "BiasGelu": _B, "QuickGelu": _E}


def combine(a: OpKind, b: OpKind) -> OpKind:
    """The kind of two patterns together: the larger (TVM's CombinePattern)."""
    return a if a >= b else b


def _same_shape_inputs(node: ir.Node, shapes: dict[str, tuple] | None) -> bool:
    out = node.outputs[0]
    target = shapes.get(out.name) if shapes else None
    if target is None and out.shape is not None and all(isinstance(d, int) for d in out.shape):
        target = tuple(out.shape)
    if target is None:
        return False
    for v in node.inputs:
        if v is None:
            continue
        s = shapes.get(v.name) if shapes else None
        if s is None and v.shape is not None and all(isinstance(d, int) for d in v.shape):
            s = tuple(v.shape)
        if s != target:
            return False
    return True


def classify(node: ir.Node, shapes: dict[str, tuple] | None = None) -> OpKind:
    """The fusion pattern kind of one node (shapes, if given, demote same-shape broadcasts to ELEMWISE)."""
    domain = node.domain
    if domain in ("", "ai.onnx"):
        kind = KIND_OF.get(node.op_type, _X)
    elif domain == "com.microsoft":
        kind = _MS_KIND.get(node.op_type, _X)
    else:
        return _X
    if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
        return _X
    if node.op_type == "BatchNormalization" and len(node.outputs) > 1:
        return _X  # training mode: running statistics are outputs, not an affine map
    if node.op_type == "Dropout" and len(node.outputs) > 1:
        return _X
    if kind == _B and node.op_type not in ("Expand", "BatchNormalization") and _same_shape_inputs(node, shapes):
        return _E
    return kind


def table() -> list[tuple[str, str]]:
    """(op type, kind name) for every classified default-domain op, sorted by kind then name."""
    return sorted(((op, k.name) for op, k in KIND_OF.items()), key=lambda r: (OpKind[r[1]], r[0]))
