"""The key findings of docs/corpus.md, each computed from the survey's measurements (tools/corpus_survey.py).

Every number and quoted chain below is read off the graphs when the page is generated; a statement whose
condition no longer holds is replaced by a line saying so, rather than left standing.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import onnx
import onnxruntime as ort

import corpus_facts as facts
from corpus_graph import Dump, backward_slice, chain_forward, chain_str, in_scope, scores_path, softmaxes

TEXT = ("bert", "bert_eager", "gpt2", "vit")
CORPUS = Path(__file__).resolve().parent.parent / "tests" / "corpus"


def _runs(by_model: dict, models=None, settings=None):
    for m, per in by_model.items():
        if models is None or m in models:
            for s, r in per.items():
                if settings is None or s in settings:
                    yield m, s, r


def _total(by_model: dict, fn, key: str, **kw) -> int:
    return sum(v for _, _, r in _runs(by_model, **kw) for k, v in fn(r["analysed"]).items() if key in k)


def _ops(by_model: dict, op: str, level: str = "original", **kw) -> int:
    return sum(r[level].get(op, 0) for _, _, r in _runs(by_model, **kw))


def _claim(ok: bool, text: str, what: str) -> str:
    return text if ok else f"- (a finding about {what} no longer holds on this corpus: see the tables below)"


def opsets(by_model: dict) -> str:
    sets = Counter(r["entry"]["opset"]["ai.onnx"] for _, _, r in _runs(by_model))
    return (f"- **Opset.** All {sum(sets.values())} exports are opset {', '.join(map(str, sorted(sets)))}: the default "
            f"of both exporters in torch {_torch(by_model)}. At opset 20 the TorchScript "
            "exporter already emits single `LayerNormalization` and `Gelu` ops; nothing here is decomposed LayerNorm.")


def _torch(by_model: dict) -> str:
    r = next(iter(next(iter(by_model.values())).values()))
    return r["entry"]["producer"].replace("pytorch ", "")


def folding(by_model: dict) -> str:
    wt = _total(by_model, facts.matmuls, "Transpose[1, 0] of weight", settings=("ts-nofold",))
    wt_other = _total(by_model, facts.matmuls, "Transpose[1, 0] of weight", settings=("ts-fold", "dynamo"))
    bn = _ops(by_model, "BatchNormalization", settings=("ts-nofold",))
    bn_other = _ops(by_model, "BatchNormalization", settings=("ts-fold", "dynamo"))
    weight_only = sum(sum(facts.housekeeping(r["analysed"])["weight_only"].values())
                      for _, _, r in _runs(by_model, settings=("ts-nofold",)))
    ok = wt and not wt_other and bn and not bn_other
    return _claim(ok, f"- **`do_constant_folding=False`** keeps every Linear weight as `[out, in]` with a "
                      f"`Transpose(perm=[1, 0])` into its MatMul ({wt} such Transposes over the ts-nofold files, none "
                      f"in the others), keeps BatchNorm unfolded ({bn} `BatchNormalization` nodes; ts-fold and dynamo "
                      f"have none: both fold BN into the Conv weights), and writes shape constants as "
                      f"`Unsqueeze(Constant)` and the SDPA scale as `Cast(Sqrt(Constant))`: {weight_only} weight-only "
                      "computations in all, each a fold candidate.", "constant folding")


def shape_arithmetic(by_model: dict) -> str:
    rows = []
    for m in ("bert", "gpt2", "vit"):
        if m not in by_model:
            continue
        h = {s: facts.housekeeping(r["analysed"]) for s, r in by_model[m].items()}
        rows.append(f"{m} {h['ts-fold']['host']}/{h['ts-fold']['nodes']} (ts-fold), "
                    f"{h['ts-nofold']['host']}/{h['ts-nofold']['nodes']} (ts-nofold), "
                    f"{h['dynamo']['host']}/{h['dynamo']['nodes']} (dynamo)")
    consts = _ops(by_model, "Constant", settings=("dynamo",))
    ts_consts = _ops(by_model, "Constant", settings=("ts-fold",))
    identities = _ops(by_model, "Identity")
    return (f"- **Host-side shape arithmetic** (int64 Shape/Gather/Unsqueeze/Concat/... nodes of ≤ 8 elements, out of "
            f"all nodes): {'; '.join(rows)}. The TorchScript exporter recomputes each Reshape target from "
            "`Shape` of the live tensor; dynamo uses `Shape(x, start, end)` slices and `Concat`, and emits "
            f"{consts} `Constant` nodes over its {len(by_model)} exports (ts-fold: {ts_consts}). `Identity` nodes "
            f"in the whole corpus: {identities}.")


def attention(by_model: dict) -> str:
    out = []
    for m, title in (("bert", "SDPA (transformers' default)"), ("bert_eager", "eager attention")):
        if m not in by_model:
            continue
        for s in ("ts-fold", "dynamo"):
            f = facts.attention(by_model[m][s]["analysed"])
            if not f:
                continue
            out.append(f"  - {m} {s} ({title}): Q `{f['Q (input A of the scores MatMul)']}`; "
                       f"K `{f['K (input B of the scores MatMul)']}`; scores `{f['scores']}` with mask "
                       f"`{f['mask operand']}`; then `{f['probabilities into the context MatMul']}`; "
                       f"context `{f['context → output projection']}`.")
    ext = sum(v for _, _, r in _runs(by_model) for k, v in r["EXTENDED"].items()
              if k.endswith(("Attention", "MultiHeadAttention", "GroupQueryAttention")))
    head = ("- **Attention** is never a single op: onnxruntime EXTENDED fuses it in "
            f"{'none' if not ext else ext} of the exports. Projections are separate `MatMul` + `Add` (BERT, ViT) "
            "or one `Gemm` on the flattened input followed by `Split` (GPT-2's Conv1D). SDPA splits the scale "
            "d^-1/4 onto Q and K each *before* the scores MatMul, adds a `Where(mask, 0, -inf | finfo.min)` "
            "bias, and guards the Softmax with `IsNaN → Where`; eager multiplies the scores by 1/sqrt(d) after "
            "the MatMul and has no guard. The chains, measured:")
    return "\n".join([head, *out])


def _mask_inputs(a) -> set[str] | None:
    """Graph inputs the first attention mask reads as data (not only through Shape); None: no mask."""
    sms = softmaxes(a)
    if not sms:
        return None
    _, _, masks = scores_path(a, sms[0])
    if not masks:
        return None
    graph_inputs = {i.name for i in a.proto.graph.input}
    region = backward_slice(a, masks[0])
    return {v for i in region if a.nodes[i].op_type != "Shape" for v in a.nodes[i].input if v in graph_inputs}


def _mask_ops(a) -> set[str]:
    sms = softmaxes(a)
    masks = scores_path(a, sms[0])[2] if sms else []
    return {a.nodes[i].op_type for i in backward_slice(a, masks[0])} if masks else set()


def masks(by_model: dict) -> str:
    rows = []
    ok = True
    for m, s, r in _runs(by_model, models=TEXT):
        read = _mask_inputs(r["analysed"])
        if read:
            ops = _mask_ops(r["analysed"])
            ok &= {"Range", "And", "Expand", "Where"} <= ops and bool({"Gather", "GatherND"} & ops)
        rows.append(f"{m} {s}: " + ("no mask" if read is None else
                                    f"from {', '.join(sorted(read))}" if read else "**constant** (reads no input)"))
    return _claim(ok, "- **Masks** (transformers 5 `masking_utils`): a boolean [B, 1, S, S] built by index arithmetic "
            "(Range / Unsqueeze / GreaterOrEqual or LessOrEqual for causal / Gather or GatherND of the padding mask / "
            "And / Expand), then `Where(mask, 0, -inf or finfo.min)` added to the scores; not the classic "
            "`(1 - mask) * -10000`. What each first mask reads: " + "; ".join(rows) + ". A constant mask is an "
            "all-zero Add on the scores that folding can remove.", "masks")


def projections(by_model: dict) -> str:
    ts = _total(by_model, facts.matmuls, "as Add(b, MatMul)", settings=("ts-fold", "ts-nofold"))
    ts_other = _total(by_model, facts.matmuls, "as Add(MatMul, b)", settings=("ts-fold", "ts-nofold"))
    dy = _total(by_model, facts.matmuls, "as Add(MatMul, b)", settings=("dynamo",))
    dy_other = _total(by_model, facts.matmuls, "as Add(b, MatMul)", settings=("dynamo",))
    gemm = _total(by_model, facts.matmuls, "Gemm", models=("gpt2",), settings=("dynamo",))
    ok = ts and dy and not ts_other and not dy_other
    return _claim(ok, "- **Linear on rank ≥ 3 is `MatMul` + bias `Add`, never Gemm**, and the operand order "
                      f"differs: TorchScript writes `Add(b, MatMul)` ({ts} times), dynamo `Add(MatMul, b)` ({dy}). "
                      "A rule must accept both. Linear on rank 2 (poolers, classifiers) is `Gemm(transB=1)`; GPT-2's "
                      f"Conv1D is `Reshape → Gemm(x, W[in, out], b) → Reshape` in every exporter ({gemm} Gemm per "
                      "GPT-2 export).", "bias adds")


def norms_and_gelu(by_model: dict) -> str:
    ln = _ops(by_model, "LayerNormalization")
    reduce = _ops(by_model, "ReduceMean", models=TEXT)
    gelu = {m: by_model[m]["ts-fold"]["original"].get("Gelu", 0) for m in ("bert", "vit", "convnext") if m in by_model}
    lines = [_claim(ln and not reduce, f"- **LayerNorm** is the `LayerNormalization` op ({ln} over the corpus, axis -1) "
                                       "in every exporter; BERT/GPT-2/ViT have no `ReduceMean` at all.", "LayerNorm")]
    lines.append(f"- **GELU**: `nn.GELU`/`F.gelu` export as the opset-20 `Gelu` op (approximate none) in all three "
                 f"exporters ({', '.join(f'{m} {n}' for m, n in gelu.items())} per export); GPT-2's `gelu_new` stays "
                 "explicit, the same in all three:")
    if "gpt2" in by_model:
        a = by_model["gpt2"]["ts-fold"]["analysed"]
        region = [i for i, s in enumerate(a.scope) if in_scope(s, "model.h.0.mlp.act")]
        lines += ["", "  ```text", *[f"  {line}" for line in Dump(a, region, "model.h.0.mlp.act").lines()], "  ```"]
    return "\n".join(lines)


def cnn_forms(by_model: dict) -> str:
    out = []
    if "convnext" in by_model:
        a = by_model["convnext"]["ts-fold"]["analysed"]
        n = facts.norms(a)
        cl = sum(v for k, v in n.items() if k.startswith("Transpose → LayerNormalization"))
        scale = facts.per_channel_scales(a)
        out.append(f"- **ConvNeXt** has no channels-first norm: all {cl} LayerNorms are channels-last between "
                   "Transposes (`Transpose[0, 2, 3, 1] → LayerNormalization → MatMul` in CNBlocks, `… → "
                   "Transpose[0, 3, 1, 2] → Conv` in LayerNorm2d downsamples), and layer-scale is "
                   f"`{hist_keys(scale)}` after the block's closing Transpose (same in all three exporters).")
    if "mobilenetv3" in by_model:
        r = by_model["mobilenetv3"]["ts-fold"]
        hs, basic_hs = r["original"].get("HardSwish", 0), r["BASIC"].get("HardSwish", 0)
        se = {s: hist_keys(facts.squeeze_excitation(x["analysed"])) for s, x in by_model["mobilenetv3"].items()}
        out.append(f"- **MobileNetV3**: `HardSwish` is an op ({hs} per export), but onnxruntime's CPU graph has "
                   f"{basic_hs} of them from BASIC on (it inlines each as `HardSigmoid` + `Mul`, the op's function "
                   f"body). Squeeze-excitation is `{se.get('ts-fold')}` (TorchScript) and `{se.get('dynamo')}` "
                   "(dynamo: `ReduceMean` instead of `GlobalAveragePool`, HardSigmoid's beta written out).")
    silu = _total(by_model, facts.activations, "SiLU as Sigmoid(x) → Mul(x, σ)", models=("yolo11", "efficientnet"))
    out.append(f"- **SiLU** is `Sigmoid(x) → Mul(x, σ)` everywhere ({silu} over the YOLO and EfficientNet exports); "
               "onnxruntime and fusionlab both make it `QuickGelu(alpha=1)`.")
    return "\n".join(out)


def hist_keys(c: Counter) -> str:
    return " / ".join(k for k, _ in c.most_common(2)) or "—"


def against_onnxruntime(by_model: dict) -> str:
    sln = {f"{m} {s}": r["EXTENDED"].get("com.microsoft.SkipLayerNormalization", 0) for m, s, r in _runs(by_model)}
    sln_files = [k for k, v in sln.items() if v]
    fmm = sum(r["EXTENDED"].get("com.microsoft.FusedMatMul", 0) for _, _, r in _runs(by_model))
    ours_fmm = sum(r["vertical"].get("com.microsoft.FusedMatMul", 0) for _, _, r in _runs(by_model))
    gaps = []
    for m in TEXT:
        if m in by_model:
            r = by_model[m]["ts-fold"]
            n = {k: sum(r[k].values()) for k in ("original", "BASIC", "EXTENDED", "vertical")}
            gaps.append(f"{m} {n['original']} → BASIC {n['BASIC']} → EXTENDED {n['EXTENDED']}, "
                        f"fusionlab vertical {n['vertical']}")
    shape_calls = {f"{m} {s}": r["all_shape_calls"] for m, s, r in _runs(by_model) if r["all_shape_calls"]}
    exp = skip_layernorm_experiment()
    return "\n".join([
        f"- **onnxruntime EXTENDED vs fusionlab vertical.** Both find BiasGelu/FastGelu/FusedGemm/FusedConv/"
        f"QuickGelu alike. onnxruntime adds `FusedMatMul` for the scaled K-transpose into the scores MatMul ({fmm} "
        f"over the corpus; fusionlab {ours_fmm}) and `SkipLayerNormalization` on dynamo exports only "
        f"({', '.join(sln_files) or 'none'}). Why not on TorchScript exports, measured on bert.ts-fold.onnx "
        f"(SkipLayerNormalization nodes at EXTENDED): as exported {exp['as exported']}; with every bias Add "
        f"turned to `Add(MatMul, b)` {exp['bias second']}; with onnx's inferred value_info added "
        f"{exp['onnx value_info']}; with batch and sequence fixed by free-dimension overrides "
        f"{exp['static dims']}. So it is shape knowledge (proving the residual Add's operands equal in shape), "
        "not operand order: TorchScript exports carry no value_info, dynamo exports do. With static dims "
        f"`Attention` nodes: {exp['attention, static dims']}. On TorchScript transformers most of onnxruntime's "
        "lead in node count is BASIC's constant folding and shape simplification, not fusion "
        f"(ts-fold: {'; '.join(gaps)}).",
        f"- **fusionlab's mixed pass** puts host-side shape ops into its kernels: local functions holding "
        f"Shape/Unsqueeze/Squeeze/ConstantOfShape/Range nodes, per file: "
        f"{', '.join(f'{k} {v}' for k, v in shape_calls.items()) or 'none'}.",
    ])


def _ort_extended_ops(model: onnx.ModelProto, dims: dict | None = None) -> Counter:
    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = str(Path(tmp) / "opt.onnx")
        so.log_severity_level = 3
        for name, value in (dims or {}).items():
            so.add_free_dimension_override_by_name(name, value)
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return Counter(n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node)


def skip_layernorm_experiment(file: str = "bert.ts-fold.onnx") -> dict[str, int]:
    """SkipLayerNormalization count at ORT EXTENDED for variants of one TorchScript export."""
    model = onnx.load(str(CORPUS / file))
    swapped = onnx.ModelProto()
    swapped.CopyFrom(model)
    inits = {i.name for i in swapped.graph.initializer}
    for n in swapped.graph.node:
        if n.op_type == "Add" and n.input[0] in inits:
            n.input[0], n.input[1] = n.input[1], n.input[0]
    key = "SkipLayerNormalization"
    return {"as exported": _ort_extended_ops(model)[key], "bias second": _ort_extended_ops(swapped)[key],
            "onnx value_info": _ort_extended_ops(onnx.shape_inference.infer_shapes(model))[key],
            "static dims": _ort_extended_ops(model, {"batch": 3, "sequence": 11})[key],
            "attention, static dims": ", ".join(
                f"{f} {_ort_extended_ops(onnx.load(str(CORPUS / f)), {'batch': 3, 'sequence': 11})['Attention']}"
                for f in (file, "bert_eager.ts-fold.onnx", "bert.dynamo.onnx"))}


def _per_setting(per: dict, fn, *, top: bool = True) -> str:
    """'ts-fold: `chain` (n); dynamo: `chain` (n)' for the most common entry of fn per export."""
    parts = []
    for s in ("ts-fold", "ts-nofold", "dynamo"):
        if s not in per:
            continue
        c = fn(per[s]["analysed"])
        if not c:
            parts.append(f"{s}: none")
            continue
        k, v = c.most_common(1)[0]
        parts.append(f"{s}: `{k}` ({v})" if top else f"{s}: " + "; ".join(f"`{k}` ({v})" for k, v in c.items()))
    return "; ".join(parts)


def _att(per: dict, key: str) -> str:
    out = []
    for s in ("ts-fold", "ts-nofold", "dynamo"):
        if s in per:
            f = facts.attention(per[s]["analysed"])
            out.append(f"{s} `{f[key]}`" if f else f"{s}: no attention found")
    return "; ".join(out)


def _unit_muls(per: dict) -> str:
    """Multiplications by a constant exactly 1.0 (a no-op an exporter wrote), per export."""
    out = []
    for s, r in per.items():
        a = r["analysed"]
        n = sum(1 for node in a.nodes if node.op_type == "Mul" and any(
            v in a.consts and a.consts[v].size == 1 and float(a.consts[v].reshape(-1)[0]) == 1.0 for v in node.input))
        out.append(f"{s} {n}")
    return ", ".join(out)


def _front_end(per: dict) -> str:
    """The chain from the first Conv to the Add of the positions (Whisper's conv front end), per export."""
    out = []
    for s, r in per.items():
        a = r["analysed"]
        conv = next((i for i, n in enumerate(a.nodes) if n.op_type == "Conv"), None)
        if conv is None:
            out.append(f"{s}: no Conv")
            continue
        out.append(f"{s} `{chain_str(a, [conv, *chain_forward(a, conv, ('Add',), limit=8)])}`")
    return "; ".join(out)


def decoders_and_encoders(by_model: dict) -> str:
    """The forms of issue 19's architectures, as each exporter writes them."""
    out = []
    if "llama" in by_model:
        per = by_model["llama"]
        cfg = next(iter(per.values()))["entry"]["config"]
        out.append(
            f"- **LLaMA** (LlamaForCausalLM, {cfg['num_attention_heads']} query heads sharing "
            f"{cfg['num_key_value_heads']} key/value heads). Grouped-query attention is written out: K of the "
            f"scores MatMul is {_att(per, 'K (input B of the scores MatMul)')}; V is "
            f"{_att(per, 'V (other context MatMul input)')}. The scores: {_att(per, 'scores')}, with the causal "
            f"mask built of {_per_setting(per, facts.additive_operand)}. RMSNorm "
            f"(`weight * (x * rsqrt(mean(x²) + eps))`, in float32): {_per_setting(per, facts.rms_norms)}. Rotary "
            f"(rotate_half): {_per_setting(per, facts.rotary)}. SwiGLU: {_per_setting(per, facts.gated_mlps)}.")
    if "t5_encoder" in by_model:
        per = by_model["t5_encoder"]
        out.append(
            f"- **T5 encoder**: scores with no 1/sqrt(d) scale, {_att(per, 'scores')}; the additive operand (the "
            f"relative position bias, bucketed with Log, computed once in block 0 and reused, plus the padding "
            f"mask) is built of {_per_setting(per, facts.additive_operand)}. T5 calls attention with scale 1.0, "
            f"which TorchScript's SDPA writes as a multiply by sqrt(scale) on Q and on K (`Mul(·, 1.0)` once folded; "
            f"Mul-by-one nodes: "
            f"{_unit_muls(per)}). T5's RMSNorm (no mean, no bias): "
            f"{_per_setting(per, facts.rms_norms)}. Gated-gelu: {_per_setting(per, facts.gated_mlps)}.")
    if "whisper_encoder" in by_model:
        per = by_model["whisper_encoder"]
        out.append(
            f"- **Whisper encoder**: Q is pre-scaled by head_dim^-1/2 before the scores MatMul (and K has no "
            f"bias): Q {_att(per, 'Q (input A of the scores MatMul)')}; K "
            f"{_att(per, 'K (input B of the scores MatMul)')}; no mask ({_per_setting(per, facts.additive_operand)}"
            f"); the attention call's scale 1.0 is again a multiply by sqrt(1.0) on Q and K in TorchScript "
            f"(Mul-by-one nodes: {_unit_muls(per)}). Conv front end: {_front_end(per)}.")
    if "swin" in by_model:
        per = by_model["swin"]
        nodes = {s: sum(r["original"].values()) for s, r in per.items()}
        host = {s: facts.housekeeping(r["analysed"])["host"] for s, r in per.items()}
        sms = {s: len(softmaxes(r["analysed"])) for s, r in per.items()}
        bias = []
        for s, r in per.items():
            ops = facts.additive_operand(r["analysed"])
            bias.append(f"{s}: computed, `{ops.most_common(1)[0][0]}`" if ops else
                        f"{s}: an initializer (the exporter folded the table lookup)")
        out.append(
            f"- **Swin**: window attention in {sms.get('dynamo')} blocks; the additive operand of the first "
            f"(unshifted) block is the relative position bias, {'; '.join(bias)}; the scores: "
            f"{_att(per, 'scores')}. Window partition, cyclic shift and padding are shape arithmetic: host-side "
            f"shape nodes {', '.join(f'{s} {host[s]}/{nodes[s]}' for s in nodes)}.")
    return "\n".join(out) or "- (no decoder/encoder of issue 19 in this corpus)"


def half_precision(by_model: dict) -> str:
    """Float16 exports: what stays float32, and how far each export is from its float32 twin."""
    rows = []
    for m in ("resnet_fp16", "bert_fp16", "bert_eager_fp16"):
        for s, r in by_model.get(m, {}).items():
            c = r["entry"]["check"]
            kinds = facts.float_types(r["analysed"])
            f32 = ", ".join(f"{k} {v}" for k, v in kinds.most_common()) or "nothing in float32, no Cast"
            ext = r["EXTENDED"]
            rows.append(f"{m} {s}: {f32}; max scaled error vs float32 {c['max_scaled_error_vs_torch']:.2g} "
                        f"(torch's own float16: {c['torch_float16_scaled_error_vs_float32']:.2g}); onnxruntime "
                        f"EXTENDED runs it as {sum(ext.values())} nodes ({sum(r['original'].values())} exported) with "
                        f"{ext.get('Cast', 0)} Casts")
    if not rows:
        return "- (no float16 export in this corpus)"
    err = {s: r["entry"]["check"]["max_scaled_error_vs_torch"] for s, r in by_model.get("resnet_fp16", {}).items()}
    folded = ""
    if len(err) == 3 and err["ts-nofold"] < min(err["ts-fold"], err["dynamo"]):
        folded = (f" The exporters that fold BatchNorm into the float16 Conv weights (ts-fold, dynamo) leave ResNet "
                  f"{min(err['ts-fold'], err['dynamo']) / err['ts-nofold']:.0f}x further from float32 than the "
                  "unfolded ts-nofold export: the folded weights are rounded to float16 once more.")
    bert = [r for m in ("bert_fp16", "bert_eager_fp16") for r in by_model.get(m, {}).values()]
    gone = sorted({k for r in bert for k in ("Softmax", "Gelu", "LayerNormalization")
                   if r["original"].get(k) and not r["EXTENDED"].get(k)})
    new_ops = sorted({k for r in bert for k in r["EXTENDED"] if k not in r["original"] and "." not in k})
    cpu = (f" Where onnxruntime's CPU provider has no float16 kernel it computes in float32 between Casts (the "
           f"Casts above, none in the exports), and in the BERTs it replaces {' and '.join(gone)} by their function "
           f"bodies ({', '.join(new_ops)} appear at EXTENDED): the float16 graph it runs is larger than the "
           "exported one" + (", and none of its fused kernels appears in it (no com.microsoft op)."
                             if not any("com.microsoft" in k for r in bert for k in r["EXTENDED"]) else ".")
           ) if gone else ""
    return ("- **Float16 exports** (judged against the float32 twin: the same float16 weights widened): "
            + "; ".join(rows) + "." + folded + cpu)


def findings(by_model: dict[str, dict[str, dict]]) -> str:
    """Markdown bullets, each computed from `by_model` (model -> setting -> survey result)."""
    parts = [opsets, folding, shape_arithmetic, attention, masks, projections, norms_and_gelu, cnn_forms,
             decoders_and_encoders, half_precision, against_onnxruntime]
    return "\n".join(fn(by_model) for fn in parts)
