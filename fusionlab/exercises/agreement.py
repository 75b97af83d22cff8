"""Exercise: how many fusion decisions two groupings of one graph make alike (notebook 15).

The learner writes ``edges_alike(graph, groups_a, groups_b) -> (alike, total)``: over every data edge between two
compute nodes of `graph` (a fusionlab Graph; producer -> consumer, Constant nodes left out, an edge counted once
however many inputs of the consumer read the producer), `total` is how many edges there are and `alike` how many
both groupings decide the same way (fused: both ends in one group; or not). A grouping is a list of groups of node
names, as §5 compares TVM's with fusionlab's. `check(edges_alike)` grades it on hidden graphs against
`compare_groupings`, the function §5 uses, and names the likely mistake: an edge counted twice when a node reads one
producer twice, edges from Constant nodes counted, edges to graph outputs counted, or two ends in two different
groups taken as fused, or two ungrouped ends taken as fused (a group index per node, None == None).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np
from onnx import helper

from .. import zoo
from ..build import make_model, tensor, value_info
from ..compilers import MODELS, grouping
from ..graph import load
from ..passes import plan as fusion_plan
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "expected", "build"]

EXERCISE = "edges two groupings decide alike"
TASK = "edges_alike(graph, groups_a, groups_b) returning (alike, total)"


@dataclass(frozen=True)
class EdgeCase:
    """A graph (`make()` returns it with its two groupings) by name, so the case prints and hashes small."""

    graph: str


def _f(name, shape):
    return value_info(name, np.float32, shape)


def _w(name, *shape, seed=0):
    return tensor(name, np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _chain():
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["t0"], name="mm1"),
             helper.make_node("Add", ["t0", "b1"], ["t1"], name="add"),
             helper.make_node("Relu", ["t1"], ["t2"], name="relu"),
             helper.make_node("MatMul", ["t2", "W2"], ["y"], name="mm2")]
    model = make_model(nodes, [_f("x", [4, 8])], [_f("y", [4, 3])], [_w("W1", 8, 6), _w("b1", 6, seed=1),
                                                                     _w("W2", 6, 3, seed=2)])
    return model, [["mm1", "add", "relu"]], [["add", "relu"]]


def _two_groups():
    ops = ["Relu", "Sigmoid", "Tanh", "Neg"]
    names = ["a", "b", "c", "d"]
    nodes = [helper.make_node(op, ["x" if i == 0 else f"t{i - 1}"], [f"t{i}" if i < 3 else "y"], name=n)
             for i, (op, n) in enumerate(zip(ops, names))]
    model = make_model(nodes, [_f("x", [2, 5])], [_f("y", [2, 5])])
    return model, [["a", "b"], ["c", "d"]], [["a", "b", "c", "d"]]


def _square():
    nodes = [helper.make_node("Tanh", ["x"], ["t"], name="tanh"),
             helper.make_node("Mul", ["t", "t"], ["s"], name="square"),
             helper.make_node("Add", ["s", "t"], ["y"], name="add")]
    model = make_model(nodes, [_f("x", [3, 4])], [_f("y", [3, 4])])
    return model, [["tanh", "square", "add"]], [["square", "add"]]


def _constant():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Constant", [], ["c"], name="const",
                              value=helper.make_tensor("c", 1, [1], [0.5])),
             helper.make_node("Add", ["r", "c"], ["s"], name="add"),
             helper.make_node("Mul", ["s", "k"], ["y"], name="mul")]
    model = make_model(nodes, [_f("x", [2, 3])], [_f("y", [2, 3])], [_w("k", 3)])
    return model, [["relu", "add", "mul"]], [["add", "mul"]]


def _output_read():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Sigmoid", ["a"], ["b"], name="sigmoid"),
             helper.make_node("Mul", ["b", "a"], ["y"], name="mul")]
    model = make_model(nodes, [_f("x", [2, 6])], [_f("a", [2, 6]), _f("y", [2, 6])])
    return model, [["relu", "sigmoid", "mul"]], [["sigmoid", "mul"]]


def _ungrouped():
    model, _, _ = _chain()
    return model, [], []


def _one_side():
    model, _, _ = _chain()
    return model, [], [["add", "relu"]]


def _bert():
    model = zoo.get("bert_tiny", **MODELS["bert_tiny"])
    graph = load(model)
    return (model, grouping.plan_groups(fusion_plan(graph, passes=("mixed",))),
            grouping.plan_groups(fusion_plan(graph, passes=("mixed",), max_group_ops=None)))


_GRAPHS: dict[str, Callable] = {"chain": _chain, "two groups": _two_groups, "square": _square,
                                "constant": _constant, "output read": _output_read, "ungrouped": _ungrouped,
                                "one side": _one_side, "bert": _bert}


@lru_cache(maxsize=None)
def build(name: str):
    """(fusionlab Graph, groups_a, groups_b) of a hidden case."""
    model, a, b = _GRAPHS[name]()
    return load(model), a, b


CASES = (
    Case("MatMul -> Add -> Relu -> MatMul: A takes the first MatMul into the group, B does not",
         EdgeCase("chain")),
    Case("two groups side by side in A, one group of all four nodes in B", EdgeCase("two groups")),
    Case("a square, Mul(t, t): one node reads the same producer twice", EdgeCase("square")),
    Case("a Constant node feeding an Add (a compiler folds it away)", EdgeCase("constant")),
    Case("a value that is a graph output and is read by two nodes too", EdgeCase("output read")),
    Case("neither grouping fuses anything: every node runs alone", EdgeCase("ungrouped")),
    Case("A fuses nothing, B fuses Add -> Relu: in A those two ends are in no group at all",
         EdgeCase("one side")),
    Case("BERT-tiny (§4's model): the mixed plan at 5 ops against no threshold", EdgeCase("bert")),
)


def expected(c: EdgeCase) -> tuple[int, int]:
    """(alike, total) by `grouping.compare_groupings`, the comparison §5 prints."""
    graph, a, b = build(c.graph)
    agreement = grouping.compare_groupings(graph, a, b)
    return sum(e.fused_a == e.fused_b for e in agreement.edges), len(agreement.edges)


def _variant(graph, groups_a, groups_b, *, twice=False, constants=False, outputs=False, any_group=False,
             none_equal=False):
    """(alike, total) counted with one plausible mistake, to name it in the hint."""
    def member(groups):
        out: dict[str, set[int]] = {}
        for i, g in enumerate(groups):
            for n in g:
                out.setdefault(n, set()).add(i)
        return out

    ma, mb = member(groups_a), member(groups_b)

    def fused(m, p, c):
        if c is None:
            return False
        if none_equal:  # group of each end compared, None (no group) == None counting as fused
            return m.get(p) == m.get(c)
        return bool(m.get(p)) and bool(m.get(c)) if any_group else bool(m.get(p, set()) & m.get(c, set()))

    pairs = []
    for node in graph:
        if node.op_type == "Constant":
            continue
        seen = set()
        for v in node.inputs:
            p = v.producer() if v is not None else None
            if p is None or (p.op_type == "Constant" and not constants) or (p.name in seen and not twice):
                continue
            seen.add(p.name)
            pairs.append((p.name, node.name))
    if outputs:
        pairs += [(v.producer().name, None) for v in graph.outputs() if v.producer() is not None]
    return sum(fused(ma, p, c) == fused(mb, p, c) for p, c in pairs), len(pairs)


_MISTAKES = (({"twice": True}, "an edge counted once per input: a node reading one producer twice is one edge"),
             ({"constants": True}, "edges from Constant nodes counted: leave Constant nodes out"),
             ({"outputs": True}, "edges to graph outputs counted: an edge joins two nodes"),
             ({"any_group": True}, "both ends grouped taken as fused: they must be in the SAME group"),
             ({"none_equal": True}, "two ungrouped ends taken as fused (None == None): fused needs a group holding "
                                    "both"))


def _mistake(c: EdgeCase, got: tuple[int, int]) -> str:
    graph, a, b = build(c.graph)
    want = expected(c)
    said = [words for flags, words in _MISTAKES if _variant(graph, a, b, **flags) == got != want]
    return f" (that looks like {' or '.join(said)})" if said else ""


def _judge(edges_alike, case: Case) -> str | None:
    c: EdgeCase = case.data
    graph, a, b = build(c.graph)
    got = attempt(edges_alike, graph, [list(g) for g in a], [list(g) for g in b])
    if is_stub(got):
        raise NotAnswered
    if (not isinstance(got, (tuple, list)) or len(got) != 2
            or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in got)):
        raise AnswerRaised(f"edges_alike must return two ints (alike, total), got {got!r}"[:160])
    got = (int(got[0]), int(got[1]))
    want = expected(c)
    if got == want:
        return None
    return (f"you say {got[0]} of {got[1]} edges alike; compare_groupings finds {want[0]} of {want[1]}"
            f"{_mistake(c, got)}")


def check(edges_alike) -> Verdict:
    """Grade `edges_alike(graph, groups_a, groups_b) -> (alike, total)` on the hidden graphs."""
    return grade(EXERCISE, edges_alike, CASES, _judge, task=TASK,
                 checked="Each graph: your (alike, total) against grouping.compare_groupings (edges between "
                         "non-Constant nodes, each once; fused means both ends in one group).")
