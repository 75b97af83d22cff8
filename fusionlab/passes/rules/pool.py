"""Pad + pooling: a constant Pad folds into AveragePool / MaxPool where the pool's own padding computes the same."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from ..engine import Match, Refused, Rule, attr, copy_attrs, is_op
from .common import folded_pads

__all__ = ["PadPool"]


@dataclass(frozen=True)
class PadPoolData:
    """The pool's pads with the Pad's folded in."""

    pads: tuple[int, ...]


def _lowest(dtype) -> float:
    return float(np.finfo(dtype).min) if dtype is not None and dtype.kind == "f" else -math.inf


class PadPool(Rule):
    """Pad -> AveragePool (count_include_pad=1) or a lowest-value Pad -> MaxPool.

    - AveragePool pads with zeros that count in the average only when ``count_include_pad=1``; explicit
      zeros from a Pad always count. So the fused pool gets ``count_include_pad=1``, which is legal only if
      the pool had no padding of its own or already counted it (onnxruntime PR #23190 fixed exactly this).
    - MaxPool's own padding is the dtype's lowest finite value in onnxruntime (not -inf): it never wins a
      max over finite data, but max(-inf, padding) is that lowest value. So a Pad with exactly that value
      folds; a -inf Pad does not (a -inf in the data next to the padding would come out finite: fuzzer
      class N1), nor a Pad with 0 (it would win over negative inputs).
    - ``ceil_mode=1`` is refused (windows past the end behave differently), and onnxruntime requires every
      pad to be smaller than the kernel, so a fold that would break that is refused too.
    """

    names = ("pad_pool",)
    anchors = ("AveragePool", "MaxPool")
    fixed = True

    def match(self, cx, pool: ir.Node) -> Match | None:
        if not pool.inputs or pool.inputs[0] is None:
            return None
        pad = pool.inputs[0].producer()
        if not is_op(pad, "Pad") or not cx.free(pad) or pad.inputs[0] is None:
            return None
        pads = self._legal_pads(cx, pad, pool)
        why = "constant Pad folded into the pool's own pads" + (
            " (count_include_pad=1: the zeros count, as they did)" if pool.op_type == "AveragePool" else
            " (padding with the lowest finite value, as MaxPool's own)")
        return Match("pad_pool", pool, [pad, pool], why, pool.op_type, data=PadPoolData(tuple(pads)))

    @staticmethod
    def _legal_pads(cx, pad: ir.Node, pool: ir.Node) -> list[int]:
        rank = cx.rank(pad.inputs[0])
        kernel = attr(pool, "kernel_shape", None)
        if rank is None or rank < 3 or kernel is None or len(list(kernel)) != rank - 2:
            raise Refused("input rank or kernel shape unknown")
        if any(o.name and (o.uses() or o.is_graph_output()) for o in pool.outputs[1:]):
            raise Refused("MaxPool's Indices output is used (it indexes the padded tensor)")
        if int(attr(pool, "ceil_mode", 0)):
            raise Refused("ceil_mode=1")
        pads, value = folded_pads(cx, pad, pool, rank)
        if pool.op_type == "AveragePool":
            if value != 0.0:
                raise Refused("Pad value is not zero")
            if not int(attr(pool, "count_include_pad", 0)) and any(attr(pool, "pads", None) or []):
                raise Refused("AveragePool has its own pads with count_include_pad=0")
        elif value != _lowest(cx.dtype(pad.inputs[0])):
            raise Refused("MaxPool's own padding is the lowest finite value; this Pad's value is "
                          f"{value:g} (a -inf data element next to the padding would come out finite)")
        k = [int(v) for v in kernel]
        half = len(pads) // 2
        if any(pads[i] >= k[i % half] for i in range(len(pads))):
            raise Refused("a folded pad would not be smaller than the kernel (onnxruntime rejects it)")
        return pads

    def rewrite(self, cx, m: Match) -> list[ir.Node]:
        pad, pool = m.nodes
        attrs = copy_attrs(pool)
        attrs["pads"] = list(m.data.pads)
        if pool.op_type == "AveragePool":
            attrs["count_include_pad"] = 1
        return [cx.node(pool.op_type, [pad.inputs[0]], attrs, base=f"{pool.name}_fused",
                        num_outputs=1)]
