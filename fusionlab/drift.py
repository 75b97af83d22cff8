"""The drift guard: which fusions fire on a model, saved once and checked again later.

An exporter update, an onnxruntime upgrade or a change to a rule can make a fusion silently stop firing
(onnxruntime issues #23864 and #10359: an attention fusion gone after a re-export, noticed weeks later as
a slowdown). `counts(model)` records what fires: fusionlab's groups per rule, and per fused-op type what
onnxruntime's own graph transformers produce at a level (the op types its optimised model has more of than
the original). `fusionlab explain MODEL --save-counts FILE` writes them; `--expect FILE` recomputes them
and names each fusion that stopped firing, started firing or fires a different number of times (exit 1).
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnxruntime

from . import __version__
from .files import atomic_write
from .graph import as_graph
from .passes import options_for, plan
from .plan import DEFAULT_PASSES
from .verification.runtime import session

__all__ = ["counts", "ort_fused_ops", "check", "save", "read", "Drift", "FORMAT"]

#: the counts file's format tag (bumped if its meaning changes)
FORMAT = "fusionlab-counts/1"


def _op_key(node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}:{node.op_type}"


def ort_fused_ops(model, level: str = "all") -> dict[str, int]:
    """{op type: count} of what onnxruntime's graph transformers make at `level`: the op types its optimised
    model (written with `optimized_model_filepath`) holds more of than the original, and how many more."""

    graph = as_graph(model)
    before = Counter(_op_key(n) for n in graph.graph)
    with tempfile.TemporaryDirectory(prefix="fusionlab-drift-") as tmp:
        out = Path(tmp) / "optimised.onnx"
        session(graph, level, optimized_path=out)
        proto = onnx.load(str(out), load_external_data=False)
    after: Counter = Counter()
    for n in proto.graph.node:
        after[n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}"] += 1
    return {op: after[op] - before.get(op, 0) for op in sorted(after) if after[op] > before.get(op, 0)}


def counts(model, passes=None, *, level: str | None = "extended", dims: dict | None = None, **options) -> dict:
    """What fires on `model`: {"rules": {rule: groups}} for fusionlab's `passes` (default: the default
    passes), and {"onnxruntime": {"level", "version", "fused_ops"}} unless `level` is None (default EXTENDED:
    ALL adds NCHWc layout ops whose number depends on the CPU)."""

    passes = list(passes or DEFAULT_PASSES)
    fplan = plan(as_graph(model), passes, **options_for(passes, dims=dims, **options))
    out = {"format": FORMAT, "fusionlab": __version__, "passes": passes, "rules": fplan.rule_counts()}
    if level is not None:
        out["onnxruntime"] = {"version": onnxruntime.__version__, "level": level,
                              "fused_ops": ort_fused_ops(model, level)}
    return out


def save(path, data: dict) -> Path:
    """Write counts as JSON (atomically, sorted keys: a diff of two files reads as the drift)."""

    return atomic_write(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def read(path) -> dict:
    """Counts from a file (ValueError with one line on anything that is not a counts file)."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("rules"), dict):
        raise ValueError(f"{path}: not a counts file (written by `fusionlab explain --save-counts`; "
                         f"format {FORMAT})")
    return data


@dataclass
class Drift:
    """One difference between expected and current counts."""

    source: str  # "fusionlab" or "onnxruntime"
    name: str  # rule or fused-op type
    expected: int
    now: int

    @property
    def kind(self) -> str:
        if self.now == 0:
            return "stopped firing"
        if self.expected == 0:
            return "started firing"
        return "fires a different number of times"

    def __str__(self) -> str:
        what = f"rule {self.name}" if self.source == "fusionlab" else f"onnxruntime {self.name}"
        return f"{what}: {self.kind} (expected {self.expected}, now {self.now})"


def _diff(source: str, want: dict, got: dict) -> list[Drift]:
    return [Drift(source, k, int(want.get(k, 0)), int(got.get(k, 0))) for k in sorted(set(want) | set(got))
            if int(want.get(k, 0)) != int(got.get(k, 0))]


def check(model, expected: dict, *, dims: dict | None = None) -> tuple[list[Drift], dict, list[str]]:
    """(differences, current counts, notes) of `model` against `expected` (from `read`), with the passes
    and onnxruntime level the expectation was made with."""
    ort = expected.get("onnxruntime")
    now = counts(model, expected.get("passes"), level=ort["level"] if ort else None, dims=dims)
    found = _diff("fusionlab", expected["rules"], now["rules"])
    notes = []
    if ort:
        found += _diff("onnxruntime", ort.get("fused_ops", {}), now["onnxruntime"]["fused_ops"])
        if ort.get("version") != now["onnxruntime"]["version"]:
            notes.append(f"expected with onnxruntime {ort.get('version')}, checked with "
                         f"{now['onnxruntime']['version']}")
    if expected.get("fusionlab") != now["fusionlab"]:
        notes.append(f"expected with fusionlab {expected.get('fusionlab')}, checked with {now['fusionlab']}")
    return found, now, notes
