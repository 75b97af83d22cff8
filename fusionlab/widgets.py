"""The fusion-threshold explorer: plain functions that tests and notebooks call, and a thin widget on top.

`explore_state` makes a plan for the chosen fusion kinds and thresholds and costs it on every device;
`sweep_group_size` is the curve behind "over-fusion": predicted latency and peak memory against the
largest group allowed; `measure` runs the fused model against the original on this CPU. `explore`
only wires ipywidgets controls to these functions.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
from dataclasses import dataclass, field

from . import cost, viz
from .cost.devices import Device, get as get_device, load_devices
from .graph import as_graph
from .passes import apply, fuse, options_for, plan as plan_passes
from .passes.rules import VERTICAL_RULES
from .plan import DEFAULT_PASSES, FusionPlan
from .text import text_table, wrap
from .timing import compare_models
from .verification.runtime import verify

__all__ = ["ExplorerResult", "make_plan", "explore_state", "change_line", "what_each_control_governs",
           "result_text", "result_html", "device_chart_html", "bar_width", "sweep_group_size", "sweep_table", "plot_sweep", "measure", "explore"]

KINDS = ("vertical", "horizontal", "mixed")
#: device name -> the precision its float models run in ("float16" on the Ascend presets, "float32" here)
_PRECISION: dict[str, str] = {}


def make_plan(model, kinds=DEFAULT_PASSES, max_group_ops: int | None = 5, buffer_kb: float | None = None,
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

    def counts(self):
        """The plan's accounting with the whole model's kernels on the chosen device (`FusionPlan.counts`)."""
        return self.plan.counts(self.cost, self.baseline)

    def summary(self) -> str:
        """Deterministic text: the setting, groups by kind, and predicted latency / peak memory."""
        running = self.plan.running()
        by_kind = {k: sum(1 for g in running if g.kind == k) for k in KINDS}
        b, c = self.baseline, self.cost
        return "\n".join([
            ", ".join(f"{k}={v}" for k, v in self.settings.items()),
            f"groups: {len(running)} ({', '.join(f'{k} {v}' for k, v in by_kind.items() if v) or 'none'}), "
            f"kernels {b.kernels} -> {c.kernels}",
            f"{c.device}: predicted {b.latency_s * 1e6:.1f} -> {c.latency_s * 1e6:.1f} us "
            f"({b.latency_s / c.latency_s:.2f}x), peak memory {b.peak_memory_bytes / 2**20:.2f} -> "
            f"{c.peak_memory_bytes / 2**20:.2f} MiB, traffic {b.bytes_moved / 2**20:.2f} -> "
            f"{c.bytes_moved / 2**20:.2f} MiB",
        ])

    def device_rows(self) -> list[dict]:
        """One row per device the result was costed on, in the table's order: unfused and planned kernels,
        latency (us) and peak memory (MiB), the speedup, the precision it runs, and whether it is the chosen one."""
        rows: dict[str, dict] = {}
        for r in self.devices.rows:
            rows.setdefault(r["device"], {})[r["plan"]] = r
        out = []
        for name, r in rows.items():
            u, f = r["unfused"], r["plan"]
            out.append({"device": name, "chosen": name == self.cost.device, "kernels": (u["kernels"], f["kernels"]),
                        "latency_us": (u["latency_s"] * 1e6, f["latency_s"] * 1e6), "speedup": f["speedup"],
                        "peak_MiB": (u["peak_MiB"], f["peak_MiB"]), "runs": _PRECISION.get(name, "")})
        return out

    def device_table(self) -> str:
        """Every device the result was costed on (the chosen one marked >): kernels, latency, peak memory."""
        cells = [[("> " if r["chosen"] else "  ") + r["device"], "{} -> {}".format(*r["kernels"]),
                  "{:.1f} -> {:.1f}".format(*r["latency_us"]), f"{r['speedup']:.2f}x",
                  "{:.2f} -> {:.2f}".format(*r["peak_MiB"]), r["runs"]] for r in self.device_rows()]
        return "\n".join(text_table(["device", "kernels", "latency us", "speedup", "peak MiB", "runs"], cells,
                                     rule=False))


def explore_state(model, max_group_ops: int | None = 5, buffer_kb: float | None = None, kinds=DEFAULT_PASSES,
                  device: str | Device = "Atlas 300I Pro", *, dims: dict | None = None, picture: bool = False,
                  devices: list | None = None, drop: tuple = ()) -> ExplorerResult:
    """Plan with these thresholds, cost it on `device` and on every preset; optionally draw the groups.

    `drop` names plan groups to leave unfused: the edited plan is what is costed, drawn and measured (an
    executable plan: `fusionlab.passes.apply` rewrites exactly it).
    """
    graph = as_graph(model)
    dev = get_device(device)
    plan = make_plan(graph, kinds, max_group_ops, buffer_kb, dims)
    known = {g.id for g in plan}
    if any(d in known for d in drop):
        plan = plan.without(*[d for d in drop if d in known])
    a = cost.Analysis(graph, dims, dev.precision)
    base = cost.plan_cost(graph, None, dev, analysis=a)
    fused = cost.plan_cost(graph, plan, dev, analysis=a)
    others = list(devices if devices is not None else load_devices().values())
    if dev.name not in {get_device(d).name for d in others}:
        others.append(dev)  # "this machine" (or a custom device) is a row like the presets
    for d in others:
        d = get_device(d)
        _PRECISION[d.name] = "float32" if d.precision == "fp32" else "float16"
    table = cost.compare(graph, {"unfused": None, "plan": plan}, others, dims=dims)
    fig = None
    if picture:
        fig = viz.draw(graph, plan, title=f"{len(plan.running())} groups, max {max_group_ops} ops per group")
    settings = {"kinds": "+".join(kinds), "max_group_ops": max_group_ops, "buffer_kb": buffer_kb, "device": dev.name}
    if drop:
        settings["dropped"] = ",".join(d for d in drop if d in known) or "none"
    return ExplorerResult(plan, fused, base, table, fig, settings)


def change_line(before: ExplorerResult, after: ExplorerResult) -> str:
    """One line saying what a control change did, and why a number did not move.

    E.g. "max_group_ops 5 -> 3: 4 more group(s), 6 more launches, latency +3.1%, peak memory unchanged (...)"."""
    moved = [k for k in after.settings if before.settings.get(k) != after.settings.get(k)]
    b, a = before.cost, after.cost
    cb, ca = before.plan.counts(), after.plan.counts()
    same_plan = _layout(before.plan) == _layout(after.plan)
    dg, dk = ca.groups - cb.groups, a.kernels - b.kernels
    parts = []
    if same_plan:
        parts.append(f"same plan ({_why_same(before, after, moved)})")
    elif dg:
        parts.append(f"{abs(dg)} {'more' if dg > 0 else 'fewer'} group(s)")
    else:
        parts.append("as many groups, regrouped")
    if dk:
        parts.append(f"{abs(dk)} {'more' if dk > 0 else 'fewer'} launches")
    elif same_plan:
        parts.append("same launches")
    else:  # regrouped: a larger group may take only part of an earlier group's lowering (`FusionPlan.left_over`)
        parts.append(f"same launches (the fused model runs {a.kernels} kernels either way)")
    lat = f"latency {_pct(a.latency_s, b.latency_s)}"
    if a.latency_s == b.latency_s and not same_plan:
        lat += " (same kernels' bytes and FLOPs)"
    parts.append(lat)
    peak = f"peak memory {_pct(a.peak_memory_bytes, b.peak_memory_bytes)}"
    pb, pa = _PRECISION.get(b.device), _PRECISION.get(a.device)
    if pb and pa and pb != pa:
        peak += f" ({a.device} runs {pa}, {b.device} {pb}: {'twice' if pa == 'float32' else 'half'} the bytes a value)"
    elif a.peak_memory_bytes == b.peak_memory_bytes:
        peak += " (the largest live tensors stay the same)"
    parts.append(peak)
    head = ", ".join(f"{k} {before.settings.get(k)} -> {after.settings.get(k)}" for k in moved) or "no change"
    return f"{head}: " + ", ".join(parts)


def _layout(plan: FusionPlan) -> list:
    return [(g.kind, tuple(g.covers), g.kernels) for g in plan.running()]


def _why_same(before: ExplorerResult, after: ExplorerResult, moved: list[str]) -> str:
    """Why a control change left the plan as it was, in a few words."""
    if moved == ["device"]:
        return "a device prices the plan; the passes do not look at it"
    if "max_group_ops" in moved:
        largest = max((g.size for g in after.plan.running() if g.kind == "mixed"), default=0)
        lo = min(x for x in (before.settings.get("max_group_ops"), after.settings.get("max_group_ops")) if x)
        if not largest:
            return "max ops splits mixed groups and stops vertical chains; none reached either limit"
        if largest <= lo:
            return f"no group needed more than {lo} ops"
    if "buffer_kb" in moved:
        return "no group's tiles outgrew the buffer"
    if "kinds" in moved:
        return "the kinds added or removed found nothing of their own"
    return "no group was at a limit the change moved"


def _pct(new: float, old: float) -> str:
    if not old or new == old:
        return "unchanged" if new == old else "n/a"
    return f"{(new - old) / old:+.1%}"


def what_each_control_governs(plan: FusionPlan) -> str:
    """The explorer's legend: which groups the size limit can split and which it cannot, and why."""

    fixed = sorted({g.rule for g in plan if any(g.rule in r.names and r.fixed for r in VERTICAL_RULES)})
    lines = ["max ops: the most ops one group may hold; a vertical chain (Conv+BN+act, MatMul+Add+act) stops",
             "growing there, a mixed group splits. UB KiB: the on-chip buffer a mixed group's tiles may fill.",
             "Horizontal groups are not limited by either: they concatenate siblings into one wide op per step."]
    if fixed:
        lines.append(f"Not split by max ops: {', '.join(fixed)}: each is one runtime op (e.g. a decomposed GELU is "
                     "one Gelu kernel), so a part of it would be no kernel at all.")
    return "\n".join(lines)


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
    """The sweep as a plain-text table, a column per key ('max_group_ops' headed 'max group ops', over two lines)."""
    keys = list(rows[0]) if rows else []
    cells = [[str(r[k]) for k in keys] for r in rows]
    return "\n".join(text_table([k.replace("_", " ") for k in keys], cells, rule=False, align="right"))


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


def measure(model, kinds=DEFAULT_PASSES, max_group_ops: int | None = 5, buffer_kb: float | None = None, *,
            dims: dict | None = None, min_time: float = 1.0, plan: FusionPlan | None = None):
    """Fuse with these settings (or apply `plan`, e.g. an edited one), verify, and time both here (1 thread)."""

    graph = as_graph(model)
    if plan is not None:
        result = apply(graph, plan)
    else:
        result = fuse(graph, passes=list(kinds), **options_for(kinds, max_group_ops=max_group_ops,
                                                                buffer_kb=buffer_kb, dims=dims))
    report = verify(graph, result.graph, dims=dims)
    if not report.ok:
        raise ValueError("the fused model does not match the original:\n" + report.table())
    return compare_models(graph, result.graph, dims=dims, min_time=min_time, label_a="original", label_b="fused")


#: Tallest the explorer's picture may be (px): it is scaled to fit, never scrolled, so the result stays on screen.
PICTURE_MAX_PX = 480


def bar_width(value: float, unfused: float) -> float:
    """A bar's width in percent of its row's unfused bar: each device is drawn on its own scale (this machine
    is a thousand times slower than an Ascend part), so a bar shows what fusion does there, its label the value."""
    if unfused <= 0:
        return 0.0
    return round(max(0.0, min(100.0, 100.0 * value / unfused)), 1)


def device_chart_html(res: ExplorerResult) -> str:
    """The devices as a small table with bars: per device (the chosen one marked >) kernels, predicted latency
    and peak memory, unfused (grey) against the plan (coloured) on the device's own scale, and the precision run."""

    def bars(pair, fmt: str, unit: str, colour: str) -> str:
        before, after = pair
        return (f'<td class="fl-bars"><span class="fl-bar-pair">'
                f'<span class="fl-bar fl-bar-unfused" style="width: {bar_width(before, before)}%"></span>'
                f'<span class="fl-bar fl-bar-plan" style="width: {bar_width(after, before)}%; background: {colour}">'
                f'</span></span><span class="fl-num">{fmt.format(before)} &rarr; {fmt.format(after)} {unit}</span></td>')

    head = ("<tr><th>device</th><th>kernels</th><th>predicted latency</th><th>speedup</th>"
            "<th>peak memory</th><th>runs</th></tr>")
    body = []
    for r in res.device_rows():
        name = ("&gt; " if r["chosen"] else "") + html.escape(r["device"])
        body.append(f'<tr class="{"fl-chosen" if r["chosen"] else ""}"><td class="fl-device">{name}</td>'
                    f'<td>{r["kernels"][0]} &rarr; {r["kernels"][1]}</td>'
                    + bars(r["latency_us"], "{:.1f}", "us", "#2b7bba") + f'<td>{r["speedup"]:.2f}x</td>'
                    + bars(r["peak_MiB"], "{:.2f}", "MiB", "#c0504d") + f'<td>{html.escape(r["runs"])}</td></tr>')
    legend = ('<caption>per device: grey bar unfused, coloured bar the plan, on that device\'s own scale'
              '</caption>')
    return f'<table class="fl-explorer-devices">{legend}<thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'


def result_text(res: ExplorerResult) -> str:
    """What the explorer prints for one setting: the summary, the plan's counts, the devices side by side."""
    return "\n".join([wrap(res.summary()), wrap(res.counts().line()), res.device_table()])


def result_html(head: str, res: ExplorerResult) -> str:
    """The explorer's result as shown: a few lines of text (what changed, the setting, the plan's counts), the
    devices as a table with bars (`device_chart_html`) and the controls' legend folded away."""

    text = "\n".join([wrap(head), wrap(res.summary()), wrap(res.counts().line())])
    return (f'<pre class="fl-explorer-text">{html.escape(text)}</pre>{device_chart_html(res)}'
            f'<details class="fl-explorer-legend"><summary>what each control governs</summary>'
            f'<pre class="fl-explorer-text">{html.escape(what_each_control_governs(res.plan))}</pre></details>')


#: Shown instead of ipywidgets' red "disconnected" icon on every control of a stored (kernel-less) explorer.
STORED_NOTE = "A stored view of the explorer: run the notebook (Run > Run All Cells) to use its controls."
#: Inside the explorer's box: hide the per-control icons, show the one note while no kernel is connected, and
#: wrap the result's lines at spaces (JupyterLab's output style breaks a line anywhere, mid-word).
_STYLE = """<style>
.fl-explorer.jupyter-widgets-disconnected::before, .fl-explorer .jupyter-widgets-disconnected::before { display: none; }
.fl-explorer .fl-explorer-stored { display: none; color: var(--jp-ui-font-color2); }
.fl-explorer.jupyter-widgets-disconnected .fl-explorer-stored { display: block; }
.fl-explorer .fl-explorer-text { white-space: pre-wrap; word-break: normal; overflow-wrap: normal; margin: 0;
  font-family: var(--jp-code-font-family); font-size: var(--jp-code-font-size); line-height: 1.3; }
.fl-explorer .fl-explorer-picture img { max-width: 100%; max-height: %dpx; object-fit: contain; }
.fl-explorer .fl-explorer-devices { border-collapse: collapse; margin: 4px 0; font-size: var(--jp-ui-font-size1); }
.fl-explorer .fl-explorer-devices caption { caption-side: bottom; text-align: left; color: var(--jp-ui-font-color2);
  font-size: var(--jp-ui-font-size0); padding-top: 2px; }
.fl-explorer .fl-explorer-devices th, .fl-explorer .fl-explorer-devices td { padding: 1px 8px; white-space: nowrap;
  text-align: left; border-bottom: 1px solid var(--jp-border-color2); }
.fl-explorer .fl-explorer-devices tr.fl-chosen td { font-weight: bold; }
.fl-explorer .fl-bar-pair { display: inline-block; position: relative; width: 90px; height: 14px;
  vertical-align: middle; margin-right: 6px; }
.fl-explorer .fl-bar { display: inline-block; position: absolute; left: 0; height: 6px; }
.fl-explorer .fl-bar-unfused { top: 0; }
.fl-explorer .fl-bar-plan { top: 8px; }
.fl-explorer .fl-bar-unfused { background: #b8b8b8; }
.fl-explorer .fl-num { font-family: var(--jp-code-font-family); }
.fl-explorer details summary { cursor: pointer; color: var(--jp-ui-font-color2); }
</style>""".replace("%d", str(PICTURE_MAX_PX))


class ExplorerBox:
    """Mixin for the explorer's box: shows its last result as text where widgets do not render."""

    last_text = ""

    def _repr_mimebundle_(self, **kwargs):
        data = super()._repr_mimebundle_(**kwargs)
        note = "(a live explorer: run the notebook to use its controls)"
        data["text/plain"] = f"{self.last_text}\n{note}"
        data["text/html"] = f"<pre>{html.escape(self.last_text)}</pre><p><i>{note}</i></p>"
        return data


_EXPLORERS: dict[str, list] = {}


def _explorer_key(graph, kinds, max_group_ops, buffer_kb, device) -> str:
    what = repr((graph.name, len(graph), tuple(kinds), max_group_ops, buffer_kb, device))
    return "fusionlab-explorer-" + hashlib.sha1(what.encode()).hexdigest()[:12]


class _StableIds:
    """Widgets made inside get model ids `key-000`, `key-001`, ... instead of random ones.

    The notebook stores the widgets' state (ids and all) when it is built; a learner's Run All in a fresh kernel
    then makes the same ids, so the output a save writes names models that the stored state holds, and the
    reopened notebook renders them (with random ids it shows "Error displaying widget: model not found").
    Running the cell again in the same kernel closes the previous explorer's widgets and reuses their ids."""

    def __init__(self, key: str):
        self.key, self.made = key, []

    def __enter__(self):
        from ipywidgets import comm as wcomm

        for old in _EXPLORERS.pop(self.key, []):
            old.close()
        self._create = wcomm.create_comm
        count = iter(range(10**6))

        def create(*args, **kwargs):
            if kwargs.get("target_name") == "jupyter.widget" and not kwargs.get("comm_id"):
                kwargs["comm_id"] = f"{self.key}-{next(count):03d}"
            return self._create(*args, **kwargs)

        wcomm.create_comm = create
        return self

    def __exit__(self, *exc):
        from ipywidgets import comm as wcomm
        from ipywidgets.widgets.widget import _instances

        wcomm.create_comm = self._create
        _EXPLORERS[self.key] = [w for k, w in list(_instances.items()) if k.startswith(self.key + "-")]


def explore(model, *, dims: dict | None = None, max_group_ops: int = 5, device: str = "Atlas 300I Pro",
            buffer_kb: int = 0, kinds=DEFAULT_PASSES):
    """An ipywidgets explorer over `explore_state` and `measure`: controls, what changed, result, picture.

    `kinds`: the passes selected at the start (default: those `fuse` runs; the thresholds govern the mixed pass)."""
    import ipywidgets as w

    graph = as_graph(model)
    with _StableIds(_explorer_key(graph, kinds, max_group_ops, buffer_kb, device)):
        c = _controls(w, max_group_ops, buffer_kb, device, kinds)
        measured, result = w.Output(), w.HTML()
        picture = w.Output(layout=w.Layout(max_height=f"{PICTURE_MAX_PX + 20}px", overflow="hidden",
                                           border="1px solid #ddd"))
        for widget, name in ((measured, "measured"), (result, "result"), (picture, "picture")):
            widget.add_class(f"fl-explorer-{name}")
        note = w.HTML(_STYLE + f'<div class="fl-explorer-stored">{STORED_NOTE}</div>')
        box_cls = type("Explorer", (ExplorerBox, w.VBox), {})
        box = box_cls([note, w.HBox([c["ops"], c["buf"]]), w.HBox([c["kinds"], c["dev"], c["drop"], c["button"]]),
                       measured, result, picture])
        box.add_class("fl-explorer")
    state = {"last": None, "first": None}

    def show(*_):
        res = explore_state(graph, c["ops"].value, c["buf"].value or None, c["kinds"].value or DEFAULT_PASSES,
                            c["dev"].value, dims=dims, drop=tuple(c["drop"].value))
        kept = [g.id for g in make_plan(graph, c["kinds"].value or DEFAULT_PASSES, c["ops"].value,
                                        c["buf"].value or None, dims)]
        if list(c["drop"].options) != kept:
            c["drop"].options = kept  # the groups of the current setting; a dropped id that no longer exists goes
        if state["last"] is None:
            head, state["first"] = "initial setting", res
        else:
            head = change_line(state["last"], res)
            if state["first"].settings != state["last"].settings:  # several steps: also what they add up to
                head += "\nsince the initial setting, " + change_line(state["first"], res)
        before, state["last"] = state["last"], res
        box.last_text = "\n".join([wrap(head), result_text(res), what_each_control_governs(res.plan)])
        result.value = result_html(head, res)
        _draw_to(picture, graph, res, before)

    def run_measure(_):
        _print_to(measured, "measuring (apply the plan shown, verify, interleaved timing)...")
        cmp = measure(graph, dims=dims, plan=state["last"].plan)
        _print_to(measured, cmp.table())

    for control in (c["ops"], c["buf"], c["kinds"], c["dev"], c["drop"]):
        control.observe(show, names="value")
    c["button"].on_click(run_measure)
    show()
    from IPython.display import display

    display(box)
    return box


def _controls(w, max_group_ops: int, buffer_kb: int, device: str, kinds=DEFAULT_PASSES) -> dict:
    ops = w.IntSlider(value=max_group_ops, min=1, max=16, description="max ops", continuous_update=False,
                      tooltip="the most ops one fused group may hold")
    buf = w.IntSlider(value=buffer_kb, min=0, max=512, step=16, description="UB KiB", continuous_update=False,
                      tooltip="on-chip buffer a mixed group's tiles may fill (0 = no limit)")
    kinds = w.SelectMultiple(options=KINDS, value=tuple(kinds), description="kinds", rows=3)
    dev = w.Dropdown(options=list(load_devices()) + ["this machine"], value=device, description="device",
                     layout=w.Layout(width="max-content"))
    drop = w.SelectMultiple(options=[], description="drop", rows=3, layout=w.Layout(width="170px"),
                            tooltip="leave these plan groups unfused (the edited plan is costed and measured)")
    button = w.Button(description="measure on this CPU", icon="stopwatch",
                      layout=w.Layout(width="auto", min_width="210px", flex="0 0 auto"),
                      tooltip="apply the plan shown, verify, and time both models here (a few seconds)")
    controls = {"ops": ops, "buf": buf, "kinds": kinds, "dev": dev, "drop": drop, "button": button}
    css = {"ops": "ops", "buf": "buffer", "kinds": "kinds", "dev": "device", "drop": "drop", "button": "measure"}
    for name, widget in controls.items():
        widget.add_class(f"fl-explorer-{css[name]}")  # the browser test finds the controls by these classes
    return controls


def _print_to(out, text: str) -> None:
    out.clear_output(wait=True)
    with out:
        print(text)


#: models up to this many nodes are drawn whole; bigger ones around the groups the last change touched
WHOLE_PICTURE_NODES = 40


def changed_nodes(before: ExplorerResult | None, after: ExplorerResult, limit: int = 24) -> list[str]:
    """Nodes of the groups that a change made, split or removed (the first groups if nothing came before)."""
    if before is None:
        groups = list(after.plan)[:3]
    else:
        old = {tuple(g.covers) for g in before.plan}
        new = {tuple(g.covers) for g in after.plan}
        groups = [g for g in after.plan if tuple(g.covers) not in old] + \
                 [g for g in before.plan if tuple(g.covers) not in new]
    out: list[str] = []
    for g in groups:
        out += [n for n in g.covers if n not in out]
        if len(out) >= limit:
            break
    return out[:limit]


def _draw_to(out, graph, res: ExplorerResult, before: ExplorerResult | None = None) -> None:
    import matplotlib.pyplot as plt
    from IPython.display import HTML, display

    out.clear_output(wait=True)
    title = f"{len(res.plan.running())} groups, max {res.settings['max_group_ops']} ops per group"
    nodes = None
    if len(graph) > WHOLE_PICTURE_NODES:
        nodes = viz.neighbourhood(graph, changed_nodes(before, res) or [n.name for n in list(graph)[:8]], hops=1)
        title += f" (around what changed: {len(nodes)} of {len(graph)} nodes)"
    fig = viz.draw(graph, res.plan, nodes=nodes, title=title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    with out:  # scaled to fit the box (CSS in _STYLE), not a scroll box inside the notebook's own
        display(HTML(f'<img alt="{title}" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'))
