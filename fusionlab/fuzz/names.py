"""Renaming tensors and nodes to names a pass might make up itself (the fresh-name near misses).

The passes name what they create after what they replace: ``<conv>_W_fused``, ``horizontal0_W``,
``horizontal0/Conv_0``, ``<Op>_<i>`` for unnamed nodes, ``<x>__replaced``... A model that already uses
such a name is legal ONNX, and a pass must not define it twice or read the user's tensor instead of its
own. `tempt` gives a few existing tensors and nodes such names; `rename_tensor` is the plumbing.
"""

from __future__ import annotations

import random

import onnx

__all__ = ["tempt", "rename_tensor", "tensor_names", "node_name_candidates", "tensor_name_candidates"]

_WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def tensor_names(graph: onnx.GraphProto) -> set[str]:
    names = {i.name for i in graph.input} | {o.name for o in graph.output} | {t.name for t in graph.initializer}
    for n in graph.node:
        names.update(n.input)
        names.update(n.output)
    names.discard("")
    return names


def rename_tensor(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Rename tensor `old` to `new` everywhere in `graph` (not in subgraphs: the generator makes none)."""
    for n in graph.node:
        for i, v in enumerate(n.input):
            if v == old:
                n.input[i] = new
        for i, v in enumerate(n.output):
            if v == old:
                n.output[i] = new
    for coll in (graph.input, graph.output, graph.value_info, graph.initializer):
        for item in coll:
            if item.name == old:
                item.name = new


def node_name_candidates(graph: onnx.GraphProto) -> list[str]:
    """Node names the passes may generate for this graph."""
    out = []
    ops = sorted({n.op_type for n in graph.node})
    for i, n in enumerate(graph.node):
        out.append(f"{n.op_type}_{i}")
        out.append(f"{n.op_type}_{i + 1}")
        if n.name:
            out += [f"{n.name}_fused", f"{n.name}_gelu", f"{n.name}_layernorm", f"{n.name}_silu", f"{n.name}_call"]
    for k in range(2):
        for op in ops:
            out += [f"horizontal{k}/{op}", f"horizontal{k}/{op}_0", f"horizontal{k}/{op}_1"]
        out += [f"horizontal{k}/Split", f"mixed{k}"]
    return out


def tensor_name_candidates(graph: onnx.GraphProto) -> list[str]:
    """Tensor names the passes may generate for this graph."""
    out = []
    for n in graph.node:
        if n.op_type in _WEIGHTED:
            out += [f"{n.name}_W_fused", f"{n.name}_B_fused", f"{n.name}_C_fused", f"{n.name}_B_zero"]
        for o in n.output:
            out += [f"{o}__replaced", f"{o}__h", f"{o}__bypassed", f"{o}#rc0", f"{o}__{n.op_type.lower()}",
                    f"{o}__conv", f"{o}__mul"]
    for k in range(2):
        out += [f"horizontal{k}_W", f"horizontal{k}_B", f"horizontal{k}_split", f"horizontal{k}_add0",
                f"horizontal{k}_add1", f"horizontal{k}_bn0_0"]
    return out


def tempt(model: onnx.ModelProto, rng: random.Random) -> list[str]:
    """Rename 1-3 nodes and 1-3 tensors of `model` (in place) to names a pass might make up; returns what it did."""
    g = model.graph
    done = []
    taken_nodes = {n.name for n in g.node if n.name}
    for _ in range(rng.randint(0, 3)):
        cands = [c for c in node_name_candidates(g) if c not in taken_nodes]
        if not cands or not g.node:
            break
        node = rng.choice(list(g.node))
        new = rng.choice(cands)
        taken_nodes.discard(node.name)
        node.name = new
        taken_nodes.add(new)
        done.append(f"node:{new}")
    taken = tensor_names(g)
    outputs = {o.name for o in g.output}
    for _ in range(rng.randint(1, 3)):
        cands = [c for c in tensor_name_candidates(g) if c not in taken]
        victims = [t for t in sorted(taken) if t not in outputs or rng.random() < 0.3]
        if not cands or not victims:
            break
        old, new = rng.choice(victims), rng.choice(cands)
        rename_tensor(g, old, new)
        taken.discard(old)
        taken.add(new)
        done.append(f"tensor:{new}")
    return done
