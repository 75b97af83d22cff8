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

The matcher finds the whole chain whichever rules are on (`_Found`); `ConvChain.cut` keeps the part the enabled
rules and the group-size limit allow: a Pad only with ``pad_conv``, the affine steps up to the first one whose
rule is off, and the residual or activation tail only after all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx_ir as ir

from ...analysis import derive
from ...analysis.legality import range_edge_input
from ..engine import Match, Refused, Rule, attr, consumers, copy_attrs, is_op, next_reader, other_input, sole_consumer
from ..lowering import FUSED_CONV_ACTIVATIONS, conv_activations, conv_target, float16_refusal
from ..options import Lowering
from .activation import hard_sigmoid_after
from .common import F16, F32, FLOATS, activation, bn_scale_shift, channel_affine, folded_pads

__all__ = ["ConvChain"]

RULES = ("pad_conv", "conv_bn", "convtranspose_bn", "conv_scale_bias", "conv_act", "conv_bn_act", "conv_add_act")


@dataclass(frozen=True, eq=False)
class _Head:
    """The conv's weight, bias, dtype and channels (`w` None: a run-time weight; activation and Pad fusion only)."""

    w: np.ndarray | None
    bias: np.ndarray | None
    dtype: np.dtype
    group: int
    channels: int
    rank: int
    transpose: bool
    can_fold: bool

    @property
    def bn_rule(self) -> str:
        return "convtranspose_bn" if self.transpose else "conv_bn"


@dataclass(frozen=True, eq=False)
class _Step:
    """One affine step folded into the weights: y -> scale * y + shift per channel."""

    node: ir.Node
    scale: np.ndarray
    shift: np.ndarray
    rule: str


@dataclass(frozen=True, eq=False)
class _Tail:
    """What ends the chain: an activation (op, params) over its member nodes, after a residual Add when `z` is set."""

    nodes: tuple[ir.Node, ...]
    act: tuple[str, dict]
    z: ir.Value | None = None

    def allowed(self, rules: frozenset[str], has_steps: bool) -> bool:
        if self.z is not None:
            return "conv_add_act" in rules
        fused = ("conv_bn_act" in rules) if has_steps else bool({"conv_act", "conv_bn_act"} & rules)
        return fused and (self.act[0] != "HardSigmoid" or "hard_sigmoid" in rules)


@dataclass(frozen=True, eq=False)
class _Found:
    """The whole chain at a conv, before `ConvChain.cut`, with the refusals met on the way."""

    head: _Head
    pad: tuple[ir.Node, list[int]] | None
    pad_refusal: Refused | None
    steps: tuple[_Step, ...]
    stop: Refused | None  # why the affine steps stopped: a refused step, or a near miss (a second reader)
    stopped_at: bool  # `stop` is a refused step (the group's reason then says where it stopped)
    tail: _Tail | None
    tail_refusals: tuple[tuple[Refused, int], ...]  # (refusal, members beyond one it needs room for after the steps)
    #: the tail when the steps are cut before step k: a written-out hard sigmoid can begin with the Add step k is
    cut_tails: tuple[_Tail | None, ...]
    edge: str | None  # why folding into the weights is unsafe here (`legality.range_edge_input`)
    lower: Lowering


@dataclass(frozen=True, eq=False)
class ConvChainData:
    """What the rewrite needs: the conv, the folded Pad's pads, the affine steps, the residual Z, the activation."""

    head: _Head
    pad: tuple[ir.Node, list[int]] | None
    steps: tuple[_Step, ...]
    z: ir.Value | None
    act: tuple[str, dict] | None


def _head(cx, conv: ir.Node) -> _Head | None:
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
    if transpose and (group < 1 or w_shape[0] % group):
        return None
    channels = w_shape[1] * group if transpose else w_shape[0]
    has_bias = len(conv.inputs) > 2 and conv.inputs[2] is not None
    bias = cx.constant(conv.inputs[2]) if has_bias else None
    if bias is not None and (bias.shape != (channels,) or bias.dtype != dtype):
        return None
    return _Head(w, bias, dtype, group, channels, len(w_shape), transpose,
                 w is not None and (not has_bias or bias is not None))


def _pad_step(cx, conv: ir.Node, head: _Head) -> tuple[ir.Node, list[int]] | Refused | None:
    """A zero constant Pad in front whose padding moves into Conv's pads; its refusal when it cannot."""
    if head.transpose:
        return None
    pad = conv.inputs[0].producer()
    if not is_op(pad, "Pad") or not cx.free(pad):
        return None
    try:
        pads, value = folded_pads(cx, pad, conv, head.rank)
        if value != 0.0:
            raise Refused("Pad value is not zero")
    except Refused as exc:
        return Refused(str(exc)).at("pad_conv", pad)
    return pad, pads


def _affine_steps(cx, conv: ir.Node, head: _Head, before: int) -> tuple[list[_Step], Refused | None, bool]:
    """BatchNormalization and per-channel Mul/Add/Sub after the conv, the refusal that stopped them, and whether it
    refused a step (not a near miss)."""
    steps: list[_Step] = []
    cur = conv.outputs[0]

    def foldable(n: ir.Node) -> bool:
        return n.domain in ("", "ai.onnx") and (
            (n.op_type == "BatchNormalization" and n.inputs[0] is cur)
            or (n.op_type in ("Mul", "Add", "Sub") and cx.constant(other_input(n, cur)) is not None))

    while head.can_fold:
        here = before + len(steps)
        nxt = next_reader(cx, cur, head.bn_rule if any(is_op(n, "BatchNormalization") for n in consumers(cur))
                          else "conv_scale_bias", conv, foldable, here)
        if isinstance(nxt, Refused):
            return steps, nxt, False
        if nxt is None or not cx.free(nxt) or nxt.domain not in ("", "ai.onnx"):
            break
        rule = head.bn_rule if nxt.op_type == "BatchNormalization" else "conv_scale_bias"
        try:
            if nxt.op_type == "BatchNormalization" and nxt.inputs[0] is cur:
                s, t = bn_scale_shift(cx, nxt, head.channels, head.w, head.bias)
            elif nxt.op_type in ("Mul", "Add", "Sub"):
                s, t = channel_affine(cx, nxt, cur, head.channels, head.rank, 1, head.dtype)
            else:
                break
        except Refused as exc:
            why = f"stopped at {nxt.op_type} {nxt.name}: {exc}"
            return steps, Refused(why, condition=exc.condition, found=exc.found, matched=here + 1, rule=rule,
                                  node=conv), True
        steps.append(_Step(nxt, s, t, rule))
        cur = nxt.outputs[0]
    return steps, None, False


def _residual_step(cx, conv: ir.Node, cur: ir.Value, head: _Head, refusals: list):
    """_Tail(Add, activation, Z) when `cur` feeds only Add(cur, Z) whose only reader is a FusedConv activation."""
    if cx.lower == Lowering.ONNX or head.transpose or head.dtype not in (F32, F16):
        return None
    add = sole_consumer(cur)
    if not is_op(add, "Add") or not cx.free(add) or add.outputs[0].is_graph_output():
        return None
    z = other_input(add, cur)
    if z is None:
        return None
    if float16_refusal("com.microsoft:FusedConv", head.dtype):
        after = sole_consumer(add.outputs[0])
        if after is not None and activation(cx, after, FUSED_CONV_ACTIVATIONS) is not None and \
                cx.lower == Lowering.RUNTIME:
            refusals.append((float16_refusal("com.microsoft:FusedConv", F16, f"float16 Add {add.name} + {after.op_type} "
                                             f"{after.name}").at("conv_add_act", conv), 1))
        return None
    a, b = cx.shape(cur), cx.shape(z)
    if a is None or b is None or len(a) != len(b) or any(x is None or y is None or x != y for x, y in zip(a, b)):
        refusals.append((Refused("cannot prove the residual has the conv output's shape").at("conv_add_act", add), 1))
        return None
    if cx.dtype(z) != head.dtype:
        return None
    after = sole_consumer(add.outputs[0])
    if after is None or not cx.free(after):
        return None
    found = activation(cx, after, FUSED_CONV_ACTIVATIONS)
    return None if found is None else _Tail((add, after), found, z)


def _activation_step(cx, conv: ir.Node, cur: ir.Value, head: _Head, has_steps: bool, before: int, refusals: list):
    """_Tail of a trailing activation the target can take, or None."""
    if cx.lower == Lowering.ONNX:
        return None
    rule = "conv_bn_act" if has_steps else "conv_act"
    silu = _silu_tail(cur)
    if silu is not None and head.dtype == F16 and cx.lower == Lowering.RUNTIME:
        refusals.append((float16_refusal("com.microsoft:QuickGelu", F16, f"float16 SiLU at {silu[0].name}").at(rule, conv),
                         0))
    if silu is not None and cx.free(*silu) and head.dtype == F32:
        return _Tail(silu, ("SiLU", {}))
    hard = _hard_tail(cx, cur, head)
    if hard is not None:
        return hard
    table = conv_activations(head.dtype, head.transpose, cx.lower)
    if not head.transpose and cx.lower == Lowering.RUNTIME and float16_refusal("com.microsoft:FusedConv", head.dtype):
        act = next((n for n in consumers(cur) if activation(cx, n, FUSED_CONV_ACTIVATIONS) is not None), None)
        if act is not None and len(consumers(cur)) == 1 and not cur.is_graph_output():
            refusals.append((float16_refusal("com.microsoft:FusedConv", F16, f"float16 {act.op_type} {act.name}")
                             .at(rule, conv), 0))
    nxt = next_reader(cx, cur, rule, conv, lambda n: activation(cx, n, table) is not None, before)
    if isinstance(nxt, Refused):
        refusals.append((nxt, 0))
        return None
    if nxt is None or not cx.free(nxt):
        return None
    found = activation(cx, nxt, table)
    return _Tail((nxt,), found) if found is not None else None


def _hard_tail(cx, cur: ir.Value, head: _Head) -> _Tail | None:
    """A written-out hard sigmoid of `cur` (FusedConv takes it as HardSigmoid), or None."""
    hard = hard_sigmoid_after(cx, cur) if head.dtype == F32 and not head.transpose and cx.lower != Lowering.ONNX \
        else None
    return None if hard is None else _Tail(tuple(hard.nodes), ("HardSigmoid", {"alpha": hard.alpha, "beta": hard.beta}))


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


def _affine(head: _Head, steps) -> tuple[np.ndarray, np.ndarray]:
    """The steps composed into one per-channel (scale, shift)."""
    scale, shift = np.ones(head.channels), np.zeros(head.channels)
    for step in steps:
        scale, shift = step.scale * scale, step.scale * shift + step.shift
    return scale, shift


def _fold(head: _Head, steps) -> derive.Folded:
    return derive.fold_affine(head.w, head.bias, *_affine(head, steps), group=head.group, transpose=head.transpose)


def _unsafe_fold(f: _Found, steps: list[_Step]) -> Refused | None:
    """Why folding `steps` into the weights would not compute the same, or None."""
    if not steps:
        return None
    if f.edge is not None:
        return Refused(f.edge)
    if _overflows(f.head, steps):
        return Refused(f"folded weights overflow {f.head.w.dtype}")
    if _underflows(f.head, steps):
        return Refused(f"a folded weight underflows to 0 in {f.head.w.dtype} (its term would be lost, and an "
                       "infinite input would give NaN or 0 where Conv then the scale gives ±inf)")
    return None


def _overflows(head: _Head, steps) -> bool:
    """Whether the folded weights leave the dtype's range (a cheap bound first; folding twice costs time)."""
    s_max, t_max = 1.0, 0.0
    for step in steps:
        s, t = step.scale, step.shift
        s_max, t_max = s_max * float(np.abs(s).max()), float(np.abs(s).max()) * t_max + float(np.abs(t).max())
    b_max = float(np.abs(head.bias).max()) if head.bias is not None else 0.0
    bound = max(float(np.abs(head.w).max()) * s_max, s_max * b_max + t_max)
    return not bound < float(np.finfo(head.w.dtype).max) / 4 and _fold(head, steps).overflow


def _underflows(head: _Head, steps) -> bool:
    """Whether a nonzero folded weight rounds to 0 in the dtype (a cheap bound first)."""
    w = np.abs(head.w[head.w != 0]) if head.w.size else head.w
    if not w.size:
        return False
    s_min = 1.0
    for step in steps:
        s_min *= float(np.abs(step.scale).min())
    finfo = np.finfo(head.w.dtype)
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
        pad = _pad_step(cx, conv, head)
        pad_refusal = pad if isinstance(pad, Refused) else None
        pad = None if pad_refusal is not None else pad
        before = 1 + (pad is not None)
        steps, stop, stopped_at = _affine_steps(cx, conv, head, before)
        cur = steps[-1].node.outputs[0] if steps else conv.outputs[0]
        tail_refusals: list = []
        tail = _residual_step(cx, conv, cur, head, tail_refusals)
        if tail is None:
            tail = _activation_step(cx, conv, cur, head, bool(steps), before + len(steps), tail_refusals)
        edge = range_edge_input(cx.graph, conv.inputs[0]) if steps else None
        cut_tails = tuple(_hard_tail(cx, conv.outputs[0] if k == 0 else steps[k - 1].node.outputs[0], head)
                          for k in range(len(steps)))
        found = _Found(head, pad, pad_refusal, tuple(steps), stop, stopped_at, tail, tuple(tail_refusals), cut_tails,
                       edge, cx.lower)
        return Match("", conv, [conv], data=found)

    def cut(self, m: Match, rules: frozenset[str], limit: int | None) -> Match | None:
        """The chain the enabled rules and the limit keep: the Pad, the steps up to the first one that is off or
        does not fit, the tail after all of them; the refusals met inside that part."""
        f: _Found = m.data
        conv = m.anchor

        def room(members: int, more: int = 0) -> bool:  # one more member (+ `more`) under the group-size limit
            return limit is None or members + more < limit

        refusals: list[Refused] = []
        pad = f.pad if "pad_conv" in rules and room(1) else None
        if f.pad_refusal is not None and "pad_conv" in rules and room(1):
            refusals.append(f.pad_refusal)
        nodes = ([pad[0]] if pad is not None else []) + [conv]
        steps: list[_Step] = []
        for step in f.steps:
            if step.rule not in rules or not room(len(nodes) + len(steps)):
                break
            steps.append(step)
        whole = len(steps) == len(f.steps)
        why = ""
        if whole and f.stop is not None and f.stop.rule in rules and room(len(nodes) + len(steps)):
            refusals.append(f.stop)
            why = str(f.stop) if f.stopped_at else ""
        nodes += [s.node for s in steps]
        tail = f.tail if whole else f.cut_tails[len(steps)]
        if tail is not None and not (tail.allowed(rules, bool(steps)) and room(len(nodes), len(tail.nodes) - 1)):
            tail = None
        if whole:
            for exc, more in f.tail_refusals:
                if exc.rule == "conv_add_act":
                    on = "conv_add_act" in rules
                else:
                    on = ("conv_bn_act" in rules) if steps else bool({"conv_act", "conv_bn_act"} & rules)
                if on and room(len(nodes), more):
                    refusals.append(exc)
        if tail is not None:
            nodes += list(tail.nodes)
        act = tail.act if tail is not None else None
        data = ConvChainData(f.head, pad, tuple(steps), tail.z if tail is not None else None, act)
        if len(nodes) == 1:
            return replace(m, refusals=refusals)
        unsafe = _unsafe_fold(f, steps)
        if unsafe is not None:  # the whole chain refused, with what was refused on the way
            if refusals:
                return replace(m, refusals=refusals + [unsafe])
            raise unsafe
        target = conv_target(act[0] if act else None, f.head.dtype, f.head.transpose, f.lower)
        reason = why or ("single-consumer chain; constant parameters; per-channel affine steps fold into the "
                         "weights" if steps else "single-consumer chain")
        return Match(self._name(data), conv, nodes, reason, target.op, target.kernels, data=data,
                     kernel=target.kernel, activation=act[0] if act else None, refusals=refusals)

    @staticmethod
    def _name(d: ConvChainData) -> str:
        if d.z is not None:
            return "conv_add_act"
        if d.act is not None:
            return "conv_bn_act" if d.steps else "conv_act"
        if any(s.node.op_type == "BatchNormalization" for s in d.steps):
            return d.head.bn_rule
        return "conv_scale_bias" if d.steps else "pad_conv"

    def rewrite(self, cx, m: Match) -> list[ir.Node]:
        d: ConvChainData = m.data
        conv, head = m.anchor, d.head
        x = d.pad[0].inputs[0] if d.pad is not None else conv.inputs[0]
        if d.steps:
            folded = _fold(head, d.steps)
            wv = cx.initializer(f"{conv.name}_W_fused", folded.weight)
            bv = cx.initializer(f"{conv.name}_B_fused", folded.bias)
        else:
            wv = conv.inputs[1]
            bv = conv.inputs[2] if len(conv.inputs) > 2 else None
        attrs = copy_attrs(conv)
        if d.pad is not None:
            attrs["pads"] = d.pad[1]
        inputs = [x, wv] + ([bv] if bv is not None else [])
        if d.z is not None:
            if bv is None:  # Z is input 3: a bias must stand in slot 2
                inputs.append(cx.initializer(f"{conv.name}_B_zero", np.zeros(head.channels, dtype=head.dtype)))
            inputs.append(d.z)
        if m.lowered_to == "com.microsoft:FusedConv":
            op, params = d.act
            attrs["activation"] = op
            vals = [params[k] for k, _ in FUSED_CONV_ACTIVATIONS[op]] if op != "Clip" else [params["min"], params["max"]]
            if vals:
                attrs["activation_params"] = [float(v) for v in vals]
            return [cx.node("FusedConv", inputs, attrs, domain="com.microsoft", base=f"{conv.name}_fused")]
        out = [cx.node(conv.op_type, inputs, attrs, base=f"{conv.name}_fused")]
        if d.act is not None and d.act[0] == "SiLU":
            out.append(cx.node("QuickGelu", [out[0].outputs[0]], {"alpha": 1.0}, domain="com.microsoft",
                               base=f"{conv.name}_silu"))
        elif d.act is not None:
            a = m.nodes[-1]
            out.append(cx.node(a.op_type, [out[0].outputs[0]] + list(a.inputs[1:]), copy_attrs(a),
                               base=f"{a.name}_after_fold"))
        return out
