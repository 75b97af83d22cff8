#!/usr/bin/env python3
"""What the reference optimisers find on the corpus exports issue 19 added, beside fusionlab's passes today.

    make bench-reference          # makes .bench-venv/ (the `bench` extra; never the workbook's .venv) and runs this
    .bench-venv/bin/python benchmarks/new_exports_reference.py [--only llama swin ...]

For every export of the new architectures in tests/corpus/ (LLaMA, T5 encoder, Whisper encoder, Swin, and
the float16 ResNet and BERTs), each by every exporter setting the manifest holds:

- nodes of the original and of the graph onnxruntime EXTENDED runs (1 thread, CPU, as it saves it), and the
  op types EXTENDED adds (its fused kernels);
- onnxscript's `onnxscript.rewriter.ort_fusions.optimize_for_ort`: nodes, the fusion counts it reports, the
  op types it adds, and whether its model computes what the original does (`fusionlab.verify`);
- onnxruntime's transformers optimizer (`onnxruntime.transformers.optimizer.optimize_model`, opt_level=0: its
  Python fusions only) with the model type onnxruntime documents for the family: the same columns;
- fusionlab `passes.fuse` with the default ("vertical",) and all passes ("vertical", "horizontal", "mixed"):
  what happens today (crash / invalid / wrong / runs-fails / ok), nodes, groups by rule, op types added;
- the same fusionlab runs on each export with its norm weights set to exactly one, as Hugging Face initialises
  RMSNorm (`tests/corpus_cases.norms_at_one`; only where a norm weight feeds a Mul): what a user who exports a
  freshly initialised model gets.

Inputs: the test corpus' sizes (batch 2, sequence 16, a padded second sequence). No timing: counts only.
Writes benchmarks/results/new_exports_reference.md and .json.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

from common import RESULTS, ROOT, markdown_table, write_result

sys.path.insert(0, str(ROOT / "tests"))

import onnx  # noqa: E402

import fusionlab  # noqa: E402
from fusionlab.passes import fuse  # noqa: E402
from fusionlab.verification.runtime import session

CORPUS = ROOT / "tests" / "corpus"
NEW = ("llama", "t5_encoder", "whisper_encoder", "swin", "resnet_fp16", "bert_fp16", "bert_eager_fp16")
SETTINGS = ("ts-fold", "ts-nofold", "dynamo")
PASSES = {"vertical": ("vertical",), "all": ("vertical", "horizontal", "mixed")}
#: onnxruntime.transformers.optimizer model_type per architecture (its MODEL_TYPES; None: not a transformer)
ORT_MODEL_TYPES = {"llama": "qwen3",  # "decoder-only with RoPE, GQA, RMSNorm" (LLaMA has no type of its own)
                   "t5_encoder": "t5", "whisper_encoder": "bart",  # onnxruntime's Whisper tooling optimises as bart
                   "swin": "swin", "resnet_fp16": None, "bert_fp16": "bert", "bert_eager_fp16": "bert"}


def ops_of(proto: onnx.ModelProto) -> Counter:
    return Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in proto.graph.node)


def added(proto: onnx.ModelProto, original: Counter) -> Counter:
    """Op types in `proto` that the original does not have (the fused kernels), with counts; local-function
    calls (fusionlab's mixed groups) count as `fusionlab.fused` calls."""
    c = ops_of(proto)
    out = Counter({k: v for k, v in c.items() if k not in original and not k.startswith("fusionlab.fused.")})
    calls = sum(v for k, v in c.items() if k.startswith("fusionlab.fused."))
    if calls:
        out["function calls"] = calls
    return out


def hist(c: Counter | dict) -> str:
    items = sorted(((k, v) for k, v in c.items() if v), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{k} {v}" for k, v in items) or "—"


def first_line(exc: BaseException, n: int = 220) -> str:
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {(lines[0] if lines else '')[:n]}"


def verdict(original, proto: onnx.ModelProto, feeds: dict) -> str:
    """ok / invalid (full checker) / runs-fails / wrong, for an optimiser's model against the original."""
    notes = []
    try:
        onnx.checker.check_model(proto, full_check=True)
    except Exception as exc:
        notes.append(f"invalid ({first_line(exc, 160)})")
    try:
        report = fusionlab.verify(original, proto, feeds=feeds)
    except Exception as exc:
        return "; ".join(notes + [f"runs-fails ({first_line(exc, 160)})"])
    if not report.ok:
        bad = [f"{o.name} max abs {o.max_abs:.3g}" for o in report.outputs if not o.ok]
        notes.append("wrong (" + ", ".join(bad) + ")")
    return "; ".join(notes) or "ok"


def ort_extended(path: Path) -> onnx.ModelProto:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "opt.onnx"
        session(path, "extended", optimized_path=out)
        return onnx.load(str(out))


def run_fusionlab(graph, passes, feeds, original_ops) -> dict:
    """fuse() as a user calls it (validate=True); when it raises, what the unvalidated result is."""
    row: dict = {}
    try:
        res = fuse(graph, passes=passes)
        row["outcome"] = "fused"
    except Exception as exc:
        row["outcome"] = f"crash: fuse raised {first_line(exc)}"
        try:
            res = fuse(graph, passes=passes, validate=False)
        except Exception as exc2:
            row["unvalidated"] = f"fuse(validate=False) raised {first_line(exc2)}"
            return row
    proto = res.graph.to_proto()
    row.update(nodes=len(proto.graph.node), rules=dict(sorted(res.plan.rule_counts().items())),
               added=dict(added(proto, original_ops)), verdict=verdict(graph, proto, feeds))
    return row


def run_onnxscript(path: Path, graph, feeds, original_ops) -> dict:
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    try:
        model, counts = optimize_for_ort(ir.load(str(path)))
        proto = ir.serde.serialize_model(model)
    except Exception as exc:
        return {"error": first_line(exc)}
    return {"nodes": len(proto.graph.node), "fusions": {k: v for k, v in sorted(counts.items()) if v},
            "added": dict(added(proto, original_ops)), "verdict": verdict(graph, proto, feeds)}


def _heads_hidden(config: dict) -> tuple[int, int]:
    heads = config.get("num_attention_heads") or config.get("num_heads") or config.get("encoder_attention_heads")
    hidden = config.get("hidden_size") or config.get("d_model")
    if not isinstance(heads, int) or not isinstance(hidden, int):  # Swin: heads per stage; let it detect
        return 0, 0
    return heads, hidden


def run_ort_transformers(path: Path, entry: dict, graph, feeds, original_ops) -> dict:
    from onnxruntime.transformers.optimizer import optimize_model

    model_type = ORT_MODEL_TYPES.get(entry["model"])
    if model_type is None:
        return {"skipped": "not a transformer (no model type)"}
    heads, hidden = _heads_hidden(entry["config"])
    try:
        opt = optimize_model(str(path), model_type=model_type, num_heads=heads, hidden_size=hidden, opt_level=0)
        stats = {k: v for k, v in sorted(opt.get_fused_operator_statistics().items()) if v}
        with tempfile.TemporaryDirectory() as tmp:  # as a user gets it: saving sorts and adds its opset imports
            opt.save_model_to_file(str(Path(tmp) / "opt.onnx"))
            proto = onnx.load(str(Path(tmp) / "opt.onnx"))
    except Exception as exc:
        return {"model_type": model_type, "error": first_line(exc)}
    return {"model_type": model_type, "nodes": len(proto.graph.node), "fusions": stats,
            "added": dict(added(proto, original_ops)), "verdict": verdict(graph, proto, feeds)}


def measure(entry: dict) -> dict:
    from corpus_cases import corpus_feeds, norms_at_one

    path = CORPUS / entry["file"]
    graph = fusionlab.load(path)
    feeds = corpus_feeds(graph)
    original_ops = ops_of(graph.to_proto())
    ext = ort_extended(path)
    row = {"file": entry["file"], "model": entry["model"], "setting": entry["setting"],
           "size_bytes": entry["size_bytes"], "nodes": entry["nodes"],
           "ort_extended": {"nodes": len(ext.graph.node), "added": dict(added(ext, original_ops))},
           "onnxscript": run_onnxscript(path, graph, feeds, original_ops),
           "ort_transformers": run_ort_transformers(path, entry, graph, feeds, original_ops),
           "fusionlab": {tag: run_fusionlab(graph, passes, feeds, original_ops) for tag, passes in PASSES.items()}}
    ones = norms_at_one(graph)
    if ones is not None:
        row["fusionlab_norms_at_one"] = {tag: run_fusionlab(ones, passes, feeds, original_ops)
                                         for tag, passes in PASSES.items()}
    return row


def _ours(r: dict) -> str:
    if "nodes" not in r:
        return f"{r['outcome']}; {r.get('unvalidated', '')}"
    head = "" if r["outcome"] == "fused" else r["outcome"] + "; unvalidated: "
    return f"{head}{r['nodes']} nodes, {r['verdict']}; rules: {hist(r['rules'])}"


def _theirs(r: dict) -> str:
    if "skipped" in r:
        return f"n/a ({r['skipped']})"
    if "error" in r:
        return f"error: {r['error']}"
    return f"{r['nodes']} nodes, {r['verdict']}"


def render(rows: list[dict], manifest: dict) -> str:
    env = manifest["environment"]
    from importlib.metadata import version

    counts, fused, ours, ones = [], [], [], []
    for r in rows:
        name = f"`{r['file']}`"
        ot = r["ort_transformers"]
        counts.append([name, f"{r['size_bytes'] / 1e6:.2f}", r["nodes"], r["ort_extended"]["nodes"],
                       r["onnxscript"].get("nodes", "error"), ot.get("nodes", "n/a" if "skipped" in ot else "error"),
                       r["fusionlab"]["vertical"].get("nodes", "crash"), r["fusionlab"]["all"].get("nodes", "crash")])
        fused.append([name, hist(r["ort_extended"]["added"]),
                      hist(r["onnxscript"].get("fusions", {})) + f" → adds {hist(r['onnxscript'].get('added', {}))}; "
                      + _theirs(r["onnxscript"]),
                      (f"[{ot['model_type']}] " if "model_type" in ot else "")
                      + (hist(ot.get("fusions", {})) + f" → adds {hist(ot.get('added', {}))}; "
                         if "nodes" in ot else "")
                      + _theirs(ot),
                      hist(r["fusionlab"]["vertical"].get("added", {}))])
        ours.append([name, _ours(r["fusionlab"]["vertical"]), _ours(r["fusionlab"]["all"])])
        if "fusionlab_norms_at_one" in r:
            o = r["fusionlab_norms_at_one"]
            ones.append([name, _ours(o["vertical"]), _ours(o["all"])])
    return "\n\n".join([
        "# The exports issue 19 added: what onnxruntime, onnxscript and onnxruntime's transformers optimizer find, "
        "and what fusionlab's passes do today",
        f"Made by `benchmarks/new_exports_reference.py` (`make bench-reference`) on `tests/corpus/` (exported with "
        f"torch {env['torch']}, transformers {env['transformers']}); onnxruntime {version('onnxruntime')}, "
        f"onnxscript {version('onnxscript')}, onnx {version('onnx')}, fusionlab {version('fusionlab')} (this "
        "checkout). Counts only, no timing. Verdicts: `fusionlab.verify` against the original (onnxruntime, "
        "optimisations off; float16 outputs also against a float32 run) on the test corpus' inputs (batch 2, "
        "sequence 16, second sequence padded by 5), after the full ONNX checker: ok / invalid / wrong / "
        "runs-fails (onnxruntime cannot run the model).",
        "## Node counts",
        markdown_table(["file", "MB", "original", "ORT EXTENDED", "onnxscript optimize_for_ort",
                        "ORT transformers optimizer (opt_level 0)", "fusionlab vertical", "fusionlab all passes"],
                       counts),
        "## Fused ops each finds",
        "\"adds\": op types the optimiser's model has and the original has not, with counts (its fused kernels). "
        "onnxscript's and the transformers optimizer's own fusion counts (\"reports\") come first: they count "
        "rewrites made on the way, not ops in the final model (onnxscript's rotary_embedding rewrites, for one, "
        "are expanded back when no cos/sin cache is fused). onnx's full checker rejects "
        "`SimplifiedLayerNormalization` in the default domain at every opset (onnx has no such op; its RMS norm "
        "is `RMSNormalization`, opset 23), while onnxruntime registers it there as a contrib op and runs it.",
        markdown_table(["file", "ORT EXTENDED adds", "onnxscript optimize_for_ort: reports → adds; verdict",
                        "ORT transformers optimizer [model type]: reports → adds; verdict",
                        "fusionlab vertical adds"],
                       fused),
        "## fusionlab's passes today",
        "`fuse(model)` (default passes: vertical) and `fuse(model, passes=(\"vertical\", \"horizontal\", \"mixed\"))`"
        ", validated as a user calls them; when `fuse` raises, the unvalidated result (`validate=False`) is judged "
        "too.",
        markdown_table(["file", "fusionlab vertical (default)", "fusionlab all passes"], ours),
        "## fusionlab's passes on the same exports with their norm weights at exactly one",
        "Hugging Face initialises RMSNorm weights to one, and writes the norm as `weight * hidden`: a freshly "
        "initialised model, as a user exports it, has `Mul(ones, x)` in every norm. The corpus weights are "
        "trained-looking (norm weights ~ U(0.5, 1.5)), so this variant sets every norm weight that feeds a `Mul` "
        "to one (`tests/corpus_cases.norms_at_one`); files without such a norm are not listed.",
        markdown_table(["file", "fusionlab vertical (default)", "fusionlab all passes"], ones),
    ])


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", help="models (llama, swin, ...) or files")
    ap.add_argument("--render", action="store_true", help="only rewrite the .md from the stored .json")
    args = ap.parse_args()
    manifest = json.loads((CORPUS / "manifest.json").read_text())
    if args.render:
        rows = json.loads((RESULTS / "new_exports_reference.json").read_text())
        write_result("new_exports_reference.md", render(rows, manifest))
        return 0
    entries = [e for e in manifest["models"] if e["model"] in NEW
               and (not args.only or e["model"] in args.only or e["file"] in args.only)]
    entries.sort(key=lambda e: (NEW.index(e["model"]), SETTINGS.index(e["setting"])))
    rows = []
    for e in entries:
        print(f"  {e['file']}", flush=True)
        rows.append(measure(e))
    (RESULTS / "new_exports_reference.json").write_text(json.dumps(rows, indent=1) + "\n")
    write_result("new_exports_reference.md", render(rows, manifest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
