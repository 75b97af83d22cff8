"""The first exercise of notebook 18: the workspace a preallocated memory plan needs."""


def workspace_bytes(inputs, steps, outputs):
    """Reference: each tensor is live from its writer (graph inputs: the start) to its last reader (graph outputs:
    the end); the peak over the steps of the live bytes."""
    start = {name: 0 for name in inputs}
    size = dict(inputs)
    for i, step in enumerate(steps):
        for name, nbytes in step.writes.items():
            start[name], size[name] = i, nbytes
    end = dict(start)
    for i, step in enumerate(steps):
        for name in step.reads:
            end[name] = max(end[name], i)
    for name in outputs:
        end[name] = len(steps) - 1
    return max(sum(size[t] for t in start if start[t] <= i <= end[t]) for i in range(len(steps)))


def workspace_bytes_no_reuse(inputs, steps, outputs):
    """WRONG: a slot for every tensor of the run, none reused."""
    return sum(inputs.values()) + sum(sum(step.writes.values()) for step in steps)


def workspace_bytes_first_reader(inputs, steps, outputs):
    """WRONG: frees each tensor after its first reader, as in a chain: a skip connection's tensor is still
    waiting for a later reader."""
    start = {name: 0 for name in inputs}
    size = dict(inputs)
    for i, step in enumerate(steps):
        for name, nbytes in step.writes.items():
            start[name], size[name] = i, nbytes
    end = {}
    for i, step in enumerate(steps):
        for name in step.reads:
            end.setdefault(name, i)
    for name in outputs:
        end[name] = len(steps) - 1
    return max(sum(size[t] for t in start if start[t] <= i <= end.get(t, start[t])) for i in range(len(steps)))


def workspace_bytes_without_inputs(inputs, steps, outputs):
    """WRONG: the reference without the graph inputs."""
    return workspace_bytes({}, [type(s)(s.kernel, tuple(t for t in s.reads if t not in inputs), s.writes)
                                for s in steps], outputs)


def workspace_bytes_largest_kernel(inputs, steps, outputs):
    """WRONG: the bytes the largest kernel reads and writes, as if nothing else were live while it runs."""
    size = dict(inputs) | {name: nbytes for step in steps for name, nbytes in step.writes.items()}
    return max(sum(size[t] for t in step.reads) + sum(step.writes.values()) for step in steps)


def workspace_bytes_stub(inputs, steps, outputs):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "workspace"
REFERENCE = workspace_bytes
WRONG = [(workspace_bytes_no_reuse, 0, "one slot per tensor"),
         (workspace_bytes_without_inputs, 4, "the graph inputs left out"),
         (workspace_bytes_first_reader, 1, "freed after its first reader"),
         (workspace_bytes_largest_kernel, 1, "the largest kernel's reads and writes")]
STUB = workspace_bytes_stub
