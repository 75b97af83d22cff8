"""Exercise: the bytes one attention head moves, unfused and tiled (notebook 10).

The learner writes ``attention_traffic(seq, head_dim, item, block) -> (unfused, tiled)``: the bytes one head of
attention moves to and from memory when exported as MatMul, Mul (the scale), Softmax, MatMul, and when tiled as
FlashAttention with query tiles of `block` rows, for `item`-byte elements. `check(attention_traffic)` grades it on
hidden shapes against `lessons.reductions.attention_bytes`, the model notebook 10 §2 tabulates (the block is the
one that model chooses for the case's on-chip budget), and names the likely mistake: the N x N scores counted fewer
than six times, Q, K, V and O (or O alone) left out, K and V read only once, the partial last query tile dropped
(floor for ceiling), or elements for bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..lessons.reductions import attention_bytes
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "expected"]

EXERCISE = "the bytes of attention, unfused and tiled"
TASK = "attention_traffic(seq, head_dim, item, block) returning (unfused, tiled)"


@dataclass(frozen=True)
class BytesCase:
    """One head of `seq` tokens and `head_dim`, `item`-byte elements, the model's tile for `on_chip` bytes."""

    seq: int
    head_dim: int
    item: int
    on_chip: int = 1 << 20

    @property
    def model(self):
        return attention_bytes(self.seq, self.head_dim, item=self.item, on_chip_bytes=self.on_chip)

    @property
    def block(self) -> int:
        return self.model.block_q


def _case(what: str, c: BytesCase) -> Case:
    return Case(f"{what}: N = {c.seq}, d = {c.head_dim}, fp{8 * c.item}, query tiles of {c.block}", c)


CASES = (
    _case("§2's table (1 MiB on chip)", BytesCase(1024, 64, 4)),
    _case("a partial last query tile", BytesCase(1000, 64, 4)),
    _case("a wider head in half precision", BytesCase(4096, 128, 2)),
    _case("a short sequence, one query tile", BytesCase(40, 64, 4)),
    _case("a 256 KiB budget, smaller tiles", BytesCase(2048, 64, 4, on_chip=256 * 1024)),
    _case("§2's longest sequence", BytesCase(16384, 64, 4)),
)


def expected(c: BytesCase) -> tuple[int, int]:
    """(unfused, tiled) bytes from the lesson's model."""
    m = c.model
    return m.unfused, m.flash


def _unfused_mistake(c: BytesCase, got: int) -> str:
    n, d, item = c.seq, c.head_dim, c.item
    if item > 1 and got * item == expected(c)[0]:
        return " (that is elements, not bytes: multiply by item)"
    ends_said = {4: "", 3: "O written left out: the second MatMul writes an N x d output, as Q, K and V are read",
                 0: "the scores alone: Q, K and V read and O written count too"}  # N x d tensors counted
    for ends, left_out in ends_said.items():
        scores, rest = divmod(got - ends * n * d * item, n * n * item)
        if rest or not 0 < scores <= 6 or (ends == 4 and scores == 6):
            continue
        said = [left_out] if left_out else []
        if scores != 6:
            said.append(f"the {n} x {n} scores counted {scores} time{'s' if scores != 1 else ''}: the first MatMul "
                        f"writes them, the scale and the softmax each read and write them, the second MatMul reads "
                        f"them: six")
        return f" (that is {'; and '.join(said)})"
    return ""


def _tiled_mistake(c: BytesCase, got: int) -> str:
    n, d, item, b = c.seq, c.head_dim, c.item, c.block
    said = [words for value, words in (
        (4 * n * d * item, "K and V read once: each query tile reads all of K and V again"),
        (2 * n * d * item + (n // b) * 2 * n * d * item,
         "n // block query tiles: the partial last tile reads K and V too, so round up"),
        (expected(c)[1] // item, "elements, not bytes: multiply by item")) if value == got and value != expected(c)[1]]
    return f" (that is {' or '.join(said)})" if said else ""


def _judge(attention_traffic, case: Case) -> str | None:
    c: BytesCase = case.data
    got = attempt(attention_traffic, c.seq, c.head_dim, c.item, c.block)
    if is_stub(got):
        raise NotAnswered
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise AnswerRaised(f"attention_traffic must return (unfused, tiled); it returned {type(got).__name__}")
    if any(is_stub(g) for g in got):
        raise NotAnswered
    for g in got:
        if isinstance(g, bool) or not isinstance(g, (int, np.integer, float, np.floating)):
            raise AnswerRaised(f"attention_traffic must return two numbers of bytes, got {type(g).__name__}")
    want_u, want_t = expected(c)
    got_u, got_t = (int(round(float(g))) for g in got)
    if got_u != want_u:
        word = "too high" if got_u > want_u else "too low"
        return (f"your unfused bytes are {got_u:,} B, {word}; the model counts {want_u:,} B"
                f"{_unfused_mistake(c, got_u)}")
    if got_t != want_t:
        word = "too high" if got_t > want_t else "too low"
        return f"your tiled bytes are {got_t:,} B, {word}; the model counts {want_t:,} B{_tiled_mistake(c, got_t)}"
    return None


def check(attention_traffic) -> Verdict:
    """Grade `attention_traffic(seq, head_dim, item, block) -> (unfused, tiled)` on the hidden shapes."""
    return grade(EXERCISE, attention_traffic, CASES, _judge, task=TASK,
                 checked="Each shape: your (unfused, tiled) bytes against lessons.reductions.attention_bytes, exactly.")
