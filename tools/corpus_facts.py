"""Measured facts about the node patterns in one export: attention anatomy, norms, activations, bias adds,
transposes into MatMul, squeeze-excitation, SiLU, shape arithmetic. Each is counted on the graph, so the
survey (tools/corpus_survey.py) states only what is there.
"""

from __future__ import annotations

from collections import Counter

from corpus_graph import (Analysed, _reaches, attrs_str, backward_slice, chain_back, chain_forward, chain_str,
                          constant_only, scores_path, softmaxes, step)

PROJECTIONS = ("MatMul", "Gemm", "Split", "Conv", "LayerNormalization")


def _projection_chain(a: Analysed, value: str) -> list[int]:
    """From the projection (MatMul/Gemm/Conv, through a Split of a fused QKV) to `value`."""
    chain = chain_back(a, value, PROJECTIONS)
    if chain and a.nodes[chain[0]].op_type == "Split":
        chain = chain_back(a, a.nodes[chain[0]].input[0], ("MatMul", "Gemm", "Conv")) + chain
    return chain


def _forward_matmul(a: Analysed, start: int, depth: int = 4) -> int | None:
    frontier = [start]
    for _ in range(depth):
        nxt = []
        for i in frontier:
            for o in a.nodes[i].output:
                for c in a.consumers.get(o, []):
                    if a.nodes[c].op_type == "MatMul":
                        return c
                    if c not in a.host:
                        nxt.append(c)
        frontier = nxt
    return None


def attention(a: Analysed) -> dict[str, str] | None:
    """The first attention block as chains: Q, K, V paths, scores (with the mask operand), context, output."""
    sms = softmaxes(a)
    if not sms:
        return None
    sm = sms[0]
    qk, path, masks = scores_path(a, sm)
    ctx = _forward_matmul(a, sm)
    if qk is None or ctx is None:
        return None
    q_in, k_in = a.nodes[qk].input[:2]
    probs_side = 0 if _reaches(a, a.nodes[ctx].input[0], "Softmax", 4) else 1
    v_in = a.nodes[ctx].input[1 - probs_side]
    mask = "; ".join(step(a, a.producer[m]) if m in a.producer else m for m in masks) or "none"
    pre = chain_back(a, a.nodes[ctx].input[probs_side], ("Softmax",))
    post = chain_forward(a, ctx, ("MatMul", "Gemm", "Conv", "Add"))
    return {
        "attention blocks (Softmax over rank-4 scores)": str(len(sms)),
        "Q (input A of the scores MatMul)": chain_str(a, _projection_chain(a, q_in)),
        "K (input B of the scores MatMul)": chain_str(a, _projection_chain(a, k_in)),
        "scores": chain_str(a, [qk, *path, sm]),
        "mask operand": mask,
        "probabilities into the context MatMul": chain_str(a, pre) + f" → MatMul input {'AB'[probs_side]}",
        "V (other context MatMul input)": chain_str(a, _projection_chain(a, v_in)),
        "context → output projection": chain_str(a, [ctx, *post]),
    }


def _around(a: Analysed, i: int) -> str:
    """'Add → LayerNormalization[axis=-1 epsilon=1e-12] → Add | MatMul': the op with its producer and users."""
    node = a.nodes[i]
    data = a.data_inputs(i)
    prev = a.nodes[a.producer[data[0]]].op_type if data and data[0] in a.producer else "input"
    users = sorted({a.nodes[c].op_type for o in node.output for c in a.consumers.get(o, []) if c not in a.host})
    return f"{prev} → {node.op_type}[{attrs_str(node)}] → {' | '.join(users) or 'output'}"


def norms(a: Analysed) -> Counter:
    """Each LayerNormalization with its neighbours, counted; decomposed norms show as ReduceMean pairs."""
    return Counter(_around(a, i) for i, n in enumerate(a.nodes)
                   if n.op_type in ("LayerNormalization", "ReduceMean", "GlobalAveragePool", "BatchNormalization"))


def activations(a: Analysed) -> Counter:
    """GELU/HardSwish/HardSigmoid/SiLU forms: op counts, and SiLU as Sigmoid feeding Mul(x, ·)."""
    out: Counter = Counter()
    for i, n in enumerate(a.nodes):
        if n.op_type == "Gelu":
            out[f"Gelu[{attrs_str(n) or 'approximate=none'}] after {_prev(a, i)}"] += 1
        elif n.op_type in ("HardSwish", "HardSigmoid", "Erf", "Tanh", "Relu", "Clip", "Pow"):
            out[f"{step(a, i)} after {_prev(a, i)}"] += 1
        elif n.op_type == "Sigmoid":
            x = n.input[0]
            muls = [c for c in a.consumers.get(n.output[0], []) if a.nodes[c].op_type == "Mul"]
            silu = [c for c in muls if x in a.nodes[c].input]
            if silu:
                order = "Mul(x, σ)" if a.nodes[silu[0]].input[0] == x else "Mul(σ, x)"
                out[f"SiLU as Sigmoid(x) → {order} after {_prev(a, i)}"] += 1
            else:
                out[f"Sigmoid → {', '.join(sorted({step(a, c) for c in a.consumers.get(n.output[0], [])}))}"] += 1
    return out


def _prev(a: Analysed, i: int) -> str:
    data = a.data_inputs(i)
    return a.nodes[a.producer[data[0]]].op_type if data and data[0] in a.producer else "input"


def matmuls(a: Analysed) -> Counter:
    """Bias adds after MatMul (which side the bias is on), Gemm, and Transposes feeding MatMul inputs."""
    out: Counter = Counter()
    for i, n in enumerate(a.nodes):
        if n.op_type == "Gemm":
            out[f"Gemm[{attrs_str(n)}] on rank {len(a.shape(n.input[0]))}, after {_prev(a, i)}"] += 1
        if n.op_type != "MatMul":
            continue
        rank = len(a.shape(n.input[0]))
        weight = n.input[1] in a.consts or _transposed_const(a, n.input[1])
        for c in a.consumers.get(n.output[0], []):
            add = a.nodes[c]
            if add.op_type == "Add" and weight and any(v in a.consts and a.consts[v].ndim == 1 for v in add.input):
                side = "Add(b, MatMul)" if add.input[0] in a.consts else "Add(MatMul, b)"
                out[f"rank-{rank} MatMul(x, W) + bias as {side}"] += 1
        for k, v in enumerate(n.input[:2]):
            src = _through_scalar_mul(a, v)
            if src is not None and a.nodes[src].op_type == "Transpose":
                kind = "weight" if a.nodes[src].input[0] in a.consts else "data"
                via = " via Mul(scalar)" if src != a.producer.get(v) else ""
                perm = attrs_str(a.nodes[src]).replace("perm=", "")
                out[f"MatMul input {'AB'[k]} ← Transpose{perm} of {kind}{via}"] += 1
    return out


def _transposed_const(a: Analysed, v: str) -> bool:
    p = a.producer.get(v)
    return p is not None and a.nodes[p].op_type == "Transpose" and a.nodes[p].input[0] in a.consts


def _through_scalar_mul(a: Analysed, v: str) -> int | None:
    p = a.producer.get(v)
    if p is not None and a.nodes[p].op_type == "Mul":
        scalars = [x for x in a.nodes[p].input if x in a.consts and a.consts[x].size == 1]
        if scalars:
            other = [x for x in a.nodes[p].input if x not in scalars]
            return a.producer.get(other[0]) if other else None
    return p


def squeeze_excitation(a: Analysed) -> Counter:
    """Global pooling followed by a gate that multiplies back: GlobalAveragePool/ReduceMean → … → Mul."""
    out: Counter = Counter()
    for i, n in enumerate(a.nodes):
        if n.op_type in ("GlobalAveragePool", "ReduceMean") and len(a.shape(n.output[0])) == 4:
            chain = chain_forward(a, i, ("Mul",), limit=6)
            if chain and a.nodes[chain[-1]].op_type == "Mul":
                out[chain_str(a, [i, *chain], generic=True)] += 1
    return out


def per_channel_scales(a: Analysed) -> Counter:
    """Mul by a constant [C, 1, 1] (ConvNeXt layer-scale) with the op before it."""
    out: Counter = Counter()
    for i, n in enumerate(a.nodes):
        if n.op_type == "Mul":
            for v in n.input:
                if v in a.consts and a.consts[v].ndim == 3 and a.consts[v].shape[1:] == (1, 1):
                    arg = "Mul(W[C, 1, 1], ·)" if n.input[0] == v else "Mul(·, W[C, 1, 1])"
                    out[f"{_prev(a, i)} → {arg} → "
                        f"{' | '.join(sorted({a.nodes[c].op_type for c in a.consumers.get(n.output[0], [])}))}"] += 1
    return out


def housekeeping(a: Analysed) -> dict[str, object]:
    """Host-side shape arithmetic, Constant and Identity nodes, weight-only computations."""
    ops = Counter(n.op_type for n in a.nodes)
    weight_only = Counter(a.nodes[i].op_type for i in constant_only(a) if a.nodes[i].op_type != "Constant")
    host = Counter(a.nodes[i].op_type for i in a.host)
    return {"nodes": len(a.nodes), "host": sum(host.values()), "host_ops": host, "Constant": ops.get("Constant", 0),
            "Identity": ops.get("Identity", 0), "weight_only": weight_only}


# --------------------------------------------------------------------------------------------------
# decoder and encoder forms (issue 19's architectures): RMSNorm, rotary, gated MLPs, additive attention
# operands, float16
# --------------------------------------------------------------------------------------------------

def _data_users(a: Analysed, i: int) -> list[int]:
    return [c for o in a.nodes[i].output for c in a.consumers.get(o, []) if c not in a.host]


def _weight_mul(a: Analysed, i: int) -> bool:
    """A Mul by a 1-D weight of more than one element (a norm's gamma)."""
    n = a.nodes[i]
    return n.op_type == "Mul" and any(v in a.consts and a.consts[v].ndim == 1 and a.consts[v].size > 1
                                      for v in n.input)


def rms_norms(a: Analysed) -> Counter:
    """Written-out RMS norms: from the square (Pow(x, 2) or Mul(x, x)), through ReduceMean, to the weight Mul;
    the chain counted with the op before the square (a Cast to float32 in transformers' form)."""
    out: Counter = Counter()
    for i, n in enumerate(a.nodes):
        square = (n.op_type == "Pow" and any(v in a.consts and a.consts[v].size == 1 and float(a.consts[v]) == 2.0
                                             for v in n.input[1:])) \
            or (n.op_type == "Mul" and n.input[0] == n.input[1])
        users = _data_users(a, i)
        if not square or len(users) != 1 or a.nodes[users[0]].op_type != "ReduceMean":
            continue
        chain, node = [i], i
        for _ in range(8):
            nxt = _data_users(a, node)
            if len(nxt) != 1:
                break
            node = nxt[0]
            chain.append(node)
            if _weight_mul(a, node):
                break
        else:
            continue
        if not _weight_mul(a, chain[-1]):
            continue
        before = _prev(a, i)
        order = "Mul(W, ·)" if a.nodes[chain[-1]].input[0] in a.consts else "Mul(·, W)"
        out[f"{before} → {chain_str(a, chain[:-1], generic=True)} → {order}"] += 1
    return out


def rotary(a: Analysed) -> Counter:
    """rotate_half as exported: the Neg of the second half, back to its Slice and on to the Add of x·cos."""
    out: Counter = Counter()
    for i, n in enumerate(a.nodes):
        if n.op_type != "Neg":
            continue
        back = chain_back(a, n.input[0], ("Slice", "Split", "Gather"), limit=3)
        fwd = chain_forward(a, i, ("Add",), limit=4)
        out[chain_str(a, [*back, i, *fwd], generic=True)] += 1
    for op in ("Cos", "Sin"):
        k = sum(1 for n in a.nodes if n.op_type == op)
        if k:
            out[f"{op} nodes (the rotary table, computed once per forward)"] = k
    return out


def gated_mlps(a: Analysed) -> Counter:
    """SwiGLU / GeGLU: an activation whose output is multiplied by another projection, into the down MatMul."""
    out: Counter = Counter()
    acts = ("Sigmoid", "Gelu", "Tanh", "Erf")
    for i, n in enumerate(a.nodes):
        if n.op_type not in acts:
            continue
        chain = chain_forward(a, i, ("MatMul",), limit=7)
        if not chain or a.nodes[chain[-1]].op_type != "MatMul":
            continue
        gate = [c for c in chain[:-1] if a.nodes[c].op_type == "Mul"
                and all(a.producer.get(v) is not None and a.producer[v] not in a.host for v in a.nodes[c].input)
                and any(_reaches(a, v, "MatMul", 1) for v in a.nodes[c].input)]
        if not gate:
            continue
        start = chain_back(a, n.input[0], ("MatMul",), limit=8)
        out[chain_str(a, [*start, i, *chain], generic=True)] += 1
    return out


def additive_operand(a: Analysed) -> Counter:
    """What the first attention's additive score operand (mask, position bias) is computed from: op counts of
    its device-side nodes (host-side shape arithmetic left out), and the graph inputs it reads as data."""
    sms = softmaxes(a)
    if not sms:
        return Counter()
    _, _, masks = scores_path(a, sms[0])
    out: Counter = Counter()
    inputs = {i.name for i in a.proto.graph.input}
    for m in masks:
        region = backward_slice(a, m)
        ops = Counter(a.nodes[i].op_type for i in region if i not in a.host and a.nodes[i].op_type != "Constant")
        reads = sorted({v for i in region if a.nodes[i].op_type != "Shape" for v in a.nodes[i].input if v in inputs})
        out[f"{'none' if not ops else ', '.join(f'{k} {v}' for k, v in ops.most_common())}; reads "
            f"{', '.join(reads) or 'no input (constant)'}"] += 1
    return out


def float_types(a: Analysed) -> Counter:
    """In a float16 model: Casts by target type, and the ops whose results are float32 at run time."""
    out: Counter = Counter()
    if not any(a.dtype(o.name) == "float16" for o in a.proto.graph.output):
        return out
    for i, n in enumerate(a.nodes):
        if i in a.host:
            continue
        if n.op_type == "Cast":
            kinds = (a.dtype(n.input[0]), a.dtype(n.output[0]))
            if any(k.startswith("float") for k in kinds):
                out[f"Cast {kinds[0]} → {kinds[1]}"] += 1
        elif any(a.dtype(o) == "float32" for o in n.output):
            out[f"{n.op_type} computing in float32"] += 1
    return out
