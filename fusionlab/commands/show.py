"""`fusionlab show IN.onnx -o picture.svg|png [--plan]`: a static picture of the graph."""

from __future__ import annotations

from pathlib import Path

from . import check_output, load_input, parse_passes


def register(sub) -> None:
    p = sub.add_parser("show", help="draw a model (optionally with its fusion plan) to SVG or PNG",
                       description="Draw the graph; with --plan, fusion groups are highlighted.")
    p.add_argument("model")
    p.add_argument("-o", "--output", required=True, help="picture path ending in .svg or .png")
    p.add_argument("--plan", action="store_true", help="highlight the groups the passes would form")
    p.add_argument("--passes", default="vertical", help="passes for --plan (comma list; default vertical)")
    p.add_argument("--nodes", default=None, help="comma list of node names: draw only these and their neighbours")
    p.add_argument("--max-nodes", type=int, default=200, help="refuse bigger drawings (default 200)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..cli import UsageError
    from ..passes import plan as plan_only
    from ..viz import save_picture

    out = check_output(args.output, [args.model])
    if Path(args.output).suffix.lower() not in (".svg", ".png"):
        raise UsageError(f"{args.output}: the picture must end in .svg or .png")
    graph = load_input(args.model)
    plan = None
    if args.plan:
        try:
            plan = plan_only(graph, passes=parse_passes(args.passes))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    nodes = [n.strip() for n in args.nodes.split(",")] if args.nodes else None
    try:
        save_picture(graph, out, plan=plan, nodes=nodes, max_nodes=args.max_nodes)
    except (ValueError, KeyError) as exc:
        raise UsageError(str(exc).strip("'\"")) from None
    groups = f", {len(plan)} fusion groups highlighted" if plan is not None else ""
    print(f"wrote {out} ({len(graph)} nodes{groups})")
    return 0
