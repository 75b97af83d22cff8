"""Vertical fusion: producer -> consumer chains that become one kernel.

The rules (`fusionlab.passes.rules`, one module per family; rule names in brackets):

- Conv / ConvTranspose followed by BatchNormalization and per-channel constant Mul/Add/Sub, folded into
  the weights [conv_bn, convtranspose_bn, conv_scale_bias]; a zero constant Pad folded into Conv's pads
  [pad_conv]; a trailing activation fused as ``com.microsoft:FusedConv`` where onnxruntime's CPU kernel
  supports it, and SiLU (``Sigmoid`` + ``Mul``) as Conv + ``com.microsoft:QuickGelu`` [conv_act, conv_bn_act];
  a residual Add + activation in FusedConv's Z input [conv_add_act].
- A constant Pad folded into AveragePool (count_include_pad=1) or into MaxPool when it pads with -inf
  [pad_pool].
- MatMul + Add -> Gemm [matmul_add_gemm]; MatMul / Gemm + BatchNormalization folded [matmul_bn, gemm_bn];
  Gemm + activation -> ``com.microsoft:FusedGemm`` [gemm_act].
- Decomposed erf-GELU -> ``Gelu`` [gelu]; Add + GELU -> ``com.microsoft:BiasGelu`` [bias_gelu].
- Decomposed tanh-GELU, in any arrangement of Mul/Add/Sub/Div/Pow (proved by multiplying out the
  polynomials), with an optional bias Add before it -> ``com.microsoft:FastGelu``, or ``Gelu(approximate=
  "tanh")`` at opset 20 with standard ops only; an opset-20 tanh ``Gelu`` after a bias Add -> FastGelu
  [fast_gelu].
- Decomposed LayerNorm -> ``LayerNormalization`` [layernorm]; [bias Add +] residual Add + LayerNorm ->
  ``com.microsoft:SkipLayerNormalization`` [skip_layernorm]; decomposed RMSNorm (LLaMA/T5 forms) ->
  ``RMSNormalization`` (opset 23; below it no valid op exists: refused) [rmsnorm]; [bias Add +]
  residual Add + RMSNorm -> ``com.microsoft:SkipSimplifiedLayerNormalization`` [skip_rmsnorm].
- Gated MLPs, act(x W_gate) * (x W_up), LLaMA's SiLU and T5's GELU forms, as one group: its ops with the
  activation as one op, or one model-local function with ``lower="functions"`` [swiglu, geglu; opt-in].
- Scalar Mul/Div on a MatMul operand or its output, and Transposes of the last two (or batch) axes of an
  operand -> ``com.microsoft:FusedMatMul`` [fused_matmul].
- ConvNeXt's channels-last blocks: a per-channel Mul after MatMul [+ bias] [-> Transpose] folded into the
  weights [layer_scale]; Transpose -> elementwise ops -> inverse Transpose done untransposed [transpose_cancel].
- Sigmoid + Mul -> QuickGelu [silu]; hard sigmoid / hard swish written out (relu6(x + 3) / 6, ...) ->
  ``HardSigmoid`` / ``HardSwish`` [hard_sigmoid, hard_swish], a Conv before a hard sigmoid -> FusedConv.
- Slices of one tensor that tile an axis (TorchScript's ``chunk``) -> one ``Split`` [slice_split].
- Rotary position embeddings, x * cos + rotate(x) * sin (rotate_half, rotate_every_two, partial rotary) ->
  ``com.microsoft:RotaryEmbedding``, its cache the model's own cos/sin table with position offset 0 [rotary].

Every rewrite is checked first: each intermediate has a single consumer and is not a graph output,
parameters are constants (not overridable initializers), shapes and ranks make the fused op compute the
same thing, constants are exact, the op version and dtype are ones the target op accepts. When a check
fails the nodes are left alone and the refusal is recorded (`plan.refusals`). Folded weights are new
initializers, so a weight shared with another node is never changed.

`lower` chooses the targets (`fusionlab.passes.lowering`): ``"runtime"`` (default) uses onnxruntime's
``com.microsoft`` fused ops; ``"onnx"`` standard ONNX ops only; ``"functions"`` is ``"runtime"`` plus
groups with no fused kernel written as model-local functions. `max_group_ops` caps how many ops a chain
may take (a longer chain stops growing); fixed patterns (a decomposed GELU or LayerNorm becomes one op)
are not split by it.
"""

from __future__ import annotations

from ..graph import Graph
from ..plan import FusionPlan, VERTICAL
from . import cleanup, engine
from .functions import to_functions
from .options import Lowering, check_options
from .rules import RULE_NAMES, VERTICAL_RULES, rule_for

__all__ = ["RULE_NAMES", "DEFAULT_RULES", "OPT_IN_REASONS", "OPTIONS", "plan", "apply"]

#: rules a user names to get (measured no faster than what the default rules make; see below)
_OPT_IN = ("skip_layernorm", "swiglu", "geglu")
#: Rules applied when none are named. A fused kernel earns its place by measurement, not by existing
#: (benchmarks/bench_rules.py -> results/rules.md: one thread, medians of paired interleaved ratios with 95% CIs,
#: speedup = time(original) / time(fused); "off" = optimisations off. The machine is shared: figures are noisy.)
#:
#: - `skip_layernorm` is opt-in: onnxruntime 1.31's CPU SkipLayerNormalization kernel is *slower* than the
#:   Add(s) + LayerNormalization it replaces: Add + LN at 1x128x768 0.16x off; with the projection's bias
#:   0.63x at the corpus' BERT size 3x11x128 and 0.92x at 1x128x768; on whole corpus models 0.86-0.89x off
#:   (bert, gpt2, vit dynamo exports); the pre-LN form that hands the sum on is slower at EXTENDED too
#:   (0.63x, 0.91x). onnxruntime EXTENDED makes the fusion itself on dynamo exports, at that cost.
#: - measured faster, so on: `fused_matmul` 1.09-1.18x off (SDPA scores, YOLO11 attention; 1.00x at EXTENDED,
#:   which makes the same fusion), 1.01-1.05x on the corpus models; `rmsnorm` (RMSNormalization, opset 23) 1.75-3.32x; `skip_rmsnorm` 1.22x
#:   (3x11x128), 1.03x (1x128x768); `layer_scale` 1.01-1.07x; `transpose_cancel` 1.09-1.17x with layer_scale
#:   (the first ConvNeXt block's Mul folds into its projection; 1.01-1.02x on the corpus ConvNeXt), alone 0.95x
#:   off at 3x24x24x16 (the Mul then broadcasts along the last axis) and 1.04x at 1x56x56x96; `hard_swish`
#:   1.44-1.86x, `hard_sigmoid` 1.77-2.76x (Conv + hard sigmoid as FusedConv 1.24x); `slice_split` 1.02-1.06x
#:   off, 0.97-1.01x at EXTENDED (onnxruntime makes the same Split); `attention` (MultiHeadAttention) 1.18x
#:   off on the corpus BERT's attention block (3x11x128), and 1.07-1.35x against the decomposed graph at sequence
#:   16-4096 (benchmarks/results/reductions.md; notebook 10 times 16-2048); on whole BERT-base it measured 1.02x
#:   (0.96-1.06) vs onnxruntime EXTENDED; `rotary` (RotaryEmbedding) on LLaMA's q, k: 1.96x off, 1.76x EXTENDED at the
#:   corpus size (3x4x11x16), 2.83x / 2.58x at LLaMA-7B heads (1x32x512x128); against slice_split's graph with the
#:   in-graph tables, heads handed to attention, 1.24x off / 1.05x EXTENDED (1x4x128x16), 1.89x / 1.36x
#:   (1x32x512x128), with q @ k^T after it
#:   1.29x off / 0.97x (0.84-1.15) EXTENDED (1x32x256x128, the MatMul dominating); whole corpus LLaMA (tiny: rotary
#:   a small share) 0.98-1.06x, within noise. Where the rotated heads are only transposed back, onnxruntime EXTENDED
#:   cancels the Transpose pair around the written-out form and the fused op, opaque to it, measured 0.63x
#:   (0.54-0.72): that case is refused.
#: - `gqa` (GroupQueryAttention on the unrepeated K/V, causal=0, the graph's mask as attention_bias) is on: against
#:   MultiHeadAttention after LLaMA's repeat_kv (benchmarks/bench_gqa.py -> results/gqa.md, corpus LLaMA at 1x32
#:   and 1x128, an 8 Q / 2 K/V-head block at 1x128 and 1x512, off and at ALL) it measured faster in 4 of 16 cells
#:   in a first run (ts exports at 1x32, 1.08-1.13x) and 9 of 16 in a second (ts exports 1.04-1.11x, the block at
#:   1x512 1.04x off), no clear difference in the rest (the dynamo export), never slower, with fewer nodes; without it
#:   (rules without 'gqa') attention is MultiHeadAttention after the kept repeat.
#: - `swiglu`, `geglu` are opt-in: onnxruntime 1.31 has no CPU kernel for a gated MLP (SwiGLU only inside
#:   MoE/QMoE, BiasSplitGelu CUDA-only), so the group is its ops or one model-local function, which onnxruntime
#:   inlines: against the default rules on the corpus exports (batch 1, sequence 64, 1 thread, interleaved,
#:   95% CIs) as a function 0.96x (0.80-1.26) off / 1.05x (1.00-1.15) at ALL on llama.dynamo, 0.97x
#:   (0.91-1.06) / 1.02x (0.97-1.06) on t5_encoder.dynamo, 1.02x (0.88-1.18) / 1.04x (0.94-1.11) on
#:   llama.ts-fold: no clear difference; written out (lower="runtime") it is the same graph as silu/fast_gelu.
DEFAULT_RULES = tuple(r for r in RULE_NAMES if r not in _OPT_IN)
#: why each opt-in rule is off by default, in one line (the measurements above; benchmark tables quote it)
OPT_IN_REASONS = {
    "skip_layernorm": "onnxruntime 1.31's CPU SkipLayerNormalization measured slower than the Add(s) + "
                      "LayerNormalization it replaces (bench_rules: 0.16-0.92x off; whole BERT/GPT-2/ViT 0.86-0.89x)",
    "swiglu": "no CPU kernel for a gated MLP; as one group it measured no faster than the activation fused alone",
    "geglu": "no CPU kernel for a gated MLP; as one group it measured no faster than the activation fused alone",
}
assert set(OPT_IN_REASONS) == set(_OPT_IN)
#: the options this pass takes, with their defaults
OPTIONS = {"rules": None, "lower": "runtime", "dims": None, "max_group_ops": None}


def _resolve(options: dict) -> dict:
    opts = {**OPTIONS, **check_options("vertical", options, OPTIONS)}
    if opts["lower"] not in set(Lowering):
        raise ValueError(f"unknown lowering {opts['lower']!r}; choose from {', '.join(Lowering)}")
    opts["lower"] = Lowering(opts["lower"]).value  # plans hold plain data
    rules = opts["rules"]
    if rules is None:
        rules = DEFAULT_RULES
    elif isinstance(rules, str):
        rules = [r.strip() for r in rules.split(",") if r.strip()]
    unknown = sorted(set(rules) - set(RULE_NAMES))
    if unknown:
        raise ValueError(f"unknown vertical rule(s) {unknown}; choose from {', '.join(RULE_NAMES)}")
    opts["rules"] = sorted(set(rules), key=RULE_NAMES.index)
    if opts["max_group_ops"] is not None and opts["max_group_ops"] < 1:
        raise ValueError(f"max_group_ops must be >= 1 or None, got {opts['max_group_ops']}")
    return opts


def _context(graph: Graph, opts: dict) -> engine.Context:
    return engine.Context(graph, rules=opts["rules"], lower=opts["lower"], dims=opts["dims"],
                          max_group_ops=opts["max_group_ops"])


def _prepared(graph: Graph) -> Graph:
    """The graph plans are computed on: a cleaned copy when clean-up would change anything."""
    if not cleanup.needed(graph):
        return graph
    work = graph.copy()
    cleanup.clean(work)
    return work


def plan(graph: Graph, **options) -> FusionPlan:
    """Find vertical fusion groups (the graph is not changed)."""
    opts = _resolve(options)
    cx = _context(_prepared(graph), opts)
    result = FusionPlan(model=graph.name, options={"vertical": opts})
    for i, m in enumerate(engine.find(cx, VERTICAL_RULES)):
        group = engine.to_group(cx, m, f"v{i}", VERTICAL)
        if opts["lower"] == Lowering.FUNCTIONS and not m.kernel:
            group.lowered_to = "function"
        group.extra = {"kernel": m.kernel, **({"activation": m.activation} if m.activation else {})}
        result.add(group)
    result.refusals = sorted(set(cx.refusals), key=lambda r: (r.node, r.rule, r.reason))
    result.notes.extend(f"vertical: not fused: {r}" for r in result.refusals)
    return result


def apply(graph: Graph, plan: FusionPlan, **options) -> FusionPlan:
    """Rewrite `graph` in place: each vertical group re-checked with its own rule on its anchor, then rewritten;
    returns the groups as written (`engine.written`: a group lowered to a function says which).

    The options are the plan's own (`plan.options["vertical"]`) unless given here. A group whose nodes no
    longer match raises `engine.StaleGroup` naming the group; nothing outside the plan is touched, and the plan
    itself is not changed.
    """
    groups = engine.written(plan, [g for g in plan if g.kind == VERTICAL])
    if not len(groups):
        return groups
    opts = _resolve({**plan.options.get("vertical", {}), **options})
    cleanup.clean(graph)
    cx = _context(graph, opts)
    index = engine.node_index(graph)
    functions: dict[str, list[str]] = {}
    for group in groups:
        if group.anchor not in index:
            raise engine.StaleGroup(f"group {group.id} ({group.rule} at {group.anchor}): node {group.anchor!r} "
                                    "is not in the model")
        rule = rule_for(group.rule, index[group.anchor].op_type)
        if rule is None:
            raise engine.StaleGroup(f"group {group.id}: no {group.rule!r} rule anchors on {group.anchor!r}")
        m = engine.recheck(cx, rule, group, index)
        new_nodes = rule.rewrite(cx, m)
        engine.replace(cx, m, new_nodes, rule.outputs(m, new_nodes), same_shape=rule.same_shape)
        for old in m.nodes:
            index.pop(old.name, None)
        index.update((n.name, n) for n in new_nodes)
        if opts["lower"] == Lowering.FUNCTIONS and not m.kernel:
            functions[group.id] = [n.name for n in new_nodes]
    cleanup.remove_dead(graph)
    engine.import_domains(graph)
    if functions:
        to_functions(graph, groups, groups=list(functions), members=functions)
    return groups

