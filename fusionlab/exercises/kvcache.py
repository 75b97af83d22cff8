"""Exercise: the bytes of the KV cache one decode step reads (notebook 11).

The learner writes ``kv_cache_bytes(layers, heads, kv_heads, head_dim, context, dtype_bytes) -> int``: the bytes a
decode step reads from the KV cache when `context` tokens are cached, for a LLaMA-style decoder of `layers` layers
whose `heads` query heads share `kv_heads` K/V heads of `head_dim`. `check(kv_cache_bytes)` grades it on hidden
shapes against `lessons.decoding.LlamaConfig.kv_bytes_per_token`, the count notebook 11 uses, and names the likely
mistake: V forgotten, the query heads counted instead of the K/V heads (no GQA), one layer only, or bits for bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..lessons.decoding import LlamaConfig
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "expected"]

EXERCISE = "the KV cache a decode step reads"
TASK = "kv_cache_bytes(layers, heads, kv_heads, head_dim, context, dtype_bytes)"


@dataclass(frozen=True)
class KVCase:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    context: int
    dtype_bytes: int

    def config(self, kv_heads: int | None = None) -> LlamaConfig:
        return LlamaConfig(hidden=self.heads * self.head_dim, heads=self.heads,
                           kv_heads=self.kv_heads if kv_heads is None else kv_heads, layers=self.layers)


def _case(name: str, *args) -> Case:
    return Case(name, KVCase(*args))


CASES = (
    _case("notebook 11's decoder: 2 layers, 12 query heads over 4 K/V heads of 64, 4096 cached, fp32",
          2, 12, 4, 64, 4096, 4),
    _case("an 8B-sized shape: 32 layers, 32 query heads over 8 K/V heads of 128, 8192 cached, fp16",
          32, 32, 8, 128, 8192, 2),
    _case("no GQA (multi-head attention): 12 layers, 12 heads of 64, 1024 cached, fp16", 12, 12, 12, 64, 1024, 2),
    _case("the first decode step after an empty cache: context 0", 4, 8, 2, 64, 0, 2),
    _case("multi-query attention: one K/V head for 16 query heads, 2048 cached, fp32", 6, 16, 1, 64, 2048, 4),
)


def expected(c: KVCase) -> int:
    """K and V of every layer, `kv_heads` heads of `head_dim`, for each cached token (the lesson's count)."""
    return c.context * c.config().kv_bytes_per_token(c.dtype_bytes)


def _mistake(c: KVCase, got: int) -> str:
    want = expected(c)
    said = [words for value, words in (
        (want // 2, "K only: a cache holds V beside K"),
        (c.context * c.config(kv_heads=c.heads).kv_bytes_per_token(c.dtype_bytes),
         "the query heads counted: with grouped-query attention the cache holds only the K/V heads"),
        (want // c.layers if c.layers else -1, "one layer: every layer has its own cache"),
        (want * 8, "bits, not bytes"),
        (want // c.dtype_bytes, "elements, not bytes: multiply by dtype_bytes")) if value == got and value != want]
    return f" (that is {' or '.join(said)})" if said else ""


def _judge(kv_cache_bytes, case: Case) -> str | None:
    c: KVCase = case.data
    got = attempt(kv_cache_bytes, c.layers, c.heads, c.kv_heads, c.head_dim, c.context, c.dtype_bytes)
    if is_stub(got):
        raise NotAnswered
    if isinstance(got, bool) or not isinstance(got, (int, np.integer, float)):
        raise AnswerRaised(f"kv_cache_bytes must return a number of bytes, got {type(got).__name__}")
    want = expected(c)
    if got == want:
        return None
    word = "too high" if got > want else "too low"
    return f"you say {int(got):,} B, {word}; the cache of this shape holds {want:,} B{_mistake(c, int(got))}"


def check(kv_cache_bytes) -> Verdict:
    """Grade `kv_cache_bytes(layers, heads, kv_heads, head_dim, context, dtype_bytes)` on the hidden shapes."""
    return grade(EXERCISE, kv_cache_bytes, CASES, _judge, task=TASK,
                 checked="Each shape: your bytes against LlamaConfig.kv_bytes_per_token x context (K and V, every "
                         "layer, the K/V heads only).")
