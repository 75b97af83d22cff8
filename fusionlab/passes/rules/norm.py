"""LayerNorm as exporters write it: mean -> sub -> square -> mean -> + eps -> sqrt -> div [-> * gamma [-> + beta]].

- ``layernorm``: the decomposed form -> ``LayerNormalization`` (opset 17), over the last axis only;
- ``skip_layernorm``: a residual Add of two same-shape tensors, optionally after a constant [H] bias Add on one
  of them (the projection's bias: SkipLayerNormalization's `bias` input), then LayerNorm (decomposed or the op) ->
  ``com.microsoft:SkipLayerNormalization``; when the sum is read elsewhere too (pre-LN blocks) it is handed on
  as the op's 4th output. Opt-in: measured slower than Add + LayerNormalization here (vertical.DEFAULT_RULES).

The square must be exactly Pow(d, 2) or d * d, and epsilon a positive size-1 constant that does not
broadcast the result up a rank.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx_ir as ir

from ..engine import Match, Refused, Rule, attr, consumers, exact, is_op, only_read_by, other_input, sole_consumer
from ..lowering import contrib_target, layernorm_target
from ..options import Lowering
from .common import F16, F32

__all__ = ["DecomposedLayerNorm", "SkipLayerNorm", "Residual", "NormData", "SkipNormData", "residual_add",
           "skip_inputs", "skip_node", "skip_outputs", "reduces_last_axis", "square_of"]


@dataclass(frozen=True, eq=False)
class Residual:
    """x = input + skip [+ bias]: the Add, its operands, the bias and its Add (or None), whether x is handed on."""

    add: ir.Node
    input: ir.Value
    skip: ir.Value
    bias: ir.Value | None
    bias_add: ir.Node | None
    sum: bool

    @property
    def nodes(self) -> list[ir.Node]:
        return ([self.bias_add] if self.bias_add is not None else []) + [self.add]


@dataclass(frozen=True, eq=False)
class NormData:
    """A normalisation as one op: its input, scale, shift (None: none) and epsilon."""

    x: ir.Value
    gamma: ir.Value
    beta: ir.Value | None
    eps: float


@dataclass(frozen=True, eq=False)
class SkipNormData:
    """A residual Add then a normalisation, as one Skip*LayerNormalization: the residual, scale, shift, epsilon."""

    res: Residual
    gamma: ir.Value
    beta: ir.Value | None
    eps: float


def reduces_last_axis(cx, node: ir.Node | None, rank: int | None) -> bool:
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


def square_of(cx, d: ir.Value, readers: list[ir.Node]) -> ir.Node | None:
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
    if x is None or not reduces_last_axis(cx, mean, rank):
        return None
    sub = sole_consumer(mean.outputs[0])
    if not is_op(sub, "Sub") or sub.inputs[0] is not x or sub.inputs[1] is not mean.outputs[0]:
        return None
    d = sub.outputs[0]
    readers = consumers(d)
    if d.is_graph_output() or len(readers) != 2 or len(list(d.uses())) not in (2, 3):
        return None
    sq = square_of(cx, d, readers)
    div = next((n for n in readers if is_op(n, "Div") and n.inputs[0] is d), None)
    if sq is None or div is None:
        return None
    var = sole_consumer(sq.outputs[0])
    if var is None or not reduces_last_axis(cx, var, rank):
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


def _bias_split(cx, node: ir.Node, h) -> tuple[ir.Value, ir.Value] | None:
    """(input, bias) when `node` adds a constant [H] bias to a non-constant tensor (either operand order)."""
    for t, b in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
        c = cx.constant(b) if b is not None else None
        if t is not None and c is not None and cx.constant(t) is None and c.shape == (h,) and c.dtype == cx.dtype(t):
            return t, b
    return None


def residual_add(cx, x: ir.Value, readers: list[ir.Node], *, hand_on_sum: bool = True) -> Residual | None:
    """x = input + skip [+ bias] of two same-shape, non-constant float32 or float16 tensors of rank 2 or 3 (what
    the CPU Skip*LayerNormalization kernels take: both have float16 kernels, `lowering.FLOAT16_CPU_KERNELS`), the bias a constant [H] added to one of them first.

    `sum` is True when x has readers besides `readers` (pre-LN blocks reuse the residual sum): the fused op
    then hands x on as its 4th output (input_skip_bias_sum), if `hand_on_sum`.
    """
    add = x.producer()
    if not is_op(add, "Add") or len(add.inputs) != 2 or not cx.free(add):
        return None
    handed = not only_read_by(x, readers)
    if handed and not hand_on_sum:
        return None
    a, b = add.inputs
    if a is None or b is None or cx.constant(a) is not None or cx.constant(b) is not None:
        return None
    shape = cx.shape(x)
    found = Residual(add, a, b, None, None, handed)
    h = shape[-1] if shape else None
    for cand, other in ((a, b), (b, a)):
        ba = cand.producer()
        if isinstance(h, int) and is_op(ba, "Add") and len(ba.inputs) == 2 and sole_consumer(cand) is add \
                and cx.free(ba):
            split = _bias_split(cx, ba, h)
            if split is not None:
                found = replace(found, input=split[0], skip=other, bias=split[1], bias_add=ba)
                break
    sa, sb = cx.shape(found.input), cx.shape(found.skip)
    if sa is None or sb is None or sa != sb or None in sa or len(sa) not in (2, 3):
        return None
    if cx.dtype(a) != cx.dtype(b) or cx.dtype(a) not in (F32, F16):
        return None
    return found


def skip_inputs(res: Residual, gamma, beta=None, *, simplified: bool = False) -> list:
    """Inputs of SkipLayerNormalization (input, skip, gamma, beta, bias) or of SkipSimplifiedLayerNormalization
    (input, skip, gamma, bias)."""
    ins = [res.input, res.skip, gamma]
    if not simplified:
        ins.append(beta)
    if res.bias is not None:
        ins.append(res.bias)
    while ins and ins[-1] is None:
        ins.pop()
    return ins


def skip_node(cx, m: Match, op: str, inputs: list) -> ir.Node:
    """The Skip*LayerNormalization node of a match; with 4 outputs when it hands the residual sum on."""
    res = m.data.res
    node = cx.node(op, inputs, {"epsilon": m.data.eps}, domain="com.microsoft", base=f"{res.add.name}_skipln",
                   num_outputs=4 if res.sum else 1)
    for o in node.outputs[1:3]:
        o.name = ""  # mean and inv_std_var: not computed
    return node


def skip_outputs(m: Match, new_nodes: list[ir.Node]) -> list[tuple[ir.Value, ir.Value]]:
    """(old, new) value pairs: the normalised output, and the residual sum when it is handed on."""
    pairs = [(m.handed_on()[0], new_nodes[-1].outputs[0])]
    if m.data.res.sum:
        pairs.insert(0, (m.data.res.add.outputs[0], new_nodes[-1].outputs[3]))
    return pairs


def _skip_match(anchor: ir.Node, nodes: list, skip: Residual, gamma, beta, eps: float, what: str,
                fallback: "Match | Refused | None" = None) -> Match:
    why = "Add of two same-shape tensors" + (" and a [H] bias" if skip.bias is not None else "") + \
        f", then {what} over the last axis" + ("; the sum is handed on too" if skip.sum else "")
    out = [nodes[-1].outputs[0]] + ([skip.add.outputs[0]] if skip.sum else [])
    return Match("skip_layernorm", anchor, nodes, why, "com.microsoft:SkipLayerNormalization", outputs=out,
                 data=SkipNormData(skip, gamma, beta, eps), fallback=fallback)


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
        if layernorm_target(cx.graph.opset) is None:
            plain = Refused(f"LayerNormalization needs opset 17 (model has {cx.graph.opset})", rule="layernorm")
        else:
            plain = Match("layernorm", mean, nodes, "mean/variance over the last axis, constant gamma/beta",
                          "LayerNormalization", data=NormData(x, gamma, beta, eps))
        target = contrib_target("SkipLayerNormalization", cx.lower)
        skip = residual_add(cx, x, nodes[:2]) if target else None
        if skip is not None:
            return _skip_match(mean, skip.nodes + nodes, skip, gamma, beta, eps, "LayerNorm", fallback=plain)
        if isinstance(plain, Refused):
            raise plain
        return plain

    def rewrite(self, cx, m: Match) -> list[ir.Node]:
        d = m.data
        tail = [d.gamma] + ([d.beta] if d.beta is not None else [])
        if isinstance(d, SkipNormData):
            return [skip_node(cx, m, "SkipLayerNormalization", skip_inputs(d.res, d.gamma, d.beta))]
        return [cx.node("LayerNormalization", [d.x] + tail, {"axis": -1, "epsilon": d.eps},
                        base=f"{m.anchor.name}_layernorm")]

    def outputs(self, m: Match, new_nodes: list[ir.Node]) -> list[tuple[ir.Value, ir.Value]]:
        return skip_outputs(m, new_nodes) if isinstance(m.data, SkipNormData) else Rule.outputs(self, m, new_nodes)


class SkipLayerNorm(Rule):
    """An existing LayerNormalization after a residual Add -> SkipLayerNormalization."""

    names = ("skip_layernorm",)
    anchors = ("LayerNormalization",)
    fixed = True

    def match(self, cx, ln: ir.Node) -> Match | None:
        if cx.lower == Lowering.ONNX or len(ln.inputs) < 2 or \
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
        skip = residual_add(cx, x, [ln])
        if skip is None or not cx.free(ln):
            return None
        return _skip_match(ln, skip.nodes + [ln], skip, gamma, beta, float(attr(ln, "epsilon", 1e-5)),
                           "LayerNormalization")

    rewrite = DecomposedLayerNorm.rewrite
    outputs = DecomposedLayerNorm.outputs
