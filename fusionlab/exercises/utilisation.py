"""Exercise: the seed's evaluation model on one chip of an Atlas preset (notebook 18).

The learner writes ``utilisation(flops, nbytes, seconds, device) -> (compute, bandwidth)``: the compute and the
bandwidth utilisation, as fractions, of a run that did `flops` FLOPs and moved `nbytes` bytes in `seconds`, on one
chip of `device`, a preset as `fusionlab.cost.devices.load_devices()` gives it (the Atlas 300I Duo is the whole
card of two chips), at the precision the preset runs a float model in (fp16). `check(utilisation)` grades it on
hidden runs against `fusionlab.cost.metrics.utilisation` on ``device.one_chip()``, the figures §4's table prints,
and names the likely mistake: the whole card's peak, the fp32 peak, GiB/s for GB/s, TFLOP/s read as 1e9, percent
for fractions, or the two figures swapped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cost import devices, metrics
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, first_difference, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "expected"]

EXERCISE = "utilisation of one chip"
TASK = "utilisation(flops, nbytes, seconds, device)"
RTOL = 1e-6


@dataclass(frozen=True)
class RunCase:
    """One run: its work (cost model FLOPs and bytes), its time in seconds, and the preset it ran on."""

    flops: float
    nbytes: float
    seconds: float
    device: str

    def preset(self) -> devices.Device:
        return devices.load_devices()[self.device]


def expected(c: RunCase) -> tuple[float, float]:
    """fusionlab.cost.metrics' figures for the run on one chip of the preset."""
    u = metrics.utilisation(c.seconds, {"run": (c.flops, c.nbytes)}, c.preset().one_chip())
    return u.compute_util, u.bandwidth_util


CASES = (
    Case("a small detector's run, like §4's, on an Atlas 300I Pro: 0.285 GFLOP and 12.4 MB in 0.773 ms",
         RunCase(2.85e8, 1.24e7, 7.73e-4, "Atlas 300I Pro")),
    Case("the same run on the Atlas 300I Duo, whose preset is the whole card of two chips",
         RunCase(2.85e8, 1.24e7, 7.73e-4, "Atlas 300I Duo")),
    Case("an Atlas 800I A2, a preset that also lists an fp32 peak: the model runs in fp16",
         RunCase(2.85e8, 1.24e7, 7.26e-4, "Atlas 800I A2 (Ascend 910B)")),
    Case("a memory-bound run near the seed's 80% bandwidth line on an Atlas 800T: 0.9 GB in 1 ms",
         RunCase(2.0e9, 9.0e8, 1.0e-3, "Atlas 800T (Ascend 910)")),
    Case("a compute-bound MatMul on the Atlas 300I Duo: 49 GFLOP in 1 ms",
         RunCase(4.9e10, 5.0e7, 1.0e-3, "Atlas 300I Duo")),
)


def _mistakes(c: RunCase) -> list[tuple[tuple[float, float], str]]:
    card, chip = c.preset(), c.preset().one_chip()
    flop_s, byte_s = c.flops / c.seconds, c.nbytes / c.seconds
    right = (flop_s / chip.peak_flops("float16"), byte_s / chip.bandwidth)
    return [
        ((flop_s / card.peak_flops("float16"), byte_s / card.bandwidth),
         f"the whole card's peak and bandwidth: one model instance runs on one of its {card.chips} chips "
         f"(Device.one_chip(), §4)"),
        ((flop_s / chip.peak_flops("float32"), right[1]),
         "the fp32 peak: the Atlas presets run a float model in fp16 (device.peak_flops('float16'))"),
        ((right[0], byte_s / (chip.mem_bandwidth_gbs * 2**30)), "GiB/s: mem_bandwidth_gbs is in GB/s, 1e9 bytes"),
        ((right[0] * 1e3, right[1]), "TFLOP/s taken as 1e9 FLOP/s: a TFLOP is 1e12"),
        ((right[0] * 100, right[1] * 100), "percent: return fractions (0.65, not 65)"),
        ((right[1], right[0]), "the two figures swapped: return (compute, bandwidth)"),
    ]


def _close(got, want) -> bool:
    return first_difference(np.asarray(got, np.float64), np.asarray(want, np.float64), RTOL, 0.0) is None


def _judge(utilisation, case: Case) -> str | None:
    c: RunCase = case.data
    got = attempt(utilisation, c.flops, c.nbytes, c.seconds, c.preset())
    if is_stub(got):
        raise NotAnswered
    try:
        pair = tuple(float(v) for v in got)
    except (TypeError, ValueError):
        pair = ()
    if len(pair) != 2:
        raise AnswerRaised(f"utilisation must return (compute, bandwidth), got {type(got).__name__}")
    want = expected(c)
    if _close(pair, want):
        return None
    said = [words for value, words in _mistakes(c) if not _close(value, want) and _close(pair, value)]
    wrong = "compute" if not _close(pair[0], want[0]) else "bandwidth"
    return (f"you say compute {pair[0]:.4g}, bandwidth {pair[1]:.4g}; one chip of this preset gives "
            f"{want[0]:.4g} and {want[1]:.4g}" + (f": that is {said[0]}" if said else f" (your {wrong} is off)"))


def check(utilisation) -> Verdict:
    """Grade `utilisation(flops, nbytes, seconds, device)` on the hidden runs."""
    return grade(EXERCISE, utilisation, CASES, _judge, task=TASK,
                 checked="Each run: your two fractions against fusionlab.cost.metrics.utilisation on "
                         "device.one_chip() (fp16 peak, bandwidth in GB/s).")
