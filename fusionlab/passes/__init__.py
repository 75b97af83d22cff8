"""Fusion passes: each decides *what* may fuse (a plan) and then rewrites a graph exactly as the plan says.

A pass module exposes `OPTIONS` (the options it takes, with defaults) and two functions:

- ``plan(graph, **options) -> FusionPlan``: pure analysis, the graph is not touched; the plan records the
  options that made it;
- ``apply(graph, plan) -> None``: rewrites `graph` in place, re-checking each of the plan's groups with its own
  rule on its anchor (a group that no longer matches raises `StaleGroup`, naming it).

Module-level:

- `fuse(model, passes, **options)` runs the passes in order on a copy of the model (each pass plans on the
  graph the previous one rewrote) and checks the result (`validate`): the caller's model is never modified,
  and a broken rewrite raises `FusionError` instead of being returned;
- `plan(model, passes, **options)` is the one planner every view uses (explain, show, customop, the
  explorer): the plan `fuse` would make, without the fused graph;
- `apply(model, plan)` rewrites a copy of the model exactly as a plan says — one read from JSON, possibly
  edited (a deleted group leaves its nodes unfused).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..graph import Graph, as_graph
from ..plan import HORIZONTAL, MIXED, VERTICAL, FusionPlan, PlanError
from .engine import StaleGroup
from .options import split_options
from .validate import FusionError, problems

__all__ = ["PASSES", "FusionResult", "FusionError", "StaleGroup", "PlanError", "fuse", "plan", "plan_only", "apply",
           "get_pass", "options_of", "options_for"]

#: pass name -> module (imported lazily)
PASSES = {
    "cleanup": "fusionlab.passes.cleanup",
    "vertical": "fusionlab.passes.vertical",
    "horizontal": "fusionlab.passes.horizontal",
    "mixed": "fusionlab.passes.mixed",
}
_KIND_PASS = {VERTICAL: "vertical", HORIZONTAL: "horizontal", MIXED: "mixed"}


@dataclass
class FusionResult:
    """The fused graph and the plan that produced it."""

    graph: Graph
    plan: FusionPlan
    before: dict
    after: dict

    def summary(self) -> str:
        lines = [f"nodes: {sum(self.before.values())} -> {sum(self.after.values())}"]
        for rule, n in self.plan.rule_counts().items():
            lines.append(f"  {rule:<28} {n} group(s)")
        return "\n".join(lines)


def get_pass(name: str):
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




def _merge(combined: FusionPlan, part: FusionPlan, name: str) -> None:
    for group in part:
        combined.add(group)
    combined.notes.extend(part.notes)
    combined.refusals.extend(part.refusals)
    combined.options.update(part.options)


def fuse(model, passes=("vertical",), *, prepare: bool = True, validate: bool = True, select: str | None = None,
         select_level: str = "disable", **options) -> FusionResult:
    """Run the named passes in order on a copy of `model`; returns the fused graph and the combined plan.

    The copy is first prepared (`fusionlab.passes.prepare`: clean-up and constant folding) unless
    `prepare=False`; the result is checked (`validate`) and a broken rewrite raises `FusionError`.
    `select="measured"` keeps only the groups that measure faster than the ops they replace, timed on the
    model's own shapes at onnxruntime level `select_level` (`fusionlab.passes.select`).
    """
    if select not in (None, "measured"):
        raise ValueError(f"unknown selection {select!r}; choose None or 'measured'")
    passes = list(passes)
    original = as_graph(model)
    per_pass = split_options([(p, get_pass(p).OPTIONS) for p in passes], options)
    graph = original.copy()
    combined = FusionPlan(model=original.name, options={"passes": passes, "prepare": prepare})
    if prepare:
        _prepare(graph, combined, fold=prepare != "no-fold")
    for name in passes:
        module = get_pass(name)
        part = module.plan(graph, **per_pass[name])
        if select == "measured" and len(part):
            from .select import select as by_measurement

            part, _ = by_measurement(graph, part, level=select_level)
        _apply_part(graph, module, part, name)
        _merge(combined, part, name)
    if select:
        combined.options["select"] = {"by": select, "level": select_level}
    result = FusionResult(graph, combined, original.op_counts(), graph.op_counts())
    if validate:
        try:
            _check(original, result)
        except FusionError:
            if prepare != "no-fold" and any(n.startswith("prepare:") and "fold" in n for n in combined.notes):
                # A fold can make shape inference see through a model whose own declared shapes are wrong
                # (a value_info that contradicts what the graph computes); keep that model as it was.
                retry = fuse(model, passes, prepare="no-fold", validate=True, select=select,
                             select_level=select_level, **options)
                retry.plan.notes.append("prepare: constant folding skipped: the folded model contradicts "
                                        "the model's own declared shapes")
                return retry
            raise
    return result


def plan(model, passes=("vertical",), *, prepare: bool = True, **options) -> FusionPlan:
    """The plan `fuse` makes for these passes and options (groups of later passes see earlier rewrites)."""
    return fuse(model, passes, prepare=prepare, validate=False, **options).plan


#: the planner's old name
plan_only = plan


def _prepare(graph: Graph, fplan: FusionPlan, fold: bool = True) -> None:
    from .prepare import prepare as run_prepare

    done = run_prepare(graph, fold=fold)
    if done:
        fplan.notes.append("prepare: " + ", ".join(f"{k} {v}" for k, v in done.items()))


def _apply_part(graph: Graph, module, part: FusionPlan, name: str) -> None:
    try:
        module.apply(graph, part)
    except (StaleGroup, FusionError, PlanError):
        raise
    except Exception as exc:  # a rewrite that crashes is our bug: say where
        group = ", ".join(g.id for g in part)[:60]
        raise FusionError(f"{type(exc).__name__}: {exc}", pass_name=name, group=group) from exc


def apply(model, fplan: FusionPlan, *, validate: bool = True) -> FusionResult:
    """Rewrite a copy of `model` exactly as `fplan` says, pass by pass in the plan's order."""
    original = as_graph(model)
    graph = original.copy()
    if fplan.options.get("prepare", False):
        _prepare(graph, FusionPlan(), fold=fplan.options["prepare"] != "no-fold")
    order = fplan.options.get("passes") or [p for p in ("vertical", "horizontal", "mixed")
                                           if any(_KIND_PASS[g.kind] == p for g in fplan)]
    unknown = [p for p in order if p not in PASSES]
    if unknown:
        raise PlanError(f"the plan names an unknown pass {unknown[0]!r}")
    for name in order:
        part = FusionPlan([g for g in fplan if _KIND_PASS[g.kind] == name], model=fplan.model,
                          options={k: v for k, v in fplan.options.items() if k == name})
        _apply_part(graph, get_pass(name), part, name)
    result = FusionResult(graph, fplan, original.op_counts(), graph.op_counts())
    if validate:
        _check(original, result)
    return result


def _check(original: Graph, result: FusionResult) -> None:
    """FusionError if the fused graph is not a valid rewrite, naming the first group that breaks it."""
    found = problems(original, result.graph)
    if not found:
        return
    culprit = _first_bad_group(original, result.plan)
    if culprit is not None:
        raise FusionError(found[0], pass_name=_KIND_PASS[culprit.kind], rule=culprit.rule, group=culprit.id)
    raise FusionError(found[0])


def _first_bad_group(original: Graph, fplan: FusionPlan):
    """Apply the plan one group at a time; the first group after which the model is broken, if any."""
    for k in range(1, len(fplan) + 1):
        prefix = FusionPlan(list(fplan)[:k], options=fplan.options)
        try:
            partial = apply(original, prefix, validate=False)
        except Exception:
            return fplan[k - 1]
        if problems(original, partial.graph):
            return fplan[k - 1]
    return None
