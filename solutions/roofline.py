"""The exercise of notebook 07: one kernel's predicted time on a device preset, by the roofline."""


def kernel_time(flops, nbytes, device):
    """Reference: the larger of compute time (at the fp16 peak the presets run float models at) and memory time,
    plus one launch."""
    compute = flops / device.peak_flops("float16")
    memory = nbytes / device.bandwidth
    return max(compute, memory) + device.launch_overhead_us * 1e-6


def kernel_time_added(flops, nbytes, device):
    """WRONG: adds compute and memory time, as if the two never overlapped."""
    return flops / device.peak_flops("float16") + nbytes / device.bandwidth + device.launch_overhead_us * 1e-6


def kernel_time_fp32_peak(flops, nbytes, device):
    """WRONG: `peak_flops()` with its default dtype, float32: 75 TFLOP/s on the 910B, which runs the model at fp16."""
    return max(flops / device.peak_flops(), nbytes / device.bandwidth) + device.launch_overhead_us * 1e-6


def kernel_time_no_launch(flops, nbytes, device):
    """WRONG: the roofline alone, without the launch overhead."""
    return max(flops / device.peak_flops("float16"), nbytes / device.bandwidth)


def kernel_time_stub(flops, nbytes, device):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "roofline"
REFERENCE = kernel_time
WRONG = [(kernel_time_added, 0, "compute time + memory time"), (kernel_time_fp32_peak, 4, "the fp32 peak"),
         (kernel_time_no_launch, 0, "the launch overhead left out")]
STUB = kernel_time_stub
