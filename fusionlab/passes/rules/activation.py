"""Activations written out.

- ``silu``: x * sigmoid(x) -> com.microsoft QuickGelu(alpha=1) (that is exactly SiLU);
- ``hard_sigmoid``: k * clip(a*x + b, 0, 1/k) in any arrangement of scalar Add/Sub/Mul/Div around a Clip ->
  ``HardSigmoid(alpha=k*a, beta=k*b)``: TensorFlow's relu6(x + 3) / 6, Keras' clip(0.2 x + 0.5, 0, 1);
- ``hard_swish``: the same times x -> ``HardSwish`` when alpha = 1/6 and beta = 1/2 (YOLOv5's and Keras'
  x * hardtanh(x + 3, 0, 6) / 6), else HardSigmoid + Mul. (onnxruntime's CPU build has no HardSwish kernel: it
  inlines the op as HardSigmoid + Mul, two kernels instead of the four written out.)

The Clip's lower bound must be exactly 0 and k * upper bound exactly 1 (to a few float32 ulps), every constant
a scalar that does not broadcast x up a rank, every intermediate read only by the next op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from ..engine import Match, Refused, Rule, consumers, is_op, other_input, sole_consumer
from ..lowering import contrib_target, float16_refusal
from .common import F32, FLOATS, activation

__all__ = ["SiLU", "HardActivation", "hard_activation", "hard_sigmoid_after"]

_ULPS = 4 * float(np.finfo(np.float32).eps)


class SiLU(Rule):
    """x * sigmoid(x) with a single-consumer Sigmoid -> com.microsoft QuickGelu(alpha=1) (that is exactly SiLU)."""

    names = ("silu",)
    anchors = ("Sigmoid",)
    fixed = True

    def match(self, cx, sig: ir.Node) -> Match | None:
        target = contrib_target("QuickGelu", cx.lower)
        if target is None or sig.inputs[0] is None or cx.dtype(sig.inputs[0]) not in (F32, np.dtype(np.float16)):
            return None
        x = sig.inputs[0]
        mul = sole_consumer(sig.outputs[0])
        if not is_op(mul, "Mul") or other_input(mul, sig.outputs[0]) is not x or not cx.free(sig, mul):
            return None
        fp16 = float16_refusal(target.op, cx.dtype(x), f"float16 x * sigmoid(x) at {sig.name}")
        if fp16:
            raise fp16
        return Match("silu", sig, [sig, mul], "x * sigmoid(x) with a single-consumer sigmoid", target.op)

    def rewrite(self, cx, m: Match) -> list[ir.Node]:
        sig = m.nodes[0]
        return [cx.node("QuickGelu", [sig.inputs[0]], {"alpha": 1.0}, domain="com.microsoft", base=f"{sig.name}_silu")]


def _scalar(cx, node: ir.Node, cur: ir.Value) -> float | None:
    """The scalar constant `node` combines `cur` with (None: not one that keeps cur's rank)."""
    c = cx.constant(other_input(node, cur)) if other_input(node, cur) is not None else None
    if c is None or c.size != 1 or c.dtype != cx.dtype(cur) or cx.broadcasts_up(c, cur):
        return None
    v = float(c.reshape(-1)[0])
    return v if math.isfinite(v) and not (node.op_type == "Div" and v == 0.0) else None


def _inner(cx, clip: ir.Node) -> tuple[list[ir.Node], ir.Value, float, float]:
    """(nodes, x, a, b) with clip's input = a*x + b through up to three single-reader scalar ops."""
    a, b, u, nodes = 1.0, 0.0, clip.inputs[0], []
    for _ in range(3):
        p = u.producer()
        if not is_op(p, "Add", "Sub", "Mul", "Div") or len(p.inputs) != 2 or sole_consumer(u) is not (nodes[0] if nodes
                                                                                                    else clip):
            break
        src = next((v for v in p.inputs if v is not None and cx.constant(v) is None), None)
        c = _scalar(cx, p, src) if src is not None else None
        if c is None or not cx.free(p) or (p.op_type == "Div" and p.inputs[0] is not src):
            break
        if p.op_type == "Add":
            b += a * c
        elif p.op_type == "Sub":
            a, b = (a, b - a * c) if p.inputs[0] is src else (-a, b + a * c)
        elif p.op_type == "Mul":
            a *= c
        else:
            a /= c
        nodes.insert(0, p)
        u = src
    return nodes, u, a, b


def _bounds(cx, clip: ir.Node) -> tuple[float, float] | None:
    found = activation(cx, clip, {"Clip": ()})
    return None if found is None else (found[1]["min"], found[1]["max"])


def _is_hard_sigmoid(lo: float, hi: float, k: float) -> bool:
    return lo == 0.0 and hi > 0 and abs(k * hi - 1.0) <= _ULPS


@dataclass(frozen=True, eq=False)
class HardFound:
    """A hard sigmoid (or swish: times x) written out: its nodes, its input, HardSigmoid's alpha and beta."""

    nodes: list[ir.Node]
    x: ir.Value
    alpha: float
    beta: float
    swish: bool


def hard_activation(cx, clip: ir.Node) -> HardFound | None:
    """The hard sigmoid / swish around `clip`: nodes, x, alpha, beta, swish; None if absent, Refused if not legal."""
    bounds = _bounds(cx, clip)
    if bounds is None or clip.inputs[0] is None or cx.dtype(clip.inputs[0]) not in FLOATS:
        return None
    inner, x, a, b = _inner(cx, clip)
    lo, hi = bounds
    k, cur, tail, best, why = 1.0, clip.outputs[0], [], None, None
    for step in range(4):
        if (inner or tail) and _is_hard_sigmoid(lo, hi, k):
            best = (list(tail), k)
        n = sole_consumer(cur)
        readers = consumers(cur)
        if n is None and any(is_op(r, "Mul", "Div") for r in readers) and (len(readers) > 1 or cur.is_graph_output()):
            why = f"{cur.name} is read outside the pattern"
        if step == 3 or not is_op(n, "Mul", "Div") or len(n.inputs) != 2 or not cx.free(n):
            break
        c = _scalar(cx, n, cur)
        if is_op(n, "Mul") and other_input(n, cur) is x and not any(_reads_x(t, x) for t in tail):
            tail.append(n)
        elif c is not None and (n.op_type == "Mul" or n.inputs[0] is cur):
            k = k * c if n.op_type == "Mul" else k / c
            tail.append(n)
        else:
            break
        cur = n.outputs[0]
    if best is None:
        if tail or why:
            raise Refused(why or f"clip({lo:g}, {hi:g}) scaled by {k:g} is no hard sigmoid (it needs min 0 and "
                          "scale * max = 1)")
        return None
    tail, k = best
    return HardFound(inner + [clip] + tail, x, k * a, k * b, any(_reads_x(n, x) for n in tail))


def _reads_x(n: ir.Node, x: ir.Value) -> bool:
    return n.op_type == "Mul" and any(v is x for v in n.inputs)


def hard_sigmoid_after(cx, value: ir.Value) -> HardFound | None:
    """A hard sigmoid of `value` (not a swish) whose first op reads it: for Conv chains (FusedConv takes it)."""
    cur, n = value, sole_consumer(value)
    for _ in range(4):
        if n is None or not cx.free(n):
            return None
        if is_op(n, "Clip"):
            break
        if not is_op(n, "Add", "Sub", "Mul", "Div"):
            return None
        cur, n = n.outputs[0], sole_consumer(n.outputs[0])
    if not is_op(n, "Clip"):
        return None
    try:
        found = hard_activation(cx, n)
    except Refused:
        return None
    return found if found is not None and found.x is value and not found.swish else None


def _exact(v: float, target: float) -> bool:
    return abs(v - target) <= _ULPS * abs(target)


class HardActivation(Rule):
    """k * clip(a*x + b, 0, 1/k) [* x] -> HardSigmoid(alpha, beta) [HardSwish when alpha = 1/6, beta = 1/2]."""

    names = ("hard_sigmoid", "hard_swish")
    anchors = ("Clip",)
    fixed = True

    def match(self, cx, clip: ir.Node) -> Match | None:
        found = hard_activation(cx, clip)
        if found is None or not cx.free(*found.nodes):
            return None
        rule = "hard_swish" if found.swish else "hard_sigmoid"
        std = _exact(found.alpha, 1 / 6) and _exact(found.beta, 0.5)
        if rule == "hard_swish" and std and cx.graph.opset < 14:
            raise Refused(f"HardSwish needs opset 14 (model has {cx.graph.opset})", rule=rule)
        op = "HardSwish" if rule == "hard_swish" and std else "HardSigmoid" + ("+Mul" if found.swish else "")
        why = f"clip(a*x + b, 0, 1/k) * k with alpha = {found.alpha:.6g}, beta = {found.beta:.6g}" + \
            (" times x" if found.swish else "")
        return Match(rule, clip, found.nodes, why, op, kernels=1 + op.count("+"),
                     outputs=[found.nodes[-1].outputs[0]], data=found)

    def rewrite(self, cx, m: Match) -> list[ir.Node]:
        d, base = m.data, m.anchor.name
        if m.lowered_to == "HardSwish":
            return [cx.node("HardSwish", [d.x], {}, base=f"{base}_hardswish")]
        hs = cx.node("HardSigmoid", [d.x], {"alpha": float(d.alpha), "beta": float(d.beta)},
                     base=f"{base}_hardsigmoid")
        if not d.swish:
            return [hs]
        return [hs, cx.node("Mul", [d.x, hs.outputs[0]], {}, base=f"{base}_times_x")]
