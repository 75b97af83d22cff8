"""The second exercise of notebook 14: the time of n tiles with one and with two buffers on one memory path."""


def pipeline_time(n_tiles, t_in, t_compute, t_out, buffers):
    """Reference, notebook 14 §1's closed forms. One buffer: fully serial, since the next copy-in shares the path
    with this copy-out. Two buffers: copying overlaps computing, so the longer of the memory path's n x (in + out)
    and the compute's fill + n x compute + drain."""
    if buffers == 1:
        return n_tiles * (t_in + t_compute + t_out)
    return max(n_tiles * (t_in + t_out), t_in + n_tiles * t_compute + t_out)


def pipeline_time_slowest_stage(n_tiles, t_in, t_compute, t_out, buffers):
    """WRONG: n x the slowest stage, as if three independent engines ran without fill or drain."""
    return n_tiles * max(t_in, t_compute, t_out) if buffers > 1 else n_tiles * (t_in + t_compute + t_out)


def pipeline_time_serial(n_tiles, t_in, t_compute, t_out, buffers):
    """WRONG: the sum of the stages for double buffering too (nothing overlaps)."""
    return n_tiles * (t_in + t_compute + t_out)


def pipeline_time_no_fill(n_tiles, t_in, t_compute, t_out, buffers):
    """WRONG: n periods of max(in + out, compute) for two buffers, without the fill and drain."""
    if buffers == 1:
        return n_tiles * (t_in + t_compute + t_out)
    return n_tiles * max(t_in + t_out, t_compute)


def pipeline_time_stub(n_tiles, t_in, t_compute, t_out, buffers):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "pipeline"
REFERENCE = pipeline_time
WRONG = [(pipeline_time_slowest_stage, 0, "n x the slowest stage"), (pipeline_time_serial, 2, "the serial time"),
         (pipeline_time_no_fill, 0, "no fill and drain")]
STUB = pipeline_time_stub
