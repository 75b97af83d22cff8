"""Exercise: predict what onnxruntime runs at each of its optimisation levels (notebook 00).

The learner writes ``ort_ops(ops, level) -> list``: the op types onnxruntime's optimised graph holds when it loads a
chain `ops` (each op reading the one before: 3x3 Convs with pads 1, BatchNormalizations with constant statistics,
Relus) at `level`, one of "disable", "basic", "extended"; in any order, onnxruntime's contrib op written
"FusedConv". Notebook 00 teaches the rule: "basic" folds a BatchNormalization into the Conv whose output it reads
(`ConvBNFusion`), "extended" adds Conv + activation into one `FusedConv`. `check(ort_ops)` builds each hidden chain
as an ONNX model and takes the truth from `fusionlab.compilers.ort.optimized_ops` (onnxruntime's own optimised
graph at that level), compared as a multiset of op types. The hidden cases include the three levels on notebook
00's block, a Conv without BN, a BN without activation, near misses (a BN after the Relu, a BN with no Conv) and two
blocks in a row. The hint says what onnxruntime runs and names the likely mistake: the BN folded where it does not
follow a Conv, FusedConv at "basic", the fold forgotten, the activation left out of the FusedConv.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from onnx import helper

from ..build import make_model, tensor, value_info
from ..compilers import ort
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "LEVELS", "check", "model", "truth"]

EXERCISE = "what onnxruntime runs at each optimisation level"
TASK = "ort_ops(ops, level) returning a list of op types"
LEVELS = ("disable", "basic", "extended")
C, SIDE = 4, 6


@dataclass(frozen=True)
class LevelCase:
    """A chain `ops` (each reading the one before) loaded by onnxruntime at `level`."""

    ops: tuple
    level: str


def _case(name: str, ops, level: str) -> Case:
    return Case(name, LevelCase(tuple(ops), level))


CBR = ("Conv", "BatchNormalization", "Relu")
#: the hidden cases, in the order they are graded
CASES = (
    _case("notebook 00's Conv -> BN -> Relu, optimisations off ('disable')", CBR, "disable"),
    _case("Conv -> BN -> Relu at 'basic'", CBR, "basic"),
    _case("Conv -> BN -> Relu at 'extended'", CBR, "extended"),
    _case("Conv -> Relu, no BN, at 'basic'", ("Conv", "Relu"), "basic"),
    _case("Conv -> BN, no activation, at 'extended'", ("Conv", "BatchNormalization"), "extended"),
    _case("near miss: Conv -> Relu -> BN (the BN after the Relu) at 'extended'", ("Conv", "Relu", "BatchNormalization"),
          "extended"),
    _case("near miss: BN -> Relu, no Conv, at 'extended'", ("BatchNormalization", "Relu"), "extended"),
    _case("two Conv -> BN -> Relu blocks in a row at 'extended'", CBR + CBR, "extended"),
)


def model(ops: tuple):
    """The chain as an ONNX model: x [1, 4, 6, 6] float32, each op reading the one before (fixed random weights)."""
    rng = np.random.default_rng(0)
    f32 = np.float32
    nodes, inits, cur = [], [], "x"
    for k, op in enumerate(ops):
        out = "y" if k == len(ops) - 1 else f"t{k}"
        name = f"{op.lower()}_{k}"
        if op == "Conv":
            inits.append(tensor(f"W{k}", (rng.standard_normal((C, C, 3, 3)) * 0.2).astype(f32)))
            nodes.append(helper.make_node("Conv", [cur, f"W{k}"], [out], name=name, pads=[1, 1, 1, 1],
                                          kernel_shape=[3, 3]))
        elif op == "BatchNormalization":
            params = [f"bn{k}.{p}" for p in ("scale", "bias", "mean", "var")]
            inits += [tensor(params[0], rng.uniform(0.5, 1.5, C).astype(f32)),
                      tensor(params[1], rng.standard_normal(C).astype(f32)),
                      tensor(params[2], rng.standard_normal(C).astype(f32)),
                      tensor(params[3], rng.uniform(0.5, 2.0, C).astype(f32))]
            nodes.append(helper.make_node(op, [cur] + params, [out], name=name))
        else:
            nodes.append(helper.make_node(op, [cur], [out], name=name))
        cur = out
    shape = [1, C, SIDE, SIDE]
    return make_model(nodes, [value_info("x", f32, shape)], [value_info("y", f32, shape)], inits, name="chain")


def _plain(op: str) -> str:
    return str(op).split(":")[-1]


@lru_cache(maxsize=None)
def truth(c: LevelCase) -> tuple[tuple[str, int], ...]:
    """(op type, count) of the graph onnxruntime runs for the case, contrib ops without their domain."""
    counts = Counter()
    for op, n in ort.optimized_ops(model(c.ops), c.level).items():
        counts[_plain(op)] += n
    return tuple(sorted(counts.items()))


def _spell(counts: Counter) -> str:
    ops = [op for op, n in sorted(counts.items()) for _ in range(n)]
    return ", ".join(ops) if ops else "nothing"


def _mistake(c: LevelCase, said: Counter, want: Counter) -> str:
    """The plausible mistake the difference looks like, from what notebook 00 says each level does."""
    bn, fc = "BatchNormalization", "FusedConv"
    before = {i: c.ops[i - 1] if i else "graph input" for i in range(len(c.ops))}
    stray = [before[i] for i, op in enumerate(c.ops) if op == bn and before[i] != "Conv"]
    if said[bn] < want[bn]:
        if c.level == "disable":
            return "with optimisations off onnxruntime runs the graph as written"
        return (f"a BatchNormalization folds only into a Conv whose output it reads; this one reads the "
                f"{stray[0]}'s" if stray else "the BatchNormalization stays")
    if said[bn] > want[bn]:
        return ("from 'basic' on, onnxruntime folds a BatchNormalization into the Conv whose output it reads "
                "(ConvBNFusion)")
    if said[fc] > want[fc]:
        if c.level != "extended":
            return f"FusedConv (a Conv and its activation as one kernel) is an 'extended' fusion, not '{c.level}'"
        return "a Conv becomes a FusedConv only with an activation right after it (once a BN is folded)"
    if said[fc] < want[fc]:
        return "at 'extended' a Conv and the activation right after it (once a BN is folded) become one FusedConv"
    return ""


def _judge(ort_ops, case: Case) -> str | None:
    c: LevelCase = case.data
    got = attempt(ort_ops, list(c.ops), c.level)
    if is_stub(got):
        raise NotAnswered
    if isinstance(got, dict):
        items = [(k, v) for k, v in got.items()]
    elif isinstance(got, (list, tuple)):
        items = [(k, 1) for k in got]
    else:
        raise AnswerRaised(f"ort_ops must return a list of op types, like ['Conv', 'Relu']; it returned "
                           f"{type(got).__name__}")
    if any(is_stub(k) for k, _ in items):
        raise NotAnswered
    if not all(isinstance(k, str) and isinstance(v, (int, np.integer)) and not isinstance(v, bool) for k, v in items):
        raise AnswerRaised("ort_ops must return a list of op type names (strings), like ['Conv', 'Relu']")
    said = Counter()
    for k, v in items:
        said[_plain(k)] += int(v)
    said = Counter({k: v for k, v in said.items() if v})
    want = Counter(dict(truth(c)))
    if said == want:
        return None
    why = _mistake(c, said, want)
    return f"onnxruntime at {c.level!r} runs {_spell(want)}; you said {_spell(said)}" + (f"; {why}" if why else "")


def check(ort_ops) -> Verdict:
    """Grade `ort_ops(ops, level)` on the hidden chains against onnxruntime's own optimised graphs."""
    return grade(EXERCISE, ort_ops, CASES, _judge, task=TASK,
                 checked="Each chain: your op types against those of the graph onnxruntime optimises at that level "
                         "(fusionlab.compilers.ort.optimized_ops), counted as a multiset.")
