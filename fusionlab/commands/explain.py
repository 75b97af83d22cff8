"""`fusionlab explain IN.onnx`: the fusion plan and its predicted cost on each device; `--why-not` for refusals."""

from __future__ import annotations

from . import add_dim_option, load_input, parse_dims, parse_passes

KINDS = ("vertical", "horizontal", "mixed")


def register(sub) -> None:
    p = sub.add_parser("explain", help="show the fusion plan and its predicted cost per device",
                       description="Plan fusion (nothing is written) and cost the plan with the roofline model "
                                   "on device presets: latency, kernels, bytes moved and peak memory. "
                                   "--why-not lists every candidate a rule refused, with the reason.")
    p.add_argument("model", help="ONNX model to explain (only read)")
    p.add_argument("--device", action="append", default=[], metavar="NAME",
                   help="device preset (repeatable; default: the four Ascend presets; 'this machine' measures)")
    p.add_argument("--passes", default="vertical,horizontal,mixed",
                   help="comma-separated fusion kinds, in order (default vertical,horizontal,mixed)")
    p.add_argument("--max-group-ops", type=int, default=5,
                   help="largest group a chain or mixed group may form (default 5)")
    p.add_argument("--buffer-kb", type=float, default=None, help="on-chip budget per group for the mixed pass")
    p.add_argument("--why-not", nargs="?", const="", default=None, metavar="NODE",
                   help="list the candidates rules refused and why (all, or only those anchored on NODE)")
    add_dim_option(p)
    p.add_argument("--max-rows", type=int, default=30, help="groups to list (default 30)")
    p.set_defaults(func=run)


def run(args) -> int:
    from .. import cost
    from ..cost import devices
    from ..cli import UsageError
    from ..passes import options_for, plan

    kinds = parse_passes(args.passes, allowed=KINDS)
    if args.max_group_ops < 1:
        raise UsageError("--max-group-ops must be >= 1")
    if args.buffer_kb is not None and args.buffer_kb <= 0:
        raise UsageError("--buffer-kb must be > 0")
    try:
        devs = [devices.get(d) for d in args.device] or list(devices.load_devices().values())
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    dims = parse_dims(args.dim)
    graph = load_input(args.model)
    fplan = plan(graph, kinds, **options_for(kinds, max_group_ops=args.max_group_ops, buffer_kb=args.buffer_kb,
                                             dims=dims or None))
    if args.why_not is not None:
        return _why_not(args, graph, fplan)
    print(f"{args.model}: {len(graph)} nodes; passes {', '.join(kinds)}; max {args.max_group_ops} ops per group")
    print(fplan.table(max_rows=args.max_rows))
    refused = {str(r) for r in fplan.refusals}
    for note in fplan.notes:
        if not any(note.endswith(r) for r in refused):
            print(f"note: {note}")
    if fplan.refusals:
        print(f"note: {len(fplan.refusals)} candidate(s) refused; see --why-not")
    print()
    print(cost.compare(graph, {"unfused": None, "fused": fplan}, devs, dims=dims).table())
    uncertain = sorted({f for d in devs for f in d.uncertain})
    if uncertain:
        print(f"model: roofline + launch overhead; uncertain device figures used: {', '.join(uncertain)} "
              "(see data/devices.json)")
    return 0


def _why_not(args, graph, fplan) -> int:
    """One line per refused candidate: rule, node, reason."""
    from ..cli import UsageError

    node = args.why_not or None
    if node is not None and not any(n.name == node for n in graph):
        raise UsageError(f"no node named {node!r} in {args.model}")
    rows = fplan.why_not(node)
    if node is not None:
        fused_in = [g for g in fplan if node in g.covers]
        if fused_in:
            print(f"{node}: fused in group {fused_in[-1].id} ({fused_in[-1].rule})")
    if not rows:
        print(f"no rule refused {'anything' if node is None else node}")
    for r in rows:
        print(f"{r.rule:<16} {r.node}: {r.reason}")
    return 0
