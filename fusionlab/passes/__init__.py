"""Fusion passes: each decides *what* may fuse (a plan) and then rewrites a graph exactly as the plan says.

A pass module exposes `OPTIONS` (the options it takes, with defaults) and two functions:

- ``plan(graph, **options) -> FusionPlan``: pure analysis, the graph is not touched; the plan records the
  options that made it;
- ``apply(graph, plan) -> FusionPlan``: rewrites `graph` in place, re-checking each of the plan's groups with its
  own rule on its anchor (a group that no longer matches raises `StaleGroup`, naming it); returns the groups as
  written (copies: what each was lowered to), and never changes the plan it is given.

Module-level:

- `fuse(model, passes, **options)` runs the passes in order on a copy of the model (each pass plans on the
  graph the previous one rewrote) and checks the result: statically (`validate`: the full checker, names,
  the interface) and by running it (`runcheck`: onnxruntime loads and runs the fused model once on small random
  inputs and compares it with the original). The caller's model is never modified, and a broken rewrite
  raises `FusionError` naming the pass, rule and group after which the model first breaks, instead of being
  returned;
- `plan(model, passes, **options)` is the one planner every view uses (explain, show, customop, the
  explorer): the plan `fuse` would make, without the fused graph;
- `apply(model, plan)` rewrites a copy of the model exactly as a plan says — one read from JSON, possibly
  edited (a deleted group leaves its nodes unfused); the result's plan is the plan as written, the caller's is
  unchanged.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from ..graph import Graph, as_graph
from ..plan import FusionGroup, FusionPlan, KINDS, PlanError, VERTICAL
from ..shapes import ShapeInfo
from .engine import StaleGroup
from .fold import is_host_side
from .options import split_options
from .prepare import prepare as run_prepare, settings
from .runcheck import RunCheck, RunFailure, run_check
from .select import select as by_measurement
from .validate import FusionError, problems

__all__ = ["PASSES", "FusionResult", "FusionError", "StaleGroup", "PlanError", "fuse", "plan", "apply",
           "get_pass", "options_of", "options_for"]

#: pass name -> its module's import path; the pass that makes groups of a kind (`plan.KINDS`) is named as the kind
PASSES = {"cleanup": "fusionlab.passes.cleanup", **{kind: f"fusionlab.passes.{kind}" for kind in KINDS}}


@dataclass
class FusionResult:
    """The fused graph and the plan that produced it."""

    graph: Graph
    plan: FusionPlan
    before: dict
    after: dict
    #: what the safety net's run found (None without validation); its sessions and draw are reused by `verify`
    check: RunCheck | None = field(default=None, repr=False)

    def summary(self) -> str:
        lines = [f"nodes: {sum(self.before.values())} -> {sum(self.after.values())}"]
        for rule, n in self.plan.rule_counts().items():
            lines.append(f"  {rule:<28} {n} group(s)")
        return "\n".join(lines)


def get_pass(name: str):
    """The module of the pass `name`; ValueError naming the passes for an unknown one."""
    if name not in PASSES:
        raise ValueError(f"unknown pass {name!r}; choose from {', '.join(PASSES)}")
    return importlib.import_module(PASSES[name])


def options_of(passes) -> dict:
    """{option: default} of every option the named passes take."""
    out: dict = {}
    for name in passes:
        out.update(get_pass(name).OPTIONS)
    return out


def options_for(passes, **options) -> dict:
    """The options the named passes take, out of settings meant for any pass (a UI's sliders, CLI flags).

    A setting no pass at all takes is still an error (ValueError naming it), so a misspelling never goes quiet.
    """
    every = options_of(PASSES)
    unknown = sorted(set(options) - set(every))
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r}; valid options: {', '.join(sorted(every))}")
    mine = options_of(passes)
    return {k: v for k, v in options.items() if k in mine}


def _merge(combined: FusionPlan, part: FusionPlan) -> None:
    for group in part:
        combined.add(group)
    combined.notes.extend(part.notes)
    combined.refusals.extend(part.refusals)
    combined.options.update(part.options)


def _made(graph: Graph, part: FusionPlan, before: set[str]) -> dict[str, list[str]]:
    """{group id: the nodes its rewrite put in the graph}: each node new since `before` goes to the group that
    made it (`Graph.made_by`), else to the group of this pass whose `covers` hold the loaded nodes it stands
    for (`Graph.covers`)."""
    made: dict[str, list[str]] = {g.id: [] for g in part}
    covers = [(set(g.covers), g.id) for g in part]
    for n in graph.nodes():
        if n.name in before:
            continue
        if graph.made_by.get(n.name) in made:
            made[graph.made_by[n.name]].append(n.name)
            continue
        origin = set(graph.covers(n.name))
        home = min(((len(c), gid) for c, gid in covers if origin <= c), default=None)
        if home is not None:
            made[home[1]].append(n.name)
    return made


def _count_runs(graph: Graph, combined: FusionPlan, made: dict[str, list[str]], dims: dict | None) -> None:
    """Set each group's `runs`: the kernels of its rewrite still in the fused model, after every pass (a later
    group may have taken some of them in). Host-side shape arithmetic launches no kernel and is not counted,
    as the cost model does not count it (`fold.is_host_side`)."""
    index = {n.name: n for n in graph.nodes()}
    info = ShapeInfo.of(graph, dims or {})
    for group in combined:
        alive = [index[n] for n in made.get(group.id, ()) if n in index]
        group.runs = sum(1 for n in alive if not is_host_side(n, info))


def fuse(model, passes=("vertical",), *, prepare: bool = True, fold: bool = True, validate: bool = True,
         compare: bool = True, select: str | None = None, select_level: str = "disable", **options) -> FusionResult:
    """Run the named passes in order on a copy of `model`; returns the fused graph and the combined plan.

    The copy is first prepared (`fusionlab.passes.prepare`: clean-up, then constant folding unless `fold=False`)
    unless `prepare=False`. With `validate` (the default) the result is checked statically and by running it once
    (`runcheck`; `compare=False` runs it without comparing it with the original), and a broken rewrite
    raises `FusionError`; a model onnxruntime cannot load at all is refused (`ModelError` naming it).
    `select="measured"` keeps only the groups that measure faster than the ops they replace, timed on the
    model's own shapes at onnxruntime level `select_level` (`fusionlab.passes.select`).
    """
    if select not in (None, "measured"):
        raise ValueError(f"unknown selection {select!r}; choose None or 'measured'")
    passes = list(passes)
    original = as_graph(model)
    per_pass = split_options([(p, get_pass(p).OPTIONS) for p in passes], options)
    graph = original.copy()
    combined = FusionPlan(model=original.name, options={"passes": passes, "prepare": prepare, "fold": fold})
    if prepare:
        _prepare(graph, combined, fold=fold)
    made: dict[str, list[str]] = {}
    for name in passes:
        module = get_pass(name)
        part = module.plan(graph, **per_pass[name])
        if select == "measured" and len(part):
            part, _ = by_measurement(graph, part, level=select_level)
        before = {n.name for n in graph.nodes()}
        part = _apply_part(graph, module, part, name)
        made.update(_made(graph, part, before))
        for group in part:
            if group.kind == VERTICAL:
                group.extra["fused_nodes"] = made[group.id]
        _merge(combined, part)
    _count_runs(graph, combined, made, options.get("dims"))
    if select:
        combined.options["select"] = {"by": select, "level": select_level}
    result = FusionResult(graph, combined, original.op_counts(), graph.op_counts())
    if validate:
        _check(original, result, compare=compare, dims=options.get("dims"))
    return result


def plan(model, passes=("vertical",), *, prepare: bool = True, fold: bool = True, **options) -> FusionPlan:
    """The plan `fuse` makes for these passes and options (groups of later passes see earlier rewrites)."""
    return fuse(model, passes, prepare=prepare, fold=fold, validate=False, **options).plan


def _prepare(graph: Graph, fplan: FusionPlan, *, fold: bool) -> None:
    done = run_prepare(graph, fold=fold)
    if done:
        fplan.notes.append("prepare: " + ", ".join(f"{k} {v}" for k, v in done.items()))
    for name, why in graph.undeclared_outputs.items():
        fplan.notes.append(f"prepare: graph output {name!r} {why}: declared as computed")


def _apply_part(graph: Graph, module, part: FusionPlan, name: str) -> FusionPlan:
    """The pass's `apply` of `part` to `graph`: the groups as written; a crash is a FusionError naming the pass."""
    try:
        return module.apply(graph, part)
    except (StaleGroup, FusionError, PlanError):
        raise
    except Exception as exc:  # a rewrite that crashes is our bug: say where
        group = ", ".join(g.id for g in part)[:60]
        raise FusionError(f"{type(exc).__name__}: {exc}", pass_name=name, group=group) from exc


def apply(model, fplan: FusionPlan, *, validate: bool = True, compare: bool = True) -> FusionResult:
    """Rewrite a copy of `model` exactly as `fplan` says, pass by pass in the plan's order; checked as `fuse`
    checks (`validate`, `compare`)."""
    original = as_graph(model)
    graph = original.copy()
    prepared, fold = settings(fplan)
    if prepared:
        _prepare(graph, FusionPlan(), fold=fold)
    order = fplan.options.get("passes") or [kind for kind in KINDS if any(g.kind == kind for g in fplan)]
    unknown = [p for p in order if p not in PASSES]
    if unknown:
        raise PlanError(f"the plan names an unknown pass {unknown[0]!r}")
    written: dict[str, FusionGroup] = {}
    for name in order:
        part = FusionPlan([g for g in fplan if g.kind == name], model=fplan.model,
                          options={k: v for k, v in fplan.options.items() if k == name})
        written.update((g.id, g) for g in _apply_part(graph, get_pass(name), part, name))
    done = FusionPlan([written.get(g.id, g) for g in fplan], model=fplan.model, notes=list(fplan.notes),
                      options=dict(fplan.options), refusals=list(fplan.refusals))
    result = FusionResult(graph, done, original.op_counts(), graph.op_counts())
    if validate:
        _check(original, result, compare=compare, dims=_plan_dims(fplan))
    return result


def _plan_dims(fplan: FusionPlan) -> dict | None:
    """The symbolic-dim sizes the plan was made for (a pass's `dims` option), if any."""
    for value in fplan.options.values():
        if isinstance(value, dict) and value.get("dims"):
            return dict(value["dims"])
    return None


def _check(original: Graph, result: FusionResult, *, compare: bool = True, dims: dict | None = None) -> None:
    """FusionError if the fused graph is not a valid rewrite or does not run (or, with `compare`, does not agree
    with the original on random inputs), naming the step after which it first breaks; sets `result.check`."""
    found = problems(original, result.graph)
    if found:
        raise _blamed(original, result.plan, found[0], lambda g: bool(problems(original, g)))
    sessions: dict = {}
    try:
        result.check = run_check(original, result.graph, compare=compare, dims=dims, sessions=sessions)
    except RunFailure as exc:
        def broken(g: Graph) -> bool:
            try:
                run_check(original, g, compare=compare, dims=dims, sessions=sessions)
            except RunFailure:
                return True
            return False

        error = _blamed(original, result.plan, exc.problem, broken)
        error.feeds = exc.feeds
        raise error from None


def _blamed(original: Graph, fplan: FusionPlan, problem: str, broken) -> FusionError:
    """The FusionError for `problem`, naming where the model first breaks: preparation (its clean-up or its
    constant folding), or the first group of the plan after which `broken(graph)` holds."""
    step = _first_bad_prefix(original, fplan, broken)
    if step is None:
        return FusionError(problem)
    if step == 0:
        no_fold = original.copy()
        _prepare(no_fold, FusionPlan(), fold=False)
        if broken(no_fold):
            return FusionError(problem, pass_name="prepare", rule="cleanup")
        return FusionError(problem, pass_name="prepare", rule="fold")
    culprit = fplan[step - 1]
    return FusionError(problem, pass_name=culprit.kind, rule=culprit.rule, group=culprit.id)


def _first_bad_prefix(original: Graph, fplan: FusionPlan, broken) -> int | None:
    """The fewest leading groups of the plan whose rewrite (after preparation) is broken; 0: preparation alone
    already is; None: not even the whole plan replayed is. By bisection (a model once broken stays broken)."""
    groups = list(fplan)

    def bad(k: int) -> bool:
        try:
            partial = apply(original, FusionPlan(groups[:k], options=fplan.options), validate=False)
        except Exception:
            return True
        return broken(partial.graph)

    if settings(fplan)[0] and bad(0):
        return 0
    if not groups or not bad(len(groups)):
        return None
    lo, hi = 0, len(groups)  # bad(lo) is False (or untested: no preparation), bad(hi) is True
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if bad(mid):
            hi = mid
        else:
            lo = mid
    return hi
