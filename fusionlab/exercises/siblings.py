"""Exercise: which sibling ops may become one wide op + Split (notebook 05).

The learner writes ``can_stack(a, b) -> bool``: whether the horizontal pass puts two ops in one group. Each op is a
`Sibling`: its name, op type (Conv or MatMul), the tensor it reads (`reads`), its weight (a numpy array, or None when
the weight is a graph input) and its attributes as the node has them. `check(can_stack)` builds each hidden case's
graph (siblings side by side; the Convs without bias), plans it with `fusionlab.passes.horizontal.plan`, and asks
the learner about every pair: the truth is whether the plan holds both in one group. The cases include stackable
siblings of different widths (GQA's narrow K/V, Inception's 1x1 branches) beside near misses: different strides,
kernels or dilations, grouped convolutions, a weight that is a graph input, another input tensor. The hint names
the pair and why the pass stacks it or not: the pass's refusal, else where the pass's sibling keys differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from itertools import combinations

import numpy as np
from onnx import helper

from ..build import make_model, tensor, value_info
from ..graph import load
from ..passes import engine, horizontal
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "Sibling", "check", "build", "truth", "why"]

EXERCISE = "which siblings the horizontal pass stacks"
TASK = "can_stack(a, b) returning True or False"


@dataclass(frozen=True, eq=False)
class Sibling:
    """One candidate op: `weight` is None when the weight is a graph input, not a constant."""

    name: str
    op: str
    reads: str
    weight: np.ndarray | None
    attrs: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        w = "graph input" if self.weight is None else f"constant {tuple(self.weight.shape)}"
        return f"Sibling({self.name}: {self.op} reads {self.reads}, weight {w}, attrs {self.attrs})"


def _w(seed: int, *shape) -> np.ndarray:
    return np.random.default_rng(3000 + seed).standard_normal(shape).astype(np.float32)


def _conv(name, seed, c_out, k=1, reads="x", c_in=8, **attrs):
    return Sibling(name, "Conv", reads, _w(seed, c_out, c_in // attrs.get("group", 1), k, k),
                   {"kernel_shape": [k, k], **attrs})


def _mm(name, seed, n, k=64, const=True):
    return Sibling(name, "MatMul", "x", _w(seed, k, n) if const else None)


@dataclass(frozen=True, eq=False)
class SiblingCase:
    """Siblings side by side on graph inputs of shape `shape` (each `reads` one of them)."""

    siblings: tuple
    shape: tuple


def _case(name: str, shape, *siblings) -> Case:
    return Case(name, SiblingCase(tuple(siblings), tuple(shape)))


_MAP, _SEQ = (1, 8, 8, 8), (2, 5, 64)

#: the hidden cases, in the order they are graded
CASES = (
    _case("BERT's Q, K and V: three MatMuls 64 -> 64 on one tensor", _SEQ,
          _mm("query", 1, 64), _mm("key", 2, 64), _mm("value", 3, 64)),
    _case("grouped-query attention: Q 64 wide, K and V 16 wide", _SEQ,
          _mm("q_proj", 4, 64), _mm("k_proj", 5, 16), _mm("v_proj", 6, 16)),
    _case("Inception's 1x1 branches: Convs to 16, 12 and 24 channels", _MAP,
          _conv("branch1x1", 7, 16), _conv("branch5x5_1", 8, 12), _conv("branch3x3_1", 9, 24)),
    _case("four 1x1 Convs, the 2nd and 4th with stride 2", _MAP,
          _conv("conv_a", 10, 4, strides=[1, 1]), _conv("conv_b", 11, 4, strides=[2, 2]),
          _conv("conv_c", 12, 4, strides=[1, 1]), _conv("conv_d", 13, 4, strides=[2, 2])),
    _case("a 1x1 and a 3x3 Conv (pads 1) on one map", _MAP,
          _conv("conv1x1", 14, 8, 1, pads=[0, 0, 0, 0]), _conv("conv3x3", 15, 8, 3, pads=[1, 1, 1, 1])),
    _case("two 3x3 Convs with pads 1, one dilated (dilations 2)", _MAP,
          _conv("plain", 16, 8, 3, pads=[1, 1, 1, 1], dilations=[1, 1]),
          _conv("dilated", 17, 8, 3, pads=[1, 1, 1, 1], dilations=[2, 2])),
    _case("two grouped 3x3 Convs (group=2), equal attributes", _MAP,
          _conv("grouped_a", 18, 8, 3, pads=[1, 1, 1, 1], group=2),
          _conv("grouped_b", 19, 4, 3, pads=[1, 1, 1, 1], group=2)),
    _case("three MatMuls on one tensor, the middle one's weight a graph input", _SEQ,
          _mm("fixed_1", 20, 32), _mm("weight_is_input", 21, 32, const=False), _mm("fixed_2", 22, 32)),
    _case("equal 1x1 Convs, one on x and one on another tensor y", _MAP,
          _conv("on_x", 23, 8), _conv("on_y", 24, 8, reads="y")),
)


def build(c: SiblingCase):
    """The case's model: each sibling reads its tensor; weights that are None become graph inputs."""
    nodes, inits, outs = [], [], []
    inputs = {s.reads: value_info(s.reads, np.float32, list(c.shape)) for s in c.siblings}
    for s in c.siblings:
        w = f"W_{s.name}"
        if s.weight is None:
            inputs[w] = value_info(w, np.float32, [c.shape[-1], 32])
        else:
            inits.append(tensor(w, s.weight))
        nodes.append(helper.make_node(s.op, [s.reads, w], [s.name + "_out"], name=s.name, **s.attrs))
        outs.append(value_info(s.name + "_out", np.float32, None))
    return make_model(nodes, list(inputs.values()), outs, inits, name="siblings")


@lru_cache(maxsize=None)
def _planned(index: int):
    c: SiblingCase = CASES[index].data
    g = load(build(c), check=False)
    return g, horizontal.plan(g)


def truth(index: int) -> dict[tuple[str, str], bool]:
    """{(a, b): whether the plan of case `index` holds both in one group}, every pair in the siblings' order."""
    _, p = _planned(index)
    group = {n: grp.id for grp in p for n in grp.nodes}
    names = [s.name for s in CASES[index].data.siblings]
    return {(a, b): a in group and group.get(a) == group.get(b) for a, b in combinations(names, 2)}


def why(index: int, a: str, b: str) -> str:
    """Why the pass stacks a and b or keeps them apart: its group's reason, its refusal, or the sibling keys'
    difference (`horizontal`'s own key function)."""
    g, p = _planned(index)
    for grp in p:
        if a in grp.nodes and b in grp.nodes:
            return f"the pass stacks them ({grp.reason})"
    refused = {r.node: r.reason for r in p.refusals}
    for n in (a, b):
        if n in refused:
            return f"the pass refuses {n}: {refused[n]}"
    nodes = {n.name: n for n in g}
    na, nb = nodes[a], nodes[b]
    if na.inputs[0] is not nb.inputs[0]:
        return f"they read different tensors ({na.inputs[0].name} and {nb.inputs[0].name}): they are not siblings"
    cx = engine.Context(g, rules=horizontal.Siblings.names)
    (fa, ka), (fb, kb) = (horizontal._anchor_key(cx, n, n.inputs[0]) for n in (na, nb))
    if fa != fb:
        return f"a {na.op_type} and a {nb.op_type} do not stack"
    if fa == "conv":
        if ka[3] != kb[3]:
            return (f"their weights differ beyond the output axis: {tuple(ka[3])} and {tuple(kb[3])} "
                    "(input channels and kernel must match)")
        attrs_a, attrs_b = dict(ka[4]), dict(kb[4])
        diff = sorted(k for k in attrs_a.keys() | attrs_b.keys() if attrs_a.get(k) != attrs_b.get(k))
        return "their attributes differ: " + "; ".join(
            f"{k} {attrs_a.get(k, 'unset')} and {attrs_b.get(k, 'unset')}" for k in diff)
    return f"their sibling keys differ: {ka} and {kb}"


def _judge(can_stack, case: Case) -> str | None:
    index = CASES.index(case)
    sibs = {s.name: s for s in case.data.siblings}
    for (a, b), want in truth(index).items():
        got = attempt(can_stack, sibs[a], sibs[b])
        if is_stub(got):
            raise NotAnswered
        if not isinstance(got, (bool, np.bool_)):
            raise AnswerRaised(f"can_stack must return True or False, got {type(got).__name__}")
        if bool(got) != want:
            said = "they stack" if got else "they do not stack"
            wa, wb = sibs[a].weight, sibs[b].weight
            widths = " (their weights differ only on the output axis: the wide op stacks any widths)" if (
                want and wa.shape != wb.shape) else ""
            return f"{a} and {b}: you say {said}, but {why(index, a, b)}{widths}"
    return None


def check(can_stack) -> Verdict:
    """Grade `can_stack(a, b) -> bool` on every pair of siblings of the hidden cases."""
    return grade(EXERCISE, can_stack, CASES, _judge, task=TASK,
                 checked="Each case: your answer for every pair of its siblings against whether "
                         "horizontal.plan puts the two in one group.")
