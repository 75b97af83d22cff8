"""Exercise: the time of a profiled run with no kernel running (notebook 17).

The learner writes ``idle_us(run_us, ops) -> float``: given one run's duration and its kernels as
`fusionlab.profile.OpEvent`s (what ``Profile.ops()`` returns: ``start_us`` from the start of the run, ``dur_us``,
``end_us``, ``lane``, ``wait_us``), the microseconds of the run during which no kernel ran: the last figure of
§2's op table. `check(idle_us)` builds each hidden run as an onnxruntime Chrome trace, parses it with
`fusionlab.profile.parse_events`, hands the learner the parsed ops, and grades the answer against that profile's
``gap_us``. The hint names the likely mistake: the Wait column summed (the tail after the last kernel lost),
every duration subtracted (overlapping kernels counted twice), gaps or the tail measured from the previous
(last-started) kernel rather than from the latest end, or the time before the first kernel and after the last left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..profile import OpEvent, Profile, parse_events
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, first_difference, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "profile_of", "expected"]

EXERCISE = "the time with no kernel running"
TASK = "idle_us(run_us, ops)"
_BASE_US = 1_000_000.0  # where the hidden run starts on the trace's clock (any value: starts are relative)


@dataclass(frozen=True)
class IdleCase:
    """One run: its duration and its kernels as (start from the run's start, duration, lane, op type), in µs."""

    run_us: float
    kernels: tuple[tuple[float, float, int, str], ...]


def profile_of(c: IdleCase) -> Profile:
    """The run as onnxruntime's profiler would write it, parsed by fusionlab.profile (one run, no warm-up)."""
    events = [{"cat": "Session", "name": "model_run", "ph": "X", "ts": _BASE_US, "dur": c.run_us}]
    for i, (start, dur, lane, op_type) in enumerate(c.kernels):
        events.append({"cat": "Node", "name": f"/model.{i}/{op_type}_kernel_time", "ph": "X", "ts": _BASE_US + start,
                       "dur": dur, "tid": 100 + lane, "args": {"op_name": op_type, "provider": "CPUExecutionProvider"}})
    return parse_events(events)


def expected(c: IdleCase) -> float:
    """The profile's own figure: run time minus the time at least one kernel was running."""
    return profile_of(c).gap_us


def _serial(rng, n: int, types: tuple[str, ...]) -> tuple[float, tuple]:
    """A run of `n` kernels on one lane with launch gaps of a few µs, like §2's YOLOv5 (seeded)."""
    t, out = float(rng.uniform(5, 15)), []
    for i in range(n):
        dur = float(np.round(rng.lognormal(np.log(25), 1.0), 1))
        out.append((round(t, 1), dur, 0, types[i % len(types)]))
        t += dur + float(np.round(rng.uniform(1.5, 6.0), 1))
    return round(t + 20.0, 1), tuple(out)


_YOLO = _serial(np.random.default_rng(13), 256, ("Conv", "BatchNormalization", "Sigmoid", "Mul"))

CASES = (
    Case("a serial run, one lane: five kernels, idle before the first and after the last",
         IdleCase(420.0, ((6.0, 120.0, 0, "Conv"), (131.0, 40.0, 0, "BatchNormalization"), (176.0, 35.0, 0, "Sigmoid"),
                          (215.0, 150.0, 0, "Conv"), (371.0, 30.0, 0, "Mul")))),
    Case("back-to-back kernels: no gap between some of them",
         IdleCase(200.0, ((4.0, 50.0, 0, "Conv"), (54.0, 20.0, 0, "Relu"), (74.0, 60.0, 0, "Conv"),
                          (139.0, 50.0, 0, "Relu")))),
    Case("two lanes: parallel branches on two streams, their kernels overlapping",
         IdleCase(300.0, ((5.0, 100.0, 0, "Conv"), (20.0, 60.0, 1, "Conv"), (90.0, 70.0, 1, "MaxPool"),
                          (170.0, 50.0, 0, "Concat"), (230.0, 40.0, 0, "Conv")))),
    Case("a short kernel entirely inside a long one on the other lane",
         IdleCase(260.0, ((3.0, 200.0, 0, "MatMul"), (50.0, 30.0, 1, "Add"), (208.0, 40.0, 0, "Softmax")))),
    Case("two lanes: a long kernel outlasts the one that starts last",
         IdleCase(300.0, ((5.0, 250.0, 0, "MatMul"), (20.0, 30.0, 1, "Add"), (100.0, 40.0, 1, "Relu")))),
    Case("a late first kernel: 40 us of the run before any kernel starts",
         IdleCase(180.0, ((40.0, 60.0, 0, "Conv"), (104.0, 30.0, 0, "Relu"), (137.0, 35.0, 0, "Conv")))),
    Case("a YOLOv5-sized run: 256 kernels with launch gaps of a few us", IdleCase(*_YOLO)),
)


def _mistakes(c: IdleCase, ops: list[OpEvent]) -> list[tuple[float, str]]:
    starts = sorted(ops, key=lambda e: e.start_us)
    if not starts:
        return []
    last = max(e.end_us for e in starts)
    inner = sum(e.wait_us for e in starts[1:])  # the gaps between kernels, from the latest end so far
    naive = (starts[0].start_us + sum(max(0.0, b.start_us - a.end_us) for a, b in zip(starts, starts[1:]))
             + max(0.0, c.run_us - starts[-1].end_us))
    return [
        (sum(e.wait_us for e in ops), "the Wait column summed: it leaves out the time after the last kernel ends"),
        (c.run_us - sum(e.dur_us for e in ops),
         "the run minus every duration: where kernels overlap on two lanes, the overlap is subtracted twice"),
        (naive, "gaps and the tail measured from the previous kernel's end: a kernel still running on the other "
                "lane keeps the run busy, so measure from the latest end so far"),
        (sum(e.wait_us for e in ops) + c.run_us - starts[-1].end_us,
         "the tail measured from the kernel that starts last: it is the tail after the latest end, not the last "
         "start"),
        (inner, "the gaps between kernels only: the time before the first kernel and after the last is idle too"),
        (inner + (c.run_us - last), "the time before the first kernel starts is idle too"),
        (sum(e.dur_us for e in ops), "the time in kernels, not the time with none running"),
    ]


def _judge(idle_us, case: Case) -> str | None:
    c: IdleCase = case.data
    ops = profile_of(c).ops()
    got = attempt(idle_us, c.run_us, list(ops))
    if is_stub(got):
        raise NotAnswered
    if isinstance(got, bool) or not isinstance(got, (int, float, np.integer, np.floating)):
        raise AnswerRaised(f"idle_us must return a number of microseconds, got {type(got).__name__}")
    want = expected(c)
    if first_difference(np.float64(got), np.float64(want), rtol=1e-9, atol=1e-6) is None:
        return None
    said = [words for value, words in _mistakes(c, ops)
            if first_difference(np.float64(value), np.float64(want), 1e-9, 1e-6) is not None
            and first_difference(np.float64(got), np.float64(value), 1e-9, 1e-6) is None]
    word = "too high" if got > want else "too low"
    return (f"you say {float(got):.1f} us, {word}; this run of {c.run_us:.1f} us had {want:.1f} us with no kernel "
            f"running ({want / c.run_us:.0%})" + (f": that is {said[0]}" if said else ""))


def check(idle_us) -> Verdict:
    """Grade `idle_us(run_us, ops)` on the hidden runs."""
    return grade(EXERCISE, idle_us, CASES, _judge, task=TASK,
                 checked="Each run: your figure against fusionlab.profile's gap_us for the same trace (run time "
                         "minus the union of the kernels' intervals).")
