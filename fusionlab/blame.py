"""Why did the outputs change? Which optimisation did it, what it costs to turn off, and a minimal repro.

The question people bring to onnxruntime's tracker ("ORT_ENABLE_ALL differs from DISABLE_ALL by 61.8, which
optimiser?", onnxruntime #18959; "LayerNorm fusion changes results", #4293), answered by measurement:

1. run the model unoptimised (DISABLE_ALL, the reference `verify` uses) and at the level the user deploys,
   on several input draws, and compare every output with its dtype's tolerance (`fusionlab.verify`);
   a float64 run (`fusionlab.verification.precision`) says which of the two is nearer the exact result;
2. if they differ, find the graph transformer responsible: onnxruntime's verbose log names every
   transformer it ran and whether it changed the graph; those that did are bisected by disabling them
   (`InferenceSession(..., disabled_optimizers=[...])`) until the smallest set whose absence brings the
   outputs back within tolerance remains; a level's rule-based transformer is split into its rewrite rules;
3. say what it rewrote (the op types of onnxruntime's optimised model with and without it), the error with
   and without it, and what disabling it costs (interleaved timing);
4. shrink the model (`fusionlab.fuzz.shrink`) to the smallest one that still differs and is fixed by
   disabling the same transformer, and write it.

`blame_passes` asks the same of fusionlab's own passes: the plan group (rule and group id) whose rewrite
makes the fused model differ from the original, found by bisecting the plan.

The transformer names are onnxruntime's own (`ORT_TRANSFORMERS`, with where each comes from).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from .fuzz.shrink import shrink
from .graph import Graph, as_graph, load, save_model
from .passes import apply, fuse, options_for
from .plan import DEFAULT_PASSES, FusionPlan
from .timing import Comparison, interleaved
from .verification.precision import Reference
from .verification.runtime import LEVELS, make_feeds, model_bytes, quiet_onnxruntime, run, session, verify

__all__ = ["OrtTransformer", "ORT_TRANSFORMERS", "ORT_SOURCE", "LEVEL_NUMBER", "transformers_run", "blame_ort",
           "blame_passes", "OrtBlame", "PassBlame", "transformer"]


# --------------------------------------------------------------------------------------------------
# onnxruntime's graph transformers, by the names `disabled_optimizers` takes
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OrtTransformer:
    """One of onnxruntime's graph optimisations: its name (what `disabled_optimizers` matches), the level
    that runs it (0 every session, 1 basic, 2 extended, 3 all), whether it is a rewrite rule of that level's
    `LevelN_RuleBasedTransformer` or a transformer of its own, what it does, and its header."""

    name: str
    level: int
    kind: str
    does: str
    source: str


#: Where the names come from: microsoft/onnxruntime, onnxruntime/core/optimizer/graph_transformer_utils.cc
#: (GenerateRewriteRules and GenerateTransformers list what runs at each level, on the CPU provider) and the
#: string each class hands to RewriteRule(...) / GraphTransformer(...) in its header (under
#: onnxruntime/core/optimizer/), which is what `disabled_optimizers` compares (FilterTransformers compares
#: transformer->Name(); GenerateRewriteRules compares rule->Name()). Several differ from their class names
#: (PadFusion is "Pad_Fusion", MatmulBNFusion "MatMul_BatchNormalization_Fusion", ClipQuantFusion
#: "ClipQuantRewrite"; GeluFusion and LayerNormFusion are named per level, "...L1"/"...L2"). The transformer
#: names were checked against the installed onnxruntime 1.31.1, which logs "GraphTransformer <name> modified:
#: <0|1>" for each one it runs (tests/test_blame.py keeps the table and the build in step).
ORT_SOURCE = ("microsoft/onnxruntime: onnxruntime/core/optimizer/graph_transformer_utils.cc (what runs at each "
              "level) and each class's Name() in its header; checked against onnxruntime 1.31.1's verbose log")

_R, _T = "rule", "transformer"
ORT_TRANSFORMERS: tuple[OrtTransformer, ...] = (
    # level 0: what every session runs, DISABLE_ALL too (not in graph_transformer_utils.cc: the session adds
    # them, onnxruntime/core/session/inference_session.cc); never to blame for a DISABLE/level difference
    OrtTransformer("CastFloat16Transformer", 0, _T, "Casts around fp16 nodes with no fp16 kernel (required)",
                   "insert_cast_transformer.h"),
    OrtTransformer("RemoveDuplicateCastTransformer", 0, _T, "removes Cast pairs the above made (required)",
                   "insert_cast_transformer.h"),
    OrtTransformer("FuseFp16InitializerToFp32NodeTransformer", 0, _T, "fp16 initializers feeding fp32 Casts (required)",
                   "fuse_initializers_transformer.h"),
    OrtTransformer("MemcpyTransformer", 0, _T, "copies between devices (required)", "transformer_memcpy.h"),
    # level 1 (ORT_ENABLE_BASIC): rewrite rules, run inside Level1_RuleBasedTransformer
    OrtTransformer("Level1_RuleBasedTransformer", 1, _T, "runs the level-1 rewrite rules below", "rule_based_graph_transformer.h"),
    OrtTransformer("EliminateIdentity", 1, _R, "removes Identity", "identity_elimination.h"),
    OrtTransformer("EliminateSlice", 1, _R, "removes a Slice that keeps everything", "slice_elimination.h"),
    OrtTransformer("UnsqueezeElimination", 1, _R, "folds Unsqueeze of an initializer", "unsqueeze_elimination.h"),
    OrtTransformer("EliminateDropout", 1, _R, "removes inference Dropout", "dropout_elimination.h"),
    OrtTransformer("ExpandElimination", 1, _R, "removes an Expand to the same shape", "expand_elimination.h"),
    OrtTransformer("CastElimination", 1, _R, "removes a Cast to the same type", "cast_elimination.h"),
    OrtTransformer("CastChainElimination", 1, _R, "shortens Cast chains (session config opt-in)", "cast_chain_elimination.h"),
    OrtTransformer("PreShapeNodeElimination", 1, _R, "removes a Cast feeding only Shape", "pre_shape_node_elimination.h"),
    OrtTransformer("NoopElimination", 1, _R, "removes x+0, x*1 and the like", "noop_elimination.h"),
    OrtTransformer("DivMulFusion", 1, _R, "(1/a)*b -> b/a", "div_mul_fusion.h"),
    OrtTransformer("FuseReluClip", 1, _R, "Relu+Clip -> Clip", "relu_clip_fusion.h"),
    OrtTransformer("GemmSumFusion", 1, _R, "Gemm+Sum -> Gemm", "gemm_sum_fusion.h"),
    OrtTransformer("GemmTransposeFusion", 1, _R, "Transpose around Gemm -> transA/transB", "gemm_transpose_fusion.h"),
    OrtTransformer("NotWhereFusion", 1, _R, "Not+Where -> Where", "not_where_fusion.h"),
    OrtTransformer("ConvAddFusion", 1, _R, "Conv+Add(constant) -> Conv bias", "conv_add_fusion.h"),
    OrtTransformer("ConvMulFusion", 1, _R, "Conv+Mul(constant) -> Conv weights", "conv_mul_fusion.h"),
    OrtTransformer("ConvBNFusion", 1, _R, "Conv+BatchNormalization -> Conv", "conv_bn_fusion.h"),
    OrtTransformer("Pad_Fusion", 1, _R, "Pad into Conv/MaxPool pads (class PadFusion)", "pad_fusion.h"),
    OrtTransformer("MatMul_BatchNormalization_Fusion", 1, _R, "MatMul+BatchNormalization -> Gemm (class MatmulBNFusion)",
                   "matmul_bn_fusion.h"),
    OrtTransformer("LabelEncoderFusion", 1, _R, "two LabelEncoders -> one", "label_encoder_fusion.h"),
    # level 1 transformers
    OrtTransformer("DoubleQDQPairsRemover", 1, _T, "removes back-to-back Q/DQ pairs", "double_qdq_pairs_remover.h"),
    OrtTransformer("ConstantSharing", 1, _T, "shares equal scalar initializers", "constant_sharing.h"),
    OrtTransformer("CommonSubexpressionElimination", 1, _T, "merges identical nodes", "common_subexpression_elimination.h"),
    OrtTransformer("ConstantFolding", 1, _T, "computes constant subgraphs at load", "constant_folding.h"),
    OrtTransformer("MatMulAddFusion", 1, _T, "MatMul+Add -> Gemm", "matmul_add_fusion.h"),
    OrtTransformer("ReshapeFusion", 1, _T, "Shape->Gather->Concat->Reshape -> Reshape(constant)", "reshape_fusion.h"),
    OrtTransformer("FreeDimensionOverrideTransformer", 1, _T, "fixes free dims from session options",
                   "free_dim_override_transformer.h"),
    OrtTransformer("GeluFusionL1", 1, _T, "decomposed erf GELU -> Gelu (opset 20)", "gelu_fusion.h"),
    OrtTransformer("LayerNormFusionL1", 1, _T, "decomposed LayerNorm -> LayerNormalization", "layer_norm_fusion.h"),
    OrtTransformer("QDQPropagationTransformer", 1, _T, "propagates Q/DQ through data-movement ops", "qdq_transformer/qdq_propagation.h"),
    OrtTransformer("WeightBiasQuantization", 1, _T, "quantizes float weights/biases next to Q/DQ",
                   "qdq_transformer/weight_bias_quantization.h"),
    OrtTransformer("EnsureUniqueDQForNodeUnit", 1, _T, "one DQ per consumer", "qdq_transformer/ensure_unique_dq_for_node_unit.h"),
    OrtTransformer("TransposeOptimizer", 1, _T, "pushes Transposes through ops and cancels them", "transpose_optimizer.h"),
    # level 2 (ORT_ENABLE_EXTENDED)
    OrtTransformer("Level2_RuleBasedTransformer", 2, _T, "runs the level-2 rewrite rules below", "rule_based_graph_transformer.h"),
    OrtTransformer("ClipQuantRewrite", 2, _R, "Clip into QuantizeLinear (class ClipQuantFusion)",
                   "qdq_transformer/clip_quantizelinear.h"),
    OrtTransformer("ReluQuantRewrite", 2, _R, "Relu into QuantizeLinear (class ReluQuantFusion)",
                   "qdq_transformer/relu_quantizelinear.h"),
    OrtTransformer("TransposeOptimizer_CPUExecutionProvider", 2, _T, "TransposeOptimizer again, CPU-specific",
                   "transpose_optimizer.h"),
    OrtTransformer("QDQS8ToU8Transformer", 2, _T, "int8 QDQ -> uint8", "qdq_transformer/qdq_s8_to_u8.h"),
    OrtTransformer("QDQSelectorActionTransformer", 2, _T, "QDQ node groups -> quantized ops",
                   "qdq_transformer/selectors_actions/qdq_selector_action_transformer.h"),
    OrtTransformer("GemmActivationFusion", 2, _T, "Gemm+activation -> FusedGemm", "gemm_activation_fusion.h"),
    OrtTransformer("MatMulIntegerToFloatFusion", 2, _T, "MatMulInteger+Cast+Mul -> MatMulIntegerToFloat",
                   "matmul_integer_to_float.h"),
    OrtTransformer("DynamicQuantizeMatMulFusion", 2, _T, "DynamicQuantizeLinear+MatMulInteger -> DynamicQuantizeMatMul",
                   "dynamic_quantize_matmul_fusion.h"),
    OrtTransformer("ConvActivationFusion", 2, _T, "Conv+activation -> FusedConv", "conv_activation_fusion.h"),
    OrtTransformer("GeluFusionL2", 2, _T, "decomposed erf GELU -> com.microsoft Gelu", "gelu_fusion.h"),
    OrtTransformer("LayerNormFusionL2", 2, _T, "decomposed LayerNorm -> LayerNormalization (level 2)", "layer_norm_fusion.h"),
    OrtTransformer("SimplifiedLayerNormFusion", 2, _T, "x/sqrt(mean(x^2)+eps)*g -> SimplifiedLayerNormalization",
                   "layer_norm_fusion.h"),
    OrtTransformer("AttentionFusion", 2, _T, "BERT self-attention subgraph -> Attention", "attention_fusion.h"),
    OrtTransformer("EmbedLayerNormFusion", 2, _T, "embeddings+LayerNorm -> EmbedLayerNormalization",
                   "embed_layer_norm_fusion.h"),
    OrtTransformer("GatherSliceToSplitFusion", 2, _T, "Gathers/Slices of one axis -> Split", "gather_fusion.h"),
    OrtTransformer("GatherToSliceFusion", 2, _T, "Gather of a range -> Slice", "gather_fusion.h"),
    OrtTransformer("MatmulTransposeFusion", 2, _T, "Transpose/scale into MatMul -> FusedMatMul", "matmul_transpose_fusion.h"),
    OrtTransformer("BiasGeluFusion", 2, _T, "Add+Gelu -> BiasGelu", "bias_gelu_fusion.h"),
    OrtTransformer("GroupQueryAttentionFusion", 2, _T, "GQA subgraph -> GroupQueryAttention (CUDA)",
                   "group_query_attention_fusion.h"),
    OrtTransformer("GroupQueryAttentionPreNormFusion", 2, _T, "norm before GQA into GroupQueryAttention",
                   "group_query_attention_pre_norm_fusion.h"),
    OrtTransformer("SkipLayerNormFusion", 2, _T, "Add+LayerNormalization -> SkipLayerNormalization",
                   "skip_layer_norm_fusion.h"),
    OrtTransformer("BiasSkipLayerNormFusion", 2, _T, "bias Add into SkipLayerNormalization", "bias_skip_layer_norm_fusion.h"),
    OrtTransformer("FastGeluFusion", 2, _T, "tanh-approximated GELU subgraph -> FastGelu", "fast_gelu_fusion.h"),
    OrtTransformer("QuickGeluFusion", 2, _T, "x*sigmoid(a*x) -> QuickGelu", "quick_gelu_fusion.h"),
    OrtTransformer("GeluApproximation", 2, _T, "Gelu -> FastGelu, changes results (session config opt-in: "
                   "optimization.enable_gelu_approximation=1)", "gelu_approximation.h"),
    OrtTransformer("BiasSoftmaxFusion", 2, _T, "Add+Softmax -> BiasSoftmax", "bias_softmax_fusion.h"),
    OrtTransformer("BiasDropoutFusion", 2, _T, "Add+Dropout -> BiasDropout (CUDA)", "bias_dropout_fusion.h"),
    OrtTransformer("MatMulScaleFusion", 2, _T, "scalar Mul into MatMul -> FusedMatMul alpha", "matmul_scale_fusion.h"),
    OrtTransformer("MatMulActivationFusion", 2, _T, "MatMul+activation (DirectML)", "matmul_activation_fusion.h"),
    OrtTransformer("MatMulNBitsFusion", 2, _T, "MatMulNBits with a following op", "matmul_nbits_fusion.h"),
    OrtTransformer("SliceConcatToSpaceToDepthFusion", 2, _T, "Slice+Concat downsample -> SpaceToDepth",
                   "slice_concat_to_space_to_depth_fusion.h"),
    OrtTransformer("QDQFinalCleanupTransformer", 2, _T, "removes Q/DQ pairs left over", "qdq_transformer/qdq_final_cleanup.h"),
    OrtTransformer("WhereDummyDq", 2, _T, "a DQ for Where's constant operand", "qdq_transformer/where_dummy_dq.h"),
    # level 3 (ORT_ENABLE_ALL): layout
    OrtTransformer("NchwcTransformer", 3, _T, "Conv and neighbours to the NCHWc blocked layout", "nchwc_transformer.h"),
    OrtTransformer("NhwcTransformer", 3, _T, "quantized/fp16 Conv to NHWC", "nhwc_transformer.h"),
    OrtTransformer("ConvAddActivationFusion", 3, _T, "Conv+Add+activation -> FusedConv with Z", "conv_add_act_fusion.h"),
)
#: the --level names and the transformer level each runs up to
LEVEL_NUMBER = {"disable": 0, "basic": 1, "extended": 2, "all": 3}


def transformer(name: str) -> OrtTransformer | None:
    """The table's entry for an onnxruntime transformer or rule name, if it has one."""
    return next((t for t in ORT_TRANSFORMERS if t.name == name), None)


def transformers_run(model, level: str = "all", *, config: dict | None = None,
                     disabled: tuple = ()) -> list[tuple[str, bool]]:
    """[(name, changed the graph)] of every graph transformer onnxruntime runs on `model` at `level`, in the
    order it first runs them, read from its verbose log ("GraphTransformer <name> modified: <0|1>").

    The log goes to the process's stderr from C++; it is caught by pointing file descriptor 2 at a
    temporary file while the session is made."""

    data = model_bytes(as_graph(model))
    so = ort.SessionOptions()
    so.graph_optimization_level = LEVELS[level]
    so.log_severity_level = 0
    so.log_verbosity_level = 0
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, str(v))
    fd, path = tempfile.mkstemp(prefix="fusionlab-ortlog-")
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        os.dup2(fd, 2)
        ort.set_default_logger_severity(0)
        ort.InferenceSession(data, so, providers=["CPUExecutionProvider"],
                             **({"disabled_optimizers": list(disabled)} if disabled else {}))
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)
        quiet_onnxruntime()
    try:
        text = Path(path).read_text(errors="replace")
    finally:
        Path(path).unlink(missing_ok=True)
    seen: dict[str, bool] = {}
    for name, modified in re.findall(r"GraphTransformer (\S+) modified: (\d)", text):
        seen[name] = seen.get(name, False) or modified == "1"
    return list(seen.items())


# --------------------------------------------------------------------------------------------------
# judging one run against the unoptimised one
# --------------------------------------------------------------------------------------------------

@dataclass
class Verdict:
    """A candidate run judged against the unoptimised run: the worst output, its error and tolerance."""

    ok: bool
    output: str
    max_abs: float
    tolerance: float
    draw: int
    report: object = None

    rtol: float = 0.0

    def text(self) -> str:
        rel = f" + {self.rtol:g}·|value|" if self.rtol else ""
        return f"{self.output} off by {self.max_abs:.3g} (allowed {self.tolerance:.2g}{rel})"


def _verdict(report) -> Verdict:
    bad = [o for o in report.outputs if not o.ok] or list(report.outputs)
    worst = max(bad, key=lambda o: (o.max_abs if np.isfinite(o.max_abs) else np.inf))
    return Verdict(report.ok, worst.name, float(worst.max_abs), float(worst.atol), worst.draw, report, float(worst.rtol))


def _proto(model) -> onnx.ModelProto:
    return model.to_proto() if isinstance(model, Graph) else model


@dataclass
class _Judge:
    """Runs `model` at a level (with some optimisers disabled) and judges it against DISABLE_ALL."""

    graph: Graph
    level: str
    config: dict
    draws: int
    dims: dict | None
    runs: int = 0

    def session(self, disabled=()):
        return session(self.graph, self.level, disabled_optimizers=tuple(disabled), config=self.config)

    def __call__(self, disabled=()) -> Verdict:
        self.runs += 1
        return _verdict(verify(self.graph, self.graph, fused_session=self.session(disabled), draws=self.draws,
                               dims=self.dims))


def _reference_errors(graph: Graph, verdict: Verdict, sessions: dict, dims) -> dict | None:
    """{run name: max |run - float64 run|} for the verdict's output on its draw; None when no float64 run."""

    try:
        ref = Reference(_proto(graph))
    except Exception:  # noqa: BLE001 - an op with no double kernel anywhere: no reference
        return None
    feeds = make_feeds(graph, seed=verdict.draw, dims=dims)
    try:
        exact = np.asarray(ref.run(feeds)[verdict.output], np.float64)
    except Exception:  # noqa: BLE001
        return None
    out = {}
    for name, sess in sessions.items():
        got = np.asarray(run(sess, feeds)[verdict.output], np.float64)
        fin = np.isfinite(got) & np.isfinite(exact)
        out[name] = float(np.max(np.abs(got - exact)[fin])) if fin.any() else float("nan")
    return out


def _ops(model) -> Counter:
    return Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}" for n in _proto(model).graph.node)


def _optimised(graph: Graph, level: str, config: dict, disabled=()) -> onnx.ModelProto:
    with tempfile.TemporaryDirectory(prefix="fusionlab-blame-") as tmp:
        out = Path(tmp) / "optimised.onnx"
        session(graph, level, optimized_path=out, disabled_optimizers=tuple(disabled), config=config)
        return onnx.load(str(out), load_external_data=False)


def _rewrote(original: onnx.ModelProto, without: onnx.ModelProto, with_: onnx.ModelProto) -> tuple[list, Counter,
                                                                                                Counter]:
    """(the model's nodes the culprit rewrote, the ops the optimised graph has without it and not with it,
    and those it has with it instead)."""
    def key(n):
        return n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}"

    a = {n.name: n for n in without.graph.node}
    b = {n.name: n for n in with_.graph.node}
    gone = [n for name, n in a.items() if name not in b]
    made = [n for name, n in b.items() if name not in a]
    mine = {n.name for n in original.graph.node}
    originals = [n.name for n in original.graph.node if n.name not in b and (n.name in a or not a)]
    return originals or [n.name for n in gone if n.name in mine], Counter(key(n) for n in gone), \
        Counter(key(n) for n in made)


def _minimal(cands: list[str], fixes) -> list[str]:
    """A small subset of `cands` whose disabling alone `fixes` (delta debugging on the complement)."""
    cur, n = list(cands), 2
    while len(cur) >= 2:
        size = -(-len(cur) // n)
        chunks = [cur[i:i + size] for i in range(0, len(cur), size)]
        for c in chunks:
            rest = [x for x in cur if x not in c]
            if rest and fixes(rest):
                cur, n = rest, max(n - 1, 2)
                break
        else:
            if n >= len(cur):
                break
            n = min(len(cur), 2 * n)
    return cur


def _timing(calls: dict, min_time: float, rounds: int):
    s = interleaved(calls, min_time=min_time, min_rounds=rounds, warmup=2)
    a, b = list(s)
    return Comparison.from_samples(s[a], s[b], label_a=a, label_b=b)


# --------------------------------------------------------------------------------------------------
# onnxruntime
# --------------------------------------------------------------------------------------------------

@dataclass
class OrtBlame:
    """What `blame_ort` found; `culprits` empty when the outputs agree (or nothing single is to blame)."""

    level: str
    draws: int
    verdict: Verdict
    changed: list[str] = field(default_factory=list)  # transformers that changed the graph at the level
    culprits: list[str] = field(default_factory=list)
    fixed: Verdict | None = None  # the run with the culprits disabled
    reference: dict | None = None  # {"disable": err, level: err, "without": err} against float64
    gone: list[str] = field(default_factory=list)
    gone_ops: Counter = field(default_factory=Counter)
    made_ops: Counter = field(default_factory=Counter)
    cost: object = None  # Comparison: at the level (A) against the level without the culprits (B)
    repro: Path | None = None
    repro_nodes: tuple[int, int] = (0, 0)
    runs: int = 0
    seconds: float = 0.0
    note: str = ""

    @property
    def differs(self) -> bool:
        return not self.verdict.ok


def blame_ort(model, level: str = "all", *, config: dict | None = None, draws: int = 3, dims: dict | None = None,
              shrink_budget: float | None = 60.0, repro: str | os.PathLike | None = None, time_budget: float = 1.0,
              rounds: int = 10, source: str | None = None) -> OrtBlame:
    """Blame onnxruntime's optimisations at `level` for a difference from DISABLE_ALL (see the module)."""
    t0 = time.monotonic()
    graph = as_graph(model)
    config = dict(config or {})
    judge = _Judge(graph, level, config, draws, dims)
    first = judge()
    out = OrtBlame(level, draws, first)
    if first.ok:
        out.runs, out.seconds = judge.runs, time.monotonic() - t0
        return out
    ran = [(name, changed) for name, changed in transformers_run(graph, level, config=config)
           if (transformer(name) is None or transformer(name).level > 0)]  # the required ones run at DISABLE too
    out.changed = [name for name, changed in ran if changed] or [name for name, _ in ran]
    if not judge(out.changed).ok:
        out.note = (f"still differs with every transformer that changed the graph disabled "
                    f"({', '.join(out.changed) or 'none'}): the difference is in the kernels at this level")
        out.runs, out.seconds = judge.runs, time.monotonic() - t0
        return out
    culprits = _minimal(out.changed, lambda d: judge(d).ok)
    for rb, lv in (("Level1_RuleBasedTransformer", 1), ("Level2_RuleBasedTransformer", 2)):
        if rb in culprits:  # which of its rewrite rules
            rules = [t.name for t in ORT_TRANSFORMERS if t.kind == _R and t.level == lv]
            others = [c for c in culprits if c != rb]
            if judge(others + rules).ok:
                culprits = others + _minimal(rules, lambda d: judge(others + d).ok)
    out.culprits = culprits
    out.fixed = judge(culprits)
    sess_level, sess_without = judge.session(), judge.session(culprits)

    out.reference = _reference_errors(graph, first, {"disable": session(graph, "disable"), level: sess_level,
                                                     "without": sess_without}, dims)
    out.gone, out.gone_ops, out.made_ops = _rewrote(_proto(graph), _optimised(graph, level, config, culprits),
                                                   _optimised(graph, level, config))

    feeds = make_feeds(graph, dims=dims, sess=sess_level)
    names = [o.name for o in sess_level.get_outputs()]
    out.cost = _timing({level: lambda: sess_level.run(names, feeds), "without": lambda: sess_without.run(names, feeds)},
                       time_budget, rounds)
    if shrink_budget:
        out.repro, out.repro_nodes = _shrink_ort(graph, level, config, culprits, draws, dims, shrink_budget, repro,
                                                 source)
    out.runs, out.seconds = judge.runs, time.monotonic() - t0
    return out


def _repro_path(repro, source: str | None, what: str) -> Path:
    if repro is not None:
        return Path(repro)
    stem = Path(source).stem if source else "model"
    return Path(f"{stem}.{what}-repro.onnx")


def _shrink_ort(graph, level, config, culprits, draws, dims, budget, repro, source):
    def still(m: onnx.ModelProto) -> bool:
        g = load(m.SerializeToString(), check=False)
        j = _Judge(g, level, config, draws, dims)
        return not j().ok and j(culprits).ok

    small = shrink(_proto(graph), still, budget_s=budget)
    path = _repro_path(repro, source, "ort")
    if source is not None and Path(source).resolve() == path.resolve():
        path = path.with_name(path.stem + "-small.onnx")
    save_model(small, path, source=source)
    return path, (len(_proto(graph).graph.node), len(small.graph.node))


# --------------------------------------------------------------------------------------------------
# fusionlab's own passes
# --------------------------------------------------------------------------------------------------

@dataclass
class PassBlame:
    """What `blame_passes` found: the fused model's verdict against the original, and the group to blame."""

    passes: list
    verdict: Verdict
    group: object = None  # FusionGroup
    fixed: Verdict | None = None  # the plan without the group
    others: list = field(default_factory=list)  # further groups still wrong without it
    cost: object = None
    repro: Path | None = None
    repro_nodes: tuple[int, int] = (0, 0)
    groups: int = 0
    seconds: float = 0.0
    reference: dict | None = None  # {"disable": original's error, "fused": the fused model's} against float64

    @property
    def differs(self) -> bool:
        return not self.verdict.ok


def blame_passes(model, passes=None, *, draws: int = 3, dims: dict | None = None, level: str = "all",
                 shrink_budget: float | None = 60.0, repro=None, time_budget: float = 1.0, rounds: int = 10,
                 source: str | None = None, **options) -> PassBlame:
    """Blame a group of fusionlab's plan for a fused model that differs from the original."""

    t0 = time.monotonic()
    graph = as_graph(model)
    passes = list(passes or DEFAULT_PASSES)
    opts = options_for(passes, dims=dims, **options)
    # the fuse() safety net would refuse the very difference blame is here to find: run it, compare below
    opts["compare"] = False
    result = fuse(graph, passes, **opts)

    def check(plan) -> Verdict:
        return _verdict(verify(graph, apply(graph, plan, validate=False).graph, draws=draws, dims=dims))

    first = _verdict(verify(graph, result.graph, draws=draws, dims=dims))
    out = PassBlame(passes, first, groups=len(result.plan))
    if not first.ok:
        out.reference = _reference_errors(graph, first, {"disable": session(graph, "disable"),
                                                         "fused": session(result.graph, "disable")}, dims)
    if first.ok:
        out.seconds = time.monotonic() - t0
        return out
    groups = list(result.plan)
    lo, hi = 0, len(groups)  # the plan's first `hi` groups are wrong, its first `lo` are not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if check(FusionPlan(groups[:mid], model=result.plan.model, options=result.plan.options)).ok:
            lo = mid
        else:
            hi = mid
    group = groups[hi - 1]
    out.group = group
    without = result.plan.without(group.id)
    out.fixed = check(without)
    if not out.fixed.ok:
        out.others = [g.id for g in groups[hi:]]

    fused = result.graph
    spared = apply(graph, without, validate=False).graph
    sa, sb = session(fused, level), session(spared, level)
    feeds = make_feeds(graph, dims=dims, sess=sa)
    fa = {k: v for k, v in feeds.items() if k in {i.name for i in sa.get_inputs()}}
    names_a, names_b = [o.name for o in sa.get_outputs()], [o.name for o in sb.get_outputs()]
    out.cost = _timing({"fused": lambda: sa.run(names_a, fa), "without": lambda: sb.run(names_b, fa)}, time_budget,
                       rounds)
    if shrink_budget:
        out.repro, out.repro_nodes = _shrink_passes(graph, passes, opts, group.rule, draws, dims, shrink_budget,
                                                    repro, source)
    out.seconds = time.monotonic() - t0
    return out


def _shrink_passes(graph, passes, opts, rule, draws, dims, budget, repro, source):
    def still(m: onnx.ModelProto) -> bool:
        g = load(m.SerializeToString(), check=False)
        res = fuse(g, passes, **opts)
        mine = [x.id for x in res.plan if x.rule == rule]
        if not mine or verify(g, res.graph, draws=draws, dims=dims).ok:
            return False
        return verify(g, apply(g, res.plan.without(*mine), validate=False).graph, draws=draws, dims=dims).ok

    small = shrink(_proto(graph), still, budget_s=budget)
    path = _repro_path(repro, source, "fusionlab")
    save_model(small, path, source=source)
    return path, (len(_proto(graph).graph.node), len(small.graph.node))
