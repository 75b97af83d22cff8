"""`fusionlab bench A.onnx [B.onnx]`: medians with 95% CIs, and the paired ratio of interleaved runs."""

from __future__ import annotations

from . import add_dim_option, load_input, parse_dims

LEVEL_CHOICES = ["disable", "basic", "extended", "all"]


def register(sub) -> None:
    p = sub.add_parser("bench", help="time one model, or two models interleaved",
                       description="Time a model with onnxruntime (median and 95% CI); with two models, run them "
                                   "interleaved and report the median of paired ratios A/B (>1: B is faster).")
    p.add_argument("a", help="model A")
    p.add_argument("b", nargs="?", help="model B (optional)")
    p.add_argument("--level", choices=LEVEL_CHOICES, default="disable",
                   help="onnxruntime graph-optimisation level for A (and B unless --level-b); default disable")
    p.add_argument("--level-b", choices=LEVEL_CHOICES, default=None, help="level for B (default: same as --level)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1: stable on shared machines)")
    p.add_argument("--min-time", type=float, default=2.0, help="seconds of measurement at least (default 2)")
    p.add_argument("--seed", type=int, default=0)
    add_dim_option(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..cli import UsageError
    from ..runtime import make_feeds, session
    from ..timing import bench_session, compare_models

    if args.threads < 1:
        raise UsageError("--threads must be at least 1")
    dims = parse_dims(args.dim)
    a = load_input(args.a)
    if args.b is None:
        sess = session(a, args.level, args.threads)
        feeds = make_feeds(a, seed=args.seed, dims=dims, sess=sess)
        timing = bench_session(sess, feeds, label=f"{args.a} ({args.level})", min_time=args.min_time)
        print(timing)
        print(f"threads: intra_op={args.threads}, inter_op=1")
        return 0
    b = load_input(args.b)
    level_b = args.level_b or args.level
    cmp = compare_models(a, b, level_a=args.level, level_b=level_b, threads=args.threads, seed=args.seed, dims=dims,
                         min_time=args.min_time, label_a=f"A {args.a} ({args.level})",
                         label_b=f"B {args.b} ({level_b})")
    print(cmp.table())
    return 0
