"""Exercise: predict the fused operators the vertical pass writes into a LLaMA-style decoder (notebook 12).

The learner writes ``fused_ops(layers, heads, kv_heads, batch, past) -> {op type: count}``: how many of each of six
fused operators (`OPS`: RMSNormalization, SkipSimplifiedLayerNormalization, RotaryEmbedding, QuickGelu,
GroupQueryAttention, MultiHeadAttention) ``fuse(model, passes=("vertical",))`` writes into
``lessons.decoding.llama_decoder`` of that shape: `layers` layers, `heads` query heads over `kv_heads` K/V heads,
`batch` an int or a name (symbolic), `past` whether the graph takes a KV cache. `check(fused_ops)` builds each
hidden decoder (small widths: the counts do not depend on them), runs the pass and counts the ops of the fused
model. The hint names the first op counted wrong and why: for attention, the plan's own refusal of rule `gqa`
(batch not provably 1, the present V a graph output) or no K/V head shared; for the norms, the first one has no
residual Add before it; rotary, one for Q and one for K per layer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..graph import load
from ..lessons.decoding import LlamaConfig, llama_decoder
from ..passes import fuse
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "OPS", "check", "truth"]

EXERCISE = "the fused operators of a decoder"
TASK = "fused_ops(layers, heads, kv_heads, batch, past) returning {op type: count}"
OPS = ("RMSNormalization", "SkipSimplifiedLayerNormalization", "RotaryEmbedding", "QuickGelu", "GroupQueryAttention",
       "MultiHeadAttention")
HEAD_DIM = 16  # small widths keep the check fast; a multiple of 8, as onnxruntime's attention kernels want

_WHY = {"RMSNormalization": "the first norm has no residual Add before it: RMSNormalization, once",
        "SkipSimplifiedLayerNormalization": "every norm after a residual Add, the final norm included, is Add + "
                                            "RMSNorm in one kernel: two per layer",
        "RotaryEmbedding": "each layer rotates its queries and its keys: two per layer",
        "QuickGelu": "each layer's MLP has one SiLU (Sigmoid and Mul)"}


@dataclass(frozen=True)
class Decoder:
    """The arguments of one hidden decoder."""

    layers: int
    heads: int
    kv_heads: int
    batch: int | str
    past: bool

    def args(self) -> tuple:
        return self.layers, self.heads, self.kv_heads, self.batch, self.past


CASES = (
    Case("notebook 12's decoder: 2 layers, 12 query heads over 4 K/V heads, batch 1, with a cache",
         Decoder(2, 12, 4, 1, True)),
    Case("one layer, 8 query heads over 2 K/V heads, batch 1, with a cache", Decoder(1, 8, 2, 1, True)),
    Case("multi-query attention: 4 layers, 16 query heads over one K/V head, batch 1, with a cache",
         Decoder(4, 16, 1, 1, True)),
    Case("no GQA: 2 layers, 12 query heads and 12 K/V heads, batch 1, with a cache", Decoder(2, 12, 12, 1, True)),
    Case("a symbolic batch: 2 layers, 12 over 4 heads, batch 'batch', with a cache",
         Decoder(2, 12, 4, "batch", True)),
    Case("two requests at once: 2 layers, 12 over 4 heads, batch 2, with a cache", Decoder(2, 12, 4, 2, True)),
    Case("a prefill-only export: 3 layers, 12 over 4 heads, batch 1, no cache inputs", Decoder(3, 12, 4, 1, False)),
)


@lru_cache(maxsize=None)
def truth(d: Decoder) -> tuple[dict[str, int], str]:
    """(the count of each of `OPS` in the fused decoder, the plan's refusal of attention in layer 0 or "")."""
    cfg = LlamaConfig(vocab=64, hidden=d.heads * HEAD_DIM, heads=d.heads, kv_heads=d.kv_heads, intermediate=64,
                      layers=d.layers)
    res = fuse(load(llama_decoder(cfg, past=d.past, batch=d.batch)), passes=("vertical",))
    ops = Counter(n.op_type for n in res.graph.to_proto().graph.node)
    why = next((r.reason for r in res.plan.why_not()
                if r.rule in ("gqa", "attention") and "layers.0/" in r.node), "")
    return {op: ops.get(op, 0) for op in OPS}, why


def _attention_hint(d: Decoder, want: dict[str, int], why: str) -> str:
    if why:
        return f"the plan says: {why}"
    if want["GroupQueryAttention"]:
        return ("rule gqa finds repeat_kv over Concat(past, new) with batch 1: GroupQueryAttention reads the cache, "
                "one per layer")
    if d.kv_heads == d.heads:
        return "no K/V head is shared (as many as query heads): no repeat to remove, so MultiHeadAttention"
    return "no attention group was formed"


def _judge(fused_ops, case: Case) -> str | None:
    d: Decoder = case.data
    got = attempt(fused_ops, *d.args())
    if is_stub(got):
        raise NotAnswered
    if not isinstance(got, dict):
        raise AnswerRaised(f"fused_ops must return a dict {{op type: count}}, got {type(got).__name__}")
    unknown = sorted(str(k) for k in got if k not in OPS)
    if unknown:
        return f"{', '.join(unknown)} is not one of the six graded ops: {', '.join(OPS)}"
    for op, n in got.items():
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            return f"the count of {op} must be an int, got {type(n).__name__}"
    want, why = truth(d)
    for op in OPS:
        n = int(got.get(op, 0))
        if n != want[op]:
            reason = _attention_hint(d, want, why) if op.endswith("Attention") else _WHY[op]
            return f"{op}: you say {n}, the fused model has {want[op]}; {reason}"
    return None


def check(fused_ops) -> Verdict:
    """Grade `fused_ops(layers, heads, kv_heads, batch, past)` on the hidden decoders."""
    return grade(EXERCISE, fused_ops, CASES, _judge, task=TASK,
                 checked="Each decoder: your counts of the six ops against the model fuse(passes=('vertical',)) "
                         "writes from lessons.decoding.llama_decoder of that shape.")
