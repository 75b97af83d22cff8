"""Exercise: the bytes SkipLayerNormalization saves over a residual Add and a LayerNormalization (notebook 04).

The learner writes ``saved_bytes(batch, seq, hidden, dtype_bytes, bias, sum_read_again) -> int``: the memory
traffic the fused kernel removes for activations of shape (batch, seq, hidden), when the residual Add's left operand
comes from a bias Add of a (hidden,) vector first (`bias`, the projection's bias as exporters write it) and when the
residual sum is also read by the next block's residual Add (`sum_read_again`, the pre-LN form: the fused kernel
must then still write the sum, as its fourth output). `check(saved_bytes)` builds each hidden case's model,
fuses it with the `skip_layernorm` rule (`fuse(..., rules=vertical.RULE_NAMES)`), and takes the truth from
fusionlab's cost model: the bytes every kernel reads and writes (`cost.node_costs`), unfused less fused. The hint
names the mistake the answer looks like: elements instead of bytes, the bias Add's output forgotten, the sum
counted as gone when the next Add still reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
from onnx import helper

from ..build import make_model, tensor, value_info
from ..cost import node_costs
from ..graph import load
from ..passes import fuse, vertical
from .core import Case, NotAnswered, Verdict, attempt, grade

__all__ = ["EXERCISE", "TASK", "CASES", "check", "model", "cost_model_saving"]

EXERCISE = "the bytes SkipLayerNormalization saves"
TASK = "saved_bytes(batch, seq, hidden, dtype_bytes, bias, sum_read_again)"
_DTYPES = {4: np.float32, 2: np.float16}


@dataclass(frozen=True)
class SkipCase:
    batch: int
    seq: int
    hidden: int
    dtype_bytes: int
    bias: bool = False
    sum_read_again: bool = False

    @property
    def args(self):
        return (self.batch, self.seq, self.hidden, self.dtype_bytes, self.bias, self.sum_read_again)


#: the hidden cases, in the order they are graded
CASES = (
    Case("post-LN block, 1 x 128 x 768, fp32", SkipCase(1, 128, 768, 4)),
    Case("the projection's bias Add before the residual Add, 1 x 128 x 768, fp32", SkipCase(1, 128, 768, 4, True)),
    Case("fp16, 4 x 64 x 256, with the bias Add", SkipCase(4, 64, 256, 2, True)),
    Case("pre-LN: the sum is also read by the next residual Add, 1 x 128 x 768, fp32",
         SkipCase(1, 128, 768, 4, False, True)),
    Case("pre-LN with the bias Add, 2 x 32 x 512, fp16", SkipCase(2, 32, 512, 2, True, True)),
    Case("one decode step, 1 x 1 x 4096, fp16, with the bias Add", SkipCase(1, 1, 4096, 2, True)),
)


def model(c: SkipCase):
    """[bias Add ->] residual Add -> LayerNormalization [-> the next residual Add reading the sum]."""
    dt, shape, h = _DTYPES[c.dtype_bytes], [c.batch, c.seq, c.hidden], c.hidden
    rng = np.random.default_rng(c.hidden + c.seq)
    inits = [tensor("gamma", rng.uniform(0.5, 1.5, h).astype(dt)), tensor("beta", rng.standard_normal(h).astype(dt))]
    nodes, left = [], "h"
    if c.bias:
        inits.append(tensor("bias", rng.standard_normal(h).astype(dt)))
        nodes.append(helper.make_node("Add", ["h", "bias"], ["hb"], name="bias_add"))
        left = "hb"
    nodes += [helper.make_node("Add", [left, "residual"], ["sum"], name="residual_add"),
              helper.make_node("LayerNormalization", ["sum", "gamma", "beta"], ["y"], name="layernorm", axis=-1)]
    out = "y"
    if c.sum_read_again:
        nodes.append(helper.make_node("Add", ["sum", "y"], ["next"], name="next_residual_add"))
        out = "next"
    return make_model(nodes, [value_info("h", dt, shape), value_info("residual", dt, shape)],
                      [value_info(out, dt, shape)], inits, name="skip_layernorm")


@lru_cache(maxsize=None)
def cost_model_saving(c: SkipCase) -> int:
    """Bytes read and written by every kernel (`cost.node_costs`), unfused less fused with skip_layernorm on."""
    unfused = load(model(c))
    fused = fuse(unfused, passes=("vertical",), rules=vertical.RULE_NAMES)
    if "skip_layernorm" not in fused.plan.rule_counts():  # pragma: no cover - the cases are built to fuse
        raise RuntimeError(f"skip_layernorm did not fuse {c}")
    return sum(n.bytes for n in node_costs(unfused)) - sum(n.bytes for n in node_costs(fused.graph))


def _looks_like(said: int, c: SkipCase) -> str:
    if said * c.dtype_bytes == cost_model_saving(c):
        return ": it looks like elements, not bytes (times dtype_bytes)"
    if c.sum_read_again and said == cost_model_saving(replace(c, sum_read_again=False)):
        return (": it looks like the sum counted as gone, but the next Add still reads it, so the fused kernel "
                "writes it (its fourth output); only the LayerNorm's read of it is saved")
    if c.bias and said == cost_model_saving(replace(c, bias=False)):
        return ": it looks like the bias Add's output forgotten, an intermediate written once and read once too"
    return ""


def _judge(saved_bytes, case: Case) -> str | None:
    c: SkipCase = case.data
    said = attempt(saved_bytes, *c.args)
    if said is None:
        raise NotAnswered
    if isinstance(said, bool) or not isinstance(said, (int, float, np.integer, np.floating)):
        return f"saved_bytes must return a number of bytes; it returned {type(said).__name__}"
    want = cost_model_saving(c)
    if float(said) == want:
        return None
    side = "more" if want > said else "fewer"
    return f"you said {float(said):,.0f} bytes; the cost model counts {side}{_looks_like(said, c)}"


def check(saved_bytes) -> Verdict:
    """Grade `saved_bytes(batch, seq, hidden, dtype_bytes, bias, sum_read_again)` against the cost model."""
    return grade(EXERCISE, saved_bytes, CASES, _judge, task=TASK,
                 checked="Each case: your bytes against fusionlab's cost model (every kernel's reads and writes, "
                         "unfused less fused with skip_layernorm on), exactly.")
