"""MatMul with its scalar scales and operand transposes folded in -> ``com.microsoft:FusedMatMul`` [fused_matmul].

onnxruntime's MatMulScaleFusion and MatmulTransposeFusion as one rule, in the forms exporters write:

- a Mul or Div by a scalar constant on either operand or on the output multiplies ``alpha`` (SDPA exports
  scale Q and K by d^-1/4 each *before* the scores MatMul; eager attention scales the scores after it);
- a Transpose of an operand sets ``transA``/``transB`` when it swaps the last two axes, ``transBatchA``/``B``
  when it moves the first axis behind the batch axes (perm [1, ..., r-2, 0, r-1]), both for [1, ..., r-1, 0]
  (YOLO11's attention: ``Transpose(Mul(q, s))`` into the scores MatMul, ``Transpose(softmax)`` into the next).

Legal only where FusedMatMul computes the same: fp32 (the CPU kernel's only type), a scale of one element
that does not broadcast the operand up a rank, Div only as x / s with s finite and non-zero, every absorbed
node read only by the next one, operands of rank >= 2, and transBatch only with operands of equal rank >= 3
(the kernel refuses anything else at run time).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from ..engine import Match, Refused, Rule, attr, is_op, other_input, sole_consumer
from ..lowering import contrib_target, float16_refusal
from .common import F32

__all__ = ["FusedMatMul", "transpose_flags"]


@dataclass(frozen=True, eq=False)
class FusedMatMulData:
    """FusedMatMul(a, b) with `alpha` and (transA, transB, transBatchA, transBatchB)."""

    a: ir.Value
    b: ir.Value
    alpha: float
    flags: tuple[bool, bool, bool, bool]


def transpose_flags(perm: list[int], rank: int) -> tuple[bool, bool] | None:
    """(trans, trans_batch) for a Transpose FusedMatMul can absorb on an operand of this rank, else None."""
    head = list(range(rank - 2))
    if rank >= 2 and perm == head + [rank - 1, rank - 2]:
        return True, False
    if rank >= 3 and perm == list(range(1, rank - 1)) + [0, rank - 1]:
        return False, True
    if rank >= 3 and perm == list(range(1, rank)) + [0]:
        return True, True
    return None


def _scale_of(cx, node: ir.Node, data: ir.Value | None = None) -> tuple[float, ir.Value] | None:
    """(factor, scaled value) if `node` is x * s, s * x or x / s with s a scalar constant (x = `data` when
    given); None if it is no scale at all, Refused if it is one FusedMatMul cannot take."""
    if node.op_type == "Div":
        x, s_v = node.inputs
        if cx.constant(x) is not None and cx.constant(s_v) is None:
            raise Refused(f"Div {node.name} divides a constant by the operand: not a scale")
    elif data is not None:
        x, s_v = data, other_input(node, data)
    else:
        consts = [v for v in node.inputs if cx.constant(v) is not None]
        if len(consts) != 1:
            return None
        s_v = consts[0]
        x = node.inputs[1] if node.inputs[0] is s_v else node.inputs[0]
    c = cx.constant(s_v) if s_v is not None else None
    if c is None:
        return None  # a data Mul/Div: not a scale
    if data is not None and x is not data:
        return None
    if c.size != 1:
        raise Refused(f"{node.op_type} {node.name}: constant of shape {list(c.shape)} is not a scalar scale")
    if cx.broadcasts_up(c, x):
        raise Refused(f"{node.op_type} {node.name}: scalar of rank {c.ndim} would broadcast the operand up a rank")
    v = float(c.reshape(-1)[0])
    if not np.isfinite(v) or (node.op_type == "Div" and v == 0.0):
        raise Refused(f"{node.op_type} {node.name}: scale {v} is not finite and non-zero")
    return (v if node.op_type == "Mul" else 1.0 / v), x


@dataclass
class _Operand:
    """One side of the MatMul as FusedMatMul reads it: the value before the scales and Transpose it absorbs."""
    value: ir.Value
    nodes: list = field(default_factory=list)  # the absorbed Mul/Div/Transpose nodes, in graph order
    alpha: float = 1.0
    trans: bool = False
    batch: bool = False
    why: str | None = None  # why the walk stopped at a node it could not take


def _operand(cx, mm: ir.Node, i: int) -> _Operand:
    """Walk back from input i through single-reader scales and at most one Transpose FusedMatMul takes."""
    out = _Operand(mm.inputs[i])
    reader, transposed = mm, False
    while True:
        v = out.value
        p = v.producer()
        if not (is_op(p, "Mul", "Div") and len(p.inputs) == 2) and not is_op(p, "Transpose"):
            return out
        try:
            if sole_consumer(v) is not reader:
                raise Refused(f"{p.op_type} {p.name}: its output is read elsewhere")
            if not cx.free(p):
                return out
            if p.op_type == "Transpose":
                rank = cx.rank(p.inputs[0])
                perm = [int(k) for k in attr(p, "perm", range(rank or 0)[::-1])]
                flags = transpose_flags(perm, rank) if rank is not None and not transposed else None
                if flags is None:
                    raise Refused(f"Transpose {p.name} perm {perm} is not one FusedMatMul takes")
                out.trans, out.batch, transposed, nxt = flags[0], flags[1], True, p.inputs[0]
            else:
                found = _scale_of(cx, p)
                if found is None:
                    return out
                out.alpha, nxt = out.alpha * found[0], found[1]
        except Refused as exc:
            out.why = str(exc)
            return out
        out.nodes.insert(0, p)
        out.value, reader = nxt, p


def _output_scales(cx, mm: ir.Node) -> tuple[list[ir.Node], float, str | None]:
    """Single-reader scalar Mul/Div after the MatMul: (nodes, factor, why the walk stopped)."""
    nodes, alpha, cur = [], 1.0, mm.outputs[0]
    while True:
        n = sole_consumer(cur)
        if not is_op(n, "Mul", "Div") or len(n.inputs) != 2 or not cx.free(n):
            return nodes, alpha, None
        try:
            found = _scale_of(cx, n, cur)
        except Refused as exc:
            return nodes, alpha, str(exc)
        if found is None:
            return nodes, alpha, None
        nodes.append(n)
        alpha, cur = alpha * found[0], n.outputs[0]


def _operands_refusal(cx, mm: ir.Node, a: _Operand, b: _Operand, ra, rb) -> Refused:
    """Why FusedMatMul's CPU kernel cannot take these operands."""
    if cx.dtype(mm.inputs[0]) != F32 or cx.dtype(mm.inputs[1]) != F32:
        return Refused(f"FusedMatMul's CPU kernel takes float32 only (operands are {cx.dtype(mm.inputs[0])})")
    if ra is None or rb is None or ra < 2 or rb < 2:
        return Refused(f"FusedMatMul needs operands of known rank >= 2 (ranks {ra}, {rb})")
    return Refused(f"transBatch needs both operands of the same rank >= 3 (ranks {ra}, {rb})")


class FusedMatMul(Rule):
    """Scale(s) and last-two-axes / batch Transposes around a MatMul -> com.microsoft FusedMatMul."""

    names = ("fused_matmul",)
    anchors = ("MatMul",)

    def match(self, cx, mm: ir.Node) -> Match | None:
        if contrib_target("FusedMatMul", cx.lower) is None or len(mm.inputs) != 2:
            return None
        a, b = _operand(cx, mm, 0), _operand(cx, mm, 1)
        tail, out_alpha, out_why = _output_scales(cx, mm)
        whys = [w for w in (a.why, b.why, out_why) if w]
        if not (a.nodes or b.nodes or tail):
            if whys:
                raise Refused(whys[0])
            return None
        stayed = [Refused(w) for w in whys]  # fused without them: say why they stayed
        ra, rb = cx.rank(a.value), cx.rank(b.value)
        fp16 = float16_refusal("com.microsoft:FusedMatMul", cx.dtype(mm.inputs[0]), f"float16 MatMul {mm.name}")
        if fp16 or cx.dtype(mm.inputs[0]) != F32 or cx.dtype(mm.inputs[1]) != F32 or ra is None or rb is None \
                or ra < 2 or rb < 2 or ((a.batch or b.batch) and not (ra == rb >= 3)):
            refused = fp16 or _operands_refusal(cx, mm, a, b, ra, rb)
            if not stayed:
                raise refused
            return Match("fused_matmul", mm, [mm], refusals=stayed + [refused])  # nothing fused: all of them said
        alpha = a.alpha * b.alpha * out_alpha
        nodes = a.nodes + [n for n in b.nodes if n not in a.nodes] + [mm] + tail
        return Match("fused_matmul", mm, nodes, "scalar scales and operand transposes FusedMatMul computes itself",
                     "com.microsoft:FusedMatMul", outputs=[nodes[-1].outputs[0]],
                     data=FusedMatMulData(a.value, b.value, float(np.float32(alpha)),
                                          (a.trans, b.trans, a.batch, b.batch)), refusals=stayed)

    def rewrite(self, cx, m: Match) -> list[ir.Node]:
        d: FusedMatMulData = m.data
        ta, tb, ba, bb = d.flags
        attrs = {"alpha": d.alpha, "transA": int(ta), "transB": int(tb), "transBatchA": int(ba),
                 "transBatchB": int(bb)}
        return [cx.node("FusedMatMul", [d.a, d.b], attrs, domain="com.microsoft",
                        base=f"{m.anchor.name}_fused")]
