"""LayerNorm as exporters write it: mean -> sub -> square -> mean -> + eps -> sqrt -> div [-> * gamma [-> + beta]].

- ``layernorm``: the decomposed form -> ``LayerNormalization`` (opset 17), over the last axis only;
- ``skip_layernorm``: a residual Add of two same-shape tensors, then LayerNorm (decomposed or the op) ->
  ``com.microsoft:SkipLayerNormalization`` (opt-in: measured slower than Add + LayerNormalization here).

The square must be exactly Pow(d, 2) or d * d, and epsilon a positive size-1 constant that does not
broadcast the result up a rank.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..engine import Match, Refused, Rule, attr, consumers, exact, is_op, only_read_by, other_input, sole_consumer
from ..lowering import contrib_target, layernorm_target
from .common import F32

__all__ = ["DecomposedLayerNorm", "SkipLayerNorm"]


def _reduces_last_axis(cx, node: ir.Node | None, rank: int | None) -> bool:
    if not is_op(node, "ReduceMean") or int(attr(node, "keepdims", 1)) != 1:
        return False
    if cx.graph.opset >= 18:
        axes = cx.constant(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    else:
        axes = attr(node, "axes", None)
    if axes is None:
        return False
    axes = [int(a) for a in np.asarray(list(axes) if not isinstance(axes, np.ndarray) else axes).reshape(-1)]
    return axes == [-1] or (rank is not None and axes == [rank - 1])


def _square_of(cx, d: ir.Value, readers: list[ir.Node]) -> ir.Node | None:
    for n in readers:
        if is_op(n, "Mul") and n.inputs[0] is d and n.inputs[1] is d:
            return n
        if is_op(n, "Pow") and n.inputs[0] is d and len(n.inputs) == 2:
            c = cx.constant(n.inputs[1])
            if c is not None and exact(c, 2.0, ulps=0) and not cx.broadcasts_up(c, d):
                return n
    return None


def _core(cx, mean: ir.Node):
    """(nodes, x, eps) of mean..div of a decomposed LayerNorm whose first ReduceMean is `mean`."""
    x = mean.inputs[0] if mean.inputs else None
    rank = cx.rank(x)
    if x is None or not _reduces_last_axis(cx, mean, rank):
        return None
    sub = sole_consumer(mean.outputs[0])
    if not is_op(sub, "Sub") or sub.inputs[0] is not x or sub.inputs[1] is not mean.outputs[0]:
        return None
    d = sub.outputs[0]
    readers = consumers(d)
    if d.is_graph_output() or len(readers) != 2 or len(list(d.uses())) not in (2, 3):
        return None
    sq = _square_of(cx, d, readers)
    div = next((n for n in readers if is_op(n, "Div") and n.inputs[0] is d), None)
    if sq is None or div is None:
        return None
    var = sole_consumer(sq.outputs[0])
    if var is None or not _reduces_last_axis(cx, var, rank):
        return None
    add = sole_consumer(var.outputs[0])
    eps_v = other_input(add, var.outputs[0]) if is_op(add, "Add") else None
    eps = cx.constant(eps_v) if eps_v is not None else None
    if eps is None or eps.size != 1 or not float(eps.reshape(-1)[0]) > 0 or cx.broadcasts_up(eps, x):
        return None
    sqrt = sole_consumer(add.outputs[0])
    if not is_op(sqrt, "Sqrt") or sole_consumer(sqrt.outputs[0]) is not div or div.inputs[1] is not sqrt.outputs[0]:
        return None
    return [mean, sub, sq, var, add, sqrt, div], x, float(eps.reshape(-1)[0])


def _affine_tail(cx, nodes: list[ir.Node], x: ir.Value):
    """(gamma, beta, nodes) of `* gamma [+ beta]` after the normalisation (vectors of length H)."""
    shape = cx.shape(x)
    h = shape[-1] if shape else None
    if not isinstance(h, int):
        return None, None, nodes

    def vector(v):
        return v is not None and cx.shape(v) == (h,) and cx.dtype(v) == cx.dtype(x)

    gamma = beta = None
    cur = nodes[-1].outputs[0]
    mul = sole_consumer(cur)
    if is_op(mul, "Mul") and vector(other_input(mul, cur)):
        gamma, cur = other_input(mul, cur), mul.outputs[0]
        nodes = nodes + [mul]
        badd = sole_consumer(cur)
        if is_op(badd, "Add") and vector(other_input(badd, cur)):
            beta = other_input(badd, cur)
            nodes = nodes + [badd]
    return gamma, beta, nodes


def _skip_add(cx, x: ir.Value, readers: list[ir.Node]):
    """(Add, a, b) when x = a + b of two same-shape, non-constant fp32 tensors read only by `readers`."""
    add = x.producer()
    if not is_op(add, "Add") or len(add.inputs) != 2 or not cx.free(add) or not only_read_by(x, readers):
        return None
    a, b = add.inputs
    if a is None or b is None or cx.constant(a) is not None or cx.constant(b) is not None:
        return None
    sa, sb = cx.shape(a), cx.shape(b)
    if sa is None or sb is None or sa != sb or None in sa or len(sa) not in (2, 3):
        return None
    if cx.dtype(a) != F32 or cx.dtype(b) != F32:
        return None
    return add, a, b


class DecomposedLayerNorm(Rule):
    """The decomposed LayerNorm -> LayerNormalization; with a residual Add before it -> SkipLayerNormalization."""

    names = ("layernorm", "skip_layernorm")
    anchors = ("ReduceMean",)
    fixed = True

    def match(self, cx, mean: ir.Node) -> Match | None:
        core = _core(cx, mean)
        if core is None or not cx.free(*core[0]):
            return None
        nodes, x, eps = core
        if cx.dtype(x) == np.dtype(np.float16):
            raise Refused("float16: onnxruntime's LayerNormalization was measured less accurate than the decomposed "
                          "form (5e-3 vs 1e-4 against a float64 reference; fuzzer class N3)")
        if cx.dtype(x) != F32:
            return None
        gamma, beta, nodes = _affine_tail(cx, nodes, x)
        if gamma is None or not cx.free(*nodes):
            return None  # plain normalisation without scale: left alone (rare; needs a ones initializer)
        target = contrib_target("SkipLayerNormalization", cx.lower)
        skip = _skip_add(cx, x, nodes[:2]) if "skip_layernorm" in cx.rules and target else None
        if skip is not None:
            return Match("skip_layernorm", mean, [skip[0]] + nodes, "Add of two same-shape tensors, then LayerNorm "
                         "over the last axis", target.op, data={"skip": skip, "gamma": gamma, "beta": beta, "eps": eps})
        if "layernorm" not in cx.rules:
            return None
        if layernorm_target(cx.graph.opset) is None:
            raise Refused(f"LayerNormalization needs opset 17 (model has {cx.graph.opset})")
        return Match("layernorm", mean, nodes, "mean/variance over the last axis, constant gamma/beta",
                     "LayerNormalization", data={"x": x, "gamma": gamma, "beta": beta, "eps": eps})

    def rewrite(self, cx, m: Match) -> list[ir.Node]:
        d = m.data
        tail = [d["gamma"]] + ([d["beta"]] if d["beta"] is not None else [])
        if "skip" in d:
            add, a, b = d["skip"]
            return [cx.node("SkipLayerNormalization", [a, b] + tail, {"epsilon": d["eps"]}, domain="com.microsoft",
                            base=f"{add.name}_skipln")]
        return [cx.node("LayerNormalization", [d["x"]] + tail, {"axis": -1, "epsilon": d["eps"]},
                        base=f"{m.anchor.name}_layernorm")]


class SkipLayerNorm(Rule):
    """An existing LayerNormalization after a residual Add -> SkipLayerNormalization."""

    names = ("skip_layernorm",)
    anchors = ("LayerNormalization",)
    fixed = True

    def match(self, cx, ln: ir.Node) -> Match | None:
        if cx.lower == "onnx" or len(ln.inputs) < 2 or \
                any(o.name and (o.uses() or o.is_graph_output()) for o in ln.outputs[1:]):
            return None
        x, gamma = ln.inputs[0], ln.inputs[1]
        beta = ln.inputs[2] if len(ln.inputs) > 2 else None
        rank = cx.rank(x) if x is not None else None
        if x is None or rank is None or int(attr(ln, "axis", -1)) not in (-1, rank - 1):
            return None
        gs = cx.shape(gamma) if gamma is not None else None
        if gs is None or len(gs) != 1 or (beta is not None and cx.shape(beta) != gs):
            return None
        skip = _skip_add(cx, x, [ln])
        if skip is None or not cx.free(ln):
            return None
        return Match("skip_layernorm", ln, [skip[0], ln], "Add of two same-shape tensors, then LayerNormalization "
                     "over the last axis", "com.microsoft:SkipLayerNormalization",
                     data={"skip": skip, "gamma": gamma, "beta": beta, "eps": float(attr(ln, "epsilon", 1e-5))})

    rewrite = DecomposedLayerNorm.rewrite
