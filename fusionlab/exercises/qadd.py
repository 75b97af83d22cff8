"""Exercise: add two differently scaled uint8 tensors, as a residual QLinearAdd does (notebook 14).

The learner writes ``qlinear_add(qa, sa, za, qb, sb, zb, sy, zy) -> uint8``: what onnxruntime's ``QLinearAdd``
writes for two uint8 tensors, each with its own scale and zero point, onto the output's grid (notebook 14 §4.2):
y = saturate(round((sa / sy)·(qa − za) + (sb / sy)·(qb − zb)) + zy), rounding half to even. Two integers of
different scales cannot be added as integers; each input needs its own multiplier. `check(qlinear_add)` compares
the answer with onnxruntime on the same integers and scales (`lessons.quantization.run_qlinear_add`: DQ, DQ → Add
→ Q at level ALL, which onnxruntime fuses into one ``QLinearAdd``). The cases include equal scales (where adding
the integers is right), scales several times apart, exact ties, saturation at 0 and 255, and an output zero point
of 0. The hint names adding the integers as they are, one multiplier for both inputs, a forgotten zero point,
``q − z`` computed in uint8 (it wraps around below 0), rounding a tie up and a missing clip.

The random cases leave out the elements whose exact sum lies within 1e-3 of a rounding boundary (k + 1/2 not hit
exactly): there float32 arithmetic in another order, which onnxruntime's kernel may use, can round either way.
The tie case uses power-of-two scales, so that its halves are exact in every order.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..lessons.quantization import run_qlinear_add
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "exact_sum"]

EXERCISE = "add two differently scaled uint8 tensors"
TASK = "qlinear_add(qa, sa, za, qb, sb, zb, sy, zy)"
#: how far from a rounding boundary every element of a random case lies (in output steps)
MARGIN = 1e-3


@dataclass(frozen=True)
class AddCase:
    qa: np.ndarray  # uint8 [n]
    sa: float
    za: int
    qb: np.ndarray  # uint8 [n]
    sb: float
    zb: int
    sy: float
    zy: int

    def __hash__(self):  # frozen dataclass of arrays: hashed by identity
        return id(self)

    @property
    def args(self) -> tuple:
        return (self.qa, self.sa, self.za, self.qb, self.sb, self.zb, self.sy, self.zy)


def exact_sum(c: AddCase) -> np.ndarray:
    """The real sum on the output's grid before rounding, in float64: (sa·(qa − za) + sb·(qb − zb)) / sy."""
    a, b = c.qa.astype(np.int64) - c.za, c.qb.astype(np.int64) - c.zb
    return (c.sa * a + c.sb * b) / c.sy


def _random_case(seed: int, n: int, sa: float, za: int, sb: float, zb: int, sy: float, zy: int) -> AddCase:
    rng = np.random.default_rng(seed)
    qa, qb = (rng.integers(0, 256, 4 * n).astype(np.uint8) for _ in range(2))
    sa, sb, sy = (float(np.float32(v)) for v in (sa, sb, sy))
    c = AddCase(qa, sa, za, qb, sb, zb, sy, zy)
    frac = exact_sum(c) - np.floor(exact_sum(c))
    keep = np.flatnonzero(np.abs(frac - 0.5) > MARGIN)[:n]  # see the module's docstring
    return AddCase(qa[keep], sa, za, qb[keep], sb, zb, sy, zy)


def _tie_case() -> AddCase:
    """Power-of-two scales, sa / sy = sb / sy = 1/2: every odd (qa − za) + (qb − zb) is an exact k + 1/2."""
    qa = np.arange(0, 48, dtype=np.uint8)
    return AddCase(qa, 0.125, 20, np.full(48, 7, np.uint8), 0.125, 0, 0.25, 100)


CASES = (
    Case("equal scales and zero points: the integers add, less one zero point",
         _random_case(1, 64, 0.05, 128, 0.05, 128, 0.05, 128)),
    Case("scales like a residual block's: s_a / s_y = 1.12, s_b / s_y = 0.95",
         _random_case(2, 256, 0.0641, 131, 0.0542, 118, 0.0571, 125)),
    Case("one input's scale 3.5 times the other's, s_b / s_y = 1.9",
         _random_case(3, 256, 0.0394, 140, 0.1373, 92, 0.0721, 110)),
    Case("exact ties: the sum is k + 1/2, rounded half to even", _tie_case()),
    Case("a narrow output range: saturate at 0 and at 255", _random_case(4, 256, 0.08, 128, 0.06, 100, 0.02, 128)),
    Case("an output zero point of 0 (a Relu's range): negative sums saturate at 0",
         _random_case(5, 256, 0.03, 100, 0.05, 150, 0.04, 0)),
)


@functools.lru_cache(maxsize=None)
def _truth(i: int) -> np.ndarray:
    return run_qlinear_add(*CASES[i].data.args)


def _mistake(c: AddCase, got: np.ndarray) -> str:
    """The plausible mistakes that give exactly `got`, in words ("" if none does)."""
    a, b = c.qa.astype(np.int64) - c.za, c.qb.astype(np.int64) - c.zb
    v = exact_sum(c)
    said = [words for value, words in (
        (np.clip(a + b + c.zy, 0, 255), "the integers added as they are: each needs its own multiplier s / s_y"),
        (np.clip(np.rint(c.sa / c.sy * (a + b)) + c.zy, 0, 255), "s_a / s_y used for both inputs: q_b has its own "
                                                                  "scale"),
        (np.clip(np.rint((c.sa * c.qa.astype(np.int64) + c.sb * c.qb.astype(np.int64)) / c.sy) + c.zy, 0, 255),
         "the inputs' zero points forgotten: subtract z_a and z_b first"),
        (np.clip(np.rint(v), 0, 255), "the output's zero point forgotten"),
        (np.clip(np.rint((c.sa * (a % 256) + c.sb * (b % 256)) / c.sy) + c.zy, 0, 255),
         "q - z computed in uint8 wraps around below 0: cast to int first"),
        (np.clip(np.floor(v + 0.5) + c.zy, 0, 255), "a tie rounded up: QLinearAdd rounds it to even (np.rint)"),
        ((np.rint(v) + c.zy).astype(np.int64) % 256, "no saturation: uint8 wraps around, clip to 0..255 first"))
        if value.shape == got.shape and np.array_equal(value.astype(np.int64), got)]
    return f" (that is {' or '.join(said)})" if said else ""


def _judge(qlinear_add, case: Case) -> str | None:
    c: AddCase = case.data
    got = attempt(qlinear_add, c.qa.copy(), c.sa, c.za, c.qb.copy(), c.sb, c.zb, c.sy, c.zy)
    if is_stub(got):
        raise NotAnswered
    try:
        got_arr = np.asarray(got)
        got_i = got_arr.astype(np.int64)
    except (TypeError, ValueError):
        raise AnswerRaised(f"qlinear_add must return an array, got {type(got).__name__}") from None
    want = _truth(CASES.index(case))
    if got_i.shape != want.shape:
        return f"your result has shape {got_i.shape}; the inputs have {c.qa.shape}"
    bad = np.flatnonzero(got_i != want.astype(np.int64))
    if bad.size:
        i = int(bad[0])
        return (f"at [{i}], q_a = {int(c.qa[i])} and q_b = {int(c.qb[i])}: you give {int(got_i[i])}, onnxruntime's "
                f"QLinearAdd {int(want[i])}{_mistake(c, got_i)}")
    if got_arr.dtype != np.uint8:
        return f"the values are right, but the array is {got_arr.dtype}: QLinearAdd's output is uint8"
    return None


def check(qlinear_add) -> Verdict:
    """Grade `qlinear_add(qa, sa, za, qb, sb, zb, sy, zy)` on the hidden cases."""
    return grade(EXERCISE, qlinear_add, CASES, _judge, task=TASK,
                 checked="Each case: your uint8 sum against onnxruntime's QLinearAdd (DQ, DQ -> Add -> Q, fused) run "
                         "on the same uint8 inputs, scales and zero points.")
