"""Exercise: declare a fused MatMul + Add + ReLU the way CANN's REG_OP does (notebook 16).

The learner writes ``declare_matmul_add_relu() -> OpDecl`` with `fusionlab.export.reg_op`: inputs `x1`, `x2`,
`bias` and output `y` (CANN MatMul's names) of types DT_FLOAT16 and DT_FLOAT, the built-in MatMul's attributes
`transpose_x1` and `transpose_x2` (Bool, default false), `.fuses("MatMul", "Add", "Relu")`, closed by
`OP_END_FACTORY_REG`. `check(declare_matmul_add_relu)` checks the seed's three rules (`export.declare.problems`)
and the interface, that a node setting no attribute gets the defaults, and then, for hidden input shapes and
dtypes, that `OpDecl.infer` on the declaration gives the shape and dtype onnxruntime gives for the unfused
MatMul -> Add -> Relu. The hint names the likely mistake: the inputs in an order the fused body does not
compute, a transpose flag declared REQUIRED, or `y` declared with other types than the inputs, fewer or more (its
dtype is the inputs').
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from onnx import helper

from ..build import make_model, value_info
from ..export.declare import OpDecl, canonical_dtype, problems
from ..verification.runtime import run
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "expected", "unfused_model"]

EXERCISE = "declare MatMulAddRelu"
TASK = "declare_matmul_add_relu() returning the OpDecl"
INPUTS = ("x1", "x2", "bias")
FUSED = ("MatMul", "Add", "Relu")
ATTRS = ("transpose_x1", "transpose_x2")


@dataclass(frozen=True)
class InferCase:
    """Input shapes (x1, x2, bias) and their dtype; `kind` is "interface", "defaults" or "infer"."""

    kind: str
    x1: tuple = ()
    x2: tuple = ()
    bias: tuple = ()
    dtype: str = "float32"


CASES = (
    Case("the declaration: the seed's three rules, inputs x1, x2, bias, output y, the transpose flags",
         InferCase("interface")),
    Case("a node that sets no attribute: transpose_x1 and transpose_x2 default to false", InferCase("defaults")),
    Case("fp32, 2-D: (32, 64) @ (64, 128) + bias (128,)", InferCase("infer", (32, 64), (64, 128), (128,))),
    Case("fp16 inputs: (8, 16) @ (16, 4) + bias (4,)", InferCase("infer", (8, 16), (16, 4), (4,), "float16")),
    Case("a batch of matrices: (4, 16, 64) @ (64, 32) + bias (32,)", InferCase("infer", (4, 16, 64), (64, 32),
                                                                              (32,))),
    Case("stacked weights broadcast over a batch: (2, 3, 8, 16) @ (3, 16, 4) + bias (1, 4)",
         InferCase("infer", (2, 3, 8, 16), (3, 16, 4), (1, 4))),
)


def unfused_model(c: InferCase):
    """MatMul -> Add -> Relu on the case's shapes and dtype, the ops the fused kernel replaces."""
    dt = np.dtype(c.dtype)
    nodes = [helper.make_node("MatMul", ["x1", "x2"], ["t"]), helper.make_node("Add", ["t", "bias"], ["u"]),
             helper.make_node("Relu", ["u"], ["y"])]
    return make_model(nodes, [value_info(n, dt, list(s)) for n, s in zip(INPUTS, (c.x1, c.x2, c.bias))],
                      [value_info("y", dt, None)])


@lru_cache(maxsize=None)
def expected(c: InferCase) -> tuple[tuple[int, ...], str]:
    """(shape, CANN dtype) of y from onnxruntime running the unfused ops (graph optimisations off)."""
    dt = np.dtype(c.dtype)
    y = run(unfused_model(c), {n: np.zeros(s, dt) for n, s in zip(INPUTS, (c.x1, c.x2, c.bias))})["y"]
    return tuple(y.shape), canonical_dtype(y.dtype)


def _interface(decl: OpDecl) -> str | None:
    found = problems(decl, decl.name)
    if found:
        return f"the declaration breaks a rule: {found[0]}"
    names = tuple(t.name for t in decl.inputs)
    if set(names) != set(INPUTS) or len(names) != len(INPUTS):
        return f"the inputs are {list(names)}; declare CANN MatMul's x1 and x2, then bias"
    if names != INPUTS:
        return (f"the inputs are in the order {list(names)}: the fused body feeds the first two to the MatMul and "
                f"the third to the Add, so declare x1, x2, bias")
    if [t.name for t in decl.outputs] != ["y"]:
        return f"the outputs are {[t.name for t in decl.outputs]}; declare one output, y"
    if tuple(decl.fused) != FUSED:
        return f"the declaration fuses {list(decl.fused)}; it computes {', then '.join(FUSED)}"
    declared = {a.name: a for a in decl.attrs}
    missing = [n for n in ATTRS if n not in declared]
    if missing:
        return f"{' and '.join(missing)} not declared: the built-in MatMul has transpose_x1 and transpose_x2"
    for t in decl.inputs:
        if set(t.types) != {"DT_FLOAT16", "DT_FLOAT"}:
            return f"input {t.name} declares {list(t.types)}; the task asks for DT_FLOAT16 and DT_FLOAT"
    y = decl.outputs[0]
    if set(y.types) != {"DT_FLOAT16", "DT_FLOAT"}:
        return (f"y declares {list(y.types)} and the inputs DT_FLOAT16 and DT_FLOAT: the output's types must be "
                f"the inputs' (y's dtype is always theirs: none missing, none extra)")
    return None


def _defaults(decl: OpDecl) -> str | None:
    required = [a.name for a in decl.attrs if a.required]
    if required:
        return (f"{' and '.join(required)} declared REQUIRED_ATTR: a node that sets none could not be built; "
                f"the built-in declares ATTR(transpose_x1, Bool, false)")
    values = decl.attr_values({})
    wrong = [n for n in ATTRS if values[n] is not False]
    if wrong:
        return f"{wrong[0]} defaults to {values[wrong[0]]!r}; the built-in MatMul's default is false"
    return None


def _infer(decl: OpDecl, c: InferCase) -> str | None:
    shapes = dict(zip(INPUTS, (c.x1, c.x2, c.bias)))
    try:
        out = decl.infer(shapes, {n: c.dtype for n in INPUTS}, {})
    except ValueError as exc:
        return f"inference from your declaration failed: {str(exc)[:120]}"
    shape, dtype = out["y"]
    want_shape, want_dtype = expected(c)
    if tuple(shape) != want_shape:
        return f"your declaration infers y {list(shape)}; onnxruntime's unfused ops give {list(want_shape)}"
    if dtype != want_dtype:
        return f"your declaration infers y as {dtype}; onnxruntime's unfused ops give {want_dtype}"
    return None


def _judge(declare, case: Case) -> str | None:
    c: InferCase = case.data
    decl = attempt(declare)
    if is_stub(decl):
        raise NotAnswered
    if not isinstance(decl, OpDecl):
        raise AnswerRaised(f"declare_matmul_add_relu must return the OpDecl that OP_END_FACTORY_REG returns, got "
                           f"{type(decl).__name__}")
    if c.kind == "interface":
        return _interface(decl)
    if c.kind == "defaults":
        return _defaults(decl)
    return _infer(decl, c)


def check(declare_matmul_add_relu) -> Verdict:
    """Grade `declare_matmul_add_relu() -> OpDecl`: the rules, the interface, then inference on hidden shapes."""
    return grade(EXERCISE, declare_matmul_add_relu, CASES, _judge, task=TASK,
                 checked="The seed's three rules and the interface, the attribute defaults, then OpDecl.infer on "
                         "each shape against onnxruntime's unfused MatMul -> Add -> Relu (shape and dtype).")
