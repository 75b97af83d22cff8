#!/usr/bin/env python3
"""Survey the export corpus (tests/corpus/) and write docs/corpus.md: every number and pattern is measured here.

    .venv/bin/python tools/corpus_survey.py            # (make corpus runs it after exporting)

Per model: nodes original → onnxruntime BASIC / EXTENDED / ALL (the optimised model onnxruntime saves with
`SessionOptions.optimized_model_filepath`, counted by op type) → fusionlab vertical / all passes; the fused
ops onnxruntime EXTENDED has and fusionlab has not; host-side shape arithmetic, Constant and Identity
nodes, weight-only computations; and the exact node patterns each exporter emits, as chains and as SSA
listings of one block per architecture (shapes from an onnxruntime run at batch 3, sequence 11).
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))

import corpus_facts as facts  # noqa: E402
from corpus_graph import Analysed, Dump, analyse, backward_slice, scope_region, scores_path, softmaxes  # noqa: E402

CORPUS = ROOT / "tests" / "corpus"
DOC = ROOT / "docs" / "corpus.md"
DIMS = {"batch": 3, "sequence": 11}  # sizes that coincide with no model dimension, so shapes read unambiguously
PADDING = 4  # the last sequence of a text batch ends in this many masked positions
SETTINGS = ("ts-fold", "ts-nofold", "dynamo")
LEVELS = {"BASIC": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
          "EXTENDED": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
          "ALL": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
#: ops that only ever compute shapes here; a local function holding one mixes host-side arithmetic into a kernel
SHAPE_OPS = {"Shape", "Unsqueeze", "Squeeze", "ConstantOfShape", "Range"}
#: model -> [(title, module path prefix or "mask")]: the blocks shown as SSA listings
REGIONS = {
    "bert": [("encoder layer 0", "model.encoder.layer.0"), ("attention mask construction", "mask")],
    "bert_eager": [("encoder layer 0", "model.encoder.layer.0"), ("attention mask construction", "mask")],
    "gpt2": [("block 0", "model.h.0"), ("attention mask construction", "mask")],
    "vit": [("patch and position embeddings", "model.embeddings"), ("encoder layer 0", "model.layers.0"),
            ("attention mask construction (dynamo only: no mask input)", "mask")],
    "convnext": [("stem", "features.0"), ("CNBlock features.1.0", "features.1.0"),
                 ("downsample (LayerNorm2d + Conv) features.2", "features.2"), ("head", "classifier")],
    "mobilenetv3": [("features.1 (depthwise, SE with ReLU)", "features.1"),
                    ("features.4 (expand, HardSwish, SE)", "features.4"), ("head", "classifier")],
    "efficientnet": [("stem features.0", "features.0"), ("MBConv features.2.0 (SiLU, SE)", "features.2.0")],
    "yolo11": [("Conv + SiLU model.1", "model.1"), ("C2PSA attention model.10", "model.10"),
               ("Detect head model.23 (DFL, anchors)", "model.23")],
    "llama": [("rotary table (cos, sin)", "model.model.rotary_emb"), ("decoder layer 0", "model.model.layers.0"),
              ("final norm", "model.model.norm"), ("causal mask construction", "mask")],
    "t5_encoder": [("block 0 (computes the relative position bias)", "model.encoder.block.0"),
                   ("mask and position bias, as added to the scores", "mask")],
    "whisper_encoder": [("conv front end and positions", "model.conv1,model.conv2,=model"),
                        ("encoder layer 0", "model.layers.0")],
    "swin": [("patch embeddings", "model.embeddings"),
             ("shifted-window block model.encoder.layers.0.blocks.1", "model.encoder.layers.0.blocks.1"),
             ("patch merging model.encoder.layers.0.downsample", "model.encoder.layers.0.downsample"),
             ("relative position bias and window mask, as added to the first block's scores", "mask")],
    "resnet_fp16": [("stem", "conv1,bn1,relu,maxpool"), ("BasicBlock with downsample layer2.0", "layer2.0")],
    "bert_fp16": [("encoder layer 0", "model.encoder.layer.0")],
    "bert_eager_fp16": [("encoder layer 0", "model.encoder.layer.0")],
}


def ops_of(proto: onnx.ModelProto, *, functions: bool = False) -> Counter:
    """Op histogram ('com.microsoft.Attention' for other domains); with `functions`, local-function bodies too."""
    def name(n):
        return n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
    c = Counter(name(n) for n in proto.graph.node)
    if functions:
        bodies = {f.name: Counter(name(n) for n in f.node) for f in proto.functions}
        for n in proto.graph.node:
            if n.op_type in bodies:
                c[name(n)] -= 1
                c.update(bodies[n.op_type])
        c = +c
    return c


def ort_optimised(path: Path, level: str) -> onnx.ModelProto:
    """The model onnxruntime runs at `level` (1 thread, CPU), as it saves it."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "opt.onnx"
        so = ort.SessionOptions()
        so.graph_optimization_level = LEVELS[level]
        so.optimized_model_filepath = str(out)
        so.intra_op_num_threads = 1
        so.log_severity_level = 3
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        return onnx.load(str(out))


def feeds_for(graph) -> dict:
    """Random inputs at DIMS; text batches get a padded last sequence so the mask computes something."""
    from fusionlab.verification.runtime import make_feeds

    feeds = make_feeds(graph, dims=DIMS)
    if "attention_mask" in feeds:
        feeds["attention_mask"][-1, -PADDING:] = 0
    return feeds


def measure(entry: dict) -> dict:
    """Everything the survey reports about one file."""
    import fusionlab
    from fusionlab.passes import fuse

    path = CORPUS / entry["file"]
    graph = fusionlab.load(path)
    a = analyse(path, feeds_for(graph))
    res = {"entry": entry, "analysed": a, "original": ops_of(a.proto)}
    for level in LEVELS:
        res[level] = ops_of(ort_optimised(path, level))
    for tag, passes in (("vertical", ("vertical",)), ("all", ("vertical", "horizontal", "mixed"))):
        try:
            proto = fuse(graph, passes=passes).graph.to_proto()
        except Exception as exc:  # a pass that fails on an export is a finding of the survey, not its end
            res[tag + "_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            proto = graph.to_proto()
        res[tag] = ops_of(proto)
        res[tag + "+bodies"] = ops_of(proto, functions=True)
        res[tag + "_calls"] = sum(1 for n in proto.graph.node if n.domain == "fusionlab.fused")
        shapey = {f.name for f in proto.functions if any(n.op_type in SHAPE_OPS for n in f.node)}
        res[tag + "_shape_calls"] = sum(1 for n in proto.graph.node if n.op_type in shapey)
    res["fused_housekeeping"] = facts.housekeeping(analyse_fused(graph) if "all_error" not in res else a)
    return res


def analyse_fused(graph) -> Analysed:
    """The fused (all passes) model, analysed like an original (for its host-side/constant-only counts)."""
    from fusionlab.passes import fuse

    fused = fuse(graph, passes=("vertical", "horizontal", "mixed")).graph
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "fused.onnx"
        onnx.save(fused.to_proto(), str(p))
        return analyse(p, feeds_for(graph))


# --------------------------------------------------------------------------------------------------
# markdown
# --------------------------------------------------------------------------------------------------

def table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(out)


def hist(c: Counter, limit: int = 0) -> str:
    items = sorted(((k, v) for k, v in c.items() if v > 0), key=lambda kv: (-kv[1], kv[0]))
    if limit and len(items) > limit:
        items = items[:limit] + [("…", sum(v for _, v in items[limit:]))]
    return ", ".join(f"{k} {v}" for k, v in items) or "—"


def _new_ops(res: dict, key: str) -> Counter:
    """Op types in `key`'s model that the original does not have (the fused kernels), with counts."""
    return Counter({k: v for k, v in res[key].items() if k not in res["original"]})


def not_exported_section(manifest: dict) -> str:
    failed = manifest.get("not_exported", [])
    if not failed:
        return "Every exporter setting exported every architecture."
    rows = [[f"`{f['file']}`", f["architecture"], f["setting"], f["stage"], f["error"]] for f in failed]
    return ("Exports an exporter could not make (`tools/export_corpus.py` writes no file and records the error in "
            "the manifest's `not_exported`):\n\n" + table(["file", "architecture", "exporter", "stage", "error"], rows))


def files_section(results: list[dict]) -> str:
    rows = []
    for r in results:
        e = r["entry"]
        ins = ", ".join(f"{i['name']}[{', '.join(map(str, i['shape']))}]" for i in e["inputs"])
        rows.append([f"`{e['file']}`", e["architecture"], e["setting"], e["opset"]["ai.onnx"],
                     f"{e['size_bytes'] / 1e6:.2f}", e["nodes"], ins])
    total = sum(r["entry"]["size_bytes"] for r in results)
    return (table(["file", "architecture", "exporter", "opset", "MB", "nodes", "inputs"], rows)
            + f"\n\n{len(results)} files, {total / 1e6:.1f} MB in all.")


def counts_section(results: list[dict]) -> str:
    rows = []
    for r in results:
        n = {k: sum(r[k].values()) for k in ("original", "BASIC", "EXTENDED", "ALL", "vertical", "all")}
        vertical = f"crash: {r['vertical_error']}" if "vertical_error" in r else n["vertical"]
        every = f"crash: {r['all_error']}" if "all_error" in r else \
            f"{n['all']} ({r['all_calls']} function calls, {r['all_shape_calls']} with shape ops inside)"
        rows.append([f"`{r['entry']['file']}`", n["original"], n["BASIC"], n["EXTENDED"], n["ALL"], vertical, every])
    return table(["file", "original", "ORT BASIC", "ORT EXTENDED", "ORT ALL", "fusionlab vertical",
                  "fusionlab all passes"], rows)


def fused_ops_section(results: list[dict]) -> str:
    rows = []
    for r in results:
        ext, ours = r["EXTENDED"], r["vertical"]
        rows.append([f"`{r['entry']['file']}`", hist(_new_ops(r, "EXTENDED")), hist(_new_ops(r, "vertical")),
                     hist(_new_ops(r, "all+bodies")), hist(ext - ours, 8), hist(ours - ext, 8)])
    return table(["file", "ORT EXTENDED's new ops", "fusionlab vertical's new ops",
                  "fusionlab all passes (inside functions)", "EXTENDED has more of", "fusionlab vertical has more of"],
                 rows)


def housekeeping_section(results: list[dict]) -> str:
    rows = []
    for r in results:
        h = facts.housekeeping(r["analysed"])
        f = r["fused_housekeeping"]
        rows.append([f"`{r['entry']['file']}`", f"{h['host']} → {f['host']}", hist(h["host_ops"], 6),
                     f"{h['Constant']} → {f['Constant']}", f"{h['Identity']} → {f['Identity']}",
                     f"{hist(h['weight_only'])} → {hist(f['weight_only'])}"])
    return table(["file", "host-side shape nodes (original → all passes)", "their ops (original)",
                  "Constant nodes", "Identity nodes", "weight-only computations (original → all passes)"], rows)


def _pattern_table(by_setting: dict[str, Counter], title: str) -> str:
    keys = sorted({k for c in by_setting.values() for k in c}, key=lambda k: (-max(c.get(k, 0) for c in
                                                                                 by_setting.values()), k))
    if not keys:
        return ""
    rows = [[f"`{k}`"] + [by_setting[s].get(k, "") if s in by_setting else "" for s in SETTINGS] for k in keys]
    return f"**{title}** (count per export)\n\n" + table(["pattern", *SETTINGS], rows)


def region_dump(a: Analysed, prefix: str) -> str:
    if prefix == "mask":
        sms = softmaxes(a)
        if not sms:
            return "(no attention)"
        _, _, masks = scores_path(a, sms[0])
        if not masks:
            return "(no mask operand on the scores)"
        return Dump(a, backward_slice(a, masks[0])).text()
    parts = prefix.split(",")  # several module paths; "=path": nodes of exactly that scope, not its children
    region = sorted({i for p in parts for i in (
        [k for k, sc in enumerate(a.scope) if sc == p[1:]] if p.startswith("=") else scope_region(a, p))})
    return Dump(a, region, "" if len(parts) > 1 else prefix).text() if region else f"(no nodes under {prefix})"


def architecture_section(model: str, results: dict[str, dict]) -> str:
    first = next(iter(results.values()))["entry"]
    cfg = {k: v for k, v in first["config"].items() if k not in ("preset",)}
    out = [f"### {model}: {first['architecture']} ({first['library']} {first['library_version']})",
           "", f"Configuration: `{json.dumps(cfg)}`", ""]
    att = {s: facts.attention(r["analysed"]) for s, r in results.items()}
    if any(att.values()):
        keys = next(v for v in att.values() if v).keys()
        rows = [[k] + [f"`{att[s][k]}`" if att.get(s) else "—" for s in SETTINGS] for k in keys]
        out += ["**Attention, first block** (chains follow the data input; `shape` = a host-computed shape)", "",
                table(["", *SETTINGS], rows), ""]
    for title, fn in (("Normalisation and pooling ops with their neighbours", facts.norms),
                      ("Activations", facts.activations),
                      ("MatMul / Gemm: bias adds and transposed inputs", facts.matmuls),
                      ("Squeeze-excitation (pool → … → Mul)", facts.squeeze_excitation),
                      ("Per-channel scale (layer-scale) Mul", facts.per_channel_scales),
                      ("RMS norms written out (op before the square → … → weight Mul)", facts.rms_norms),
                      ("Rotary embedding: rotate_half (Slice → Neg → Concat → …) and the cos/sin table",
                       facts.rotary),
                      ("Gated MLPs (SwiGLU / GeGLU: activation × up projection → down MatMul)", facts.gated_mlps),
                      ("The first attention's additive score operand (mask, position bias): its device-side ops, "
                       "and the inputs it reads", facts.additive_operand),
                      ("Float16 models: Casts, and ops computing in float32", facts.float_types)):
        t = _pattern_table({s: fn(r["analysed"]) for s, r in results.items()}, title)
        if t:
            out += [t, ""]
    for title, prefix in REGIONS.get(model, []):
        out += [f"<details><summary>SSA listing: {title} (<code>{prefix}</code>), per exporter</summary>", ""]
        for s in SETTINGS:
            if s not in results:  # an export this exporter could not make (the files section says why)
                continue
            r = results[s]
            out += [f"`{r['entry']['file']}`", "", "```text", region_dump(r["analysed"], prefix), "```", ""]
        out += ["</details>", ""]
    return "\n".join(out)


def environment_line(manifest: dict) -> str:
    from importlib.metadata import version

    env = manifest["environment"]
    exp = ", ".join(f"{k} {env[k]}" for k in ("torch", "transformers", "torchvision", "ultralytics", "onnxscript"))
    return (f"Exported with {exp} (tools/corpus-requirements.txt); surveyed with onnxruntime {ort.__version__}, "
            f"onnx {onnx.__version__}, fusionlab {version('fusionlab')} (this checkout's passes).")


def main() -> int:
    manifest = json.loads((CORPUS / "manifest.json").read_text())
    order = {m: k for k, m in enumerate(REGIONS)}
    entries = sorted(manifest["models"], key=lambda e: (order.get(e["model"], 99), SETTINGS.index(e["setting"])))
    results = []
    for e in entries:
        print(f"  {e['file']}", flush=True)
        results.append(measure(e))
    by_model: dict[str, dict[str, dict]] = {}
    for r in results:
        by_model.setdefault(r["entry"]["model"], {})[r["entry"]["setting"]] = r
    from corpus_findings import findings

    parts = [HEADER.format(env=environment_line(manifest), dims=DIMS, padding=PADDING),
             "## Key findings", "", findings(by_model), "",
             "## The files", "", files_section(results), "", not_exported_section(manifest), "",
             "## Nodes: original → onnxruntime → fusionlab", "", COUNTS_NOTE, "", counts_section(results), "",
             "## What onnxruntime EXTENDED fuses that fusionlab does not", "", FUSED_NOTE, "",
             fused_ops_section(results), "",
             "## Shape arithmetic, constants, identities", "", HOUSEKEEPING_NOTE, "", housekeeping_section(results), "",
             "## The patterns, per architecture and exporter", "", PATTERNS_NOTE, ""]
    parts += [architecture_section(m, by_model[m]) for m in REGIONS if m in by_model]
    DOC.write_text("\n".join(parts).rstrip() + "\n")
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


HEADER = """# The export corpus: what three exporters emit, and what the passes make of it

Generated by `tools/corpus_survey.py` from `tests/corpus/` (made by `tools/export_corpus.py`, see
`tests/corpus/manifest.json`); do not edit by hand: `make corpus` re-exports and rewrites this page.
{env}

Every model is a small configuration of a real architecture with random but trained-looking weights,
exported by torch's TorchScript exporter with constant folding on (`ts-fold`) and off (`ts-nofold`),
and by the dynamo exporter (`dynamo`, torch's default since 2.9; it runs the onnxscript optimizer
by default; its per-node stack-trace metadata, which holds the exporting machine's paths, is stripped).
All three use their default opset, 20. Shapes below come from an onnxruntime run
(optimisations off) at {dims}; text inputs have their last sequence padded by {padding} masked positions.
"""

COUNTS_NOTE = """Node counts of the graph onnxruntime 1 thread CPU actually runs at each level (saved with
`SessionOptions.optimized_model_filepath`), and of fusionlab's `passes.fuse` with `("vertical",)` and
`("vertical", "horizontal", "mixed")` (mixed groups become local-function calls, counted as one node each)."""

FUSED_NOTE = """"New ops" are op types the original does not contain (the fused kernels). The last two columns are the
op-type difference between onnxruntime EXTENDED's model and fusionlab vertical's (multiset difference)."""

HOUSEKEEPING_NOTE = """Host-side shape arithmetic: nodes whose outputs are all integer/bool tensors of at most 8 elements
(measured on the run), e.g. Shape → Gather → Unsqueeze → Concat feeding a Reshape; never a kernel.
Weight-only computations: nodes that compute from initializers and Constant nodes alone (what constant
folding would remove), by op type."""

PATTERNS_NOTE = """For each architecture: the first attention block as chains (each chain follows the data input back
to the projection), then counted patterns, then SSA listings of one block per exporter (`<details>`).
In the listings `%n` is a value computed in the block, `$x` one from outside (the legend says where
from), `W[..]`/`b[..]` an initializer, small constants are written out, and host-side shape arithmetic
is written inline as an expression (`Concat(Unsqueeze(Gather(Shape($a), 0, axis=0), [0]), ...)`; past five
levels it is cut to its value at the run, `⟨=[3, 11, 128]⟩`), so every statement line is a tensor
computation. The comment is the module path inside the block."""


if __name__ == "__main__":
    sys.exit(main())
