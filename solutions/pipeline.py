"""The second exercise of notebook 19: the time of n tiles with one and with two buffers on one memory path."""


def pipeline_time(n_tiles, t_in, t_compute, t_out, buffers):
    """Reference: an event simulation of the three queues as notebook 19 §1 describes them. Each queue takes the
    tiles in order, one at a time, as soon as it may: CopyIn of tile i waits for Compute of tile i - buffers (its
    input buffer), Compute waits for its CopyIn and for CopyOut of tile i - buffers (its output buffer), CopyOut
    waits for its Compute; while CopyIn and CopyOut both run, each goes at half speed (one memory path)."""
    work = (t_in, t_compute, t_out)
    end = [[None] * 3 for _ in range(n_tiles)]  # when each stage of each tile ended
    nxt, left, t, done = [0, 0, 0], [None, None, None], 0.0, 0  # next tile per queue, work left on it (us)

    def ready(k, i):
        old = i - buffers  # the tile whose buffer tile i reuses
        if k == 0:
            return old < 0 or end[old][1] is not None
        if k == 1:
            return end[i][0] is not None and (old < 0 or end[old][2] is not None)
        return end[i][1] is not None

    while done < 3 * n_tiles:
        for k in range(3):
            if left[k] is None and nxt[k] < n_tiles and ready(k, nxt[k]):
                left[k], nxt[k] = work[k], nxt[k] + 1
        shared = left[0] is not None and left[2] is not None
        rate = [0.5 if shared and k != 1 else 1.0 for k in range(3)]
        busy = [k for k in range(3) if left[k] is not None]
        dt = min(left[k] / rate[k] for k in busy)  # until the next stage ends
        t += dt
        for k in busy:
            left[k] -= dt * rate[k]
            if left[k] <= 1e-12 * max(work):
                end[nxt[k] - 1][k], left[k], done = t, None, done + 1
    return t


def pipeline_time_bounds(n_tiles, t_in, t_compute, t_out, buffers):
    """WRONG: §1's closed forms. One buffer: fully serial (right). Two buffers: the larger of the memory path's
    n x (in + out) and the compute's fill + n x compute + drain, which are bounds: where the copies set the pace
    the path still idles, e.g. while the last tile computes (8 tiles of 2 / 1 / 0.5 us take 21 us, not 20)."""
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
         (pipeline_time_no_fill, 0, "no fill and drain"), (pipeline_time_bounds, 4, "both are bounds")]
STUB = pipeline_time_stub
