"""Exercise: how many compilations a bounded cache of compiled shapes does (notebook 21).

The learner writes ``compilations(shapes, capacity) -> int``: a stream of input shapes goes through a cache of
compiled models that holds at most `capacity` of them (None: unbounded, the seed's cache) and, when full, evicts the
least recently used one; every miss is a compilation. Shapes arrive spelled as tuples, lists or with NumPy ints, and
equal shapes are one entry (notebook 20 §2's flaw 2: key by `dynamic_shapes.shape_key`). `check(compilations)`
grades it on hidden streams against the lesson's own cache, `fusionlab.lessons.dynamic_shapes.ShapeCache` (its
`misses`), and names the likely mistake: first-in-first-out eviction (a hit that does not refresh recency), the most
recent entry evicted, the capacity ignored, shapes keyed by their spelling, or evictions counted instead of compilations.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..lessons.dynamic_shapes import ShapeCache, gear_for, gears, shape_key
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "expected"]

EXERCISE = "compilations of a bounded cache"
TASK = "compilations(shapes, capacity)"


@dataclass(frozen=True)
class CacheCase:
    shapes: tuple[Any, ...]
    capacity: int | None


def expected(c: CacheCase) -> int:
    """The lesson's ShapeCache run over the stream: its misses are the compilations."""
    cache = ShapeCache(lambda key: key, c.capacity)
    for s in c.shapes:
        cache.get(s)
    return cache.misses


def _gear_stream(n: int, seed: int) -> tuple[tuple[int, int], ...]:
    """`n` requests like notebook 20's stream, each as the (batch, gear) shape it is padded to (pow2 gears of 512)."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(np.log(96), 0.8, n)), 8, 512).astype(int)
    return tuple((1, gear_for(int(n), gears(512, 4))) for n in lengths)


A, B, C, D = (1, 64), (1, 128), (1, 256), (1, 512)
CASES = (
    Case("gears 64/128/256/512 with room for all four", CacheCase((A, B, A, C, D, B, A, D, C, A), 4)),
    Case("one hot gear between two others, capacity 2", CacheCase((A, B, A, C, A, B, A, C, A, B), 2)),
    Case("capacity None: the seed's unbounded cache", CacheCase((A, B, C, D, A, B, C, D, (1, 100)), None)),
    Case("capacity 1: every change of shape recompiles", CacheCase((A, A, B, B, A, C, C, A), 1)),
    Case("shapes spelled as tuples, lists and with NumPy ints: equal shapes are one entry",
         CacheCase(((1, 128), [1, 128], (1, np.int64(128)), [np.int64(1), 64], (1, 64), (1, 128)), 2)),
    Case("three gears cycling through room for two: LRU evicts the one needed next",
         CacheCase((A, B, C) * 4, 2)),
    Case("2000 requests like notebook 20's stream padded to pow2 gears, LRU 2", CacheCase(_gear_stream(2000, 5), 2)),
)


def _simulate(shapes, capacity, *, key=shape_key, refresh=True, evict_newest=False) -> tuple[int, int]:
    """(misses, evictions) of a cache that differs from the lesson's in one way (the mistakes named below)."""
    entries: OrderedDict = OrderedDict()
    misses = evictions = 0
    for s in shapes:
        k = key(s)
        if k in entries:
            if refresh:
                entries.move_to_end(k)
            continue
        misses += 1
        if capacity is not None and len(entries) >= capacity:
            entries.popitem(last=evict_newest)
            evictions += 1
        entries[k] = True
    return misses, evictions


def _mistakes(c: CacheCase) -> list[tuple[int, str]]:
    return [
        (_simulate(c.shapes, c.capacity, refresh=False)[0],
         "first in, first out: a hit must make its entry the most recently used, so it is evicted last"),
        (_simulate(c.shapes, c.capacity, evict_newest=True)[0],
         "the most recently used entry evicted: evict the least recently used"),
        (_simulate(c.shapes, None)[0], "no bound: with the cache full, a new shape evicts one"),
        (_simulate(c.shapes, c.capacity, key=str)[0],
         "shapes keyed by their spelling: equal shapes (tuple, list, NumPy ints) are one entry, key by shape_key"),
        (_simulate(c.shapes, c.capacity)[1], "evictions, not compilations: every miss compiles"),
        (len(c.shapes) - expected(c), "the hits, not the misses"),
    ]


def _judge(compilations, case: Case) -> str | None:
    c: CacheCase = case.data
    got = attempt(compilations, list(c.shapes), c.capacity)
    if is_stub(got):
        raise NotAnswered
    if isinstance(got, bool) or not isinstance(got, (int, np.integer, float)) or got != int(got):
        raise AnswerRaised(f"compilations must return a whole number, got {got!r:.40}")
    want = expected(c)
    if got == want:
        return None
    said = [words for value, words in _mistakes(c) if value != want and value == got]
    word = "too many" if got > want else "too few"
    cache = "an unbounded cache" if c.capacity is None else f"an LRU cache of capacity {c.capacity}"
    return (f"you say {int(got)} compilations, {word}; {cache} compiles {want} times "
            f"over these {len(c.shapes)} shapes" + (f": that is {said[0]}" if said else ""))


def check(compilations) -> Verdict:
    """Grade `compilations(shapes, capacity)` on the hidden streams."""
    return grade(EXERCISE, compilations, CASES, _judge, task=TASK,
                 checked="Each stream: your count against the misses of dynamic_shapes.ShapeCache(build, capacity) "
                         "over the same shapes.")
