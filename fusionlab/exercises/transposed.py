"""Exercise: fold a BatchNormalization into the ConvTranspose before it (notebook 02).

The learner writes ``fold_bn(W, b, gamma, beta, mean, var, eps, group) -> (W2, b2)``: W is the ConvTranspose's
weight (C_in, C_out / group, *k), output channels on axis 1 per group (notebook 02 §3); b its bias (C_out,) or
None; the BN's parameters are (C_out,) each. `check(fold_bn)` builds each hidden case's ConvTranspose ->
BatchNormalization graph, runs it in onnxruntime with graph optimisations off, runs a single ConvTranspose with the
learner's (W2, b2) on the same input, and compares them at float32 tolerances (rtol 1e-4, atol 1e-5 scaled by the
output's magnitude, as `fusionlab.verify` does). When they differ, the hint compares the learner's weights and bias
with `derive.fold_conv_bn(..., transpose=True)` and names the mistake they look like: weight axis 0 scaled (as for
a Conv; when C_in != C_out that raises a broadcasting error, and the hint says so), every group scaled by the first group's factors, or the write-up's bias beta - s * mean, which forgets
the ConvTranspose's own bias.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import helper

from ..analysis import derive
from ..build import make_model, tensor, value_info
from ..verification.runtime import run
from .core import (AnswerRaised, Case, Verdict, attempt, first_difference, grade, output_difference, weight_pair,
                   where)

__all__ = ["EXERCISE", "TASK", "CASES", "check"]

EXERCISE = "fold BatchNormalization into a ConvTranspose"
TASK = "fold_bn(W, b, gamma, beta, mean, var, eps, group) returning (W2, b2)"
RTOL, ATOL = 1e-4, 1e-5


@dataclass(frozen=True)
class TCase:
    """A ConvTranspose (`c_in` -> `c_out` channels, kernel `k` on each of `dims` spatial axes, `group`), then BN."""

    c_in: int
    c_out: int
    k: int
    group: int
    bias: bool
    stride: int = 1
    dims: int = 2
    eps: float = 1e-5
    dead: bool = False  # one channel with variance 0
    seed: int = 0

    def arrays(self):
        rng = np.random.default_rng(2000 + self.seed)
        w = rng.standard_normal((self.c_in, self.c_out // self.group) + (self.k,) * self.dims).astype(np.float32)
        b = rng.standard_normal(self.c_out).astype(np.float32) if self.bias else None
        gamma = rng.uniform(0.5, 1.5, self.c_out)
        beta = rng.standard_normal(self.c_out)
        mean = rng.standard_normal(self.c_out)
        var = rng.uniform(0.5, 2.0, self.c_out)
        if self.dead:
            var[-1] = 0.0
        bn = tuple(a.astype(np.float32) for a in (gamma, beta, mean, var))
        x = rng.standard_normal((2, self.c_in) + (5,) * self.dims).astype(np.float32)
        return w, b, bn, x


#: the hidden cases, in the order they are graded
CASES = (
    Case("ConvTranspose 4 -> 6 channels with bias, stride 2", TCase(4, 6, 3, 1, True, stride=2, seed=1)),
    Case("ConvTranspose 4 -> 6 channels without a bias", TCase(4, 6, 3, 1, False, seed=2)),
    Case("8 -> 8 channels, one group: weight axis 0 has the right length", TCase(8, 8, 3, 1, True, stride=2, seed=3)),
    Case("group=2, 8 -> 6 channels", TCase(8, 6, 3, 2, True, stride=2, seed=4)),
    Case("depthwise ConvTranspose (group = 4 = channels), no bias", TCase(4, 4, 3, 4, False, seed=5)),
    Case("1-D ConvTranspose (weight of rank 3), group=3, 6 -> 9 channels", TCase(6, 9, 4, 3, True, stride=2, dims=1,
                                                                                    seed=6)),
    Case("epsilon 1e-3 and a channel whose variance is 0", TCase(3, 5, 2, 1, True, eps=1e-3, dead=True, seed=7)),
)


def _conv_node(c: TCase, inputs, out):
    return helper.make_node("ConvTranspose", inputs, [out], kernel_shape=[c.k] * c.dims, group=c.group,
                            strides=[c.stride] * c.dims)


def _out_shape(c: TCase, x: np.ndarray) -> list[int]:
    return [x.shape[0], c.c_out] + [(side - 1) * c.stride + c.k for side in x.shape[2:]]


def unfused_model(c: TCase):
    """The ConvTranspose -> BatchNormalization graph of a case."""
    w, b, (gamma, beta, mean, var), x = c.arrays()
    inits = [tensor("W", w)] + ([tensor("B", b)] if b is not None else [])
    inits += [tensor(n, a) for n, a in (("gamma", gamma), ("beta", beta), ("mean", mean), ("var", var))]
    nodes = [_conv_node(c, ["x", "W"] + (["B"] if b is not None else []), "t"),
             helper.make_node("BatchNormalization", ["t", "gamma", "beta", "mean", "var"], ["y"], epsilon=c.eps)]
    return make_model(nodes, [value_info("x", np.float32, list(x.shape))],
                      [value_info("y", np.float32, _out_shape(c, x))], inits)


def folded_model(c: TCase, w2: np.ndarray, b2: np.ndarray):
    x = c.arrays()[3]
    return make_model([_conv_node(c, ["x", "W", "B"], "y")], [value_info("x", np.float32, list(x.shape))],
                      [value_info("y", np.float32, _out_shape(c, x))], [tensor("W", w2), tensor("B", b2)])


def _close(got, want) -> bool:
    return np.shape(got) == np.shape(want) and first_difference(got, want, RTOL, ATOL) is None


def _weight_mistake(c: TCase, w2, w, scale) -> str:
    """The plausible mistake the learner's weights look like, or ''."""
    if c.c_in == c.c_out and _close(w2, derive.fold_affine(w, None, scale, 0 * scale).weight):
        return " (they look like weight axis 0 scaled, the input channels, as for a Conv)"
    per = c.c_out // c.group
    if c.group > 1 and _close(w2, w * scale[:per].reshape((1, per) + (1,) * c.dims)):
        return " (they look like every group scaled by the first group's factors)"
    return ""


def _judge(fold_bn, case: Case) -> str | None:
    c: TCase = case.data
    w, b, bn, x = c.arrays()
    try:
        got = attempt(fold_bn, w.copy(), None if b is None else b.copy(), *(a.copy() for a in bn), c.eps, c.group)
    except AnswerRaised as exc:
        if "broadcast" in str(exc) and c.c_in != c.c_out:
            raise AnswerRaised(f"{exc} (it looks like the C_out = {c.c_out} factors laid along weight axis 0, "
                               f"which has C_in = {c.c_in} entries: on a ConvTranspose the output channels are "
                               f"axis 1)") from None
        raise
    got = weight_pair(got, "fold_bn", "ConvTranspose", w.shape, c.c_out)
    if isinstance(got, str):
        return got
    w2, b2 = got
    want = run(unfused_model(c), {"x": x})["y"]
    have = run(folded_model(c, w2.astype(np.float32), b2.astype(np.float32)), {"x": x})["y"]
    out = output_difference(have, want, RTOL, ATOL)
    if out is None:
        return None
    exact = derive.fold_conv_bn(w.astype(np.float64), b, *bn, c.eps, group=c.group, transpose=True)
    scale, shift = derive.bn_scale_shift(*bn, c.eps)
    parts = [f"your ConvTranspose's output differs from onnxruntime's ConvTranspose -> BN by {where(out)}"]
    wd = first_difference(w2, exact.weight, RTOL, ATOL)
    if wd is not None:
        parts.append(f"your weights differ from the exact fold by {where(wd)}" + _weight_mistake(c, w2, w, scale))
    bd = first_difference(b2, exact.bias, RTOL, ATOL)
    if bd is not None:
        why = ""
        if b is not None and _close(b2, shift):
            why = " (it looks like the write-up's beta - s * mean, which forgets the ConvTranspose's own bias)"
        parts.append(f"your bias differs by {where(bd)}{why}")
    return "; ".join(parts)


def check(fold_bn) -> Verdict:
    """Grade `fold_bn(W, b, gamma, beta, mean, var, eps, group) -> (W2, b2)` on the hidden ConvTranspose cases."""
    return grade(EXERCISE, fold_bn, CASES, _judge, task=TASK,
                 checked="Each case: your folded ConvTranspose against onnxruntime running the unfused ConvTranspose "
                         "-> BatchNormalization, fp32 rtol 1e-4, atol 1e-5 (scaled by the output's magnitude).")
