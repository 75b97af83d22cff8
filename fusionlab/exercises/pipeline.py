"""Exercise: the time of a tiled pipeline with one and with two buffers (notebook 19).

The learner writes ``pipeline_time(n_tiles, t_in, t_compute, t_out, buffers) -> float``: how long `n_tiles`
tiles take through CopyIn -> Compute -> CopyOut on one AI Core with ``BUFFER_NUM`` = `buffers` (1 or 2),
copy-in and copy-out sharing the core's one memory path (notebook 19 §1-§2). `check(pipeline_time)` grades it on
hidden stage times against the notebook's simulator, `lessons.double_buffer.simulate` (the same dependencies, the
shared path), within a relative 1e-6. With two buffers no closed form gives that time when the copies set the
pace (the two copies at half speed and the last tile leave the path idle now and then): the answer is an event
simulation of the three queues as §1 describes them, which is exact. The cases include one tile, §1's equal
stages, a compute-bound kernel with few tiles (fill and drain matter), copy-bound kernels where the bounds of §1
fall short, and stage times modelled from the device presets as §4 models them; the hint names n x the slowest
stage, the serial sum for two buffers, no fill and drain, the larger of §1's two bounds, and a memory path per
copy queue.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cost.devices import get as get_device
from ..lessons.double_buffer import core_from_device, max_tile_elems, simulate, stage_times
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "RTOL", "CASES", "check", "expected"]

EXERCISE = "pipeline time with one and two buffers"
TASK = "pipeline_time(n_tiles, t_in, t_compute, t_out, buffers)"
RTOL = 1e-6  # an event simulation of the three queues is exact; the tolerance is for float rounding
ELEMS = 4 * 2**20  # elements per core, as notebook 19 §4 models a kernel


@dataclass(frozen=True)
class PipeCase:
    n_tiles: int
    t_in: float
    t_compute: float
    t_out: float
    buffers: int

    @property
    def times(self) -> tuple[float, float, float]:
        return (self.t_in, self.t_compute, self.t_out)


def _modelled(device: str, buffers: int, ops_per_elem: float, in_bytes: int = 2, out_bytes: int = 2) -> PipeCase:
    """A kernel of ELEMS elements on one core of `device`, tiled as large as the UB allows (notebook 19 §4)."""
    core = core_from_device(get_device(device))
    tile = max_tile_elems(core.ub_bytes, buffers, in_bytes=in_bytes, out_bytes=out_bytes)
    t = stage_times(core, tile, in_bytes=in_bytes, out_bytes=out_bytes, ops_per_elem=ops_per_elem)
    return PipeCase(-(-ELEMS // tile), *t.as_tuple(), buffers)


CASES = (
    Case("one tile: nothing to overlap (1, 2 and 0.5 us), BUFFER_NUM = 2", PipeCase(1, 1.0, 2.0, 0.5, 2)),
    Case("three equal stages of 1 us, 8 tiles, BUFFER_NUM = 1 (section 1)", PipeCase(8, 1.0, 1.0, 1.0, 1)),
    Case("three equal stages of 1 us, 8 tiles, BUFFER_NUM = 2 (section 1)", PipeCase(8, 1.0, 1.0, 1.0, 2)),
    Case("compute dominates: 4 us against copies of 1 us, 8 tiles, BUFFER_NUM = 2", PipeCase(8, 1.0, 4.0, 1.0, 2)),
    Case("copies set the pace: 2 / 1 / 0.5 us, 8 tiles, BUFFER_NUM = 2", PipeCase(8, 2.0, 1.0, 0.5, 2)),
    Case("compute between one copy and both: 1 / 1.5 / 1 us, 3 tiles, BUFFER_NUM = 2", PipeCase(3, 1.0, 1.5, 1.0, 2)),
    Case("the Sinh-like kernel on an Atlas 300I Pro core (section 4), BUFFER_NUM = 2",
         _modelled("Atlas 300I Pro", 2, 20)),
    Case("the same kernel with BUFFER_NUM = 1 (tiles twice as large, half as many)",
         _modelled("Atlas 300I Pro", 1, 20)),
    Case("a Cast from fp16 to fp32 on an Atlas 800I A2 vector core: copy-out twice copy-in, BUFFER_NUM = 2",
         _modelled("Atlas 800I A2", 2, 1, in_bytes=2, out_bytes=4)),
)


def expected(c: PipeCase) -> float:
    """The simulator's makespan for the case (us)."""
    return simulate(c.n_tiles, c.times, c.buffers).total


def _mistake(c: PipeCase, got: float) -> str:
    n, (a, b, o) = c.n_tiles, c.times
    said = [words for value, words in (
        (n * max(a, b, o), "n x the slowest stage: copy-in and copy-out share one memory path, and the first tile's "
                           "copy-in and the last one's copy-out overlap nothing"),
        (n * (a + b + o) if c.buffers == 2 else -1, "the serial time: with two buffers, copying overlaps computing"),
        (n * max(a + o, b) if c.buffers == 2 else -1, "n periods with no fill and drain: the first copy-in and the "
                                                       "last copy-out overlap no compute"),
        ((a + b + o) + (n - 1) * max(a + o, b) if c.buffers == 2 else -1,
         "one tile's latency + (n - 1) periods: the second tile's copy-in starts during the first tile's compute, "
         "not after its copy-out"),
        (max(n * (a + o), a + n * b + o) if c.buffers == 2 else -1,
         "the larger of the path's n x (in + out) and fill + n x compute + drain: both are bounds, not the time; "
         "where the copies set the pace the path still idles, e.g. while the last tile computes"),
        (simulate(n, c.times, c.buffers, shared_bandwidth=False).total, "a memory path per copy queue: on one core "
                                                                         "copy-in and copy-out share one")) if
        value >= 0 and np.isclose(got, value, rtol=RTOL / 10, atol=0)]
    return f" (that is {' or '.join(said)})" if said else ""


def _judge(pipeline_time, case: Case) -> str | None:
    c: PipeCase = case.data
    got = attempt(pipeline_time, c.n_tiles, c.t_in, c.t_compute, c.t_out, c.buffers)
    if is_stub(got):
        raise NotAnswered
    if isinstance(got, bool) or not isinstance(got, (int, float, np.integer, np.floating)):
        raise AnswerRaised(f"pipeline_time must return a number of us, got {type(got).__name__}")
    want = expected(c)
    if np.isclose(float(got), want, rtol=RTOL, atol=0):
        return None
    stages = (f"{c.n_tiles} tile{'s' if c.n_tiles != 1 else ''} of {c.t_in:.4g} / {c.t_compute:.4g} / "
              f"{c.t_out:.4g} us, BUFFER_NUM = {c.buffers}")
    return (f"{stages}: you say {float(got):.10g} us, double_buffer.simulate gives {want:.10g} us"
            f"{_mistake(c, float(got))}")


def check(pipeline_time) -> Verdict:
    """Grade `pipeline_time(n_tiles, t_in, t_compute, t_out, buffers)` on the hidden stage times."""
    return grade(EXERCISE, pipeline_time, CASES, _judge, task=TASK,
                 checked=f"Each case: your time against double_buffer.simulate (one memory path shared by copy-in "
                         f"and copy-out) within a relative {RTOL:g}.")
