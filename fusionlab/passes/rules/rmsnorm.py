"""RMSNorm as exporters write it: x * 1/sqrt(mean(x^2) + eps) * gamma.

The forms: the square as Pow(x, 2) or x * x; ReduceMean over the last axis; + eps; then Sqrt + Reciprocal,
Div(1, Sqrt), Pow(., -0.5) or x / Sqrt; the scale last. LLaMA and T5 cast to float32 first and back before
the scale (``weight * hidden.to(input_dtype)``): both Casts are members. T5 in half precision casts the input
twice (``hidden.to(float32).pow(2)`` for the variance, and type promotion for ``hidden * rsqrt(...)``): the twin
Cast is a member too. A Cast to the type a value already has is bypassed before any rule runs (`fold`).

- ``rmsnorm`` -> the opset-23 ``RMSNormalization``, stash_type 1 (float32 inside); refused below opset 23:
  onnxruntime's ``SimplifiedLayerNormalization`` exists only in the ONNX domain, where onnx has no such op, so a
  model holding it fails onnx.checker at every opset (and onnxruntime does not find it in com.microsoft);
- ``skip_rmsnorm``: a residual Add [+ a constant [H] bias] then RMSNorm (decomposed or either op) ->
  ``com.microsoft:SkipSimplifiedLayerNormalization`` (the sum handed on as its 4th output when read elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from ..engine import Match, Refused, Rule, attr, consumers, exact, is_op, other_input, sole_consumer
from ..lowering import contrib_target, rmsnorm_target
from .common import F32
from .norm import (NormData, SkipNormData, reduces_last_axis, residual_add, skip_inputs, skip_node, skip_outputs,
    square_of)

__all__ = ["DecomposedRMSNorm", "SkipRMSNorm"]

_FLOATS = (F32, np.dtype(np.float16))


def _only(cx, v: ir.Value, *ops: str) -> ir.Node | None:
    """The one reader of `v` if it is one of `ops`; Refused when such a reader exists but `v` is read elsewhere too."""
    readers = consumers(v)
    hit = next((n for n in readers if is_op(n, *ops)), None)
    if hit is None:
        return None
    if len(readers) > 1 or len(list(v.uses())) > 1 or v.is_graph_output():
        raise Refused(f"{v.name} is read outside the RMSNorm pattern")
    return hit


def _inverse_root(cx, add: ir.Node, xf: ir.Value) -> tuple[list[ir.Node], ir.Node] | None:
    """(nodes after + eps, the node that normalises xf): Sqrt + Reciprocal, Div(1, Sqrt), Pow(-0.5), or xf / Sqrt."""
    nxt = _only(cx, add.outputs[0], "Sqrt", "Pow")
    if nxt is None:
        return None
    if nxt.op_type == "Pow":
        c = cx.constant(nxt.inputs[1]) if len(nxt.inputs) == 2 else None
        if c is None or not exact(c, -0.5, ulps=0) or cx.broadcasts_up(c, xf):
            return None
        nodes = [nxt]
    else:
        root = nxt.outputs[0]
        inv = _only(cx, root, "Reciprocal", "Div")
        if inv is None:
            return None
        if inv.op_type == "Div" and _reads_x(cx, inv.inputs[0], xf) and inv.inputs[1] is root:
            return [nxt], inv  # xf / sqrt(mean + eps)
        if inv.op_type == "Div":
            one = cx.constant(inv.inputs[0])
            if inv.inputs[1] is not root or one is None or not exact(one, 1.0, ulps=0) or cx.broadcasts_up(one, xf):
                return None
        nodes = [nxt, inv]
    r = nodes[-1].outputs[0]
    mul = _only(cx, r, "Mul")
    return (nodes, mul) if mul is not None and _reads_x(cx, other_input(mul, r), xf) else None


def _reads_x(cx, v: ir.Value | None, xf: ir.Value) -> bool:
    """v is xf, or a twin of it: a second Cast of xf's Cast's input to the same type, read only here (T5's
    half-precision form casts the input once for the variance and once more for the product)."""
    return v is xf or _twin(cx, v, xf) is not None


def _twin(cx, v: ir.Value | None, xf: ir.Value) -> ir.Node | None:
    a, b = (v.producer() if v is not None else None), xf.producer()
    if v is None or v is xf or not is_op(a, "Cast") or not is_op(b, "Cast") or a.inputs[0] is not b.inputs[0]:
        return None
    if int(attr(a, "to", 0)) != int(attr(b, "to", -1)) or len(consumers(v)) != 1 or len(list(v.uses())) != 1 \
            or v.is_graph_output():
        return None
    return a


def _no_epsilon(cx, mean: ir.Node) -> None:
    """Refused when the mean of squares goes on to an inverse root without + epsilon before it (a near miss)."""
    nxt = sole_consumer(mean.outputs[0])
    if not is_op(nxt, "Sqrt", "Pow", "Sub", "Reciprocal"):
        return
    later = sole_consumer(nxt.outputs[0])
    where = f" after {nxt.op_type} {nxt.name}" if is_op(later, "Add") and nxt.op_type != "Sub" else ""
    raise Refused(f"the mean of squares {mean.outputs[0].name} is read by {nxt.op_type} {nxt.name}, not by "
                  f"+ epsilon{' (epsilon is added' + where + ')' if where else ''}: not an RMSNorm")


@dataclass(frozen=True, eq=False)
class _Core:
    """x / sqrt(mean(x²) + eps) as `_core` found it: the nodes, the float32 input `xf` (a Cast's output when the
    pattern starts with one), x² and the normalising node, where the pattern ends (`cur`, after a Cast back),
    whether `xf` is read outside, and the second Cast of the same input that the x² side may read (`twin`)."""
    nodes: list
    xf: ir.Value
    sq: ir.Node
    norm: ir.Node
    cur: ir.Value
    eps: float
    shared: bool
    twin: ir.Node | None


def _core(cx, mean: ir.Node) -> _Core | None:
    """The decomposed RMSNorm whose ReduceMean is `mean`: members, input, eps; Refused where it is not legal."""
    sq = mean.inputs[0].producer() if mean.inputs and mean.inputs[0] is not None else None
    if not is_op(sq, "Pow", "Mul") or consumers(sq.outputs[0]) != [mean] or sq.outputs[0].is_graph_output():
        return None
    xf = sq.inputs[0]
    if not reduces_last_axis(cx, mean, cx.rank(xf)) or (sq.op_type == "Mul" and sq.inputs[1] is not xf):
        return None
    centre = xf.producer()
    if is_op(centre, "Sub") and is_op(centre.inputs[1].producer(), "ReduceMean"):
        return None  # x - mean(x): the second half of a LayerNorm, which is the layernorm rule's
    add = _only(cx, mean.outputs[0], "Add")
    if add is None:
        _no_epsilon(cx, mean)
    eps_v = other_input(add, mean.outputs[0]) if add is not None else None
    eps = cx.constant(eps_v) if eps_v is not None else None
    if eps is None or eps.size != 1 or not float(eps.reshape(-1)[0]) > 0:
        return None
    found = _inverse_root(cx, add, xf)
    if found is None:
        return None
    if cx.broadcasts_up(eps, xf):
        raise Refused(f"epsilon of shape {list(eps.shape)} would broadcast the result up a rank")
    tail, norm = found
    if sq.op_type == "Pow" and square_of(cx, xf, [sq]) is None:
        raise Refused(f"Pow {sq.name} is not exactly a square")
    twin = _twin(cx, other_input(norm, tail[-1].outputs[0]), xf)
    mine = {id(sq)} | ({id(norm)} if twin is None else set())
    readers = {id(n) for n in consumers(xf)}
    if not mine <= readers:
        return None
    shared = readers != mine or xf.is_graph_output()  # xf is read outside: a member Cast making it cannot go
    nodes = [sq, mean, add] + tail + [norm]
    cast = xf.producer()
    if twin is not None and not (cx.dtype(xf) == F32 and cx.dtype(cast.inputs[0]) in _FLOATS):
        return None
    if is_op(cast, "Cast") and cx.dtype(xf) == F32 and cx.dtype(cast.inputs[0]) in _FLOATS:
        nodes.insert(0, cast)  # LLaMA / T5: hidden.to(float32) first
        if twin is not None:
            nodes.insert(1, twin)
    cur = norm.outputs[0]
    back = _only(cx, cur, "Cast")
    if back is not None:
        nodes.append(back)
        cur = back.outputs[0]
    return _Core(nodes, xf, sq, norm, cur, float(eps.reshape(-1)[0]), shared, twin)


def _scale(cx, core: _Core) -> tuple[ir.Value, ir.Value, list[ir.Node]]:
    """(input, [H] scale, readers of the input in the group): the scale Mul is appended to the members.

    The input is the Cast's when the group starts with one, unless the scale's dtype then differs from it
    (a float32 scale after a float16 input: the Cast stays outside and the op reads its float32 output).
    """
    cur = core.cur
    mul = _only(cx, cur, "Mul")
    if mul is None:
        raise Refused("no scale after the normalisation (the fused op needs one)")
    gamma = other_input(mul, cur)
    nodes, twin = core.nodes, core.twin
    x, readers = core.xf, [core.sq] + ([core.norm] if twin is None else [])
    if is_op(nodes[0], "Cast") and cx.dtype(nodes[0].inputs[0]) == cx.dtype(gamma):
        x, readers = nodes[0].inputs[0], [nodes[0]] + ([twin] if twin is not None else [])
    elif is_op(nodes[0], "Cast"):
        nodes.pop(0)  # the float32 input stays the op's (a twin Cast, read by the group alone, goes with it)
    h = (cx.shape(x) or (None,))[-1]
    if gamma is None or not isinstance(h, int) or cx.shape(gamma) != (h,):
        raise Refused(f"scale of shape {cx.shape(gamma) if gamma is not None else None} is not [H] = [{h}]")
    if cx.dtype(gamma) != cx.dtype(x) or cx.dtype(x) not in _FLOATS:
        raise Refused(f"input {cx.dtype(x)} and scale {cx.dtype(gamma)}: one float32 or float16 type needed")
    nodes.append(mul)
    return x, gamma, readers


def _skip_or_plain(cx, anchor: ir.Node, nodes: list, x: ir.Value, readers: list, gamma, eps: float) -> Match | None:
    """The residual form if there is one (falling back to plain RMSNorm while skip_rmsnorm is off), else plain
    RMSNorm."""
    plain = _plain(cx, anchor, nodes, x, gamma, eps)
    target = contrib_target("SkipSimplifiedLayerNormalization", cx.lower)
    skip = residual_add(cx, x, readers) if target else None
    # x read outside the pattern (the embedding LLaMA's first norm reads, which the residual Add reads too) stays as
    # it is: the plain op reads x as the decomposed nodes did. No member produces x (a member Cast producing the x
    # it reads is refused in `match`)
    if skip is not None:
        out = [nodes[-1].outputs[0]] + ([skip.add.outputs[0]] if skip.sum else [])
        why = "residual Add" + (" with a [H] bias" if skip.bias is not None else "") + ", then RMSNorm over the last axis"
        return Match("skip_rmsnorm", anchor, skip.nodes + nodes, why, target.op, outputs=out,
                     data=SkipNormData(skip, gamma, None, eps), fallback=plain)
    if isinstance(plain, Refused):
        raise plain
    return plain


def _plain(cx, anchor: ir.Node, nodes: list, x: ir.Value, gamma, eps: float) -> Match | Refused | None:
    """Plain RMSNorm as one op, or the Refused of rule rmsnorm saying why there is none."""
    if anchor.op_type != "ReduceMean":
        return None  # already the op
    target = rmsnorm_target(cx.graph.opset, cx.lower)
    if target is None:
        return Refused(f"RMSNormalization needs opset 23 (model has {cx.graph.opset}); onnxruntime's "
                       "SimplifiedLayerNormalization is no ONNX op (onnx.checker rejects it at every opset)",
                       rule="rmsnorm")
    return Match("rmsnorm", anchor, nodes, "mean of squares over the last axis, + eps, inverse root, [H] scale",
                 target.op, outputs=[nodes[-1].outputs[0]], data=NormData(x, gamma, None, eps))


class DecomposedRMSNorm(Rule):
    """x * rsqrt(mean(x^2) + eps) * gamma -> RMSNormalization (opset 23) [+ residual: SkipSimplified...]."""

    names = ("rmsnorm", "skip_rmsnorm")
    anchors = ("ReduceMean",)
    fixed = True

    def match(self, cx, mean: ir.Node) -> Match | None:
        core = _core(cx, mean)
        if core is None or not cx.free(*[n for n in core.nodes if not is_op(n, "Cast")]):
            return None
        x, gamma, readers = _scale(cx, core)
        if not cx.free(*core.nodes):
            return None
        if core.shared and x is not core.xf:
            raise Refused(f"{core.xf.name} is read outside the RMSNorm pattern")
        return _skip_or_plain(cx, mean, core.nodes, x, readers, gamma, core.eps)

    def rewrite(self, cx, m: Match) -> list[ir.Node]:
        d = m.data
        if isinstance(d, SkipNormData):
            inputs = skip_inputs(d.res, d.gamma, simplified=True)
            return [skip_node(cx, m, "SkipSimplifiedLayerNormalization", inputs)]
        op = m.lowered_to
        return [cx.node(op, [d.x, d.gamma], {"axis": -1, "epsilon": d.eps, "stash_type": 1},
                        base=f"{m.anchor.name}_rmsnorm")]

    def outputs(self, m: Match, new_nodes: list[ir.Node]) -> list[tuple[ir.Value, ir.Value]]:
        return skip_outputs(m, new_nodes) if isinstance(m.data, SkipNormData) else Rule.outputs(self, m, new_nodes)


class SkipRMSNorm(DecomposedRMSNorm):
    """An existing SimplifiedLayerNormalization / RMSNormalization after a residual Add -> SkipSimplified..."""

    names = ("skip_rmsnorm",)
    anchors = ("SimplifiedLayerNormalization", "RMSNormalization")

    def match(self, cx, ln: ir.Node) -> Match | None:
        if len(ln.inputs) != 2 or any(o.name and (o.uses() or o.is_graph_output()) for o in ln.outputs[1:]):
            return None
        x, gamma = ln.inputs
        rank = cx.rank(x) if x is not None else None
        shape = cx.shape(x) if x is not None else None
        if rank is None or int(attr(ln, "axis", -1)) not in (-1, rank - 1) or gamma is None or \
                cx.shape(gamma) != (shape[-1],):
            return None
        if not cx.free(ln):
            return None
        return _skip_or_plain(cx, ln, [ln], x, [ln], gamma, float(attr(ln, "epsilon", 1e-5)))
