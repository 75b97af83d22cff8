"""`fusionlab customop IN.onnx --group ID --out DIR`: a fusion group as a custom op, plus its CANN package.

Writes DIR/<model>_customop.onnx (the group replaced by one `ai.onnx.contrib` node that onnxruntime runs
with a registered Python kernel) and the package (op_proto/, msopgen/, ascendc/, atc.sh,
fusion_switch.cfg, README.md). Refuses a non-empty DIR unless --force; nothing is written when the
group cannot become a custom op. `--list` shows the plan's groups and whether each can.
"""

from __future__ import annotations

from pathlib import Path

from ..cli import UsageError
from ..export import UnsupportedGroup, declare_group, library_path, package_files, replace_groups, write_package
from ..graph import save_model
from ..passes import plan
from ..passes.prepare import graph_of
from ..plan import DEFAULT_PASSES
from ..text import MAX_WIDTH, wrap
from ..verification.runtime import verify
from . import load_input, parse_passes


def register(sub) -> None:
    p = sub.add_parser("customop", help="turn a fusion group into a custom op and a CANN custom-op package",
                       description="Replace a fusion-plan group by a custom op (run in onnxruntime with a Python "
                                   "kernel, verified against the original) and generate the CANN files for it.")
    p.add_argument("model", help="input ONNX model (only read)")
    p.add_argument("--group", action="append", default=[], metavar="ID",
                   help="plan group id to replace (repeatable); see --list")
    p.add_argument("--out", metavar="DIR", help="output folder (must be empty or new, unless --force)")
    p.add_argument("--force", action="store_true", help="write into a non-empty DIR (files are replaced)")
    p.add_argument("--passes", default=",".join(DEFAULT_PASSES),
                   help=f"passes that make the plan, comma-separated (default {','.join(DEFAULT_PASSES)}, as fuse)")
    p.add_argument("--soc", default="Ascend310P3", help="soc_version for build.sh / atc.sh (default Ascend310P3)")
    p.add_argument("--no-verify", action="store_true", help="skip running both models and comparing outputs")
    p.add_argument("--list", action="store_true", help="list the plan's groups and whether each can become a custom op")
    p.set_defaults(func=run)


def _input_shape(graph) -> str | None:
    parts = []
    for v in graph.inputs():
        if v.shape is None:
            return None
        dims = [str(d) if isinstance(d, int) else "1" for d in v.shape]
        parts.append(f"{v.name}:{','.join(dims)}")
    return ";".join(parts) or None


def run(args) -> int:
    graph = load_input(args.model)
    passes = tuple(parse_passes(args.passes))
    try:
        fplan = plan(graph, passes)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.list:
        work = graph_of(graph, fplan)  # the graph the plan's groups name
        for g in fplan:
            try:
                op = declare_group(work, g)
                verdict = f"-> {op.decl.name}"
            except UnsupportedGroup as exc:
                verdict = f"no: {str(exc).split(': ', 1)[-1]}"
            print(wrap(f"{g.id:<6} {g.pattern:<40} {verdict}", MAX_WIDTH, indent=" " * 8))
        return 0
    if not args.group:
        raise UsageError("choose at least one --group ID (see --list)")
    if not args.out:
        raise UsageError("--out DIR is required")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a folder")
    if out.exists() and any(out.iterdir()) and not args.force:
        raise UsageError(f"{out} is not empty; pass --force to write into it")
    try:
        result = replace_groups(graph, fplan, args.group)
    except UnsupportedGroup as exc:
        raise UsageError(str(exc)) from None
    if not args.no_verify:
        report = verify(graph, result.graph, custom_ops_library=library_path())
        print(report.table())
        if not report.ok:
            print("not written: the custom-op model does not match the original")
            return 1
    name = f"{Path(args.model).stem}_customop.onnx"
    files = package_files(list(result.declarations().values()), name, _input_shape(graph), args.soc)
    out.mkdir(parents=True, exist_ok=True)
    save_model(result.graph, out / name, source=args.model)
    write_package(out, files, force=True)
    for op in result.ops:
        print(f"{op.group_id}: {'+'.join(op.decl.folded and [*op.decl.fused[:1], *op.decl.folded, *op.decl.fused[1:]] or op.decl.fused)}"
              f" -> {op.decl.name}")
    print(f"wrote {name} and {len(files)} package files to {out}")
    return 0
