"""Exercise: a vectorisable tanh helper built from exp, as notebook 01's section 5 builds its helpers (notebook 01).

Section 5 shows why the loop generator emits small branch-free helpers for transcendentals instead of calling the
scalar C library, and that MLAS clamps tanh's argument to +-9. The learner writes ``tanh(x)`` for a float32 array
with ``np.exp``, arithmetic and clamps (``np.clip``, ``np.where``), whole-array operations a loop can vectorise;
an answer whose code names ``tanh`` (``np.tanh``, ``math.tanh``) is refused. `check(tanh)` compares the answer with
onnxruntime running one Tanh node (graph optimisations off) at section 3's float32 tolerances (rtol 1e-4,
atol 1e-5); NaN must stay NaN. The hidden inputs include arguments where e^(2x) overflows float32 (above
log(float32 max) / 2, about 44.4) and where e^|x| does too (about 88.7), NaN and infinities: the textbook forms
(e^(2x) - 1) / (e^(2x) + 1) and sinh / cosh give inf / inf = NaN there. The hint names the input where the answer
differs most, what tanh is there, and that overflow; a Python `if` on the array or a scalar math call gets a hint
of its own.
"""

from __future__ import annotations

import dis
import math
from dataclasses import dataclass

import numpy as np
from onnx import helper

from ..build import make_model, value_info
from ..verification.runtime import run
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, first_difference, grade

__all__ = ["EXERCISE", "TASK", "CASES", "check", "tanh_model", "OVERFLOW_2X", "OVERFLOW_X"]

EXERCISE = "a tanh helper that survives overflow"
TASK = "tanh(x) with np.exp, arithmetic and np.clip / np.where"
RTOL, ATOL = 1e-4, 1e-5
#: where e^(2x), and e^x, overflow float32
OVERFLOW_X = float(np.log(np.finfo(np.float32).max))
OVERFLOW_2X = OVERFLOW_X / 2


@dataclass(frozen=True)
class Inputs:
    """A case's input x: `kind` says how it is drawn, `shape` its shape (float32)."""

    kind: str
    shape: tuple

    def array(self) -> np.ndarray:
        rng = np.random.default_rng(2103)
        sign = rng.choice([-1.0, 1.0], self.shape)
        if self.kind == "middle":
            x = rng.uniform(-3.0, 3.0, self.shape)
        elif self.kind == "map":
            x = rng.uniform(-6.0, 6.0, self.shape)
        elif self.kind == "over2x":  # e^(2x) overflows, e^|x| does not
            x = sign * rng.uniform(math.ceil(OVERFLOW_2X), math.floor(OVERFLOW_X), self.shape)
        elif self.kind == "overx":  # e^|x| overflows too
            x = sign * 10.0 ** rng.uniform(np.log10(math.ceil(OVERFLOW_X)), 38.0, self.shape)
        else:  # "special"
            x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30], np.float32)
        return np.asarray(x, np.float32).reshape(self.shape)


CASES = (
    Case("1,000 values in [-3, 3]", Inputs("middle", (1000,))),
    Case("an NCHW map [2, 4, 8, 8] of values in [-6, 6]: the output keeps its shape", Inputs("map", (2, 4, 8, 8))),
    Case(f"|x| from {math.ceil(OVERFLOW_2X)} to {math.floor(OVERFLOW_X)}, both signs", Inputs("over2x", (256,))),
    Case(f"|x| from {math.ceil(OVERFLOW_X)} to 1e38, both signs", Inputs("overx", (256,))),
    Case("NaN, +inf, -inf, 0, -0 and 1e-30", Inputs("special", (6,))),
)


def tanh_model(shape):
    """One Tanh node (opset 17) over a float32 input of `shape`."""
    return make_model([helper.make_node("Tanh", ["x"], ["y"])], [value_info("x", np.float32, list(shape))],
                      [value_info("y", np.float32, list(shape))], name="tanh")


def _codes(code):
    """A function's code object and its nested functions'."""
    yield code
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            yield from _codes(const)


def _calls_library_tanh(fn) -> bool:
    """Whether the answer's own code reads np.tanh or math.tanh: an attribute `tanh` of a global that is numpy or
    math, or a global that is one of them (`from numpy import tanh`)."""
    fn = getattr(fn, "__func__", fn)
    code, env = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
    if code is None:
        return False
    libraries, kernels = (np, math), (np.tanh, math.tanh)
    for c in _codes(code):
        before = None
        for ins in dis.get_instructions(c):
            if ins.opname.startswith("LOAD_GLOBAL") and any(env.get(ins.argval) is k for k in kernels):
                return True
            if (ins.argval == "tanh" and ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and before is not None
                    and before.opname.startswith("LOAD_GLOBAL") and any(env.get(before.argval) is m
                                                                        for m in libraries)):
                return True
            before = ins
    return False


def _raised(message: str) -> str:
    said = f"your answer raised {message}"
    if "truth value of an array" in message:
        return said + "; a Python `if` on the array is a branch: select with np.where or clamp with np.clip"
    if "only length-1 arrays" in message or "only 0-dimensional arrays" in message:
        return said + "; math functions take one scalar: use np.exp, which works on the whole array"
    return said


def _why(x: float, got: float) -> str:
    if np.isnan(x):
        return "NaN must stay NaN"
    if np.isinf(x):
        tail = "; e^(2x) is inf there and inf / inf is NaN" if np.isnan(got) else ""
        return f"tanh({x:+g}) is {math.copysign(1, x):+g}{tail}"
    if np.isnan(got) and abs(x) > OVERFLOW_X:
        return (f"e^|x| overflows float32 above |x| = {OVERFLOW_X:.1f} (so do np.sinh and np.cosh), and inf / inf is "
                "NaN: clamp x first, as MLAS clamps it to +-9 (section 5)")
    if np.isnan(got) and abs(x) > OVERFLOW_2X:
        return (f"e^(2x) overflows float32 above x = {OVERFLOW_2X:.1f}, and inf / inf is NaN: clamp x first, as MLAS "
                "clamps it to +-9 (section 5)")
    return "tanh(x) = (e^(2x) - 1) / (e^(2x) + 1)"


def _compare(have: np.ndarray, want: np.ndarray) -> tuple[float, tuple[int, ...]] | None:
    """first_difference, where NaN against NaN counts as equal."""
    same = (have == want) | (np.isnan(have) & np.isnan(want))
    return first_difference(np.where(same, 0.0, have), np.where(same, 0.0, want), RTOL, ATOL)


def _judge(fn, case: Case) -> str | None:
    if not callable(fn):
        return f"answer with a function tanh(x); got {type(fn).__name__}"
    if isinstance(fn, np.vectorize):
        return ("np.vectorize calls a scalar function once per element, a Python loop: write tanh with whole-array "
                "operations (np.exp, np.clip, np.where)")
    c: Inputs = case.data
    x = c.array()
    if _calls_library_tanh(fn):
        return ("your tanh calls the library's tanh (np.tanh or math.tanh): build it from np.exp, as section 5's "
                "helpers are built")
    try:
        with np.errstate(all="ignore"):
            have = attempt(fn, x.copy())
    except AnswerRaised as exc:
        return _raised(str(exc))
    if have is None:
        raise NotAnswered
    if np.ndim(have) == 0:
        return f"your tanh returned one number for an input of shape {list(x.shape)}: it must return an array"
    have = np.asarray(have, dtype=np.float64)
    if have.shape != x.shape:
        return (f"your tanh returned shape {list(have.shape)} for an input of shape {list(x.shape)}: an elementwise "
                "helper keeps the input's shape")
    want = run(tanh_model(c.shape), {"x": x})["y"].astype(np.float64)
    out = _compare(have, want)
    if out is None:
        return None
    _, idx = out
    at, got, ref = (float(a[idx]) + 0.0 for a in (x, have, want))  # + 0.0: print -0 as 0
    return f"at x = {at:.9g} your tanh gives {got:.9g}, onnxruntime's Tanh {ref:.9g}: {_why(at, got)}"


def check(fn) -> Verdict:
    """Grade a tanh(x) built from np.exp against onnxruntime's Tanh on hidden float32 inputs."""
    return grade(EXERCISE, fn, CASES, _judge, task=TASK,
                 checked="Each input: your tanh (built without np.tanh) against onnxruntime running "
                         "Tanh, fp32 rtol 1e-4, atol 1e-5, NaN staying NaN.")
