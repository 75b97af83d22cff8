"""`fusionlab bench A.onnx [B.onnx]`: medians with 95% CIs, and paired ratios of interleaved runs.

By default at onnxruntime's ALL level, the one users deploy: comparing two models with optimisations off
says little about what either costs in production (the original at ALL can beat both). `--levels` times
every chosen level side by side (default DISABLE, EXTENDED and ALL), all candidates interleaved.
"""

from __future__ import annotations

from pathlib import Path

from ..cli import UsageError
from ..text import text_table
from ..timing import Comparison, Timing, bench_session, compare_models, format_seconds, interleaved
from ..verification.runtime import make_feeds, quiet_onnxruntime, session
from . import add_dim_option, load_input, parse_dims

LEVEL_CHOICES = ["disable", "basic", "extended", "all"]
SIDE_BY_SIDE = "disable,extended,all"


def register(sub) -> None:
    p = sub.add_parser("bench", help="time one model, or two models interleaved, at onnxruntime's levels",
                       description="Time a model with onnxruntime (median and 95% CI); with two models, run them "
                                   "interleaved and report the median of paired ratios A/B (>1: B is faster). "
                                   "Default level: all (what a deployment runs).")
    p.add_argument("a", help="model A")
    p.add_argument("b", nargs="?", help="model B (optional)")
    p.add_argument("--level", choices=LEVEL_CHOICES, default="all",
                   help="onnxruntime graph-optimisation level for A (and B unless --level-b); default all")
    p.add_argument("--level-b", choices=LEVEL_CHOICES, default=None, help="level for B (default: same as --level)")
    p.add_argument("--levels", nargs="?", const=SIDE_BY_SIDE, default=None, metavar="L1,L2,...",
                   help=f"time at several levels side by side, interleaved (default {SIDE_BY_SIDE})")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1: stable on shared machines)")
    p.add_argument("--min-time", type=float, default=2.0, help="seconds of measurement at least (default 2)")
    p.add_argument("--rounds", type=int, default=10, help="interleaved rounds at least (default 10)")
    p.add_argument("--seed", type=int, default=0)
    add_dim_option(p)
    p.set_defaults(func=run)


def _levels(text: str) -> list[str]:
    levels = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in levels if x not in LEVEL_CHOICES]
    if not levels or bad:
        raise UsageError(f"--levels takes a comma list of {', '.join(LEVEL_CHOICES)}"
                         + (f"; got {bad[0]!r}" if bad else ""))
    return list(dict.fromkeys(levels))


def run(args) -> int:
    if args.threads < 1 or args.rounds < 1 or args.min_time < 0:
        raise UsageError("--threads and --rounds must be at least 1, --min-time at least 0")
    if args.levels is not None and args.level_b is not None:
        raise UsageError("--levels times both models at each level; drop --level-b")
    dims = parse_dims(args.dim)
    models = {"A": (args.a, load_input(args.a))}
    if args.b is not None:
        models["B"] = (args.b, load_input(args.b))
    if args.levels is not None:
        return _side_by_side(args, models, _levels(args.levels), dims)
    if args.b is None:
        return _one(args, models["A"], dims)
    return _two(args, models, dims)


def _sessions(args, models, levels, dims):
    """({(tag, level): run callable}, feeds) on one shared input draw."""

    quiet_onnxruntime()
    calls, feeds = {}, None
    for tag, (_, graph) in models.items():
        for level in levels:
            sess = session(graph, level, args.threads, inter_threads=1)
            if feeds is None:
                feeds = make_feeds(graph, seed=args.seed, dims=dims, sess=sess)
            wanted = {i.name for i in sess.get_inputs()}
            f = {k: v for k, v in feeds.items() if k in wanted}
            names = [o.name for o in sess.get_outputs()]
            calls[(tag, level)] = (lambda s=sess, n=names, f=f: s.run(n, f))
    return calls


def _one(args, model, dims) -> int:
    path, graph = model
    sess = session(graph, args.level, args.threads)
    feeds = make_feeds(graph, seed=args.seed, dims=dims, sess=sess)
    timing = bench_session(sess, feeds, label=f"{Path(path).name} ({args.level})", min_time=args.min_time,
                           min_repeats=args.rounds)
    print(timing)
    print(f"threads: intra_op={args.threads}, inter_op=1")
    return 0


def _two(args, models, dims) -> int:
    (pa, a), (pb, b) = models["A"], models["B"]
    level_b = args.level_b or args.level
    cmp = compare_models(a, b, level_a=args.level, level_b=level_b, threads=args.threads, seed=args.seed, dims=dims,
                         min_time=args.min_time, min_rounds=args.rounds, label_a=f"{Path(pa).name} ({args.level})",
                         label_b=f"{Path(pb).name} ({level_b})")
    print(cmp.table())
    return 0


def _side_by_side(args, models, levels, dims) -> int:
    calls = _sessions(args, models, levels, dims)
    samples = interleaved({f"{t}@{lv}": fn for (t, lv), fn in calls.items()}, min_time=args.min_time,
                          min_rounds=args.rounds)
    rounds = len(next(iter(samples.values())))
    for tag, (path, _) in models.items():
        print(f"{tag}: {path}")
    base = levels[0]
    rows = []
    for lv in levels:
        row = [lv]
        for tag in models:
            t = Timing.from_samples(samples[f"{tag}@{lv}"])
            row += [format_seconds(t.median), f"{format_seconds(t.ci_low)}–{format_seconds(t.ci_high)}"]
        if "B" in models:
            c = Comparison.from_samples(samples[f"A@{lv}"], samples[f"B@{lv}"], label_a="A", label_b="B")
            row += [f"{c.speedup:.2f}×", f"{c.ci_low:.2f}–{c.ci_high:.2f}", c.verdict(brief=True)]
        else:
            c = Comparison.from_samples(samples[f"A@{base}"], samples[f"A@{lv}"])
            row += ["1.00× (base)" if lv == base else f"{c.speedup:.2f}× ({c.ci_low:.2f}–{c.ci_high:.2f})"]
        rows.append(row)
    if "B" in models:
        header = ["level", "A median", "A 95% CI", "B median", "B 95% CI", "A/B", "95% CI", "verdict"]
    else:
        header = ["level", "median", "95% CI", f"{base}/level (95% CI)"]
    print("\n".join(text_table(header, rows)))
    note = "A/B > 1: B faster" if "B" in models else f"{base}/level > 1: faster than at {base}"
    print(f"{rounds} interleaved rounds (every candidate each round, order rotated); threads: intra_op="
          f"{args.threads}, inter_op=1")
    print(f"ratios: median of the per-round ratios, 95% CI; {note}")
    return 0
