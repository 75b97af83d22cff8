"""Exercise: write erf-GELU as torch's TorchScript exporter writes it, so that the vertical pass fuses it (notebook 04).

The learner writes ``gelu_nodes(x, y) -> [NodeProto, ...]``: ONNX nodes (`onnx.helper.make_node`, constants as
`Constant` nodes) reading the tensor named `x` and writing `y = GELU(x) = x * 0.5 * (1 + erf(x / sqrt 2))`. On
each hidden case `check(gelu_nodes)` builds a model around them (float32; a bias Add before them in one case; the
opset varies) and grades two things:

- it computes GELU: onnxruntime (graph optimisations off) against a float64 erf-GELU, fp32 tolerances; where it
  does not, the hint says whether it looks like the tanh approximation, twice GELU (the 0.5 missing), erf(x)
  without the 1/sqrt 2, or x * sigmoid(1.702 x);
- the vertical pass fuses all of it (`fuse(model, passes=("vertical",))`): the fused model is exactly the op
  `fusionlab.passes.lowering` names for that opset (`gelu_target`: ONNX's Gelu at opset 20, onnxruntime's
  com.microsoft Gelu below), or BiasGelu with the bias Add. The rule takes exact constants only (`engine.exact`):
  nodes that compute GELU to within fp32 tolerances with 0.7071 for 1/sqrt 2 are not fused, and the hint says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from ..build import make_model, tensor, value_info
from ..passes import fuse
from ..passes.lowering import contrib_target, gelu_target
from ..passes.options import Lowering
from ..verification.runtime import run
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, first_difference, grade

__all__ = ["EXERCISE", "TASK", "CASES", "check", "case_model", "gelu64"]

EXERCISE = "erf-GELU as the exporter writes it"
TASK = "gelu_nodes(x, y) returning a list of ONNX nodes"
RTOL, ATOL = 1e-4, 1e-5
_ERF = np.vectorize(math.erf, otypes=[np.float64])


def gelu64(x):
    """The exact GELU, in float64."""
    x = np.asarray(x, np.float64)
    return 0.5 * x * (1.0 + _ERF(x / math.sqrt(2.0)))


#: float64 functions a wrong answer often computes instead, and what the hint calls them
_LOOKALIKES = (
    (lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
     "the tanh approximation (FastGelu's), not erf-GELU"),
    (lambda x: 2.0 * gelu64(x), "twice GELU: the 0.5 is missing"),
    (lambda x: 0.5 * x * (1.0 + _ERF(x)), "erf(x) without dividing x by sqrt 2"),
    (lambda x: x / (1 + np.exp(-1.702 * x)), "x * sigmoid(1.702 x), the QuickGelu approximation"),
)


@dataclass(frozen=True)
class GeluCase:
    shape: tuple
    opset: int = 17
    bias: bool = False
    spread: float = 3.0  # x drawn uniformly in [-spread, spread]
    seed: int = 0

    def x(self) -> np.ndarray:
        rng = np.random.default_rng(3000 + self.seed)
        return rng.uniform(-self.spread, self.spread, self.shape).astype(np.float32)


#: the hidden cases, in the order they are graded
CASES = (
    Case("x of shape (2, 16), opset 17: onnxruntime's com.microsoft Gelu", GeluCase((2, 16), seed=1)),
    Case("x of shape (2, 8, 32), values up to 8 in size", GeluCase((2, 8, 32), spread=8.0, seed=2)),
    Case("an opset-20 model: ONNX's own Gelu", GeluCase((3, 24), opset=20, seed=3)),
    Case("after a bias Add over the last axis: BiasGelu", GeluCase((2, 4, 16), bias=True, seed=4)),
)


def _nodes(gelu_nodes, x: str, y: str) -> list[onnx.NodeProto]:
    nodes = attempt(gelu_nodes, x, y)
    if nodes is None:
        raise NotAnswered
    nodes = list(nodes) if isinstance(nodes, (list, tuple)) else nodes
    if not isinstance(nodes, list) or not nodes or not all(isinstance(n, onnx.NodeProto) for n in nodes):
        raise AnswerRaised("gelu_nodes must return a non-empty list of ONNX nodes (onnx.helper.make_node)")
    return nodes


def case_model(c: GeluCase, nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
    """The case's model: input x [-> Add(x, bias) as `t`] -> the nodes -> y."""
    shape = list(c.shape)
    front, inits = [], []
    if c.bias:
        bias = np.random.default_rng(c.seed).standard_normal(shape[-1]).astype(np.float32)
        inits.append(tensor("bias", bias))
        front.append(helper.make_node("Add", ["x", "bias"], ["t"], name="bias_add"))
    return make_model(front + list(nodes), [value_info("x", np.float32, shape)],
                      [value_info("y", np.float32, shape)], inits, opset=c.opset, name="gelu")


def _target(c: GeluCase) -> str:
    target = contrib_target("BiasGelu", Lowering.RUNTIME) if c.bias else gelu_target(np.dtype(np.float32), c.opset,
                                                                                     Lowering.RUNTIME)
    return target.op.split(":")[-1]


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split("Status Message: ")[-1][:160]


def _judge(gelu_nodes, case: Case) -> str | None:
    c: GeluCase = case.data
    nodes = _nodes(gelu_nodes, "t" if c.bias else "x", "y")
    taken = {"x", "y", "t", "bias"} & {o for n in nodes for o in n.output if o != "y"}
    if taken:
        return f"your nodes write {sorted(taken)[0]!r}, a name the graph around them uses: name them after y"
    model = case_model(c, nodes)
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # noqa: BLE001 - any complaint of the checker fails the answer
        return f"the model with your nodes fails onnx's full checker: {_first_line(exc)}"
    x = c.x()
    try:
        got = run(model, {"x": x})["y"]
    except Exception as exc:  # noqa: BLE001 - onnxruntime refusing the learner's nodes is the learner's failure
        return f"onnxruntime cannot run your nodes: {_first_line(exc)}"
    t = x.astype(np.float64) + (model_bias(model) if c.bias else 0.0)
    want = gelu64(t)
    atol = ATOL * max(1.0, float(np.max(np.abs(want))))
    bad = first_difference(got, want, RTOL, atol)
    if bad is not None:
        like = next((what for f, what in _LOOKALIKES if first_difference(got, f(t), RTOL, atol) is None), "")
        at = float(t[bad[1]])
        return (f"your nodes compute {float(got[bad[1]]):.4g} where GELU({at:.3g}) = {float(want[bad[1]]):.4g}"
                + (f": it looks like {like}" if like else ""))
    result = fuse(model, passes=("vertical",))
    ops = [n.op_type for n in result.graph.nodes() if n.op_type != "Constant"]
    target = _target(c)
    if ops != [target]:
        return (f"onnxruntime computes GELU, but the vertical pass leaves {', '.join(ops)} where it should make one "
                f"{target}: the gelu rule reads x / sqrt 2 (Div by sqrt 2 or Mul by 1 / sqrt 2), Erf, + 1, times x, "
                "times 0.5, each constant exact to float32 (not 0.7071) and each intermediate read by one node")
    return None


def model_bias(model: onnx.ModelProto) -> np.ndarray:
    return onnx.numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "bias")).astype(np.float64)


def check(gelu_nodes) -> Verdict:
    """Grade `gelu_nodes(x, y)`: it computes GELU (onnxruntime against float64) and the vertical pass fuses it."""
    return grade(EXERCISE, gelu_nodes, CASES, _judge, task=TASK,
                 checked="Each case: your nodes against a float64 erf-GELU in onnxruntime (fp32 rtol 1e-4, atol 1e-5 "
                         "scaled), and fuse(model, passes=('vertical',)) leaves the one op lowering.gelu_target names.")
