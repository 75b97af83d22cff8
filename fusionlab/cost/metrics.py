"""The seed's evaluation model (§6.2): compute utilisation, bandwidth utilisation, efficiency per watt.

Each figure is work divided by time divided by a peak:

- compute utilisation  = FLOPs per run / run time / peak FLOP/s
- bandwidth utilisation = bytes moved per run / run time / peak bytes/s
- efficiency per watt  = achieved TFLOP/s (TOPS) / power (W), only where the power is known

The work (FLOPs, bytes per op) comes from the cost model (`fusionlab.cost.node_costs`). The time comes
either from a measured `fusionlab.profile.Profile` (this machine) or from a roofline model of a device
preset (`modelled`: each op takes max(FLOPs / peak, bytes / bandwidth) plus the launch overhead), which
is how the Atlas figures are produced here: we have no Ascend hardware.

The seed's targets for a good fused op on Atlas 300I Duo are in `TARGETS`; `draw_roofline` draws them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

import numpy as np
from onnx import helper

from ..build import make_model, tensor, value_info
from ..timing import bench
from ..verification.runtime import session
from . import devices, model as cost

__all__ = ["TARGETS", "OpPoint", "Utilisation", "cost_table", "op_points", "utilisation", "modelled", "with_cores",
           "with_peak", "ort_matmul_gflops", "meets_targets", "peak_efficiency", "draw_roofline", "table"]

#: the seed's targets (§6.2): utilisation above 65%, bandwidth below 80% of peak, above 4 TOPS/W
TARGETS = {"compute_util": 0.65, "bandwidth_util": 0.80, "tops_per_watt": 4.0}


def _get(c, key: str) -> float:
    if isinstance(c, Mapping):
        return float(c[key])
    if isinstance(c, (tuple, list)):
        return float(c[0 if key == "flops" else 1])
    return float(getattr(c, key))


def cost_table(costs) -> dict[str, tuple[float, float]]:
    """{node name: (flops, bytes)} from `cost.node_costs` output (dict of objects/dicts/tuples, or a list with .name)."""
    if isinstance(costs, Mapping):
        items = costs.items()
    else:
        items = ((getattr(c, "name", None) or getattr(c, "node", None), c) for c in costs)
    out = {}
    for name, c in items:
        out[str(name)] = (_get(c, "flops"), _get(c, "bytes"))
    return out


class _Rates:
    """Achieved rates of something with `flops`, `bytes` and `time_s`."""

    flops: float
    bytes: float
    time_s: float

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.time_s if self.time_s > 0 else 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.time_s if self.time_s > 0 else 0.0


@dataclass(frozen=True)
class OpPoint(_Rates):
    """One op on the roofline: its work and its time (measured or modelled)."""

    node: str
    op_type: str
    flops: float
    bytes: float
    time_s: float

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes if self.bytes else math.inf


@dataclass
class Utilisation(_Rates):
    """The seed's three figures for one model on one device, measured or modelled."""

    device: str
    measured: bool
    flops: float  # per run
    bytes: float  # per run
    time_s: float  # per run
    peak_flops: float
    peak_bandwidth: float
    power_w: float | None
    points: list[OpPoint] = field(default_factory=list)
    note: str = ""

    @property
    def compute_util(self) -> float:
        """Achieved FLOP/s / peak FLOP/s."""
        return self.flops_per_s / self.peak_flops if self.peak_flops else 0.0

    @property
    def bandwidth_util(self) -> float:
        """Achieved bytes/s / peak bytes/s."""
        return self.bytes_per_s / self.peak_bandwidth if self.peak_bandwidth else 0.0

    @property
    def tops_per_watt(self) -> float | None:
        """Achieved TFLOP/s (TOPS) per watt at the device's rated power (None if unknown)."""
        return self.flops_per_s / 1e12 / self.power_w if self.power_w else None

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else math.inf

    def row(self) -> dict:
        """The figures as a dict (fractions, TOPS/W or None)."""
        return {"device": self.device, "source": "measured" if self.measured else "modelled",
                "time_ms": self.time_s * 1e3, "gflops_per_s": self.flops_per_s / 1e9,
                "compute_util": self.compute_util, "bandwidth_util": self.bandwidth_util,
                "tops_per_watt": self.tops_per_watt}


def with_cores(device, cores: int):
    """The device with its compute peak multiplied by `cores` (for a CPU measured on one core)."""
    if cores < 1:
        raise ValueError("cores must be >= 1")
    return replace(device, name=f"{device.name} x{cores} cores" if cores > 1 else device.name,
                   peak_fp16_tflops=device.peak_fp16_tflops * cores,
                   peak_fp32_tflops=(device.peak_fp32_tflops or device.peak_fp16_tflops) * cores)


def with_peak(device, gflops: float, name: str | None = None):
    """The device with its compute peak set to `gflops` GFLOP/s (e.g. a measured onnxruntime MatMul)."""
    if not gflops > 0:
        raise ValueError("gflops must be > 0")
    return replace(device, name=name or device.name, peak_fp16_tflops=gflops / 1e3, peak_fp32_tflops=gflops / 1e3)


def ort_matmul_gflops(n: int = 1024, threads: int = 1, min_time: float = 0.5) -> float:
    """Measured fp32 GFLOP/s of onnxruntime's own MatMul kernel (n x n x n) with `threads` intra-op threads.

    The practical compute roof of this CPU for onnxruntime: the same kernels (MLAS) that run the models.
    A roof is a best case, so the fastest call counts (other work on the machine only slows calls down).
    """

    rng = np.random.default_rng(0)
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["c"], name="mm")],
                       [value_info("a", np.float32, [n, n])], [value_info("c", np.float32, [n, n])],
                       [tensor("b", rng.standard_normal((n, n)).astype(np.float32))])
    sess = session(model, "disable", threads)
    feeds = {"a": rng.standard_normal((n, n)).astype(np.float32)}
    t = bench(lambda: sess.run(["c"], feeds), min_time=min_time, warmup=2)
    return 2.0 * n**3 / min(t.samples) / 1e9


def _dtype_for(device) -> str:
    return "float32" if getattr(device, "precision", "fp16") == "fp32" else "float16"


def op_points(profile, costs) -> list[OpPoint]:
    """Per-op roofline points of one measured run (the profile's median run); ops without a cost are skipped."""
    table_ = cost_table(costs)
    out = []
    for e in profile.ops():
        if e.node in table_ and e.dur_us > 0:
            f, b = table_[e.node]
            out.append(OpPoint(e.node, e.op_type, f, b, e.dur_us * 1e-6))
    return out


def utilisation(measurement, costs, device, *, time: str = "run") -> Utilisation:
    """Measured figures: the cost model's work over a measured time per run.

    `measurement` is a `Profile` (time='run': wall time of a run; 'kernel': time inside kernels) or a
    time per run in seconds (e.g. a `Timing.median` from `fusionlab.timing`).
    """
    if time not in ("run", "kernel"):
        raise ValueError("time must be 'run' or 'kernel'")
    table_ = cost_table(costs)
    flops = sum(f for f, _ in table_.values())
    nbytes = sum(b for _, b in table_.values())
    if isinstance(measurement, (int, float)):
        if not measurement > 0:
            raise ValueError("time per run must be > 0 seconds")
        seconds, points, note = float(measurement), [], "time per run given"
    else:
        seconds = (measurement.run_us if time == "run" else measurement.kernel_us) * 1e-6
        points = op_points(measurement, costs)
        note = f"{time} time, median of {measurement.n_runs} profiled runs"
    return Utilisation(device=device.name, measured=True, flops=flops, bytes=nbytes, time_s=seconds,
                       peak_flops=device.peak_flops(_dtype_for(device)), peak_bandwidth=device.bandwidth,
                       power_w=device.power_w, points=points, note=note)


def modelled(graph, device, plan=None, *, dims: dict | None = None) -> Utilisation:
    """Figures predicted by the cost model (`fusionlab.cost.plan_cost`) for `graph` under `plan` on a device preset.

    Each kernel takes max(FLOPs / peak, bytes / bandwidth) + the device's launch overhead; float models
    run at the device's precision (fp16 on the Ascend presets).
    """

    device = devices.get(device)
    pc = cost.plan_cost(graph, plan, device, dims)
    points = [OpPoint(k.id, k.pattern, float(k.flops), float(k.bytes), k.time_s) for k in pc.kernels_detail]
    return Utilisation(device=device.name, measured=False, flops=float(pc.flops), bytes=float(pc.bytes_moved),
                       time_s=pc.latency_s, peak_flops=device.peak_flops(_dtype_for(device)),
                       peak_bandwidth=device.bandwidth, power_w=device.power_w, points=points,
                       note=f"cost model, {device.launch_overhead_us:g} us launch overhead per kernel "
                            f"({'with' if plan else 'without'} fusion)")


def meets_targets(u: Utilisation) -> dict[str, bool | None]:
    """Which of the seed's targets a result meets (None: cannot tell, e.g. power unknown)."""
    tpw = u.tops_per_watt
    return {"compute_util": u.compute_util > TARGETS["compute_util"],
            "bandwidth_util": u.bandwidth_util < TARGETS["bandwidth_util"],
            "tops_per_watt": None if tpw is None else tpw > TARGETS["tops_per_watt"]}


def peak_efficiency(device, dtype: str = "int8") -> float | None:
    """The best TOPS/W a device can reach at all: peak throughput / rated power (None if power unknown)."""
    if not device.power_w:
        return None
    return device.peak_flops(dtype) / 1e12 / device.power_w


def table(results: Iterable[Utilisation]) -> str:
    """Plain-text table of utilisation results with the seed's targets."""
    rows = [r.row() for r in results]
    head = (f"{'device':<32} {'source':<9} {'ms/run':>9} {'GFLOP/s':>10} {'compute':>8} {'bandwidth':>9} "
            f"{'TOPS/W':>7}")
    lines = [head]
    for r in rows:
        tpw = "-" if r["tops_per_watt"] is None else f"{r['tops_per_watt']:.3f}"
        lines.append(f"{r['device'][:32]:<32} {r['source']:<9} {r['time_ms']:>9.3f} {r['gflops_per_s']:>10.1f} "
                     f"{r['compute_util']:>7.1%} {r['bandwidth_util']:>9.1%} {tpw:>7}")
    lines.append(f"seed's targets: compute > {TARGETS['compute_util']:.0%}, bandwidth < {TARGETS['bandwidth_util']:.0%}, "
                 f"> {TARGETS['tops_per_watt']:g} TOPS/W")
    return "\n".join(lines)


def draw_roofline(device, results: Iterable[Utilisation] = (), ax=None, *, title: str | None = None,
                  ops: bool = True, targets: bool = True):
    """Roofline of `device` (log-log) with ops and whole-model points, and the seed's targets as lines."""
    import matplotlib.pyplot as plt

    results = list(results)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    peak = device.peak_flops(_dtype_for(device))
    bw = device.bandwidth
    intens = [p.intensity for r in results for p in r.points if math.isfinite(p.intensity) and p.intensity > 0]
    intens += [r.intensity for r in results if math.isfinite(r.intensity) and r.intensity > 0]
    ridge = peak / bw
    lo = min(intens + [ridge / 100]) / 2
    hi = max(intens + [ridge * 10]) * 2
    x = np.logspace(math.log10(lo), math.log10(hi), 200)
    ax.loglog(x, np.minimum(peak, bw * x) / 1e9, color="black", lw=2, label=f"roofline ({device.name})")
    if targets:
        ax.loglog(x, np.full_like(x, TARGETS["compute_util"] * peak) / 1e9, "--", color="tab:green",
                  label=f"{TARGETS['compute_util']:.0%} of peak compute (target: above)")
        ax.loglog(x, np.minimum(TARGETS["bandwidth_util"] * bw * x, peak) / 1e9, ":", color="tab:red",
                  label=f"{TARGETS['bandwidth_util']:.0%} of peak bandwidth (target: below)")
        if device.power_w:
            need = TARGETS["tops_per_watt"] * 1e12 * device.power_w
            ax.loglog(x, np.full_like(x, need) / 1e9, "-.", color="tab:purple",
                      label=f"{TARGETS['tops_per_watt']:g} TOPS/W at {device.power_w:g} W")
    markers = "os^Dv<>"
    for k, r in enumerate(results):
        if ops and r.points:
            pts = [p for p in r.points if math.isfinite(p.intensity) and p.intensity > 0 and p.flops > 0]
            ax.scatter([p.intensity for p in pts], [p.flops_per_s / 1e9 for p in pts], s=12, alpha=0.45,
                       marker=markers[k % len(markers)], label=f"ops: {r.device} ({'measured' if r.measured else 'modelled'})")
        if r.flops > 0 and math.isfinite(r.intensity):
            ax.scatter([r.intensity], [r.flops_per_s / 1e9], s=90, marker=markers[k % len(markers)],
                       edgecolor="black", zorder=5, label=f"whole model: {r.device}")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(title or f"roofline: {device.name}")
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.grid(True, which="major", alpha=0.3)
    return ax.figure
