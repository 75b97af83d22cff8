"""`fusionlab fuse IN.onnx -o OUT.onnx`: plan, rewrite, verify and write a fused model.

With `--plan PLAN.json` the rewrite follows a plan written by `--report` (possibly edited: a deleted group
leaves its nodes unfused); a group that no longer matches the model is refused by name, nothing written.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..cli import UsageError
from ..files import atomic_write
from ..graph import ModelError, save_model
from ..passes import FusionError, StaleGroup, apply, fuse, options_for
from ..plan import DEFAULT_PASSES, FusionPlan, PlanError
from ..verification.runtime import session, verify
from . import add_dim_option, check_output, load_input, parse_dims, parse_passes


def register(sub) -> None:
    p = sub.add_parser("fuse", help="fuse operators in a model and write the result",
                       description="Run fusion passes over a model, check the result computes the same outputs "
                                   "as the original (onnxruntime, optimisations off), and write it atomically.")
    p.add_argument("input", help="model to fuse (never overwritten)")
    p.add_argument("-o", "--output", required=True, help="where to write the fused model")
    p.add_argument("--passes", default=",".join(DEFAULT_PASSES),
                   help=f"comma-separated pass names, run in order (default: {','.join(DEFAULT_PASSES)})")
    p.add_argument("--rules", default=None, help="comma-separated subset of vertical rules (default: all)")
    p.add_argument("--lower", default="runtime", choices=["runtime", "functions", "onnx"],
                   help="runtime: onnxruntime com.microsoft fused ops; onnx: standard ops only; "
                        "functions: runtime + model-local functions for groups with no fused kernel")
    p.add_argument("--max-group-ops", type=int, default=None, metavar="N",
                   help="at most N ops per group (vertical chains stop growing, mixed groups split); "
                        "default: no limit for vertical, 5 for mixed (the seed's Atlas 800I A2 rule); 0 = no limit")
    p.add_argument("--buffer-kb", type=float, default=None, metavar="K",
                   help="mixed pass: on-chip buffer budget per group in KiB (default: no limit)")
    p.add_argument("--allow-recompute", action="store_true",
                   help="mixed pass: copy a cheap multi-consumer op into each consumer's group")
    p.add_argument("--min-branches", type=int, default=2, metavar="N",
                   help="horizontal pass: fuse only N or more sibling branches (default 2)")
    p.add_argument("--plan", default=None, metavar="PLAN.json",
                   help="apply this plan (from --report, possibly edited) instead of planning; "
                        "passes and options come from the plan")
    p.add_argument("--select", choices=["measured"], default=None,
                   help="measured: keep only the groups that time faster than the ops they replace, on this "
                        "model's shapes (each rule's measured ratio goes in the report)")
    p.add_argument("--select-level", choices=["disable", "basic", "extended", "all"], default="disable",
                   help="onnxruntime level the selection times at (default disable)")
    p.add_argument("--report", default=None, help="also write the plan and op counts as JSON here")
    p.add_argument("--no-verify", action="store_true",
                   help="skip comparing the fused model with the original (it is still loaded and run once on "
                        "random inputs: a model that does not run is never written)")
    add_dim_option(p)
    p.set_defaults(func=run)


def _write_json_atomic(path: Path, data: dict) -> None:
    atomic_write(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def _options(args, names: list[str]) -> dict:
    if (args.max_group_ops is not None and args.max_group_ops < 0) or \
            (args.buffer_kb is not None and args.buffer_kb <= 0) or args.min_branches < 2:
        raise UsageError("--max-group-ops must be >= 0, --buffer-kb > 0 and --min-branches >= 2")
    wanted = {"lower": args.lower, "buffer_kb": args.buffer_kb, "allow_recompute": args.allow_recompute,
              "min_branches": args.min_branches, "dims": parse_dims(args.dim) or None}
    if args.max_group_ops is not None:
        wanted["max_group_ops"] = args.max_group_ops or None
    if args.rules:
        if "vertical" not in names:
            raise UsageError("--rules selects vertical rules; add 'vertical' to --passes")
        wanted["rules"] = args.rules
    return options_for(names, **wanted)


def _read_plan(path: str):
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the plan ({exc.strerror})") from None
    try:
        return FusionPlan.from_json(text)
    except PlanError as exc:
        raise UsageError(f"{path}: {exc}") from None


def run(args) -> int:
    dims = parse_dims(args.dim)
    target = check_output(args.output, [args.input])
    report_path = check_output(args.report, [args.input, args.output]) if args.report else None
    plan_in = _read_plan(args.plan) if args.plan else None
    names = plan_in.options.get("passes", []) if plan_in is not None else parse_passes(args.passes)
    options = _options(args, names) if plan_in is None else {}
    graph = load_input(args.input)
    if not len(graph.graph.outputs):
        raise ModelError(args.input, "the model has no outputs: nothing to fuse or check")
    compare = not args.no_verify
    try:
        result = apply(graph, plan_in, compare=compare) if plan_in is not None else \
            fuse(graph, names, compare=compare, select=args.select, select_level=args.select_level, **options)
    except StaleGroup as exc:
        raise UsageError(f"{args.plan}: {exc}; the plan does not fit {args.input}") from None
    except ValueError as exc:
        if isinstance(exc, ModelError):
            raise
        raise UsageError(str(exc).splitlines()[0]) from None
    check = result.check
    if args.no_verify:
        verdict = "not compared with the original (--no-verify); " + \
            (f"the fused model ran on random inputs{_dims_note(check.dims)}" if check.ran else f"not run: {check.note}")
    else:
        report = _verify(graph, result, dims, args.input)
        if not report.ok:
            print(report.table())
            print("fusionlab fuse: the fused model is NOT equivalent; nothing written")
            return 1
        verdict = f"verified: max abs error {report.max_abs:.2e}"
    save_model(result.graph, target, source=args.input)
    if report_path is not None:
        _write_json_atomic(report_path, {
            "input": str(args.input), "output": str(args.output), "passes": names, "options": options,
            "before": result.before, "after": result.after, "verified": not args.no_verify,
            "run_check": check.summary(),
            "plan": result.plan.to_dict(),
        })
    print(result.summary())
    for note in result.plan.notes:
        if note.startswith("select: "):
            print(note)
    print(verdict)
    print(f"wrote {target.name}")
    return 0


def _dims_note(dims: dict) -> str:
    return f" (dims {', '.join(f'{k}={v}' for k, v in sorted(dims.items()))})" if dims else ""


def _verify(graph, result, dims, source: str):
    """Verify on `verify`'s draws, reusing the safety net's sessions. A failure to run names the model that fails:
    the input (ModelError, exit 2) or the fused model (FusionError: fusionlab's fault, exit 3)."""

    check = result.check
    try:
        fused_sess = check.fused_session if check is not None and check.fused_session is not None else \
            session(result.graph, "disable")
    except ModelError as exc:
        raise FusionError(f"onnxruntime cannot load the fused model: {exc.problem}") from None
    try:
        return verify(graph, result.graph, dims=dims, fused_session=fused_sess,
                      original_session=check.original_session if check is not None else None)
    except ModelError as exc:
        if exc.source == source:
            raise
        raise FusionError(f"the fused model: {exc.problem}") from None
