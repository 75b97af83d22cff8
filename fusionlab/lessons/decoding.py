"""LLM decoding, for notebooks 11 and 12: a LLaMA-style decoder with a KV cache, the bytes of a token, decode attention.

- `LlamaConfig` and `llama_decoder`: a decoder written as exporters write LLaMA (RMSNorm decomposed, rotary as
  ``x * cos + rotate_half(x) * sin`` with cos/sin computed from the positions, grouped-query attention with the
  explicit repeat_kv, a SiLU-gated MLP), with the KV cache as graph inputs ``past_key_i`` / ``past_value_i``
  [B, Nkv, P, D] and outputs ``present_key_i`` / ``present_value_i`` [B, Nkv, P+S, D]: one graph runs the prefill
  (P = 0, S = the prompt) and every decode step (S = 1);
- `decode_attention`: one layer's attention for a decode step over the cache, as exported (concat, repeat_kv,
  softmax attention) or as onnxruntime's GroupQueryAttention taking the cache itself; `decode_attention_bytes`
  what each moves, `decode_attention_reference` the float64 answer;
- `token_bytes`, `step_flops`, `intensity`: what one forward step reads and computes, by counting (weights, KV
  cache, activations), so a decode step can be placed on a roofline beside a prefill;
- `rope`, `attention_reference`, `flash_decode`: rotary embeddings, softmax attention in float64, and
  FlashDecoding's split of one query's attention over the sequence (partial softmaxes combined by log-sum-exp);
- `generate`: greedy decoding with an onnxruntime session, the cache fed back each step;
- `modelled_decode`: bytes per step over a device's bandwidth, a lower bound on the time per token, for one request
  or a batch sharing one read of the weights (modelled from published specs, `fusionlab.cost.devices`);
  `roofline_figure` draws the points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from ..build import make_model, tensor, value_info
from ..cost.devices import Device

__all__ = ["LlamaConfig", "llama_decoder", "decode_attention", "decode_attention_feeds", "decode_attention_reference",
           "decode_attention_bytes", "empty_cache", "feeds_for", "token_bytes", "step_flops", "intensity",
           "rotate_half", "rope", "rope_tables", "attention_reference", "flash_decode", "prefill", "decode", "generate",
           "modelled_decode", "roofline_figure"]


@dataclass(frozen=True)
class LlamaConfig:
    """The shape of a LLaMA-style decoder: `heads` query heads of `head_dim`, `kv_heads` K/V heads they share."""

    vocab: int = 1024
    hidden: int = 768
    heads: int = 12
    kv_heads: int = 4
    intermediate: int = 2048
    layers: int = 2
    rope_base: float = 10000.0
    eps: float = 1e-6

    def __post_init__(self):
        if self.hidden % self.heads or self.heads % self.kv_heads or self.head_dim % 2:
            raise ValueError(f"hidden {self.hidden} must split into {self.heads} heads of an even size, and "
                             f"{self.heads} query heads into groups over {self.kv_heads} K/V heads")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def group(self) -> int:
        """Query heads per K/V head."""
        return self.heads // self.kv_heads

    def layer_params(self) -> dict[str, int]:
        """Weights of one decoder layer, by matrix (the norms' [H] scales included)."""
        h, d = self.hidden, self.head_dim
        return {"q_proj": h * self.heads * d, "k_proj": h * self.kv_heads * d, "v_proj": h * self.kv_heads * d,
                "o_proj": self.heads * d * h, "gate_proj": h * self.intermediate, "up_proj": h * self.intermediate,
                "down_proj": self.intermediate * h, "norms": 2 * h}

    def matmul_params(self) -> int:
        """Weights every token multiplies by: every layer's projections and the LM head (not the embedding table,
        of which a token reads one row)."""
        per = sum(v for k, v in self.layer_params().items() if k != "norms")
        return self.layers * per + self.hidden * self.vocab

    def params(self) -> int:
        """All weights: layers, embedding table, final norm, LM head."""
        return self.layers * sum(self.layer_params().values()) + 2 * self.vocab * self.hidden + self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int = 4, kv_heads: int | None = None) -> int:
        """Bytes the KV cache holds per token, all layers: K and V, `kv_heads` heads of head_dim each."""
        n = self.kv_heads if kv_heads is None else kv_heads
        return self.layers * 2 * n * self.head_dim * dtype_bytes


# --------------------------------------------------------------------------------------------------
# the decoder graph
# --------------------------------------------------------------------------------------------------

class _Graph:
    """Nodes and initializers with exporter-style names (``/model/layers.0/self_attn/...``)."""

    def __init__(self, seed: int, opset: int):
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._names: dict[str, int] = {}

    def node(self, op: str, inputs, scope: str, **attrs) -> str:
        base = f"{scope}/{op}"
        i = self._names.get(base, 0)
        self._names[base] = i + 1
        name = base if i == 0 else f"{base}_{i}"
        out = f"{name}_output_0"
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=name, **attrs))
        return out

    def const(self, name: str, value, dtype=np.float32) -> str:
        self.inits.append(tensor(name, np.asarray(value, dtype=dtype)))
        return name

    def weight(self, name: str, shape, std: float) -> str:
        return self.const(name, self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std))


def _rmsnorm(g: _Graph, x: str, scope: str, weight: str, eps: str) -> str:
    """LLaMA's RMSNorm as exported: weight * (x * 1/sqrt(mean(x^2) + eps))."""
    sq = g.node("Pow", [x, "two"], scope)
    var = g.node("ReduceMean", [sq, "axis_last"], scope, keepdims=1) if g.opset >= 18 else \
        g.node("ReduceMean", [sq], scope, axes=[-1], keepdims=1)
    root = g.node("Sqrt", [g.node("Add", [var, eps], scope)], scope)
    inv = g.node("Div", ["one", root], scope)
    return g.node("Mul", [weight, g.node("Mul", [x, inv], scope)], scope)


def _rotary(g: _Graph, t: str, scope: str, cos: str, sin: str, d: int) -> str:
    """t * cos + rotate_half(t) * sin on [B, N, S, D] (rotate_half: Concat(-t[..., D/2:], t[..., :D/2]))."""
    lo = g.node("Slice", [t, "zero_1", "half_d", "axis3"], scope)
    hi = g.node("Slice", [t, "half_d", "int_max", "axis3"], scope)
    rot = g.node("Concat", [g.node("Neg", [hi], scope), lo], scope, axis=-1)
    return g.node("Add", [g.node("Mul", [t, cos], scope), g.node("Mul", [rot, sin], scope)], scope)


def _heads(g: _Graph, t: str, scope: str, shape: str) -> str:
    """[B, S, N*D] -> [B, N, S, D]."""
    return g.node("Transpose", [g.node("Reshape", [t, shape], scope)], scope, perm=[0, 2, 1, 3])


def _repeat_kv(g: _Graph, t: str, scope: str, grow: str, target: str) -> str:
    """repeat_kv: [B, Nkv, L, D] -> Unsqueeze -> Expand [B, Nkv, G, L, D] -> Reshape [B, N, L, D]."""
    u = g.node("Unsqueeze", [t, "axis2"], scope)
    e = g.node("Expand", [u, g.node("Mul", [g.node("Shape", [u], scope), grow], scope)], scope)
    return g.node("Reshape", [e, target], scope)


def llama_decoder(cfg: LlamaConfig = LlamaConfig(), *, seed: int = 0, opset: int = 23,
                  past: bool = True, batch: int | str = "batch") -> onnx.ModelProto:
    """A LLaMA-style decoder with its KV cache as inputs and outputs, written as the exporters write LLaMA.

    Inputs ``input_ids`` [batch, sequence] and, per layer, ``past_key_i`` / ``past_value_i`` [batch, Nkv, past,
    D]; outputs ``logits`` [batch, sequence, vocab] and ``present_key_i`` / ``present_value_i`` (the past with this
    step's K and V appended on the sequence axis, K after its rotation). Positions start at ``past``: the rotary
    angles and the causal mask are computed in the graph from the cache's length (Shape -> Gather -> Range), so
    one graph runs the prefill (past 0) and each decode step (sequence 1). ``past=False`` writes the prefill
    alone: no past inputs, positions from 0, the presents this step's K and V (the same weights for a seed).
    ``batch`` fixes the batch dimension (1: one request at a time) or names it.
    Weights are deterministic (seed), LeCun-scaled; the norm scales are near one. Opset 23 (RMSNormalization
    exists from 23) is written with IR version 11.
    """
    g = _Graph(seed, opset)
    _decoder_constants(g, cfg)
    cos, sin, bias = _positions(g, past)
    x = g.node("Gather", [g.weight("model.embed_tokens.weight", (cfg.vocab, cfg.hidden), 1.0), "input_ids"],
               "/model/embed_tokens", axis=0)
    presents = []
    for i in range(cfg.layers):
        x, kv = _decoder_layer(g, cfg, i, x, cos, sin, bias, past)
        presents += kv
    final = g.const("model.norm.weight", 1.0 + 0.1 * g.rng.standard_normal(cfg.hidden, dtype=np.float32))
    hs = _rmsnorm(g, x, "/model/norm", final, "eps")
    logits = g.node("MatMul", [hs, g.weight("lm_head.weight", (cfg.hidden, cfg.vocab), cfg.hidden ** -0.5)],
                    "/lm_head")
    return _decoder_model(g, cfg, logits, presents, past, batch, opset)


def _decoder_constants(g: "_Graph", cfg: LlamaConfig) -> None:
    """The scalars, axes, shapes and rotary frequencies every layer reads, as exporters write them once."""
    d, n, nkv = cfg.head_dim, cfg.heads, cfg.kv_heads
    g.const("two", 2.0)
    g.const("one", 1.0)
    g.const("eps", cfg.eps)
    for name, v in (("zero_1", [0]), ("half_d", [d // 2]), ("int_max", [np.iinfo(np.int64).max]), ("axis3", [3]),
                    ("axis2", [2]), ("axis0", [0]), ("axis1", [1]), ("axis_last", [-1]),
                    ("q_shape", [0, 0, n, d]), ("kv_shape", [0, 0, nkv, d]), ("merge", [0, 0, n * d]),
                    ("grow", [1, 1, cfg.group, 1, 1]), ("rep", [0, n, -1, d])):
        g.const(name, v, np.int64)
    for name, v in (("i0", 0), ("i1", 1), ("i2", 2)):
        g.const(name, v, np.int64)
    g.const("mask_zero", 0.0)
    g.const("mask_min", np.finfo(np.float32).min)
    g.const("scale_q", float(d) ** -0.25)
    g.const("scale_k", float(d) ** -0.25)
    inv_freq = (1.0 / cfg.rope_base ** (np.arange(0, d, 2, dtype=np.float64) / d)).astype(np.float32)
    g.const("rotary_emb.inv_freq", inv_freq)


def _positions(g: "_Graph", past: bool) -> tuple[str, str, str]:
    """(cos, sin, causal mask bias) of positions past .. past+S-1, from the cache's and the ids' lengths."""
    s = "/model"
    seq_len = g.node("Gather", [g.node("Shape", ["input_ids"], s), "i1"], s, axis=0)
    if past:
        past_len = g.node("Gather", [g.node("Shape", ["past_key_0"], s), "i2"], s, axis=0)
        total = g.node("Add", [past_len, seq_len], s)
        q_pos = g.node("Range", [past_len, total, "i1"], s)                # [S]
        k_pos = g.node("Range", ["i0", total, "i1"], s)                    # [L]
    else:
        q_pos = k_pos = g.node("Range", ["i0", seq_len, "i1"], s)
    # rotary angles [1, 1, S, D]: Concat(f, f) -> Cos / Sin, f = positions * inv_freq
    r = "/model/rotary_emb"
    pos = g.node("Cast", [g.node("Unsqueeze", [g.node("Unsqueeze", [q_pos, "axis0"], r), "axis_last"], r)], r,
                 to=onnx.TensorProto.FLOAT)                                # [1, S, 1]
    freqs = g.node("Mul", [pos, "rotary_emb.inv_freq"], r)                 # [1, S, D/2]
    emb = g.node("Concat", [freqs, freqs], r, axis=-1)
    cos = g.node("Unsqueeze", [g.node("Cos", [emb], r), "axis1"], r)       # [1, 1, S, D]
    sin = g.node("Unsqueeze", [g.node("Sin", [emb], r), "axis1"], r)
    # causal mask [1, 1, S, L]: key j is seen by query i when j <= past + i
    m = "/model/mask"
    keep = g.node("LessOrEqual", [g.node("Unsqueeze", [k_pos, "axis0"], m),
                                  g.node("Unsqueeze", [q_pos, "axis_last"], m)], m)
    keep = g.node("Unsqueeze", [g.node("Unsqueeze", [keep, "axis0"], m), "axis0"], m)
    return cos, sin, g.node("Where", [keep, "mask_zero", "mask_min"], m)


def _decoder_layer(g: "_Graph", cfg: LlamaConfig, i: int, x: str, cos: str, sin: str, bias: str,
                   past: bool) -> tuple[str, list[tuple[str, str]]]:
    """One layer: RMSNorm, attention with rotary, the cache appended and repeat_kv, the residual, the SwiGLU MLP.
    Returns the layer's output and its (present value, output name) pairs."""
    h, d, n, nkv = cfg.hidden, cfg.head_dim, cfg.heads, cfg.kv_heads
    p, sc = f"model.layers.{i}", f"/model/layers.{i}"
    a = f"{sc}/self_attn"
    norm = lambda name: g.const(f"{p}.{name}.weight", 1.0 + 0.1 * g.rng.standard_normal(h, dtype=np.float32))  # noqa: E731
    hs = _rmsnorm(g, x, f"{sc}/input_layernorm", norm("input_layernorm"), "eps")
    q = _heads(g, g.node("MatMul", [hs, g.weight(f"{p}.self_attn.q_proj.weight", (h, n * d), h ** -0.5)],
                         f"{a}/q_proj"), a, "q_shape")
    k = _heads(g, g.node("MatMul", [hs, g.weight(f"{p}.self_attn.k_proj.weight", (h, nkv * d), h ** -0.5)],
                         f"{a}/k_proj"), a, "kv_shape")
    v = _heads(g, g.node("MatMul", [hs, g.weight(f"{p}.self_attn.v_proj.weight", (h, nkv * d), h ** -0.5)],
                         f"{a}/v_proj"), a, "kv_shape")
    q, k = _rotary(g, q, a, cos, sin, d), _rotary(g, k, a, cos, sin, d)
    if past:
        k = g.node("Concat", [f"past_key_{i}", k], a, axis=2)
        v = g.node("Concat", [f"past_value_{i}", v], a, axis=2)
    presents = [(k, f"present_key_{i}"), (v, f"present_value_{i}")]
    kr, vr = _repeat_kv(g, k, a, "grow", "rep"), _repeat_kv(g, v, a, "grow", "rep")
    qs = g.node("Mul", [q, "scale_q"], a)
    kt = g.node("Mul", [g.node("Transpose", [kr], a, perm=[0, 1, 3, 2]), "scale_k"], a)
    scores = g.node("Add", [g.node("MatMul", [qs, kt], a), bias], a)
    probs = g.node("Softmax", [scores], a, axis=-1)
    ctx = g.node("MatMul", [probs, vr], a)
    ctx = g.node("Reshape", [g.node("Transpose", [ctx], a, perm=[0, 2, 1, 3]), "merge"], a)
    o = g.node("MatMul", [ctx, g.weight(f"{p}.self_attn.o_proj.weight", (n * d, h), (n * d) ** -0.5)],
               f"{a}/o_proj")
    x = g.node("Add", [x, o], sc)
    hs = _rmsnorm(g, x, f"{sc}/post_attention_layernorm", norm("post_attention_layernorm"), "eps")
    mlp = f"{sc}/mlp"
    gate = g.node("MatMul", [hs, g.weight(f"{p}.mlp.gate_proj.weight", (h, cfg.intermediate), h ** -0.5)],
                  f"{mlp}/gate_proj")
    up = g.node("MatMul", [hs, g.weight(f"{p}.mlp.up_proj.weight", (h, cfg.intermediate), h ** -0.5)],
                f"{mlp}/up_proj")
    act = g.node("Mul", [gate, g.node("Sigmoid", [gate], f"{mlp}/act_fn")], f"{mlp}/act_fn")
    down = g.node("MatMul", [g.node("Mul", [act, up], mlp),
                             g.weight(f"{p}.mlp.down_proj.weight", (cfg.intermediate, h),
                                      cfg.intermediate ** -0.5)], f"{mlp}/down_proj")
    return g.node("Add", [x, down], sc), presents


def _decoder_model(g: "_Graph", cfg: LlamaConfig, logits: str, presents: list[tuple[str, str]], past: bool,
                   batch: int | str, opset: int) -> onnx.ModelProto:
    """The graph's outputs named as exporters name them, its inputs and outputs declared, the model made."""
    d, nkv = cfg.head_dim, cfg.kv_heads
    renames = {logits: "logits", **{v: name for v, name in presents}}
    for nd in g.nodes:
        nd.output[:] = [renames.get(o, o) for o in nd.output]
        nd.input[:] = [renames.get(o, o) for o in nd.input]
    cache = [batch, nkv, "past", d]
    inputs = [value_info("input_ids", np.int64, [batch, "sequence"])]
    outputs = [value_info("logits", np.float32, [batch, "sequence", cfg.vocab])]
    total = "past + sequence" if past else "sequence"  # the symbol shape inference gives the Concat
    for i in range(cfg.layers):
        if past:
            inputs += [value_info(f"past_key_{i}", np.float32, cache),
                       value_info(f"past_value_{i}", np.float32, cache)]
        outputs += [value_info(f"present_key_{i}", np.float32, [batch, nkv, total, d]),
                    value_info(f"present_value_{i}", np.float32, [batch, nkv, total, d])]
    model = make_model(g.nodes, inputs, outputs, g.inits, opset=opset, name="llama_decoder")
    if opset > 21:
        model.ir_version = 11  # IR 10 covers opsets up to 21; onnxruntime 1.31 reads up to IR 13
    return model


def decode_attention(cfg: LlamaConfig, *, gqa: bool = False, opset: int = 17) -> onnx.ModelProto:
    """One layer's attention for a decode step over the cache, as a model of its own, in two forms.

    Inputs ``q`` [B, 1, N*D], ``k`` / ``v`` [B, 1, Nkv*D] (this token's projections, K already rotated) and
    ``past_key`` / ``past_value`` [B, Nkv, P, D]; outputs ``out`` [B, 1, N*D] and ``present_key`` /
    ``present_value`` [B, Nkv, P+1, D]. ``gqa=False``: written as the exporters write it (the heads split, the
    past concatenated, repeat_kv, scaled scores, Softmax, the context merged); ``gqa=True``: onnxruntime's
    ``com.microsoft:GroupQueryAttention``, which takes the cache itself and attends with the unrepeated K/V
    heads (``seqlens_k`` = P per batch row and ``total_sequence_length`` = P + 1, computed from the past's shape).
    """
    g = _Graph(0, opset)
    n, nkv, d = cfg.heads, cfg.kv_heads, cfg.head_dim
    cache = ["batch", nkv, "past", d]
    inputs = [value_info("q", np.float32, ["batch", 1, n * d]), value_info("k", np.float32, ["batch", 1, nkv * d]),
              value_info("v", np.float32, ["batch", 1, nkv * d]), value_info("past_key", np.float32, cache),
              value_info("past_value", np.float32, cache)]
    outputs = [value_info("out", np.float32, ["batch", 1, n * d]),
               value_info("present_key", np.float32, ["batch", nkv, "past + 1", d]),
               value_info("present_value", np.float32, ["batch", nkv, "past + 1", d])]
    s = "/attn"
    if gqa:
        for name, v in (("i2", [2]), ("i3", [3]), ("i0", [0]), ("i1", [1])):
            g.const(name, v, np.int64)
        g.const("one32", 1, np.int32)
        shape = g.node("Shape", ["past_key"], s)
        past = g.node("Cast", [g.node("Slice", [shape, "i2", "i3"], s)], s, to=onnx.TensorProto.INT32)  # [P]
        batch = g.node("Slice", [shape, "i0", "i1"], s)                                                 # [B]
        seqlens = g.node("Expand", [past, batch], s)
        total = g.node("Squeeze", [g.node("Add", [past, "one32"], s), "i0"], s)
        g.nodes.append(helper.make_node(
            "GroupQueryAttention", ["q", "k", "v", "past_key", "past_value", seqlens, total],
            ["out", "present_key", "present_value"], name=f"{s}/GroupQueryAttention", domain="com.microsoft",
            num_heads=n, kv_num_heads=nkv, scale=float(d) ** -0.5))
        return make_model(g.nodes, inputs, outputs, g.inits, opset=opset, name="decode_gqa",
                          extra_opsets={"com.microsoft": 1})
    for name, v in (("q_shape", [0, 0, n, d]), ("kv_shape", [0, 0, nkv, d]), ("merge", [0, 0, n * d]),
                    ("grow", [1, 1, cfg.group, 1, 1]), ("rep", [0, n, -1, d]), ("axis2", [2])):
        g.const(name, v, np.int64)
    g.const("scale", float(d) ** -0.5)
    q, k, v = _heads(g, "q", s, "q_shape"), _heads(g, "k", s, "kv_shape"), _heads(g, "v", s, "kv_shape")
    k, v = g.node("Concat", ["past_key", k], s, axis=2), g.node("Concat", ["past_value", v], s, axis=2)
    kr, vr = _repeat_kv(g, k, s, "grow", "rep"), _repeat_kv(g, v, s, "grow", "rep")
    scores = g.node("Mul", [g.node("MatMul", [q, g.node("Transpose", [kr], s, perm=[0, 1, 3, 2])], s), "scale"], s)
    ctx = g.node("MatMul", [g.node("Softmax", [scores], s, axis=-1), vr], s)
    out = g.node("Reshape", [g.node("Transpose", [ctx], s, perm=[0, 2, 1, 3]), "merge"], s)
    renames = {out: "out", k: "present_key", v: "present_value"}
    for nd in g.nodes:
        nd.output[:] = [renames.get(o, o) for o in nd.output]
        nd.input[:] = [renames.get(o, o) for o in nd.input]
    return make_model(g.nodes, inputs, outputs, g.inits, opset=opset, name="decode_attention")


def decode_attention_feeds(cfg: LlamaConfig, context: int, *, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs of `decode_attention` with `context` tokens cached (seeded)."""
    rng = np.random.default_rng(seed)
    f = lambda *shape: rng.standard_normal(shape, dtype=np.float32)  # noqa: E731
    n, nkv, d = cfg.heads, cfg.kv_heads, cfg.head_dim
    return {"q": f(batch, 1, n * d), "k": f(batch, 1, nkv * d), "v": f(batch, 1, nkv * d),
            "past_key": f(batch, nkv, context, d), "past_value": f(batch, nkv, context, d)}


def decode_attention_reference(cfg: LlamaConfig, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What `decode_attention` computes, in float64 numpy: the presents, and each query head's softmax attention
    over its K/V head (head h reads K/V head h // group)."""
    b, n, nkv, d = feeds["q"].shape[0], cfg.heads, cfg.kv_heads, cfg.head_dim
    new = lambda t: t.reshape(b, 1, nkv, d).transpose(0, 2, 1, 3)  # noqa: E731
    k = np.concatenate([feeds["past_key"], new(feeds["k"])], axis=2).astype(np.float64)
    v = np.concatenate([feeds["past_value"], new(feeds["v"])], axis=2).astype(np.float64)
    q = feeds["q"].reshape(b, 1, n, d).transpose(0, 2, 1, 3)
    out = attention_reference(q, np.repeat(k, cfg.group, axis=1), np.repeat(v, cfg.group, axis=1))
    return {"out": out.transpose(0, 2, 1, 3).reshape(b, 1, n * d), "present_key": k, "present_value": v}


def decode_attention_bytes(cfg: LlamaConfig, context: int, *, gqa: bool, dtype_bytes: int = 4) -> int:
    """Bytes one layer's decode-step attention moves at least, each counted once: the past read and the present
    written (past + 1 tokens), then the K/V attended over: the present itself with GroupQueryAttention, or, after
    the repeat, the present read by Expand and its repeat_kv copy (group x the present) written and read again."""
    c = 2 * cfg.kv_heads * cfg.head_dim * dtype_bytes
    total = context + 1
    attended = total if gqa else total + 2 * cfg.group * total
    return (context + total + attended) * c


def empty_cache(cfg: LlamaConfig, batch: int = 1) -> dict[str, np.ndarray]:
    """The KV cache before the prompt: every past_key_i / past_value_i of length 0."""
    z = np.zeros((batch, cfg.kv_heads, 0, cfg.head_dim), np.float32)
    return {f"past_{kind}_{i}": z for i in range(cfg.layers) for kind in ("key", "value")}


def feeds_for(cfg: LlamaConfig, ids: np.ndarray, cache: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The inputs of one step: token ids [B, S] and the cache (empty: a prefill)."""
    ids = np.asarray(ids, np.int64)
    return {"input_ids": ids, **(cache if cache is not None else empty_cache(cfg, ids.shape[0]))}


def _step(sess, names: list[str], feeds: dict) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    res = dict(zip(names, sess.run(names, feeds)))
    nxt = res["logits"][:, -1].argmax(-1).astype(np.int64)[:, None]
    return nxt, {k.replace("present", "past"): v for k, v in res.items() if k.startswith("present")}


def prefill(sess, cfg: LlamaConfig, prompt: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The prompt [B, S] in one step from an empty cache: (the greedy next token [B, 1], the cache it wrote)."""
    return _step(sess, [o.name for o in sess.get_outputs()], feeds_for(cfg, prompt))


def decode(sess, cfg: LlamaConfig, token: np.ndarray, cache: dict[str, np.ndarray],
           steps: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """`steps` decode steps of one token each: feed `token` [B, 1] with `cache`, take the greedy next token, feed
    it back with the present cache as the next past. Returns (the `steps` tokens predicted, [B, steps]; the
    cache after the last step)."""
    names = [o.name for o in sess.get_outputs()]
    out = []
    for _ in range(steps):
        token, cache = _step(sess, names, feeds_for(cfg, token, cache))
        out.append(token)
    return np.concatenate(out, axis=1) if out else token[:, :0], cache


def generate(sess, cfg: LlamaConfig, prompt: np.ndarray, steps: int) -> np.ndarray:
    """Greedy decoding: one prefill of `prompt` [B, S], then `steps` - 1 decode steps: the `steps` ids [B, steps]."""
    token, cache = prefill(sess, cfg, prompt)
    rest, _ = decode(sess, cfg, token, cache, steps - 1)
    return np.concatenate([token, rest], axis=1)


# --------------------------------------------------------------------------------------------------
# bytes and FLOPs of one step
# --------------------------------------------------------------------------------------------------

def token_bytes(cfg: LlamaConfig, context: int, new_tokens: int = 1, dtype_bytes: int = 4) -> dict[str, int]:
    """Bytes one forward step over `new_tokens` tokens with `context` tokens already cached must read at least:
    every matmul weight once, one embedding row per token, the cache of the context, and the K/V it writes.
    (Activations are a few KiB per token and left out: they stay in cache.)"""
    weights = cfg.matmul_params() * dtype_bytes
    embed = new_tokens * cfg.hidden * dtype_bytes
    kv_read = context * cfg.kv_bytes_per_token(dtype_bytes)
    kv_write = new_tokens * cfg.kv_bytes_per_token(dtype_bytes)
    return {"weights": weights, "embedding rows": embed, "KV cache read": kv_read, "KV cache written": kv_write,
            "total": weights + embed + kv_read + kv_write}


def step_flops(cfg: LlamaConfig, context: int, new_tokens: int = 1) -> int:
    """FLOPs of one step: 2 per weight per token (a multiply-add) plus attention's two matmuls, Q·Kᵀ and P·V,
    2 x 2 x heads x head_dim per (query, key) pair, over the keys each query sees (causal)."""
    pairs = sum(context + i + 1 for i in range(new_tokens))
    return 2 * cfg.matmul_params() * new_tokens + cfg.layers * 4 * cfg.heads * cfg.head_dim * pairs


def intensity(cfg: LlamaConfig, context: int, new_tokens: int = 1, dtype_bytes: int = 4) -> float:
    """Arithmetic intensity of a step, FLOP per byte read or written."""
    return step_flops(cfg, context, new_tokens) / token_bytes(cfg, context, new_tokens, dtype_bytes)["total"]


# --------------------------------------------------------------------------------------------------
# rotary embeddings and decode attention, in numpy
# --------------------------------------------------------------------------------------------------

def rope_tables(positions, head_dim: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [len(positions), head_dim] as LLaMA computes them: angles p * base^(-2i/D), each twice."""
    inv = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.asarray(positions, np.float64)[:, None] * inv[None, :]
    emb = np.concatenate([ang, ang], axis=-1)
    return np.cos(emb), np.sin(emb)


def rotate_half(x: np.ndarray) -> np.ndarray:
    """Concat(-x[..., D/2:], x[..., :D/2]): each pair (x_i, x_{i+D/2}) turned a quarter."""
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def rope(x: np.ndarray, positions, base: float = 10000.0) -> np.ndarray:
    """Rotary embedding of x [..., S, D] at `positions` [S]: x * cos + rotate_half(x) * sin."""
    cos, sin = rope_tables(positions, x.shape[-1], base)
    return x * cos + rotate_half(x) * sin


def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(q kᵀ / sqrt(D)) v in float64, q [..., Sq, D], k and v [..., L, D] (no mask: decode's one query
    sees every cached key)."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def flash_decode(q: np.ndarray, k: np.ndarray, v: np.ndarray, splits: int) -> tuple[np.ndarray, list[dict]]:
    """FlashDecoding: one query's attention over L keys split into `splits` chunks of the sequence, each chunk
    done on its own (in parallel on a device: one core each) and the partial results combined exactly.

    Chunk j returns its unnormalised output o_j = sum_i exp(s_i - m_j) v_i, its max m_j and its sum
    l_j = sum_i exp(s_i - m_j); the combine rescales each by exp(m_j - M), M the max of the m_j:
    out = sum_j exp(m_j - M) o_j / sum_j exp(m_j - M) l_j (the log-sum-exp of all scores is M + log of the
    denominator). Returns (out, the chunks' statistics)."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    length = k.shape[-2]
    if not 1 <= splits <= length:
        raise ValueError(f"splits must be in 1..{length}")
    bounds = np.linspace(0, length, splits + 1).round().astype(int)
    parts = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        s = q @ np.swapaxes(k[..., lo:hi, :], -1, -2) / math.sqrt(q.shape[-1])
        m = s.max(-1, keepdims=True)
        e = np.exp(s - m)
        parts.append({"keys": (int(lo), int(hi)), "m": m, "l": e.sum(-1, keepdims=True), "o": e @ v[..., lo:hi, :]})
    big = np.max(np.stack([p["m"] for p in parts]), axis=0)
    num = sum(np.exp(p["m"] - big) * p["o"] for p in parts)
    den = sum(np.exp(p["m"] - big) * p["l"] for p in parts)
    return num / den, parts


# --------------------------------------------------------------------------------------------------
# modelled on the Ascend presets
# --------------------------------------------------------------------------------------------------

def modelled_decode(cfg: LlamaConfig, context: int, device: Device, dtype_bytes: int = 2, batch: int = 1) -> dict:
    """A decode step of one token for each of `batch` requests (each with `context` tokens cached) on one chip of
    `device`, modelled: bytes / bandwidth is a lower bound on the step's time (every weight read once for the whole
    batch, each request's embedding row, cache and new K/V read or written for that request alone, at the
    published peak bandwidth), and the FLOPs / peak the compute time; the larger one is the roofline's time, and
    `batch` tokens over it an upper bound on the tokens per second. fp16 (what ATC runs) by default."""
    chip = device.one_chip()
    tb = token_bytes(cfg, context, 1, dtype_bytes)
    b = tb["weights"] + batch * (tb["total"] - tb["weights"])
    f = batch * step_flops(cfg, context, 1)
    t_mem = b / chip.bandwidth
    t_flop = f / chip.peak_flops("float16")
    return {"device": chip.name, "batch": batch, "bytes": b, "flops": f, "intensity": f / b,
            "ridge": chip.ridge_flop_per_byte, "t_memory_s": t_mem, "t_compute_s": t_flop,
            "tokens_per_s_bound": batch / max(t_mem, t_flop)}


def roofline_figure(devices: list[tuple[str, float, float]], points: list[tuple[str, float]], *,
                    title: str = "roofline"):
    """A log-log roofline: each device (name, peak FLOP/s, bytes/s) as min(peak, intensity x bandwidth), each
    point (label, FLOP/byte) as a vertical line; returns the matplotlib Figure (not shown by pyplot)."""
    import matplotlib.pyplot as plt  # optional heavy dependency: only the notebook draws

    fig, ax = plt.subplots(figsize=(8, 4.2))
    plt.close(fig)
    xs = np.logspace(-1, 4, 200)
    for name, peak, bw in devices:
        ax.plot(xs, np.minimum(peak, xs * bw) / 1e12, label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    low = min(min(peak, xs[0] * bw) for _, peak, bw in devices) / 1e12 / 3
    ax.set_ylim(bottom=low)
    for j, (label, x) in enumerate(points):
        ax.axvline(x, color="0.4", linestyle=":" if j % 2 else "--", linewidth=1)
        ax.text(x * 1.1, low * 1.5, label, fontsize=8, color="0.2", rotation=90, va="bottom")
    ax.set_xlabel("arithmetic intensity (FLOP per byte)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="major", alpha=0.3)
    return fig
