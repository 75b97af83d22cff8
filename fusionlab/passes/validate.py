"""The safety net under every rewrite: a fused model is valid ONNX with the original's interface, or an error.

`problems(original, fused)` lists what is wrong with a fused graph: the ONNX checker with `full_check=True`
(when the original passes it), node and tensor names unique, every graph output kept with its name, dtype,
rank and static dimensions. `fuse` raises `FusionError` naming the pass, rule and group rather than return
a broken graph; the command line turns it into exit code 3 (an internal failure, not bad input).
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

from ..graph import Graph

__all__ = ["FusionError", "problems", "interface_problems", "checker_problem"]


class FusionError(RuntimeError):
    """A rewrite produced an invalid model: a bug in fusionlab, named by pass, rule and group."""

    def __init__(self, problem: str, *, pass_name: str = "", rule: str = "", group: str = ""):
        self.problem, self.pass_name, self.rule, self.group = problem, pass_name, rule, group
        where = ", ".join(f"{k} {v}" for k, v in (("pass", pass_name), ("rule", rule), ("group", group)) if v)
        super().__init__(f"{where}: {problem}" if where else problem)


def _output_sig(v: ir.Value) -> tuple:
    dims = tuple(d if isinstance(d, int) else None for d in v.shape) if v.shape is not None else None
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
            if sa != sb:
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


def _runtime_ops_as_contrib(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model with ops onnxruntime registers in the ONNX domain (SimplifiedLayerNormalization: onnx has no such
    op) moved to com.microsoft, where the checker checks everything around them and not their schema."""
    from .lowering import RUNTIME_ONNX_OPS

    moved = [n for n in proto.graph.node if n.domain in ("", "ai.onnx") and n.op_type in RUNTIME_ONNX_OPS]
    for n in moved:
        n.domain = "com.microsoft"
    if moved and not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return proto


def checker_problem(graph: Graph) -> str | None:
    """onnx.checker (full_check) on a graph, as one line; None when it passes."""
    try:
        onnx.checker.check_model(_runtime_ops_as_contrib(graph.to_proto()), full_check=True)
    except Exception as exc:  # ValidationError, InferenceError, or a size error
        text = str(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
    return None


def problems(original: Graph, fused: Graph, *, checker: bool = True) -> list[str]:
    """Everything wrong with `fused` as a rewrite of `original` (empty: valid)."""
    out = interface_problems(original, fused)
    if checker and not _too_big(fused):
        problem = checker_problem(fused)
        if problem is not None and checker_problem(original) is None:
            out.append(f"onnx.checker (full_check): {problem}")
    return out


def _too_big(graph: Graph) -> bool:
    """Models past protobuf's limit cannot be checked in memory (their weights stay on disk)."""
    from ..graph import has_external_tensors

    return has_external_tensors(graph.model)
