"""When folding BatchNormalization into the op before it is *illegal*: checks a pass calls before rewriting.

Folding replaces `BN(Conv(x, W, b))` by `Conv(x, W', b')`. That is only the same computation when

- BN runs in inference mode (running statistics): not `training_mode=1`, and no optional outputs
  (running mean/var, saved mean/var), which in BN-9 and earlier *mean* training mode;
- nobody else sees the conv's output (it has the BN as its only consumer and is not a graph output):
  after folding that tensor no longer exists;
- W, b and the four BN parameters are constants, and not initializers that are also graph inputs
  (those can be replaced at run time, so folding them would bake in the wrong values);
- the BN parameters are per-channel vectors (rank 1) whose length is the conv's output channels.

A conv weight shared with other nodes can still be folded, but into a *copy*: the verdict says so
(`shared_weight`) and the pass clones the initializer instead of rewriting it in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from ..graph import Graph

__all__ = ["Verdict", "conv_bn_legal", "matmul_bn_legal", "bn_foldable", "constant_inputs", "bn_inference_mode",
           "range_edge_input", "fold_rounding"]

_DEFAULT = ("", "ai.onnx")


@dataclass
class Verdict:
    """Whether a rewrite is legal; `code` is a stable keyword, `reason` a sentence for reports."""

    ok: bool
    reason: str
    code: str = "ok"
    shared_weight: bool = False  # legal, but the weight/bias is used elsewhere: fold into a copy

    def __bool__(self) -> bool:
        return self.ok


def _no(code: str, reason: str) -> Verdict:
    return Verdict(False, reason, code)


def _present(value: ir.Value | None) -> bool:
    return value is not None and value.name != ""


def constant_inputs(graph: Graph, node: ir.Node, *idx: int) -> list[np.ndarray | None] | None:
    """The constant arrays at `node`'s inputs `idx`; an absent optional input gives None in the list.

    Returns None (not a list) when any requested input is present but not a constant (computed,
    a graph input, or an overridable initializer).
    """
    out: list[np.ndarray | None] = []
    for i in idx:
        value = node.inputs[i] if i < len(node.inputs) else None
        if not _present(value):
            out.append(None)
            continue
        array = graph.constant(value)
        if array is None:
            return None
        out.append(array)
    return out


def _source(value: ir.Value) -> ir.Value:
    """Follow Identity nodes back to the value that actually holds the data."""
    seen = 0
    while seen < 64:
        seen += 1
        node = value.producer()
        if node is None or node.op_type != "Identity" or node.domain not in _DEFAULT or not node.inputs:
            return value
        value = node.inputs[0]
    return value


def _shared(graph: Graph, value: ir.Value, owner: ir.Node) -> bool:
    """Is the data behind `value` read by any node other than `owner` (or is it a graph output)?"""
    src = _source(value)
    stack, readers = [src], set()
    while stack:
        v = stack.pop()
        if graph.is_graph_output(v):
            return True
        for node in graph.consumers(v):
            if node.op_type == "Identity" and node.domain in _DEFAULT:
                stack.extend(node.outputs)
            else:
                readers.add(id(node))
    return readers != {id(owner)}


def _non_constant_reason(graph: Graph, value: ir.Value, what: str) -> Verdict:
    src = _source(value)
    # Graph.is_overridable is true for any graph input; only an initializer that is one is "overridable"
    if graph.is_overridable(src) and src.name in graph.graph.initializers:
        return _no("overridable", f"{what} {src.name!r} is an initializer that is also a graph input "
                                  "(it can be overridden at run time)")
    return _no("non_constant", f"{what} {value.name!r} is not a constant")


def bn_inference_mode(graph: Graph, bn: ir.Node) -> Verdict:
    """BN computes with its running statistics: no training_mode=1 and no optional outputs."""
    attr = bn.attributes.get("training_mode")
    if attr is not None and int(attr.value) != 0:
        return _no("training_mode", f"{bn.name or 'BatchNormalization'} has training_mode=1 (batch statistics)")
    extra = [v for v in bn.outputs[1:] if _present(v)]
    if extra:
        used = [v.name for v in extra if graph.consumers(v) or graph.is_graph_output(v)]
        if used:
            return _no("bn_outputs_used", f"BN optional outputs {used} are used (training statistics)")
        return _no("bn_outputs", f"BN declares optional outputs {[v.name for v in extra]} "
                                 "(training mode in BatchNormalization-9 and earlier)")
    spatial = bn.attributes.get("spatial")
    if spatial is not None and int(spatial.value) == 0:
        return _no("not_per_channel", "BN has spatial=0: statistics per activation, not per channel")
    return Verdict(True, "BN in inference mode")


def _bn_params(graph: Graph, bn: ir.Node, channels: int) -> Verdict | list[np.ndarray]:
    if len(bn.inputs) < 5 or not all(_present(v) for v in bn.inputs[1:5]):
        return _no("bn_inputs", "BN lacks scale/bias/mean/var inputs")
    params = constant_inputs(graph, bn, 1, 2, 3, 4)
    if params is None:
        for v, what in zip(bn.inputs[1:5], ("BN scale", "BN bias", "BN mean", "BN var")):
            if graph.constant(v) is None:
                return _non_constant_reason(graph, v, what)
        return _no("non_constant", "BN parameters are not constants")
    for p, what in zip(params, ("scale", "bias", "mean", "var")):
        if p.ndim != 1:
            return _no("not_per_channel", f"BN {what} has shape {tuple(p.shape)}, not a per-channel vector")
        if p.shape[0] != channels:
            return _no("channel_mismatch", f"BN {what} has {p.shape[0]} channels, the producer has {channels}")
        if p.dtype.kind != "f":
            return _no("dtype", f"BN {what} has dtype {p.dtype}, not floating point")
    attr = bn.attributes.get("epsilon")
    eps = float(attr.value) if attr is not None else 1e-5
    if not np.all(params[3].astype(np.float64) + eps > 0) or not all(np.all(np.isfinite(p)) for p in params):
        return _no("not_finite", "BatchNormalization variance + epsilon is not positive (or parameters not finite)")
    return params


def _common(graph: Graph, producer: ir.Node, bn: ir.Node, kinds: tuple[str, ...]) -> Verdict | None:
    if producer.op_type not in kinds or producer.domain not in _DEFAULT:
        return _no("not_a_pair", f"{producer.op_type} is not one of {', '.join(kinds)}")
    if bn.op_type != "BatchNormalization" or bn.domain not in _DEFAULT:
        return _no("not_a_pair", f"{bn.op_type} is not BatchNormalization")
    y = producer.outputs[0]
    if not bn.inputs or bn.inputs[0] is not y:
        return _no("not_a_pair", f"BN does not read {producer.op_type}'s output")
    if graph.is_graph_output(y):
        return _no("graph_output", f"{producer.op_type} output {y.name!r} is a graph output")
    if len(graph.consumers(y)) != 1:
        return _no("multi_consumer", f"{producer.op_type} output {y.name!r} has "
                                     f"{len(graph.consumers(y))} consumers; folding would change the others")
    return None


def _weights(graph: Graph, node: ir.Node, what: str) -> Verdict | tuple[np.ndarray, np.ndarray | None, bool]:
    w_val = node.inputs[1] if len(node.inputs) > 1 else None
    if not _present(w_val):
        return _no("non_constant", f"{what} has no weight input")
    w = graph.constant(w_val)
    if w is None:
        return _non_constant_reason(graph, w_val, f"{what} weight")
    b_val = node.inputs[2] if len(node.inputs) > 2 and _present(node.inputs[2]) else None
    b = None
    if b_val is not None:
        b = graph.constant(b_val)
        if b is None:
            return _non_constant_reason(graph, b_val, f"{what} bias")
    if w.dtype.kind != "f":
        return _no("dtype", f"{what} weight has dtype {w.dtype}, not floating point")
    shared = _shared(graph, w_val, node) or (b_val is not None and _shared(graph, b_val, node))
    return w, b, shared


def _producer_weights(graph: Graph, node: ir.Node, bn_node: ir.Node, ops: tuple[str, ...]):
    """The checks every BN fold shares, then (weight, bias, shared); a failing Verdict otherwise."""
    bad = _common(graph, node, bn_node, ops)
    if bad is not None:
        return bad
    return _weights(graph, node, node.op_type)


#: per-dtype (rtol, atol) a fold's rounding must stay within (fusionlab.verification.runtime.TOLERANCES)
_FOLD_TOLERANCE = {np.dtype(np.float16): (1e-3, 2.5e-3)}


def fold_rounding(w: np.ndarray, b: np.ndarray | None, params: list[np.ndarray], eps: float) -> Verdict:
    """Does storing the folded weights in w's dtype keep the result within the dtype's tolerance?

    The folded conv computes s·(W·x) + (β + s·(b - μ)) with s = γ/σ, σ = sqrt(var + ε). Rounding W' = s·W
    to the dtype costs a relative u (half its machine epsilon) on s·(W·x), whose size is |s|·|W·x| ≈
    |γ|·(κ + 3) when BN's statistics describe the data (|W·x + b - μ| within 3σ), where κ = |μ - b|/σ is
    how many standard deviations the folded bias must cancel. The output itself is about |β| + 3|γ|. The
    fold is kept when u·|γ|·(κ + 3) <= rtol·(|β| + 3|γ|) + atol on every channel.

    Checked for float16 only: there onnxruntime's CPU kernels compute the unfolded Conv -> BN chain in
    float32 (it inserts the casts itself), so the unfolded model never rounds s·W and the fold's rounding
    is new error; it refuses channels with near-zero variance and a mean far from the bias (a zero-variance
    channel with ε = 1e-5 has s ≈ 300: the folded model was off by 0.08 where the unfolded one was off by
    2e-4). In float32 and float64 the unfolded model rounds W·x in the same dtype before scaling it, so the
    fold's rounding is of the same size as the original's, and folding is kept (a zero-variance channel
    with ε = 1e-9 folds and verifies).
    """
    dtype = np.dtype(w.dtype)
    if dtype != np.float16:
        return Verdict(True, "legal")
    with np.errstate(all="ignore"):
        s_max = float(np.max(np.abs(np.asarray(params[0], np.float64)) / np.sqrt(np.asarray(params[3], np.float64) + eps)))
        if not s_max * float(np.abs(w).max(initial=0.0)) < float(np.finfo(dtype).max):
            return _no("overflow", f"folded weights overflow {dtype}")
    gamma, beta, mean, var = (np.asarray(p, np.float64).reshape(-1) for p in params)
    bias = np.asarray(b, np.float64).reshape(-1) if b is not None else np.zeros(1)
    if bias.size not in (1, mean.size):  # a Gemm C that is not a per-column vector: judged without it
        bias = np.zeros(1)
    with np.errstate(all="ignore"):
        sigma = np.sqrt(var + eps)
        kappa = np.abs(mean - bias) / sigma
        u = float(np.finfo(dtype).eps) / 2
        rtol, atol = _FOLD_TOLERANCE[dtype]
        error = u * np.abs(gamma) * (kappa + 3)
        budget = rtol * (np.abs(beta) + 3 * np.abs(gamma)) + atol
    bad = ~(error <= budget)
    if not bad.any():
        return Verdict(True, "legal")
    c = int(np.argmax(np.where(bad, error / np.maximum(budget, 1e-300), -np.inf)))
    return _no("precision", f"folding would lose {dtype} precision: channel {c} has variance {var[c]:.3g} and "
                            f"its mean is {kappa[c]:.3g} standard deviations from the bias, so the folded "
                            f"weights' rounding (~{error[c]:.2g}) exceeds the tolerance (~{budget[c]:.2g})")


def bn_foldable(graph: Graph, bn_node: ir.Node, channels: int, w: np.ndarray | None = None,
                b: np.ndarray | None = None) -> Verdict:
    """May `bn_node` fold into a producer's per-channel weights (`channels` of them; `w`, `b`: the producer's
    weight and bias, for the float16 rounding check)? Inference mode, constant finite per-channel parameters, and
    a fold that keeps the dtype's precision; what lies between the producer and the BN is the caller's to check."""
    mode = bn_inference_mode(graph, bn_node)
    if not mode.ok:
        return mode
    params = _bn_params(graph, bn_node, channels)
    if isinstance(params, Verdict):
        return params
    if w is not None:
        attr = bn_node.attributes.get("epsilon")
        rounding = fold_rounding(w, b, params, float(attr.value) if attr is not None else 1e-5)
        if not rounding.ok:
            return rounding
    return Verdict(True, "legal")


def _with_bn(graph: Graph, bn_node: ir.Node, channels: int, shared: bool, w: np.ndarray | None = None,
             b: np.ndarray | None = None) -> Verdict:
    """The verdict once the producer is fine: BN's parameters decide, and a shared weight means a copy."""
    verdict = bn_foldable(graph, bn_node, channels, w, b)
    if not verdict.ok:
        return verdict
    if shared:
        return Verdict(True, "legal; the weight is shared with other nodes, so fold into a copy", "ok", True)
    return Verdict(True, "legal")


def conv_bn_legal(graph: Graph, conv_node: ir.Node, bn_node: ir.Node) -> Verdict:
    """May `bn_node` be folded into the Conv/ConvTranspose `conv_node` before it?"""
    got = _producer_weights(graph, conv_node, bn_node, ("Conv", "ConvTranspose"))
    if isinstance(got, Verdict):
        return got
    w, b, shared = got
    if w.ndim < 3:
        return _no("unknown_rank", f"{conv_node.op_type} weight has rank {w.ndim}; expected 3 to 5")
    attr = conv_node.attributes.get("group")
    group = int(attr.value) if attr is not None else 1
    channels = w.shape[0] if conv_node.op_type == "Conv" else w.shape[1] * group
    if conv_node.op_type == "ConvTranspose" and w.shape[0] % group:
        return _no("channel_mismatch", f"ConvTranspose weight {tuple(w.shape)} does not split into {group} groups")
    if b is not None and (b.ndim != 1 or b.shape[0] != channels):
        return _no("channel_mismatch", f"{conv_node.op_type} bias has shape {tuple(b.shape)}, expected ({channels},)")
    return _with_bn(graph, bn_node, channels, shared, w, b)


def _ints(node: ir.Node, name: str) -> list[int] | None:
    a = node.attributes.get(name)
    return [int(x) for x in a.value] if a is not None else None


def range_edge_input(graph: Graph, value: ir.Value | None) -> str | None:
    """Why `value` may hold -inf or the dtype's lowest value in a whole window, or None.

    A MaxPool window that lies entirely in padding (its own pads, or a -inf `Pad` before it, at least a
    kernel wide) gives -inf, or on onnxruntime's CPU float32's lowest value (its kernel starts from
    `lowest()`); ops that only move values (a zero `Pad`, Reshape, Transpose, Concat: `_MOVES`) and later
    MaxPools between it and `value` keep it (fuzz seed 7: MaxPool, Pad, Conv, Mul). Folding a scale into
    the weights of a Conv that reads such values changes where the sum overflows (fuzz seed 5: +inf where
    ConvTranspose then BN gives -4.5e37; NaN where ConvTranspose then Mul gives -inf). ResNet's MaxPool (kernel 3, pads 1) has no such window.
    """
    for src in _sources(value):
        why = _padding_window(graph, src)
        if why is not None:
            return why
    return None


#: ops that move values without changing them: a MaxPool's -inf or lowest value read through them is still there
#: (Cast and Neg/Abs keep an extreme value extreme: float32's lowest is -inf in float16, +3.4e38 negated)
_MOVES = {"Pad", "Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Expand", "Tile",
          "Concat", "Split", "DepthToSpace", "SpaceToDepth", "Gather", "GatherElements", "Cast", "Neg", "Abs",
          "Max", "Min"}


def _sources(value: ir.Value | None, depth: int = 8) -> list[ir.Node]:
    """The MaxPool nodes whose values reach `value` unchanged (through `_MOVES` and MaxPool, `depth` ops back)."""
    found, todo, seen = [], [(value, 0)], set()
    while todo:
        v, d = todo.pop()
        src = v.producer() if v is not None else None
        if src is None or id(src) in seen or src.domain not in ("", "ai.onnx"):
            continue
        seen.add(id(src))
        if src.op_type == "MaxPool":
            found.append(src)
        if src.op_type in _MOVES | {"MaxPool"} and d < depth:
            todo += [(i, d + 1) for i in (src.inputs if src.op_type in ("Concat", "Max", "Min") else src.inputs[:1])]
    return found


def _padding_window(graph: Graph, src: ir.Node) -> str | None:
    """Why MaxPool `src` has a window entirely in padding (its own pads, or a -inf Pad before it), or None."""
    kernel = _ints(src, "kernel_shape")
    if not kernel:
        return None
    auto = src.attributes.get("auto_pad")
    if auto is not None and auto.value not in ("", "NOTSET", "VALID"):
        return None  # SAME padding is less than a kernel wide
    k = len(kernel)
    dil = _ints(src, "dilations") or [1] * k
    extent = [d * (n - 1) + 1 for d, n in zip(dil, kernel)]
    pads = _ints(src, "pads") or [0] * (2 * k)
    begin, end = list(pads[:k]), list(pads[k:])
    ceil = src.attributes.get("ceil_mode")
    if ceil is not None and int(ceil.value):  # ceil_mode may add a last window up to stride - 1 further out
        end = [e + s - 1 for e, s in zip(end, _ints(src, "strides") or [1] * k)]
    pad = src.inputs[0].producer() if src.inputs and src.inputs[0] is not None else None
    if pad is not None and pad.op_type == "Pad" and pad.domain in ("", "ai.onnx"):
        explicit = _neg_inf_pads(graph, pad, k)
        if explicit is not None:
            begin = [x + y for x, y in zip(begin, explicit[0])]
            end = [x + y for x, y in zip(end, explicit[1])]
    if any(b >= e or t >= e for b, t, e in zip(begin, end, extent)):
        return (f"it reads MaxPool {src.name!r}, some of whose windows lie entirely in padding (they give -inf, "
                f"or the dtype's lowest value on onnxruntime's CPU); folding into its weights could move "
                f"where the sum overflows")
    return None


def _neg_inf_pads(graph: Graph, pad: ir.Node, k: int) -> tuple[list[int], list[int]] | None:
    """The spatial (begin, end) pads of a constant -inf `Pad` over an N, C, spatial tensor."""
    mode = pad.attributes.get("mode")
    if mode is not None and mode.value not in ("constant", b"constant"):
        return None
    if pad.attributes.get("pads") is not None:  # opset < 11
        pads = _ints(pad, "pads")
        v = pad.attributes.get("value")
        value = float(v.value) if v is not None else 0.0
        axes = None
    else:
        ins = list(pad.inputs[1:4]) + [None] * 3
        got = [graph.constant(v) if v is not None else None for v in ins[:3]]
        if got[0] is None:
            return None
        pads = [int(x) for x in np.asarray(got[0]).reshape(-1)]
        value = float(np.asarray(got[1]).reshape(-1)[0]) if got[1] is not None and np.asarray(got[1]).size else 0.0
        axes = [int(x) for x in np.asarray(got[2]).reshape(-1)] if got[2] is not None else None
    if not value < -float(np.finfo(np.float16).max):  # -inf, or a value no float16 holds
        return None
    n = len(pads) // 2
    axes = axes if axes is not None else list(range(n))
    rank = k + 2
    begin, end = [0] * k, [0] * k
    for i, ax in enumerate(axes):
        ax = ax % rank
        if ax >= 2:
            begin[ax - 2], end[ax - 2] = pads[i], pads[n + i]
    return begin, end


def _rank(graph: Graph, value: ir.Value, shapes: dict | None) -> int | None:
    if value.shape is not None:
        return len(value.shape)
    if shapes is not None and value.name in shapes:
        return len(shapes[value.name])
    return None


def matmul_bn_legal(graph: Graph, mm_node: ir.Node, bn_node: ir.Node, shapes: dict | None = None) -> Verdict:
    """May `bn_node` be folded into the MatMul/Gemm `mm_node`? BN's channel axis is 1, so the output must be 2-D.

    (For Gemm the pass folds `beta·C` as the bias and writes beta=1; alpha stays on A·B.)
    """
    got = _producer_weights(graph, mm_node, bn_node, ("MatMul", "Gemm"))
    if isinstance(got, Verdict):
        return got
    w, b, shared = got
    if w.ndim != 2:
        return _no("unknown_rank", f"{mm_node.op_type} weight has rank {w.ndim}; only 2-D weights fold")
    if mm_node.op_type == "MatMul":
        rank = _rank(graph, mm_node.inputs[0], shapes)
        if rank is None:
            return _no("unknown_rank", "MatMul input rank unknown: cannot tell which axis BN normalises")
        if rank != 2:
            return _no("channel_axis", f"MatMul output has rank {rank}: BN normalises axis 1, not the last axis")
        channels = w.shape[1]
    else:
        attr = mm_node.attributes.get("transB")
        trans_b = int(attr.value) if attr is not None else 0
        channels = w.shape[0] if trans_b else w.shape[1]
        if b is not None and b.size not in (1, channels):
            return _no("channel_mismatch", f"Gemm C has shape {tuple(b.shape)}, not broadcast per output column")
    return _with_bn(graph, bn_node, channels, shared, w, b)
