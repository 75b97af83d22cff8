"""The fusion-threshold explorer: plain functions that tests and notebooks call, and a thin widget on top.

`explore_state` makes a plan for the chosen fusion kinds and thresholds and costs it on every device;
`sweep_group_size` is the curve behind "over-fusion": predicted latency and peak memory against the
largest group allowed; `measure` runs the fused model against the original on this CPU. `explore`
only wires ipywidgets controls to these functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import cost
from .cost.devices import Device, get as get_device, load_devices
from .graph import as_graph
from .passes import options_for, plan as plan_passes
from .plan import FusionPlan
from .text import text_table

__all__ = ["ExplorerResult", "make_plan", "explore_state", "sweep_group_size", "sweep_table", "plot_sweep",
           "measure", "explore"]

KINDS = ("vertical", "horizontal", "mixed")




def make_plan(model, kinds=KINDS, max_group_ops: int | None = 5, buffer_kb: float | None = None,
              dims: dict | None = None, *, allow_recompute: bool = False) -> FusionPlan:
    """The plan of the chosen passes in order (`fusionlab.passes.plan`, the one planner), under these thresholds."""
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown fusion kind {kind!r}; choose from {', '.join(KINDS)}")
    graph = as_graph(model)
    return plan_passes(graph, list(kinds), **options_for(kinds, max_group_ops=max_group_ops, buffer_kb=buffer_kb,
                                                          dims=dims, allow_recompute=allow_recompute))


@dataclass
class ExplorerResult:
    """What the explorer shows for one setting: the plan, its cost on the chosen device, all devices."""

    plan: FusionPlan
    cost: cost.PlanCost
    baseline: cost.PlanCost
    devices: cost.CostTable
    figure: object = None
    settings: dict = field(default_factory=dict)

    def summary(self) -> str:
        """Deterministic text: the setting, groups by kind, and predicted latency / peak memory."""
        by_kind = {k: len(self.plan.by_kind(k)) for k in KINDS if len(self.plan.by_kind(k))}
        b, c = self.baseline, self.cost
        return "\n".join([
            ", ".join(f"{k}={v}" for k, v in self.settings.items()),
            f"groups: {len(self.plan)} ({', '.join(f'{k} {v}' for k, v in by_kind.items()) or 'none'}), "
            f"kernels {b.kernels} -> {c.kernels}",
            f"{c.device}: predicted {b.latency_s * 1e6:.1f} -> {c.latency_s * 1e6:.1f} us "
            f"({b.latency_s / c.latency_s:.2f}x), peak memory {b.peak_memory_bytes / 2**20:.2f} -> "
            f"{c.peak_memory_bytes / 2**20:.2f} MiB, traffic {b.bytes_moved / 2**20:.2f} -> "
            f"{c.bytes_moved / 2**20:.2f} MiB",
        ])


def explore_state(model, max_group_ops: int | None = 5, buffer_kb: float | None = None, kinds=KINDS,
                  device: str | Device = "Atlas 300I Pro", *, dims: dict | None = None, picture: bool = False,
                  devices: list | None = None) -> ExplorerResult:
    """Plan with these thresholds, cost it on `device` and on every preset; optionally draw the groups."""
    graph = as_graph(model)
    dev = get_device(device)
    plan = make_plan(graph, kinds, max_group_ops, buffer_kb, dims)
    a = cost.Analysis(graph, dims, dev.precision)
    base = cost.plan_cost(graph, None, dev, analysis=a)
    fused = cost.plan_cost(graph, plan, dev, analysis=a)
    others = devices if devices is not None else list(load_devices().values())
    table = cost.compare(graph, {"unfused": None, "plan": plan}, others, dims=dims)
    fig = None
    if picture:
        from . import viz

        fig = viz.draw(graph, plan, title=f"{len(plan)} groups, max {max_group_ops} ops per group")
    settings = {"kinds": "+".join(kinds), "max_group_ops": max_group_ops, "buffer_kb": buffer_kb, "device": dev.name}
    return ExplorerResult(plan, fused, base, table, fig, settings)


def sweep_group_size(model, sizes=(1, 2, 3, 4, 5, 6, 8, 12, 16), device: str | Device = "Atlas 300I Pro", *,
                     kinds=("mixed",), buffer_kb: float | None = None, dims: dict | None = None,
                     ub_kb: float | None = None, allow_recompute: bool = False) -> list[dict]:
    """Predicted cost for each largest-group size: groups, kernels, latency, traffic, UB footprint, peak memory.

    `buffer_kb` is the mixed pass's per-group budget (it splits a group that does not fit at 16 KiB tiles);
    `ub_kb` overrides the UB one kernel's tiles share in the cost model (default: one core's UB);
    `allow_recompute` lets the mixed pass copy cheap multi-consumer ops into each consumer's group.
    `ub_KiB` is the largest group's UB footprint at 16 KiB tiles, `DMA_x` how much longer the plan's transfers
    take than at full bandwidth (tiles below 16 KiB), `recomputed` the node copies the plan runs.
    """
    graph = as_graph(model)
    dev = get_device(device)
    a = cost.Analysis(graph, dims, dev.precision)
    base = cost.plan_cost(graph, None, dev, analysis=a, buffer_kb=ub_kb)
    rows = []
    for size in sizes:
        plan = make_plan(graph, kinds, size, buffer_kb, dims, allow_recompute=allow_recompute)
        c = cost.plan_cost(graph, plan, dev, analysis=a, buffer_kb=ub_kb)
        moved = sum(k.bytes for k in c.kernels_detail) or 1
        rows.append({
            "max_group_ops": size, "groups": len(plan), "largest": max((g.size for g in plan), default=1),
            "kernels": c.kernels, "latency_us": round(c.latency_s * 1e6, 2),
            "speedup": round(base.latency_s / c.latency_s, 3), "MiB_moved": round(c.bytes_moved / 2**20, 3),
            "ub_KiB": round(max((k.working_set for k in c.groups()), default=0) / 1024, 1),
            "DMA_x": round(sum(k.bytes * k.transfer_factor for k in c.kernels_detail) / moved, 3),
            "recomputed": sum(k.recomputed for k in c.kernels_detail),
            "peak_MiB": round(c.peak_memory_bytes / 2**20, 3),
            "peak_vs_unfused": round(c.peak_memory_bytes / base.peak_memory_bytes, 3),
        })
    return rows


def sweep_table(rows: list[dict]) -> str:
    """The sweep as a plain-text table."""
    header = list(rows[0]) if rows else []
    cells = [[str(r[h]) for h in header] for r in rows]
    return "\n".join(text_table(header, cells, rule=False, align="right"))


def plot_sweep(rows: list[dict], ax=None, title: str | None = None):
    """Latency (left axis) and peak memory (right axis) against the largest group allowed."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 3.6))
    else:
        fig = ax.figure
    xs = [r["max_group_ops"] for r in rows]
    ax.plot(xs, [r["latency_us"] for r in rows], "o-", color="tab:blue", label="predicted latency")
    ax.set_xlabel("max ops per fused group")
    ax.set_ylabel("predicted latency (us)", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(xs, [r["peak_MiB"] for r in rows], "s--", color="tab:red", label="peak memory")
    ax.set_xticks(xs)
    ax2.set_ylabel("predicted peak memory (MiB)", color="tab:red")
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def measure(model, kinds=KINDS, max_group_ops: int | None = 5, buffer_kb: float | None = None, *,
            dims: dict | None = None, min_time: float = 1.0):
    """Fuse with these settings, verify against the original, and time both on this CPU (1 thread)."""
    from .passes import fuse
    from .runtime import verify
    from .timing import compare_models

    graph = as_graph(model)
    result = fuse(graph, passes=list(kinds), **options_for(kinds, max_group_ops=max_group_ops, buffer_kb=buffer_kb,
                                                            dims=dims))
    report = verify(graph, result.graph, dims=dims)
    if not report.ok:
        raise ValueError("the fused model does not match the original:\n" + report.table())
    return compare_models(graph, result.graph, dims=dims, min_time=min_time, label_a="original", label_b="fused")


def explore(model, *, dims: dict | None = None, max_group_ops: int = 5, device: str = "Atlas 300I Pro"):
    """An ipywidgets explorer over `explore_state`, `sweep_group_size` and `measure` (thin layer)."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display

    graph = as_graph(model)
    ops = w.IntSlider(value=max_group_ops, min=1, max=16, description="max ops", continuous_update=False)
    buf = w.IntSlider(value=0, min=0, max=512, step=16, description="UB KiB", continuous_update=False,
                      tooltip="buffer budget the mixed pass may fill per group (0 = no limit)")
    kinds = w.SelectMultiple(options=KINDS, value=KINDS, description="kinds")
    dev = w.Dropdown(options=list(load_devices()) + ["this machine"], value=device, description="device")
    button = w.Button(description="measure on this CPU")
    out, measured = w.Output(), w.Output()

    def show(*_):
        out.clear_output(wait=True)
        with out:
            res = explore_state(graph, ops.value, buf.value or None, kinds.value or ("vertical",), dev.value,
                                dims=dims, picture=len(graph) <= 80)
            print(res.summary())
            print(res.plan.table(max_rows=15))
            print(res.devices.table())
            if res.figure is not None:
                display(res.figure)
                plt.close(res.figure)

    def run_measure(_):
        measured.clear_output(wait=True)
        with measured:
            print("measuring (fuse, verify, interleaved timing)...")
            print(measure(graph, kinds.value or ("vertical",), ops.value, buf.value or None, dims=dims).table())

    for c in (ops, buf, kinds, dev):
        c.observe(show, names="value")
    button.on_click(run_measure)
    show()
    box = w.VBox([w.HBox([ops, buf]), w.HBox([kinds, dev, button]), out, measured])
    display(box)
    return box
