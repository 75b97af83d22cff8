"""Preparation before fusion: declared shapes checked, clean-up (Identity, no-op Dropout, Constant nodes, dead
code), then constant folding.

`fuse` and `apply` prepare their working copy first (`prepare=True`, the default), so rules see
`Conv -> BatchNormalization` through an Identity and a Reshape target that is really a constant.

A model's `value_info` (the shapes it declares for intermediate values) is a hint, not part of its interface,
and some models declare shapes that contradict what their graph computes (onnxruntime's reshape-fusion test
graphs declare a rank-3 Reshape output whose target has four elements). Folding would make the checker's shape
inference see through to the contradiction, and every later step would reason from a wrong shape. So first
(`repair_value_info`), each declared shape of an intermediate value is compared with onnx shape inference over
the graph *without* the declarations; a declaration that contradicts it (another rank, another static size,
another element type) is dropped, and the plan's note says how many. Declared negative dims (-1 for
"unknown") become unknown dims, as onnxruntime reads them. Graph inputs are never touched; a graph output's
declared shape is changed only when the folded graph provably computes another rank or static size (the
model's declaration was wrong; onnxruntime returns what the graph computes either way) and replaced by the
computed one (the checker wants a shape on every graph output), with the reason kept in
`graph.undeclared_outputs`, which the interface check (`validate`) accepts for exactly those outputs.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

from ..graph import Graph, as_graph
from ..shapes import _light_proto
from . import cleanup, fold as _fold

__all__ = ["prepare", "repair_value_info", "settings", "graph_of"]


def _contradicts(declared: tuple, inferred: tuple) -> bool:
    if len(declared) != len(inferred):
        return True
    return any(isinstance(a, int) and isinstance(b, int) and a >= 0 and b >= 0 and a != b
               for a, b in zip(declared, inferred))


def _dims(shape) -> tuple:
    return tuple(d if isinstance(d, int) else None for d in shape)


def _unknown_negative(v) -> bool:
    """A declared negative dim_value (some models write -1 for "unknown") made an unknown dim, as onnxruntime
    reads it; True if there was one."""
    if v.shape is None or not any(isinstance(d, int) and d < 0 for d in v.shape):
        return False
    v.shape = ir.Shape([None if isinstance(d, int) and d < 0 else d for d in v.shape])
    return True


def repair_value_info(graph: Graph, *, outputs: bool = False) -> list[str]:
    """Drop declared shapes (and types) of intermediate values that contradict shape inference over the graph
    without them; declared negative dims become unknown. With `outputs`, a graph output whose declared shape
    contradicts what the graph computes is declared with the computed shape instead (its dtype stays),
    recorded with the reason in `graph.undeclared_outputs`. Returns the names changed."""
    changed = [v.name for v in list(graph.graph.outputs) + [o for n in graph.graph for o in n.outputs]
               if v.name and _unknown_negative(v)]
    values = {v.name: v for n in graph.graph for v in n.outputs
              if v.name and not v.is_graph_output() and (v.shape is not None or v.type is not None)}
    declared_outputs = {v.name: v for v in graph.graph.outputs if outputs and v.shape is not None}
    if not values and not declared_outputs:
        return changed
    proto = _light_proto(graph)
    proto.graph.ClearField("value_info")
    for o in proto.graph.output:
        if o.name in declared_outputs:
            o.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception:
        return changed  # nothing to compare with
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        v = values.get(vi.name)
        out = declared_outputs.get(vi.name)
        if (v is None and out is None) or not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        got = _dims(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim) \
            if tt.HasField("shape") else None
        if out is not None:
            if got is not None and _contradicts(_dims(out.shape), got):
                graph.undeclared_outputs[out.name] = (f"declared {list(_dims(out.shape))}, the graph computes "
                                                      f"{list(got)}")
                # the checker wants a shape on a graph output: the computed one (its dims where known)
                out.shape = ir.Shape([d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                      for d in tt.shape.dim])
                changed.append(out.name)
            continue
        wrong_type = bool(tt.elem_type) and v.dtype is not None and int(v.dtype) != tt.elem_type
        if wrong_type or (got is not None and v.shape is not None and _contradicts(_dims(v.shape), got)):
            v.shape = None
            if wrong_type:
                v.type = None
            changed.append(v.name)
    return changed


def prepare(graph: Graph, *, fold: bool = True) -> dict[str, int]:
    """Check declared shapes, clean and (unless fold=False) fold `graph` in place; returns what was done, by kind
    (non-zero counts). Folding makes more shapes known: the declarations are checked again after it, graph
    outputs included (a declared output shape the folded graph contradicts is dropped, see `repair_value_info`)."""
    repaired = set(repair_value_info(graph))
    done = cleanup.clean(graph)
    folded = _fold.fold(graph) if fold else {}
    if any(folded.values()):
        again = cleanup.clean(graph)
        done = {k: done.get(k, 0) + again.get(k, 0) for k in set(done) | set(again)}
        repaired |= set(repair_value_info(graph, outputs=True))
    done.update(folded)
    done["contradicting value_info repaired"] = len(repaired)
    return {k: v for k, v in sorted(done.items()) if v}


def settings(plan) -> tuple[bool, bool]:
    """(prepare, fold) of how `plan` was made: whether its model was prepared first, and constants folded then."""
    options = plan.options if plan is not None else {}
    return bool(options.get("prepare", False)), bool(options.get("fold", True))


def graph_of(model, plan) -> Graph:
    """The graph whose nodes `plan`'s groups name: the prepared copy when the plan was made with `prepare`.

    `fusionlab.passes.plan` and `fuse` plan on a prepared copy (clean-up and constant folding), so a group's
    `covers` are names in that copy, and the copy can differ from the loaded model by more than deleted nodes:
    a Reshape whose target came from `Shape -> Gather -> Concat` of a group member reads a constant there.
    Anything that lays a plan over a graph (the cost model's kernels, their order, peak memory) must use this
    graph; on the loaded model that Shape chain leaves the group and comes back, and the group would be a
    cycle. The model itself is returned when the plan was made without preparation or preparing changes
    nothing; otherwise a prepared copy (the model is never modified).
    """
    graph = as_graph(model)
    prepared, fold = settings(plan)
    if not prepared:
        return graph
    work = graph.copy()
    return work if prepare(work, fold=fold) else graph
