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

from ..graph import Graph

__all__ = ["FusionError", "problems", "interface_problems", "checker_problem", "unknown_ops"]


class FusionError(RuntimeError):
    """A rewrite produced an invalid model: a bug in fusionlab, named by pass, rule and group."""

    def __init__(self, problem: str, *, pass_name: str = "", rule: str = "", group: str = ""):
        self.problem, self.pass_name, self.rule, self.group = problem, pass_name, rule, group
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


#: the domain the checker's copy moves the user's own unknown ops to (a domain onnx does not check)
_UNCHECKED = "fusionlab.unchecked"


def unknown_ops(proto: onnx.ModelProto) -> frozenset[str]:
    """Op types of the model's own default-domain nodes that onnx has no schema for at the model's opset.

    onnxruntime registers some ops in the ONNX domain that onnx does not (SimplifiedLayerNormalization,
    LayerNormalization before opset 17); a model holding one can never pass onnx.checker, whatever a rewrite
    does. Only ops of the *original* are excused this way: a rewrite may not write one (see `lowering`).
    """
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
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


def _unknown_moved(proto: onnx.ModelProto, ops: frozenset[str]) -> onnx.ModelProto:
    """The model with default-domain nodes of `ops` moved to a domain the checker does not check the schema of,
    so it still checks everything around them."""
    moved = [n for n in proto.graph.node if n.domain in ("", "ai.onnx") and n.op_type in ops]
    for n in moved:
        n.domain = _UNCHECKED
    if moved and not any(o.domain == _UNCHECKED for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid(_UNCHECKED, 1))
    return proto


def checker_problem(graph: Graph, excused: frozenset[str] = frozenset()) -> str | None:
    """onnx.checker (full_check) on a graph, as one line; None when it passes. Default-domain nodes of the op
    types `excused` (the original model's own ops onnx does not know, `unknown_ops`) are not schema-checked."""
    proto = graph.to_proto()
    try:
        onnx.checker.check_model(_unknown_moved(proto, excused) if excused else proto, full_check=True)
    except Exception as exc:  # ValidationError, InferenceError, or a size error
        text = str(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
    return None


def problems(original: Graph, fused: Graph, *, checker: bool = True) -> list[str]:
    """Everything wrong with `fused` as a rewrite of `original` (empty: valid).

    The checker judges the fused model as it is, except for ops of the original that onnx has no schema for
    (`unknown_ops`: those nodes are moved out of its sight in both models). If the original fails the checker
    even so, a fused model failing it too is not reported (the fuzzer's judge and the run check still apply).
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
    from ..graph import has_external_tensors

    return has_external_tensors(graph.model)
