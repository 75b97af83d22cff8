"""The first exercise of notebook 17: the time of a profiled run with no kernel running."""


def idle_us(run_us, ops):
    """Reference: the run minus the union of the kernels' intervals (overlapping kernels counted once)."""
    busy, end = 0.0, float("-inf")
    for e in sorted(ops, key=lambda e: e.start_us):
        if e.end_us > end:
            busy += e.end_us - max(e.start_us, end)
            end = e.end_us
    return run_us - busy


def idle_us_waits(run_us, ops):
    """WRONG: sums the op table's Wait column, which leaves out the time after the last kernel ends."""
    return sum(e.wait_us for e in ops)


def idle_us_minus_durations(run_us, ops):
    """WRONG: subtracts every kernel's duration, so kernels that overlap on two lanes are subtracted twice."""
    return run_us - sum(e.dur_us for e in ops)


def idle_us_tail_from_last_start(run_us, ops):
    """WRONG: the Wait column plus the tail after the kernel that starts last, not after the latest end (a long
    kernel on another lane can outlast it)."""
    return sum(e.wait_us for e in ops) + run_us - ops[-1].end_us


def idle_us_stub(run_us, ops):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "idle"
REFERENCE = idle_us
WRONG = [(idle_us_waits, 0, "the Wait column"), (idle_us_minus_durations, 2, "subtracted twice"),
         (idle_us_tail_from_last_start, 4, "the tail after the latest end, not the last start")]
STUB = idle_us_stub
