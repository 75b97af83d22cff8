"""Exercise: the immediate post-dominator of every node of a DAG (notebook 06).

The learner writes ``post_dominators(consumers, outputs) -> {node: its immediate post-dominator, or None}``: the
DAG is given as ``consumers``, {node: [the nodes that read its result]} in topological order, and ``outputs``, the
set of nodes whose result is also a graph output. `check(post_dominators)` builds each hidden DAG as an ONNX graph
(one elementwise op per node: Relu when it reads one node, Sum when it reads several) and grades the answer against
`fusionlab.passes.mixed.post_dominator_tree`, the tree the mixed pass groups with. It checks the nodes from the
graph's end backwards (a wrong answer near the end makes the answers above it wrong too), and the hint names the
first wrong node with a path that shows why: one that avoids the learner's post-dominator, or one that leaves the
graph. `as_dag(graph)` turns any graph (notebook 06's `g`) into the same two arguments, to try an answer on.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from onnx import helper

from ..build import make_model, value_info
from ..graph import Graph, load
from ..passes import mixed
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "as_dag", "build", "truth", "check"]

EXERCISE = "the immediate post-dominators of a DAG"
TASK = "post_dominators(consumers, outputs) returning {node: its post-dominator or None}"
SHAPE = [1, 8]


def as_dag(graph: Graph) -> tuple[dict[str, list[str]], set[str]]:
    """(consumers, outputs) of a graph: {node: [its consumers, each once]} in topological order, and the nodes
    whose result is a graph output."""
    consumers: dict[str, list[str]] = {}
    outputs: set[str] = set()
    for n in graph.topological_order():
        users = consumers.setdefault(n.name, [])
        for out in n.outputs:
            outputs.update([n.name] if out.is_graph_output() else [])
            for c in Graph.consumers(out):
                if c.name not in users:
                    users.append(c.name)
    return consumers, outputs


def _dag(edges: str, outputs: str) -> tuple[dict[str, list[str]], frozenset]:
    """A DAG from 'a>b a>c b>d ...' (nodes in the order they first appear, which must be topological)."""
    consumers: dict[str, list[str]] = {}
    for edge in edges.split():
        src, dst = edge.split(">")
        consumers.setdefault(src, []).append(dst)
        consumers.setdefault(dst, [])
    return consumers, frozenset(outputs.split())


#: the hidden DAGs, in the order they are graded
CASES = (
    Case("a chain of four nodes", _dag("a>b b>c c>d", "d")),
    Case("notebook 06's diamond: relu feeds sigmoid, mul and tanh; mul and tanh meet at join",
         _dag("relu>sigmoid relu>mul sigmoid>mul relu>tanh mul>join tanh>join join>out", "out")),
    Case("unbalanced branches: a skip of one node beside a path of three",
         _dag("a>b b>c c>d d>join a>join join>out", "out")),
    Case("a branch that leaves as a graph output (b) beside one that goes on",
         _dag("a>b a>c c>d", "b d")),
    Case("a result read further that is also a graph output (b)", _dag("a>b b>c c>d", "b d")),
    Case("nested diamonds: b's branches meet at f, a's at g", _dag("a>b a>c b>d b>e d>f e>f f>g c>g g>out", "out")),
    Case("a shortcut past the first join: a -> c -> e skips d", _dag("a>b a>c b>d c>d c>e d>e e>out", "out")),
    Case("two results that are both graph outputs", _dag("a>b b>c b>d", "c d")),
)


def build(consumers: dict[str, list[str]], outputs) -> object:
    """The DAG as an ONNX model: Relu for a node reading one node (or x), Sum for one reading several."""
    producers: dict[str, list[str]] = {n: [] for n in consumers}
    for n, users in consumers.items():
        for u in users:
            producers[u].append(n)
    nodes = []
    for n in consumers:
        ins = producers[n] or ["x"]
        nodes.append(helper.make_node("Relu" if len(ins) == 1 else "Sum", ins, [n], name=n))
    sinks = [n for n, users in consumers.items() if not users]
    assert set(sinks) <= set(outputs), "every node without consumers must be a graph output"
    return make_model(nodes, [value_info("x", np.float32, SHAPE)],
                      [value_info(n, np.float32, SHAPE) for n in consumers if n in outputs], name="dag")


@lru_cache(maxsize=None)
def truth(index: int) -> dict[str, str | None]:
    """The pass's post-dominator tree for hidden DAG `index`."""
    return mixed.post_dominator_tree(load(build(*CASES[index].data)))


def _path(consumers, outputs, start: str, avoid: str | None) -> list[str] | None:
    """A path from `start` to a node whose result leaves the graph, not through `avoid`; None if every path meets it."""
    stack, seen = [[start]], {start}
    while stack:
        path = stack.pop()
        node = path[-1]
        if node in outputs:
            return path
        for c in reversed(consumers[node]):
            if c != avoid and c not in seen:
                seen.add(c)
                stack.append(path + [c])
    return None


def _show(path: list[str]) -> str:
    return " -> ".join(path) + " (a graph output)"


def _hint(consumers, outputs, node: str, got, want) -> str:
    said = f"you say {got!r}, the pass's tree says {want!r}"
    if got is not None and got not in consumers:
        return f"{node}: {got!r} is not a node of this DAG ({said})"
    if want is None:
        if node in outputs:
            return f"{node}: {said}: {node}'s result is a graph output, so a path leaves the graph at {node} itself"
        return f"{node}: {said}: the path {_show(_path(consumers, outputs, node, got))} does not pass {got}"
    if got is None:
        return f"{node}: {said}: every path from {node} to the graph's outputs passes {want}"
    avoiding = _path(consumers, outputs, node, got)
    if avoiding is not None:
        return f"{node}: {said}: the path {_show(avoiding)} does not pass {got}"
    return f"{node}: {said}: {got} post-dominates {node}, but so does {want}, nearer: every path meets it first"


def _judge(post_dominators, case: Case) -> str | None:
    consumers, outputs = case.data
    got = attempt(post_dominators, {n: list(u) for n, u in consumers.items()}, set(outputs))
    if is_stub(got):
        raise NotAnswered
    if not isinstance(got, dict):
        raise AnswerRaised(f"post_dominators must return a dict {{node: post-dominator or None}}, got "
                           f"{type(got).__name__}")
    want = truth(CASES.index(case))
    for node in reversed(list(consumers)):  # from the end backwards: the first wrong answer is the root cause
        if node not in got:
            return f"your dict has no entry for {node!r} (give None where nothing post-dominates a node)"
        if got[node] != want[node]:
            return _hint(consumers, outputs, node, got[node], want[node])
    return None


def check(post_dominators) -> Verdict:
    """Grade `post_dominators(consumers, outputs)` on the hidden DAGs against mixed.post_dominator_tree."""
    return grade(EXERCISE, post_dominators, CASES, _judge, task=TASK,
                 checked="Each DAG, built as an ONNX graph: your post-dominator of every node against "
                         "mixed.post_dominator_tree.")
