"""`fusionlab profile IN.onnx [--fuse] -o trace.json`: an msprof-style op table and a Perfetto trace."""

from __future__ import annotations

from ..cli import UsageError
from ..passes import fuse
from ..plan import DEFAULT_PASSES
from ..profile import profile_model, side_by_side, write_trace
from ..verification.runtime import make_feeds
from . import add_dim_option, check_output, load_input, parse_dims


def register(sub) -> None:
    p = sub.add_parser("profile", help="profile a model with onnxruntime: op table and trace file",
                       description="Run the model under onnxruntime's profiler (optimisations off, one thread by "
                                   "default), print a per-op table like msprof's op_summary and write a Chrome-trace "
                                   "file that opens in Perfetto (ui.perfetto.dev) or chrome://tracing.")
    p.add_argument("model", help="the ONNX model to profile")
    p.add_argument("-o", "--output", required=True, help="trace file to write (JSON)")
    p.add_argument("--fuse", action="store_true",
                   help="also fuse the model (the default passes, as fuse) and profile both: side-by-side table, both "
                        "in the trace")
    p.add_argument("--runs", type=int, default=10, help="profiled runs after warm-up (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up runs left out of the profile (default 2)")
    p.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads (default 1)")
    p.add_argument("--level", default="disable", choices=["disable", "basic", "extended", "all"],
                   help="onnxruntime graph optimisation level (default: disable)")
    p.add_argument("--top", type=int, default=20, help="rows of the op table, longest first (0 = all, start order)")
    p.add_argument("--csv", default=None, help="also write the op table as an op_summary-style CSV")
    add_dim_option(p)
    p.set_defaults(func=run)


def run(args) -> int:
    if args.runs < 1 or args.warmup < 0 or args.threads < 1 or args.top < 0:
        raise UsageError("--runs and --threads must be >= 1, --warmup and --top >= 0")
    out = check_output(args.output, [args.model])
    csv = check_output(args.csv, [args.model, args.output]) if args.csv else None
    dims = parse_dims(args.dim)
    graph = load_input(args.model)

    feeds = make_feeds(graph, dims=dims)
    opts = dict(runs=args.runs, warmup=args.warmup, threads=args.threads, level=args.level, feeds=feeds)
    fused = None
    if args.fuse:
        try:
            fused = fuse(graph, passes=DEFAULT_PASSES).graph
        except ModuleNotFoundError as exc:
            raise UsageError(f"--fuse needs the vertical pass, which is not available ({exc.name})") from None
    profiles = [profile_model(graph, label="original", **opts)]
    if fused is not None:
        profiles.append(profile_model(fused, label="fused", **opts))
    top = args.top or None
    sort = "duration" if top else "start"
    for prof in profiles:
        print(f"== {prof.label}: median run of {prof.n_runs}")
        print(prof.op_table(top=top, sort=sort))
        print()
    if args.fuse:
        print(side_by_side(*profiles))
    write_trace(out, *profiles)
    if csv is not None:
        profiles[-1].write_csv(csv)
    print(f"trace written to {args.output} (open in ui.perfetto.dev or chrome://tracing)")
    return 0
