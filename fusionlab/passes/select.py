"""Selection by measurement: a fused op is kept only where it is faster than the ops it replaces, here.

A kernel is not faster for being fused (onnxruntime's SkipLayerNormalization measured slower than Add +
LayerNormalization on this CPU). `select(graph, plan)` cuts each candidate group out of the graph as a small
model of its own (its external inputs with the model's own shapes, its constants, the values it hands on),
rewrites a copy with the group's own rule, and times the two interleaved with onnxruntime at the chosen level
(one thread). A group is kept only if the fused copy is faster (median of paired ratios > 1); groups with the
same rule, ops and shapes share one measurement. Dropped groups become refusals with the measured ratio, so
`explain --why-not` shows them; kept ones carry `extra["measured"]`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from ..analysis.shape_values import ShapeValues
from ..graph import Graph
from ..plan import FusionGroup, FusionPlan, HORIZONTAL, MIXED, Refusal, VERTICAL
from ..shapes import ShapeInfo, dim_value
from ..timing import compare_models, ratio_verdict
from . import horizontal, mixed, vertical
from .engine import StaleGroup

__all__ = ["Trial", "select", "extract"]

_PASS_OF_KIND = {VERTICAL: vertical, HORIZONTAL: horizontal, MIXED: mixed}


@dataclass
class Trial:
    """One measurement: a group's subgraph before and after its rewrite."""

    rule: str
    groups: list[str]
    speedup: float
    ci_low: float
    ci_high: float
    kept: bool

    def __str__(self) -> str:
        verdict = "kept" if self.kept else "dropped"
        return (f"{self.rule}: {self.speedup:.2f}x (95% CI {self.ci_low:.2f}-{self.ci_high:.2f}) over "
                f"{len(self.groups)} group(s): {verdict}")


def _members(graph: Graph, group: FusionGroup) -> list[ir.Node]:
    index = {n.name: n for n in graph.graph}
    return [index[n] for n in group.nodes]


def extract(graph: Graph, group: FusionGroup, info: ShapeInfo) -> Graph | None:
    """The group's nodes as a model of their own: external inputs with concrete shapes, constants kept."""
    members = _members(graph, group)
    inside = {id(n) for n in members}
    values: dict[int, ir.Value] = {}
    inputs: list[ir.Value] = []
    inits: list[ir.Value] = []
    shape_values = ShapeValues(graph, info)

    def outer(v: ir.Value) -> ir.Value | None:
        if id(v) in values:
            return values[id(v)]
        c = graph.constant(v)
        if c is None:
            c = _bound_shape_value(shape_values, v, info)  # a Reshape target computed from Shape: its value here
        if c is not None:
            new = ir.Value(name=v.name, type=ir.TensorType(ir.DataType.from_numpy(c.dtype)), shape=ir.Shape(c.shape),
                           const_value=ir.tensor(c, name=v.name))
            inits.append(new)
        else:
            shape, dt = info.concrete(v), info.dtype(v)
            if shape is None or dt is None:
                return None
            new = ir.Value(name=v.name, type=ir.TensorType(ir.DataType.from_numpy(dt)), shape=ir.Shape(shape))
            inputs.append(new)
        values[id(v)] = new
        return new

    nodes = []
    for n in members:
        ins = []
        for v in n.inputs:
            if v is None:
                ins.append(None)
            elif v.producer() is not None and id(v.producer()) in inside:
                ins.append(values[id(v)])
            else:
                got = outer(v)
                if got is None:
                    return None
                ins.append(got)
        copy = ir.Node(n.domain, n.op_type, ins, list(n.attributes.values()), num_outputs=len(n.outputs),
                       name=n.name, version=n.version)
        for old, new in zip(n.outputs, copy.outputs):
            # concrete, as the inputs are: a symbolic dim left here would not match what the inputs give
            concrete = info.concrete(old)
            new.name, new.type = old.name, old.type
            new.shape = ir.Shape(concrete) if concrete is not None else None
            values[id(old)] = new
        nodes.append(copy)
    outs = [values[id(o)] for n in members for o in n.outputs
            if o.name and (o.is_graph_output() or any(id(u.node) not in inside for u in o.uses()))]
    if not outs:
        return None
    sub = ir.Graph(inputs, outs, nodes=nodes, initializers=inits, opset_imports=dict(graph.graph.opset_imports),
                   name=f"{group.id}_subgraph")
    return Graph(ir.Model(sub, ir_version=graph.model.ir_version), name=f"{graph.name}:{group.id}")


def _bound_shape_value(shape_values: ShapeValues, v: ir.Value, info: ShapeInfo) -> np.ndarray | None:
    """The int64 value of shape arithmetic outside the group, its dim names bound as the inputs' shapes are."""
    got = shape_values.of(v)
    if got is None:
        return None
    elems, shape = got
    bound = [e if isinstance(e, int) else dim_value(e, info.dims) if isinstance(e, str) else None for e in elems]
    if any(b is None for b in bound):
        return None
    return np.array(bound, dtype=np.int64).reshape(shape)


def _signature(sub: Graph, group: FusionGroup) -> tuple:
    shapes = tuple((str(v.dtype), tuple(v.shape)) for v in sub.graph.inputs)
    consts = tuple((str(v.dtype), tuple(v.shape)) for v in sub.graph.initializers.values())
    return group.rule, tuple(group.op_types), shapes, consts


def _measure(sub: Graph, group: FusionGroup, options: dict, level: str, min_time: float):
    one = FusionPlan([FusionGroup.from_dict(group.to_dict())], options=dict(options))
    fused = sub.copy()
    _PASS_OF_KIND[group.kind].apply(fused, one)
    return compare_models(sub, fused, level_a=level, level_b=level, threads=1, min_time=min_time, min_rounds=10)


def select(graph: Graph, part: FusionPlan, *, level: str = "disable", min_time: float = 0.3) -> tuple[FusionPlan, list[Trial]]:
    """`part` with only the groups that measured faster than what they replace; and the trials."""
    info = ShapeInfo.of(graph)
    trials: dict[tuple, Trial] = {}
    keep: list[FusionGroup] = []
    for group in part:
        sub = extract(graph, group, info)
        if sub is None:
            keep.append(group)  # nothing to time it on (unknown shapes): the rule's own default decides
            continue
        key = _signature(sub, group)
        if key not in trials:
            try:
                c = _measure(sub, group, part.options, level, min_time)
            except StaleGroup:
                # the rule needs more of the model than the group's own nodes to prove the rewrite (a value
                # the cut made an input): it cannot be timed alone, and its default stands
                part.notes.append(f"select: {group.id} ({group.rule}) cannot be measured apart from the model; kept")
                keep.append(group)
                continue
            trials[key] = Trial(group.rule, [], c.speedup, c.ci_low, c.ci_high, c.speedup > 1.0)
        t = trials[key]
        t.groups.append(group.id)
        group.extra["measured"] = {"speedup": round(t.speedup, 3), "ci": [round(t.ci_low, 3), round(t.ci_high, 3)],
                                   "level": level}
        if t.kept:
            keep.append(group)
        else:
            # the interval decides the words (timing.ratio_verdict): a median below 1 inside the noise is not "slower"
            said = ("measured slower here" if ratio_verdict(t.ci_low, t.ci_high) == "slower" else
                    "not measured faster here (no clear difference)")
            part.refusals.append(Refusal(group.rule, group.anchor, f"{said}: {t.speedup:.2f}x "
                                         f"(95% CI {t.ci_low:.2f}-{t.ci_high:.2f}) at onnxruntime level {level}"))
    chosen = FusionPlan(keep, model=part.model, notes=list(part.notes), options={**part.options},
                        refusals=list(part.refusals))
    chosen.notes.extend(f"select: {t}" for t in trials.values())
    return chosen, list(trials.values())
