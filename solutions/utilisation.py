"""The second exercise of notebook 18: the seed's evaluation model on one chip of an Atlas preset."""


def utilisation(flops, nbytes, seconds, device):
    """Reference: achieved FLOP/s and bytes/s over one chip's fp16 peak and bandwidth (GB/s are 1e9 bytes)."""
    chip = device.one_chip()
    return flops / seconds / chip.peak_flops("float16"), nbytes / seconds / chip.bandwidth


def utilisation_whole_card(flops, nbytes, seconds, device):
    """WRONG: the card's figures, as the preset lists them, where one model instance runs on one chip."""
    return flops / seconds / (device.peak_fp16_tflops * 1e12), nbytes / seconds / (device.mem_bandwidth_gbs * 1e9)


def utilisation_gib(flops, nbytes, seconds, device):
    """WRONG: reads the bandwidth's GB/s as GiB/s."""
    chip = device.one_chip()
    return flops / seconds / chip.peak_flops("float16"), nbytes / seconds / (chip.mem_bandwidth_gbs * 2**30)


def utilisation_stub(flops, nbytes, seconds, device):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "utilisation"
REFERENCE = utilisation
WRONG = [(utilisation_whole_card, 1, "the whole card"), (utilisation_gib, 0, "GiB/s")]
STUB = utilisation_stub
