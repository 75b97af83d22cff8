"""Conv chains: [Pad] Conv [BatchNormalization | per-channel Mul/Add/Sub]* [residual Add] [activation].

One chain is one kernel. Each step below is a small unit (its pattern and the reason it refuses); the
rule's name says what the chain holds:

- ``pad_conv``: a zero constant Pad folds into Conv's own pads;
- ``conv_bn`` / ``convtranspose_bn`` / ``conv_scale_bias``: inference BatchNormalization and per-channel
  constant Mul/Add/Sub fold into the weights and bias (float64, cast back once; refused if they overflow);
- ``conv_act`` / ``conv_bn_act``: a trailing activation, fused as ``com.microsoft:FusedConv`` where the CPU
  kernel supports it, SiLU (Sigmoid + Mul) as Conv + ``QuickGelu``, a hard sigmoid written out (relu6(x + 3) / 6,
  with ``hard_sigmoid`` on) as FusedConv(HardSigmoid);
- ``conv_add_act``: a residual ``Add`` then an activation ride in FusedConv's 4th input Z:
  act(conv(x) + b + Z), legal only when Z has exactly the conv output's shape and dtype.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ... import derive
from ...legality import conv_bn_legal, range_edge_input
from ..engine import Match, Refused, Rule, attr, copy_attrs, is_op, next_reader, other_input, sole_consumer
from ..lowering import FUSED_CONV_ACTIVATIONS, conv_activations, conv_target, float16_refusal
from ..options import Lowering
from .activation import hard_sigmoid_after
from .common import FLOATS, F16, F32, activation, bn_scale_shift, channel_affine, consumers, folded_pads

__all__ = ["ConvChain"]

RULES = ("pad_conv", "conv_bn", "convtranspose_bn", "conv_scale_bias", "conv_act", "conv_bn_act", "conv_add_act")


def _head(cx, conv: ir.Node) -> dict | None:
    """The conv's weight, bias, dtype and channels, or None when it is no chain anchor."""
    if len(conv.inputs) < 2 or len(conv.outputs) != 1 or conv.inputs[0] is None or conv.inputs[1] is None:
        return None
    transpose = conv.op_type == "ConvTranspose"
    w = cx.constant(conv.inputs[1])  # None: a run-time weight (activation and Pad fusion still legal)
    w_shape = tuple(w.shape) if w is not None else cx.shape(conv.inputs[1])
    dtype = w.dtype if w is not None else cx.dtype(conv.inputs[1])
    if w_shape is None or len(w_shape) < 3 or not all(isinstance(d, int) for d in w_shape) or dtype not in FLOATS:
        return None
    group = int(attr(conv, "group", 1))
    channels = w_shape[1] * group if transpose else w_shape[0]
    has_bias = len(conv.inputs) > 2 and conv.inputs[2] is not None
    bias = cx.constant(conv.inputs[2]) if has_bias else None
    if bias is not None and (bias.shape != (channels,) or bias.dtype != dtype):
        return None
    return {"w": w, "bias": bias, "dtype": dtype, "group": group, "channels": channels, "rank": len(w_shape),
            "transpose": transpose, "can_fold": w is not None and (not has_bias or bias is not None)}


def _pad_step(cx, conv: ir.Node, head: dict, nodes: list) -> tuple[ir.Node, list[int]] | None:
    """A zero constant Pad in front whose padding moves into Conv's pads."""
    if head["transpose"] or "pad_conv" not in cx.rules or not cx.room(nodes):
        return None
    pad = conv.inputs[0].producer()
    if not is_op(pad, "Pad") or not cx.free(pad):
        return None
    try:
        pads, value = folded_pads(cx, pad, conv, head["rank"])
        if value != 0.0:
            raise Refused("Pad value is not zero")
    except Refused as exc:
        cx.refuse("pad_conv", pad, str(exc))
        return None
    return pad, pads


def _affine_steps(cx, conv: ir.Node, head: dict, nodes: list) -> tuple[list, str]:
    """BatchNormalization and per-channel Mul/Add/Sub after the conv: [(node, scale, shift)], why it stopped."""
    steps: list[tuple[ir.Node, np.ndarray, np.ndarray]] = []
    cur = conv.outputs[0]
    bn_rule = "convtranspose_bn" if head["transpose"] else "conv_bn"
    def foldable(n: ir.Node) -> bool:
        return n.domain in ("", "ai.onnx") and (
            (n.op_type == "BatchNormalization" and bn_rule in cx.rules and n.inputs[0] is cur)
            or (n.op_type in ("Mul", "Add", "Sub") and "conv_scale_bias" in cx.rules
                and cx.constant(other_input(n, cur)) is not None))

    while head["can_fold"] and cx.room(nodes + [s[0] for s in steps]):
        here = len(nodes) + len(steps)
        nxt = next_reader(cx, cur, bn_rule if any(is_op(n, "BatchNormalization") for n in consumers(cur))
                          else "conv_scale_bias", conv, foldable, here)
        if nxt is None or not cx.free(nxt) or nxt.domain not in ("", "ai.onnx"):
            break
        try:
            if nxt.op_type == "BatchNormalization" and bn_rule in cx.rules and nxt.inputs[0] is cur:
                verdict = conv_bn_legal(cx.graph, conv, nxt)
                if not verdict.ok:
                    raise Refused(str(verdict.reason))
                s, t = bn_scale_shift(cx, nxt, head["channels"])
            elif nxt.op_type in ("Mul", "Add", "Sub") and "conv_scale_bias" in cx.rules:
                s, t = channel_affine(cx, nxt, cur, head["channels"], head["rank"], 1, head["dtype"])
            else:
                break
        except Refused as exc:
            why = f"stopped at {nxt.op_type} {nxt.name}: {exc}"
            cx.refuse(bn_rule if nxt.op_type == "BatchNormalization" else "conv_scale_bias", conv, why,
                      condition=exc.condition, found=exc.found, matched=here + 1)
            return steps, why
        steps.append((nxt, s, t))
        cur = nxt.outputs[0]
    return steps, ""


def _residual_step(cx, cur: ir.Value, head: dict, nodes: list):
    """(Add, Z, activation) when `cur` feeds only Add(cur, Z) whose only reader is a FusedConv activation."""
    if "conv_add_act" not in cx.rules or cx.lower == Lowering.ONNX or head["transpose"] or head["dtype"] not in (F32, F16) \
            or not cx.room(nodes + [None]):
        return None
    add = sole_consumer(cur)
    if not is_op(add, "Add") or not cx.free(add) or add.outputs[0].is_graph_output():
        return None
    z = other_input(add, cur)
    if z is None:
        return None
    if float16_refusal("com.microsoft:FusedConv", head["dtype"]):
        after = sole_consumer(add.outputs[0])
        if after is not None and activation(cx, after, FUSED_CONV_ACTIVATIONS) is not None and cx.lower == Lowering.RUNTIME:
            cx.refuse("conv_add_act", _conv_of(nodes), float16_refusal(
                "com.microsoft:FusedConv", F16, f"float16 Add {add.name} + {after.op_type} {after.name}"))
        return None
    a, b = cx.shape(cur), cx.shape(z)
    if a is None or b is None or len(a) != len(b) or any(x is None or y is None or x != y for x, y in zip(a, b)):
        cx.refuse("conv_add_act", add, "cannot prove the residual has the conv output's shape")
        return None
    if cx.dtype(z) != head["dtype"]:
        return None
    after = sole_consumer(add.outputs[0])
    if after is None or not cx.free(after):
        return None
    found = activation(cx, after, FUSED_CONV_ACTIVATIONS)
    return None if found is None else (add, z, found)


def _activation_step(cx, cur: ir.Value, head: dict, nodes: list, has_steps: bool):
    """(member nodes, (op, params)) of a trailing activation the target can take, or None."""
    allowed = ("conv_bn_act" in cx.rules) if has_steps else ("conv_act" in cx.rules or "conv_bn_act" in cx.rules)
    if not allowed or cx.lower == Lowering.ONNX or not cx.room(nodes):
        return None
    silu = _silu_tail(cur)
    if silu is not None and head["dtype"] == F16 and cx.lower == Lowering.RUNTIME:
        cx.refuse("conv_bn_act" if has_steps else "conv_act", _conv_of(nodes),
                  float16_refusal("com.microsoft:QuickGelu", F16, f"float16 SiLU at {silu[0].name}"))
    if silu is not None and cx.free(*silu) and head["dtype"] == F32 and cx.room(nodes + [None]):
        return list(silu), ("SiLU", {})
    hard = hard_sigmoid_after(cx, cur) if "hard_sigmoid" in cx.rules and head["dtype"] == F32 else None
    if hard is not None and not head["transpose"] and cx.lower != Lowering.ONNX and cx.room(nodes + hard["nodes"][1:]):
        return hard["nodes"], ("HardSigmoid", {"alpha": hard["alpha"], "beta": hard["beta"]})
    table = conv_activations(head["dtype"], head["transpose"], cx.lower)
    if not head["transpose"] and cx.lower == Lowering.RUNTIME and float16_refusal("com.microsoft:FusedConv", head["dtype"]):
        act = next((n for n in consumers(cur) if activation(cx, n, FUSED_CONV_ACTIVATIONS) is not None), None)
        if act is not None and len(consumers(cur)) == 1 and not cur.is_graph_output():
            cx.refuse("conv_bn_act" if has_steps else "conv_act", _conv_of(nodes), float16_refusal(
                "com.microsoft:FusedConv", F16, f"float16 {act.op_type} {act.name}"))
    nxt = next_reader(cx, cur, "conv_bn_act" if has_steps else "conv_act", nodes[0] if not is_op(nodes[0], "Pad")
                      else nodes[1], lambda n: activation(cx, n, table) is not None, len(nodes))
    if nxt is None or not cx.free(nxt):
        return None
    found = activation(cx, nxt, table)
    return ([nxt], found) if found is not None else None


def _conv_of(nodes: list) -> ir.Node:
    """The chain's Conv (behind a folded Pad)."""
    return nodes[1] if is_op(nodes[0], "Pad") else nodes[0]


def _silu_tail(value: ir.Value) -> tuple[ir.Node, ir.Node] | None:
    """(Sigmoid, Mul) if value's only readers compute value * sigmoid(value)."""
    if value.is_graph_output():
        return None
    readers = consumers(value)
    if len(readers) != 2 or len(list(value.uses())) != 2:
        return None
    sig = next((n for n in readers if is_op(n, "Sigmoid")), None)
    mul = next((n for n in readers if is_op(n, "Mul")), None)
    if sig is None or mul is None:
        return None
    s = sig.outputs[0]
    if sole_consumer(s) is not mul or set(map(id, mul.inputs)) != {id(value), id(s)}:
        return None
    return sig, mul


def _fold(head: dict, steps: list) -> derive.Folded:
    scale, shift = np.ones(head["channels"]), np.zeros(head["channels"])
    for _, s, t in steps:
        scale, shift = s * scale, s * shift + t
    return derive.fold_conv_bn(head["w"], head["bias"], scale, shift, np.zeros(head["channels"]),
                               np.ones(head["channels"]), 0.0, group=head["group"], transpose=head["transpose"])


def _overflows(head: dict, steps: list) -> bool:
    """Whether the folded weights leave the dtype's range (a cheap bound first; folding twice costs time)."""
    s_max, t_max = 1.0, 0.0
    for _, s, t in steps:
        s_max, t_max = s_max * float(np.abs(s).max()), float(np.abs(s).max()) * t_max + float(np.abs(t).max())
    b_max = float(np.abs(head["bias"]).max()) if head["bias"] is not None else 0.0
    bound = max(float(np.abs(head["w"]).max()) * s_max, s_max * b_max + t_max)
    return not bound < float(np.finfo(head["w"].dtype).max) / 4 and _fold(head, steps).overflow


def _underflows(head: dict, steps: list) -> bool:
    """Whether a nonzero folded weight rounds to 0 in the dtype (a cheap bound first)."""
    w = np.abs(head["w"][head["w"] != 0]) if head["w"].size else head["w"]
    if not w.size:
        return False
    s_min = 1.0
    for _, s, _t in steps:
        s_min *= float(np.abs(s).min())
    finfo = np.finfo(head["w"].dtype)
    if float(w.min()) * s_min > 4 * float(finfo.smallest_subnormal):
        return False
    return _fold(head, steps).underflow


class ConvChain(Rule):
    """[Pad] Conv [BN | Mul | Add | Sub]* [Add residual] [activation] -> one Conv / FusedConv (+ QuickGelu)."""

    names = RULES
    anchors = ("Conv", "ConvTranspose")

    def match(self, cx, conv: ir.Node) -> Match | None:
        head = _head(cx, conv)
        if head is None:
            return None
        nodes = [conv]
        pad = _pad_step(cx, conv, head, nodes)
        if pad is not None:
            nodes.insert(0, pad[0])
        steps, why = _affine_steps(cx, conv, head, nodes)
        nodes += [s[0] for s in steps]
        cur = nodes[-1].outputs[0]
        residual = _residual_step(cx, cur, head, nodes) if (head["can_fold"] or not steps) else None
        if residual is not None:
            add, z, act = residual
            nodes += [add, sole_consumer(add.outputs[0])]
        else:
            found = _activation_step(cx, cur, head, nodes, bool(steps))
            z, act = None, None
            if found is not None:
                nodes += found[0]
                act = found[1]
        if len(nodes) == 1:
            return None
        if steps:
            edge = range_edge_input(cx.graph, conv.inputs[0])
            if edge is not None:
                raise Refused(edge)
        if steps and _overflows(head, steps):
            raise Refused(f"folded weights overflow {head['w'].dtype}")
        if steps and _underflows(head, steps):
            raise Refused(f"a folded weight underflows to 0 in {head['w'].dtype} (its term would be lost, and "
                          "an infinite input would give NaN or 0 where Conv then the scale gives ±inf)")
        rule = self._name(head, steps, residual, act)
        target = conv_target(act[0] if act else None, head["dtype"], head["transpose"], cx.lower)
        reason = why or ("single-consumer chain; constant parameters; per-channel affine steps fold into the "
                         "weights" if steps else "single-consumer chain")
        return Match(rule, conv, nodes, reason, target.op, target.kernels,
                     data={"head": head, "pad": pad, "steps": steps, "z": z, "act": act, "kernel": target.kernel})

    @staticmethod
    def _name(head: dict, steps: list, residual, act) -> str:
        if residual is not None:
            return "conv_add_act"
        if act is not None:
            return "conv_bn_act" if steps else "conv_act"
        if any(s[0].op_type == "BatchNormalization" for s in steps):
            return "convtranspose_bn" if head["transpose"] else "conv_bn"
        return "conv_scale_bias" if steps else "pad_conv"

    def rewrite(self, cx, m: Match) -> list[ir.Node]:
        d, conv = m.data, m.anchor
        head, steps, act, z = d["head"], d["steps"], d["act"], d["z"]
        x = d["pad"][0].inputs[0] if d["pad"] is not None else conv.inputs[0]
        if steps:
            folded = _fold(head, steps)
            wv = cx.initializer(f"{conv.name}_W_fused", folded.weight)
            bv = cx.initializer(f"{conv.name}_B_fused", folded.bias)
        else:
            wv = conv.inputs[1]
            bv = conv.inputs[2] if len(conv.inputs) > 2 else None
        attrs = copy_attrs(conv)
        if d["pad"] is not None:
            attrs["pads"] = d["pad"][1]
        inputs = [x, wv] + ([bv] if bv is not None else [])
        if z is not None:
            if bv is None:  # Z is input 3: a bias must stand in slot 2
                inputs.append(cx.initializer(f"{conv.name}_B_zero", np.zeros(head["channels"], dtype=head["dtype"])))
            inputs.append(z)
        if m.lowered_to == "com.microsoft:FusedConv":
            op, params = act
            attrs["activation"] = op
            vals = [params[k] for k, _ in FUSED_CONV_ACTIVATIONS[op]] if op != "Clip" else [params["min"], params["max"]]
            if vals:
                attrs["activation_params"] = [float(v) for v in vals]
            return [cx.node("FusedConv", inputs, attrs, domain="com.microsoft", base=f"{conv.name}_fused")]
        out = [cx.node(conv.op_type, inputs, attrs, base=f"{conv.name}_fused")]
        if act is not None and act[0] == "SiLU":
            out.append(cx.node("QuickGelu", [out[0].outputs[0]], {"alpha": 1.0}, domain="com.microsoft",
                               base=f"{conv.name}_silu"))
        elif act is not None:
            a = m.nodes[-1]
            out.append(cx.node(a.op_type, [out[0].outputs[0]] + list(a.inputs[1:]), copy_attrs(a),
                               base=f"{a.name}_after_fold"))
        return out
