"""Exercise: a fused group's working set in the Unified Buffer, tile by tile (notebook 07).

The learner writes ``ub_bytes(members, tile) -> int``: the UB bytes a fused group needs with tiles of `tile` bytes,
by the rules of notebook 07 §3. `members` is the group in execution order, as `fusionlab.analysis.working_set`
sees it (`Member`: `cube`, `reads`, `writes`, `keeps`): a tensor read from or written to device memory through the
UB takes two tiles, an intermediate one tile from the member that makes it to its last reader, a cube operand none
(it goes through L1), and a tensor smaller than a tile its own size. `check(ub_bytes)` grades it on hidden groups,
made by the mixed pass's own `mixed.working_set_members`, against `working_set(members).bytes_at(tile)`: the §3
YOLOv5 group at two tiles, the §2 MatMul + Add + Relu, a SiLU reading x twice, decomposed LayerNorms (long and
short rows) and a chain of 8 Adds, each bringing in one more input. The hint names the likely mistake: every
intermediate counted at once, the cube's operands counted in the UB, a tensor read twice counted twice, whole
tensors where the tile is smaller, one tile per transfer, a tensor the cube reads left out for the op that reads it
again; both, when two give the same number.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from onnx import helper

from ..analysis import working_set as ws_model
from .. import zoo
from ..build import make_model, value_info
from ..graph import load
from ..lessons import reductions
from ..passes import mixed
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "members", "truth", "count"]

EXERCISE = "a fused group's working set in tiles"
TASK = "ub_bytes(members, tile) returning bytes"
KIB = 1024


@dataclass(frozen=True)
class Group:
    """A hidden group: which graph, which of its nodes (None: all), and the tile in bytes."""

    graph: str
    tile: int = 16 * KIB
    nodes: tuple[str, ...] | None = None


def _yolo():
    return load(zoo.get("yolov5s", image_size=320, width_mult=0.25, depth_mult=0.33))


def _toy(n: int = 4096):
    """Notebook 07 §2: y = Relu(MatMul(a, b) + a)."""
    nodes = [helper.make_node("MatMul", ["a", "b"], ["c"], name="matmul"),
             helper.make_node("Add", ["c", "a"], ["d"], name="add"),
             helper.make_node("Relu", ["d"], ["y"], name="relu")]
    return load(make_model(nodes, [value_info("a", np.float32, [n, n]), value_info("b", np.float32, [n, n])],
                           [value_info("y", np.float32, [n, n])], name="toy"))


def _silu(shape=(1, 64, 40, 40)):
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="sigmoid"),
             helper.make_node("Mul", ["x", "s"], ["y"], name="mul")]
    return load(make_model(nodes, [value_info("x", np.float32, list(shape))], [value_info("y", np.float32, list(shape))],
                           name="silu"))


def _adds(k: int = 8, n: int = 1 << 19):
    """k Adds in a chain, each bringing in one more input of n float32 values (the chains notebook 08 §1 costs)."""
    names = [f"x{i}" for i in range(k + 1)]
    nodes = [helper.make_node("Add", [names[0], names[1]], ["s1"], name="a1")]
    for i in range(2, k + 1):
        nodes.append(helper.make_node("Add", [f"s{i - 1}", names[i]], [f"s{i}" if i < k else "y"], name=f"a{i}"))
    return load(make_model(nodes, [value_info(x, np.float32, [n]) for x in names], [value_info("y", np.float32, [n])],
                           name="adds"))


_GRAPHS = {
    "yolo": _yolo, "toy": _toy, "silu": _silu, "adds": _adds,
    "layernorm 2048": lambda: load(reductions.layernorm_model(64, 2048)),
    "layernorm 64": lambda: load(reductions.layernorm_model(32, 64)),
}

CASES = (
    Case("notebook 07's YOLOv5 group, Conv+BN+Sigmoid+Mul+Add, at 16 KiB tiles", Group("yolo")),
    Case("the same group at 4 KiB tiles", Group("yolo", 4 * KIB)),
    Case("§2's MatMul + Add + Relu: `a` read by the cube and by the Add", Group("toy")),
    Case("a SiLU, x * Sigmoid(x): x read by two ops", Group("silu")),
    Case("a decomposed LayerNorm, nine ops, rows of 2048 (x - mean read by Pow and Div)", Group("layernorm 2048")),
    Case("a decomposed LayerNorm with rows of 64 values: every tensor smaller than a tile", Group("layernorm 64")),
    Case("a chain of 8 Adds, each bringing in one more input", Group("adds")),
    Case("the same chain at 1 KiB tiles", Group("adds", KIB)),
)


@lru_cache(maxsize=None)
def _graph(name: str):
    return _GRAPHS[name]()


@lru_cache(maxsize=None)
def members(g: Group) -> tuple[ws_model.Member, ...]:
    """The group's members, made by the mixed pass (for YOLOv5: its first group of five ops at max_group_ops=5)."""
    graph = _graph(g.graph)
    nodes = g.nodes
    if g.graph == "yolo":
        nodes = next(grp for grp in mixed.plan(graph, max_group_ops=5) if grp.size == 5).nodes
    elif nodes is None:
        nodes = [n.name for n in graph]
    return tuple(mixed.working_set_members(graph, list(nodes)))


def truth(g: Group) -> int:
    """The answer: the shared working-set model's bytes at the case's tile."""
    return ws_model.working_set(members(g)).bytes_at(g.tile)


def count(ms, tile: int, *, peak: bool = True, cube_in_ub: bool = False, dedupe: bool = True, clip: bool = True,
          copies: int = 2, cube_serves: bool = False) -> int:
    """The §3 count written out, with switches for the mistakes the hint names (all defaults: the rules).
    `cube_serves`: a tensor the cube reads is taken as brought in already when a later member reads it."""
    size = (lambda b: min(b, tile)) if clip else (lambda b: b)
    seen, fixed, mids = set(), 0, []
    for pos, m in enumerate(ms):
        for key, b in m.reads:
            if m.cube and not cube_in_ub:
                if cube_serves:
                    seen.add(("in", key))
                continue
            if dedupe and ("in", key) in seen:
                continue
            seen.add(("in", key))
            fixed += copies * size(b)
        for key, b in m.writes:
            fixed += copies * size(b)
        mids += [(pos, last, size(b)) for _, b, last in m.keeps]
    if not peak:
        return fixed + sum(b for _, _, b in mids)
    return fixed + max((sum(b for s, e, b in mids if s <= k <= e) for k in range(len(ms))), default=0)


def _mistake(ms, tile: int, got: int) -> str:
    want = ws_model.working_set(ms).bytes_at(tile)
    said = [words for value, words in (
        (count(ms, tile, peak=False), "every intermediate counted at once: one is freed after its last reader"),
        (count(ms, tile, cube_in_ub=True), "the cube's operands counted in the UB: they go through L1"),
        (count(ms, tile, dedupe=False), "a tensor read by two ops counted twice: it is brought in once"),
        (count(ms, tile, clip=False), "whole tensors: a tensor takes min(its bytes, tile)"),
        (count(ms, tile, copies=1), "one tile per transfer: double buffering takes two"),
        (count(ms, tile, cube_serves=True), "a tensor the cube reads left out for the op that reads it again: "
                                             "the cube's copy is in L1, that op brings its own through the UB"))
        if value == got != want]
    if len(said) > 1:  # two mistakes give this number: name both, the answer alone cannot tell which
        return " (that is one of these: " + "; or ".join(said) + ")"
    return f" (that is {said[0]})" if said else ""


def _judge(ub_bytes, case: Case) -> str | None:
    g: Group = case.data
    ms = members(g)
    got = attempt(ub_bytes, list(ms), g.tile)
    if is_stub(got):
        raise NotAnswered
    if isinstance(got, bool) or not isinstance(got, (int, float, np.integer, np.floating)):
        raise AnswerRaised(f"ub_bytes must return a number of bytes, got {type(got).__name__}")
    want = truth(g)
    if np.isfinite(got) and abs(got - want) < 0.5:
        return None
    word = "too many" if got > want else "too few"
    return (f"you say {float(got):,.0f} B, {word}; the working-set model needs {want:,} B = {want / g.tile:g} tiles "
            f"of {g.tile / KIB:g} KiB{_mistake(ms, g.tile, int(round(got)) if np.isfinite(got) else -1)}")


def check(ub_bytes) -> Verdict:
    """Grade `ub_bytes(members, tile)` against `working_set(members).bytes_at(tile)` on the hidden groups."""
    return grade(EXERCISE, ub_bytes, CASES, _judge, task=TASK,
                 checked="Each group (members from mixed.working_set_members): your bytes against "
                         "working_set(members).bytes_at(tile), exactly.")
