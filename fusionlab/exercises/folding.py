"""Exercise: fold a Conv followed by a per-channel Mul into the Conv's weights, by hand (notebook 02).

The learner writes ``fold(W, b, scale) -> (W2, b2)``: W is the Conv's weight (C_out, C_in / group, kH, kW), b its
bias (C_out,) or None, scale the Mul's constant as the graph stores it: (C_out, 1, 1), (1, C_out, 1, 1) or one
factor (1,) (a (C_out,) constant would broadcast along the width, not the channels). `check(fold)` builds each
hidden case's Conv -> Mul graph, runs it in onnxruntime with graph optimisations off, runs a single Conv with the
learner's (W2, b2) on the same input, and compares them at float32 tolerances (rtol 1e-4, atol 1e-5 scaled by the
output's magnitude, as `fusionlab.verify` does). The hint names the first case whose outputs differ and, beside it,
where the learner's weights or bias differ most from the exact fold (computed in float64).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import helper

from ..build import make_model, tensor, value_info
from ..verification.runtime import run
from .core import Case, Verdict, attempt, first_difference, grade, output_difference, where, weight_pair

__all__ = ["EXERCISE", "TASK", "CASES", "check", "exact_fold"]

EXERCISE = "fold Conv -> Mul into the Conv"
TASK = "fold(W, b, scale) returning (W2, b2)"
RTOL, ATOL = 1e-4, 1e-5


@dataclass(frozen=True)
class FoldCase:
    """A Conv (`c_in` -> `c_out` channels, `k` x `k`, `group`) and the shape of the Mul's constant."""

    c_in: int
    c_out: int
    k: int
    group: int
    bias: bool
    scale_shape: tuple
    stride: int = 1
    seed: int = 0

    def arrays(self):
        rng = np.random.default_rng(1000 + self.seed)
        w = rng.standard_normal((self.c_out, self.c_in // self.group, self.k, self.k)).astype(np.float32)
        b = rng.standard_normal(self.c_out).astype(np.float32) if self.bias else None
        n = int(np.prod(self.scale_shape))
        s = (rng.uniform(0.5, 2.0, n) * rng.choice([-1.0, 1.0], n)).astype(np.float32).reshape(self.scale_shape)
        x = rng.standard_normal((2, self.c_in, 9, 9)).astype(np.float32)
        return w, b, s, x


#: the hidden cases, in the order they are graded
CASES = (
    Case("3x3 Conv 4 -> 6 channels with bias, scale (6, 1, 1)", FoldCase(4, 6, 3, 1, True, (6, 1, 1), seed=1)),
    Case("Conv without a bias, scale (6, 1, 1)", FoldCase(4, 6, 3, 1, False, (6, 1, 1), seed=2)),
    Case("scale of shape (1, C, 1, 1) and stride 2", FoldCase(3, 5, 3, 1, True, (1, 5, 1, 1), stride=2, seed=4)),
    Case("Conv with group=2 (8 -> 6 channels), scale (6, 1, 1)", FoldCase(8, 6, 3, 2, True, (6, 1, 1), seed=5)),
    Case("depthwise Conv (group = 4 = channels) without bias", FoldCase(4, 4, 3, 4, False, (4, 1, 1), seed=6)),
    Case("1x1 Conv, one factor for every channel: scale (1,)", FoldCase(6, 8, 1, 1, True, (1,), seed=7)),
    Case("5x5 Conv 2 -> 3 channels, negative factors, scale (3, 1, 1)", FoldCase(2, 3, 5, 1, True, (3, 1, 1),
                                                                                    seed=8)),
)


def _conv_node(c: FoldCase, inputs, out):
    pad = c.k // 2
    return helper.make_node("Conv", inputs, [out], kernel_shape=[c.k, c.k], pads=[pad] * 4, group=c.group,
                            strides=[c.stride, c.stride])


def _out_shape(c: FoldCase, x: np.ndarray) -> list[int]:
    side = (x.shape[2] + 2 * (c.k // 2) - c.k) // c.stride + 1
    return [x.shape[0], c.c_out, side, side]


def unfused_model(c: FoldCase):
    """The Conv -> Mul graph of a case."""
    w, b, s, x = c.arrays()
    inits = [tensor("W", w), tensor("S", s)] + ([tensor("B", b)] if b is not None else [])
    nodes = [_conv_node(c, ["x", "W"] + (["B"] if b is not None else []), "conv"),
             helper.make_node("Mul", ["conv", "S"], ["y"])]
    return make_model(nodes, [value_info("x", np.float32, list(x.shape))],
                      [value_info("y", np.float32, _out_shape(c, x))], inits)


def folded_model(c: FoldCase, w2: np.ndarray, b2: np.ndarray):
    x = c.arrays()[3]
    nodes = [_conv_node(c, ["x", "W", "B"], "y")]
    return make_model(nodes, [value_info("x", np.float32, list(x.shape))],
                      [value_info("y", np.float32, _out_shape(c, x))], [tensor("W", w2), tensor("B", b2)])


def exact_fold(w, b, s):
    """The fold in float64: W2 = W * s per output channel (axis 0), b2 = b * s."""
    scale = np.broadcast_to(np.asarray(s, np.float64).reshape(-1), (w.shape[0],))
    w2 = np.asarray(w, np.float64) * scale.reshape(-1, 1, 1, 1)
    b2 = (np.zeros(w.shape[0]) if b is None else np.asarray(b, np.float64)) * scale
    return w2, b2


def _judge(fold, case: Case) -> str | None:
    c: FoldCase = case.data
    w, b, s, x = c.arrays()
    got = weight_pair(attempt(fold, w.copy(), None if b is None else b.copy(), s.copy()), "fold", "Conv", w.shape,
                      c.c_out, bias_none=f"b2 is None; the folded Conv needs a bias even when the original had none "
                                         f"(its {c.c_out} values are the scale times a bias of zeros)")
    if isinstance(got, str):
        return got
    w2, b2 = got
    want = run(unfused_model(c), {"x": x})["y"]
    have = run(folded_model(c, w2.astype(np.float32), b2.astype(np.float32)), {"x": x})["y"]
    out = output_difference(have, want, RTOL, ATOL)
    if out is None:
        return None
    ew, eb = exact_fold(w, b, s)
    wd = first_difference(w2, ew, RTOL, ATOL)
    bd = first_difference(b2, eb, RTOL, ATOL)
    parts = [f"your Conv's output differs from onnxruntime's Conv -> Mul by {where(out)}"]
    if wd is not None:
        parts.append(f"your weights differ from the exact fold by {where(wd)}")
    if bd is not None:
        parts.append(f"your bias differs by {where(bd)}" + (" (the Conv has no bias: b2 is scale times 0)"
                                                             if b is None else ""))
    return "; ".join(parts)


def check(fold) -> Verdict:
    """Grade `fold(W, b, scale) -> (W2, b2)` on the hidden cases (onnxruntime, graph optimisations off)."""
    return grade(EXERCISE, fold, CASES, _judge, task=TASK,
                 checked="Each case: your folded Conv against onnxruntime running the unfused Conv -> Mul, fp32 rtol "
                         "1e-4, atol 1e-5 (scaled by the output's magnitude).")
