"""`fusionlab blame MODEL [--level all]`: which optimisation changed the outputs, and a minimal repro.

onnxruntime at the level you deploy against DISABLE_ALL (the transformer to blame, found by bisecting
`disabled_optimizers`), and fusionlab's own passes against the original (the rule and group to blame);
see `fusionlab.blame`. Exit 0: no difference; 1: a difference (blamed when one optimisation explains it).
"""

from __future__ import annotations

from ..blame import blame_ort, blame_passes, transformer
from ..cli import UsageError
from ..plan import DEFAULT_PASSES
from ..text import MAX_WIDTH, wrap
from ..timing import ratio_verdict
from . import add_dim_option, load_input, parse_dims, parse_passes

LEVELS = ["basic", "extended", "all"]


def register(sub) -> None:
    p = sub.add_parser("blame", help="find the optimisation that changed a model's outputs; write a minimal repro",
                       description="Run the model unoptimised and at the level you deploy, compare with the dtype's "
                                   "tolerance and a float64 reference; if they differ, bisect onnxruntime's graph "
                                   "transformers (and fusionlab's plan groups) to the one responsible, measure what "
                                   "disabling it costs, and shrink the model to the smallest one that still differs.")
    p.add_argument("model", help="the ONNX model (only read)")
    p.add_argument("--level", choices=LEVELS, default="all", help="onnxruntime level you deploy (default all)")
    p.add_argument("--only", choices=["onnxruntime", "fusionlab"], default=None,
                   help="blame only onnxruntime's optimisations or only fusionlab's passes (default both)")
    p.add_argument("--passes", default=",".join(DEFAULT_PASSES),
                   help=f"fusionlab passes to check (default {','.join(DEFAULT_PASSES)}, as fuse)")
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="onnxruntime session config entry you deploy with (repeatable), e.g. "
                        "optimization.enable_gelu_approximation=1")
    p.add_argument("--draws", type=int, default=3, help="input draws to compare on (default 3)")
    p.add_argument("--repro", default=None, metavar="PATH",
                   help="where to write the shrunk model (default MODEL-stem.ort-repro.onnx / .fusionlab-repro.onnx "
                        "in the current folder)")
    p.add_argument("--no-shrink", action="store_true", help="do not shrink or write a repro")
    p.add_argument("--shrink-budget", type=float, default=60.0, help="seconds the shrinker may take (default 60)")
    p.add_argument("--min-time", type=float, default=1.0, help="seconds of timing for the cost of disabling (default 1)")
    p.add_argument("--rounds", type=int, default=10, help="interleaved timing rounds at least (default 10)")
    add_dim_option(p)
    p.set_defaults(func=run)


def _config(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--config expects KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def run(args) -> int:
    if args.draws < 1 or args.rounds < 1 or args.min_time < 0 or args.shrink_budget <= 0:
        raise UsageError("--draws and --rounds must be >= 1, --min-time >= 0, --shrink-budget > 0")
    dims = parse_dims(args.dim)
    config = _config(args.config)
    passes = parse_passes(args.passes, allowed=("vertical", "horizontal", "mixed"))
    graph = load_input(args.model)
    budget = None if args.no_shrink else args.shrink_budget
    differs = False
    if args.only in (None, "onnxruntime"):
        res = blame_ort(graph, args.level, config=config, draws=args.draws, dims=dims or None, shrink_budget=budget,
                        repro=args.repro, time_budget=args.min_time, rounds=args.rounds, source=args.model)
        for line in ort_lines(res, args.model):
            print(wrap(line, MAX_WIDTH, indent="    "))
        differs |= res.differs
    if args.only in (None, "fusionlab"):
        repro = args.repro if args.only == "fusionlab" else None
        res = blame_passes(graph, passes, draws=args.draws, dims=dims or None, level=args.level, shrink_budget=budget,
                           repro=repro, time_budget=args.min_time, rounds=args.rounds, source=args.model)
        for line in pass_lines(res):
            print(wrap(line, MAX_WIDTH, indent="    "))
        differs |= res.differs
    return 1 if differs else 0


def _cost_text(what: str, c) -> str:
    """A Comparison of (with, without) as what the change costs: without / with, its 95% CI."""
    r, lo, hi = 1 / c.speedup, 1 / c.ci_high, 1 / c.ci_low
    word = ratio_verdict(lo, hi)  # ratio without/with: above 1, the run without it takes longer
    verdict = {"faster": "slower without it", "slower": "faster without it"}.get(word, word)
    return (f"{what}: runs take {r:.2f}× as long (95% CI {lo:.2f}–{hi:.2f}, {c.rounds} interleaved rounds, "
            f"median of paired ratios): {verdict}")


def _ops_text(c) -> str:
    return ", ".join(f"{op.split(':')[-1]}×{n}" if n > 1 else op.split(":")[-1] for op, n in c.most_common())


def _accuracy(ref: dict | None, level: str) -> str:
    if not ref:
        return "no float64 reference could run this model"
    d, a = ref.get("disable"), ref.get(level)
    if a is None or d is None or not (a == a and d == d):
        return "float64 reference: not comparable (non-finite outputs)"
    if a > 2 * d + 1e-12:
        judged = f"{level.upper()} is {a / max(d, 1e-300):.3g}× further from it: the optimisation loses accuracy"
    elif d > 2 * a + 1e-12:
        judged = f"{level.upper()} is nearer: the unoptimised graph is the less accurate one"
    else:
        judged = "as accurate as each other: the optimisation rounds in another order, it computes the same function"
    return f"against float64: DISABLE off by {d:.3g}, {level.upper()} by {a:.3g}; {judged}"


def ort_lines(res, model: str) -> list[str]:
    """One screen about onnxruntime: verdict, culprit, rewrite, errors, cost, repro."""

    lv = res.level.upper()
    head = f"onnxruntime {lv} vs DISABLE_ALL on {res.draws} input draws"
    if not res.differs:
        return [f"{head}: no difference (worst: {res.verdict.text()})"]
    out = [f"{head}: outputs DIFFER: {res.verdict.text()}"]
    if res.note:
        return out + [res.note]
    names = ", ".join(res.culprits)
    entries = [transformer(c) for c in res.culprits]
    where = "; ".join(f"level {t.level} {t.kind}, {t.does} (onnxruntime/core/optimizer/{t.source})" for t in entries
                      if t is not None) or "not in fusionlab's table"
    n = len(res.changed)
    out.append(f"responsible: {names} ({where}); found in {res.runs} runs among the {n} transformer"
               f"{'s' if n != 1 else ''} that changed the graph")
    if res.gone_ops or res.made_ops:
        shown = ", ".join(res.gone[:3]) + (f" and {len(res.gone) - 3} more" if len(res.gone) > 3 else "")
        out.append(f"with it, the optimised graph has {_ops_text(res.made_ops) or 'nothing'} where without it it has "
                   f"{_ops_text(res.gone_ops) or 'nothing'}" + (f" (from the model's {shown})" if shown else ""))
    fixed = res.fixed
    out.append(f"error against DISABLE: with it {res.verdict.max_abs:.3g}, without it {fixed.max_abs:.3g} "
               f"({'within' if fixed.ok else 'still outside'} tolerance {fixed.tolerance:.2g}); "
               + _accuracy(res.reference, res.level))
    if res.cost is not None:
        out.append(_cost_text("disabling it", res.cost))
    quoted = ", ".join(f'"{c}"' for c in res.culprits)
    out.append(f"to deploy without it: InferenceSession(model, so, disabled_optimizers=[{quoted}])")
    if res.repro is not None:
        a, b = res.repro_nodes
        out.append(f"repro: {res.repro} ({a} -> {b} nodes; still differs at {lv}, fixed by disabling {names})")
    return out


def pass_lines(res) -> list[str]:
    """One screen about fusionlab's passes: verdict, the group, errors, cost, repro."""
    passes = "+".join(res.passes)
    head = f"fusionlab passes {passes} ({res.groups} groups) vs the original on {res.verdict.report.draws} draws"
    if not res.differs:
        return [f"{head}: no difference (worst: {res.verdict.text()})"]
    g = res.group
    out = [f"{head}: outputs DIFFER: {res.verdict.text()}",
           f"responsible: rule {g.rule}, group {g.id} ({'+'.join(g.op_types)} at {g.anchor}, lowered to "
           f"{g.lowered_to or '?'}): found by bisecting the plan",
           f"error against the original: with it {res.verdict.max_abs:.3g}, without it {res.fixed.max_abs:.3g} "
           f"({'within' if res.fixed.ok else 'still outside'} tolerance)"
           + (f"; later groups still wrong: {', '.join(res.others[:5])}" if res.others else "")
           + ("; " + _accuracy(res.reference, "fused").replace("DISABLE", "original").replace("FUSED", "fused")
              if res.reference is not None else "")]
    if res.cost is not None:
        out.append(_cost_text("leaving the group unfused", res.cost))
    out.append(f"to fuse without it: fusionlab fuse --report plan.json, delete group {g.id}, fuse --plan plan.json")
    if res.repro is not None:
        a, b = res.repro_nodes
        out.append(f"repro: {res.repro} ({a} -> {b} nodes; still differs, fixed by leaving rule {g.rule} out)")
    return out
