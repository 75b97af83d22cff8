#!/usr/bin/env python3
"""Full-size third-party exports: fusionlab against onnxruntime, onnxscript and onnxruntime's transformers optimizer.

On the full-size models `tools/export_corpus.py --full DIR` makes (BERT-base, GPT-2 small, ViT-B/16,
ConvNeXt-T, MobileNetV3-small, EfficientNet-b0 at 224, YOLO11n at 640; each by TorchScript with and
without constant folding and by dynamo), for every optimiser:

- nodes: original / the model onnxruntime EXTENDED runs / the optimiser's output;
- the optimiser's model under ORT_DISABLE_ALL vs the original under ORT_ENABLE_EXTENDED: does it beat
  onnxruntime's own fusions on its own? (issue 10's target: >= 1.0);
- the optimiser's model vs the original, both under ORT_ENABLE_ALL (target: >= 0.99).

Ratios are time(original) / time(optimised), medians of paired interleaved rounds (fusionlab.timing.compare),
95% CI, one intra-op thread; > 1 means the optimised model is faster. Every optimised model is verified
against the original first (fusionlab.verify, onnxruntime with optimisations off); an optimiser whose model
is byte-identical to another's takes that one's measurement. Each model is measured in a process of its own
(a full-size model holds several GB), and the result is rewritten after each, so `--resume` continues an
interrupted run. Not run by the tests; `make bench-exports` makes the exports (once, into
.cache/corpus-full/) and runs this.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from common import RESULTS, ROOT, machine_line, markdown_table, parser

import fusionlab
from fusionlab import timing
from fusionlab.passes import fuse
from fusionlab.verification.runtime import make_feeds, session

FULL = ROOT / ".cache" / "corpus-full"
SOURCE: Path | None = None  # the models' folder of this run (main sets it)
ORDER = ("bert", "bert_eager", "gpt2", "vit", "convnext", "mobilenetv3", "efficientnet", "yolo11", "googlenet",
         # the architectures issue 19 added (small configs, in tests/corpus/ only: `make bench-new-exports`)
         "llama", "t5_encoder", "whisper_encoder", "swin", "resnet_fp16", "bert_fp16", "bert_eager_fp16")
SETTINGS = ("ts-fold", "ts-nofold", "dynamo")
#: the onnxruntime transformers optimizer's model_type per corpus architecture (others: not applicable)
ORT_MODEL_TYPES = {"bert": "bert", "bert_eager": "bert", "gpt2": "gpt2", "vit": "vit",
                   "llama": "qwen3",  # "decoder-only with RoPE, GQA, RMSNorm" (LLaMA has no type of its own)
                   "t5_encoder": "t5", "whisper_encoder": "bart",  # onnxruntime's Whisper tooling optimises as bart
                   "swin": "swin", "bert_fp16": "bert", "bert_eager_fp16": "bert"}


def nodes_of(model) -> int:
    import onnx

    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
    return len(proto.graph.node)


def op_counts(model) -> Counter:
    """Op types of a model, domain-qualified (com.microsoft:MultiHeadAttention)."""
    import onnx

    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
    return Counter(f"{n.domain}:{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                   for n in proto.graph.node)


def fused_ops(original: Counter, model) -> dict:
    """The fused op types an optimiser's model holds (FUSED_OP_FAMILY), beyond those of the original."""
    have = op_counts(model)
    return {op: have[op] - original.get(op, 0) for op in sorted(have) if op in FUSED_OP_FAMILY
            and have[op] > original.get(op, 0)}


#: fused op type -> the fusion family it counts for (the same family whichever tool wrote it)
FUSED_OP_FAMILY = {
    "com.microsoft:MultiHeadAttention": "attention", "com.microsoft:Attention": "attention",
    "com.microsoft:GroupQueryAttention": "attention", "com.microsoft:RotaryEmbedding": "rotary",
    "SimplifiedLayerNormalization": "rmsnorm", "RMSNormalization": "rmsnorm",
    "com.microsoft:SkipSimplifiedLayerNormalization": "skip_rmsnorm", "LayerNormalization": "layernorm",
    "com.microsoft:SkipLayerNormalization": "skip_layernorm", "com.microsoft:EmbedLayerNormalization": "embed_layernorm",
    "com.microsoft:BiasGelu": "bias_gelu", "com.microsoft:FastGelu": "gelu", "com.microsoft:Gelu": "gelu", "Gelu": "gelu",
    "com.microsoft:QuickGelu": "silu", "com.microsoft:FusedMatMul": "fused_matmul", "com.microsoft:FusedConv": "conv_act",
    "com.microsoft:FusedGemm": "gemm_act",
}
#: family -> the fusionlab rules that write it (their near misses explain a family fusionlab does not fuse)
FAMILY_RULES = {"attention": ("attention", "gqa"), "rotary": ("rotary",), "rmsnorm": ("rmsnorm",),
                "skip_rmsnorm": ("skip_rmsnorm",), "layernorm": ("layernorm",), "skip_layernorm": ("skip_layernorm",),
                "embed_layernorm": (), "bias_gelu": ("bias_gelu",), "gelu": ("gelu", "fast_gelu"), "silu": ("silu",),
                "fused_matmul": ("fused_matmul",), "conv_act": ("conv_act", "conv_bn_act"), "gemm_act": ("gemm_act",)}


def ort_extended_nodes(path: Path) -> int:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "opt.onnx"
        session(path, "extended", optimized_path=out)
        return nodes_of(out)


def fusionlab_tool(passes: tuple[str, ...], **options):
    def run(path: Path, entry: dict):
        res = fuse(fusionlab.load(path), passes=passes, **options)
        why = {}  # per rule, its near misses on this model, most frequent first (at most 3 distinct)
        for r in res.plan.refusals:
            why.setdefault(r.rule, Counter())[r.reason] += 1
        return res.graph.to_proto(), res.plan.rule_counts(), {
            k: "; ".join(f"{reason}" + (f" (x{n})" if n > 1 else "") for reason, n in c.most_common(3))
            for k, c in why.items()}
    return run


def onnxscript_tool(path: Path, entry: dict):
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model, counts = optimize_for_ort(ir.load(str(path)))
    return ir.serde.serialize_model(model), {k: v for k, v in counts.items() if v}


def _heads_hidden(config: dict) -> tuple[int, int]:
    """Heads and hidden size for the transformers optimizer; 0, 0 (let it detect) where the config has no single
    value (Swin: heads per stage)."""
    heads = (config.get("num_attention_heads") or config.get("n_head") or config.get("num_heads")
             or config.get("encoder_attention_heads") or 12)
    hidden = config.get("hidden_size") or config.get("n_embd") or config.get("d_model") or 768
    if not isinstance(heads, int) or not isinstance(hidden, int):
        return 0, 0
    return heads, hidden


def ort_transformers_tool(path: Path, entry: dict):
    from onnxruntime.transformers.optimizer import optimize_model

    model_type = ORT_MODEL_TYPES.get(entry["model"])
    if model_type is None:
        return None, {"not applicable": "no transformer model type"}
    heads, hidden = _heads_hidden(entry["config"])
    # opt_level=0: its Python fusions only; the sessions below then apply onnxruntime's own levels
    opt = optimize_model(str(path), model_type=model_type, num_heads=heads, hidden_size=hidden, opt_level=0)
    return opt.model, {k: v for k, v in opt.get_fused_operator_statistics().items() if v}


TOOLS = {
    "fusionlab vertical": fusionlab_tool(("vertical",)),
    "fusionlab vertical+horizontal": fusionlab_tool(("vertical", "horizontal")),
    # --select measured --select-level all: each candidate group timed against its ops at ALL, kept if faster
    "fusionlab vertical+horizontal, measured at ALL": fusionlab_tool(("vertical", "horizontal"), select="measured",
                                                                     select_level="all"),
    "onnxscript optimize_for_ort": onnxscript_tool,
    "onnxruntime transformers optimizer": ort_transformers_tool,
}


def _ratio(c) -> str:
    return f"{c.speedup:.2f} ({c.ci_low:.2f}-{c.ci_high:.2f})"


def _paired(sess_a, sess_b, feeds: dict, min_time: float, rounds: int):
    na = [o.name for o in sess_a.get_outputs()]
    nb = [o.name for o in sess_b.get_outputs()]
    fa = {k: v for k, v in feeds.items() if k in {i.name for i in sess_a.get_inputs()}}
    fb = {k: v for k, v in feeds.items() if k in {i.name for i in sess_b.get_inputs()}}
    return timing.compare(lambda: sess_a.run(na, fa), lambda: sess_b.run(nb, fb), label_a="original",
                          label_b="optimised", min_time=min_time, min_rounds=rounds)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:160]}" if text else type(exc).__name__


def bench_tool(name: str, tool, path: Path, entry: dict, ctx: dict) -> dict:
    """One optimiser on one model: produce, verify, count, time at both settings."""
    start = time.perf_counter()
    try:
        model, fusions, *why = tool(path, entry)
    except Exception as exc:  # a third-party optimiser failing on a model is a result, not a crash
        return {"tool": name, "error": first_line(exc)}
    seconds = time.perf_counter() - start
    if model is None:
        return {"tool": name, "skipped": next(iter(fusions.values()))}
    row = {"tool": name, "nodes": nodes_of(model), "fusions": fusions, "optimise_seconds": round(seconds, 1),
           "fused_ops": fused_ops(ctx["original_ops"], model)}
    if why:
        row["why_not"] = why[0]
    key = hashlib.sha256(model.SerializeToString()).hexdigest()
    same = ctx["made"].get(key)
    if same is not None:  # byte-identical to another optimiser's model: its measurements are this one's
        return {**row, **{k: same[k] for k in ("verified", "vs_extended", "vs_all") if k in same},
                "same_as": same["tool"]}
    ctx["made"][key] = row
    try:
        report = fusionlab.verify(ctx["graph"], model, feeds=ctx["feeds"])
        row["verified"] = bool(report.ok)
        dis, al = session(model, "disable"), session(model, "all")
    except Exception as exc:
        row["error"] = first_line(exc)
        return row
    row["vs_extended"] = _paired(ctx["ext"], dis, ctx["feeds"], ctx["min_time"], ctx["rounds"])
    row["vs_all"] = _paired(ctx["all"], al, ctx["feeds"], ctx["min_time"], ctx["rounds"])
    return row


def bench_model(entry: dict, full: Path, tools: list[str], min_time: float, rounds: int) -> list[dict]:
    path = full / entry["file"]
    graph = fusionlab.load(path)
    dims = {**entry["check"]["checked_sizes"][0], "batch": 1}  # batch 1 at the exported sequence length
    ctx = {"graph": graph, "feeds": make_feeds(graph, dims=dims), "min_time": min_time, "rounds": rounds,
           "ext": session(path, "extended"), "all": session(path, "all"), "made": {}, "original_ops": op_counts(path)}
    base = {"file": entry["file"], "model": entry["model"], "setting": entry["setting"],
            "original_nodes": entry["nodes"], "ort_extended_nodes": ort_extended_nodes(path)}
    rows = []
    for name in tools:
        print(f"  {entry['file']}: {name}", flush=True)
        rows.append({**base, **bench_tool(name, TOOLS[name], path, entry, ctx)})
    return rows


def _cell(row: dict, key: str) -> str:
    if "error" in row:
        return "error" if key == "vs_all" else row["error"]
    if "skipped" in row:
        return "n/a"
    return _ratio(row[key]) if key in row else "—"


def render(rows: list[dict], min_time: float, rounds: int, source: str | None = None) -> str:
    table = []
    for r in rows:
        nodes = f"{r['original_nodes']} / {r['ort_extended_nodes']} / {r.get('nodes', '—')}"
        fus = ", ".join(f"{k} {v}" for k, v in sorted(r.get("fusions", {}).items())) or "—"
        if r.get("same_as"):
            fus += f" (the same model as {r['same_as']}'s: its measurement)"
        ok = {True: "yes", False: "**NO**"}.get(r.get("verified"), "—")
        table.append([r["model"], r["setting"], r["tool"], nodes, ok, _cell(r, "vs_extended"), _cell(r, "vs_all"),
                      fus if "skipped" not in r else r["skipped"]])
    head = ["model", "export", "optimiser", "nodes: original / ORT EXTENDED / optimised", "verified",
            "optimised @DISABLE_ALL vs original @EXTENDED", "optimised vs original, both @ALL", "fusions it reports"]
    return "\n\n".join([
        "# Full-size third-party exports: fusionlab, onnxscript and onnxruntime's transformers optimizer",
        machine_line() + "; 1 intra-op thread; inputs batch 1 (text: the exported sequence length, 128 at full "
        "size, 32 in the test corpus, no padding); each ratio = time(original) / "
        f"time(optimised), median of paired interleaved rounds (>= {rounds} rounds, >= {min_time} s per side), "
        "95% CI; > 1: the optimised model is faster.",
        "The machine is shared (2 cores, other jobs running): read ratios whose CI includes 1 as no difference. "
        + (f"Made by `benchmarks/bench_exports.py` (`make bench-new-exports`) on the small test-corpus exports in "
           f"`{source}`" if source else "Made by `benchmarks/bench_exports.py` (`make bench-exports`) on the "
           "exports of `tools/export_corpus.py --full`")
        + "; the onnxruntime transformers optimizer ran with opt_level=0 (its Python fusions only) and only on "
        "transformer models.",
        markdown_table(head, table)] + ([comparison(rows)] if comparison(rows) else []))


def _families(ops: dict) -> Counter:
    out = Counter()
    for op, n in ops.items():
        out[FUSED_OP_FAMILY[op]] += n
    return out


def _why(family: str, ours: dict) -> str:
    """Why fusionlab's default rules leave a family unfused on an export: opt-in, or the rule's own near miss."""
    from fusionlab.passes import vertical

    rules = FAMILY_RULES.get(family, ())
    if not rules:
        return "no fusionlab rule writes it"
    off = [r for r in rules if r in vertical.OPT_IN_REASONS]
    misses = [f"{r}: {ours.get('why_not', {})[r]}" for r in rules if r in ours.get("why_not", {})]
    parts = [f"`{r}` is opt-in: {vertical.OPT_IN_REASONS[r]}" for r in off] + [f"near miss {m}" for m in misses]
    return "; ".join(parts) if parts else "no near miss recorded (fusionlab's rules do not see this form)"


def comparison(rows: list[dict], ours_tool: str = "fusionlab vertical", other: str = "onnxscript optimize_for_ort") -> str:
    """Where `other`'s model holds more fused ops of a family than fusionlab's, per export, and why (from the rows)."""
    by_file: dict[str, dict] = {}
    for r in rows:
        by_file.setdefault(r["file"], {})[r["tool"]] = r
    table, more_ours = [], 0
    for file, tools in by_file.items():
        a, b = tools.get(ours_tool), tools.get(other)
        if not a or not b or "fused_ops" not in a or "fused_ops" not in b:
            continue
        fa, fb = _families(a["fused_ops"]), _families(b["fused_ops"])
        more_ours += sum(1 for f in fa if fa[f] > fb.get(f, 0))
        for fam in sorted(fb):
            if fb[fam] > fa.get(fam, 0):
                ops = ", ".join(f"{op.split(':')[-1]} {n}" for op, n in sorted(b["fused_ops"].items())
                                if FUSED_OP_FAMILY[op] == fam)
                table.append([file.replace(".onnx", ""), fam, str(fa.get(fam, 0)), f"{fb[fam]} ({ops})",
                              _why(fam, a)])
    if not table:
        return ""
    head = ["export", "family", f"{ours_tool}: fused ops", f"{other}: fused ops", "why fusionlab has fewer"]
    return "\n\n".join([
        f"## Where {other} fuses more than {ours_tool}",
        f"Generated by `benchmarks/bench_exports.py` from the rows above. Counted as the fused ops each tool's "
        f"model holds beyond the original's (by family: MultiHeadAttention, Attention and GroupQueryAttention are "
        f"`attention`, ...), not as the counts the tools report: onnxscript reports each stage of one rewrite "
        f"(sdpa, sdpa_via_mha, mha2, mha_bias, attention for one attention op). The reason is fusionlab's own: "
        f"a rule off by default (vertical.OPT_IN_REASONS) or the near miss its plan recorded for the rule (the "
        f"most frequent ones, as `--why-not` lists them). The reverse, a family where {ours_tool} holds more fused "
        f"ops than {other}: {more_ours} export/family pairs.",
        markdown_table(head, table)])


@dataclass
class Stored:
    """A comparison read back from OUT.json: its per-round ratios, and the median and CI they give."""

    ratios: list

    def __post_init__(self):
        self.speedup, self.ci_low, self.ci_high = timing.median_ci(self.ratios)


def _load(path: Path) -> list[dict]:
    rows = json.loads(path.read_text()) if path.exists() else []
    return [{k: (Stored(v) if k in ("vs_extended", "vs_all") and isinstance(v, list) else v) for k, v in r.items()}
            for r in rows]


def _save(rows: list[dict], out: str, title: str | None, min_time: float, rounds: int) -> None:
    source = None if SOURCE is None or SOURCE.resolve() == FULL.resolve() else SOURCE.resolve().relative_to(ROOT)
    raw = [{k: (v.ratios if isinstance(v, (timing.Comparison, Stored)) else v) for k, v in r.items()} for r in rows]
    (RESULTS / f"{out}.json").parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS / f".{out}.json.tmp"
    tmp.write_text(json.dumps(raw, indent=1) + "\n")
    tmp.replace(RESULTS / f"{out}.json")
    text = render(rows, min_time, rounds, str(source) if source else None)
    if title:
        text = f"# {title}" + text[text.index("\n"):]
    (RESULTS / f"{out}.md").write_text(text.rstrip() + "\n")


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--full-dir", type=Path, default=FULL, help="where export_corpus.py --full put the models")
    ap.add_argument("--only", nargs="+", help="models (bert, gpt2, ...) or files to run")
    ap.add_argument("--tools", nargs="+", choices=sorted(TOOLS), default=list(TOOLS))
    ap.add_argument("--out", default="exports", help="result name: benchmarks/results/OUT.md and OUT.json")
    ap.add_argument("--title", help="the result's heading (default: the full run's)")
    ap.add_argument("--rounds", type=int, default=None, help="at least this many interleaved rounds (default 10)")
    ap.add_argument("--resume", action="store_true", help="keep OUT.json's rows and measure only what it lacks")
    ap.add_argument("--in-process", action="store_true",
                    help="measure in this process (default: one process per model, so each model's memory, "
                         "several GB at full size, goes back to the system before the next)")
    args = ap.parse_args()
    global SOURCE
    SOURCE = args.full_dir
    manifest = json.loads((args.full_dir / "manifest.json").read_text())
    entries = [e for e in manifest["models"] if not args.only or e["model"] in args.only or e["file"] in args.only]
    entries.sort(key=lambda e: (ORDER.index(e["model"]) if e["model"] in ORDER else 99, SETTINGS.index(e["setting"])))
    min_time = args.min_time or (0.2 if args.quick else 2.0)
    rounds = args.rounds or (3 if args.quick else 10)
    rows = _load(RESULTS / f"{args.out}.json") if args.resume else []
    done = {(r["file"], r["tool"]) for r in rows}
    if not args.resume:
        _save(rows, args.out, args.title, min_time, rounds)
    for e in entries:  # the result is rewritten after each model: a long run interrupted keeps what it measured
        tools = [t for t in args.tools if (e["file"], t) not in done]
        if not tools:
            continue
        if args.in_process:
            rows += bench_model(e, args.full_dir, tools, min_time, rounds)
            _save(rows, args.out, args.title, min_time, rounds)
            continue
        cmd = [sys.executable, __file__, "--full-dir", str(args.full_dir), "--only", e["file"], "--tools", *tools,
               "--out", args.out, "--resume", "--in-process", "--min-time", str(min_time), "--rounds", str(rounds)]
        cmd += ["--title", args.title] if args.title else []
        cmd += ["--quick"] if args.quick else []
        subprocess.run(cmd, check=True)
    rows = _load(RESULTS / f"{args.out}.json")
    order = {f: i for i, f in enumerate(e["file"] for e in entries)}
    rows.sort(key=lambda r: (order.get(r["file"], len(order)), args.tools.index(r["tool"]) if r["tool"] in args.tools
                             else len(args.tools)))
    _save(rows, args.out, args.title, min_time, rounds)
    print((RESULTS / f"{args.out}.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
