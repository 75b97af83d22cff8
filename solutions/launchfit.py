"""The exercise of notebook 08: the launch cost at which the cost model predicts a measured speedup."""

from dataclasses import replace

from fusionlab import cost


def launch_us(model, plan, device, measured):
    """Reference: latency is linear in the launch cost L, T(L) = T(0) + kernels x L, for the unfused model and for
    what onnxruntime runs under the plan; solve (T0 + k0 L) / (T1 + k1 L) = measured for L."""
    free = replace(device, launch_overhead_us=0.0)
    base = cost.plan_cost(model, None, free)
    fused = cost.plan_cost(model, cost.as_launched(plan), free)
    denominator = measured * fused.kernels - base.kernels
    if denominator == 0:
        return None
    seconds = (base.latency_s - measured * fused.latency_s) / denominator
    return seconds * 1e6 if seconds >= 0 else None


def launch_us_as_made(model, plan, device, measured):
    """WRONG: costs the plan as fuse made it, so a mixed group counts as one kernel (onnxruntime inlines it)."""
    free = replace(device, launch_overhead_us=0.0)
    base, fused = cost.plan_cost(model, None, free), cost.plan_cost(model, plan, free)
    seconds = (base.latency_s - measured * fused.latency_s) / (measured * fused.kernels - base.kernels)
    return seconds * 1e6 if seconds >= 0 else None


def launch_us_negative(model, plan, device, measured):
    """WRONG: returns the solution even when it is below zero (no launch cost explains the measurement)."""
    free = replace(device, launch_overhead_us=0.0)
    base = cost.plan_cost(model, None, free)
    fused = cost.plan_cost(model, cost.as_launched(plan), free)
    denominator = measured * fused.kernels - base.kernels
    return None if denominator == 0 else (base.latency_s - measured * fused.latency_s) / denominator * 1e6


def launch_us_seconds(model, plan, device, measured):
    """WRONG: the answer in seconds."""
    us = launch_us(model, plan, device, measured)
    return None if us is None else us * 1e-6


def launch_us_on_top(model, plan, device, measured):
    """WRONG: prices the rest with `device` itself, not the zero-launch copy, so it solves for the launch cost added
    on top of the device's own."""
    base = cost.plan_cost(model, None, device)
    fused = cost.plan_cost(model, cost.as_launched(plan), device)
    denominator = measured * fused.kernels - base.kernels
    if denominator == 0:
        return None
    seconds = (base.latency_s - measured * fused.latency_s) / denominator
    return seconds * 1e6 if seconds >= 0 else None


def launch_us_stub(model, plan, device, measured):
    raise NotImplementedError  # the notebook's stub (None is an answer here, so the stub raises)

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "launchfit"
REFERENCE = launch_us
WRONG = [(launch_us_as_made, 3, "cost.as_launched"), (launch_us_negative, 2, "below zero"),
         (launch_us_seconds, 0, "seconds, not µs"), (launch_us_on_top, 0, "on top of the device's own")]
STUB = launch_us_stub
