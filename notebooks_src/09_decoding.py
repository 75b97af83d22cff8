# %% [markdown]
# # 09 · Decoding: one token at a time, and what fusion can do about it
#
# **What you will be able to do after this notebook**
#
# - say why generating text one token at a time is limited by memory bandwidth, not by arithmetic: count the
#   bytes of weights and KV cache a decode step reads, compute its arithmetic intensity beside a prefill's,
#   and place both on the roofline of this machine and of the Ascend presets;
# - size a KV cache (bytes per token per layer) and say what grouped-query attention saves;
# - apply a rotary embedding by hand, and split one query's attention over the sequence as FlashDecoding does,
#   with the log-sum-exp combine that makes the split exact;
# - fuse a LLaMA-style decoder that reads and writes its cache, check the fused model against the unfused one,
#   and measure tokens per second against the bandwidth this machine can stream;
# - read what CANN's decoding operators (IncreFlashAttention, PromptFlashAttention, RotaryMul) do, and model a
#   lower bound on the time per token on an Ascend card from its published bandwidth.
#
# You know vertical fusion (notebooks 03 and 04) and fused attention (notebook 08). This notebook takes both to a
# decoder. Everything marked *measured* runs on this machine's CPU with onnxruntime, one thread; the machine
# is shared with other work, so every time comes as a median with an interval. The Ascend figures are
# *modelled* from published specifications, not measured: we have no Ascend hardware.

# %%
import matplotlib.pyplot as plt
import numpy as np

import fusionlab
from fusionlab import exercises, timing, viz, zoo
from fusionlab.cost import calibrate, devices
from fusionlab.cost import model as cost_model
from fusionlab.lessons import decoding as dec
from fusionlab.passes import fuse, vertical
from fusionlab.text import text_table, wrap
from fusionlab.verification import runtime
from IPython.display import Markdown, display

plt.rcParams["figure.dpi"] = 80
MiB = 2**20


def show(header, rows):
    """Print a plain-text table (fusionlab.text.text_table narrows it to the notebook's width)."""
    print("\n".join(text_table(header, rows)))

# %% [markdown]
# ## 1. Prefill and decode: the bytes of one token
#
# A decoder-only language model answers a prompt in two phases:
#
# - **prefill**: the whole prompt goes through the network in one step. Every weight matrix multiplies a
#   matrix of S token rows, so each weight read from memory is used S times;
# - **decode**: then one new token per step. Each weight matrix multiplies a single row (a matrix-vector
#   product): every weight is read from memory, used for one multiply-add, and not used again until the next
#   step. The step also reads the keys and values of every earlier token, the **KV cache**.
#
# The model of this notebook is a small LLaMA-style decoder (`dec.LlamaConfig`): two layers, hidden size 768,
# 12 query heads of 64 sharing 4 key/value heads, a SiLU-gated MLP. It is small, but its weights are larger
# than a CPU's last-level cache (this machine's is printed by the calibration in section 2), so each decode
# step has to fetch them from DRAM, as a device fetches them from its HBM or LPDDR.
#
# **Predict before you run the next cell:** how many bytes must one decode step read, at a context of 128
# tokens, and how many FLOPs does it do per byte?

# %%
cfg = dec.LlamaConfig()
print(wrap(str(cfg)))
show(["matrix (per layer)", "weights"], [[k, f"{v:,}"] for k, v in cfg.layer_params().items()])
print(f"weights every token multiplies by (all layers + LM head): {cfg.matmul_params():,} "
      f"= {cfg.matmul_params() * 4 / MiB:.1f} MiB in float32")
rows = []
for ctx, new in ((128, 1), (1024, 1), (0, 128), (0, 512)):
    b = dec.token_bytes(cfg, ctx, new)
    rows.append([f"{'decode' if new == 1 else 'prefill'}: {new} new, {ctx} cached", f"{b['weights'] / MiB:.1f}",
                 f"{b['KV cache read'] / MiB:.2f}", f"{b['total'] / MiB:.1f}", f"{b['total'] / new / MiB:.2f}",
                 f"{dec.step_flops(cfg, ctx, new) / 1e9:.3f}", f"{dec.intensity(cfg, ctx, new):.2f}"])
show(["step", "weights MiB", "KV read MiB", "total MiB", "MiB per token", "GFLOP", "FLOP/byte"], rows)

# %%
one, pre = dec.intensity(cfg, 128, 1), dec.intensity(cfg, 0, 512)
one16, pre16 = dec.intensity(cfg, 128, 1, dtype_bytes=2), dec.intensity(cfg, 0, 512, dtype_bytes=2)
display(Markdown(
    f"A decode step reads every weight once for one multiply-add each: 2 FLOPs per 4-byte float32 weight, an "
    f"arithmetic intensity of **{one:.2f} FLOP/byte** ({one16:.2f} in float16, two bytes a weight). A prefill of "
    f"512 tokens reads the same weights once for 512 rows: **{pre:.0f} FLOP/byte** ({pre16:.0f} in float16), "
    f"{pre / one:.0f} times more work for each byte. The bytes per token tell the same story: a prefill shares "
    f"one read of the weights among all its tokens."))

# %% [markdown]
# ## 2. On the roofline
#
# A roofline (the cost model of notebook 07) says the fastest a kernel can run is the smaller of the compute
# peak and its arithmetic intensity times the memory bandwidth. Where the two meet is the **ridge point**: a
# kernel of lower intensity is limited by memory. This machine's peak and bandwidth are measured once by
# `fusionlab.cost.calibrate` (one thread: a float32 matmul, and STREAM-style copy and add kernels over arrays four times
# larger than the last-level cache, the median of several runs). The Ascend presets come from
# `data/devices.json` (published specs, see each preset's source note); one model instance runs on one chip,
# so the 300I Duo (two 310P3 chips, each with its own memory) appears as one of its chips, whose figures are
# nearly the 300I Pro's (their lines overlap). The 910B's AI cores are split: each has one cube core for
# matrix products and two vector cores, so its 20 cube cores do the matmuls that dominate decoding, and the
# roofline uses its fp16 cube peak. A 310P3's AI cores each hold a cube and a vector unit, and the chip has
# standalone vector cores besides (the table's count, from the chip's platform file as quoted in
# `cann_facts.md` §3.3, a secondary source).
#
# **Predict before you run the next cell:** on which side of each device's ridge does a decode step fall? And
# a prefill of 512 tokens?

# %%
# NBVAL_IGNORE_OUTPUT
calib = calibrate.calibrate(quick=True)
print(calib.summary())
here = devices.this_machine()
chips = [devices.get(n).one_chip() for n in ("Atlas 300I Pro", "Atlas 300I Duo", "Atlas 800I A2 (Ascend 910B)")]
lines = [(f"this machine (fp32, measured): ridge {here.ridge_flop_per_byte:.1f}", here.peak_flops("float32"),
          here.bandwidth)]
lines += [(f"{d.name} (fp16): ridge {d.ridge_flop_per_byte:.0f}", d.peak_flops("float16"), d.bandwidth)
          for d in chips]
points = [("decode fp32", one), ("decode fp16", one16), ("prefill 512 fp32", pre), ("prefill 512 fp16", pre16)]
dec.roofline_figure(lines, points, title="a decode step (128 cached) and a prefill of 512 tokens on the roofline")

# %%
table = [[d.name, f"{d.mem_bandwidth_gbs:g}", f"{d.peak_fp16_tflops:g}", str(d.ai_cores),
          str(d.vector_cores or (f"{d.standalone_vector_cores} standalone" if d.standalone_vector_cores else "-")),
          f"{d.ridge_flop_per_byte:.0f}", "memory" if one16 < d.ridge_flop_per_byte else "compute",
          "memory" if pre16 < d.ridge_flop_per_byte else "compute"] for d in chips]
show(["one chip of", "GB/s", "FP16 TFLOPS", "AI cores", "vector cores", "ridge FLOP/B", "decode bound by",
      "prefill bound by"], table)

# %% [markdown]
# The decode step sits far to the left of every ridge: on each device its time is set by bytes, and a faster
# matrix unit would not shorten it. In float16 (what the Ascend chips run; the table judges fp16 intensity
# against fp16 ridges) the intensity doubles, and is still orders of magnitude below the Ascend ridges. A
# prefill of 512 tokens is compute-bound on this CPU, and in float16 just past the Ascend ridges. That is why
# serving systems batch many users' decode steps together: B rows share one read of the weights, multiplying
# the intensity by B (the weights' part only: each user's KV cache is still read for that user alone, so the
# attention's intensity does not grow with B).
#
# ## 3. The KV cache, and what grouped-query attention saves
#
# Attention at step t needs the keys and values of all t earlier tokens. They do not change once computed, so
# a decoder stores them: per layer, one key and one value vector per K/V head per token. That store is the KV
# cache, and every decode step reads all of it. Grouped-query attention (GQA) lets several query heads share
# one K/V head: LLaMA-style models keep fewer K/V heads than query heads, and the cache shrinks by the same
# factor.
#
# **Predict before you run the next cell:** this model has 12 query heads and 4 K/V heads. How many bytes does
# one token add to the cache, per layer, and at what context length does the cache outweigh the weights?

# %%
per_layer = cfg.kv_bytes_per_token() // cfg.layers
per_layer_mha = cfg.kv_bytes_per_token(kv_heads=cfg.heads) // cfg.layers
print(f"per token per layer: K and V x {cfg.kv_heads} heads x {cfg.head_dim} floats x 4 bytes = {per_layer:,} "
      f"bytes\n  (with one K/V head per query head: {per_layer_mha:,})")
weights = cfg.matmul_params() * 4
print(f"the cache outweighs the weights from {weights // cfg.kv_bytes_per_token():,} tokens of context "
      f"(without GQA: {weights // cfg.kv_bytes_per_token(kv_heads=cfg.heads):,})")
rows = [[f"{ctx:,}", f"{ctx * cfg.kv_bytes_per_token() / MiB:.1f}",
         f"{ctx * cfg.kv_bytes_per_token(kv_heads=cfg.heads) / MiB:.1f}",
         f"{dec.token_bytes(cfg, ctx)['total'] / MiB:.1f}"] for ctx in (128, 1024, 4096, 16384)]
show(["context", "KV cache MiB (GQA, 4 heads)", "MiB (12 K/V heads)", "MiB read per decode step"], rows)

# %% [markdown]
# The same arithmetic on a model of real size. The cell below uses the shape of an 8-billion-parameter
# LLaMA-style model (32 layers, hidden 4096, 32 query heads of 128 sharing 8 K/V heads, an MLP of 14,336, a
# vocabulary of 128,256: the numbers are in the code) in float16, the precision the Ascend rooflines below use.

# %%
big = dec.LlamaConfig(vocab=128256, hidden=4096, heads=32, kv_heads=8, intermediate=14336, layers=32)
print(f"weights: {big.params() / 1e9:.2f} billion, {big.params() * 2 / 2**30:.1f} GiB in float16")
print(f"KV cache per token: {big.kv_bytes_per_token(2) // 1024} KiB with {big.kv_heads} K/V heads, "
      f"{big.kv_bytes_per_token(2, kv_heads=big.heads) // 1024} KiB with {big.heads}")
for ctx in (4096, 32768):
    print(f"  at {ctx:,} tokens: {ctx * big.kv_bytes_per_token(2) / 2**30:.1f} GiB with GQA, "
          f"{ctx * big.kv_bytes_per_token(2, kv_heads=big.heads) / 2**30:.1f} GiB without")

# %% [markdown]
# For one request the weights still dominate at these lengths; but each request in a batch reads its own cache
# while all of them share one read of the weights, so in a batched server the cache soon is what a decode step
# reads most. Grouped-query attention divides it by the group size (four for this shape, three for the notebook's decoder). It also lets a batch
# of users fit in the device's memory at all.
#
# ## 4. Rotary embeddings on a few numbers
#
# LLaMA does not add a position vector to the tokens. It **rotates** each query and key: the channels form
# pairs (channel i with channel i + D/2), and at position p the pair i turns by the angle p·θᵢ, θᵢ =
# 10000^(−2i/D). Written with `rotate_half(x) = [−x₂, x₁]` (the second half negated, put first), the rotation
# is `x · cos + rotate_half(x) · sin`, which is exactly the pattern the exporters write (Slice, Neg, Concat,
# two Muls and an Add) and fusionlab's `rotary` rule turns into one `RotaryEmbedding` op.
#
# **Predict before you run the next cell:** a vector of four numbers at positions 0, 1 and 2. What happens at
# position 0? Does the rotation change the vector's length?

# %%
x = np.array([1.0, 0.0, 0.5, 2.0])
cos, sin = dec.rope_tables([0, 1, 2], head_dim=4)
print("angles per pair (radians), positions 0, 1, 2:", np.round(np.arccos(cos[:, :2]), 4).tolist())
for p in range(3):
    y = dec.rope(x[None], [p])[0]
    print(f"position {p}: {np.round(y, 4)}   length {np.linalg.norm(y):.4f}   "
          f"pair lengths {np.round(np.hypot(y[:2], y[2:]), 4)}")
q, k = np.array([0.3, -1.2, 0.8, 0.5]), np.array([1.1, 0.4, -0.7, 0.9])
score = lambda m, n: dec.rope(q[None], [m])[0] @ dec.rope(k[None], [n])[0]  # noqa: E731
print(f"q at 7 · k at 2 = {score(7, 2):.6f};  q at 12 · k at 7 = {score(12, 7):.6f};  "
      f"q at 7 · k at 3 = {score(7, 3):.6f}")

# %% [markdown]
# At position 0 nothing turns. Each pair keeps its length, so the vector's does too: rotary changes
# directions, not sizes. And the score between a query and a key depends only on how far apart they are (the
# same at 7 and 2 as at 12 and 7): the model sees relative positions. For decoding this means the key of a
# token can be rotated once, when it is computed, and stored rotated in the cache; later steps never touch it
# again.
#
# ## 5. Decode attention, and FlashDecoding's split over the sequence
#
# In a decode step each head has **one** query against L cached keys. FlashAttention (notebook 08)
# parallelises over batch, heads and query tiles; with one query per head and a small batch there are too few
# blocks to fill the cores, and each walks its whole cache. **FlashDecoding** splits the *keys* instead (split-K): each of n chunks
# of the sequence computes, on its own core, its partial softmax: its maximum score mⱼ, its sum lⱼ = Σ exp(s −
# mⱼ), and its unnormalised output oⱼ = Σ exp(s − mⱼ) v. A last small step combines them with M = max mⱼ:
#
#     out = Σⱼ exp(mⱼ − M) · oⱼ  /  Σⱼ exp(mⱼ − M) · lⱼ
#     log-sum-exp of all the scores = M + log Σⱼ exp(mⱼ − M) · lⱼ
#
# **Predict before you run the next cell:** is the split result equal to plain softmax attention, or only
# close? And what goes wrong if the chunks' outputs are simply added, without the factors exp(mⱼ − M)?

# %%
rng = np.random.default_rng(0)
L, D = 1000, 64
q1 = rng.standard_normal((1, D)) * 2
K, V = rng.standard_normal((L, D)) * 2, rng.standard_normal((L, D))
want = dec.attention_reference(q1, K, V)
out, parts = dec.flash_decode(q1, K, V, splits=4)
show(["chunk", "keys", "max score m_j", "sum l_j"],
     [[str(j), f"{p['keys'][0]}-{p['keys'][1] - 1}", f"{p['m'].item():.3f}", f"{p['l'].item():.4f}"]
      for j, p in enumerate(parts)])
err = np.abs(out - want).max()
naive = sum(p["o"] for p in parts) / sum(p["l"] for p in parts)
print(f"split into 4, combined by log-sum-exp: max |difference| from float64 softmax attention = {err:.1e}")
print(f"the same chunks added without exp(m_j - M):          max |difference| = {np.abs(naive - want).max():.2f}")
for n in (1, 7, 50, 1000):
    o, _ = dec.flash_decode(q1, K, V, n)
    print(f"  {n:4d} chunks: {'equal to' if np.allclose(o, want, rtol=1e-12, atol=1e-13) else 'DIFFERS from'} "
          f"the reference (rtol 1e-12, atol 1e-13)")

# %% [markdown]
# The split is exact, up to float64 rounding, for any number of chunks: the combine rescales every chunk's
# partial sums to the common maximum, the same online-softmax update as FlashAttention, done once across
# chunks instead of tile by tile. Without the rescale the chunks are weighed by their own maxima and the
# result is simply wrong. The price of the split is small: n partial results of D + 2 numbers each, written
# and read back.
#
# ## 6. A LLaMA-style decoder, unfused and fused
#
# `dec.llama_decoder(cfg)` writes the decoder as the exporters write LLaMA: RMSNorm decomposed (Pow,
# ReduceMean, Add, Sqrt, Div, Mul, Mul), rotary written out with cos and sin computed from the positions,
# grouped-query attention with the explicit `repeat_kv` (Unsqueeze, Expand, Reshape), SiLU as Sigmoid and Mul.
# The cache is part of the graph's interface: inputs `past_key_i` / `past_value_i` of shape [batch, K/V heads,
# past, head size] and outputs `present_key_i` / `present_value_i` with this step's keys and values appended.
# The positions (for the rotation and the causal mask) start at the cache's length, so one graph runs the
# prefill (an empty cache) and every decode step (one token). It serves one request at a time: `batch=1`.
#
# **Predict before you run the next cell:** which of the patterns of notebooks 04 and 08 will fuse, and into
# which onnxruntime ops?

# %%
model = dec.llama_decoder(cfg, batch=1)
result = fuse(fusionlab.load(model), passes=("vertical",))
fused = result.graph.to_proto()
print(result.plan.table())

# %% [markdown]
# The rotary groups are not accounted alike. The next cell prints what each rewrite wrote and what the plan
# charges it:

# %%
rot = [g for g in result.plan.groups if g.rule == "rotary"]
made = {o: n for n in model.graph.node for o in n.output}


def projection(g):
    """The projection whose output the group rotates: Transpose <- Reshape <- MatMul (q_proj or k_proj)."""
    matmul = made[made[made[g.reason.rsplit(" of ", 1)[1]].input[0]].input[0]]
    parts = matmul.name.split("/")  # /model/layers.0/self_attn/q_proj/MatMul
    return f"{parts[2]} {parts[4]}"


show(["group", "rotates", "kernels", "saved KiB", "nodes its rewrite wrote"],
     [[g.id, projection(g), str(g.kernels), f"{g.saved_bytes / 1024:.0f}",
       ", ".join(n.rsplit("/", 1)[-1] for n in g.extra["fused_nodes"])] for g in rot])
first, plain = rot[0], [g for g in rot if g.kernels == 1]
q_kib = max(g.saved_bytes for g in plain) / 1024
k_kib = min(g.saved_bytes for g in plain) / 1024
print(wrap(f"{first.id} also wrote {first.kernels - 1} nodes: the Slice and Reshape that cut the graph's cos and sin "
           f"tables to the [S, D/2] caches every RotaryEmbedding reads; the other groups reuse them. The groups that "
           f"wrote nothing else save {q_kib:.0f} KiB (queries, {cfg.heads} heads) or {k_kib:.0f} KiB (keys, "
           f"{cfg.kv_heads} K/V heads): {q_kib / k_kib:.0f}x, the ratio of the heads."))
twin = next(g for g in plain if projection(g).endswith(projection(first).split()[-1]))
print(wrap(f"{first.id} saves {first.saved_bytes / 1024:.0f} KiB, {(twin.saved_bytes - first.saved_bytes) / 1024:.0f} KiB "
           f"less than {twin.id}, the same rotation one layer on: its caches, charged at their own size (the Slice "
           f"writes half of each table, the plan charges the Reshape as a copy, and each is read back once)."))

# %%
before, after = zoo.summary(model), zoo.summary(fused)
ops = sorted(set(before["ops"]) | set(after["ops"]), key=lambda o: (-before["ops"].get(o, 0), o))
show(["op", "exported", "fused"], [[o, str(before["ops"].get(o, 0)), str(after["ops"].get(o, 0))] for o in ops]
     + [["nodes in all", str(before["nodes"]), str(after["nodes"])]])

# %% [markdown]
# One layer's attention before and after (the coloured groups on the left are the plan; the filled ops on the
# right are onnxruntime's fused kernels, each naming the ops it replaces). The right side leaves out the
# few host-side shape ops the rewrite adds to compute `seqlens_k` and `total_sequence_length` from the
# shapes (Shape, Add, Cast, Sub, Expand of a handful of integers):

# %%
layer0 = "/model/layers.0/self_attn/"
lengths = ("_seq", "_past_len", "_total_len", "_seq32", "_total_seq", "_last", "_batch", "_seqlens_k")
viz.before_after(fusionlab.load(model), result.graph, plan=result.plan,
                 nodes_a=[n.name for n in model.graph.node if n.name.startswith(layer0)],
                 nodes_b=[n.name for n in fused.graph.node if n.name.startswith(layer0)
                          and not n.name.endswith(lengths)],
                 titles=("layer 0 attention, exported", "fused"))

# %% [markdown]
# What fused: each RMSNorm after a residual Add became `SkipSimplifiedLayerNormalization` (the Add and the
# norm in one kernel, the sum handed on to the next residual), the first one (no residual before it) the
# opset-23 `RMSNormalization`; each rotation became `RotaryEmbedding`, reading the graph's own cos/sin; SiLU
# became `QuickGelu` (x·sigmoid(α·x); the rule sets α = 1, which is SiLU). And the whole attention, with its cache, became one `GroupQueryAttention`: the rule
# `gqa` sees that the repeated K and V are `Concat(past, new)` on the sequence axis, with the past a graph
# input, and writes the op with `past_key` / `past_value` as inputs; its outputs 1 and 2 (the present cache)
# replace the Concats' outputs, and `repeat_kv` is gone: query head h reads K/V head h // group directly.
#
# The rule refuses, and says why, where onnxruntime's kernel would not compute the same thing. Two cases: the
# same decoder with a symbolic batch (the CPU kernel takes a past together with several new tokens only at
# batch 1), and a prefill-only export whose present V is a graph output the pattern would swallow:

# %%
for name, m in (("symbolic batch", dec.llama_decoder(cfg)), ("prefill only", dec.llama_decoder(cfg, past=False))):
    res = fuse(fusionlab.load(m), passes=("vertical",))
    counts = {k: v for k, v in res.plan.rule_counts().items() if k in ("gqa", "attention")}
    print(f"{name}: attention groups {counts or 'none'}")
    for r in res.plan.why_not():
        if r.rule == "gqa" and "layers.0" in r.node:
            print(wrap("  gqa refused: " + r.reason))

# %% [markdown]
# ### Is the fused decoder the same function?
#
# Correctness first. The fused model is compared with the exported one, both run by onnxruntime with graph
# optimisations off, on a prefill (a prompt of 32 tokens, empty cache) and on a decode step (one token with
# that cache), every output: the logits and every present key and value. Float32 tolerances: rtol 1e-4, atol
# 1e-5 (scaled by the output's largest magnitude, `verify`'s default), tight enough to catch a wrong rotation
# or a missing mask, loose enough for a fused kernel's different order of summation. Then the cache itself: a
# prefill of the first 31 tokens plus one decode step must give the logits that a prefill of all 32 gives for
# its last token.

# %%
prompt = np.random.default_rng(1).integers(0, cfg.vocab, size=(1, 32))
steps = {"prefill, 32 tokens": dec.feeds_for(cfg, prompt)}
first = runtime.run(model, steps["prefill, 32 tokens"])
cache = {k.replace("present", "past"): v for k, v in first.items() if k.startswith("present")}
steps["decode, 1 token after 32"] = dec.feeds_for(cfg, first["logits"][:, -1:].argmax(-1), cache)
rows = []
for name, feeds in steps.items():
    rep = runtime.verify(model, fused, feeds=feeds)
    rows.append([name, f"logits and {len(rep.outputs) - 1} cache tensors", "yes" if rep.ok else "NO"])
show(["step", "outputs compared", "all within rtol 1e-4 / atol 1e-5"], rows)
head = runtime.run(model, dec.feeds_for(cfg, prompt[:, :31]))
past = {k.replace("present", "past"): v for k, v in head.items() if k.startswith("present")}
step = runtime.run(model, dec.feeds_for(cfg, prompt[:, 31:], past))
same = np.allclose(step["logits"][:, 0], first["logits"][:, 31], rtol=1e-4, atol=1e-5)
print(f"31-token prefill + 1 decode step {'matches' if same else 'DIFFERS from'} "
      "the 32-token prefill's last logits")
sa, sb = runtime.session(model, "disable"), runtime.session(fused, "disable")
ga, gb = dec.generate(sa, cfg, prompt, 16), dec.generate(sb, cfg, prompt, 16)
print(f"16 greedy tokens, unfused and fused: {'identical' if np.array_equal(ga, gb) else 'DIFFERENT'}")

# %% [markdown]
# ### What GroupQueryAttention on the cache buys
#
# `dec.decode_attention(cfg)` is one layer's attention for a decode step as a model of its own: this token's
# q, k, v and the past cache in, the context and the present cache out, written as exported (Concat of the
# past, `repeat_kv`, softmax attention). Fused with rule `gqa` it becomes `GroupQueryAttention` on the cache;
# with the rule off, `MultiHeadAttention` after the repeat, which copies each K/V head once per query head of
# its group before attending. Both are checked against a float64 numpy reference (each query head's softmax
# over its K/V head) at a few context lengths, float32 tolerances rtol 1e-4 / atol 1e-5; the present caches
# must be exact.

# %%
exported = dec.decode_attention(cfg)
no_gqa = tuple(r for r in vertical.DEFAULT_RULES if r != "gqa")
forms = {"exported": exported,
         "rule gqa off: MultiHeadAttention after the repeat":
             fuse(fusionlab.load(exported), passes=("vertical",), rules=no_gqa).graph.to_proto(),
         "rule gqa on: GroupQueryAttention": fuse(fusionlab.load(exported), passes=("vertical",)).graph.to_proto()}
rows = []
for name, m in forms.items():
    checks = []
    for ctx in (0, 7, 4096):
        feeds = dec.decode_attention_feeds(cfg, ctx, seed=ctx)
        want, got = dec.decode_attention_reference(cfg, feeds), runtime.run(m, feeds)
        checks.append(np.allclose(got["out"], want["out"], rtol=1e-4, atol=1e-5)
                      and all(np.array_equal(got[k], want[k]) for k in ("present_key", "present_value")))
    made_by = {o: n.op_type for n in m.graph.node for o in n.output}
    repeat = any(n.op_type == "Expand" and made_by.get(n.input[0]) == "Unsqueeze" for n in m.graph.node)
    attention = next((n.op_type for n in m.graph.node if n.domain), "Softmax and MatMuls")
    rows.append([name, str(len(m.graph.node)), attention, "yes" if repeat else "no", "yes" if all(checks) else "NO"])
show(["form", "nodes", "attention", "repeat_kv", "within rtol 1e-4 / atol 1e-5 of float64 at contexts 0, 7, 4096"], rows)
CTX = 4096
b_rep, b_gqa = (dec.decode_attention_bytes(cfg, CTX, gqa=g) for g in (False, True))
print(f"one layer, {CTX} cached: {b_rep / MiB:.1f} MiB moved after the repeat, {b_gqa / MiB:.1f} MiB by "
      f"GroupQueryAttention ({b_rep / b_gqa:.2f}x)")

# %% [markdown]
# The bytes (the last line above): with the cache of one layer at P tokens, both forms read the past and write
# the present, P + 1 tokens. Then GroupQueryAttention reads the present once; the repeat reads the present, writes
# a copy of it `group` times over, and the attention reads that copy.
#
# **Predict before you run the next cell:** the repeat path moves that many times the bytes. How much slower
# will it be?

# %%
# NBVAL_IGNORE_OUTPUT
feeds4k = dec.decode_attention_feeds(cfg, CTX)
s_rep, s_gqa = (runtime.session(forms[k], "disable") for k in list(forms)[1:])
att = timing.interleaved({"repeat": lambda: s_rep.run(None, feeds4k), "gqa": lambda: s_gqa.run(None, feeds4k)},
                         min_time=3.0, min_rounds=20)
ca = timing.Comparison.from_samples(att["repeat"], att["gqa"], label_a="MultiHeadAttention after the repeat",
                                    label_b="GroupQueryAttention")
print(ca)
display(Markdown(ca.markdown("GroupQueryAttention on the cache", "MultiHeadAttention after the repeat")
                 + f" Counting each byte moved once, the repeat path moves {b_rep / b_gqa:.2f}× the bytes."))

# %% [markdown]
# Where fusion can pay in decoding, then: not in the small elementwise intermediates, but in not materialising
# a copy of the cache, the one tensor that grows with the context (and, for a small model on a device, in the
# launches it removes: section 8). CANN's IncreFlashAttention takes the same
# grouping as an argument, `num_key_value_heads` (section 8).
#
# ## 7. Tokens per second, and bytes per token against the bandwidth
#
# First the two phases on this machine, one thread, the unfused model: a prefill of 128 tokens against a
# single decode step, run interleaved (the order alternating each round, so drift hits both alike).
#
# **Predict before you run the next cell:** a prefill of 128 tokens does 128 times the arithmetic of one
# decode step. How many decode steps' time does it take?

# %%
# NBVAL_IGNORE_OUTPUT
long_prompt = np.random.default_rng(2).integers(0, cfg.vocab, size=(1, 128))
tok, cache128 = dec.prefill(sa, cfg, long_prompt)
names = [o.name for o in sa.get_outputs()]
pre_feeds, dec_feeds = dec.feeds_for(cfg, long_prompt), dec.feeds_for(cfg, tok, cache128)
phase = timing.interleaved({"prefill": lambda: sa.run(names, pre_feeds),
                            "decode": lambda: sa.run(names, dec_feeds)},
                           min_time=3.0, min_rounds=15)
c = timing.Comparison.from_samples(phase["prefill"], phase["decode"], label_a="prefill of 128",
                                   label_b="one decode step")
print(c)
display(Markdown(
    f"One prefill of 128 tokens costs **{c.speedup:.1f}** decode steps (95% CI {c.ci_low:.1f}–{c.ci_high:.1f}): "
    f"per token, the prefill is {128 / c.speedup:.0f} times cheaper, because its tokens share one read of the "
    f"weights."))

# %% [markdown]
# Now the decode loop, unfused against fused: 16 steps of one token each from the cache of a 32-token prompt,
# the present cache fed back as the next past each step, the two models run interleaved. The bytes a step must
# read (weights, the cache so far, the K/V it writes) over the time it takes is the bandwidth the step
# achieves; beside it, the bandwidth this machine streams (the streaming bandwidth of section 2, the better of copy and add).
#
# **Predict before you run the next cell:** fusion removed many of the decoder's nodes (the table in section
# 6). How much faster will a decode step be?

# %%
# NBVAL_IGNORE_OUTPUT
N_STEPS = 16
start_tok, start_cache = dec.prefill(sa, cfg, prompt)
loops = timing.interleaved({"unfused": lambda: dec.decode(sa, cfg, start_tok, start_cache, N_STEPS),
                            "fused": lambda: dec.decode(sb, cfg, start_tok, start_cache, N_STEPS)},
                           min_time=6.0, min_rounds=15)
cmp = timing.Comparison.from_samples(loops["unfused"], loops["fused"], label_a="unfused", label_b="fused")
print(cmp)
step_bytes = np.mean([dec.token_bytes(cfg, 32 + i)["total"] for i in range(N_STEPS)])
rows = []
for name in ("unfused", "fused"):
    t = timing.median_ci(loops[name])[0] / N_STEPS
    rows.append([name, f"{1 / t:.0f}", f"{t * 1e3:.2f}", f"{step_bytes / t / 1e9:.1f}",
                 f"{step_bytes / t / 1e9 / calib.stream_gbs:.0%}"])
show(["model", "tokens/s", "ms per token", "GB/s achieved", "of streamed bandwidth"], rows)
display(Markdown(cmp.markdown("The fused decoder", "the unfused one") + (
    f" A step must read {step_bytes / MiB:.1f} MiB; at the {calib.stream_gbs:.1f} GB/s this machine streams, "
    f"that alone takes {step_bytes / calib.stream_gbs / 1e6:.2f} ms.")))

# %% [markdown]
# Whatever the interval says on the day, the reason is in the bytes: fusion removed the *intermediate* tensors
# between the small ops (each a few KiB for one token), but every weight still has to be read once per token,
# fused or not. The time of a decode step is mostly that read. What shortens it is fewer bytes: weights in
# float16 or int8 (notebook 10), a smaller cache (GQA, a quantized cache) read without a copy
# (GroupQueryAttention above), or more tokens per read of the weights (batching users, speculative decoding).
#
# ## 8. CANN's decoding operators, and a model of an Ascend card
#
# CANN has fused operators for exactly these phases (from the op-plugin documentation of `torch_npu`, as
# summarised in our reference notes):
#
# - **IncreFlashAttention** (`npu_incre_flash_attention`): decode attention, one query token against the KV
#   cache, with `num_key_value_heads` for grouped-query attention and a paged cache (`block_table`,
#   `block_size`). On the Atlas inference series (310P: the 300I Pro and Duo) the query must be fp16; the KV
#   cache may be fp16 or int8.
# - **PromptFlashAttention** (`npu_prompt_flash_attention`): prefill attention over the whole prompt. On 310P
#   it is restricted: fp16 only, and `num_key_value_heads` only 0, that is, no GQA.
# - **FusedInferAttentionScore** dispatches to one or the other: a query of one token goes to the
#   IncreFlashAttention branch, longer ones to PromptFlashAttention (documented for A2/A3; not listed for 310P).
# - **RotaryMul** (`npu_rotary_mul`): `out = r1 * x + r2 * rotate(x)`, the rotation of section 4 on one
#   tensor; on 310P only with `jit_compile=True`, half mode only, head size 128. `npu_apply_rotary_pos_emb`
#   rotates Q and K in one kernel.
# - **RmsNorm** and **AddRmsNorm**: RMSNorm, and the residual Add with it, the counterpart of
#   `SkipSimplifiedLayerNormalization` above.
#
# They are the same fusions as onnxruntime's `MultiHeadAttention` / `GroupQueryAttention`, `RotaryEmbedding`
# and `SkipSimplifiedLayerNormalization`, and none of them changes the bytes of weights a decode step reads.
# So a lower bound on an Ascend card's time per token needs no hardware: bytes per token over the bandwidth of
# the chip that holds the model. The cell below models the 8-billion-parameter shape of section 3 in fp16, at
# a context of 4096 tokens, on one chip of each preset. These are **modelled from published specifications,
# not measured**; a real card reaches only part of its peak bandwidth, so real times are longer.
#
# **Predict before you run the next cell:** how many tokens per second at most can one 310P3 chip (about 205
# GB/s) generate for this model?

# %%
rows = []
for d in chips:
    m = dec.modelled_decode(big, 4096, d)
    rows.append([m["device"], f"{m['bytes'] / 2**30:.2f}", f"{m['intensity']:.2f}", f"{m['ridge']:.0f}",
                 f"{m['t_memory_s'] * 1e3:.1f}", f"{m['t_compute_s'] * 1e3:.2f}", f"{m['tokens_per_s_bound']:.1f}"])
show(["one chip of", "GiB per token", "FLOP/B", "ridge", "ms (bytes/bandwidth)", "ms (FLOPs/peak)",
      "tokens/s at most"], rows)
small = dec.modelled_decode(cfg, 128, chips[0])
print(f"this notebook's decoder in fp16 on one 310P3, 128 cached: at most {small['tokens_per_s_bound']:,.0f} "
      f"tokens/s ({small['bytes'] / MiB:.1f} MiB per token)")
pro = chips[0]
step_cost = cost_model.plan_cost(fusionlab.load(model), cost_model.as_launched(result.plan), pro,
                                 dims={"sequence": 1, "past": 128})
launch_ms = step_cost.kernels * pro.launch_overhead_us / 1e3
print(wrap(f"but the fused decoder launches {step_cost.kernels} kernels a step (the cost model's count, host-side shape "
           f"ops left out); at the preset's {pro.launch_overhead_us:g} us a launch (assumed) that is {launch_ms:.2f} ms, "
           f"{launch_ms / (small['t_memory_s'] * 1e3):.1f}x its memory time of {small['t_memory_s'] * 1e3:.2f} ms; the "
           f"cost model predicts {step_cost.latency_s * 1e3:.2f} ms a step, {1 / step_cost.latency_s:,.0f} tokens/s"))

# %% [markdown]
# On every chip the memory time is far larger than the compute time: decode runs at the bandwidth, and the
# FLOPs are nearly free. The same table says what the levers are: the 300I Duo's second chip doubles what the
# card serves (a second model instance with its own memory), not the speed of one request on one chip
# (splitting one model over both chips adds the traffic between them, which this model does not count); a chip
# with HBM (the 910B4) is several times faster per token; int8 weights nearly halve the bytes (the fp16 cache stays).
#
# The last lines say the bytes bound is not the whole story for a model this small: on the model of a 310P3 its
# decode step is limited by kernel launches, not bytes (compare the launch time with the memory time above), and
# the tokens per second fall well short of the bound. There fusion pays a second way, besides the cache copy of
# section 6: every kernel it removes is one launch less per token. The launch cost is an assumption of the
# presets (no figure is published; msprof's task wait times would measure it).
#
# ## Summary
#
# - A decode step reads every weight and the whole KV cache for one token, below one FLOP per byte in fp32:
#   far left of every ridge, so bytes per token over bandwidth bounds its time, here and (modelled) on Ascend.
# - The cache grows by K and V per K/V head per layer per token; GQA shrinks it by the group, rotary keys are
#   cached rotated, and FlashDecoding splits one query over the sequence exactly by a log-sum-exp combine.
# - Fusing norms, rotations and attention (verified on prefill and decode) leaves the weights' bytes; what can
#   pay is reading the cache without a copy (GroupQueryAttention; CANN's IncreFlashAttention takes the
#   groups) and, for a small model on a device, the kernel launches it removes.

# %% [markdown]
# ## Exercises
#
# The exercises check themselves: write your answer in the cell under each task, run it, then run the `check` cell.
# `check` grades it at once on hidden cases and prints PASS with what it checked, or FAIL with a hint naming the
# first case your answer gets wrong and the mistake it looks like. The notebook is stored unanswered; reference
# answers are in the repository's `solutions/` folder, outside the notebooks (try first).
#
# **Exercise 1: the KV cache a decode step reads.** Write `kv_cache_bytes(layers, heads, kv_heads, head_dim,
# context, dtype_bytes)`: the bytes of the K and V of the `context` earlier tokens that a decode step reads (§1's
# "KV read" column; this token's own K/V not counted), for a decoder of `layers` layers whose `heads` query heads
# share `kv_heads` K/V heads of `head_dim` values, each value `dtype_bytes` bytes (§3 counted it for this
# notebook's decoder). The hidden shapes include an 8B-sized one with
# GQA, one without GQA, multi-query attention and an empty cache.

# %%
def kv_cache_bytes(layers, heads, kv_heads, head_dim, context, dtype_bytes):
    """Bytes of K and V a decode step reads with `context` tokens cached."""
    ...  # your code here


# %%
exercises.kvcache.check(kv_cache_bytes)


# %% [markdown]
# **Exercise 2: rotary embeddings.** Write `apply_rotary(x, positions, base)`: `x` holds vectors [..., S, D] at the
# token positions `positions` [S]; rotate each as §4 does, channel i paired with channel i + D/2 and turned by
# p·θᵢ, θᵢ = base^(−2i/D), without calling `dec.rope`. `check` compares your result with onnxruntime's own
# `RotaryEmbedding` kernel, the op the `rotary` rule writes; the hidden cases include §4's vector, a decode step
# at a late position, several heads and another base.

# %%
def apply_rotary(x, positions, base=10000.0):
    """x [..., S, D] rotated at `positions` [S], LLaMA's half-rotated form."""
    ...  # your code here


# %%
exercises.rotary.check(apply_rotary)
