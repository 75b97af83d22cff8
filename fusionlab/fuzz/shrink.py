"""Shrinking a failing model to a small one that fails the same way (greedy delta debugging).

`shrink(model, still_fails)` tries edits in order of how much they remove and keeps every edit after
which `still_fails(candidate)` holds, until no edit helps or the time budget is spent:

1. drop a graph output (the nodes only it needed go with it);
2. cut the graph at an intermediate tensor: it becomes a new graph input (everything upstream that
   nothing else needs goes);
3. bypass a node: its output is replaced by one of its inputs of the same type and shape;
4. replace a graph input by a constant initializer, or an overridable initializer by a plain one;
5. shrink shapes: a symbolic dim becomes 1 or 2, a static input dim becomes 1 or half;
6. drop value_info, unused graph inputs and initializers.

Dead nodes and unused initializers are removed after every edit; graph output types are re-inferred.
`same_failure(passes, outcome, ...)` builds the usual predicate: the candidate is valid (checker and
onnxruntime, as the generator demands) and the oracle reports the same kind and symptom.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..verification.feeds import NP_TYPES
from ..verification.judge import Case
from .generator import validate
from .names import rename_tensor
from .oracle import judge

__all__ = ["shrink", "same_failure", "dead_code", "size"]


def size(model: onnx.ModelProto) -> tuple[int, int]:
    """(nodes, total elements of graph inputs): what shrinking makes smaller."""
    elems = 0
    for vi in model.graph.input:
        n = 1
        for d in vi.type.tensor_type.shape.dim:
            n *= d.dim_value if d.HasField("dim_value") else 2
        elems += n
    return len(model.graph.node), elems


def dead_code(model: onnx.ModelProto) -> onnx.ModelProto:
    """Remove nodes none of whose outputs are used, and initializers nothing reads (in place; returned)."""
    g = model.graph
    while True:
        used = {o.name for o in g.output}
        for n in g.node:
            used.update(n.input)
        keep = [n for n in g.node if any(o in used for o in n.output if o)]
        if len(keep) == len(g.node):
            break
        del g.node[:]
        g.node.extend(keep)
    used = {o.name for o in g.output} | {i for n in g.node for i in n.input}
    inputs = {i.name for i in g.input}
    inits = [t for t in g.initializer if t.name in used or t.name in inputs]
    del g.initializer[:]
    g.initializer.extend(inits)
    return model


def _types(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.value_info[:]
    try:
        inferred = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # noqa: BLE001
        inferred = m
    g = inferred.graph
    out = {vi.name: vi for vi in list(g.value_info) + list(g.output) + list(g.input)}
    for t in g.initializer:
        out.setdefault(t.name, helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return out


def _refresh_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Re-declare graph output types from shape inference (after an edit changed them)."""
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    for o in bare.graph.output:
        o.type.tensor_type.ClearField("shape")
    types = _types(bare)
    for o in model.graph.output:
        vi = types.get(o.name)
        if vi is not None and vi.type.tensor_type.elem_type:
            o.type.CopyFrom(vi.type)
    return model


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


def _finish(m: onnx.ModelProto) -> onnx.ModelProto:
    del m.graph.value_info[:]
    return _refresh_outputs(dead_code(m))


def _drop_outputs(model):
    for i in range(len(model.graph.output)):
        if len(model.graph.output) < 2:
            return
        m = _copy(model)
        del m.graph.output[i]
        yield _finish(m)


def _intermediates(model) -> list[str]:
    inputs = {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}
    out = []
    for n in reversed(model.graph.node):
        if n.op_type == "Constant":
            continue
        out += [o for o in n.output if o and o not in inputs]
    return out


def _cut(model, types):
    for t in _intermediates(model):
        vi = types.get(t)
        if vi is None or not vi.type.tensor_type.HasField("shape") or vi.type.tensor_type.elem_type not in NP_TYPES:
            continue
        if any(not d.HasField("dim_value") and not d.dim_param for d in vi.type.tensor_type.shape.dim):
            continue
        m = _copy(model)
        for n in m.graph.node:
            for k, o in enumerate(n.output):
                if o == t:
                    n.output[k] = ""  # the producer no longer defines it (an empty name: an unused output)
        m.graph.input.append(vi)
        m = _finish(m)
        yield m


def _bypass(model, types):
    outputs = {o.name for o in model.graph.output}
    for idx in range(len(model.graph.node) - 1, -1, -1):
        node = model.graph.node[idx]
        outs = [o for o in node.output if o]
        if len(outs) != 1 or node.op_type == "Constant":
            continue
        o = outs[0]
        vo = types.get(o)
        for i in dict.fromkeys(x for x in node.input if x):
            vi = types.get(i)
            if vo is None or vi is None or vi.type != vo.type:
                continue
            m = _copy(model)
            del m.graph.node[idx]
            if o in outputs:
                if i in {x.name for x in m.graph.input} | outputs:
                    continue
                rename_tensor(m.graph, i, o)
            else:
                rename_tensor(m.graph, o, i)
            yield _finish(m)


def _constants(model, types):
    g = model.graph
    inits = {t.name for t in g.initializer}
    rng = np.random.default_rng(0)
    for k, vi in enumerate(g.input):
        if vi.name in inits:  # overridable: make it a plain initializer
            m = _copy(model)
            del m.graph.input[k]
            yield _finish(m)
            continue
        dt = NP_TYPES.get(vi.type.tensor_type.elem_type)
        if dt is None or len(g.input) - len(inits) < 2:
            continue
        shape = [d.dim_value if d.HasField("dim_value") else 2 for d in vi.type.tensor_type.shape.dim]
        m = _copy(model)
        del m.graph.input[k]
        m.graph.initializer.append(numpy_helper.from_array(np.asarray(rng.standard_normal(shape)).astype(dt), vi.name))
        yield _finish(m)


def _dims(model, types):
    for k, vi in enumerate(model.graph.input):
        for j, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.dim_param:
                for v in (1, 2):
                    m = _copy(model)
                    param = d.dim_param
                    for x in list(m.graph.input) + list(m.graph.output):
                        for dd in x.type.tensor_type.shape.dim:
                            if dd.dim_param == param:
                                dd.dim_value = v
                    yield _finish(m)
            elif d.dim_value > 1:
                for v in sorted({1, d.dim_value // 2}):
                    m = _copy(model)
                    m.graph.input[k].type.tensor_type.shape.dim[j].dim_value = v
                    yield _finish(m)


def _tidy(model, types):
    if len(model.graph.value_info):
        m = _copy(model)
        del m.graph.value_info[:]
        yield m
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    for k, vi in enumerate(model.graph.input):
        if vi.name not in used:
            m = _copy(model)
            del m.graph.input[k]
            yield _finish(m)


_EDITS = (_drop_outputs, _cut, _bypass, _constants, _dims, _tidy)


def _candidates(model) -> Iterator[onnx.ModelProto]:
    types = _types(model)
    for edit in _EDITS:
        yield from (edit(model) if edit is _drop_outputs else edit(model, types))


def shrink(model: onnx.ModelProto, still_fails: Callable[[onnx.ModelProto], bool], *,
           budget_s: float = 120.0, max_checks: int = 2000) -> onnx.ModelProto:
    """A smaller model for which `still_fails` holds (the input if nothing smaller does)."""
    start = time.monotonic()
    current = _copy(model)
    checks = 0
    seen: set[bytes] = {current.SerializeToString()}
    progress = True
    while progress and time.monotonic() - start < budget_s and checks < max_checks:
        progress = False
        for cand in _candidates(current):
            if time.monotonic() - start > budget_s or checks >= max_checks:
                break
            key = cand.SerializeToString()
            if key in seen or size(cand) > size(current):
                continue
            seen.add(key)
            checks += 1
            try:
                ok = still_fails(cand)
            except Exception:  # noqa: BLE001 - a candidate the oracle cannot even judge is no reduction
                ok = False
            if ok:
                current = cand
                progress = True
                break
    return current


def same_failure(passes, outcome, *, options: dict | None = None, n_draws: int = 3) -> Callable[[onnx.ModelProto], bool]:
    """A predicate: the model is valid and fusing it with `passes` fails as `outcome` did."""

    def still_fails(m: onnx.ModelProto) -> bool:
        if validate(m, n_draws) is not None:
            return False
        return judge(Case(m, n_draws, options), passes).same_failure(outcome)

    return still_fails
