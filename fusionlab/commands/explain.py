"""`fusionlab explain MODEL`: the fusion plan and its predicted cost per device; `--why-not` for refusals.

The plan is the one `fusionlab fuse` makes with the same passes and options (the same default passes,
`fusionlab.plan.DEFAULT_PASSES`), so the prediction describes the model `fuse` writes; every printed
prediction names its passes. `--save-counts FILE` / `--expect FILE` are the drift guard
(`fusionlab.drift`): which fusions fire, saved once and checked again (exit 1 on a difference).
"""

from __future__ import annotations

from .. import cost, drift
from ..cli import UsageError
from ..cost import devices
from ..passes import options_for, plan
from ..plan import DEFAULT_PASSES
from ..text import MAX_WIDTH, wrap
from . import add_dim_option, check_output, load_input, parse_dims, parse_passes

KINDS = ("vertical", "horizontal", "mixed")


def register(sub) -> None:
    p = sub.add_parser("explain", help="show the fusion plan, its predicted cost per device, and why not",
                       description="Plan fusion exactly as `fusionlab fuse` would (nothing is written) and cost the "
                                   "plan with the roofline model on device presets. --why-not lists the candidates "
                                   "rules refused, grouped by rule and reason, nearest misses first.")
    p.add_argument("model", nargs="?", help="ONNX model to explain (only read)")
    p.add_argument("--device", action="append", default=[], metavar="NAME",
                   help="device preset (repeatable; default: the four Ascend presets; 'this machine' measures)")
    p.add_argument("--passes", default=",".join(DEFAULT_PASSES),
                   help=f"comma-separated fusion kinds, in order (default {','.join(DEFAULT_PASSES)}, as fuse)")
    p.add_argument("--max-group-ops", type=int, default=None, metavar="N",
                   help="largest group a chain or mixed group may form (default: each pass's own, as fuse)")
    p.add_argument("--buffer-kb", type=float, default=None, help="on-chip budget per group for the mixed pass")
    p.add_argument("--why-not", nargs="?", const="", default=None, metavar="NODE",
                   help="list the candidates rules refused and why (all, or only those anchored on NODE)")
    p.add_argument("--save-counts", metavar="FILE", default=None,
                   help="write the fusions that fire (per rule, and per onnxruntime fused-op type) to FILE")
    p.add_argument("--expect", metavar="FILE", default=None,
                   help="check the fusions that fire against FILE (from --save-counts); exit 1 on a difference")
    p.add_argument("--ort-level", choices=["basic", "extended", "all"], default="extended",
                   help="onnxruntime level whose fused ops --save-counts records (default extended: ALL adds "
                        "layout ops that depend on the CPU, so counts saved on one machine would drift on another)")
    add_dim_option(p)
    p.add_argument("--max-rows", type=int, default=30, help="groups to list (default 30)")
    p.set_defaults(func=run)


def _model_and_node(args) -> tuple[str, str | None]:
    """(model path, --why-not node): `explain --why-not M.onnx` gives the path to --why-not; take it back."""

    model, node = args.model, args.why_not
    if model is None and node:
        model, node = node, ""
    if model is None:
        raise UsageError("the following argument is required: model (explain MODEL [options])")
    return model, node


def run(args) -> int:
    args.model, args.why_not = _model_and_node(args)
    kinds = parse_passes(args.passes, allowed=KINDS)
    if args.max_group_ops is not None and args.max_group_ops < 1:
        raise UsageError("--max-group-ops must be >= 1")
    if args.buffer_kb is not None and args.buffer_kb <= 0:
        raise UsageError("--buffer-kb must be > 0")
    if args.save_counts and args.expect:
        raise UsageError("--save-counts and --expect are two steps: save once, then expect")
    try:
        devs = [devices.get(d) for d in args.device] or list(devices.load_devices().values())
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    dims = parse_dims(args.dim)
    graph = load_input(args.model)
    if args.expect:
        return _expect(args, graph, dims)
    options = {"buffer_kb": args.buffer_kb, "dims": dims or None}
    if args.max_group_ops is not None:
        options["max_group_ops"] = args.max_group_ops
    fplan = plan(graph, kinds, **options_for(kinds, **options))
    if args.why_not is not None:
        code = _why_not(args, graph, fplan)
    else:
        code = _explain(args, graph, fplan, kinds, devs, dims, cost)
    if args.save_counts:
        _save_counts(args, graph, kinds, options)
    return code


def _explain(args, graph, fplan, kinds, devs, dims, cost) -> int:
    passes = "+".join(kinds)
    limit = f"; at most {args.max_group_ops} ops per group" if args.max_group_ops else ""
    print(wrap(f"{args.model}: {len(graph)} nodes. Plan of passes {', '.join(kinds)}{limit}: the model "
               f"`fusionlab fuse` writes with the same options.", MAX_WIDTH))
    print(fplan.table(max_rows=args.max_rows, wrap=True))
    # the cost table's kernels column, reconciled with the footer: one accounting (FusionPlan.counts)
    counts = fplan.counts(cost.plan_cost(graph, fplan, devs[0], dims), cost.plan_cost(graph, None, devs[0], dims))
    print(wrap(f"with {counts.fused_kernels - counts.kernels} kernel(s) for the nodes outside groups, the model "
               f"launches {counts.unfused_kernels} -> {counts.fused_kernels} kernels (the table below)"
               f"{counts.prepared_text()}", MAX_WIDTH))
    refused = {str(r) for r in fplan.refusals}
    for note in fplan.notes:
        if not any(note.endswith(r) for r in refused):
            print(wrap(f"note: {note}", MAX_WIDTH))
    if fplan.refusals:
        rules = len({r.rule for r in fplan.refusals})
        print(wrap(f"{len(set(fplan.refusals))} candidate(s) refused by {rules} rule(s): "
                   f"fusionlab explain --why-not {args.model}", MAX_WIDTH))
    print()
    print(f"predicted (roofline model): the loaded model, and the model `fuse --passes {','.join(kinds)}` writes")
    print(cost.compare(graph, {"unfused": None, f"fused: {passes}": fplan}, devs, dims=dims).table())
    uncertain = sorted({f for d in devs for f in d.uncertain})
    if uncertain:
        print(wrap(f"model: roofline + launch overhead; uncertain device figures used: {', '.join(uncertain)} "
                   "(see data/devices.json)", MAX_WIDTH))
    return 0


def why_not_lines(fplan, node: str | None = None, width: int = MAX_WIDTH, examples: int = 3) -> list[str]:
    """The near misses as text: per rule, per condition, how many, the failing values and where."""
    groups = fplan.near_misses(node)
    if not groups:
        return []
    total = sum(len(g.refusals) for g in groups)
    rules = list(dict.fromkeys(g.rule for g in groups))
    passes = ", ".join(fplan.options.get("passes", []))
    out = [f"{total} candidate(s) refused by {len(rules)} rule(s) of passes {passes}, nearest misses first",
           "(a nearer miss had more of its pattern in place: [n matched])"]
    for rule in rules:
        mine = [g for g in groups if g.rule == rule]
        out.append(f"{rule}: {sum(len(g.refusals) for g in mine)} refused")
        for g in mine:
            n = len(g.refusals)
            head = f"  {n}× " if n > 1 else "  "
            if g.structured:
                found = g.found()
                values = ", ".join(f"{v} ({k}×)" if k > 1 and len(found) > 1 else v for v, k in found[:examples])
                k = len(found) - examples
                more = f", and {k} other value{'s' if k > 1 else ''}" if k > 0 else ""
                text = f"needs {g.condition}; found {values}{more}" if found else f"needs {g.condition}"
            else:
                text = g.condition
            near = f" [{g.nearest} matched]" if g.nearest else ""
            out.append(wrap(head + text + near, width, indent=" " * len(head)))
            at = ", ".join(r.node if len(r.node) <= 48 else "…" + r.node[-47:] for r in g.refusals[:examples])
            rest = f" and {n - examples} more" if n > examples else ""
            out.append(wrap(" " * len(head) + f"at {at}{rest}", width, indent=" " * (len(head) + 3)))
    return out


def _why_not(args, graph, fplan) -> int:
    """The refused candidates, grouped by rule and condition, nearest misses first."""

    node = args.why_not or None
    if node is not None and not any(n.name == node for n in graph):
        raise UsageError(f"no node named {node!r} in {args.model}")
    if node is not None:
        fused_in = [g for g in fplan if node in g.covers]
        if fused_in:
            print(f"{node}: fused in group {fused_in[-1].id} ({fused_in[-1].rule})")
    lines = why_not_lines(fplan, node)
    if not lines:
        passes = ", ".join(fplan.options.get("passes", []))
        print(f"no rule refused {'anything' if node is None else node} (passes {passes})")
    for line in lines:
        print(line)
    return 0


def _save_counts(args, graph, kinds, options) -> None:
    target = check_output(args.save_counts, [args.model])
    data = drift.counts(graph, kinds, level=args.ort_level, **{k: v for k, v in options.items() if v is not None})
    data["model"] = str(args.model)
    drift.save(target, data)
    fired = sum(data["rules"].values())
    ort = sum(data["onnxruntime"]["fused_ops"].values())
    print(wrap(f"wrote {target}: {fired} fusionlab group(s) over {len(data['rules'])} rule(s), {ort} onnxruntime "
               f"fused op(s) at {args.ort_level}", MAX_WIDTH))


def _expect(args, graph, dims) -> int:
    try:
        expected = drift.read(args.expect)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    found, now, notes = drift.check(graph, expected, dims=dims or None)
    where = f"{args.model} against {args.expect}"
    for note in notes:
        print(f"note: {note}")
    if not found:
        ort = now.get("onnxruntime")
        also = f" and onnxruntime's fused ops at {ort['level']}" if ort else ""
        print(wrap(f"no drift: {where}: fusionlab's groups per rule ({sum(now['rules'].values())} in "
                   f"{len(now['rules'])} rules){also} as expected", MAX_WIDTH))
        return 0
    print(wrap(f"DRIFT: {where}: {len(found)} fusion(s) stopped, started or changed", MAX_WIDTH))
    for d in found:
        print(f"  {d}")
    return 1
