"""Exercise: the numpy kernel of a fused MatMul + Add + ReLU, run by onnxruntime as a custom op (notebook 16).

The learner writes ``matmul_add_relu(x1, x2, bias) -> y`` in numpy: ``relu(x1 @ x2 + bias)`` with ONNX's MatMul
semantics (stacked matrices broadcast). `check(matmul_add_relu)` registers it with onnxruntime-extensions' PyOp bridge
the way `fusionlab.export.kernels.register` registers a declaration's kernel (domain `ai.onnx.contrib`, float32
inputs), runs a one-node model of that op in onnxruntime on each hidden case's inputs, and compares the output with
onnxruntime running the unfused MatMul -> Add -> Relu (graph optimisations off) at fp32 tolerances (rtol 1e-4, atol
1e-5 scaled by the output's magnitude, as `verify` does). The hint names the likely mistake: the ReLU applied before
the bias, no ReLU, no bias, or `np.dot`, which is not MatMul for stacked matrices.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
from onnx import helper

from ..build import make_model, value_info
from ..export.kernels import DOMAIN, _extensions, library_path
from ..verification.runtime import run, session
from .core import AnswerRaised, Case, NotAnswered, Verdict, first_difference, grade

__all__ = ["EXERCISE", "TASK", "CASES", "OP_TYPE", "check", "unfused_model", "fused_model", "run_fused"]

EXERCISE = "the fused MatMulAddRelu kernel"
TASK = "matmul_add_relu(x1, x2, bias) returning y"
RTOL, ATOL = 1e-4, 1e-5
#: the op type the learner's kernel runs under (not MatMulAddRelu, which a learner's own declaration may register)
OP_TYPE = "MatMulAddReluExercise"
INPUTS = ("x1", "x2", "bias")


@dataclass(frozen=True)
class KernelCase:
    x1: tuple
    x2: tuple
    bias: tuple
    seed: int = 0
    bias_shift: float = 0.0  # added to the bias, so the ReLU clips more or less

    def arrays(self):
        rng = np.random.default_rng(4200 + self.seed)
        x1 = rng.standard_normal(self.x1).astype(np.float32)
        x2 = rng.standard_normal(self.x2).astype(np.float32)
        bias = (rng.standard_normal(self.bias) + self.bias_shift).astype(np.float32)
        return {"x1": x1, "x2": x2, "bias": bias}


CASES = (
    Case("2-D: (8, 16) @ (16, 32) + bias (32,)", KernelCase((8, 16), (16, 32), (32,), seed=1)),
    Case("a batch of matrices: (2, 4, 16) @ (16, 8) + bias (8,)", KernelCase((2, 4, 16), (16, 8), (8,), seed=2)),
    Case("a bias pushing most outputs below zero: (6, 10) @ (10, 5) + (bias - 3)",
         KernelCase((6, 10), (10, 5), (5,), seed=3, bias_shift=-3.0)),
    Case("one output column: (6, 10) @ (10, 1) + bias (1,)", KernelCase((6, 10), (10, 1), (1,), seed=4)),
    Case("stacked weights: (3, 4, 5) @ (3, 5, 6) + bias (6,)", KernelCase((3, 4, 5), (3, 5, 6), (6,), seed=5)),
)


def unfused_model(c: KernelCase):
    """MatMul -> Add -> Relu on the case's shapes: the reference onnxruntime runs."""
    nodes = [helper.make_node("MatMul", ["x1", "x2"], ["t"]), helper.make_node("Add", ["t", "bias"], ["u"]),
             helper.make_node("Relu", ["u"], ["y"])]
    return make_model(nodes, [value_info(n, np.float32, list(s)) for n, s in zip(INPUTS, (c.x1, c.x2, c.bias))],
                      [value_info("y", np.float32, None)])


def fused_model(c: KernelCase):
    """One node of OP_TYPE in domain ai.onnx.contrib, as `replace_groups` writes a custom op."""
    node = helper.make_node(OP_TYPE, list(INPUTS), ["y"], domain=DOMAIN)
    return make_model([node], [value_info(n, np.float32, list(s)) for n, s in zip(INPUTS, (c.x1, c.x2, c.bias))],
                      [value_info("y", np.float32, None)], extra_opsets={DOMAIN: 1})


# --------------------------------------------------------------------------------------------------
# the registration: once per process, a trampoline that calls the kernel being graded
# --------------------------------------------------------------------------------------------------

_LOCK = threading.Lock()
_STATE: dict = {"registered": False, "kernel": None, "error": None, "shape": None}


def _trampoline(x1, x2, bias):
    """What onnxruntime calls: the kernel under grading. Its exceptions are kept (and re-raised by `run_fused`), so
    the bridge always gets an array back."""
    try:
        out = _STATE["kernel"](x1, x2, bias)
        if out is Ellipsis or out is None:
            raise NotAnswered
        out = np.asarray(out, dtype=np.float32)
    except NotImplementedError:
        _STATE["error"] = NotAnswered()
        out = np.zeros(_STATE["shape"], np.float32)
    except Exception as exc:  # noqa: BLE001 - the learner's code may raise anything; reported after the run
        _STATE["error"] = exc
        out = np.zeros(_STATE["shape"], np.float32)
    return out


def _register() -> None:
    if _STATE["registered"]:
        return
    ext = _extensions()
    dt = ext.PyCustomOpDef.dt_float
    ext.onnx_op(op_type=OP_TYPE, inputs=[dt, dt, dt], outputs=[dt])(_trampoline)
    _STATE["registered"] = True


def run_fused(kernel, c: KernelCase, feeds: dict) -> np.ndarray:
    """The one-node model run by onnxruntime with `kernel` behind the custom op."""
    want_shape = run(unfused_model(c), feeds)["y"].shape
    with _LOCK:
        _register()
        _STATE.update(kernel=kernel, error=None, shape=want_shape)
        try:
            sess = session(fused_model(c), "disable", custom_ops_library=library_path())
            out = sess.run(["y"], feeds)[0]
        finally:
            error, _STATE["kernel"] = _STATE["error"], None
    if isinstance(error, NotAnswered):
        raise NotAnswered
    if error is not None:
        text = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise AnswerRaised(f"{type(error).__name__}: {text}"[:200] if text else type(error).__name__)
    return out


def _mistake(c: KernelCase, feeds: dict, got: np.ndarray) -> str:
    x1, x2, b = (feeds[n].astype(np.float64) for n in INPUTS)
    mm = np.matmul(x1, x2)
    said = []
    for value, words in ((np.maximum(mm, 0) + b, "the ReLU applied before the bias"),
                         (mm + b, "no ReLU"), (np.maximum(mm, 0), "no bias")):
        if value.shape == got.shape and first_difference(got, value, RTOL, ATOL * max(1.0, np.abs(value).max())) \
                is None:
            said.append(words)
    return f" (that looks like {' or '.join(said)})" if said else ""


def _judge(kernel, case: Case) -> str | None:
    c: KernelCase = case.data
    feeds = c.arrays()
    want = run(unfused_model(c), feeds)["y"]
    have = run_fused(kernel, c, {k: v.copy() for k, v in feeds.items()})
    if have.shape != want.shape:
        dot = np.dot(feeds["x1"], feeds["x2"]).shape if len(c.x2) > 2 else None
        why = " (np.dot's shape: np.dot is not MatMul for stacked matrices; use np.matmul or @)" \
            if dot is not None and tuple(have.shape) == dot else ""
        return f"your kernel returned y {list(have.shape)}; the unfused ops give {list(want.shape)}{why}"
    atol = ATOL * max(1.0, float(np.max(np.abs(want))))
    diff = first_difference(have, want, RTOL, atol)
    if diff is None:
        return None
    err, idx = diff
    return (f"y differs from onnxruntime's MatMul -> Add -> Relu by {err:.3g} at [{','.join(map(str, idx))}]"
            f"{_mistake(c, feeds, have)}")


def check(matmul_add_relu) -> Verdict:
    """Grade `matmul_add_relu(x1, x2, bias) -> y`, run by onnxruntime as a custom op, on the hidden inputs."""
    return grade(EXERCISE, matmul_add_relu, CASES, _judge, task=TASK,
                 checked="Each case: your kernel, run by onnxruntime as a custom op, against onnxruntime's unfused "
                         "MatMul -> Add -> Relu, fp32 rtol 1e-4, atol 1e-5 (scaled by the output's magnitude).")
