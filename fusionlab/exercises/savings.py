"""Exercise: the bytes fusing a Conv chain into one kernel saves (notebook 00).

The learner writes ``saved_bytes(shape, dtype_bytes, ops) -> int``: the memory traffic saved when a chain of
operators `ops` (a Conv, then elementwise ones such as BatchNormalization and Relu, each reading only the previous
one's output) runs as one fused kernel instead of one kernel per operator; every tensor between them has the Conv
output's `shape`, each value `dtype_bytes` bytes. Counted as notebook 00's "What fusing it would save" does: each
intermediate is written once and read back once unfused, and never leaves the chip fused. `check(saved_bytes)`
builds each hidden chain as an ONNX model and takes the truth from `fusionlab.cost.plan_cost`: the bytes moved with
no plan (one kernel per node) minus the bytes moved under a plan that fuses the whole chain into one group, as the
notebook's plan does. The hint names the likely mistake: the reads back forgotten, notebook 00's two intermediates
whatever the chain, the output counted as saved, one sample of the batch, bits, or values for bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from onnx import helper

from ..build import make_model, tensor, value_info
from ..cost.model import plan_cost
from ..graph import load
from ..plan import FusionGroup, FusionPlan
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "chain", "truth"]

EXERCISE = "the bytes a fused Conv chain saves"
TASK = "saved_bytes(shape, dtype_bytes, ops)"
DEVICE = "Atlas 300I Pro"  # any preset: bytes do not depend on it
PRECISION = {4: "fp32", 2: "fp16"}


@dataclass(frozen=True)
class ChainCase:
    """A chain `ops` (Conv first) whose Conv maps `c_in` channels to the `shape` it and every later op output."""

    ops: tuple
    shape: tuple
    dtype_bytes: int = 4
    c_in: int = 8


def _case(name: str, ops, shape, dtype_bytes=4) -> Case:
    return Case(name, ChainCase(tuple(ops), tuple(shape), dtype_bytes))


CBR = ("Conv", "BatchNormalization", "Relu")
CASES = (
    _case("Conv -> BatchNormalization -> Relu to [1, 16, 64, 64], fp32: notebook 00's block", CBR, (1, 16, 64, 64)),
    _case("the same chain on a batch of 8: [8, 32, 28, 28], fp32", CBR, (8, 32, 28, 28)),
    _case("the same chain in fp16 (2 bytes a value): [1, 64, 56, 56]", CBR, (1, 64, 56, 56), 2),
    _case("Conv -> Relu, no BatchNormalization: [2, 24, 32, 32], fp32", ("Conv", "Relu"), (2, 24, 32, 32)),
    _case("Conv -> Add (its bias, exported apart) -> BatchNormalization -> Relu: [1, 32, 40, 40], fp16",
          ("Conv", "Add", "BatchNormalization", "Relu"), (1, 32, 40, 40), 2),
    _case("a Conv alone, nothing to fuse: [1, 16, 64, 64], fp32", ("Conv",), (1, 16, 64, 64)),
)


def chain(c: ChainCase):
    """The case's chain as a Graph: a 3x3 Conv (pads 1) and then each op, every one reading its predecessor."""
    rng = np.random.default_rng(0)
    n, ch, h, w = c.shape
    f32 = np.float32
    nodes, inits, cur = [], [], "x"
    for k, op in enumerate(c.ops):
        out = "y" if k == len(c.ops) - 1 else f"t{k}"
        name = f"{op.lower()}_{k}"
        if op == "Conv":
            inits.append(tensor("W", rng.standard_normal((ch, c.c_in, 3, 3)).astype(f32)))
            nodes.append(helper.make_node("Conv", [cur, "W"], [out], name=name, pads=[1, 1, 1, 1]))
        elif op == "BatchNormalization":
            params = [f"bn{k}.{p}" for p in ("scale", "bias", "mean", "var")]
            inits += [tensor(p, rng.uniform(0.5, 1.5, ch).astype(f32)) for p in params]
            nodes.append(helper.make_node(op, [cur] + params, [out], name=name))
        elif op == "Add":
            inits.append(tensor(f"b{k}", rng.standard_normal((ch, 1, 1)).astype(f32)))
            nodes.append(helper.make_node(op, [cur, f"b{k}"], [out], name=name))
        else:
            nodes.append(helper.make_node(op, [cur], [out], name=name))
        cur = out
    proto = make_model(nodes, [value_info("x", f32, [n, c.c_in, h, w])], [value_info("y", f32, list(c.shape))],
                       inits, name="conv_chain")
    return load(proto)


@lru_cache(maxsize=None)
def truth(c: ChainCase) -> int:
    """Bytes moved one kernel per node, minus bytes moved with the whole chain in one group (`cost.plan_cost`)."""
    g = chain(c)
    plan = FusionPlan(model="conv_chain")
    names = [node.name for node in g.topological_order()]
    plan.add(FusionGroup(id="g0", kind="vertical", rule="conv_chain", nodes=names, op_types=list(c.ops),
                         saved_bytes=0, kernels=1, saved_launches=len(names) - 1, lowered_to="one kernel",
                         reason="a chain: each intermediate has a single consumer and is not a graph output"))
    precision = PRECISION[c.dtype_bytes]
    unfused = plan_cost(g, None, DEVICE, precision=precision).bytes_moved
    return unfused - plan_cost(g, plan, DEVICE, precision=precision).bytes_moved


def _mistake(c: ChainCase, got: int) -> str:
    size = int(np.prod(c.shape)) * c.dtype_bytes  # one intermediate's bytes, for naming mistakes only
    want, mids, batch = truth(c), len(c.ops) - 1, c.shape[0]
    said = [words for value, words in (
        (mids * size, "the writes only: unfused, each intermediate is also read back"),
        (2 * 2 * size, "two intermediates, as in notebook 00's block: a chain of n operators has n - 1"),
        (2 * len(c.ops) * size, "one tensor per operator: y is still written by the fused kernel, so it saves nothing"),
        (want // batch if batch > 1 else -1, "one sample: the tensors hold the whole batch"),
        (want * 8, "bits, not bytes"),
        (want // c.dtype_bytes, "values, not bytes: multiply by dtype_bytes")) if value == got and value != want]
    return f" (that is {said[0]})" if said else ""


def _judge(saved_bytes, case: Case) -> str | None:
    c: ChainCase = case.data
    got = attempt(saved_bytes, c.shape, c.dtype_bytes, list(c.ops))
    if is_stub(got):
        raise NotAnswered
    if isinstance(got, bool) or not isinstance(got, (int, np.integer, float, np.floating)):
        raise AnswerRaised(f"saved_bytes must return a number of bytes, got {type(got).__name__}")
    want = truth(c)
    if got == want:
        return None
    word = "too high" if got > want else "too low"
    return f"you say {float(got):,.0f} B, {word}; the cost model's count is {want:,} B{_mistake(c, int(got))}"


def check(saved_bytes) -> Verdict:
    """Grade `saved_bytes(shape, dtype_bytes, ops)` on the hidden chains against `cost.plan_cost`."""
    return grade(EXERCISE, saved_bytes, CASES, _judge, task=TASK,
                 checked="Each chain: your bytes against cost.plan_cost's bytes moved one kernel per node minus "
                         "those with the chain fused into one group.")
