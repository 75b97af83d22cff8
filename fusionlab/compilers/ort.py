"""What onnxruntime itself runs: the node count of its optimised graph at a given level."""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx

from ..graph import load
from ..verification import runtime

__all__ = ["optimized_ops", "kernel_count", "op_table"]


def optimized_ops(model, level: str = "extended") -> dict[str, int]:
    """{op type (domain:op for contrib ops): count} of the graph onnxruntime runs after its own fusions."""

    with tempfile.TemporaryDirectory(prefix="fusionlab-ort-") as tmp:
        path = Path(tmp) / "optimized.onnx"
        runtime.session(model, level, 1, optimized_path=path)
        proto = onnx.load(str(path))
    counts: dict[str, int] = {}
    for n in proto.graph.node:
        key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def kernel_count(model, level: str = "extended") -> int:
    """Kernels onnxruntime launches per run at `level`: the nodes of its optimised graph (Constants excluded)."""
    return sum(n for op, n in optimized_ops(model, level).items() if op != "Constant")


def op_table(model, fused, levels: tuple[str, ...] = ("basic", "extended", "all")) -> str:
    """Op counts side by side: the original `model`, the graph onnxruntime runs at each of `levels`, and `fused`.

    One row per op type (domain-qualified for contrib ops) and a total: what each column launches."""
    columns = {"original": load(model).op_counts(),
               **{f"ORT {level}": optimized_ops(model, level) for level in levels},
               "fusionlab": load(fused).op_counts()}
    ops = sorted(set().union(*columns.values()))
    lines = [f"{'op':<34}" + "".join(f"{c:>13}" for c in columns)]
    lines += [f"{op:<34}" + "".join(f"{columns[c].get(op, 0):>13}" for c in columns) for op in ops]
    lines.append(f"{'total':<34}" + "".join(f"{sum(columns[c].values()):>13}" for c in columns))
    return "\n".join(lines)
