"""Exercise: predict what the vertical pass makes of seven small CNN graphs (notebook 03).

Each graph is a Conv -> BatchNormalization chain with what follows it: a Relu, SiLU (Sigmoid and Mul), a residual
Add and Relu, an Exp, and the near misses of notebook 03 §3: a BN output that is also a graph output, a Conv output
another node reads, a residual sum read twice. `listing()` prints them; the learner answers with a dict
``{"A": kernels, ...}``: how many kernels each graph launches once `fuse(model, passes=("vertical",))` has run
(Constant nodes launch nothing). `check(kernels)` runs the pass on each graph and counts; the hint names the first
graph predicted wrong and, from the plan, what the pass did there: the groups it formed and what they became, or
the refusal that stopped a longer chain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from ..build import make_model, tensor, value_info
from ..passes import fuse
from .core import Case, NotAnswered, Verdict, grade

__all__ = ["EXERCISE", "TASK", "CASES", "GRAPHS", "check", "listing", "model", "kernels_after"]

EXERCISE = "predict the kernels left after the vertical pass"
TASK = "your prediction for each graph, kernels = {\"A\": ..., ...}"
C, SHAPE = 8, [1, 8, 6, 6]
_BN = ("gamma", "beta", "mean", "var")
_SHORT = {"BatchNormalization": "bn"}


@dataclass(frozen=True)
class Graph:
    """Nodes as (op, inputs, output); the Conv's weight is `W`, the BN's parameters are implied."""

    nodes: tuple
    outputs: tuple = ("y",)


def _chain(*tail, outputs=("y",)):
    return Graph((("Conv", ("x", "W"), "a"), ("BatchNormalization", ("a",), "b")) + tuple(tail), outputs)


#: the graphs, by the letter the answer uses
GRAPHS = {
    "A": _chain(("Relu", ("b",), "y")),
    "B": _chain(("Sigmoid", ("b",), "s"), ("Mul", ("b", "s"), "y")),
    "C": _chain(("Relu", ("b",), "y"), outputs=("y", "b")),
    "D": _chain(("Relu", ("b",), "y"), ("Sigmoid", ("a",), "y2"), outputs=("y", "y2")),
    "E": _chain(("Add", ("b", "x"), "s"), ("Relu", ("s",), "y")),
    "F": _chain(("Add", ("b", "x"), "s"), ("Relu", ("s",), "y"), ("Sigmoid", ("s",), "y2"), outputs=("y", "y2")),
    "G": _chain(("Exp", ("b",), "y")),
}
_WHAT = {
    "A": "Conv -> BN -> Relu",
    "B": "Conv -> BN -> SiLU (Sigmoid and Mul)",
    "C": "Conv -> BN -> Relu, the BN's output also a graph output",
    "D": "Conv -> BN -> Relu, the Conv's output also read by a Sigmoid",
    "E": "Conv -> BN -> residual Add of the block's input x -> Relu",
    "F": "residual block whose sum is also read by a Sigmoid",
    "G": "Conv -> BN -> Exp",
}

#: the hidden cases, in the order they are graded: one per graph
CASES = tuple(Case(f"graph {k}: {_WHAT[k]}", k) for k in GRAPHS)


def model(letter: str) -> onnx.ModelProto:
    """The ONNX model of graph `letter` (fixed random weights and BN statistics)."""
    g = GRAPHS[letter]
    rng = np.random.default_rng(ord(letter))
    nodes, inits = [], [tensor("W", (rng.standard_normal((C, C, 3, 3)) * 0.2).astype(np.float32))]
    for i, (op, inputs, out) in enumerate(g.nodes):
        kw = {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3]} if op == "Conv" else {}
        if op == "BatchNormalization":
            inputs = tuple(inputs) + _BN
            inits += [tensor("gamma", rng.uniform(0.5, 1.5, C).astype(np.float32)),
                      tensor("beta", rng.standard_normal(C).astype(np.float32)),
                      tensor("mean", rng.standard_normal(C).astype(np.float32)),
                      tensor("var", rng.uniform(0.5, 2.0, C).astype(np.float32))]
        nodes.append(helper.make_node(op, list(inputs), [out], name=_SHORT.get(op, op.lower()), **kw))
    return make_model(nodes, [value_info("x", np.float32, SHAPE)],
                      [value_info(o, np.float32, SHAPE) for o in g.outputs], inits, name=f"graph_{letter}")


def listing() -> str:
    """The seven graphs, one line each: the nodes in order (W: the Conv's weight) and the graph outputs."""
    lines = []
    for k, g in GRAPHS.items():
        body = "; ".join(f"{out} = {op}({', '.join(inputs)})" for op, inputs, out in g.nodes)
        lines.append(f"{k}: {body}   outputs: {', '.join(g.outputs)}")
    return "\n".join(lines)


def kernels_after(letter: str):
    """(kernels the fused model launches, the fused result) for graph `letter`: the vertical pass's own count."""
    result = fuse(model(letter), passes=("vertical",))
    return sum(1 for n in result.graph.nodes() if n.op_type != "Constant"), result


def _what_it_did(result, original: onnx.ModelProto) -> str:
    """The plan in words: each group and what it emits, the ops left alone, and the refusal that kept a value
    (the escape check: an intermediate read elsewhere or a graph output) from fusing, if any."""
    parts = [f"{g.rule} takes {', '.join(g.op_types)}, "
             + (f"emitted as {g.lowered_to.split(':')[-1]}" if g.kernels == 1 else
                f"emitted as {g.kernels} kernels, the last a {g.lowered_to.split(':')[-1]}") for g in result.plan]
    grouped = {n for g in result.plan for n in g.nodes}
    alone = [n.op_type for n in original.graph.node if n.name not in grouped]
    parts.append(f"left alone: {', '.join(alone)}" if alone else "nothing is left alone")
    escapes = [r for r in result.plan.why_not() if "fusing removes it" in r.condition]
    if escapes:
        top = max(r.matched for r in escapes)
        r = [r for r in escapes if r.matched == top][-1]
        found = r.found
        for n in original.graph.node:  # "read by Sigmoid sigmoid": the op type says it, the node's name repeats it
            found = found.replace(f"{n.op_type} {n.name}", n.op_type)
        parts.append(f"{r.rule} refuses, it needs {r.condition}: {found}")
    return "; ".join(parts)


def _judge(kernels, case: Case) -> str | None:
    letter = case.data
    if not isinstance(kernels, dict):
        return f"write a dict, kernels = {{\"A\": 1, ...}}; you gave a {type(kernels).__name__}"
    said = kernels.get(letter, ...)
    if said is Ellipsis or said is None:
        raise NotAnswered
    if isinstance(said, bool) or not isinstance(said, (int, np.integer)):
        return f"kernels[{letter!r}] must be a whole number of kernels; it is {said!r}"
    want, result = kernels_after(letter)
    if int(said) == want:
        return None
    side = "more" if want > said else "fewer"
    return f"you said {said}; the fused model launches {side}: {_what_it_did(result, model(letter))}"


def check(kernels) -> Verdict:
    """Grade a dict {graph letter: kernels after the vertical pass} against the pass itself."""
    return grade(EXERCISE, kernels, CASES, _judge, task=TASK,
                 checked="Each graph: your count against the kernels of fuse(model, passes=('vertical',)) (Constant "
                         "nodes launch nothing).")
