"""Exercise: predict one kernel's time on a device preset with the roofline (notebook 07).

The learner writes ``kernel_time(flops, nbytes, device) -> seconds``: the time the cost model predicts for one
node run as its own kernel, from its FLOPs, the bytes it moves and a `Device` preset (`fusionlab.cost.devices`):
max(FLOPs / peak, bytes / bandwidth) + the launch overhead, at the fp16 peak the presets run float models at.
`check(kernel_time)` builds each hidden node as a one-node ONNX model, takes its FLOPs and bytes from
`cost.node_costs` and the truth from `cost.plan_cost` (the kernel's `time_s`), on nodes that are memory-bound,
compute-bound, at the ridge and launch-bound, on four presets. The hint names the likely mistake: compute and
memory time added instead of the larger taken, the launch forgotten, the fp32 peak (`Device.peak_flops()`'s
default) where the preset runs fp16, or units (TFLOP/s, GB/s, µs) left unconverted.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from onnx import helper

from ..build import make_model, value_info
from ..cost import model as cost
from ..cost.devices import Device, get as get_device
from ..graph import load
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "node", "truth"]

EXERCISE = "a kernel's time on the roofline"
TASK = "kernel_time(flops, nbytes, device) returning seconds"
RTOL = 1e-6


@dataclass(frozen=True)
class Node:
    """One node: its op, its inputs' shapes (float32, stored; the presets cost them at fp16), its output's shape,
    attributes, and the device preset it runs on."""

    op: str
    inputs: tuple[tuple[int, ...], ...]
    output: tuple[int, ...]
    device: str
    attrs: tuple[tuple[str, object], ...] = ()


CASES = (
    Case("a Relu over 2048 x 4096 values on the Atlas 300I Pro (memory-bound)",
         Node("Relu", ((2048, 4096),), (2048, 4096), "Atlas 300I Pro")),
    Case("a 2048 x 2048 x 2048 MatMul on the Atlas 300I Pro (compute-bound)",
         Node("MatMul", ((2048, 2048), (2048, 2048)), (2048, 2048), "Atlas 300I Pro")),
    Case("a 1024 x 1024 x 1024 MatMul on the Atlas 300I Pro (at the ridge: compute and memory time nearly equal)",
         Node("MatMul", ((1024, 1024), (1024, 1024)), (1024, 1024), "Atlas 300I Pro")),
    Case("an Add of two 128 x 256 tensors on the Atlas 800I A2 (launch-bound)",
         Node("Add", ((128, 256), (128, 256)), (128, 256), "Atlas 800I A2")),
    Case("a 4096 x 4096 x 4096 MatMul on the Atlas 800I A2 (compute-bound, fp16 peak)",
         Node("MatMul", ((4096, 4096), (4096, 4096)), (4096, 4096), "Atlas 800I A2")),
    Case("a Sigmoid over a 64 x 256 x 80 x 80 map on the Atlas 300I Duo (memory-bound, whole card)",
         Node("Sigmoid", ((64, 256, 80, 80),), (64, 256, 80, 80), "Atlas 300I Duo")),
    Case("a 3x3 Conv, 256 -> 256 channels, on an 8 x 256 x 40 x 40 map on the Atlas 800T (compute-bound)",
         Node("Conv", ((8, 256, 40, 40), (256, 256, 3, 3)), (8, 256, 40, 40), "Atlas 800T",
              (("pads", (1, 1, 1, 1)),))),
)


def node(c: Node):
    """The one-node model of a case (inputs x0, x1, ...; output y)."""
    names = [f"x{i}" for i in range(len(c.inputs))]
    n = helper.make_node(c.op, names, ["y"], name=c.op.lower(), **dict(c.attrs))
    return load(make_model([n], [value_info(x, np.float32, list(s)) for x, s in zip(names, c.inputs)],
                           [value_info("y", np.float32, list(c.output))], name=c.op.lower()))


@lru_cache(maxsize=None)
def truth(c: Node) -> tuple[int, int, Device, cost.KernelCost]:
    """(FLOPs, bytes, device, the cost model's kernel) of a case: what the learner is given, and the answer."""
    device = get_device(c.device)
    g = node(c)
    (nc,) = cost.node_costs(g, precision=device.precision)
    (k,) = cost.plan_cost(g, None, device).kernels_detail
    return nc.flops, nc.bytes, device, k


def _mistake(flops: int, nbytes: int, d: Device, got: float) -> str:
    launch = d.launch_overhead_us * 1e-6
    compute, memory = flops / d.peak_flops("float16"), nbytes / d.bandwidth
    said = [words for value, words in (
        (compute + memory + launch, "compute time + memory time: the roofline takes the larger of the two, "
                                    "the other overlaps it"),
        (max(compute, memory), "the launch overhead left out"),
        (max(flops / d.peak_flops(), memory) + launch,
         f"the fp32 peak, {d.peak_flops() / 1e12:g} TFLOP/s (peak_flops()'s default): the presets run a float "
         f"model at fp16, peak_flops('float16')"),
        (max(compute, memory) + d.launch_overhead_us, "the launch overhead in µs added to seconds"),
        (max(flops / d.peak_fp16_tflops, memory) + launch, "FLOPs over TFLOP/s: the peak is in 1e12 FLOP/s"),
        (max(compute, nbytes / d.mem_bandwidth_gbs) + launch, "bytes over GB/s: the bandwidth is in 1e9 B/s"))
        if np.isclose(got, value, rtol=RTOL, atol=0.0)]
    return f" (that is {' or '.join(said)})" if said else ""


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.2f} µs"


def _judge(kernel_time, case: Case) -> str | None:
    flops, nbytes, device, k = truth(case.data)
    got = attempt(kernel_time, flops, nbytes, device)
    if is_stub(got):
        raise NotAnswered
    if isinstance(got, bool) or not isinstance(got, (int, float, np.integer, np.floating)):
        raise AnswerRaised(f"kernel_time must return a number of seconds, got {type(got).__name__}")
    got = float(got)
    want = k.time_s
    if np.isfinite(got) and abs(got - want) <= RTOL * want:
        return None
    word = "too long" if got > want else "too short"
    return (f"you say {_us(got)}, {word}; the cost model predicts {_us(want)}, {k.bound}-bound "
            f"(compute {_us(k.compute_s)}, memory {_us(k.memory_s)}, launch {_us(k.launch_s)})"
            f"{_mistake(flops, nbytes, device, got)}")


def check(kernel_time) -> Verdict:
    """Grade `kernel_time(flops, nbytes, device)` against the cost model's time for each hidden node."""
    return grade(EXERCISE, kernel_time, CASES, _judge, task=TASK,
                 checked="Each node: your seconds against cost.plan_cost's kernel time (FLOPs and bytes from "
                         "cost.node_costs at the preset's fp16), within 1e-6 relative.")
