"""The second exercise of notebook 17: the op type a profiled run spends most of its kernel time in."""


def top_op_type(ops):
    """Reference: each type's summed durations; the largest, over the sum of every kernel's duration."""
    time = {}
    for e in ops:
        time[e.op_type] = time.get(e.op_type, 0.0) + e.dur_us
    top = max(time, key=time.get)
    return top, time[top] / sum(time.values())


def top_op_type_longest_kernel(ops):
    """WRONG: the type of the single longest kernel (the op table's top row when sorted by duration)."""
    longest = max(ops, key=lambda e: e.dur_us)
    return longest.op_type, sum(e.dur_us for e in ops if e.op_type == longest.op_type) / sum(e.dur_us for e in ops)


def top_op_type_largest_mean(ops):
    """WRONG: the type whose kernels are longest on average (a MatMul of 120 us beats 24 Mul of 6 us)."""
    time, count = {}, {}
    for e in ops:
        time[e.op_type] = time.get(e.op_type, 0.0) + e.dur_us
        count[e.op_type] = count.get(e.op_type, 0) + 1
    top = max(time, key=lambda t: time[t] / count[t])
    return top, time[top] / sum(time.values())


def top_op_type_most_frequent(ops):
    """WRONG: the type with the most kernels."""
    count = {}
    for e in ops:
        count[e.op_type] = count.get(e.op_type, 0) + 1
    top = max(count, key=count.get)
    return top, sum(e.dur_us for e in ops if e.op_type == top) / sum(e.dur_us for e in ops)


def top_op_type_of_the_run(ops):
    """WRONG: the share of the span from the first kernel's start to the last one's end: the gaps count too."""
    time = {}
    for e in ops:
        time[e.op_type] = time.get(e.op_type, 0.0) + e.dur_us
    top = max(time, key=time.get)
    return top, time[top] / (max(e.end_us for e in ops) - min(e.start_us for e in ops))


def top_op_type_stub(ops):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "hotspot"
REFERENCE = top_op_type
WRONG = [(top_op_type_longest_kernel, 1, "the type of the single longest kernel"),
         (top_op_type_largest_mean, 1, "the longest kernels on average"),
         (top_op_type_most_frequent, 2, "the most frequent type"),
         (top_op_type_of_the_run, 0, "the span from the first start to the last end")]
STUB = top_op_type_stub
