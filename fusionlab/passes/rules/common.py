"""Steps several vertical rules share: BatchNormalization parameters, per-channel affine maps, activations, pads."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ...analysis import derive
from ...analysis.legality import bn_foldable
from ..engine import Refused, attr, sole_consumer
from ..lowering import ELEMENTWISE_ACTIVATIONS, FUSED_GEMM_ACTIVATIONS

__all__ = ["FLOATS", "F32", "F16", "bn_scale_shift", "bn_affine", "channel_affine", "activation", "folded_pads"]

FLOATS = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16))
F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)


def bn_scale_shift(cx, bn: ir.Node, channels: int, w: np.ndarray | None = None,
                   b: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (scale, shift) of a BatchNormalization that may fold into `channels` per-channel weights
    (`legality.bn_foldable`; `w`, `b` the producer's weight and bias), or Refused saying why not."""
    verdict = bn_foldable(cx.graph, bn, channels, w, b)
    if not verdict.ok:
        raise Refused(verdict.reason)
    return bn_affine(cx, bn)


def bn_affine(cx, bn: ir.Node) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (scale, shift) of a BatchNormalization already judged foldable (`legality`)."""
    params = [cx.constant(v) for v in bn.inputs[1:5]]
    return derive.bn_scale_shift(*params, float(attr(bn, "epsilon", 1e-5)))


def channel_affine(cx, node: ir.Node, cur: ir.Value, channels: int, rank: int, axis: int, dtype):
    """(scale, shift) per channel of Mul/Add/Sub(cur, constant) along `axis` of a rank-`rank` value, or Refused."""
    if len(node.inputs) != 2 or sum(v is cur for v in node.inputs) != 1:
        raise Refused(f"{node.op_type} does not read the value once")
    other = node.inputs[1] if node.inputs[0] is cur else node.inputs[0]
    if node.op_type == "Sub" and node.inputs[0] is not cur:
        raise Refused("Sub with the constant first is not an affine map of the input")
    c = cx.constant(other)
    if c is None:
        made = other.producer()
        raise Refused(f"{node.op_type} operand is not a constant", condition=f"a constant as the {node.op_type}'s "
                      "other operand", found=f"{other.name} (computed by {made.op_type} {made.name})" if made is not None
                      else f"{other.name} (a graph input)")
    if c.dtype != dtype:
        raise Refused(f"{node.op_type} constant dtype {c.dtype} differs from {dtype}",
                      condition=f"a {node.op_type} constant of the conv's dtype {dtype}", found=f"dtype {c.dtype}")
    if c.ndim > rank:
        raise Refused(f"{node.op_type} constant has rank {c.ndim} > {rank}: it would broadcast the output",
                      condition=f"a {node.op_type} constant of rank <= {rank}", found=f"rank {c.ndim}")
    padded = (1,) * (rank - c.ndim) + tuple(c.shape)
    for i, d in enumerate(padded):
        if d != 1 and not (i == axis and d == channels):
            raise Refused(f"{node.op_type} constant shape {c.shape} is not per-channel",
                          condition=f"a per-channel {node.op_type} constant (1 or {channels} along axis {axis})",
                          found=f"shape {list(c.shape)}")
    flat = c.astype(np.float64).reshape(-1)
    vec = np.broadcast_to(flat if c.size == channels else flat[:1], (channels,)).copy()
    if not np.all(np.isfinite(vec)):
        raise Refused(f"{node.op_type} constant is not finite")
    if node.op_type == "Mul":
        return vec, np.zeros(channels)
    if node.op_type == "Add":
        return np.ones(channels), vec
    return np.ones(channels), -vec


def activation(cx, node: ir.Node | None, table: dict | None):
    """(op name, params) if `node` is an activation in `table` (None: any elementwise op), else None."""
    if node is None or node.domain not in ("", "ai.onnx") or node.op_type not in ELEMENTWISE_ACTIVATIONS:
        return None
    if len(node.outputs) != 1:
        return None
    op = node.op_type
    if table is not None and op not in table:
        return None
    if op == "Clip":
        return _clip_bounds(cx, node)
    if len([v for v in node.inputs if v is not None]) != 1:
        return None
    defaults = dict((table or FUSED_GEMM_ACTIVATIONS).get(op, ()))
    return op, {k: float(attr(node, k, d)) for k, d in defaults.items()}


def _clip_bounds(cx, node: ir.Node):
    lo, hi = -3.4028234663852886e38, 3.4028234663852886e38
    if cx.graph.opset < 11:
        return "Clip", {"min": float(attr(node, "min", lo)), "max": float(attr(node, "max", hi))}
    bounds = [lo, hi]
    for i in (1, 2):
        if len(node.inputs) > i and node.inputs[i] is not None:
            c = cx.constant(node.inputs[i])
            if c is None or c.size != 1:
                return None
            bounds[i - 1] = float(c.reshape(-1)[0])
    return "Clip", {"min": bounds[0], "max": bounds[1]}


def folded_pads(cx, pad: ir.Node, consumer: ir.Node, rank: int) -> tuple[list[int], float]:
    """(consumer pads + Pad's spatial pads, pad value) if a constant Pad's padding can move into `consumer`."""
    kind = consumer.op_type
    if consumer.inputs[0] is not pad.outputs[0] or sole_consumer(pad.outputs[0]) is not consumer:
        raise Refused("Pad output is read elsewhere or is a graph output")
    if str(attr(consumer, "auto_pad", "NOTSET")) != "NOTSET":
        raise Refused(f"{kind} uses auto_pad")
    if str(attr(pad, "mode", "constant")) != "constant":
        raise Refused("Pad mode is not constant")
    pads, value = _pad_amounts(cx, pad)
    if pads.size != 2 * rank:
        raise Refused(f"Pad has {pads.size} pads for a rank-{rank} input")
    if np.any(pads < 0):
        raise Refused(f"negative pads (cropping) cannot fold into {kind}")
    begin, end = pads[:rank], pads[rank:]
    if begin[0] or begin[1] or end[0] or end[1]:
        raise Refused("Pad pads the batch or channel axis")
    own = attr(consumer, "pads", None)
    own = np.zeros(2 * (rank - 2), dtype=np.int64) if own is None else np.asarray(list(own))
    if own.size != 2 * (rank - 2):
        raise Refused(f"{kind} has {own.size} pads for {rank - 2} spatial axes")
    spatial = np.concatenate([begin[2:], end[2:]])
    return [int(v) for v in own + spatial], value


def _pad_amounts(cx, pad: ir.Node) -> tuple[np.ndarray, float]:
    if cx.graph.opset < 11:
        pads = attr(pad, "pads", None)
        if pads is None:
            raise Refused("Pad has no pads")
        return np.asarray(list(pads), dtype=np.int64), float(attr(pad, "value", 0.0))
    if len(pad.inputs) < 2 or pad.inputs[1] is None:
        raise Refused("Pad has no pads input")
    pads = cx.constant(pad.inputs[1])
    if pads is None:
        raise Refused("Pad pads are not constant")
    value = 0.0
    if len(pad.inputs) > 2 and pad.inputs[2] is not None:
        c = cx.constant(pad.inputs[2])
        if c is None or c.size != 1:
            raise Refused("Pad value is not a constant scalar")
        value = float(c.reshape(-1)[0])
    if len(pad.inputs) > 3 and pad.inputs[3] is not None:
        raise Refused("Pad with an axes input is not folded")
    return np.asarray(pads).reshape(-1).astype(np.int64), value
