"""One self-contained HTML page about one model: what fuses, what does not and why, what it costs, who to blame.

`report(model)` returns the page as text: the fusion plan (the passes `fuse` runs by default), the picture
(a PNG inside the page), the near misses (`--why-not`), the fusions that fire (fusionlab's per rule and
onnxruntime's per fused op at ALL), the predicted cost, measured time of the original and the fused model
at onnxruntime's DISABLE, EXTENDED and ALL levels (interleaved), and blame's verdict. No network: no
scripts, fonts or styles from elsewhere; the one picture is a data: URL. `fusionlab report MODEL -o r.html`.
"""

from __future__ import annotations

import base64
import html
import io
import platform
import struct
import time
from pathlib import Path

import onnxruntime

from . import __version__, cost, drift
from .blame import blame_ort, blame_passes
from .commands.blame import ort_lines, pass_lines
from .commands.explain import why_not_lines
from .graph import as_graph
from .passes import fuse
from .plan import DEFAULT_PASSES
from .timing import Comparison, Timing, format_seconds, interleaved
from .verification.runtime import make_feeds, session, verify
from .viz import draw

__all__ = ["report", "LEVELS"]

LEVELS = ("disable", "extended", "all")

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;max-width:1100px;padding:1em 1.5em;
color:#222;line-height:1.4}
h1{font-size:1.4em;margin-bottom:.2em} h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;width:100%;table-layout:auto;font-size:.9em;margin:.4em 0}
th,td{border:1px solid #ddd;padding:.25em .45em;text-align:left;vertical-align:top;overflow-wrap:anywhere}
th{background:#f4f4f4} td.n{text-align:right;white-space:nowrap}
pre{background:#f8f8f8;padding:.6em;overflow-x:auto;white-space:pre-wrap;overflow-wrap:anywhere;font-size:.85em}
.pic{overflow:auto;max-height:85vh;border:1px solid #ddd} .pic img{width:100%;height:auto;display:block}
.muted{color:#666;font-size:.9em} .bad{color:#a40000;font-weight:600} .good{color:#1d6b1d;font-weight:600}
"""


def _esc(x) -> str:
    return html.escape(str(x))


def _table(header, rows, numeric=()) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(
        f"<td class='n'>{_esc(v)}</td>" if i in numeric else f"<td>{_esc(v).replace('+', '+<wbr>')}</td>"
        for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _picture(graph, plan) -> tuple[str, tuple[int, int]]:
    """The picture as a PNG data: URL and its size in pixels."""

    fig = draw(graph, plan)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight", facecolor="white", metadata={"Software": None})
    data = buf.getvalue()

    w, h = struct.unpack(">II", data[16:24])
    return "data:image/png;base64," + base64.b64encode(data).decode(), (w, h)


def _timing(graph, fused, min_time: float, rounds: int, dims) -> list[list[str]]:
    """Rows: level, original median (CI), fused median (CI), original/fused with CI, verdict (all interleaved)."""

    calls, feeds = {}, None
    for tag, g in (("original", graph), ("fused", fused)):
        for lv in LEVELS:
            sess = session(g, lv)
            if feeds is None:
                feeds = make_feeds(graph, dims=dims, sess=sess)
            f = {k: v for k, v in feeds.items() if k in {i.name for i in sess.get_inputs()}}
            names = [o.name for o in sess.get_outputs()]
            calls[f"{tag}@{lv}"] = (lambda s=sess, n=names, f=f: s.run(n, f))
    samples = interleaved(calls, min_time=min_time, min_rounds=rounds, warmup=2)
    rows = []
    for lv in LEVELS:
        a, b = Timing.from_samples(samples[f"original@{lv}"]), Timing.from_samples(samples[f"fused@{lv}"])
        c = Comparison.from_samples(samples[f"original@{lv}"], samples[f"fused@{lv}"], label_a="original",
                                    label_b="fused")
        rows.append([lv.upper(), f"{format_seconds(a.median)} ({format_seconds(a.ci_low)}–{format_seconds(a.ci_high)})",
                     f"{format_seconds(b.median)} ({format_seconds(b.ci_low)}–{format_seconds(b.ci_high)})",
                     f"{c.speedup:.2f}× ({c.ci_low:.2f}–{c.ci_high:.2f})", c.verdict(brief=True)])
    rows.append(["rounds", str(len(samples["original@all"])), "", "", "interleaved, order rotated each round"])
    return rows


def report(model, *, passes=None, name: str | None = None, level: str = "all", dims: dict | None = None,
           timing: bool = True, blame: bool = True, min_time: float = 1.0, rounds: int = 10) -> str:
    """The HTML page about `model` (see the module)."""
    t0 = time.monotonic()
    graph = as_graph(model)
    passes = list(passes or DEFAULT_PASSES)
    title = name or getattr(graph, "path", None) or graph.name or "model"
    # the report shows a fused model that differs (verify below, blame's verdict) rather than refusing it
    result = fuse(graph, passes, compare=False, **({"dims": dims} if dims else {}))
    parts = _header(graph, result, passes, title, dims)
    parts += _plan_section(result.plan)
    parts += _picture_section(graph, result.plan)
    parts += _near_misses_section(result.plan)
    parts += _counts_section(graph, passes, level, dims)
    parts += _predicted_section(graph, result.plan, passes, dims)
    if timing:
        parts += _timing_section(graph, result, min_time, rounds, dims)
    if blame:
        parts += _blame_section(graph, passes, title, level, dims, min_time, rounds)
    parts.append(f"<p class='muted'>Made by <code>fusionlab report</code> in {time.monotonic() - t0:.0f} s.</p>")
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><meta name='viewport' "
            "content='width=device-width, initial-scale=1'>"
            f"<title>fusionlab report: {_esc(Path(str(title)).name)}</title><style>{_CSS}</style></head><body>"
            + "\n".join(parts) + "</body></html>\n")


def _header(graph, result, passes, title, dims) -> list[str]:
    """The title, what was run, and whether the fused model computes the same outputs."""
    check = verify(graph, result.graph, dims=dims)
    verdict = "good'>the fused model computes the same outputs" if check.ok else "bad'>the fused model DIFFERS"
    return [f"<h1>fusionlab report: {_esc(Path(str(title)).name)}</h1>",
            f"<p class='muted'>{_esc(title)} · {len(graph)} nodes · passes {_esc(', '.join(passes))} · fusionlab "
            f"{_esc(__version__)} · onnxruntime {_esc(onnxruntime.__version__)} · {_esc(platform.machine())}, "
            f"{_esc(platform.system())}</p>",
            f"<p>{sum(result.before.values())} nodes → {sum(result.after.values())} after fusion; "
            f"<span class='{verdict}</span> ({_esc(check.summary().splitlines()[-1])}, max abs error "
            f"{check.max_abs:.2e}).</p>"]


def _plan_section(plan) -> list[str]:
    parts = ["<h2>The plan</h2>"]
    if not len(plan):
        return parts + ["<p>No group: nothing in this model matches a rule of these passes.</p>"]
    rows = [[r["id"], r["rule"], r["pattern"].replace("BatchNormalization", "BN"), r["nodes"], r["kernels"],
             r["launches saved"], r["saved KiB"], r["lowered to"]] for r in plan.rows()]
    return parts + [_table(["id", "rule", "pattern", "nodes", "kernels", "launches saved", "saved KiB", "lowered to"],
                           rows, numeric=(3, 4, 5, 6)),
                    f"<p class='muted'>{_esc(plan.footer())}</p>"]


def _picture_section(graph, plan) -> list[str]:
    src, (w, h) = _picture(graph, plan)
    return ["<h2>The picture</h2>",
            f"<p class='muted'>Groups outlined in colour (legend at the top), {w}×{h} px; scroll inside the "
            f"frame.</p><div class='pic'><img alt='the graph with its fusion groups' src='{src}' "
            f"width='{w}' height='{h}'></div>"]


def _near_misses_section(plan) -> list[str]:
    lines = why_not_lines(plan)
    return ["<h2>Near misses (why not)</h2>",
            f"<pre>{_esc(chr(10).join(lines))}</pre>" if lines else "<p>No rule refused anything.</p>"]


def _counts_section(graph, passes, level, dims) -> list[str]:
    counts = drift.counts(graph, passes, level=level, dims=dims)
    rules = [[k, v] for k, v in counts["rules"].items()] or [["(none)", 0]]
    ort_ops = [[k, v] for k, v in counts["onnxruntime"]["fused_ops"].items()] or [["(none)", 0]]
    return ["<h2>What fires</h2>",
            "<p>fusionlab's groups per rule:</p>" + _table(["rule", "groups"], rules, numeric=(1,)),
            f"<p>onnxruntime {level.upper()}'s fused ops (op types its optimised model has more of):</p>"
            + _table(["op type", "more than the original"], ort_ops, numeric=(1,)),
            "<p class='muted'>Save these with <code>fusionlab explain MODEL --save-counts FILE</code> and check "
            "later with <code>--expect FILE</code> (exit 1 naming each fusion that stopped or started).</p>"]


def _predicted_section(graph, plan, passes, dims) -> list[str]:
    table = cost.compare(graph, {"unfused": None, f"fused: {'+'.join(passes)}": plan}, dims=dims)
    return ["<h2>Predicted (roofline model)</h2>",
            _table(["plan", "device", "kernels", "latency", "speedup", "MiB moved", "peak MiB"],
                   [[r["plan"], r["device"], r["kernels"], f"{r['latency_s'] * 1e6:.1f} µs", f"{r['speedup']:.2f}×",
                     f"{r['MiB_moved']:.2f}", f"{r['peak_MiB']:.2f}"] for r in table.rows], numeric=(2, 3, 4, 5, 6))]


def _timing_section(graph, result, min_time, rounds, dims) -> list[str]:
    return ["<h2>Measured on this machine (onnxruntime, 1 thread)</h2>",
            _table(["level", "original median (95% CI)", "fused median (95% CI)", "original/fused (95% CI)",
                    "verdict"], _timing(graph, result.graph, min_time, rounds, dims)),
            "<p class='muted'>Ratios are medians of per-round ratios of interleaved runs; >1: the fused "
            "model is faster. A shared machine's numbers vary from run to run: read the intervals.</p>"]


def _blame_section(graph, passes, title, level, dims, min_time, rounds) -> list[str]:
    ort = blame_ort(graph, level, dims=dims, shrink_budget=None, time_budget=min(min_time, 0.5), rounds=rounds)
    ours = blame_passes(graph, passes, dims=dims, level=level, shrink_budget=None,
                        time_budget=min(min_time, 0.5), rounds=rounds)
    return ["<h2>Blame: did an optimisation change the outputs?</h2>",
            f"<pre>{_esc(chr(10).join(ort_lines(ort, str(title)) + pass_lines(ours)))}</pre>",
            "<p class='muted'><code>fusionlab blame MODEL</code> also shrinks the model to a minimal "
            "repro and writes it.</p>"]

