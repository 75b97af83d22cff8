"""The safety net under every rewrite: a fused model is valid ONNX with the original's interface, or an error.

`problems(original, fused)` lists what is wrong with a fused graph: the ONNX checker with `full_check=True`
(when the original passes it; only ops of the original onnx has no schema for are out of its sight), node and
tensor names unique, every graph output kept with its name, dtype, rank and static dimensions. The run check
(`runcheck`) then loads and runs it. `fuse` raises `FusionError` naming the pass, rule and group rather than
return a broken graph; the command line turns it into exit code 3 (an internal failure, not bad input).
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

from ..graph import Graph, has_external_tensors, onnx_opset
from ..shapes import ShapeInfo, _light_proto

__all__ = ["FusionError", "problems", "interface_problems", "checker_problem", "unknown_ops"]


class FusionError(RuntimeError):
    """A rewrite produced an invalid model: a bug in fusionlab, named by pass, rule and group."""

    def __init__(self, problem: str, *, pass_name: str = "", rule: str = "", group: str = "",
                 feeds: dict | None = None):
        self.problem, self.pass_name, self.rule, self.group = problem, pass_name, rule, group
        self.feeds = feeds  # the inputs of a failed run (None for a checker or interface problem)
        where = ", ".join(f"{k} {v}" for k, v in (("pass", pass_name), ("rule", rule), ("group", group)) if v)
        super().__init__(f"{where}: {problem}" if where else problem)


def _output_sig(v: ir.Value) -> tuple:
    """(dtype, rank, static dims); a negative declared dim (-1 for "unknown") is unknown, as onnxruntime reads it."""
    dims = tuple(d if isinstance(d, int) and d >= 0 else None for d in v.shape) if v.shape is not None else None
    return (str(v.dtype) if v.dtype is not None else None, None if dims is None else len(dims), dims)


def interface_problems(original: Graph, fused: Graph) -> list[str]:
    """Outputs renamed, retyped or reshaped; inputs lost; duplicate node or tensor names."""
    out = []
    a = [(v.name, _output_sig(v)) for v in original.graph.outputs]
    b = [(v.name, _output_sig(v)) for v in fused.graph.outputs]
    if [n for n, _ in a] != [n for n, _ in b]:
        out.append(f"graph outputs changed: {[n for n, _ in a]} -> {[n for n, _ in b]}")
    else:
        for (name, sa), (_, sb) in zip(a, b):
            if sa != sb and not (name in fused.undeclared_outputs and sa[0] == sb[0]):  # a wrong declaration
                out.append(f"output {name!r} changed dtype/rank/shape: {sa} -> {sb}")
    if [v.name for v in original.graph.inputs] != [v.name for v in fused.graph.inputs]:
        out.append("graph inputs changed")
    names = [n.name for n in fused.graph]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        out.append(f"duplicate node names {dup[:3]}")
    values = [v.name for v in fused.graph.inputs if v.name not in fused.graph.initializers]
    values += list(fused.graph.initializers) + [o.name for n in fused.graph for o in n.outputs if o.name]
    if len(set(values)) != len(values):
        seen, dup = set(), []
        for v in values:
            if v in seen:
                dup.append(v)
            seen.add(v)
        out.append(f"tensor(s) defined twice: {sorted(set(dup))[:3]}")
    return out


_ONNX_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


def unknown_ops(proto: onnx.ModelProto) -> frozenset[str]:
    """Op types of the model's own default-domain nodes that onnx has no schema for at the model's opset.

    onnxruntime registers some ops in the ONNX domain that onnx does not (SimplifiedLayerNormalization,
    LayerNormalization before opset 17); a model holding one can never pass onnx.checker, whatever a rewrite
    does. Only ops of the *original* are excused this way: a rewrite may not write one (see `lowering`).
    """
    opset = onnx_opset(proto, None)
    if opset is None:
        return frozenset()
    out = set()
    for n in proto.graph.node:
        if n.domain in ("", "ai.onnx") and n.op_type not in out:
            try:
                onnx.defs.get_schema(n.op_type, opset, "")
            except onnx.defs.SchemaError:
                out.add(n.op_type)
    return frozenset(out)


def _stand_ins(graph: Graph, proto: onnx.ModelProto, excused: frozenset[str]) -> onnx.ModelProto:
    """The model as the checker can check it all: each node onnx has no schema for (onnxruntime's com.microsoft
    ops; default-domain ops of `excused`) replaced by its outputs as graph inputs, typed and shaped as fusionlab
    infers them (onnxruntime's symbolic inference knows its own ops).

    Why: a single node of a domain onnx does not know makes onnx's shape inference drop *every* inference error
    of the model (it cannot be strict about a graph it cannot fully infer), so a fused model holding a FusedConv
    was never shape-checked at all. The stand-in nodes themselves are checked by onnxruntime when it loads the
    model (`runcheck`). A node whose outputs fusionlab cannot type stays where it is (an excused default-domain op
then moves to a domain the checker does not check, as a contrib op stays in its own). A call of a model-local function
    whose body holds such a node (the mixed pass wraps a contrib or an excused op with its neighbours) stands in
    the same way, and a function no call reads any more is left out of the copy.
    """
    local = {(f.domain, f.name): f for f in proto.functions}

    def unknown(n, seen=()) -> bool:
        key = (n.domain, n.op_type)
        if key in local:
            return key not in seen and any(unknown(b, seen + (key,)) for b in local[key].node)
        return n.domain not in _ONNX_DOMAINS or (n.domain in ("", "ai.onnx") and n.op_type in excused)

    values = {o.name: o for n in graph.graph for o in n.outputs if o.name}
    info = None
    keep, inputs = [], []
    for n in proto.graph.node:
        if not unknown(n):
            keep.append(n)
            continue
        if info is None:
            info = ShapeInfo.of(graph)
        typed = []
        for name in n.output:
            v = values.get(name) if name else None
            dt, shape = (info.dtype(v), info.shape(v)) if v is not None else (None, None)
            if name and (dt is None or shape is None):
                typed = None
                break
            if name:
                typed.append(onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(dt),
                                                                list(shape)))
        if typed is None:
            keep.append(n)
            continue
        inputs += typed
    _unchecked(proto, excused)
    if not inputs:
        return proto
    names = {v.name for v in inputs}
    del proto.graph.node[:]
    proto.graph.node.extend(keep)
    called = {(n.domain, n.op_type) for n in keep}
    for f in [f for f in proto.functions if (f.domain, f.name) in local and (f.domain, f.name) not in called]:
        if not any((b.domain, b.op_type) == (f.domain, f.name) for g in proto.functions for b in g.node):
            proto.functions.remove(f)
    kept_vi = [v for v in proto.graph.value_info if v.name not in names]
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(kept_vi)
    proto.graph.input.extend(inputs)
    return proto


#: the domain an excused op the checker's copy cannot stand in moves to (a domain onnx does not check)
_UNCHECKED = "fusionlab.unchecked"


def _unchecked(proto: onnx.ModelProto, excused: frozenset[str]) -> None:
    """Excused default-domain ops still in the copy (main graph and function bodies) moved to `_UNCHECKED`."""
    def move(nodes, imports) -> None:
        hit = [n for n in nodes if n.domain in ("", "ai.onnx") and n.op_type in excused]
        for n in hit:
            n.domain = _UNCHECKED
        if hit and not any(o.domain == _UNCHECKED for o in imports):
            imports.append(onnx.helper.make_opsetid(_UNCHECKED, 1))

    if excused:
        move(proto.graph.node, proto.opset_import)
        for f in proto.functions:
            move(f.node, f.opset_import)


def checker_problem(graph: Graph, excused: frozenset[str] = frozenset()) -> str | None:
    """onnx.checker (full_check) on a graph, as one line; None when it passes. Nodes onnx has no schema for
    (contrib ops, and the default-domain op types `excused`: the original's own, `unknown_ops`) stand as their
    typed outputs (`_stand_ins`), so the shape checks run over everything else.

    The checker reads the graph without the bytes of its big float weights (`shapes._light_proto`: they are
    declared as typed inputs of their shapes), which it never looks at beyond their type and shape: checking
    ResNet-50 no longer serialises its 100 MB twice. That the bytes fit the shapes is checked where they are
    read, by onnxruntime loading the model (`runcheck`)."""
    proto = _light_proto(graph)
    try:
        onnx.checker.check_model(_stand_ins(graph, proto, excused), full_check=True)
    except Exception as exc:  # ValidationError, InferenceError, or a size error
        text = str(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
    return None


def problems(original: Graph, fused: Graph, *, checker: bool = True) -> list[str]:
    """Everything wrong with `fused` as a rewrite of `original` (empty: valid).

    The checker judges the fused model with every node onnx has no schema for standing as its typed outputs
    (`_stand_ins`: contrib ops, and ops of the original onnx does not know, `unknown_ops`); an op onnx does not
    know that the rewrite wrote in the default domain is reported. If the original fails the checker even so,
    a fused model failing it too is not reported (the fuzzer's judge and the run check still apply).
    """
    out = interface_problems(original, fused)
    if checker and not _too_big(fused):
        excused = unknown_ops(original.to_proto())
        problem = checker_problem(fused, excused)
        if problem is not None and checker_problem(original, excused) is None:
            out.append(f"onnx.checker (full_check): {problem}")
    return out


def _too_big(graph: Graph) -> bool:
    """Models past protobuf's limit cannot be checked in memory (their weights stay on disk)."""
    return has_external_tensors(graph.model)
