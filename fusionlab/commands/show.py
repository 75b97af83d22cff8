"""`fusionlab show IN.onnx -o picture.svg|png [--plan | --fused]`: a static picture of the graph, any size.

A tall graph is drawn in bands of layers side by side (a page, not a strip) with text that is never
scaled below readable; the legend is at the top. `--plan` outlines the groups the default passes (those
of `fuse`) would form; `--fused` draws the model `fuse` writes, each fused op filled and labelled with
the ops it stands for.
"""

from __future__ import annotations

from pathlib import Path

from ..cli import UsageError
from ..graph import ModelError
from ..passes import fuse, plan
from ..plan import DEFAULT_PASSES
from ..text import MAX_WIDTH
from ..viz import save_picture
from . import check_output, load_input, parse_passes


def register(sub) -> None:
    p = sub.add_parser("show", help="draw a model (with its fusion plan, or fused) to SVG or PNG",
                       description="Draw the graph; with --plan, fusion groups are outlined; with --fused, the "
                                   "fused model is drawn with its fused ops marked.")
    p.add_argument("model")
    p.add_argument("-o", "--output", required=True, help="picture path ending in .svg or .png")
    p.add_argument("--plan", action="store_true", help="outline the groups the passes would form")
    p.add_argument("--fused", action="store_true", help="draw the fused model (what `fusionlab fuse` writes)")
    p.add_argument("--passes", default=",".join(DEFAULT_PASSES),
                   help=f"passes for --plan/--fused (comma list; default {','.join(DEFAULT_PASSES)}, as fuse)")
    p.add_argument("--nodes", default=None, help="comma list of node names: draw only these and their neighbours")
    p.add_argument("--hops", type=int, default=1, help="with --nodes: neighbours this many edges away (default 1)")
    p.add_argument("--columns", default="auto", metavar="auto|N",
                   help="bands of layers side by side: auto (a page's proportions, default) or a number (1: one strip)")
    p.add_argument("--max-nodes", type=int, default=None, help="refuse drawings of more nodes (default: no limit)")
    p.set_defaults(func=run)


def run(args) -> int:
    out = check_output(args.output, [args.model])
    if Path(args.output).suffix.lower() not in (".svg", ".png"):
        raise UsageError(f"{args.output}: the picture must end in .svg or .png")
    if args.plan and args.fused:
        raise UsageError("--plan outlines groups on the model, --fused draws the fused model: choose one")
    if args.columns != "auto" and not (args.columns.isdigit() and int(args.columns) >= 1):
        raise UsageError(f"--columns takes auto or a number >= 1, not {args.columns!r}")
    if args.hops < 0:
        raise UsageError("--hops must be >= 0")
    graph = load_input(args.model)
    fplan, drawn, source = None, graph, None
    try:
        if args.plan:
            fplan = plan(graph, passes=parse_passes(args.passes))
        elif args.fused:
            result = fuse(graph, passes=parse_passes(args.passes))
            drawn, source = result.graph, graph
    except ValueError as exc:
        if isinstance(exc, ModelError):
            raise
        raise UsageError(str(exc).splitlines()[0]) from None
    nodes = [n.strip() for n in args.nodes.split(",")] if args.nodes else None
    bands = "auto" if args.columns == "auto" else int(args.columns)
    try:
        save_picture(drawn, out, plan=fplan, nodes=nodes, hops=args.hops if nodes else 0, max_nodes=args.max_nodes,
                     wrap=bands, source=source)
    except (ValueError, KeyError) as exc:
        raise UsageError(str(exc).strip("'\"")) from None
    what = f", {len(fplan)} fusion groups highlighted" if fplan is not None else ""
    if source is not None:
        fused = sum(1 for n in drawn if len(drawn.covers(n.name)) > 1 or n.domain not in ("", "ai.onnx"))
        what = f" after fusion (from {len(graph)}), {fused} fused ops marked"
    line = f"wrote {out} ({len(drawn)} nodes{what})"
    print(line if len(line) <= MAX_WIDTH else f"wrote {out}\n  ({len(drawn)} nodes{what})")
    return 0
