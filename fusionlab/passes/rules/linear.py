"""MatMul / Gemm chains: MatMul [Add | BatchNormalization] [activation],  Gemm [BatchNormalization] [activation].

- ``matmul_add_gemm``: MatMul + Add of a bias that broadcasts to (M, N) without growing it -> Gemm (2-D only);
- ``matmul_bn`` / ``gemm_bn``: BatchNormalization over the output columns folds into the weight and bias;
- ``gemm_act``: an activation the CPU FusedGemm kernel supports -> ``com.microsoft:FusedGemm``.

The matcher finds the whole chain whichever rules are on; `LinearChain.cut` keeps the bias or BN step only when
its rule is on, and the activation only with ``gemm_act`` after a kept step (or after a Gemm itself).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx_ir as ir

from ...analysis import derive
from ...analysis.legality import matmul_bn_legal
from ..engine import Match, Refused, Rule, attr, consumers, copy_attrs, is_op, next_reader, sole_consumer
from ..lowering import FUSED_GEMM_ACTIVATIONS, float16_refusal, gemm_target
from ..options import Lowering
from .common import F32, FLOATS, activation, bn_affine

__all__ = ["LinearChain"]


def _bias_ok_for(c_shape: tuple, m, n) -> bool:
    """Whether a bias of shape c_shape broadcasts unidirectionally to (M, N) without growing it."""
    if len(c_shape) > 2:
        return False
    padded = (1,) * (2 - len(c_shape)) + tuple(c_shape)
    return all(d == 1 or (full is not None and d == full) for d, full in zip(padded, (m, n)))


@dataclass(frozen=True, eq=False)
class _Head:
    """The MatMul/Gemm's dtype, output size (m, n) when known, and constant weight."""

    dtype: np.dtype
    gemm: bool
    two_d: bool
    trans_b: int
    m: int | None
    n: int | None
    w: np.ndarray | None


@dataclass(frozen=True, eq=False)
class LinearData:
    """What the rewrite needs: the bias Add and its C, or the folded BN (node, weight, C), and the activation."""

    head: _Head
    add: tuple[ir.Node, ir.Value] | None
    bn: tuple[ir.Node, np.ndarray, np.ndarray] | None
    act: tuple[str, dict] | None


@dataclass(frozen=True, eq=False)
class _Found:
    """The whole chain before `LinearChain.cut`: the step after the op (refused or not) and the activation."""

    head: _Head
    step: tuple | None  # (Add, C) or (BN, weight, C)
    step_rule: str  # the rule the step's node belongs to ("" when there is no step node)
    step_refusal: Refused | None
    near: Refused | None  # the op's output read elsewhere while a step could follow
    act: tuple[ir.Node, tuple[str, dict]] | None
    act_refusals: tuple[Refused, ...]


def _head(cx, node: ir.Node) -> _Head | None:
    if len(node.outputs) != 1 or len(node.inputs) < 2 or any(v is None for v in node.inputs[:2]):
        return None
    a, b = node.inputs[0], node.inputs[1]
    dt = cx.dtype(a)
    if dt not in FLOATS or cx.dtype(b) != dt:
        return None
    is_gemm = node.op_type == "Gemm"
    a_shape, b_shape = cx.shape(a), cx.shape(b)
    two_d = a_shape is not None and b_shape is not None and len(a_shape) == 2 and len(b_shape) == 2
    trans_a = int(attr(node, "transA", 0)) if is_gemm else 0
    trans_b = int(attr(node, "transB", 0)) if is_gemm else 0
    m = n = None
    if two_d:
        m = a_shape[1] if trans_a else a_shape[0]
        n = b_shape[0] if trans_b else b_shape[1]
    w = cx.constant(b)
    if w is not None and w.ndim == 2:
        n = w.shape[0] if trans_b else w.shape[1]
    return _Head(dt, is_gemm, two_d, trans_b, m, n, w)


def _bias_step(cx, node: ir.Node, nxt: ir.Node, head: _Head):
    """(Add, C) when MatMul's output gets a bias that Gemm's C can hold."""
    cur = node.outputs[0]
    others = [v for v in nxt.inputs if v is not cur]
    if len(nxt.inputs) != 2 or len(others) != 1 or cx.dtype(others[0]) != head.dtype:
        return None
    cs = cx.shape(others[0])
    if cs is None or None in cs or not _bias_ok_for(cs, head.m, head.n):
        raise Refused(f"Add operand shape {cs} is not broadcastable to (M, N) = ({head.m}, {head.n})")
    return nxt, others[0]


def _bn_step(cx, node: ir.Node, bn: ir.Node, head: _Head):
    """(BN, folded weight, folded C) when BatchNormalization over the columns folds into the weight."""
    verdict = matmul_bn_legal(cx.graph, node, bn, cx.info.symbolic_shapes)
    if not verdict.ok:
        raise Refused(str(verdict.reason))
    w = head.w
    if w is None:
        raise Refused("weight is not a constant")
    c = None
    if head.gemm and len(node.inputs) > 2 and node.inputs[2] is not None:
        c = cx.constant(node.inputs[2])
        if c is None:
            raise Refused("Gemm C is not a constant")
    s, t = bn_affine(cx, bn)
    folded = derive.fold_linear_affine(w, None, s, t, trans_b=bool(head.trans_b))
    beta = float(attr(node, "beta", 1.0)) if head.gemm else 1.0
    new_c = t if c is None else beta * c.astype(np.float64) * s + t
    if folded.overflow or not np.all(np.isfinite(new_c)) or np.any(np.abs(new_c) > np.finfo(w.dtype).max):
        raise Refused(f"folded weights overflow {w.dtype}")
    return bn, folded.weight, new_c.astype(w.dtype)


class LinearChain(Rule):
    """MatMul + bias -> Gemm; MatMul/Gemm + BN folded; Gemm + activation -> FusedGemm."""

    names = ("matmul_add_gemm", "matmul_bn", "gemm_bn", "gemm_act")
    anchors = ("MatMul", "Gemm")

    def match(self, cx, node: ir.Node) -> Match | None:
        def follows(n: ir.Node) -> bool:
            return n.domain in ("", "ai.onnx") and n.op_type in ("Add", "BatchNormalization", *FUSED_GEMM_ACTIVATIONS)

        out = node.outputs[0] if len(node.outputs) == 1 else None
        head = _head(cx, node)
        if out is None or head is None:
            return None
        nxt = next((n for n in consumers(out) if follows(n)), None)
        near = None
        if nxt is not None and (head.gemm or head.two_d):  # a second reader / graph output is a near miss
            rule = {"Add": "matmul_add_gemm", "BatchNormalization": "gemm_bn" if head.gemm else "matmul_bn"}
            first = next_reader(cx, out, rule.get(nxt.op_type, "gemm_act"), node, follows, 1)
            if isinstance(first, Refused):
                near, first = first, None
        else:
            first = sole_consumer(out)
        if first is None or not cx.free(first) or not follows(first):
            return Match("", node, [node], refusals=[near] if near is not None else [])
        if not head.gemm and not head.two_d:
            if is_op(first, "Add", "BatchNormalization"):
                ranks = [cx.rank(v) for v in node.inputs[:2]]
                raise Refused("MatMul operands are not both known rank 2 (Gemm needs 2-D)",
                              condition="both MatMul operands of known rank 2 (Gemm is 2-D)",
                              found="ranks " + " and ".join("unknown" if r is None else str(r) for r in ranks),
                              matched=2)
            return None
        step, step_rule, step_refusal = None, "", None
        bn_rule = "gemm_bn" if head.gemm else "matmul_bn"
        try:
            if not head.gemm and is_op(first, "Add"):
                step_rule = "matmul_add_gemm"
                step = _bias_step(cx, node, first, head)
            elif is_op(first, "BatchNormalization") and first.inputs[0] is node.outputs[0] and isinstance(head.n, int):
                step_rule = bn_rule
                step = _bn_step(cx, node, first, head)
        except Refused as exc:
            reason = str(exc) if not is_op(first, "BatchNormalization") else f"BN not folded: {exc}"
            step_refusal = Refused(reason).at(step_rule, node)
        last = step[0] if step is not None else node
        act_refusals: list[Refused] = []
        act = self._activation(cx, node, last, head, act_refusals, 2 if step is not None else 1)
        return Match("", node, [node], data=_Found(head, step, step_rule, step_refusal, near, act, tuple(act_refusals)))

    @staticmethod
    def _activation(cx, node: ir.Node, last: ir.Node, head: _Head, refusals: list, matched: int):
        """(node, (op, params)) of an activation FusedGemm takes after `last`; its near misses into `refusals`."""
        if cx.lower == Lowering.ONNX:
            return None
        if float16_refusal("com.microsoft:FusedGemm", head.dtype):
            after = next((n for n in consumers(last.outputs[0])
                          if activation(cx, n, FUSED_GEMM_ACTIVATIONS) is not None), None)
            if after is not None:
                refusals.append(float16_refusal("com.microsoft:FusedGemm", head.dtype,
                                                f"float16 {after.op_type} {after.name}").at("gemm_act", node))
            return None
        if head.dtype != F32:
            return None
        nxt = next_reader(cx, last.outputs[0], "gemm_act", node,
                          lambda n: activation(cx, n, FUSED_GEMM_ACTIVATIONS) is not None, matched)
        if isinstance(nxt, Refused):
            refusals.append(nxt)
            return None
        if nxt is None or not cx.free(nxt):
            return None
        found = activation(cx, nxt, FUSED_GEMM_ACTIVATIONS)
        return (nxt, found) if found is not None and found[0] != "Clip" else None

    def cut(self, m: Match, rules: frozenset[str], limit: int | None) -> Match | None:
        """The step only with its rule on (and room for it), the activation only with gemm_act after a kept step."""
        f: _Found | None = m.data
        if f is None:
            return replace(m, refusals=[r for r in m.refusals if r.rule in rules])
        node, head = m.anchor, f.head
        refusals = [f.near] if f.near is not None and f.near.rule in rules else []
        on = f.step_rule in rules and (limit is None or 1 < limit)
        if f.step_refusal is not None and on:
            refusals.append(f.step_refusal)
        step = f.step if on else None
        nodes = [node] + ([step[0]] if step is not None else [])
        act = None
        if "gemm_act" in rules and (limit is None or len(nodes) < limit) and (step is not None or not f.step_rule):
            refusals += f.act_refusals
            act = f.act
        if act is not None:
            nodes.append(act[0])
        add = step if step is not None and len(step) == 2 else None
        bn = step if step is not None and len(step) == 3 else None
        if len(nodes) == 1 or (head.gemm and act is None and bn is None):
            return replace(m, nodes=[node], data=None, refusals=refusals)
        rule = "gemm_act" if act else (f.step_rule if bn else "matmul_add_gemm")
        target = gemm_target(act[1][0] if act else None)
        reason = str(f.step_refusal) if f.step_refusal is not None and on else ""
        return Match(rule, node, nodes, reason or "rank-2 operands; bias broadcasts to (M, N); single consumers",
                     target.op, target.kernels, data=LinearData(head, add, bn, act and act[1]),
                     activation=act[1][0] if act else None, refusals=refusals)

    def rewrite(self, cx, m: Match) -> list[ir.Node]:
        node, d = m.anchor, m.data
        attrs = copy_attrs(node) if d.head.gemm else {}
        inputs = [node.inputs[0]]
        if d.bn is not None:
            inputs += [cx.initializer(f"{node.name}_W_fused", d.bn[1]), cx.initializer(f"{node.name}_C_fused", d.bn[2])]
            attrs["beta"] = 1.0
        else:
            inputs.append(node.inputs[1])
            if d.add is not None:
                inputs.append(d.add[1])
            elif d.head.gemm and len(node.inputs) > 2 and node.inputs[2] is not None:
                inputs.append(node.inputs[2])
        if d.act is None:
            return [cx.node("Gemm", inputs, attrs, base=f"{node.name}_gemm")]
        op, params = d.act
        attrs["activation"] = op
        for k, v in params.items():
            attrs[f"activation_{k}"] = float(v)
        return [cx.node("FusedGemm", inputs, attrs, domain="com.microsoft", base=f"{node.name}_fused")]
