"""Profiling onnxruntime runs: an msprof-style op table, launch gaps, a timeline and a Perfetto trace.

onnxruntime's profiler writes a Chrome-trace JSON file: one ``"Node"`` event per kernel (``dur`` and
``ts`` in µs, ``args.op_name``, the thread in ``tid``) and one ``"Session"`` ``model_run`` event per
`InferenceSession.run`. `profile_model` runs a model with the profiler on, parses that file into a
`Profile` and deletes it. A `Profile` answers the questions msprof's ``op_summary`` answers on Ascend:
which kernel ran when, for how long, and how long the device sat idle before it (``Task Wait Time``,
computed as msprof does: the gap since the previous kernel ended). `write_trace` writes one or more
profiles as a trace file that opens in Perfetto (ui.perfetto.dev) or chrome://tracing.

`runner` builds the run configurations the seed's three fixes compare (parallel execution, memory
arena, IO binding, intra-op threads) as zero-argument callables for `fusionlab.timing.compare`.
"""

from __future__ import annotations

import html
import json
import os
import statistics
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import onnxruntime as ort

from .files import atomic_write
from .graph import ModelError
from .text import MAX_WIDTH
from .verification import runtime

__all__ = [
    "OpEvent", "RunSpan", "Profile", "profile_model", "parse_events", "load_trace", "write_trace", "side_by_side",
    "draw_timeline", "draw_op_types", "runner",
]


@dataclass(frozen=True)
class OpEvent:
    """One kernel execution, times in µs; `start_us` counts from the start of its run."""

    run: int
    node: str
    op_type: str
    start_us: float
    dur_us: float
    wait_us: float
    lane: int
    provider: str = ""

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


@dataclass(frozen=True)
class RunSpan:
    """One `InferenceSession.run` (onnxruntime's ``model_run`` event): absolute start and duration in µs."""

    index: int
    ts_us: float
    dur_us: float


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def _union_length(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, -np.inf
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


@dataclass
class Profile:
    """Parsed profile of several runs of one model (the warm-up runs already dropped)."""

    events: list[OpEvent]
    runs: list[RunSpan]
    lanes: dict[int, int] = field(default_factory=dict)  # onnxruntime tid -> lane index
    trace: list[dict] = field(default_factory=list)  # the raw Chrome-trace events of the kept runs
    label: str = ""
    config: dict = field(default_factory=dict)

    # -- per run -----------------------------------------------------------------------------------
    @property
    def n_runs(self) -> int:
        return len(self.runs)

    def ops(self, run: int | None = None) -> list[OpEvent]:
        """The kernels of one run (default: the median run) in start order."""
        r = self.median_run() if run is None else run
        return [e for e in self.events if e.run == r]

    def median_run(self) -> int:
        """Index of the run whose duration is the (lower) median: the representative one."""
        if not self.runs:
            raise ValueError("profile has no runs")
        order = sorted(self.runs, key=lambda s: (s.dur_us, s.index))
        return order[(len(order) - 1) // 2].index

    def _per_run(self, fn: Callable[[list[OpEvent], RunSpan], float]) -> float:
        return _median([fn([e for e in self.events if e.run == s.index], s) for s in self.runs])

    # -- summary numbers (medians over runs) --------------------------------------------------------
    @property
    def ops_per_run(self) -> int:
        """Kernels launched per run."""
        return int(round(self._per_run(lambda ev, s: len(ev))))

    @property
    def run_us(self) -> float:
        """Median wall time of one run (``model_run``)."""
        return self._per_run(lambda ev, s: s.dur_us)

    @property
    def kernel_us(self) -> float:
        """Median per-run sum of kernel durations."""
        return self._per_run(lambda ev, s: sum(e.dur_us for e in ev))

    @property
    def busy_us(self) -> float:
        """Median per-run time during which at least one kernel was running."""
        return self._per_run(lambda ev, s: _union_length((e.start_us, e.end_us) for e in ev))

    @property
    def gap_us(self) -> float:
        """Median per-run time with no kernel running: launch gaps, scheduling and run overhead."""
        return self._per_run(lambda ev, s: max(0.0, s.dur_us - _union_length((e.start_us, e.end_us) for e in ev)))

    @property
    def wait_us(self) -> float:
        """Median per-run sum of msprof-style wait times (gaps before each kernel)."""
        return self._per_run(lambda ev, s: sum(e.wait_us for e in ev))

    @property
    def n_lanes(self) -> int:
        return len(self.lanes) or 1

    def by_op_type(self) -> dict[str, dict]:
        """{op type: {count, time_us, share}} per run (medians over runs), biggest time first."""
        types = sorted({e.op_type for e in self.events})
        rows = {}
        kernel = self.kernel_us or 1.0
        for t in types:
            count = self._per_run(lambda ev, s: sum(1 for e in ev if e.op_type == t))
            time_us = self._per_run(lambda ev, s: sum(e.dur_us for e in ev if e.op_type == t))
            rows[t] = {"count": int(round(count)), "time_us": time_us, "share": time_us / kernel}
        return dict(sorted(rows.items(), key=lambda kv: (-kv[1]["time_us"], kv[0])))

    def summary(self) -> dict:
        """The headline numbers (medians over runs, µs)."""
        return {"runs": self.n_runs, "ops_per_run": self.ops_per_run, "run_us": self.run_us,
                "kernel_us": self.kernel_us, "busy_us": self.busy_us, "gap_us": self.gap_us,
                "wait_us": self.wait_us, "lanes": self.n_lanes}

    # -- msprof-style op table ----------------------------------------------------------------------
    def op_rows(self, run: int | None = None) -> list[dict]:
        """One dict per kernel of a run with msprof ``op_summary``-like keys (times in µs)."""
        ops = self.ops(run)
        total = sum(e.dur_us for e in ops) or 1.0
        return [{"Op Name": e.node, "OP Type": e.op_type, "Thread": e.lane,
                 "Task Start Time(us)": e.start_us, "Task Duration(us)": e.dur_us,
                 "Task Wait Time(us)": e.wait_us, "Share(%)": 100.0 * e.dur_us / total} for e in ops]

    def op_table(self, run: int | None = None, top: int | None = None, sort: str = "start") -> str:
        """The op table of one run (default: the median run) as text; `sort` is 'start' or 'duration'."""
        rows = self.op_rows(run)
        if sort == "duration":
            rows = sorted(rows, key=lambda r: (-r["Task Duration(us)"], r["Task Start Time(us)"]))
        elif sort != "start":
            raise ValueError("sort must be 'start' or 'duration'")
        shown = rows if top is None else rows[:top]
        twidth = max([len("OP Type")] + [len(r["OP Type"]) for r in shown])
        # the name column takes what the notebook's width leaves (the other columns need 55 characters and the type)
        cap = min(40, MAX_WIDTH - 55 - twidth)
        width = max([len("Op Name")] + [min(len(r["Op Name"]), cap) for r in shown])
        head = (f"{'Op Name':<{width}}  {'OP Type':<{twidth}}  {'Thread':>6}  {'Start(us)':>10}  {'Duration(us)':>12}  "
                f"{'Wait(us)':>9}  {'Share':>6}")
        lines = [head]
        for r in shown:
            lines.append(f"{r['Op Name'][:cap]:<{width}}  {r['OP Type']:<{twidth}}  {r['Thread']:>6}  "
                         f"{r['Task Start Time(us)']:>10.1f}  {r['Task Duration(us)']:>12.1f}  "
                         f"{r['Task Wait Time(us)']:>9.1f}  {r['Share(%)']:>5.1f}%")
        if top is not None and len(rows) > top:
            lines.append(f"... {len(rows) - top} more ops")
        span = next((s for s in self.runs if s.index == (self.median_run() if run is None else run)), None)
        if span is not None:
            ops = self.ops(run)
            busy = _union_length((e.start_us, e.end_us) for e in ops)
            lines.append(f"{len(ops)} ops; run {span.dur_us:.1f} us, kernels {sum(e.dur_us for e in ops):.1f} us, "
                         f"no kernel running {max(0.0, span.dur_us - busy):.1f} us")
        return "\n".join(lines)

    def write_csv(self, path, run: int | None = None) -> Path:
        """The op table of one run as an msprof-like ``op_summary`` CSV, written atomically."""
        rows = self.op_rows(run)
        keys = ["Op Name", "OP Type", "Thread", "Task Start Time(us)", "Task Duration(us)", "Task Wait Time(us)",
                "Share(%)"]
        lines = [",".join(keys)]
        for r in rows:
            lines.append(",".join(_csv_cell(r[k]) for k in keys))
        return atomic_write(Path(path), ("\n".join(lines) + "\n").encode())

    def __str__(self) -> str:
        s = self.summary()
        name = f"{self.label}: " if self.label else ""
        return (f"{name}{s['ops_per_run']} ops/run, run {s['run_us']:.1f} us, kernels {s['kernel_us']:.1f} us, "
                f"no kernel running {s['gap_us']:.1f} us (median of {s['runs']} runs)")

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(str(self))}</pre>"


def _csv_cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    text = str(v)
    return f'"{text.replace(chr(34), chr(34) * 2)}"' if any(c in text for c in ',"\n') else text


# --------------------------------------------------------------------------------------------------
# parsing onnxruntime's trace
# --------------------------------------------------------------------------------------------------

_SUFFIX = "_kernel_time"


def _num(v) -> float:
    return float(v)  # msprof writes ts as a string; onnxruntime as a number: both parse


def parse_events(events: list[dict], *, warmup: int = 0, label: str = "", config: dict | None = None) -> Profile:
    """A `Profile` from onnxruntime Chrome-trace events, dropping the first `warmup` runs."""
    if not isinstance(events, list):
        raise ValueError("a trace is a JSON list of events (or an object with 'traceEvents')")
    runs_raw = sorted((_num(e["ts"]), _num(e["dur"])) for e in events
                      if e.get("cat") == "Session" and e.get("name") == "model_run" and e.get("ph", "X") == "X")
    if len(runs_raw) <= warmup:
        raise ValueError(f"trace has {len(runs_raw)} model_run event(s); need more than {warmup} (warm-up)")
    kept = runs_raw[warmup:]
    runs = [RunSpan(i, ts, dur) for i, (ts, dur) in enumerate(kept)]
    nodes = [e for e in events if e.get("cat") == "Node" and e.get("ph", "X") == "X"
             and str(e.get("name", "")).endswith(_SUFFIX)]
    # Lanes from the kept runs only: warm-up runs may have used other pool threads.
    spans = [(r.ts_us, r.ts_us + r.dur_us) for r in runs]
    lanes: dict[int, int] = {}
    for e in sorted(nodes, key=lambda e: (_num(e["ts"]), str(e.get("tid")))):
        if any(lo <= _num(e["ts"]) <= hi for lo, hi in spans):
            lanes.setdefault(e.get("tid", 0), len(lanes))
    out: list[OpEvent] = []
    kept_raw: list[dict] = []
    for span in runs:
        lo, hi = span.ts_us, span.ts_us + span.dur_us
        mine = sorted((e for e in nodes if lo <= _num(e["ts"]) <= hi), key=lambda e: (_num(e["ts"]), e["name"]))
        end = lo
        for e in mine:
            ts, dur = _num(e["ts"]), _num(e["dur"])
            args = e.get("args", {})
            wait = max(0.0, ts - end)
            end = max(end, ts + dur)
            out.append(OpEvent(run=span.index, node=e["name"][: -len(_SUFFIX)], op_type=str(args.get("op_name", "?")),
                               start_us=ts - lo, dur_us=dur, wait_us=wait, lane=lanes[e.get("tid", 0)],
                               provider=str(args.get("provider", ""))))
        kept_raw.extend(mine)
    kept_raw.extend(e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"
                    and (_num(e["ts"]), _num(e["dur"])) in set(kept))
    return Profile(events=out, runs=runs, lanes=lanes, trace=kept_raw, label=label, config=dict(config or {}))


def load_trace(path, *, warmup: int = 0, label: str = "") -> Profile:
    """A `Profile` from an onnxruntime profile JSON file."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(str(path), f"not a readable JSON trace ({type(exc).__name__})") from None
    if isinstance(data, dict):
        data = data.get("traceEvents", [])
    try:
        return parse_events(data, warmup=warmup, label=label)
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelError(str(path), f"not an onnxruntime profile: {exc}") from None


def profile_model(model, *, runs: int = 10, warmup: int = 2, level: str = "disable", threads: int = 1,
                  inter_threads: int = 1, parallel: bool = False, mem_arena: bool = True, feeds: dict | None = None,
                  dims: dict[str, int] | None = None, seed: int = 0, label: str = "") -> Profile:
    """Run `model` `warmup + runs` times under onnxruntime's profiler and parse the trace (temp file deleted)."""

    if runs < 1 or warmup < 0:
        raise ValueError("need runs >= 1 and warmup >= 0")
    config = {"level": level, "threads": threads, "inter_threads": inter_threads, "parallel": parallel,
              "mem_arena": mem_arena, "runs": runs, "warmup": warmup}
    with tempfile.TemporaryDirectory(prefix="fusionlab-profile-") as tmp:
        sess = runtime.session(model, level, threads, inter_threads=inter_threads, parallel=parallel,
                               mem_arena=mem_arena, enable_profiling=True,
                               profile_prefix=os.path.join(tmp, "ort"))
        if feeds is None:
            feeds = runtime.make_feeds(model, seed=seed, dims=dims, sess=sess)
        needed = {i.name for i in sess.get_inputs()}
        feeds = {k: v for k, v in feeds.items() if k in needed}
        names = [o.name for o in sess.get_outputs()]
        for _ in range(warmup + runs):
            sess.run(names, feeds)
        path = sess.end_profiling()
        events = json.loads(Path(path).read_text())
    return parse_events(events, warmup=warmup, label=label, config=config)


# --------------------------------------------------------------------------------------------------
# the trace file (Perfetto / chrome://tracing)
# --------------------------------------------------------------------------------------------------

def trace_events(*profiles: Profile) -> list[dict]:
    """Chrome-trace events for the profiles, one process each, runs rebased to start at 0 one after another."""
    out: list[dict] = []
    for pid, prof in enumerate(profiles, start=1):
        name = prof.label or f"profile {pid}"
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "model_run"}})
        for lane in sorted(set(prof.lanes.values()) | {e.lane for e in prof.events}):
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": lane + 1,
                        "args": {"name": f"thread {lane}"}})
        offset = 0.0
        for span in prof.runs:
            out.append({"ph": "X", "cat": "Session", "name": "model_run", "pid": pid, "tid": 0, "ts": round(offset, 3),
                        "dur": span.dur_us, "args": {"run": span.index}})
            for e in prof.events:
                if e.run != span.index:
                    continue
                out.append({"ph": "X", "cat": "Node", "name": e.node, "pid": pid, "tid": e.lane + 1,
                            "ts": round(offset + e.start_us, 3), "dur": e.dur_us,
                            "args": {"op_type": e.op_type, "wait_us": e.wait_us, "provider": e.provider}})
            offset += span.dur_us + 50.0  # a visible pause between runs
    return out


def write_trace(path, *profiles: Profile) -> Path:
    """Write profiles as one Chrome-trace JSON (opens in Perfetto / chrome://tracing), atomically."""
    if not profiles:
        raise ValueError("write_trace needs at least one profile")
    doc = {"traceEvents": trace_events(*profiles), "displayTimeUnit": "ms",
           "otherData": {"producer": "fusionlab.profile", "profiles": [p.label for p in profiles]}}
    return atomic_write(Path(path), json.dumps(doc, indent=None, separators=(",", ":")).encode())


# --------------------------------------------------------------------------------------------------
# before / after
# --------------------------------------------------------------------------------------------------

def side_by_side(before: Profile, after: Profile, *, top: int = 8) -> str:
    """Before/after table: op count, run time, kernel time, launch gaps and time per op type."""
    a, b = before.summary(), after.summary()
    la, lb = before.label or "before", after.label or "after"
    w = max(12, len(la), len(lb))

    def ratio(x, y):
        return f"{x / y:.2f}x" if y else "-"

    lines = [f"{'':<30} {la:>{w}} {lb:>{w}}  ratio"]
    lines.append(f"{'ops per run':<30} {a['ops_per_run']:>{w}} {b['ops_per_run']:>{w}}  "
                 f"{ratio(a['ops_per_run'], b['ops_per_run'])}")
    for key, name in (("run_us", "run time (us)"), ("kernel_us", "time in kernels (us)"),
                      ("gap_us", "no kernel running (us)")):
        lines.append(f"{name:<30} {a[key]:>{w}.1f} {b[key]:>{w}.1f}  {ratio(a[key], b[key])}")
    ga = a["gap_us"] / a["ops_per_run"] if a["ops_per_run"] else 0.0
    gb = b["gap_us"] / b["ops_per_run"] if b["ops_per_run"] else 0.0
    lines.append(f"{'gap per op (us)':<30} {ga:>{w}.2f} {gb:>{w}.2f}")
    ta, tb = before.by_op_type(), after.by_op_type()
    types = sorted(set(ta) | set(tb), key=lambda t: (-max(ta.get(t, {}).get("time_us", 0), tb.get(t, {}).get("time_us", 0)), t))
    lines.append("time per op type (us, count):")
    for t in types[:top]:
        x, y = ta.get(t, {"time_us": 0.0, "count": 0}), tb.get(t, {"time_us": 0.0, "count": 0})
        lines.append(f"  {t[:28]:<28} {x['time_us']:>{w - 5}.1f} ({x['count']:>2}) {y['time_us']:>{w - 5}.1f} ({y['count']:>2})")
    if len(types) > top:
        lines.append(f"  ... {len(types) - top} more op types")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# pictures
# --------------------------------------------------------------------------------------------------

_FIXED = {"Conv": 0, "FusedConv": 1, "BatchNormalization": 2, "Relu": 3, "Sigmoid": 6, "Mul": 4, "Add": 5,
          "QuickGelu": 7, "MatMul": 8, "Gemm": 9, "Concat": 10, "MaxPool": 12, "Resize": 14, "Softmax": 16,
          "LayerNormalization": 18, "Transpose": 11, "Reshape": 13}


def _colours(types: Sequence[str]) -> dict[str, tuple]:
    """A colour per op type that is the same in every picture (fixed for common ops, else by name hash)."""

    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    return {t: cmap(_FIXED.get(t.split(":")[-1], zlib.crc32(t.encode()) % 20)) for t in sorted(types)}


def draw_timeline(profile: Profile, run: int | None = None, ax=None, title: str | None = None, legend: int = 8,
                  colours: dict | None = None):
    """A Gantt chart of one run: one lane per thread, kernels coloured by op type, gaps left blank."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ops = profile.ops(run)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 1.2 + 0.6 * profile.n_lanes))
    colours = colours or _colours({e.op_type for e in ops})
    for e in ops:
        ax.broken_barh([(e.start_us / 1000.0, e.dur_us / 1000.0)], (e.lane - 0.4, 0.8),
                       facecolors=colours.get(e.op_type, "grey"), edgecolor="none")
    r = profile.median_run() if run is None else run
    span = next(s for s in profile.runs if s.index == r)
    ax.axvspan(0, span.dur_us / 1000.0, color="0.93", zorder=-1)
    ax.set_xlim(0, span.dur_us / 1000.0 * 1.01)
    lanes = sorted({e.lane for e in ops}) or [0]
    ax.set_yticks(lanes, [f"thread {i}" for i in lanes])
    ax.set_ylim(max(lanes) + 0.6, min(lanes) - 0.6)
    ax.set_xlabel("time since the run started (ms); grey = no kernel running")
    ax.set_title(title or (profile.label or "timeline"))
    times: dict[str, float] = {}
    for e in ops:
        times[e.op_type] = times.get(e.op_type, 0.0) + e.dur_us
    top = sorted(times, key=lambda t: (-times[t], t))[:legend]
    ax.legend(handles=[Patch(color=colours[t], label=t) for t in top], loc="upper left", bbox_to_anchor=(1.0, 1.0),
              fontsize="small", frameon=False)
    return ax.figure


def draw_op_types(before: Profile, after: Profile, ax=None, top: int = 8):
    """Stacked bars: where the time of one run goes, per op type plus 'no kernel running', before vs after."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    ta, tb = before.by_op_type(), after.by_op_type()
    types = sorted(set(ta) | set(tb), key=lambda t: (-(ta.get(t, {}).get("time_us", 0) + tb.get(t, {}).get("time_us", 0)), t))
    main, rest = types[:top], types[top:]
    colours = _colours(main)
    labels = [before.label or "before", after.label or "after"]
    for x, (prof, table) in enumerate(((before, ta), (after, tb))):
        bottom = 0.0
        for t in main:
            v = table.get(t, {}).get("time_us", 0.0) / 1000.0
            ax.bar(x, v, bottom=bottom, color=colours[t], label=t if x == 0 else None, width=0.6)
            bottom += v
        other = sum(table.get(t, {}).get("time_us", 0.0) for t in rest) / 1000.0
        if other:
            ax.bar(x, other, bottom=bottom, color="0.6", label="other ops" if x == 0 else None, width=0.6)
            bottom += other
        ax.bar(x, prof.gap_us / 1000.0, bottom=bottom, color="white", edgecolor="black", hatch="//",
               label="no kernel running" if x == 0 else None, width=0.6)
    ax.set_xticks([0, 1], labels)
    ax.set_ylabel("ms per run (median)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False)
    ax.set_title("where the time goes")
    return ax.figure


# --------------------------------------------------------------------------------------------------
# run configurations for the seed's three fixes
# --------------------------------------------------------------------------------------------------

def runner(model, *, level: str = "disable", threads: int = 1, inter_threads: int = 1, parallel: bool = False,
           mem_arena: bool = True, mem_pattern: bool = True, io_binding: bool = False, feeds: dict | None = None,
           dims: dict[str, int] | None = None, seed: int = 0) -> Callable[[], object]:
    """A zero-argument callable running `model` once in the given onnxruntime configuration.

    With `io_binding` the inputs are bound once and every output is written into a buffer
    allocated once up front (no per-run output allocation or copy); otherwise `InferenceSession.run`.
    """

    so = ort.SessionOptions()
    so.enable_mem_pattern = mem_pattern
    sess = runtime.session(model, level, threads, inter_threads=inter_threads, parallel=parallel,
                           mem_arena=mem_arena, session_options=so)
    if feeds is None:
        feeds = runtime.make_feeds(model, seed=seed, dims=dims, sess=sess)
    needed = {i.name for i in sess.get_inputs()}
    feeds = {k: np.ascontiguousarray(v) for k, v in feeds.items() if k in needed}
    names = [o.name for o in sess.get_outputs()]
    if not io_binding:
        return lambda: sess.run(names, feeds)
    first = sess.run(names, feeds)
    outputs = {n: np.empty_like(a) for n, a in zip(names, first)}
    binding = sess.io_binding()
    for k, v in feeds.items():
        binding.bind_cpu_input(k, v)
    for n, buf in outputs.items():
        binding.bind_output(n, "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)

    def run_bound():
        sess.run_with_iobinding(binding)
        return outputs

    run_bound.outputs = outputs  # keeps the buffers alive as long as the callable
    run_bound.feeds = feeds
    return run_bound
