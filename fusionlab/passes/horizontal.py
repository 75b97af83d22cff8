"""Horizontal fusion: sibling ops that read the same tensor become one wide op plus a `Split`.

Siblings are Conv (or onnxruntime's `FusedConv`), MatMul or Gemm nodes that take the same data input
and have constant weights. Conv weights stack on the output-channel axis, MatMul/Gemm weights on the
output axis (`fusionlab.analysis.derive.concat_conv_weights` / `concat_matmul_weights` say why that is exact).
The ops that follow every branch in the same way ride along when they are per-channel too: a constant
bias `Add`, an inference-mode `BatchNormalization`, an activation with equal attributes. BERT's Q/K/V
projections (three MatMul+Add) become one MatMul, one Add and a Split; Inception's 1x1 branches
(Conv+BN+Relu) one Conv, one BN, one Relu and a Split.

Legality, checked for every candidate set (a set that fails is left alone, with a refusal):
- weights, biases and BN parameters are constants (not overridable initializers);
- equal attributes (kernel, strides, pads, dilations, group = 1), equal weight shape beyond the output
  axis, equal dtypes;
- no sibling depends on another (fusing them would create a cycle);
- every rewritten intermediate has one consumer and is not a graph output; the values the branches
  hand on keep their names, so graph outputs and all downstream consumers are untouched.

The rule is anchored on the first sibling (in execution order); applying a plan re-derives the sibling
set from that anchor over exactly the group's nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx
import onnx_ir as ir

from ..analysis import derive
from ..graph import Graph
from ..plan import FusionPlan, HORIZONTAL
from . import engine
from .engine import Match, Refused, Rule, consumers, copy_attrs
from .options import check_options

__all__ = ["plan", "apply", "OPTIONS", "DEFAULT_MIN_BRANCHES", "Siblings"]

#: TVM's CombineParallelConv2D defaults to 3; two siblings already share one read of the input here.
DEFAULT_MIN_BRANCHES = 2
OPTIONS = {"min_branches": DEFAULT_MIN_BRANCHES, "dims": None}

_ACTIVATIONS = {"Relu", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "HardSigmoid", "Softplus", "Gelu"}
_DEFAULT = ("", "ai.onnx")


def _plain(value):
    """An attribute value in a form that compares by meaning: float32 floats, tuples, str."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, float):
        return float(np.float32(value))
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    return value


def _attrs(node: ir.Node, weight_shape: tuple | None = None) -> tuple:
    """The node's attributes with every default it leaves out written in, so that siblings that spell one
    convolution differently (`strides=[1, 1]` written, or left to its default) compare equal.

    The defaults are the ONNX schema's (at the model's opset), and for a convolution the ones its schema states in
    prose: strides and dilations 1, pads 0 and the kernel shape of its weight."""
    values = {k: _plain(a.value) for k, a in node.attributes.items()}
    domain = node.domain or ""
    if domain in _DEFAULT:
        graph = node.graph
        opsets = graph.opset_imports if graph is not None else {}
        version = opsets.get("", opsets.get("ai.onnx", onnx.defs.onnx_opset_version()))
        try:
            schema = onnx.defs.get_schema(node.op_type, version, "")
        except onnx.defs.SchemaError:
            schema = None
        for name, a in (schema.attributes.items() if schema is not None else ()):
            if name not in values and a.default_value.name:
                values[name] = _plain(onnx.helper.get_attribute_value(a.default_value))
    if node.op_type in ("Conv", "FusedConv") and weight_shape is not None and len(weight_shape) > 2:
        nd = len(weight_shape) - 2
        values.setdefault("kernel_shape", tuple(weight_shape[2:]))
        values.setdefault("strides", (1,) * nd)
        values.setdefault("dilations", (1,) * nd)
        values.setdefault("pads", (0,) * (2 * nd))
        values.setdefault("group", 1)
        values.setdefault("auto_pad", "NOTSET")
    return tuple(sorted((k, repr(v)) for k, v in values.items()))


def _int_attr(node: ir.Node, name: str, default: int) -> int:
    a = node.attributes.get(name)
    return default if a is None else int(a.value)


def _anchor_key(cx, node: ir.Node, v: ir.Value):
    """(family, key) for a node reading `v` as its data input, or Refused with why it is no candidate."""
    if not node.inputs or node.inputs[0] is not v or any(x is v for x in node.inputs[1:]):
        raise Refused("reads the shared tensor in a non-data position")
    op, dom = node.op_type, node.domain
    if len(node.outputs) != 1:
        raise Refused("has several outputs")
    w = cx.constant(node.inputs[1]) if len(node.inputs) > 1 else None
    if w is None:
        raise Refused("weight is not a constant")
    if (op == "Conv" and dom in _DEFAULT) or (op == "FusedConv" and dom == "com.microsoft"):
        if len(node.inputs) > 3 and node.inputs[3] is not None:
            raise Refused("FusedConv with a sum input")
        b = node.inputs[2] if len(node.inputs) > 2 else None
        if b is not None and cx.constant(b) is None:
            raise Refused("bias is not a constant")
        if _int_attr(node, "group", 1) != 1:
            raise Refused("grouped convolution", condition="an ungrouped convolution (group=1)",
                          found=f"group={_int_attr(node, 'group', 1)}")
        auto = node.attributes.get("auto_pad")
        if auto is not None and auto.value not in ("NOTSET", b"NOTSET"):
            raise Refused("auto_pad")
        return "conv", (dom, op, str(w.dtype), w.shape[1:], _attrs(node, w.shape))
    if op == "MatMul" and dom in _DEFAULT:
        if w.ndim != 2:
            raise Refused("weight is not 2-D")
        return "matmul", ("MatMul", str(w.dtype), w.shape[0])
    if op == "Gemm" and dom in _DEFAULT:
        c = node.inputs[2] if len(node.inputs) > 2 else None
        if c is not None:
            cv = cx.constant(c)
            if cv is None:
                raise Refused("bias is not a constant")
            if cv.ndim == 2 and cv.shape[0] != 1:
                raise Refused("bias varies along rows")
        k = w.shape[1] if _int_attr(node, "transB", 0) else w.shape[0]
        return "gemm", ("Gemm", str(w.dtype), k, _attrs(node))
    return None, None


def _per_channel(c: np.ndarray, rank: int | None, family: str, channels: int) -> np.ndarray | None:
    """The (channels,) vector an Add of constant `c` adds along a branch's channel axis, or None if it does more.

    `c` broadcasts against the branch output (rank `rank`, channels on axis 1 for conv, on the last axis for
    MatMul/Gemm). It is a per-channel add only if it has no more dimensions than the output (or the Add
    would grow the shape), every dimension but the channel one is 1, and that one is 1 or `channels`.
    """
    if rank is None or c.ndim > rank:
        return None
    full = (1,) * (rank - c.ndim) + tuple(c.shape)
    axis = 1 if family == "conv" else rank - 1
    if axis >= rank or any(d != 1 for i, d in enumerate(full) if i != axis) or full[axis] not in (1, channels):
        return None
    return np.broadcast_to(c.reshape(-1), (channels,))


def _follower(cx, value: ir.Value, family: str, rank: int | None, channels: int):
    """(node, key) of the single per-channel op that follows `value`, or (None, None)."""
    users = consumers(value)
    if value.is_graph_output() or len(users) != 1 or not cx.free(users[0]):
        return None, None
    n = users[0]
    if n.domain not in _DEFAULT or len(n.outputs) != 1:
        return None, None
    if n.op_type in _ACTIVATIONS and len(n.inputs) == 1:
        return n, (n.op_type, _attrs(n))
    if n.op_type == "BatchNormalization" and family == "conv" and n.inputs[0] is value:
        if _int_attr(n, "training_mode", 0) != 0 or len(n.inputs) != 5 or len(n.outputs) != 1:
            return None, None
        if any(cx.constant(p) is None for p in n.inputs[1:5]):
            return None, None
        return n, ("BatchNormalization", _attrs(n))
    if n.op_type == "Add" and len(n.inputs) == 2:
        other = engine.other_input(n, value)
        c = cx.constant(other) if other is not None else None
        if c is None or _per_channel(c, rank, family, channels) is None:
            return None, None
        return n, ("Add", str(c.dtype))
    return None, None


def _depends(a: ir.Node, b: ir.Node) -> bool:
    """Whether node b (transitively) reads something node a computes."""
    stack, seen = [a], set()
    while stack:
        n = stack.pop()
        for out in n.outputs:
            for c in Graph.consumers(out):
                if c is b:
                    return True
                if id(c) not in seen:
                    seen.add(id(c))
                    stack.append(c)
    return False


def _independent(nodes: list[ir.Node]) -> bool:
    return not any(_depends(a, b) for a in nodes for b in nodes if a is not b)


def _out_sizes(cx, anchors: list[ir.Node], family: str) -> list[int]:
    out = []
    for a in anchors:
        w = cx.constant(a.inputs[1])
        if family == "gemm" and _int_attr(a, "transB", 0):
            out.append(int(w.shape[0]))
        elif family in ("matmul", "gemm"):
            out.append(int(w.shape[1]))
        else:
            out.append(int(w.shape[0]))
    return out


def _out_rank(cx, anchor: ir.Node, family: str) -> int | None:
    """Rank of an anchor's output: the weight's for Conv, 2 for Gemm, the data input's for MatMul."""
    if family == "conv":
        return int(cx.constant(anchor.inputs[1]).ndim)
    if family == "gemm":
        return 2
    r = cx.rank(anchor.inputs[0])
    return r if r is not None and r >= 2 else None


def _chains(cx, anchors: list[ir.Node], family: str, rank: int | None, sizes: list[int]) -> list[list[ir.Node]]:
    """Each branch: anchor plus the common prefix of followers all branches share."""
    chains = [[a] for a in anchors]
    while True:
        step = [_follower(cx, c[-1].outputs[0], family, rank, size) for c, size in zip(chains, sizes)]
        if any(n is None for n, _ in step) or len({k for _, k in step}) != 1:
            return chains
        for c, (n, _) in zip(chains, step):
            c.append(n)


@dataclass(frozen=True, eq=False)
class SiblingsData:
    """The branches (anchor + common followers each), their family, output rank and sizes, the shared input, and
    the id of the group being written (names its new nodes; set when applying)."""

    chains: tuple[tuple[ir.Node, ...], ...]
    family: str
    rank: int | None
    sizes: tuple[int, ...]
    input: ir.Value
    gid: str = ""


class Siblings(Rule):
    """Siblings reading one tensor with constant weights and equal attributes -> one wide op (+ followers) + Split."""

    names = ("concat_conv", "concat_matmul")
    anchors = ("Conv", "FusedConv", "MatMul", "Gemm")
    domains = ("", "ai.onnx", "com.microsoft")
    same_shape = False

    def __init__(self, min_branches: int = DEFAULT_MIN_BRANCHES):
        self.min_branches = min_branches

    def match(self, cx, anchor: ir.Node) -> Match | None:
        v = anchor.inputs[0] if anchor.inputs else None
        if v is None or len(consumers(v)) < self.min_branches:
            return None
        family, key = _anchor_key(cx, anchor, v)
        if family is None:
            return None
        order = {id(n): i for i, n in enumerate(cx.graph.topological_order())}
        siblings = []
        for u in consumers(v):
            if u is anchor or not cx.free(u):
                continue
            try:
                if _anchor_key(cx, u, v) == (family, key):
                    siblings.append(u)
            except Refused:
                continue
        if any(order[id(u)] < order[id(anchor)] for u in siblings):
            return None  # the first sibling anchors the group
        anchors = [anchor] + sorted(siblings, key=lambda u: order[id(u)])
        if len(anchors) < self.min_branches:
            return None
        if not _independent(anchors):
            raise Refused(f"siblings of {v.name} depend on each other: not fused (would create a cycle)")
        sizes = _out_sizes(cx, anchors, family)
        rank = _out_rank(cx, anchor, family)
        chains = _chains(cx, anchors, family, rank, sizes)
        in_bytes = cx.nbytes(v)
        out_bytes = sum(cx.nbytes(c[-1].outputs[0]) for c in chains)
        return Match(f"concat_{'conv' if family == 'conv' else 'matmul'}", anchor, [n for c in chains for n in c],
                     lowered_to="+".join(n.op_type for n in chains[0]) + "+Split",
                     reason=f"{len(anchors)} siblings read {v.name} with constant weights and equal attributes; "
                     f"none depends on another", kernels=len(chains[0]) + 1,
                     # the shared input is read once instead of n times; the Split writes and reads the outputs once more
                     saved_bytes=(len(anchors) - 1) * in_bytes - 2 * out_bytes,
                     outputs=[c[-1].outputs[0] for c in chains],
                     data=SiblingsData(tuple(tuple(c) for c in chains), family, rank, tuple(sizes), v))

    def rewrite(self, cx, m: Match) -> list[ir.Node]:
        d: SiblingsData = m.data
        chains, family, gid = d.chains, d.family, d.gid
        anchors = [c[0] for c in chains]
        new_nodes = [self._wide_anchor(cx, anchors, family, gid)]
        for pos in range(1, len(chains[0])):
            new_nodes.append(self._wide_follower(cx, [c[pos] for c in chains], new_nodes[-1].outputs[0], m, pos))
        split_in = [new_nodes[-1].outputs[0]]
        attrs = {"axis": 1 if family == "conv" else -1}
        if cx.graph.opset >= 13:
            split_in.append(cx.initializer(f"{gid}_split", np.array(d.sizes, dtype=np.int64)))
        else:
            attrs["split"] = list(d.sizes)
        new_nodes.append(cx.node("Split", split_in, attrs, base=f"{gid}/Split", num_outputs=len(chains)))
        m.lowered_to = "+".join(n.op_type for n in new_nodes)
        return new_nodes

    @staticmethod
    def _wide_anchor(cx, anchors: list[ir.Node], family: str, gid: str) -> ir.Node:
        a0 = anchors[0]
        weights = [cx.constant(a.inputs[1]) for a in anchors]
        biases = [cx.constant(a.inputs[2]) if len(a.inputs) > 2 and a.inputs[2] is not None else None for a in anchors]
        if family == "conv":
            w, b, _ = derive.concat_conv_weights(weights, biases)
        else:
            trans_b = family == "gemm" and bool(_int_attr(a0, "transB", 0))
            w, b, _ = derive.concat_matmul_weights(weights, biases if family == "gemm" else None, trans_b=trans_b)
        inputs = [a0.inputs[0], cx.initializer(f"{gid}_W", w)]
        if b is not None:
            inputs.append(cx.initializer(f"{gid}_B", b))
        return cx.node(a0.op_type, inputs, copy_attrs(a0), domain=a0.domain, base=f"{gid}/{a0.op_type}")

    @staticmethod
    def _wide_follower(cx, ops: list[ir.Node], x: ir.Value, m: Match, pos: int) -> ir.Node:
        f0 = ops[0]
        d: SiblingsData = m.data
        gid, family, rank, sizes = d.gid, d.family, d.rank, d.sizes
        if f0.op_type == "BatchNormalization":
            params = [np.concatenate([cx.constant(n.inputs[j]).reshape(-1) for n in ops]) for j in range(1, 5)]
            ins = [x] + [cx.initializer(f"{gid}_bn{pos}_{j}", p) for j, p in enumerate(params)]
        elif f0.op_type == "Add":
            prev = {id(c[pos - 1].outputs[0]) for c in d.chains}
            arrays = [cx.constant(n.inputs[1] if id(n.inputs[0]) in prev else n.inputs[0]) for n in ops]
            c = np.concatenate([_per_channel(a, rank, family, size) for a, size in zip(arrays, sizes)])
            if family == "conv":  # channels on axis 1 of the rank-`rank` output: shape (C, 1, ..., 1)
                c = c.reshape((c.shape[0],) + (1,) * (rank - 2))
            ins = [x, cx.initializer(f"{gid}_add{pos}", c.astype(arrays[0].dtype))]
        else:
            ins = [x]
        return cx.node(f0.op_type, ins, copy_attrs(f0), domain=f0.domain, base=f"{gid}/{f0.op_type}_{pos}")

    def outputs(self, m: Match, new_nodes: list[ir.Node]) -> list[tuple[ir.Value, ir.Value]]:
        return list(zip(m.handed_on(), new_nodes[-1].outputs))


def _resolve(options: dict) -> dict:
    opts = {**OPTIONS, **check_options("horizontal", options, OPTIONS)}
    if opts["min_branches"] < 2:
        raise ValueError(f"min_branches must be >= 2, got {opts['min_branches']}")
    return opts


def plan(graph: Graph, **options) -> FusionPlan:
    """Find sibling Conv/MatMul/Gemm sets (with their common followers) that may become one op + Split."""
    opts = _resolve(options)
    cx = engine.Context(graph, dims=opts["dims"], rules=Siblings.names)
    result = FusionPlan(model=graph.name, options={"horizontal": opts})
    for k, m in enumerate(engine.find(cx, [Siblings(opts["min_branches"])])):
        group = engine.to_group(cx, m, f"horizontal{k}", HORIZONTAL)
        d: SiblingsData = m.data
        group.extra = {"input": d.input.name, "branches": [[n.name for n in c] for c in d.chains],
                       "split": list(d.sizes), "family": d.family}
        result.add(group)
    result.refusals = sorted(set(cx.refusals), key=lambda r: (r.node, r.rule, r.reason))
    result.notes.extend(f"horizontal: {r.node}: not a candidate ({r.reason})" for r in result.refusals)
    return result


def apply(graph: Graph, fplan: FusionPlan, **options) -> FusionPlan:
    """Rewrite every horizontal group of the plan into one wide op (+ followers) and a Split, in place; returns
    the groups as written (`engine.written`: what each was lowered to), the plan itself unchanged."""
    groups = engine.written(fplan, [g for g in fplan if g.kind == HORIZONTAL])
    if not len(groups):
        return groups
    opts = _resolve({**fplan.options.get("horizontal", {}), **options})
    cx = engine.Context(graph, dims=opts["dims"], rules=Siblings.names)
    rule = Siblings(opts["min_branches"])
    index = engine.node_index(graph)
    for group in groups:
        m = engine.recheck(cx, rule, group, index)
        m.data = replace(m.data, gid=group.id)
        new_nodes = rule.rewrite(cx, m)
        engine.replace(cx, m, new_nodes, rule.outputs(m, new_nodes), same_shape=False)
        for old in m.nodes:
            index.pop(old.name, None)
        index.update((n.name, n) for n in new_nodes)
        group.lowered_to = m.lowered_to
    engine.import_domains(graph)
    return groups
