"""`fusionlab explain IN.onnx`: the fusion plan and its predicted cost on each device."""

from __future__ import annotations

from . import add_dim_option, load_input, parse_dims, parse_passes


def register(sub) -> None:
    p = sub.add_parser("explain", help="show the fusion plan and its predicted cost per device",
                       description="Plan fusion (nothing is written) and cost the plan with the roofline model "
                                   "on device presets: latency, kernels, bytes moved and peak memory.")
    p.add_argument("model", help="ONNX model to explain (only read)")
    p.add_argument("--device", action="append", default=[], metavar="NAME",
                   help="device preset (repeatable; default: the four Ascend presets; 'this machine' measures)")
    p.add_argument("--passes", default="vertical,horizontal,mixed",
                   help="comma-separated fusion kinds, in order (default vertical,horizontal,mixed)")
    p.add_argument("--max-group-ops", type=int, default=5, help="largest group the mixed pass may form (default 5)")
    p.add_argument("--buffer-kb", type=float, default=None, help="on-chip budget per group for the mixed pass")
    add_dim_option(p)
    p.add_argument("--max-rows", type=int, default=30, help="groups to list (default 30)")
    p.set_defaults(func=run)


def run(args) -> int:
    from .. import cost, devices, widgets
    from ..cli import UsageError
    
    kinds = parse_passes(args.passes, allowed=widgets.KINDS)
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
    plan = widgets.make_plan(graph, kinds, args.max_group_ops, args.buffer_kb, dims)
    print(f"{args.model}: {len(graph)} nodes; passes {', '.join(kinds)}; max {args.max_group_ops} ops per group")
    print(plan.table(max_rows=args.max_rows))
    for note in plan.notes:
        print(f"note: {note}")
    print()
    print(cost.compare(graph, {"unfused": None, "fused": plan}, devs, dims=dims).table())
    uncertain = sorted({f for d in devs for f in d.uncertain})
    if uncertain:
        print(f"model: roofline + launch overhead; uncertain device figures used: {', '.join(uncertain)} "
              "(see data/devices.json)")
    return 0
