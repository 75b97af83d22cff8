"""Exercise: size a double buffer for an Ascend vector kernel (notebook 19).

The learner writes ``largest_tile(ub_bytes, in_bytes, out_bytes, inputs=1, outputs=1) -> int``: the largest tile,
in elements, such that every input queue and every output queue gets TWO buffers of one tile each
(``BUFFER_NUM = 2``) in a Unified Buffer of `ub_bytes`, each buffer a whole number of 32-byte UB blocks
(``ubblock_size=32``, cann_facts.md §3.3). `check(largest_tile)` grades it on hidden cases taken from the device
presets (`fusionlab.cost.devices`, the UB of one core as `double_buffer.core_from_device` models it) against the
simulator module's own sizing, `fusionlab.lessons.double_buffer.max_tile_elems`, and checks the UB arithmetic of
the answer: a tile that does not fit, is not block-aligned, or leaves room for one more block fails, with the
mistake it looks like (one buffer per queue, outputs forgotten, no alignment, alignment to the wider dtype).
The UB of a preset is its nominal size (`ub_kb` x 1024); on A2 the tiling code sees 256 B less at run time
(cann_facts.md §3.3), which the cases do not model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..cost.devices import get as get_device
from ..lessons.double_buffer import core_from_device, max_tile_elems
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "BUFFER_NUM", "BLOCK", "CASES", "check"]

EXERCISE = "size a double buffer"
TASK = "largest_tile(ub_bytes, in_bytes, out_bytes, inputs, outputs)"
BUFFER_NUM = 2
BLOCK = 32


@dataclass(frozen=True)
class BufferCase:
    """A kernel's queues on one device core: `inputs` inputs of `in_bytes`, `outputs` outputs of `out_bytes`."""

    device: str
    in_bytes: int
    out_bytes: int
    inputs: int = 1
    outputs: int = 1
    ub_bytes: int | None = None  # None: the preset's UB per core

    @property
    def ub(self) -> int:
        return self.ub_bytes if self.ub_bytes is not None else core_from_device(get_device(self.device)).ub_bytes

    def per_elem(self, buffers: int = BUFFER_NUM, outputs: int | None = None) -> int:
        outs = self.outputs if outputs is None else outputs
        return buffers * (self.inputs * self.in_bytes + outs * self.out_bytes)

    @property
    def step(self) -> int:
        """Elements per 32-byte block of the narrower dtype (the alignment every buffer keeps)."""
        return BLOCK // math.gcd(BLOCK, min(self.in_bytes, self.out_bytes))


def _case(name: str, *args, **kw) -> Case:
    return Case(name, BufferCase(*args, **kw))


CASES = (
    _case("Atlas 300I Pro, fp16 in and out (an elementwise op)", "Atlas 300I Pro", 2, 2),
    _case("Atlas 800I A2, fp16 in and out", "Atlas 800I A2", 2, 2),
    _case("Atlas 800I A2, fp32 in and out", "Atlas 800I A2", 4, 4),
    _case("Atlas 300I Pro, two fp16 inputs (an Add), one output", "Atlas 300I Pro", 2, 2, inputs=2),
    _case("Atlas 800I A2, fp32 in, fp16 out (a Cast)", "Atlas 800I A2", 4, 2),
    _case("Atlas 800T, 200,000 B of the UB free, three fp16 inputs", "Atlas 800T", 2, 2, inputs=3,
          ub_bytes=200_000),
    _case("Atlas 800I A2, 200,000 B of the UB free, fp32 in, fp16 out (a Cast)", "Atlas 800I A2", 4, 2,
          ub_bytes=200_000),
)


def _mistake(c: BufferCase, tile: int) -> str:
    """The sizing mistakes that give exactly `tile`, in words ("" if none does)."""
    def aligned(per: int, step: int = c.step) -> int:
        return c.ub // per // step * step

    said = [words for size, words in (
        (aligned(c.per_elem(1)), "the tile for ONE buffer per queue (double buffering needs two of each)"),
        (aligned(c.per_elem(BUFFER_NUM, outputs=0)), "a tile with no room for the output queue's buffers"),
        (aligned(c.per_elem(BUFFER_NUM + 1)), "the tile for three buffers per queue"),
        (c.ub // c.per_elem(), "the right count, not rounded down to whole 32-byte blocks"),
        (aligned(c.per_elem(), BLOCK // max(c.in_bytes, c.out_bytes)) if c.in_bytes != c.out_bytes else -1,
         "a tile aligned to 32 bytes of the wider dtype: the narrower dtype's buffer must be whole blocks too")) if
        size == tile]
    return f" (that is {' or '.join(said)})" if said else ""


def _judge(largest_tile, case: Case) -> str | None:
    c: BufferCase = case.data
    got = attempt(largest_tile, c.ub, c.in_bytes, c.out_bytes, inputs=c.inputs, outputs=c.outputs)
    if is_stub(got):
        raise NotAnswered
    if isinstance(got, bool) or not isinstance(got, (int, np.integer)):
        raise AnswerRaised(f"largest_tile must return an int (elements), got {type(got).__name__}")
    tile = int(got)
    want = max_tile_elems(c.ub, BUFFER_NUM, in_bytes=c.in_bytes, out_bytes=c.out_bytes, inputs=c.inputs,
                          outputs=c.outputs, align=BLOCK)
    if tile == want:
        return None
    if tile <= 0:
        return f"a tile must hold at least one block; got {tile}"
    need = c.per_elem() * tile
    recipe = (f"{BUFFER_NUM} buffers x ({c.inputs} x {c.in_bytes} B in + {c.outputs} x {c.out_bytes} B out) x "
              f"{tile:,} = {need:,} B")
    if need > c.ub:
        return f"your tile of {tile:,} elements does not fit: {recipe} > UB {c.ub:,} B{_mistake(c, tile)}"
    if tile % c.step:
        return (f"your tile of {tile:,} elements fits ({recipe}), but a buffer of {tile:,} x "
                f"{min(c.in_bytes, c.out_bytes)} B is not a whole number of {BLOCK}-byte blocks{_mistake(c, tile)}")
    return (f"your tile of {tile:,} elements fits ({recipe} <= {c.ub:,} B), but so does {tile + c.step:,} (one more "
            f"{BLOCK}-byte block){_mistake(c, tile)}")


def check(largest_tile) -> Verdict:
    """Grade `largest_tile(ub_bytes, in_bytes, out_bytes, inputs=1, outputs=1)` on the hidden device cases."""
    return grade(EXERCISE, largest_tile, CASES, _judge, task=TASK,
                 checked=f"Each case: your tile against double_buffer.max_tile_elems with BUFFER_NUM = {BUFFER_NUM} "
                         f"and {BLOCK}-byte blocks: it fits the UB, is block-aligned, and one more block would not "
                         "fit.")
