"""Activations written out: SiLU = x * sigmoid(x) -> QuickGelu(alpha=1)."""

from __future__ import annotations

import onnx_ir as ir

from ..engine import Match, Rule, is_op, other_input, sole_consumer
from ..lowering import contrib_target
from .common import F32

__all__ = ["SiLU"]


class SiLU(Rule):
    """x * sigmoid(x) with a single-consumer Sigmoid -> com.microsoft QuickGelu(alpha=1) (that is exactly SiLU)."""

    names = ("silu",)
    anchors = ("Sigmoid",)
    fixed = True

    def match(self, cx, sig: ir.Node) -> Match | None:
        target = contrib_target("QuickGelu", cx.lower)
        if target is None or sig.inputs[0] is None or cx.dtype(sig.inputs[0]) != F32:
            return None
        x = sig.inputs[0]
        mul = sole_consumer(sig.outputs[0])
        if not is_op(mul, "Mul") or other_input(mul, sig.outputs[0]) is not x or not cx.free(sig, mul):
            return None
        return Match("silu", sig, [sig, mul], "x * sigmoid(x) with a single-consumer sigmoid", target.op)

    def rewrite(self, cx, m: Match) -> list[ir.Node]:
        sig = m.nodes[0]
        return [cx.node("QuickGelu", [sig.inputs[0]], {"alpha": 1.0}, domain="com.microsoft", base=f"{sig.name}_silu")]
