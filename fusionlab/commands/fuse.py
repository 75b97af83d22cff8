"""`fusionlab fuse IN.onnx -o OUT.onnx`: plan, rewrite, verify and write a fused model."""

from __future__ import annotations

import json
from pathlib import Path

from . import add_dim_option, check_output, load_input, parse_dims, parse_passes


def register(sub) -> None:
    p = sub.add_parser("fuse", help="fuse operators in a model and write the result",
                       description="Run fusion passes over a model, check the result computes the same outputs "
                                   "as the original (onnxruntime, optimisations off), and write it atomically.")
    p.add_argument("input", help="model to fuse (never overwritten)")
    p.add_argument("-o", "--output", required=True, help="where to write the fused model")
    p.add_argument("--passes", default="vertical",
                   help="comma-separated pass names, run in order (default: vertical)")
    p.add_argument("--rules", default=None, help="comma-separated subset of vertical rules (default: all)")
    p.add_argument("--lower", default="runtime", choices=["runtime", "functions", "onnx"],
                   help="runtime: onnxruntime com.microsoft fused ops; onnx: standard ops only; "
                        "functions: runtime + model-local functions for groups with no fused kernel")
    p.add_argument("--max-group-ops", type=int, default=5, metavar="N",
                   help="mixed pass: at most N ops per group (default 5, the seed's Atlas 800I A2 rule; 0 = no limit)")
    p.add_argument("--buffer-kb", type=float, default=None, metavar="K",
                   help="mixed pass: on-chip buffer budget per group in KiB (default: no limit)")
    p.add_argument("--allow-recompute", action="store_true",
                   help="mixed pass: copy a cheap multi-consumer op into each consumer's group")
    p.add_argument("--min-branches", type=int, default=2, metavar="N",
                   help="horizontal pass: fuse only N or more sibling branches (default 2)")
    p.add_argument("--report", default=None, help="also write the plan and op counts as JSON here")
    p.add_argument("--no-verify", action="store_true", help="skip checking the fused model against the original")
    add_dim_option(p)
    p.set_defaults(func=run)


def _write_json_atomic(path: Path, data: dict) -> None:
    from ..files import atomic_write

    atomic_write(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def run(args) -> int:
    from ..cli import UsageError
    from ..graph import ModelError, save_model
    from ..passes import fuse
    
    names = parse_passes(args.passes)
    dims = parse_dims(args.dim)
    target = check_output(args.output, [args.input])
    report_path = None
    if args.report:
        report_path = check_output(args.report, [args.input, args.output])
    graph = load_input(args.input)
    if args.max_group_ops < 0 or (args.buffer_kb is not None and args.buffer_kb <= 0) or args.min_branches < 2:
        raise UsageError("--max-group-ops must be >= 0, --buffer-kb > 0 and --min-branches >= 2")
    options = {"lower": args.lower, "max_group_ops": args.max_group_ops or None, "buffer_kb": args.buffer_kb,
               "allow_recompute": args.allow_recompute, "min_branches": args.min_branches}
    if args.rules:
        options["rules"] = args.rules
    try:
        result = fuse(graph, names, **options)
    except ModuleNotFoundError as exc:
        raise UsageError(f"pass not available: {exc.name}") from None
    except ValueError as exc:
        if isinstance(exc, ModelError):
            raise
        raise UsageError(str(exc).splitlines()[0]) from None
    verdict = "not verified (--no-verify)"
    if not args.no_verify:
        from ..runtime import verify

        report = verify(graph, result.graph, dims=dims)
        if not report.ok:
            print(report.table())
            print("fusionlab fuse: the fused model is NOT equivalent; nothing written")
            return 1
        verdict = f"verified: max abs error {report.max_abs:.2e}"
    save_model(result.graph, target, source=args.input)
    if report_path is not None:
        _write_json_atomic(report_path, {
            "input": str(args.input), "output": str(args.output), "passes": names, "lower": args.lower,
            "before": result.before, "after": result.after, "verified": not args.no_verify,
            "plan": result.plan.to_dict(),
        })
    print(result.summary())
    print(verdict)
    print(f"wrote {target.name}")
    return 0
