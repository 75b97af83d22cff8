"""Measure this machine for the cost model: matmul GFLOP/s, streaming bandwidth, per-kernel launch cost.

Each quantity is defined here once, and every notebook reads it from here (through `calibrate()` or
`fusionlab.cost.devices.this_machine()`), so the workbook quotes one bandwidth and one launch cost:

- **streaming bandwidth** (`Calibration.stream_gbs`): the better of a copy and an add over fp32 arrays of
  at least four times the last-level cache each (STREAM's rule), bytes counted as STREAM counts them
  (copy 2, add 3 per element). Smaller arrays stay partly in the cache and read high: arrays of 16 MiB
  on a 32 MiB L3 measure about 1.5x the DRAM figure.
- **launch overhead** (`Calibration.launch_overhead_us`): what one more node costs onnxruntime (one
  thread, optimisations off, profiler off): a chain of n tiny ``Neg`` ops minus a chain of one, per op.
  This is the per-kernel cost the cost model charges.
- **profiled launch** (`Calibration.profiled_launch_us`): the same, with onnxruntime's profiler on. The
  difference is the profiler's own cost per node (timestamps, an event record): it lands in the
  "gaps" of a profile, so a profile overstates the launch cost by about this much per op.

All measurements are single-threaded, like fusionlab's onnxruntime comparisons (one intra-op thread):
numpy's OpenBLAS is held to one thread while the matmul is timed, numpy ufuncs are single-threaded
anyway. Each figure is the median of repeated runs. `calibrate()` caches its result for the process;
``quick=True`` takes fewer repeats of the same measurements (same array sizes).
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import tempfile
import time
from dataclasses import asdict, dataclass

import numpy as np
from onnx import helper

from ..build import make_model, value_info
from ..verification.runtime import session

__all__ = ["Calibration", "calibrate", "matmul_gflops", "stream_bandwidth", "stream_elements", "launch_overhead_us",
           "cache_sizes_kb"]

_CACHE: dict[bool, "Calibration"] = {}


@dataclass(frozen=True)
class Calibration:
    """What this machine measured (single thread)."""

    matmul_gflops: float
    copy_gbs: float
    add_gbs: float
    launch_overhead_us: float
    profiled_launch_us: float
    stream_elements: int
    l1d_kb: int
    l2_kb: int
    l3_kb: int
    quick: bool

    @property
    def stream_gbs(self) -> float:
        """DRAM streaming bandwidth, the machine's memory bandwidth: the better of copy and add (GB/s)."""
        return max(self.copy_gbs, self.add_gbs)

    @property
    def profiler_cost_us(self) -> float:
        """What onnxruntime's profiler adds per node: profiled launch minus launch (us)."""
        return max(self.profiled_launch_us - self.launch_overhead_us, 0.0)

    def to_dict(self) -> dict:
        return asdict(self) | {"stream_gbs": self.stream_gbs, "profiler_cost_us": self.profiler_cost_us}

    def summary(self) -> str:
        """What was measured, one quantity per line, each with how it was measured."""
        mib = self.stream_elements * 4 / 2**20
        return "\n".join([
            f"streaming bandwidth  {self.stream_gbs:6.1f} GB/s  best of copy {self.copy_gbs:.1f} / add {self.add_gbs:.1f} "
            f"GB/s; {mib:.0f} MiB fp32 arrays >= 4 x L3 ({self.l3_kb // 1024} MiB)",
            f"launch overhead      {self.launch_overhead_us:6.2f} us    one more tiny node in onnxruntime, profiler off",
            f"profiled launch      {self.profiled_launch_us:6.2f} us    the same, onnxruntime's profiler on "
            f"(it adds {self.profiler_cost_us:.2f} us per node)",
            f"matmul peak          {self.matmul_gflops:6.1f} GFLOP/s  numpy fp32 1024 x 1024, one thread",
        ])


def _median_time(fn, repeats: int, min_time: float = 0.0) -> float:
    fn()  # warm-up (page faults, JIT, caches)
    times = []
    start = time.perf_counter()
    while len(times) < repeats or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 200:
            break
    times.sort()
    return times[len(times) // 2]


@contextlib.contextmanager
def _blas_threads(n: int):
    """Hold numpy's OpenBLAS to `n` threads (no-op when the library does not expose the call)."""
    setter = getter = None
    for lib in glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "*openblas*")):
        try:
            handle = ctypes.CDLL(lib)
        except OSError:
            continue
        for s, g in (("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
                     ("openblas_set_num_threads", "openblas_get_num_threads")):
            if hasattr(handle, s) and hasattr(handle, g):
                setter, getter = getattr(handle, s), getattr(handle, g)
                break
        if setter:
            break
    if setter is None:
        yield
        return
    before = int(getter())
    setter(ctypes.c_int(n))
    try:
        yield
    finally:
        setter(ctypes.c_int(before))


def matmul_gflops(n: int = 1024, repeats: int = 5) -> float:
    """Single-thread fp32 numpy matmul throughput on n x n matrices, GFLOP/s."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), dtype=np.float32)
    with _blas_threads(1):
        t = _median_time(lambda: np.matmul(a, b, out=out), repeats)
    return 2.0 * n**3 / t / 1e9


def stream_elements(min_elements: int = 16 * 2**20) -> int:
    """fp32 elements per array for a DRAM measurement: at least 4 x the last-level cache (STREAM's rule)."""
    caches = cache_sizes_kb()
    last = max(caches["l3"], caches["l2"]) * 1024
    return max(min_elements, 4 * last // 4)


def stream_bandwidth(n_elements: int | None = None, repeats: int = 5) -> tuple[float, float]:
    """(copy GB/s, add GB/s) on fp32 arrays far larger than the caches; bytes counted STREAM-style."""
    n_elements = stream_elements() if n_elements is None else n_elements
    a = np.ones(n_elements, dtype=np.float32)
    b = np.ones(n_elements, dtype=np.float32)
    c = np.empty(n_elements, dtype=np.float32)
    nbytes = a.nbytes
    t_copy = _median_time(lambda: np.copyto(c, a), repeats)
    t_add = _median_time(lambda: np.add(a, b, out=c), repeats)
    return 2 * nbytes / t_copy / 1e9, 3 * nbytes / t_add / 1e9


def launch_overhead_us(n_ops: int = 64, repeats: int = 30, *, profiled: bool = False) -> float:
    """Per-kernel cost of onnxruntime (1 thread): time of a chain of n tiny Neg ops minus one, per op.

    ``profiled=True`` measures the same with onnxruntime's profiler on (its trace file is deleted).
    """

    def chain(n: int):
        nodes = [helper.make_node("Neg", ["x" if i == 0 else f"t{i}"], [f"t{i + 1}" if i < n - 1 else "y"],
                                  name=f"neg{i}") for i in range(n)]
        return make_model(nodes, [value_info("x", np.float32, [1])], [value_info("y", np.float32, [1])])

    feeds = {"x": np.ones(1, dtype=np.float32)}
    with tempfile.TemporaryDirectory(prefix="fusionlab-calibrate-") as tmp:
        kw = {"enable_profiling": True, "profile_prefix": os.path.join(tmp, "ort")} if profiled else {}
        s1, sn = session(chain(1), "disable", 1, **kw), session(chain(n_ops), "disable", 1, **kw)
        t1 = _median_time(lambda: s1.run(["y"], feeds), repeats)
        tn = _median_time(lambda: sn.run(["y"], feeds), repeats)
        if profiled:
            s1.end_profiling()
            sn.end_profiling()
    return max((tn - t1) / (n_ops - 1), 1e-9) * 1e6


def cache_sizes_kb() -> dict[str, int]:
    """{'l1d', 'l2', 'l3'} cache sizes of cpu0 in KiB from sysfs (0 when unknown)."""
    out = {"l1d": 0, "l2": 0, "l3": 0}
    for index in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            level = open(os.path.join(index, "level")).read().strip()
            kind = open(os.path.join(index, "type")).read().strip()
            size = open(os.path.join(index, "size")).read().strip()
        except OSError:
            continue
        kb = int(size[:-1]) * (1024 if size.endswith("M") else 1) if size[-1] in "KM" else int(size) // 1024
        key = {"1": "l1d" if kind in ("Data", "Unified") else None, "2": "l2", "3": "l3"}.get(level)
        if key:
            out[key] = kb
    return out


def calibrate(quick: bool = False, refresh: bool = False) -> Calibration:
    """Measure this machine once per process (quick=True: fewer repeats of the same measurements)."""
    if not refresh:
        if quick in _CACHE:
            return _CACHE[quick]
        if quick and False in _CACHE:
            return _CACHE[False]
    reps, launch_reps = (3, 15) if quick else (7, 30)
    elems = stream_elements()
    copy_gbs, add_gbs = stream_bandwidth(elems, reps)
    caches = cache_sizes_kb()
    result = Calibration(
        matmul_gflops=matmul_gflops(1024, reps), copy_gbs=copy_gbs, add_gbs=add_gbs,
        launch_overhead_us=launch_overhead_us(64, launch_reps),
        profiled_launch_us=launch_overhead_us(64, launch_reps, profiled=True), stream_elements=elems,
        l1d_kb=caches["l1d"], l2_kb=caches["l2"], l3_kb=caches["l3"], quick=quick,
    )
    _CACHE[quick] = result
    return result
