"""Exercise: HardSwish, an op the loop generator lacks, written as a chain it can fuse (notebook 01).

ONNX's HardSwish is ``x * max(0, min(1, x / 6 + 1 / 2))`` (MobileNetV3's activation); `fusionlab.lessons.codegen`
has no template for it. The learner writes a chain spec, a list of steps such as ``[("Mul", 0.5), ("Add", 1.0)]``
in the form notebook 01's section 2 uses (``("Mul", "x")`` multiplies by the chain's input), that computes it.
`check(spec)` generates the fused loop with `codegen.fuse_elementwise`, runs it on each hidden case's input, and
compares it with onnxruntime running one HardSwish node (graph optimisations off), at float32 tolerances (rtol
1e-4, atol 1e-5 scaled by the output's magnitude; NaN must stay NaN, an infinity the same infinity). The hint names
the input where they differ most, what HardSwish is there, and the mistake a chain without a Clip or without the
multiply by x makes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import helper

from ..build import make_model, value_info
from ..lessons import codegen
from ..verification.runtime import run
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, first_difference, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "hardswish_model"]

EXERCISE = "HardSwish as a chain codegen fuses"
TASK = "a list of steps (a chain spec, as in section 2)"
RTOL, ATOL = 1e-4, 1e-5


@dataclass(frozen=True)
class Inputs:
    """A case's input x: `kind` says how it is drawn, `shape` its shape (float32)."""

    kind: str
    shape: tuple

    def array(self) -> np.ndarray:
        rng = np.random.default_rng(2101)
        f32 = np.float32
        if self.kind == "inside":
            x = rng.uniform(-2.999, 2.999, self.shape)
        elif self.kind == "wide":
            x = rng.uniform(-8.0, 8.0, self.shape)
        elif self.kind == "bends":
            at = np.array([-3.0, 3.0], f32)
            x = np.concatenate([at, np.nextafter(at, f32(np.inf)), np.nextafter(at, f32(-np.inf)), [0.0]])
        elif self.kind == "far":
            x = rng.choice([-1.0, 1.0], self.shape) * 10.0 ** rng.uniform(1, 4, self.shape)
        else:  # "special"
            x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0], f32)
        return np.asarray(x, f32).reshape(self.shape)


CASES = (
    Case("4,096 values between the bends, in (-3, 3)", Inputs("inside", (4096,))),
    Case("values beyond the bends too, in [-8, 8]: an NCHW map [2, 8, 16, 16]", Inputs("wide", (2, 8, 16, 16))),
    Case("x = -3 and 3, and the float32 values either side", Inputs("bends", (7,))),
    Case("far from the bends: |x| from 10 to 1e4", Inputs("far", (512,))),
    Case("NaN, +inf and -inf, as onnxruntime's HardSwish returns them", Inputs("special", (6,))),
)


def hardswish_model(shape):
    """One HardSwish node (opset 17) over a float32 input of `shape`."""
    return make_model([helper.make_node("HardSwish", ["x"], ["y"])], [value_info("x", np.float32, list(shape))],
                      [value_info("y", np.float32, list(shape))], name="hardswish")


def _region(x: float) -> str:
    if not np.isfinite(x):
        return "onnxruntime gives NaN for NaN and for -inf (0 times -inf), inf for inf"
    if x >= 3:
        return "for x >= 3 HardSwish is x itself"
    if x <= -3:
        return "for x <= -3 HardSwish is 0"
    return "between the bends HardSwish is x * (x + 3) / 6"


def _mistake(spec) -> str:
    ops = [step[0] if isinstance(step, (tuple, list)) and step else step for step in spec]
    reads_x = any(isinstance(o, str) and o == "x" for step in spec if isinstance(step, (tuple, list)) for o in step[1:])
    if "Clip" not in ops and "Relu" not in ops:
        return "; your chain has no Clip, so nothing bends it at -3 and 3"
    if not reads_x:
        return "; no step multiplies by x (\"Mul\", \"x\"): that chain is HardSigmoid, not HardSwish"
    return ""


def _compare(have: np.ndarray, want: np.ndarray) -> tuple[float, tuple[int, ...]] | None:
    """first_difference, where equal infinities and NaN against NaN count as equal."""
    same = (have == want) | (np.isnan(have) & np.isnan(want))
    atol = ATOL * max(1.0, float(np.max(np.abs(want[np.isfinite(want)]), initial=0.0)))
    return first_difference(np.where(same, 0.0, have), np.where(same, 0.0, want), RTOL, atol)


def _judge(spec, case: Case) -> str | None:
    if not isinstance(spec, (list, tuple)):
        return f"answer with a list of steps, as spec in section 2; got {type(spec).__name__}"
    if not spec:
        return "the chain is empty: it needs at least one step"
    if any(s is Ellipsis or (isinstance(s, (tuple, list)) and Ellipsis in s) for s in spec):
        raise NotAnswered
    c: Inputs = case.data
    kernel = attempt(codegen.fuse_elementwise, spec, shape=c.shape, name="hard_swish")
    if kernel.inputs != ["x"]:
        others = [i for i in kernel.inputs if i != "x"]
        return f"your chain reads inputs other than x ({', '.join(others)}): a string operand names an input"
    x = case.data.array()
    with np.errstate(all="ignore"):
        have = kernel(x)
    want = run(hardswish_model(c.shape), {"x": x})["y"]
    out = _compare(have, want)
    if out is None:
        return None
    _, idx = out
    at, got, ref = (float(a[idx]) + 0.0 for a in (x, have, want))  # + 0.0: print -0 as 0
    return (f"at x = {at:.9g} your fused loop gives {got:.9g}, onnxruntime's HardSwish {ref:.9g} "
            f"({_region(at)}){_mistake(spec)}")


def check(spec) -> Verdict:
    """Grade a chain spec for HardSwish: codegen's fused loop against onnxruntime's HardSwish on hidden inputs."""
    return grade(EXERCISE, spec, CASES, _judge, task=TASK,
                 checked="Each input: codegen.fuse_elementwise(your spec) against onnxruntime running HardSwish, "
                         "fp32 rtol 1e-4, atol 1e-5 (scaled by the output's magnitude).")
