"""Exercise: the largest FlashAttention tile one Ascend AI core holds (notebook 10).

The learner writes ``flash_block(ub_kb, l1_kb, head_dim) -> int``: the largest square tile b (b queries by b keys, a
multiple of 16) whose buffers fit a core's L1 and its Unified Buffer, as notebook 10 §4 lays them out: in L1 the
fp16 Q tile and double-buffered fp16 K and V tiles; in UB the fp32 scores, the fp16 probabilities, the fp32 output
accumulator and the fp32 running max and sum of each query row. `check(flash_block)` grades it against
`lessons.reductions.flash_block`, the search `ascend_flash_tile` makes for the table of notebook 10 §4, on the L1 and
UB sizes of the presets in data/devices.json at several head sizes, and on two hypothetical cores: one whose L1 is
the tighter, one whose UB the running max and sum decide. The hint says which buffer a too-large tile overflows,
or shows a larger tile that still fits, and names the likely mistake: the probabilities, the accumulator or the
running max and sum left out of UB, K and V not double-buffered, L1 not checked, or KiB read as 1000 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..cost.devices import get
from ..lessons.reductions import flash_block, flash_buffers
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "expected"]

EXERCISE = "the largest FlashAttention tile an AI core holds"
TASK = "flash_block(ub_kb, l1_kb, head_dim) returning the tile size"
STEP = 16  # the cube's fractal size: tiles are multiples of it


@dataclass(frozen=True)
class TileCase:
    """A core with `ub_kb` of UB and `l1_kb` of L1 (KiB), and the head size."""

    ub_kb: float
    l1_kb: float
    head_dim: int


def _preset(name: str, head_dim: int) -> Case:
    dev = get(name)
    return Case(f"{dev.name}'s core (UB {dev.ub_kb:g} KiB, L1 {dev.l1_kb:g} KiB), head size {head_dim}",
                TileCase(dev.ub_kb, dev.l1_kb, head_dim))


CASES = (
    _preset("Atlas 300I Pro", 128),
    _preset("Atlas 800I A2 (Ascend 910B)", 128),
    _preset("Atlas 800I A2 (Ascend 910B)", 64),
    _preset("Atlas 300I Pro", 256),
    _preset("Atlas 800I A2 (Ascend 910B)", 80),
    Case("a hypothetical core whose L1 is the tighter (UB 256 KiB, L1 128 KiB), head size 128",
         TileCase(256, 128, 128)),
    Case("a hypothetical core where the running max and sum decide (UB 231 KiB, L1 1024 KiB), head size 128",
         TileCase(231, 1024, 128)),
)


def expected(c: TileCase) -> int:
    """The lesson's tile: the largest multiple of 16 whose `flash_buffers` fit both L1 and UB."""
    return flash_block(c.ub_kb * 1024, c.l1_kb * 1024, c.head_dim, step=STEP)


def _largest(l1: Callable[[int, int], float], ub: Callable[[int, int], float], c: TileCase, kib: int = 1024) -> int:
    """The largest multiple of 16 under a (possibly mistaken) layout of the buffers."""
    b = 0
    while b < 1 << 16 and l1(b + STEP, c.head_dim) <= c.l1_kb * kib and ub(b + STEP, c.head_dim) <= c.ub_kb * kib:
        b += STEP
    return b


def _l1(b, d):
    return flash_buffers(b, d)[0]


def _ub(b, d):
    return flash_buffers(b, d)[1]


#: plausible mistakes, each as the layout that leads to it
_MISTAKES = (
    ("the fp16 probabilities left out of UB", _l1, lambda b, d: b * b * 4 + b * d * 4 + 2 * b * 4),
    ("the output accumulator left out of UB", _l1, lambda b, d: b * b * (4 + 2) + 2 * b * 4),
    ("the fp32 running max and sum left out of UB (one of each per query row)", _l1,
     lambda b, d: b * b * (4 + 2) + b * d * 4),
    ("K and V single-buffered in L1 (double buffering holds two tiles of each)", lambda b, d: 3 * b * d * 2, _ub),
    ("only UB checked: Q, K and V must fit L1 too", lambda b, d: 0, _ub),
)


def _mistake(c: TileCase, got: int) -> str:
    said = [words for words, l1, ub in _MISTAKES if _largest(l1, ub, c) == got]
    if _largest(_l1, _ub, c, kib=1000) == got:
        said.append("KiB read as 1000 bytes: a KiB is 1024")
    return f"; that looks like {' or '.join(said)}" if said else ""


def _judge(flash_block_answer, case: Case) -> str | None:
    c: TileCase = case.data
    got = attempt(flash_block_answer, c.ub_kb, c.l1_kb, c.head_dim)
    if is_stub(got):
        raise NotAnswered
    if isinstance(got, bool) or not isinstance(got, (int, np.integer, float, np.floating)) or got != int(got):
        raise AnswerRaised(f"flash_block must return a whole number of rows, got {got!r}")
    got, want = int(got), expected(c)
    if got == want:
        return None
    if got <= 0 or got % STEP:
        return f"a tile is a positive multiple of {STEP} (the cube's fractal size); {got} is not"
    ub_have, l1_have = int(c.ub_kb * 1024), int(c.l1_kb * 1024)
    if got > want:
        l1, ub = flash_buffers(got, c.head_dim)
        over = [f"{need:,} B of {what}, where the core has {have:,} B"
                for what, need, have in (("UB", ub, ub_have), ("L1", l1, l1_have)) if need > have]
        return f"a tile of {got} does not fit: it needs {' and '.join(over)}{_mistake(c, got)}"
    l1, ub = flash_buffers(got + STEP, c.head_dim)
    return (f"a tile of {got + STEP} still fits (UB {ub:,} of {ub_have:,} B, L1 {l1:,} of {l1_have:,} B): "
            f"yours is too small{_mistake(c, got)}")


def check(flash_block_answer) -> Verdict:
    """Grade `flash_block(ub_kb, l1_kb, head_dim) -> int` on the presets' cores and a hypothetical one."""
    return grade(EXERCISE, flash_block_answer, CASES, _judge, task=TASK,
                 checked="Each core: your tile against lessons.reductions.flash_block, the largest multiple of 16 "
                         "whose L1 and UB buffers (flash_buffers) fit.")
