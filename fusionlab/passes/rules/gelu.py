"""GELU as exporters write it: erf-GELU -> Gelu, bias + GELU -> BiasGelu, tanh-GELU -> FastGelu.

Constants must be exact to the dtype's rounding (`engine.exact`): 0.4996·x·(1 + erf(x/√2)) is not a GELU,
and rewriting it as one would change the model. A size-1 constant of higher rank than x (shape [1,1,1])
broadcasts the result up a rank, which the fused op would drop: refused too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import onnx_ir as ir

from ..engine import Match, Refused, Rule, attr, exact, is_op, only_read_by, other_input, sole_consumer
from ..lowering import contrib_target, fast_gelu_target, float16_refusal, gelu_target
from ..options import Lowering
from .common import F16, F32, FLOATS
from .poly import prove_tanh_gelu

__all__ = ["ErfGelu", "GeluAfterBias", "TanhGelu", "BiasOpData", "GeluData", "bias_before"]


@dataclass(frozen=True, eq=False)
class BiasOpData:
    """op(input, bias) after a bias Add (BiasGelu, FastGelu with bias): the Add, its input and the bias."""

    add: ir.Node
    input: ir.Value
    bias: ir.Value


@dataclass(frozen=True, eq=False)
class GeluData:
    """One GELU op: its type, domain and attributes, over `x`."""

    op: str
    domain: str
    attrs: dict
    x: ir.Value


def _const_is(cx, v: ir.Value | None, x: ir.Value, target: float) -> bool:
    """v is a constant equal to `target` (to its dtype's rounding) that does not broadcast x's rank up."""
    c = cx.constant(v) if v is not None else None
    return c is not None and exact(c, target) and not cx.broadcasts_up(c, x)


def _erf_gelu_core(cx, erf: ir.Node) -> tuple[list[ir.Node], ir.Value] | None:
    """(nodes in order, x) for x * 0.5 * (1 + erf(x / sqrt 2)) in any of its three arrangements."""
    if erf.inputs[0] is None:
        return None
    scale = erf.inputs[0].producer()
    if not is_op(scale, "Div", "Mul") or sole_consumer(scale.outputs[0]) is not erf or len(scale.inputs) != 2:
        return None
    x = scale.inputs[0]
    if x is None or not _const_is(cx, scale.inputs[1], x, math.sqrt(2.0) if scale.op_type == "Div" else 1 / math.sqrt(2.0)):
        return None
    add = sole_consumer(erf.outputs[0])
    if not is_op(add, "Add") or not _const_is(cx, other_input(add, erf.outputs[0]), x, 1.0):
        return None
    m1 = sole_consumer(add.outputs[0])
    o = other_input(m1, add.outputs[0]) if is_op(m1, "Mul") else None
    if o is None:
        return None
    nodes = [scale, erf, add, m1]
    half = o.producer()
    if o is x:  # (x * (1 + erf)) * 0.5
        m2 = sole_consumer(m1.outputs[0])
        if not is_op(m2, "Mul") or not _const_is(cx, other_input(m2, m1.outputs[0]), x, 0.5):
            return None
        nodes.append(m2)
    elif is_op(half, "Mul") and _const_is(cx, other_input(half, x), x, 0.5) and sole_consumer(o) is m1:
        nodes.insert(0, half)  # (x * 0.5) * (1 + erf)
    elif _const_is(cx, o, x, 0.5):  # ((1 + erf) * 0.5) * x
        m2 = sole_consumer(m1.outputs[0])
        if not is_op(m2, "Mul") or other_input(m2, m1.outputs[0]) is not x:
            return None
        nodes.append(m2)
    else:
        return None
    return (nodes, x) if cx.dtype(x) in FLOATS else None


def bias_before(cx, x: ir.Value, readers: list[ir.Node]) -> tuple[ir.Node, ir.Value, ir.Value] | None:
    """(Add, input, bias) when x = Add(input, 1-D bias over the last axis) is read only by `readers`."""
    add = x.producer()
    dt = cx.dtype(x)
    if not is_op(add, "Add") or len(add.inputs) != 2 or not cx.free(add) or not only_read_by(x, readers):
        return None
    for inp, b in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        if inp is None or b is None or cx.dtype(b) != dt or cx.dtype(inp) != dt:
            continue
        bs, shape = cx.shape(b), cx.shape(inp)
        if bs is None or len(bs) != 1 or not isinstance(bs[0], int) or not shape or len(shape) < 2:
            continue
        if shape[-1] == bs[0]:  # the input keeps its shape: the bias only broadcasts over leading axes
            return add, inp, b
    return None


def _refuse_float16(cx, anchor: ir.Node, x: ir.Value, nodes: list[ir.Node], what: str, op: str = "") -> None:
    """A float16 GELU: no GELU op has a float16 CPU kernel (lowering.FLOAT16_CPU_KERNELS), so Refused, naming
    the op the group would have become (BiasGelu / FastGelu with the bias Add before it, else Gelu)."""
    bias = bias_before(cx, x, nodes) if cx.lower != Lowering.ONNX else None
    if not op:
        op = "com.microsoft:BiasGelu" if bias is not None else str(gelu_target(F32, cx.graph.opset, cx.lower) or "Gelu")
    where = "float16 " + (f"bias Add {bias[0].name} + " if bias is not None else "") + f"{what} at {anchor.name}"
    raise float16_refusal(op, F16, where)


class _BiasOp(Rule):
    """Rewrites of the form op(input, bias) in com.microsoft after a bias Add: BiasGelu, FastGelu(x, bias)."""

    def rewrite(self, cx, m: Match) -> list[ir.Node]:
        d = m.data
        if isinstance(d, BiasOpData):
            op = m.lowered_to.split(":")[-1]
            return [cx.node(op, [d.input, d.bias], {}, domain="com.microsoft", base=f"{d.add.name}_{op.lower()}")]
        return [cx.node(d.op, [d.x], d.attrs, domain=d.domain, base=f"{m.nodes[-1].name}_{d.op.lower()}")]


class ErfGelu(_BiasOp):
    """x * 0.5 * (1 + erf(x / sqrt 2)) -> Gelu; with a 1-D bias Add before it -> BiasGelu."""

    names = ("gelu", "bias_gelu")
    anchors = ("Erf",)
    fixed = True

    def match(self, cx, erf: ir.Node) -> Match | None:
        core = _erf_gelu_core(cx, erf)
        if core is None or not cx.free(*core[0]):
            return None
        nodes, x = core
        dt = cx.dtype(x)
        target = contrib_target("BiasGelu", cx.lower)
        if dt == F16:
            _refuse_float16(cx, erf, x, nodes, "erf-GELU")
        bias = bias_before(cx, x, nodes) if target and dt == F32 else None
        plain_target = gelu_target(dt, cx.graph.opset, cx.lower)
        if plain_target is None:
            plain = Refused(f"no Gelu op for opset {cx.graph.opset} with lower={cx.lower.value!r} and dtype {dt}",
                            rule="gelu")
        else:
            op = plain_target.op.split(":")[-1]
            dom = "com.microsoft" if plain_target.op.startswith("com.microsoft") else ""
            plain = Match("gelu", erf, nodes, "x * 0.5 * (1 + erf(x / sqrt 2)) with single-consumer intermediates",
                          plain_target.op, data=GeluData(op, dom, {}, x))
        if bias is not None:
            return Match("bias_gelu", erf, [bias[0]] + nodes, "Add of a 1-D bias over the last axis, then erf-GELU",
                         target.op, data=BiasOpData(*bias), fallback=plain)
        if isinstance(plain, Refused):
            raise plain
        return plain


class GeluAfterBias(_BiasOp):
    """An existing Gelu after a bias Add: exact Gelu -> BiasGelu, opset-20 tanh Gelu -> FastGelu."""

    names = ("bias_gelu", "fast_gelu")
    anchors = ("Gelu",)
    domains = ("", "ai.onnx", "com.microsoft")
    fixed = True

    def match(self, cx, gelu: ir.Node) -> Match | None:
        if cx.lower == Lowering.ONNX:
            return None
        approx = str(attr(gelu, "approximate", "none")) if gelu.domain != "com.microsoft" else "none"
        if approx not in ("none", "tanh"):
            return None
        rule, op = ("fast_gelu", "FastGelu") if approx == "tanh" else ("bias_gelu", "BiasGelu")
        x = gelu.inputs[0] if gelu.inputs else None
        if x is None or cx.dtype(x) not in (F32, F16) or not cx.free(gelu):
            return None
        found = bias_before(cx, x, [gelu])
        if found is None:
            return None
        fp16 = float16_refusal(f"com.microsoft:{op}", cx.dtype(x), f"float16 bias Add {found[0].name} + Gelu {gelu.name}")
        if fp16:
            raise fp16.at(rule, gelu)
        return Match(rule, gelu, [found[0], gelu], f"Add of a 1-D constant bias, then Gelu ({approx})",
                     f"com.microsoft:{op}", data=BiasOpData(*found))


class TanhGelu(_BiasOp):
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), however written, [after a bias Add] -> FastGelu."""

    names = ("fast_gelu",)
    anchors = ("Tanh",)
    fixed = True

    def match(self, cx, tanh: ir.Node) -> Match | None:
        if tanh.inputs[0] is None or not cx.free(tanh) or cx.dtype(tanh.inputs[0]) not in (F32, F16):
            return None
        proof = prove_tanh_gelu(cx, tanh)
        if proof is None:
            return None
        nodes, x = proof
        if cx.dtype(tanh.inputs[0]) == F16:
            _refuse_float16(cx, tanh, x, nodes, "tanh-GELU", op="com.microsoft:FastGelu" if cx.lower != Lowering.ONNX
                            else "Gelu(tanh)")
        bias = bias_before(cx, x, nodes) if cx.lower != Lowering.ONNX else None
        if bias is not None:
            return Match("fast_gelu", tanh, [bias[0]] + nodes,
                         "Add of a 1-D bias over the last axis, then tanh-GELU (polynomials multiplied out)",
                         "com.microsoft:FastGelu", data=BiasOpData(*bias))
        target = fast_gelu_target(cx.graph.opset, cx.lower)
        if target is None:
            raise Refused("tanh-GELU has no standard op below opset 20")
        op = ("FastGelu", "com.microsoft", {}) if target.op.startswith("com.microsoft") else ("Gelu", "", {"approximate": "tanh"})
        return Match("fast_gelu", tanh, nodes, "0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), "
                     "polynomials multiplied out", target.op, data=GeluData(*op, x))
