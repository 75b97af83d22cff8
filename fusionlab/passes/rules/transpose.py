"""Channels-last blocks (ConvNeXt): Transpose pairs that cancel, and layer-scale folded into the projection.

- ``transpose_cancel``: Transpose(P) -> elementwise ops -> Transpose(P^-1) computes the same elementwise ops on
  the untransposed tensor (what onnxruntime's transpose optimizer does by pushing Transposes through them):
  constants are permuted to the other layout, and an operand that is itself Transpose(P) of some u reads u.
  ConvNeXt's first block ends ``Transpose -> Mul(gamma) -> Add(residual = Transpose(LN)) -> Transpose``: both
  Transposes go. Every op between must be elementwise, read only by the next, and no operand may broadcast
  the result up; an operand that is neither a constant nor a Transpose(P) would need a new Transpose: refused.
  With ``layer_scale`` on, a layer-scale Mul first in the chain folds into the projection before the Transpose
  (in the other layout it would scale the last axis, which onnxruntime's broadcasting does slower).
- ``layer_scale``: MatMul(x, W) [+ b] [-> Transpose] -> Mul(gamma) with gamma per output channel (the MatMul's
  last axis, followed through the Transpose's perm) folds into W's columns and b: W' = W * gamma, b' = b * gamma
  (float64, cast back once; refused if that overflows). ConvNeXt writes ``Mul(W[C, 1, 1], Transpose(...))``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx_ir as ir

from ...analysis import derive
from ..engine import Match, Refused, Rule, attr, copy_attrs, is_op, other_input, sole_consumer
from .common import FLOATS

__all__ = ["TransposeCancel", "LayerScale", "ELEMENTWISE"]


@dataclass(frozen=True, eq=False)
class CancelData:
    """Each op's (input slot of the transposed value, its other operands untransposed); the projection a layer-scale
    Mul folds into and the fold (none: empty, None)."""

    steps: tuple
    proj: tuple[ir.Node, ...]
    fold: object


@dataclass(frozen=True, eq=False)
class ScaleData:
    """The projection (MatMul [+ Add]), the per-channel scale folded into it, and the Transpose after it (or None)."""

    proj: tuple[ir.Node, ...]
    fold: object
    transpose: ir.Node | None

#: elementwise ops that commute with any Transpose (inputs after the first must be constants / Transposes)
ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Exp", "Log",
               "Sqrt", "Reciprocal", "Erf", "Gelu", "LeakyRelu", "HardSigmoid", "HardSwish", "Elu", "Softplus", "Cast"}
_BINARY = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"}


def _perm(cx, t: ir.Node) -> list[int] | None:
    rank = cx.rank(t.inputs[0]) if t.inputs and t.inputs[0] is not None else None
    if rank is None:
        return None
    return [int(k) for k in attr(t, "perm", list(range(rank))[::-1])]


def _operand(cx, v: ir.Value, perm: list[int], out: ir.Value) -> tuple:
    """How a non-chain operand reads in the untransposed layout: ("const", array), ("value", u); Refused otherwise."""
    r = len(perm)
    c = cx.constant(v)
    if c is not None:
        if c.ndim > r:
            raise Refused(f"constant {v.name} of rank {c.ndim} would broadcast the result up a rank")
        padded = c.reshape((1,) * (r - c.ndim) + c.shape)
        return "const", np.ascontiguousarray(np.transpose(padded, np.argsort(perm)))
    t = v.producer()
    if is_op(t, "Transpose") and _perm(cx, t) == perm and cx.shape(v) == cx.shape(out):
        return "value", t.inputs[0]
    made = v.producer()
    raise Refused(f"operand {v.name} is neither a constant nor Transpose(perm {perm}): it would need a new Transpose",
                  condition=f"every other operand a constant or Transpose(perm {perm}) (else it needs a new Transpose)",
                  found=f"{v.name} (computed by {made.op_type})" if made is not None else f"{v.name} (a graph input)")


class TransposeCancel(Rule):
    """Transpose(P) -> elementwise chain -> Transpose(P^-1) -> the chain on the untransposed tensor."""

    names = ("transpose_cancel",)
    anchors = ("Transpose",)
    fixed = True
    same_shape = False  # a Cast in the chain changes the dtype

    def match(self, cx, t1: ir.Node) -> Match | None:
        perm = _perm(cx, t1)
        if perm is None:
            return None
        chain, steps, cur = [], [], t1.outputs[0]
        while True:
            n = sole_consumer(cur)
            if n is None or not cx.free(n):
                return None
            if is_op(n, "Transpose"):
                break
            if not is_op(n, *ELEMENTWISE) or len(n.outputs) != 1 or n.attributes.get("axis") is not None:
                return None
            ins = [v for v in n.inputs if v is not None]
            if n.op_type in _BINARY and (len(ins) != 2 or sum(v is cur for v in ins) != 1):
                return None
            if n.op_type not in _BINARY and (ins[0] is not cur or any(cx.constant(v) is None for v in ins[1:])):
                return None
            extra = [(k, _operand(cx, v, perm, n.outputs[0])) for k, v in enumerate(n.inputs)
                     if v is not None and v is not cur and n.op_type in _BINARY]
            chain.append(n)
            steps.append((list(n.inputs).index(cur), extra))
            cur = n.outputs[0]
        back = _perm(cx, n)
        if not chain or back is None or [perm[k] for k in back] != list(range(len(perm))):
            return None
        reads = [n.inputs[k].producer() for n, (_, extra) in zip(chain, steps) for k, (kind, _) in extra
                 if kind == "value"]  # the operands' Transposes, read through: they must stay

        def cancel(proj: list, fold) -> Match:
            ops = [x.op_type for x in chain[1 if fold else 0:]]
            return Match("transpose_cancel", t1, proj + [t1] + chain + [n], f"Transpose {perm} and its inverse around "
                         f"{len(chain)} elementwise op(s): constants permuted, Transposed operands read untransposed" +
                         ("; the layer-scale Mul folded into the projection" if fold else ""),
                         "+".join([p.op_type for p in proj] + ops), kernels=len(proj) + len(ops),
                         outputs=[n.outputs[0]], reads=reads, data=CancelData(tuple(steps), tuple(proj), fold))

        proj, fold = self._layer_scale(cx, t1, chain[0], perm)
        alone = cancel([], None)
        return replace(cancel(proj, fold), fallback=alone) if fold is not None else alone

    def cut(self, m: Match, rules: frozenset[str], limit: int | None) -> Match | None:
        """The pair cancelled, with the layer-scale Mul folded into the projection only while layer_scale is on."""
        if m.data.fold is not None and "layer_scale" not in rules:
            m = m.fallback
        return m if m.rule in rules else None

    @staticmethod
    def _layer_scale(cx, t1: ir.Node, first: ir.Node, perm: list[int]):
        """(projection, fold) when the first op is a layer-scale Mul that folds into the MatMul before t1."""
        if not is_op(first, "Mul"):
            return [], None
        proj = _projection(cx, t1.inputs[0], t1)
        try:
            fold = _fold_scale(cx, proj, first, t1.outputs[0], perm.index(len(perm) - 1)) if proj else None
        except Refused:
            fold = None
        return (proj, fold) if fold is not None else ([], None)

    def rewrite(self, cx, m: Match) -> list[ir.Node]:
        proj, fold = list(m.data.proj), m.data.fold
        t1 = m.nodes[len(proj)]
        chain, steps = m.nodes[len(proj) + 1:-1], list(m.data.steps)
        out = _emit_projection(cx, proj, fold) if fold else []
        cur = out[-1].outputs[0] if out else t1.inputs[0]
        if fold:
            chain, steps = chain[1:], steps[1:]
        for n, (at, extra) in zip(chain, steps):
            ins = list(n.inputs)
            ins[at] = cur
            for k, (kind, what) in extra:
                ins[k] = cx.initializer(f"{n.name}_untransposed", what) if kind == "const" else what
            new = cx.node(n.op_type, ins, copy_attrs(n), base=f"{n.name}_untransposed")
            out.append(new)
            cur = new.outputs[0]
        return out


def _per_channel(cx, mul: ir.Node, cur: ir.Value, axis: int, n: int, dtype) -> np.ndarray | None:
    """gamma as a length-n vector when Mul(cur, gamma) scales only along `axis`; Refused when it does not."""
    g_v = other_input(mul, cur)
    g = cx.constant(g_v) if g_v is not None else None
    if g is None:
        return None
    rank = cx.rank(cur)
    if g.dtype != dtype or rank is None or g.ndim > rank:
        raise Refused(f"Mul constant {g_v.name}: dtype {g.dtype} or rank {g.ndim} does not fold into the weights")
    padded = (1,) * (rank - g.ndim) + g.shape
    if any(d != 1 and not (i == axis and d == n) for i, d in enumerate(padded)):
        raise Refused(f"Mul constant of shape {list(g.shape)} is not per output channel (axis {axis} of {n})")
    vec = np.broadcast_to(g.astype(np.float64).reshape(-1), (n,)) if g.size in (1, n) else None
    if vec is None or not np.all(np.isfinite(vec)):
        raise Refused("layer-scale constant is not finite")
    return vec


def _projection(cx, v: ir.Value, reader: ir.Node) -> list[ir.Node] | None:
    """[MatMul(x, W), Add(b)?] computing v, each read only by the next one and the last only by `reader`."""
    p, nodes = v.producer(), []
    if is_op(p, "Add") and len(p.inputs) == 2:
        nodes = [p]
        p = next((u.producer() for u in p.inputs if u is not None and cx.constant(u) is None), None)
    if not is_op(p, "MatMul") or len(p.inputs) != 2:
        return None
    nodes.insert(0, p)
    chain = nodes + [reader]
    if any(sole_consumer(x.outputs[0]) is not y for x, y in zip(chain, chain[1:])) or not cx.free(*nodes):
        return None
    return nodes


def _fold_scale(cx, proj: list[ir.Node], mul: ir.Node, cur: ir.Value, axis: int) -> derive.Folded | None:
    """The projection's W' = W * gamma and b' = b * gamma for Mul(cur, gamma) scaling `axis` of cur, which holds
    the MatMul's output columns; None for a Mul by a non-constant, Refused when gamma does not fold."""
    mm = proj[0]
    w = cx.constant(mm.inputs[1])
    if w is None or w.ndim != 2 or w.dtype not in FLOATS:
        raise Refused("the MatMul's weight is not a constant 2-D float matrix")
    g = _per_channel(cx, mul, cur, axis, w.shape[1], w.dtype)
    if g is None:
        return None
    b = None
    if len(proj) > 1:
        b_v = other_input(proj[1], mm.outputs[0])
        b = cx.constant(b_v) if b_v is not None else None
        if b is None or b.dtype != w.dtype or b.shape not in ((w.shape[1],), (1,)):
            raise Refused(f"the Add after the MatMul is not a constant [{w.shape[1]}] bias")
    folded = derive.fold_linear_affine(w, b, g, np.zeros(w.shape[1]))
    if folded.overflow:
        raise Refused(f"folded weights overflow {w.dtype}")
    return folded


def _emit_projection(cx, proj: list[ir.Node], fold: derive.Folded) -> list[ir.Node]:
    """The projection with the folded weight (and the folded bias, when it had an Add)."""
    mm = proj[0]
    w = cx.initializer(f"{mm.name}_W_scaled", fold.weight)
    out = [cx.node("MatMul", [mm.inputs[0], w], base=f"{mm.name}_scaled")]
    if len(proj) > 1:
        out.append(cx.node("Add", [out[-1].outputs[0], cx.initializer(f"{proj[1].name}_B_scaled", fold.bias)],
                           base=f"{proj[1].name}_scaled"))
    return out


class LayerScale(Rule):
    """MatMul(x, W) [+ b] [-> Transpose] -> Mul(gamma per output channel) -> MatMul(x, W') [+ b'] [-> Transpose]."""

    names = ("layer_scale",)
    anchors = ("Mul",)
    same_shape = False  # the MatMul and Add outputs are in the layout before the Transpose

    def match(self, cx, mul: ir.Node) -> Match | None:
        cur = next((v for v in mul.inputs if v is not None and cx.constant(v) is None), None)
        t = cur.producer() if cur is not None and len(mul.inputs) == 2 else None
        rank = cx.rank(cur) if cur is not None else None
        if rank is None:
            return None
        if is_op(t, "Transpose"):
            perm = _perm(cx, t)
            if perm is None or sole_consumer(cur) is not mul:
                return None
            proj, axis = _projection(cx, t.inputs[0], t), perm.index(rank - 1)
        else:
            t, proj, axis = None, _projection(cx, cur, mul), rank - 1
        if proj is None or not cx.free(mul):
            return None
        fold = _fold_scale(cx, proj, mul, cur, axis)
        if fold is None:
            return None
        nodes = proj + ([t] if t is not None else []) + [mul]
        return Match("layer_scale", mul, nodes, "per-output-channel Mul folded into the MatMul's weight columns"
                     " (and bias)", "+".join(n.op_type for n in nodes[:-1]), kernels=len(nodes) - 1,
                     outputs=[mul.outputs[0]], data=ScaleData(tuple(proj), fold, t))

    def rewrite(self, cx, m: Match) -> list[ir.Node]:
        out = _emit_projection(cx, list(m.data.proj), m.data.fold)
        t = m.data.transpose
        if t is not None:
            out.append(cx.node("Transpose", [out[-1].outputs[0]], copy_attrs(t), base=f"{t.name}_scaled"))
        return out
