"""Exercise: BatchNormalization at inference is one multiply and one add per channel (notebook 00).

The learner writes ``bn_affine(gamma, beta, mean, var, eps) -> (scale, shift)``, each of shape (C,), such that
``scale * x + shift`` (per channel, axis 1) is what ONNX's BatchNormalization computes at inference,
``gamma * (x - mean) / sqrt(var + eps) + beta``. `check(bn_affine)` runs a BatchNormalization node in onnxruntime
(graph optimisations off) on each hidden case's input, applies the learner's (scale, shift) to the same input, and
compares them at float32 tolerances (rtol 1e-4, atol 1e-5 scaled by the output's magnitude, as `fusionlab.verify`
does). The hint names the channel where they differ most and, where the answer matches it, the mistake: eps left
out of the square root (or added outside it), the square root forgotten, or the mean scaled by gamma alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import helper

from ..build import make_model, tensor, value_info
from ..verification.runtime import run
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, first_difference, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "bn_model"]

EXERCISE = "BatchNormalization as scale and shift"
TASK = "bn_affine(gamma, beta, mean, var, eps) returning (scale, shift)"
RTOL, ATOL = 1e-4, 1e-5


@dataclass(frozen=True)
class BNCase:
    """A BatchNormalization over `channels` channels of an input of `shape`, its statistics drawn from `seed`."""

    channels: int
    eps: float
    shape: tuple
    negative_gamma: bool = False
    zero_var: bool = False
    var_range: tuple = (0.5, 2.0)
    seed: int = 0

    def arrays(self):
        rng = np.random.default_rng(2100 + self.seed)
        c = self.channels
        gamma = rng.uniform(0.5, 1.5, c)
        if self.negative_gamma:
            gamma *= np.where(np.arange(c) % 2 == 1, -1.0, 1.0)
        beta = rng.standard_normal(c) * 0.5
        mean = rng.standard_normal(c)
        var = rng.uniform(*self.var_range, c)
        if self.zero_var:
            var[::3] = 0.0  # a channel that was constant over the training set
        x = rng.standard_normal(self.shape)
        f32 = np.float32
        return gamma.astype(f32), beta.astype(f32), mean.astype(f32), var.astype(f32), x.astype(f32)


CASES = (
    Case("16 channels, eps 1e-5, as in notebook 00's model", BNCase(16, 1e-5, (1, 16, 8, 8), seed=1)),
    Case("negative gamma on every other channel", BNCase(8, 1e-5, (2, 8, 6, 6), negative_gamma=True, seed=2)),
    Case("channels whose variance is 0 (eps keeps the division finite)",
         BNCase(9, 1e-3, (1, 9, 5, 5), zero_var=True, seed=3)),
    Case("a large eps (0.5) beside small variances", BNCase(6, 0.5, (1, 6, 7, 7), var_range=(0.01, 0.2), seed=4)),
    Case("a [N, C] input (BatchNormalization after a Gemm), 64 channels", BNCase(64, 1e-5, (4, 64), seed=5)),
)


def bn_model(c: BNCase, gamma, beta, mean, var):
    """One BatchNormalization node of the case, in inference mode."""
    inits = [tensor("gamma", gamma), tensor("beta", beta), tensor("mean", mean), tensor("var", var)]
    node = helper.make_node("BatchNormalization", ["x", "gamma", "beta", "mean", "var"], ["y"], epsilon=c.eps)
    return make_model([node], [value_info("x", np.float32, list(c.shape))],
                      [value_info("y", np.float32, list(c.shape))], inits, name="batchnorm")


def _per_channel(v: np.ndarray, rank: int) -> np.ndarray:
    return v.reshape((1, -1) + (1,) * (rank - 2))


def _mistake(gamma, beta, mean, var, eps, scale, shift) -> str:
    """The plausible mistake the answer matches, or ''."""
    g, b, m, v = (np.asarray(a, np.float64) for a in (gamma, beta, mean, var))
    right = g / np.sqrt(v + eps)
    with np.errstate(divide="ignore", invalid="ignore"):
        scales = (("eps left out of the root: scale = gamma / sqrt(var)", g / np.sqrt(v)),
                  ("eps added outside the root: scale = gamma / (sqrt(var) + eps)", g / (np.sqrt(v) + eps)),
                  ("the root forgotten: scale = gamma / (var + eps)", g / (v + eps)))

    def near(a, b):
        return a.shape == b.shape and np.allclose(a, b, rtol=RTOL, atol=0, equal_nan=True)

    for words, wrong in scales:
        if not near(wrong, right) and near(scale, wrong):
            return f"; that looks like {words}"
    if near(scale, right) and not near(shift, b - m * right) and near(shift, b - m * g):
        return "; that looks like shift = beta - mean * gamma: the mean is scaled like x, by scale, not gamma"
    return ""


def _judge(bn_affine, case: Case) -> str | None:
    c: BNCase = case.data
    gamma, beta, mean, var, x = c.arrays()
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        got = attempt(bn_affine, gamma.copy(), beta.copy(), mean.copy(), var.copy(), c.eps)
    if got is None:
        raise NotAnswered
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return f"bn_affine must return a pair (scale, shift); it returned {type(got).__name__}"
    if any(is_stub(v) for v in got):
        raise NotAnswered
    try:
        scale, shift = (np.asarray(v, np.float64).reshape(-1) if np.ndim(v) else np.asarray(v, np.float64)
                        for v in got)
    except (TypeError, ValueError) as exc:
        raise AnswerRaised(f"scale and shift must be arrays of numbers ({exc})") from None
    for name, v in (("scale", scale), ("shift", shift)):
        if v.shape != (c.channels,):
            return f"{name} has shape {list(v.shape)}; it needs one value per channel: [{c.channels}]"
    want = run(bn_model(c, gamma, beta, mean, var), {"x": x})["y"]
    with np.errstate(invalid="ignore", over="ignore"):
        have = x * _per_channel(scale, x.ndim) + _per_channel(shift, x.ndim)
    atol = ATOL * max(1.0, float(np.max(np.abs(want))))
    out = first_difference(have, want, RTOL, atol)
    if out is None:
        return None
    err, idx = out
    say = "not finite" if not np.isfinite(have[idx]) else f"{have[idx]:.6g}"
    return (f"at channel {idx[1]} (var {float(var[idx[1]]):.3g}, eps {c.eps:g}) your scale * x + shift is {say}, "
            f"onnxruntime's BatchNormalization gives {float(want[idx]):.6g}"
            f"{_mistake(gamma, beta, mean, var, c.eps, scale, shift)}")


def check(bn_affine) -> Verdict:
    """Grade `bn_affine(gamma, beta, mean, var, eps) -> (scale, shift)` against onnxruntime's BatchNormalization."""
    return grade(EXERCISE, bn_affine, CASES, _judge, task=TASK,
                 checked="Each case: scale * x + shift against onnxruntime running the BatchNormalization, fp32 "
                         "rtol 1e-4, atol 1e-5 (scaled by the output's magnitude).")
