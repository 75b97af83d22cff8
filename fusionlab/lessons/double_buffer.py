"""Double buffering: a simulator of one Ascend AI Core vector pipeline, and a measured CPU analogue.

An Ascend C vector kernel processes its data in tiles through three hardware queues that run
concurrently: copy-in from global memory to the Unified Buffer (MTE2), compute (Vector), copy-out
back to global memory (MTE3). Tiles pass between them through `TQue`s of depth ``BUFFER_NUM``.
With one buffer per queue, copy-in of tile i+1 must wait until compute has released tile i's input
buffer; with two, MTE2 fills one buffer while the Vector unit works on the other. (TBE's forms of the
same thing: ``sch[tensor].double_buffer()`` in a DSL schedule, ``tik.for_range(..., thread_num=2)`` in TIK.)

`simulate` is a pure, deterministic, event-based model of exactly those dependencies:

- CopyIn(i) starts when MTE2 is free and input buffer ``i mod BUFFER_NUM`` has been released by Compute(i - BUFFER_NUM);
- Compute(i) starts when CopyIn(i) is done, the Vector unit is free and output buffer ``i mod BUFFER_NUM``
  has been released by CopyOut(i - BUFFER_NUM);
- CopyOut(i) starts when Compute(i) is done and MTE3 is free.

MTE2 and MTE3 are separate queues but move their bytes over one memory path: the per-core bandwidth
(device bandwidth / AI cores) is shared, so while both copy each runs at half speed
(``shared_bandwidth=True``, the default). No schedule can then beat ``lower_bound``: max(all bytes /
bandwidth, all compute). ``shared_bandwidth=False`` gives each queue a path of its own, the picture of
three independent engines, which a core does not have.

With ``inplace=True`` a tile's single buffer is both read and written (one ``VECCALC`` buffer), so it
is released only after CopyOut: with one buffer that is the fully serial picture of the CANN docs
(each stage busy one third of the time when all three take equally long).

`run_tiles` is the CPU analogue: a loader thread fills tile buffers (a queue of depth ``len(buffers)``)
while the main thread computes on the previous tile; numpy and file reads release the GIL, so the two
overlap on two cores.
"""

from __future__ import annotations

import math
import os
import queue
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..files import default_mode

__all__ = [
    "STAGES", "StageTimes", "Schedule", "simulate", "lower_bound", "serial_time", "steady_state_period", "VectorCore",
    "core_from_device", "max_tile_elems", "stage_times", "double_buffer_gain", "ratio_for_gain",
    "draw_pipeline", "run_tiles",
]

#: the three stages and the hardware queue that executes each
STAGES = (("CopyIn", "MTE2"), ("Compute", "Vector"), ("CopyOut", "MTE3"))


@dataclass(frozen=True)
class StageTimes:
    """Time of each stage for one tile (µs)."""

    copy_in: float
    compute: float
    copy_out: float

    def __post_init__(self):
        for name in ("copy_in", "compute", "copy_out"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"stage time {name} must be a finite number >= 0, got {v!r}")

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.copy_in, self.compute, self.copy_out)

    @property
    def bottleneck(self) -> float:
        return max(self.as_tuple())


@dataclass
class Schedule:
    """A simulated run: per tile and stage, (start, end) in µs; plus the parameters."""

    starts: np.ndarray  # shape (n_tiles, 3)
    ends: np.ndarray
    times: StageTimes
    buffer_num: int
    inplace: bool = False
    tile_bytes: int = 0
    meta: dict = field(default_factory=dict)

    @property
    def n_tiles(self) -> int:
        return int(self.starts.shape[0])

    @property
    def total(self) -> float:
        """Makespan: end of the last CopyOut (µs)."""
        return float(self.ends[-1, 2]) if self.n_tiles else 0.0

    def busy(self) -> dict[str, float]:
        """Fraction of the makespan each hardware queue is busy."""
        t = self.total or 1.0
        return {unit: float((self.ends[:, k] - self.starts[:, k]).sum()) / t for k, (_, unit) in enumerate(STAGES)}

    @property
    def path_busy(self) -> float:
        """Fraction of the makespan the memory path must be moving data: all copy work / makespan (<= 1 when shared)."""
        if not self.total:
            return 0.0
        return self.n_tiles * (self.times.copy_in + self.times.copy_out) / self.total

    def throughput(self, bytes_per_tile: float | None = None) -> float:
        """Tiles per µs, or bytes per µs (= MB/s) when `bytes_per_tile` is given."""
        if not self.total:
            return 0.0
        per = 1.0 if bytes_per_tile is None else bytes_per_tile
        return self.n_tiles * per / self.total


def _check(n_tiles: int, buffer_num: int) -> None:
    if not isinstance(n_tiles, (int, np.integer)) or n_tiles < 0:
        raise ValueError(f"n_tiles must be an int >= 0, got {n_tiles!r}")
    if not isinstance(buffer_num, (int, np.integer)) or buffer_num < 1:
        raise ValueError(f"buffer_num must be an int >= 1, got {buffer_num!r}")


def _ready(k: int, i: int, ends: list, buffer_num: int, inplace: bool) -> bool:
    """Whether stage k of tile i may start, given the stage ends recorded so far (None = not yet)."""
    old = i - buffer_num  # the tile whose buffer tile i reuses
    if k == 0:  # CopyIn: its input buffer released (by Compute, or by CopyOut if in place)
        return old < 0 or ends[old][2 if inplace else 1] is not None
    if k == 1:  # Compute: data in, output buffer released by CopyOut(old)
        return ends[i][0] is not None and (inplace or old < 0 or ends[old][2] is not None)
    return ends[i][1] is not None  # CopyOut: result ready


def simulate(n_tiles: int, times: StageTimes | Sequence[float], buffer_num: int = 2, *, inplace: bool = False,
             shared_bandwidth: bool = True, tile_bytes: int = 0) -> Schedule:
    """Event schedule of `n_tiles` tiles through CopyIn -> Compute -> CopyOut with `buffer_num` buffers per queue.

    `times` are each stage's time for one tile when it runs alone. With `shared_bandwidth` (the default,
    and what an AI Core has) MTE2 and MTE3 move their bytes over one memory path: while both copy, each
    runs at half speed, so no schedule moves its bytes faster than bytes / bandwidth (`lower_bound`).
    With ``shared_bandwidth=False`` each queue has a path of its own (three independent engines).
    """
    if not isinstance(times, StageTimes):
        times = StageTimes(*times)
    _check(n_tiles, buffer_num)
    work = times.as_tuple()
    starts = [[None] * 3 for _ in range(n_tiles)]
    ends = [[None] * 3 for _ in range(n_tiles)]
    nxt = [0, 0, 0]  # next tile each queue starts; queues take tiles in order, one at a time
    left: list = [None, None, None]  # work left (us at full speed) of the tile running on each queue
    t, finished, tol = 0.0, 0, 1e-12 * max(max(work), 1e-300)
    while finished < 3 * n_tiles:
        for k in range(3):
            if left[k] is None and nxt[k] < n_tiles and _ready(k, nxt[k], ends, buffer_num, inplace):
                starts[nxt[k]][k], left[k] = t, work[k]
                nxt[k] += 1
        active = [k for k in range(3) if left[k] is not None]
        if not active:  # pragma: no cover - the dependencies form no cycle
            raise RuntimeError("simulator deadlock")
        half = shared_bandwidth and left[0] is not None and left[2] is not None  # MTE2 and MTE3 share the path
        rate = [0.5 if half and k != 1 else 1.0 for k in range(3)]
        dt = min(left[k] / rate[k] for k in active)
        t += dt
        for k in active:
            if left[k] / rate[k] - dt <= tol:
                ends[nxt[k] - 1][k], left[k] = t, None
                finished += 1
            else:
                left[k] -= dt * rate[k]
    return Schedule(np.array(starts, dtype=float).reshape(n_tiles, 3), np.array(ends, dtype=float).reshape(n_tiles, 3),
                    times, buffer_num, inplace, tile_bytes, meta={"shared_bandwidth": shared_bandwidth})


def lower_bound(n_tiles: int, times: StageTimes | Sequence[float], *, shared_bandwidth: bool = True) -> float:
    """No schedule is faster: max(all copy work over the memory path(s), all compute), in us."""
    t = times if isinstance(times, StageTimes) else StageTimes(*times)
    copy = n_tiles * (t.copy_in + t.copy_out) if shared_bandwidth else n_tiles * max(t.copy_in, t.copy_out)
    return max(copy, n_tiles * t.compute)


def serial_time(n_tiles: int, times: StageTimes | Sequence[float]) -> float:
    """No overlap at all: n x (copy-in + compute + copy-out)."""
    t = times if isinstance(times, StageTimes) else StageTimes(*times)
    return n_tiles * sum(t.as_tuple())


def steady_state_period(times: StageTimes | Sequence[float], buffer_num: int, *, inplace: bool = False,
                        shared_bandwidth: bool = True) -> float:
    """Time between successive tiles once the pipeline is full (analytic, us).

    Exact with separate memory paths, and with a shared path for one buffer or a compute-bound kernel.
    With a shared path and the copies dominating, it is the bound the path allows: splitting the path
    equally between MTE2 and MTE3 is not always the best order, and the simulator can be a few % slower.
    """
    t = times if isinstance(times, StageTimes) else StageTimes(*times)
    a, b, c = t.as_tuple()
    copies = a + c if shared_bandwidth else max(a, c)  # what the memory path(s) must move per tile
    if buffer_num >= 2 and not inplace:
        # each buffer cycle: in-buffer busy a+b, out-buffer busy b+c, shared by buffer_num tiles
        return max(copies, b, (a + b) / buffer_num, (b + c) / buffer_num)
    if inplace:
        return max(copies, b, (a + b + c) / buffer_num)
    # one buffer per queue: the next CopyIn overlaps this CopyOut, which only helps with a path each
    return b + copies


# --------------------------------------------------------------------------------------------------
# stage times from a device preset
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class VectorCore:
    """One AI Core's vector pipeline: Unified Buffer size, per-core copy bandwidth, vector throughput."""

    name: str
    ub_bytes: int
    copy_gbs: float  # GM <-> UB bandwidth available to this core (GB/s = bytes/ns)
    vector_gflops: float  # element operations per ns x 1e9 ... i.e. G element-ops per second
    latency_us: float = 0.0  # fixed cost per transfer / per vector call (an assumption; 0 = ignore)
    source: str = ""


#: Vector unit width: 256 bytes per cycle (128 fp16 lanes); clock 1.8 GHz (Ascend910B ini `cube_freq=1800`).
VECTOR_BYTES_PER_CYCLE = 256
VECTOR_CLOCK_GHZ = 1.8


def core_from_device(device, *, ub_bytes: int | None = None, latency_us: float = 0.0, dtype_bytes: int = 2,
                     usable_ub: float = 1.0) -> VectorCore:
    """A `VectorCore` modelled from a `fusionlab.cost.devices.Device` preset (bandwidth shared by all the cores that
    run vector kernels: the AI cores, or the 910B's separate vector cores, two per AI core).

    One vector clock, `VECTOR_CLOCK_GHZ` (the 910B platform file's), is applied to every preset: no other chip's
    clock is in the project's sources, so the vector throughput of the others is an assumption."""
    cores = max(1, int(getattr(device, "vector_cores", None) or getattr(device, "ai_cores", 1) or 1))
    ub = ub_bytes if ub_bytes is not None else int(float(getattr(device, "ub_kb", 192) or 192) * 1024 * usable_ub)
    bw = float(device.mem_bandwidth_gbs) / cores
    lanes = VECTOR_BYTES_PER_CYCLE // dtype_bytes
    return VectorCore(name=str(device.name), ub_bytes=int(ub), copy_gbs=bw, vector_gflops=lanes * VECTOR_CLOCK_GHZ,
                      latency_us=latency_us,
                      source=f"{device.name}: {device.mem_bandwidth_gbs} GB/s / {cores} vector-capable cores; UB {ub} B; "
                             f"vector {lanes} lanes x {VECTOR_CLOCK_GHZ} GHz (modelled; the 910B's clock)")


def max_tile_elems(ub_bytes: int, buffer_num: int, *, in_bytes: int = 2, out_bytes: int = 2, inputs: int = 1,
                   outputs: int = 1, align: int = 32) -> int:
    """Largest tile (elements) with buffer_num x (inputs x in_bytes + outputs x out_bytes) x tile <= UB, 32-B aligned."""
    if ub_bytes <= 0 or buffer_num < 1:
        raise ValueError("need ub_bytes > 0 and buffer_num >= 1")
    per_elem = buffer_num * (inputs * in_bytes + outputs * out_bytes)
    elems = ub_bytes // per_elem
    step = max(1, align // math.gcd(align, min(in_bytes, out_bytes)))  # elements per 32-byte block
    return int(elems // step * step)


def stage_times(core: VectorCore, tile_elems: int, *, in_bytes: int = 2, out_bytes: int = 2, inputs: int = 1,
                outputs: int = 1, ops_per_elem: float = 1.0) -> StageTimes:
    """Per-tile stage times (µs): bytes / copy bandwidth for MTE2 and MTE3, element-ops / vector throughput."""
    if tile_elems <= 0:
        raise ValueError("tile_elems must be > 0")
    bw = core.copy_gbs * 1e3  # bytes per µs
    t_in = inputs * in_bytes * tile_elems / bw + core.latency_us
    t_out = outputs * out_bytes * tile_elems / bw + core.latency_us
    t_vec = ops_per_elem * tile_elems / (core.vector_gflops * 1e3) + core.latency_us
    return StageTimes(t_in, t_vec, t_out)


# --------------------------------------------------------------------------------------------------
# the seed's "+18%"
# --------------------------------------------------------------------------------------------------

def double_buffer_gain(times: StageTimes | Sequence[float], n_tiles: int = 64, *, inplace: bool = False,
                       shared_bandwidth: bool = True) -> float:
    """Speed-up of BUFFER_NUM=2 over BUFFER_NUM=1 for the same tiles: T(1) / T(2) - 1 (0.18 = +18%)."""
    one = simulate(n_tiles, times, 1, inplace=inplace, shared_bandwidth=shared_bandwidth).total
    two = simulate(n_tiles, times, 2, inplace=inplace, shared_bandwidth=shared_bandwidth).total
    return one / two - 1.0 if two else 0.0


def ratio_for_gain(gain: float, *, inplace: bool = False, copy_split: float = 0.5, shared_bandwidth: bool = True,
                   side: str = "compute") -> float:
    """Total copy time / compute time per tile at which BUFFER_NUM=2 gains exactly `gain` over BUFFER_NUM=1.

    Steady state; the copy time is split between copy-in and copy-out by `copy_split` (0.5 = equal).
    ``side="compute"`` gives the ratio r < 1 (compute-bound kernels), ``side="copy"`` the ratio r > 1.
    """
    if side not in ("compute", "copy"):
        raise ValueError("side must be 'compute' or 'copy'")
    if gain <= 0:
        return 0.0 if side == "compute" else math.inf

    def g(r: float) -> float:
        t = StageTimes(r * copy_split, 1.0, r * (1 - copy_split))
        kw = {"inplace": inplace, "shared_bandwidth": shared_bandwidth}
        return steady_state_period(t, 1, **kw) / steady_state_period(t, 2, **kw) - 1

    lo, hi = (0.0, 1.0) if side == "compute" else (1.0, 1e6)
    for _ in range(200):
        mid = (lo + hi) / 2
        rising = side == "compute"  # the gain grows with r below the balance point and falls above it
        if (g(mid) < gain) == rising:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


# --------------------------------------------------------------------------------------------------
# picture
# --------------------------------------------------------------------------------------------------

def draw_pipeline(schedule: Schedule, ax=None, title: str | None = None, max_tiles: int | None = 8):
    """Gantt chart of a schedule: one row per hardware queue (MTE2, Vector, MTE3), tiles labelled and coloured."""
    import matplotlib
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 2.2))
    n = schedule.n_tiles if max_tiles is None else min(schedule.n_tiles, max_tiles)
    cmap = matplotlib.colormaps["tab10"]
    for i in range(n):
        for k in range(3):
            s, e = schedule.starts[i, k], schedule.ends[i, k]
            ax.broken_barh([(s, e - s)], (k - 0.38, 0.76), facecolors=cmap(i % 10), edgecolor="black", linewidth=0.5)
            if e - s > 0:
                ax.text((s + e) / 2, k, str(i), ha="center", va="center", fontsize=7)
    ax.set_yticks(range(3), [f"{unit} ({stage})" for stage, unit in STAGES])
    ax.set_ylim(2.6, -0.6)
    end = float(schedule.ends[n - 1, 2]) if n else 1.0
    # Axes may be shared (sharex=True) with longer schedules: never cut an earlier one short.
    ax.set_xlim(0, max(end * 1.02, ax.get_xlim()[1]) if ax.get_shared_x_axes().get_siblings(ax)[1:] else end * 1.02)
    spec = ax.get_subplotspec()
    if spec is None or spec.is_last_row():
        ax.set_xlabel("time (µs)")
    shown = "" if n == schedule.n_tiles else f" (first {n} of {schedule.n_tiles} tiles)"
    ax.set_title(title or f"BUFFER_NUM = {schedule.buffer_num}{shown}")
    return ax.figure


# --------------------------------------------------------------------------------------------------
# CPU analogue: overlap loading tiles with computing on them
# --------------------------------------------------------------------------------------------------

def run_tiles(load: Callable[[int, np.ndarray], object], compute: Callable[[np.ndarray], object], n_tiles: int,
              buffers: Sequence[np.ndarray], *, overlap: bool = True) -> list:
    """Process tiles: `load(i, buf)` fills a buffer, `compute(buf)` consumes it; overlapped in two threads or not.

    With `overlap`, a loader thread fills the `buffers` round robin (a queue of depth len(buffers),
    like a `TQue` with BUFFER_NUM = len(buffers)) while this thread computes. Returns compute results in order.
    """
    if not buffers:
        raise ValueError("need at least one buffer")
    results: list = []
    if not overlap:
        buf = buffers[0]
        for i in range(n_tiles):
            load(i, buf)
            results.append(compute(buf))
        return results
    free: queue.Queue = queue.Queue()
    full: queue.Queue = queue.Queue()
    for b in buffers:
        free.put(b)
    errors: list[BaseException] = []
    stop = threading.Event()

    def loader():
        try:
            for i in range(n_tiles):
                b = free.get()
                if stop.is_set():
                    return
                load(i, b)
                full.put(b)
        except BaseException as exc:  # re-raised in the caller
            errors.append(exc)
            full.put(None)

    t = threading.Thread(target=loader, name="fusionlab-loader", daemon=True)
    t.start()
    try:
        for _ in range(n_tiles):
            b = full.get()
            if b is None:
                break
            results.append(compute(b))
            free.put(b)
    finally:
        stop.set()
        free.put(None)  # unblock the loader if it waits
        t.join()
    if errors:
        raise errors[0]
    return results


class TileFile:
    """Tiles of float32 data in a file, read with `os.preadv` (which releases the GIL) into caller buffers.

    `device_gbs` emulates a slower storage device, like a DMA engine that works without the CPU: a load
    takes at least bytes / device_gbs, the thread sleeping (no CPU used) for whatever the read did not take.
    """

    def __init__(self, path, tile_elems: int, *, device_gbs: float | None = None):
        if device_gbs is not None and device_gbs <= 0:
            raise ValueError("device_gbs must be > 0")
        self.path = path
        self.tile_elems = int(tile_elems)
        self.device_gbs = device_gbs
        self._fd = os.open(path, os.O_RDONLY)
        size = os.fstat(self._fd).st_size
        self.n_tiles = size // (4 * self.tile_elems)
        if self.n_tiles < 1:
            os.close(self._fd)
            raise ValueError(f"file holds {size} bytes, less than one tile of {tile_elems} float32")

    def load(self, i: int, buf: np.ndarray) -> None:
        """Read tile `i` into `buf` (float32, tile_elems long)."""

        if not 0 <= i < self.n_tiles:
            raise IndexError(f"tile {i} out of range (0..{self.n_tiles - 1})")
        want = 4 * self.tile_elems
        t0 = time.perf_counter()
        got = os.preadv(self._fd, [memoryview(buf).cast("B")], i * want)
        if got != want:
            raise OSError(f"short read of tile {i}: {got} of {want} bytes")
        if self.device_gbs:
            rest = want / (self.device_gbs * 1e9) - (time.perf_counter() - t0)
            if rest > 0:
                time.sleep(rest)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "TileFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_tile_file(path, n_tiles: int, tile_elems: int, seed: int = 0):
    """Write `n_tiles` x `tile_elems` random float32 values to `path` atomically; returns the path."""

    path = Path(path)
    rng = np.random.default_rng(seed)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for _ in range(n_tiles):
                f.write(rng.standard_normal(tile_elems, dtype=np.float32).tobytes())
        os.chmod(tmp, default_mode(path))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def elementwise_compute(sweeps: int, tile_elems: int) -> Callable[[np.ndarray], float]:
    """A compute stage of `sweeps` tanh passes over a tile (numpy releases the GIL), returning the tile's sum."""
    if sweeps < 1:
        raise ValueError("sweeps must be >= 1")
    scratch = np.empty(tile_elems, dtype=np.float32)

    def compute(buf: np.ndarray) -> float:
        np.tanh(buf, out=scratch)
        for _ in range(sweeps - 1):
            np.tanh(scratch, out=scratch)
        return float(scratch.sum(dtype=np.float64))

    return compute
