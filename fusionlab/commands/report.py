"""`fusionlab report MODEL -o report.html`: one self-contained page to open or send (see `fusionlab.report`)."""

from __future__ import annotations

from pathlib import Path

from ..cli import UsageError
from ..files import atomic_write
from ..plan import DEFAULT_PASSES
from ..report import report
from . import add_dim_option, check_output, load_input, parse_dims, parse_passes


def register(sub) -> None:
    p = sub.add_parser("report", help="write one self-contained HTML page: plan, picture, near misses, counts, "
                                      "timing, blame",
                       description="Write an HTML page (no network needed to view it) with the fusion plan, the "
                                   "picture, the near misses, the fusions that fire, predicted cost, measured time at "
                                   "onnxruntime's DISABLE/EXTENDED/ALL levels and blame's verdict.")
    p.add_argument("model", help="the ONNX model (only read)")
    p.add_argument("-o", "--output", required=True, help="the page to write (.html)")
    p.add_argument("--passes", default=",".join(DEFAULT_PASSES), help="passes (default: as fuse)")
    p.add_argument("--level", choices=["basic", "extended", "all"], default="all",
                   help="onnxruntime level for the fused-op counts and blame (default all)")
    p.add_argument("--min-time", type=float, default=1.0, help="seconds of interleaved timing at least (default 1)")
    p.add_argument("--rounds", type=int, default=10, help="interleaved rounds at least (default 10)")
    p.add_argument("--no-timing", action="store_true", help="leave out the measured times")
    p.add_argument("--no-blame", action="store_true", help="leave out blame's verdict")
    add_dim_option(p)
    p.set_defaults(func=run)


def run(args) -> int:
    out = check_output(args.output, [args.model])
    if Path(args.output).suffix.lower() not in (".html", ".htm"):
        raise UsageError(f"{args.output}: the report is HTML; name it .html")
    if args.rounds < 1 or args.min_time < 0:
        raise UsageError("--rounds must be >= 1 and --min-time >= 0")
    passes = parse_passes(args.passes, allowed=("vertical", "horizontal", "mixed"))
    graph = load_input(args.model)
    page = report(graph, passes=passes, name=args.model, level=args.level, dims=parse_dims(args.dim) or None,
                  timing=not args.no_timing, blame=not args.no_blame, min_time=args.min_time, rounds=args.rounds)
    atomic_write(out, page.encode("utf-8"))
    print(f"wrote {out} ({len(page) / 1024:.0f} KiB, self-contained)")
    return 0
