"""Gated MLPs as one group: SwiGLU (LLaMA: silu(x W_gate) * (x W_up)) and GeGLU (T5's gated-gelu:
gelu(x W_i0) * (x W_i1), erf or tanh GELU).

- ``swiglu`` / ``geglu``: the two projections of one input, the activation of one of them and the gating Mul
  -> MatMul, MatMul, the activation as one op (``com.microsoft:QuickGelu`` for SiLU in float32, else Sigmoid +
  Mul; ``Gelu`` / ``com.microsoft:Gelu``, ``com.microsoft:FastGelu`` or ``Gelu(tanh)`` for GELU), Mul.

onnxruntime 1.31 has no SwiGLU/GeGLU kernel for the CPU (its SwiGLU lives inside MoE/QMoE, BiasSplitGelu is
CUDA-only), so the group is no single kernel: with ``lower="functions"`` it becomes one model-local function
call (Netron shows one node; onnxruntime inlines it), otherwise its ops are written out. Opt-in
(`vertical.DEFAULT_RULES`): measured no faster than the activation rules alone (see there).

Both projections must read the same input, with constant 2-D weights of one shape; every intermediate is
read inside the group only.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from ..engine import Match, Refused, Rule, consumers, is_op, other_input, sole_consumer
from ..lowering import Target, contrib_target, fast_gelu_target, gelu_target
from .common import F32, FLOATS
from .gelu import _erf_gelu_core
from .poly import prove_tanh_gelu

__all__ = ["GatedMLP"]


@dataclass(frozen=True, eq=False)
class GatedData:
    """The gate and up projections and the activation op (type, domain, attributes) between them."""

    gate: ir.Node
    up: ir.Node
    op: tuple[str, str, dict]


def _projection(cx, v: ir.Value) -> ir.Node | None:
    mm = v.producer()
    if not is_op(mm, "MatMul") or len(mm.inputs) != 2 or any(i is None for i in mm.inputs):
        return None
    w = cx.constant(mm.inputs[1])
    return mm if w is not None and w.ndim == 2 else None


def _silu(cx, act: ir.Value) -> tuple[list[ir.Node], ir.Value] | None:
    """([Sigmoid, Mul], g) for act = g * sigmoid(g), the Sigmoid read by that Mul alone."""
    mul = act.producer()
    if not is_op(mul, "Mul") or len(mul.inputs) != 2:
        return None
    for s_v in mul.inputs:
        sig = s_v.producer() if s_v is not None else None
        if is_op(sig, "Sigmoid") and sole_consumer(s_v) is mul and other_input(mul, s_v) is sig.inputs[0]:
            return [sig, mul], sig.inputs[0]
    return None


def _gelu(cx, act: ir.Value, g: ir.Value) -> tuple[list[ir.Node], str] | None:
    """(nodes, "erf" | "tanh") for act = GELU(g): the opset-20 Gelu op, or written out (any arrangement the
    gelu rules prove)."""
    op = act.producer()
    if is_op(op, "Gelu") and len(op.inputs) == 1 and op.inputs[0] is g:
        return [op], "tanh" if str(op.attributes["approximate"].value if "approximate" in op.attributes
                                   else "none") == "tanh" else "erf"
    frontier, seen = [g], set()
    for _ in range(5):
        nxt = []
        for v in frontier:
            for n in consumers(v):
                if id(n) in seen:
                    continue
                seen.add(id(n))
                found = _erf_gelu_core(cx, n) if is_op(n, "Erf") else \
                    prove_tanh_gelu(cx, n) if is_op(n, "Tanh") else None
                if found is not None and found[1] is g and found[0][-1].outputs[0] is act:
                    return found[0], n.op_type.lower()
                nxt.extend(n.outputs)
        frontier = nxt
    return None


def _activation_target(cx, kind: str, dt) -> tuple[str, str, dict] | None:
    """(op, domain, attributes) the activation is written as; None: no op (the group is then not made)."""
    if kind == "silu":
        if dt == F32 and contrib_target("QuickGelu", cx.lower):
            return "QuickGelu", "com.microsoft", {"alpha": 1.0}
        return "Sigmoid+Mul", "", {}
    t: Target | None = gelu_target(dt, cx.graph.opset, cx.lower) if kind == "erf" else \
        (fast_gelu_target(cx.graph.opset, cx.lower) if dt == F32 else None)
    if t is None:
        return None
    if t.op == "Gelu(tanh)":
        return "Gelu", "", {"approximate": "tanh"}
    return t.op.split(":")[-1], ("com.microsoft" if t.op.startswith("com.microsoft") else ""), {}


class GatedMLP(Rule):
    """act(x W_gate) * (x W_up) -> MatMul, MatMul, one activation op, Mul (one function with lower=functions)."""

    names = ("swiglu", "geglu")
    anchors = ("Mul",)
    fixed = True

    def enabled(self, cx) -> bool:
        return True  # off, it still names the gated MLPs it sees (--why-not: opt-in, and what was measured)

    def match(self, cx, mul: ir.Node) -> Match | None:
        if len(mul.inputs) != 2 or any(v is None for v in mul.inputs) or mul.inputs[0] is mul.inputs[1]:
            return None
        for act, up in (mul.inputs, mul.inputs[::-1]):
            found = self._gate(cx, act, up)
            if found is not None:
                return self._match(cx, mul, *found)
        return None

    def _gate(self, cx, act: ir.Value, up: ir.Value):
        up_mm = _projection(cx, up)
        if up_mm is None:
            return None
        for gate_mm in consumers(up_mm.inputs[0]):
            if gate_mm is up_mm or _projection(cx, gate_mm.outputs[0]) is not gate_mm or \
                    gate_mm.inputs[0] is not up_mm.inputs[0] or cx.shape(gate_mm.inputs[1]) != cx.shape(up_mm.inputs[1]):
                continue
            g = gate_mm.outputs[0]
            silu = _silu(cx, act)
            found = (silu[0], "silu") if silu is not None and silu[1] is g else _gelu(cx, act, g)
            if found is None:
                continue
            outside = next((Refused(f"{v.name} is read outside the gated MLP (fusing removes it)") for v in (act, up)
                            if v.is_graph_output() or len(list(v.uses())) != 1), None)
            return gate_mm, up_mm, found[0], found[1], outside
        return None

    def cut(self, m: Match, rules: frozenset[str], limit: int | None) -> Match | None:
        """The gated MLP while its rule is on; off (the default), the refusal saying it is opt-in."""
        if m.rule not in rules:
            raise Refused(f"{m.rule} is opt-in (rules=[..., {m.rule!r}]): onnxruntime has no CPU kernel for it, and "
                          "as one group it measured no faster than the activation fused alone (corpus LLaMA/T5: "
                          "0.96-1.05x, every 95% CI includes 1)")
        return m

    def _match(self, cx, mul: ir.Node, gate_mm: ir.Node, up_mm: ir.Node, act_nodes: list[ir.Node], kind: str,
               outside: Refused | None) -> Match:
        """The gated MLP's match; of `mul` alone (nothing to fuse) when it cannot be written, with the refusal
        saying why if it is read outside the group."""
        rule = "swiglu" if kind == "silu" else "geglu"
        if outside is not None:
            return Match(rule, mul, [mul], refusals=[outside])
        dt = cx.dtype(mul.outputs[0])
        if dt not in FLOATS:
            return Match(rule, mul, [mul])
        op = _activation_target(cx, kind, dt)
        if op is None:
            return Match(rule, mul, [mul])
        nodes = [gate_mm, up_mm] + act_nodes + [mul]
        if not cx.free(*nodes):
            return Match(rule, mul, [mul])
        act_op = op[0] if not op[1] else f"{op[1]}:{op[0]}"
        what = {"silu": "silu", "erf": "erf-GELU", "tanh": "tanh-GELU"}[kind]
        return Match(rule, mul, nodes, f"{what}(x W_gate) * (x W_up), both projections of one input",
                     f"MatMul+MatMul+{act_op}+Mul", kernels=4 + op[0].count("+"),
                     data=GatedData(gate_mm, up_mm, op), kernel=False)

    def rewrite(self, cx, m: Match) -> list[ir.Node]:
        d = m.data
        gate, up = d.gate, d.up
        g = cx.node("MatMul", list(gate.inputs), {}, base=f"{gate.name}_glu")
        u = cx.node("MatMul", list(up.inputs), {}, base=f"{up.name}_glu")
        op, dom, attrs = d.op
        if op == "Sigmoid+Mul":
            sig = cx.node("Sigmoid", [g.outputs[0]], {}, base=f"{m.anchor.name}_sigmoid")
            act = [sig, cx.node("Mul", [g.outputs[0], sig.outputs[0]], {}, base=f"{m.anchor.name}_silu")]
        else:
            act = [cx.node(op, [g.outputs[0]], attrs, domain=dom, base=f"{m.anchor.name}_{op.lower()}")]
        out = cx.node("Mul", [act[-1].outputs[0], u.outputs[0]], {}, base=f"{m.anchor.name}_glu")
        return [g, u] + act + [out]
