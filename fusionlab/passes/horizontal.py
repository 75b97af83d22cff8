"""Horizontal fusion: sibling ops that read the same tensor become one wide op plus a `Split`.

Siblings are Conv (or onnxruntime's `FusedConv`), MatMul or Gemm nodes that take the same data input
and have constant weights. Conv weights stack on the output-channel axis, MatMul/Gemm weights on the
output axis (`fusionlab.derive.concat_conv_weights` / `concat_matmul_weights` say why that is exact).
The ops that follow every branch in the same way ride along when they are per-channel too: a constant
bias `Add`, an inference-mode `BatchNormalization`, an activation with equal attributes. BERT's Q/K/V
projections (three MatMul+Add) become one MatMul, one Add and a Split; Inception's 1x1 branches
(Conv+BN+Relu) one Conv, one BN, one Relu and a Split.

Legality, checked for every candidate set (a set that fails is left alone, with a note):
- weights, biases and BN parameters are constants (not overridable initializers);
- equal attributes (kernel, strides, pads, dilations, group = 1), equal weight shape beyond the output
  axis, equal dtypes;
- no sibling depends on another (fusing them would create a cycle);
- every rewritten intermediate has one consumer and is not a graph output; the values the branches
  hand on keep their names, so graph outputs and all downstream consumers are untouched.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .. import derive
from ..graph import Graph
from ..plan import HORIZONTAL, FusionGroup, FusionPlan
from ..shapes import infer_shapes

__all__ = ["plan", "apply", "DEFAULT_MIN_BRANCHES"]

#: TVM's CombineParallelConv2D defaults to 3; two siblings already share one read of the input here.
DEFAULT_MIN_BRANCHES = 2

_ACTIVATIONS = {"Relu", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "HardSigmoid", "Softplus", "Gelu"}
_DEFAULT = ("", "ai.onnx")


def _attrs(node: ir.Node) -> tuple:
    return tuple(sorted((k, repr(a.value)) for k, a in node.attributes.items()))


def _const(graph: Graph, v: ir.Value | None) -> np.ndarray | None:
    return None if v is None else graph.constant(v)


def _int_attr(node: ir.Node, name: str, default: int) -> int:
    a = node.attributes.get(name)
    return default if a is None else int(a.value)


# --------------------------------------------------------------------------------------------------
# candidates
# --------------------------------------------------------------------------------------------------

def _anchor_key(graph: Graph, node: ir.Node, v: ir.Value):
    """(family, key, why-not) for a node reading `v` as its data input."""
    if not node.inputs or node.inputs[0] is not v or any(x is v for x in node.inputs[1:]):
        return None, None, "reads the shared tensor in a non-data position"
    op, dom = node.op_type, node.domain
    if len(node.outputs) != 1:
        return None, None, "has several outputs"
    if (op == "Conv" and dom in _DEFAULT) or (op == "FusedConv" and dom == "com.microsoft"):
        if len(node.inputs) > 3 and node.inputs[3] is not None:
            return None, None, "FusedConv with a sum input"
        w = _const(graph, node.inputs[1] if len(node.inputs) > 1 else None)
        if w is None:
            return None, None, "weight is not a constant"
        b = node.inputs[2] if len(node.inputs) > 2 else None
        if b is not None and _const(graph, b) is None:
            return None, None, "bias is not a constant"
        if _int_attr(node, "group", 1) != 1:
            return None, None, "grouped convolution"
        auto = node.attributes.get("auto_pad")
        if auto is not None and auto.value not in ("NOTSET", b"NOTSET"):
            return None, None, "auto_pad"
        return "conv", (dom, op, str(w.dtype), w.shape[1:], _attrs(node)), ""
    if op == "MatMul" and dom in _DEFAULT:
        w = _const(graph, node.inputs[1])
        if w is None:
            return None, None, "weight is not a constant"
        if w.ndim != 2:
            return None, None, "weight is not 2-D"
        return "matmul", ("MatMul", str(w.dtype), w.shape[0]), ""
    if op == "Gemm" and dom in _DEFAULT:
        w = _const(graph, node.inputs[1])
        if w is None:
            return None, None, "weight is not a constant"
        c = node.inputs[2] if len(node.inputs) > 2 else None
        if c is not None:
            cv = _const(graph, c)
            if cv is None:
                return None, None, "bias is not a constant"
            if cv.ndim == 2 and cv.shape[0] != 1:
                return None, None, "bias varies along rows"
        trans_b = _int_attr(node, "transB", 0)
        k = w.shape[1] if trans_b else w.shape[0]
        return "gemm", ("Gemm", str(w.dtype), k, _attrs(node)), ""
    return None, None, ""


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


def _follower(graph: Graph, value: ir.Value, family: str, rank: int | None = None, channels: int = 0):
    """(node, key) of the single per-channel op that follows `value`, or (None, None).

    `rank` and `channels` describe this branch's output (needed to prove an Add adds per channel)."""
    if value.is_graph_output():
        return None, None
    users = Graph.consumers(value)
    if len(users) != 1:
        return None, None
    n = users[0]
    if n.domain not in _DEFAULT or len(n.outputs) != 1:
        return None, None
    if n.op_type in _ACTIVATIONS and len(n.inputs) == 1:
        return n, (n.op_type, _attrs(n))
    if n.op_type == "BatchNormalization" and family == "conv" and n.inputs[0] is value:
        if _int_attr(n, "training_mode", 0) != 0:
            return None, None
        params = [_const(graph, p) for p in n.inputs[1:5]]
        if any(p is None for p in params):
            return None, None
        return n, ("BatchNormalization", _attrs(n))
    if n.op_type == "Add" and len(n.inputs) == 2:
        other = n.inputs[1] if n.inputs[0] is value else n.inputs[0]
        if other is value:
            return None, None
        c = _const(graph, other)
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


def _out_rank(graph: Graph, anchor: ir.Node, family: str, shapes: dict) -> int | None:
    """Rank of an anchor's output: the weight's for Conv, 2 for Gemm, the data input's for MatMul."""
    if family == "conv":
        return int(graph.constant(anchor.inputs[1]).ndim)
    if family == "gemm":
        return 2
    shape = shapes.get(anchor.inputs[0].name)
    if shape is None and anchor.inputs[0].shape is not None:
        shape = tuple(anchor.inputs[0].shape)
    return len(shape) if shape is not None and len(shape) >= 2 else None


def _chains(graph: Graph, anchors: list[ir.Node], family: str, rank: int | None,
            sizes: list[int]) -> list[list[ir.Node]]:
    """Each branch: anchor plus the common prefix of followers all branches share."""
    chains = [[a] for a in anchors]
    while True:
        step = [_follower(graph, c[-1].outputs[0], family, rank, size) for c, size in zip(chains, sizes)]
        if any(n is None for n, _ in step) or len({k for _, k in step}) != 1:
            return chains
        for c, (n, _) in zip(chains, step):
            c.append(n)


# --------------------------------------------------------------------------------------------------
# plan
# --------------------------------------------------------------------------------------------------

def plan(graph: Graph, *, min_branches: int = DEFAULT_MIN_BRANCHES, dims: dict | None = None,
         shapes: dict | None = None, **_ignored) -> FusionPlan:
    """Find sibling Conv/MatMul/Gemm sets (with their common followers) that may become one op + Split."""
    if min_branches < 2:
        raise ValueError(f"min_branches must be >= 2, got {min_branches}")
    result = FusionPlan(model=graph.name)
    shapes = infer_shapes(graph, dims) if shapes is None else shapes
    taken: set[int] = set()
    values = list(graph.graph.inputs) + [o for n in graph.topological_order() for o in n.outputs]
    k = 0
    for v in values:
        users = Graph.consumers(v)
        if len(users) < min_branches:
            continue
        sets: dict[tuple, list[ir.Node]] = {}
        for u in users:
            if id(u) in taken:
                continue
            family, key, why = _anchor_key(graph, u, v)
            if family is None:
                if why:
                    result.notes.append(f"{u.name}: not a horizontal candidate ({why})")
                continue
            sets.setdefault((family, key), []).append(u)
        for (family, _), anchors in sets.items():
            if len(anchors) < min_branches:
                continue
            if not _independent(anchors):
                result.notes.append(f"siblings of {v.name} depend on each other: not fused (would create a cycle)")
                continue
            sizes = _out_sizes(graph, anchors, family)
            rank = _out_rank(graph, anchors[0], family, shapes)
            chains = _chains(graph, anchors, family, rank, sizes)
            members = [n for c in chains for n in c]
            if len({id(n) for n in members}) != len(members) or any(id(n) in taken for n in members):
                continue
            taken.update(id(n) for n in members)
            in_bytes = _bytes(v, shapes)
            out_bytes = sum(_bytes(c[-1].outputs[0], shapes) for c in chains)
            length = len(chains[0])
            result.add(FusionGroup(
                id=f"horizontal{k}", kind=HORIZONTAL, rule=f"concat_{'conv' if family == 'conv' else 'matmul'}",
                nodes=[n.name for n in members], op_types=[n.op_type for n in members],
                # the shared input is read once instead of n times; the Split writes and reads the outputs once more
                saved_bytes=(len(anchors) - 1) * in_bytes - 2 * out_bytes,
                saved_launches=len(members) - (length + 1),
                reason=(f"{len(anchors)} siblings read {v.name} with constant weights and equal attributes; "
                        f"none depends on another"),
                extra={"input": v.name, "branches": [[n.name for n in c] for c in chains], "split": sizes,
                       "family": family, "out_rank": rank, "input_reads_saved_bytes": (len(anchors) - 1) * in_bytes,
                       "split_copy_bytes": 2 * out_bytes},
            ))
            k += 1
    return result


def _out_sizes(graph: Graph, anchors: list[ir.Node], family: str) -> list[int]:
    out = []
    for a in anchors:
        w = graph.constant(a.inputs[1])
        if family == "gemm" and _int_attr(a, "transB", 0):
            out.append(int(w.shape[0]))
        elif family in ("matmul", "gemm"):
            out.append(int(w.shape[1]))
        else:
            out.append(int(w.shape[0]))
    return out


def _bytes(v: ir.Value, shapes: dict) -> int:
    shape = shapes.get(v.name)
    if shape is None and v.shape is not None and all(isinstance(d, int) for d in v.shape):
        shape = tuple(v.shape)
    if shape is None:
        return 0
    itemsize = v.dtype.itemsize if v.dtype is not None else 4
    return int(np.prod(shape, dtype=np.int64)) * itemsize


# --------------------------------------------------------------------------------------------------
# apply
# --------------------------------------------------------------------------------------------------

def _init(graph: Graph, name: str, array: np.ndarray) -> ir.Value:
    base, i = name, 0
    while name in graph.graph.initializers:
        i += 1
        name = f"{base}_{i}"
    v = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                 const_value=ir.tensor(array, name=name))
    graph.graph.register_initializer(v)
    return v


def _node(domain, op, inputs, attrs, name, version=None) -> ir.Node:
    return ir.Node(domain, op, inputs, list(attrs), name=name, version=version)


def _rewrite(graph: Graph, group: FusionGroup) -> None:
    by_name = {n.name: n for n in graph}
    chains = [[by_name[n] for n in branch] for branch in group.extra["branches"]]
    family = group.extra["family"]
    anchors = [c[0] for c in chains]
    v = anchors[0].inputs[0]
    gname = f"{group.id}"
    a0 = anchors[0]
    # 1. the wide anchor
    weights = [graph.constant(a.inputs[1]) for a in anchors]
    if family == "conv":
        biases = [graph.constant(a.inputs[2]) if len(a.inputs) > 2 and a.inputs[2] is not None else None
                  for a in anchors]
        w, b, sizes = derive.concat_conv_weights(weights, biases)
        axis = 1
    else:
        trans_b = family == "gemm" and bool(_int_attr(a0, "transB", 0))
        biases = [graph.constant(a.inputs[2]) if len(a.inputs) > 2 and a.inputs[2] is not None else None
                  for a in anchors] if family == "gemm" else None
        w, b, sizes = derive.concat_matmul_weights(weights, biases, trans_b=trans_b)
        axis = -1
    inputs = [v, _init(graph, f"{gname}_W", w)]
    if b is not None:
        inputs.append(_init(graph, f"{gname}_B", b))
    new_nodes = [_node(a0.domain, a0.op_type, inputs, a0.attributes.values(), f"{gname}/{a0.op_type}", a0.version)]
    # 2. the followers, one wide op per chain position
    for pos in range(1, len(chains[0])):
        ops = [c[pos] for c in chains]
        f0 = ops[0]
        x = new_nodes[-1].outputs[0]
        if f0.op_type == "BatchNormalization":
            params = [np.concatenate([graph.constant(n.inputs[j]).reshape(-1) for n in ops]) for j in range(1, 5)]
            ins = [x] + [_init(graph, f"{gname}_bn{pos}_{j}", p) for j, p in enumerate(params)]
        elif f0.op_type == "Add":
            arrays = [graph.constant(_add_const(n, chains, pos)) for n in ops]
            rank = group.extra["out_rank"]
            c = np.concatenate([_per_channel(a, rank, family, size) for a, size in zip(arrays, sizes)])
            if family == "conv":  # channels on axis 1 of the rank-`rank` output: shape (C, 1, ..., 1)
                c = c.reshape((c.shape[0],) + (1,) * (rank - 2))
            ins = [x, _init(graph, f"{gname}_add{pos}", c.astype(arrays[0].dtype))]
        else:
            ins = [x]
        new_nodes.append(_node(f0.domain, f0.op_type, ins, f0.attributes.values(), f"{gname}/{f0.op_type}_{pos}",
                               f0.version))
    # 3. the Split, whose outputs take over the names of the values the branches hand on
    last = [c[-1].outputs[0] for c in chains]
    split_attrs = [ir.AttrInt64("axis", axis)]
    split_in = [new_nodes[-1].outputs[0]]
    if graph.opset >= 13:
        split_in.append(_init(graph, f"{gname}_split", np.array(sizes, dtype=np.int64)))
    else:
        split_attrs.append(ir.AttrInt64s("split", sizes))
    outs = [ir.Value(name=f"{o.name}__h", shape=o.shape, type=o.type) for o in last]
    split = ir.Node("", "Split", split_in, split_attrs, outputs=outs, name=f"{gname}/Split")
    new_nodes.append(split)
    # insert before the earliest member: every new node reads only `v` and constants
    order = {id(n): i for i, n in enumerate(graph)}
    first = min((n for c in chains for n in c), key=lambda n: order[id(n)])
    graph.graph.insert_before(first, new_nodes)
    names = [o.name for o in last]
    for old, new in zip(last, outs):
        old.replace_all_uses_with(new, replace_graph_outputs=True)
    members = [n for c in chains for n in c]
    graph.graph.remove(members, safe=True)
    for new, name in zip(outs, names):
        new.name = name
    group.lowered_to = "+".join(n.op_type for n in new_nodes)


def _add_const(node: ir.Node, chains, pos) -> ir.Value:
    prev = {id(c[pos - 1].outputs[0]) for c in chains}
    return node.inputs[1] if id(node.inputs[0]) in prev else node.inputs[0]


def apply(graph: Graph, fplan: FusionPlan, **_opts) -> None:
    """Rewrite every horizontal group of the plan into one wide op (+ followers) and a Split, in place."""
    for group in fplan:
        if group.kind == HORIZONTAL:
            _rewrite(graph, group)
