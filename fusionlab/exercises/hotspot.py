"""Exercise: the op type a profiled run spends most of its kernel time in, and its share (notebook 17).

The learner writes ``top_op_type(ops) -> (op_type, share)``: given one run's kernels as `fusionlab.profile.OpEvent`s
(what ``Profile.ops()`` returns), the op type whose kernels take the most time in all, and that time as a fraction
of the time in kernels (the sum of every kernel's duration: the op table's Share column of §2, summed per type).
`check(top_op_type)` builds each hidden run as an onnxruntime Chrome trace (`idle.profile_of`), parses it with
`fusionlab.profile.parse_events`, hands the learner the parsed ops, and grades the answer against that profile's
``by_op_type()``, the figures of §5's "time per op type". The hint names the likely mistake: the type of the single
longest kernel (the top row of the op table sorted by duration), the type with the longest kernels on average, the
most frequent type, the share of the span from the first kernel to the last or of the time some kernel ran instead
of the time in kernels, the share of the kernels' count, or percent. Several mistakes can give the same value on
one run, so a mistake is named only if the answer also agrees with it on `PROBE`, a run where each gives its own.
"""

from __future__ import annotations

import numpy as np

from ..profile import OpEvent, _union_length
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, first_difference, grade, is_stub
from .idle import IdleCase, profile_of

__all__ = ["EXERCISE", "TASK", "CASES", "check", "expected"]

EXERCISE = "the op type where the time goes"
TASK = "top_op_type(ops)"


def expected(c: IdleCase) -> tuple[str, float]:
    """fusionlab.profile's figures: the first row of `by_op_type()` (most time first) and its share."""
    op_type, row = next(iter(profile_of(c).by_op_type().items()))
    return op_type, row["share"]


def _serial(rng, n: int, types: tuple[str, ...], scale: dict[str, float]) -> tuple[float, tuple]:
    """A run of `n` kernels on one lane cycling through `types`, durations scaled per type (seeded)."""
    t, out = float(rng.uniform(5, 15)), []
    for i in range(n):
        op = types[i % len(types)]
        dur = float(np.round(rng.lognormal(np.log(scale[op]), 0.6), 1))
        out.append((round(t, 1), dur, 0, op))
        t += dur + float(np.round(rng.uniform(1.5, 6.0), 1))
    return round(t + 20.0, 1), tuple(out)


_YOLO = _serial(np.random.default_rng(17), 256, ("Conv", "BatchNormalization", "Sigmoid", "Mul"),
                {"Conv": 30.0, "BatchNormalization": 9.0, "Sigmoid": 8.0, "Mul": 7.0})
_FUSED = _serial(np.random.default_rng(18), 142, ("Conv", "QuickGelu"), {"Conv": 24.0, "QuickGelu": 10.0})
_MANY_MUL = tuple((130.0 + 10.0 * i, 6.0, 0, "Mul") for i in range(24))

CASES = (
    Case("a serial run: Conv, BatchNormalization, Sigmoid, then a second Conv and a Mul",
         IdleCase(420.0, ((6.0, 120.0, 0, "Conv"), (131.0, 40.0, 0, "BatchNormalization"), (176.0, 35.0, 0, "Sigmoid"),
                          (215.0, 110.0, 0, "Conv"), (330.0, 30.0, 0, "Mul")))),
    Case("many short kernels outweigh one long one: 24 Mul of 6 us against a MatMul of 120 us",
         IdleCase(400.0, ((4.0, 120.0, 0, "MatMul"),) + _MANY_MUL)),
    Case("the most frequent type is not the slowest: ten Relu of 2 us, two Conv of 40 us",
         IdleCase(200.0, tuple((5.0 + 9.0 * i, 2.0, 0, "Relu") for i in range(10))
                  + ((100.0, 40.0, 0, "Conv"), (145.0, 40.0, 0, "Conv")))),
    Case("long gaps between kernels: 90 us in kernels over a span of 365 us",
         IdleCase(600.0, ((50.0, 50.0, 0, "Conv"), (200.0, 25.0, 0, "Add"), (400.0, 15.0, 0, "Add")))),
    Case("two lanes, kernels overlapping: the time in kernels counts each kernel's full duration",
         IdleCase(300.0, ((5.0, 100.0, 0, "Conv"), (20.0, 90.0, 1, "Conv"), (115.0, 70.0, 1, "MaxPool"),
                          (190.0, 50.0, 0, "Concat"), (245.0, 40.0, 0, "MaxPool")))),
    Case("a fused run like §1's twin: Conv and QuickGelu kernels, 142 of them", IdleCase(*_FUSED)),
    Case("a YOLOv5-sized run: 256 kernels of four types", IdleCase(*_YOLO)),
)

#: Not graded: a run on which every mistake of `_mistakes` gives its own answer (the longest kernel is a Conv, the
#: longest on average a MatMul, the most frequent type Relu, the most time Add; gaps, and an overlap on two lanes).
PROBE = IdleCase(700.0, ((10.0, 50.0, 0, "Conv"), (65.0, 1.0, 0, "Conv"), (70.0, 45.0, 0, "MatMul"),
                         (120.0, 45.0, 0, "MatMul"))
                 + tuple((170.0 + 5.0 * i, 3.0, 0, "Relu") for i in range(10))
                 + tuple((230.0 + 40.0 * i, 30.0, 0, "Add") for i in range(4)) + ((240.0, 20.0, 1, "Add"),))


def _mistakes(ops: list[OpEvent], want: tuple[str, float]) -> list[tuple[tuple[str, float], str]]:
    time: dict[str, float] = {}
    count: dict[str, int] = {}
    for e in ops:
        time[e.op_type] = time.get(e.op_type, 0.0) + e.dur_us
        count[e.op_type] = count.get(e.op_type, 0) + 1
    total = sum(time.values())
    longest = max(ops, key=lambda e: e.dur_us).op_type
    mean = max(time, key=lambda t: (time[t] / count[t], t))
    frequent = max(count, key=lambda t: (count[t], t))
    top = want[0]
    span = max(e.end_us for e in ops) - min(e.start_us for e in ops)
    busy = _union_length((e.start_us, e.end_us) for e in ops)
    by_kernel = "the type of the single longest kernel: add up each type's kernels before you compare"
    return [
        ((longest, max(e.dur_us for e in ops) / total), by_kernel),
        ((longest, time[longest] / total), by_kernel),
        ((mean, time[mean] / total), "the type with the longest kernels on average: add up each type's kernels, "
                                     "do not average them"),
        ((mean, time[mean] / count[mean] / total), "the type with the longest kernels on average: add up each "
                                                   "type's kernels, do not average them"),
        ((frequent, time[frequent] / total), "the most frequent type: weigh each type by its time, not its count"),
        ((top, time[top] / span),
         "the share of the span from the first start to the last end: the gaps are not time in kernels"),
        ((top, time[top] / busy),
         "the share of the time some kernel ran: divide by the sum of all durations, overlaps counted"),
        ((top, count[top] / len(ops)), "the share of the kernels' count, not of their time"),
        ((top, 100.0 * want[1]), "percent: return a fraction (0.5, not 50)"),
    ]


def _same(got: tuple[str, float], want: tuple[str, float]) -> bool:
    return got[0] == want[0] and first_difference(np.float64(got[1]), np.float64(want[1]), 1e-9, 1e-12) is None


def _judge(top_op_type, case: Case) -> str | None:
    c: IdleCase = case.data
    ops = profile_of(c).ops()
    got = attempt(top_op_type, list(ops))
    if is_stub(got):
        raise NotAnswered
    try:
        op_type, share = got
        pair = (op_type, float(share))
    except (TypeError, ValueError):
        pair = None
    if pair is None or not isinstance(pair[0], str) or isinstance(got[1], bool):
        raise AnswerRaised(f"top_op_type must return (op type, share), got {type(got).__name__}")
    want = expected(c)
    if _same(pair, want):
        return None
    said = [i for i, (value, _) in enumerate(_mistakes(ops, want)) if not _same(value, want) and _same(pair, value)]
    if said:  # the same value as a mistake here: name it only if the answer follows that mistake on the probe too
        probe_ops = profile_of(PROBE).ops()
        probe = _mistakes(probe_ops, expected(PROBE))
        try:
            on_probe = attempt(top_op_type, list(probe_ops))
            on_probe = (on_probe[0], float(on_probe[1]))
        except Exception:  # noqa: BLE001 - whatever the answer does on the probe, it only decides the wording
            on_probe = None
        said = [probe[i][1] for i in said
                if on_probe is not None and isinstance(on_probe[0], str) and _same(on_probe, probe[i][0])]
    return (f"you say {pair[0]} with {pair[1]:.4g}; this run spends most kernel time in {want[0]}, "
            f"{want[1]:.4g} of it" + (f": that is {said[0]}" if said else ""))


def check(top_op_type) -> Verdict:
    """Grade `top_op_type(ops)` on the hidden runs."""
    return grade(EXERCISE, top_op_type, CASES, _judge, task=TASK,
                 checked="Each run: your type and share against fusionlab.profile's by_op_type() for the same trace "
                         "(time per type over the sum of all kernel durations).")
