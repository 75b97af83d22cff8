"""Exercise: the launch cost at which the cost model predicts a measured speedup (notebook 08).

Notebook 08 §2 predicts, for each fusion kind, the speedup of what onnxruntime runs (`cost.as_launched`) on this
CPU, calibrated (`devices.this_machine()`), and sets it beside the measured one. The model prices every launch at
one calibrated figure; which one would make it predict the measurement? The learner writes
``launch_us(model, plan, device, measured)``: the launch overhead in µs at which
`cost.predicted_speedup(model, cost.as_launched(plan), device)` equals `measured`, every other figure of the device
kept, or None when no launch cost >= 0 gives it. The predicted latency is linear in the launch cost (each kernel is
max(compute, memory) + its launches x the overhead), so one launch cost fits, or none. `check` takes the truth from
`cost.plan_cost` at launch 0 and the launch counts, and the hint reprices the learner's answer with
`cost.predicted_speedup` and names the likely mistake (a mixed group costed as one kernel, seconds, the speedup
inverted, the launch cost solved on top of the device's own). The hidden cases are fixed CPU-like devices (so
verdicts do not vary with this machine's calibration), fixed "measured" speedups, and plans `fuse` makes: vertical
ones, a horizontal one, a mixed one (onnxruntime inlines its functions: the same kernels as the original, 1.00x at
any launch cost) and a measurement below what the model predicts with free launches.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from .. import zoo
from ..cost import model as cost
from ..cost.devices import Device
from ..graph import load
from ..passes import fuse, options_for
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "DEVICES", "Fit", "inputs", "truth", "check"]

EXERCISE = "the launch cost a measurement implies"
TASK = "launch_us(model, plan, device, measured) returning µs or None"
RTOL = 1e-4


def _cpu(name: str, gflops: float, gbs: float, launch_us: float) -> Device:
    """A calibrated CPU core as `devices.this_machine()` builds one, with fixed figures."""
    return Device(name=name, chip="cpu", peak_fp16_tflops=gflops / 1e3, peak_int8_tops=None,
                  peak_fp32_tflops=gflops / 1e3, mem_bandwidth_gbs=gbs, ub_kb=1024, l1_kb=48, ai_cores=1,
                  power_w=None, launch_overhead_us=launch_us, source="a fixed calibration for the exercise",
                  precision="fp32", efficient_transfer_kb=None)


#: two calibrations like this_machine()'s: a laptop core and a server core with slower memory
DEVICES = {"laptop": _cpu("a laptop core", 60.0, 20.0, 1.5), "server": _cpu("a server core", 35.0, 9.0, 0.8)}

#: (zoo model, its zoo arguments)
_MODELS = {"resnet_small": ("resnet_small", ()),
           "yolov5n-size/320": ("yolov5s", (("image_size", 320), ("width_mult", 0.25), ("depth_mult", 0.33)))}


@dataclass(frozen=True)
class Fit:
    """A hidden case: a zoo model fused with one pass (max_group_ops=5), a device, a measured speedup."""

    model: str
    kind: str
    device: str
    measured: float


CASES = (
    Case("resnet_small, vertical, on the laptop core, measured 1.30x", Fit("resnet_small", "vertical", "laptop", 1.30)),
    Case("resnet_small, vertical, on the server core, measured 1.60x", Fit("resnet_small", "vertical", "server", 1.60)),
    Case("resnet_small, vertical, on the server core, measured 1.05x (less than free launches predict)",
         Fit("resnet_small", "vertical", "server", 1.05)),
    Case("resnet_small, mixed, on the laptop core, measured 1.15x (onnxruntime inlines the mixed groups)",
         Fit("resnet_small", "mixed", "laptop", 1.15)),
    Case("yolov5n-size/320, vertical (Conv + QuickGelu: two kernels a group), on the server core, measured 1.35x",
         Fit("yolov5n-size/320", "vertical", "server", 1.35)),
    Case("yolov5n-size/320, horizontal, on the laptop core, measured 1.02x",
         Fit("yolov5n-size/320", "horizontal", "laptop", 1.02)),
)


@lru_cache(maxsize=None)
def _model(name: str):
    zoo_name, kw = _MODELS[name]
    return load(zoo.get(zoo_name, **dict(kw)))


@lru_cache(maxsize=None)
def _plan(name: str, kind: str):
    return fuse(_model(name), passes=[kind], **options_for([kind], max_group_ops=5)).plan


def inputs(f: Fit):
    """What the learner's function is given: (model, plan, device, measured)."""
    return _model(f.model), _plan(f.model, f.kind), DEVICES[f.device], f.measured


def _solve(model, plan, device: Device, measured: float) -> float | None:
    """The launch cost (µs) at which the plan, costed as given, is predicted `measured`x; None if none >= 0 does."""
    free = replace(device, launch_overhead_us=0.0)
    a = cost.Analysis(model, None, device.precision)
    base, fused = (cost.plan_cost(model, p, free, analysis=a) for p in (None, plan))
    # measured = (T0 + k0 L) / (T1 + k1 L)  =>  L = (T0 - measured T1) / (measured k1 - k0)
    denominator = measured * fused.kernels - base.kernels
    if denominator == 0:
        return None
    seconds = (base.latency_s - measured * fused.latency_s) / denominator
    return seconds * 1e6 if seconds >= 0 else None


@lru_cache(maxsize=None)
def truth(f: Fit) -> float | None:
    """The launch cost in µs the case implies, for what onnxruntime runs (`cost.as_launched`); None if none."""
    model, plan, device, measured = inputs(f)
    return _solve(model, cost.as_launched(plan), device, measured)


def _speedup(f: Fit, launch_us: float) -> float:
    model, plan, device, _ = inputs(f)
    return cost.predicted_speedup(model, cost.as_launched(plan), replace(device, launch_overhead_us=launch_us))


def _range(f: Fit) -> str:
    model, plan, device, _ = inputs(f)
    free = replace(device, launch_overhead_us=0.0)
    launched = cost.as_launched(plan)
    base, fused = cost.plan_cost(model, None, free), cost.plan_cost(model, launched, free)
    return (f"from {base.latency_s / fused.latency_s:.3f}x with free launches to {base.kernels / fused.kernels:.3f}x "
            f"({base.kernels} -> {fused.kernels} kernels) when launches are all that counts")


def _mistake(f: Fit, got: float) -> str:
    model, plan, device, measured = inputs(f)
    want = truth(f)
    said = []
    as_made = _solve(model, plan, device, measured)
    if as_made is not None and np.isclose(got, as_made, rtol=RTOL):
        said.append("the plan costed as fuse made it, a mixed group one kernel: onnxruntime inlines it "
                    "(cost.as_launched)")
    if want is not None and np.isclose(got, want * 1e-6, rtol=RTOL):
        said.append("seconds, not µs")
    if want is not None and np.isclose(got + device.launch_overhead_us, want, rtol=RTOL):
        said.append(f"the launch cost added on top of the device's own {device.launch_overhead_us:g} µs: price the "
                    f"rest with dataclasses.replace(device, launch_overhead_us=0.0), not with device")
    inverted = _solve(model, cost.as_launched(plan), device, 1 / measured)
    if inverted is not None and np.isclose(got, inverted, rtol=RTOL):
        said.append("the speedup inverted: fused over unfused")
    return f" (that looks like {' or '.join(said)})" if said else ""


def _judge(launch_us, case: Case) -> str | None:
    f = case.data
    got = attempt(launch_us, *inputs(f))
    if got is Ellipsis:
        raise NotAnswered
    want = truth(f)
    if got is None:
        if want is None:
            return None
        return (f"you say no launch cost fits; at {want:.3f} µs the model predicts {f.measured:.2f}x "
                f"(it predicts {_range(f)})")
    if isinstance(got, bool) or not isinstance(got, (int, float, np.integer, np.floating)) or not np.isfinite(got):
        raise AnswerRaised(f"launch_us must return a number of µs or None, got {got!r}")
    got = float(got)
    if want is not None and abs(got - want) <= RTOL * want:
        return None
    at = f"at {got:.4g} µs the model predicts {_speedup(f, max(got, 0.0)):.3f}x" if got >= 0 else \
        "a launch cost below zero is no launch cost"
    if want is None:
        return (f"you say {got:.4g} µs, but no launch cost >= 0 gives {f.measured:.2f}x: {at}, and the model "
                f"predicts {_range(f)}{_mistake(f, got)}")
    return f"you say {got:.4g} µs: {at}; {want:.4g} µs gives the measured {f.measured:.2f}x{_mistake(f, got)}"


def check(launch_us) -> Verdict:
    """Grade `launch_us(model, plan, device, measured)` against the launch cost the cost model needs."""
    return grade(EXERCISE, launch_us, CASES, _judge, task=TASK,
                 checked=f"Each case: your µs against the launch cost at which cost.predicted_speedup of "
                         f"cost.as_launched(plan) equals the measured speedup (within {RTOL:g} relative), or None "
                         f"where no launch cost >= 0 does.")
