# %% [markdown]
# # 11 · Decoding one token at a time: bytes, the KV cache, rotary and FlashDecoding
#
# **What you will be able to do after this notebook**
#
# - say why generating text one token at a time is limited by memory bandwidth, not by arithmetic: count the
#   bytes of weights and KV cache a decode step reads, compute its arithmetic intensity beside a prefill's,
#   and place both on the roofline of this machine and of the Ascend presets;
# - size a KV cache (bytes per token per layer) and say what grouped-query attention saves;
# - apply a rotary embedding by hand, and split one query's attention over the sequence as FlashDecoding does,
#   with the log-sum-exp combine that makes the split exact.
#
# You know the roofline (notebook 07) and fused attention (notebook 10). This notebook counts what one generated
# token costs and works the decoder's two new kernels, rotary and decode attention, on a few numbers; notebook 12
# builds the decoder, fuses it and measures it. This machine's peak and bandwidth are *measured* on its CPU, one
# thread; the Ascend figures are *modelled* from published specifications, not measured: we have no Ascend
# hardware.

# %%
import matplotlib.pyplot as plt
import numpy as np

from fusionlab import exercises
from fusionlab.cost import calibrate, devices
from fusionlab.lessons import decoding as dec
from fusionlab.text import text_table, wrap
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
# vocabulary of 128,256: the numbers are in the code) in float16, the precision of §2's Ascend rooflines.

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
# In a decode step each head has **one** query against L cached keys. FlashAttention (notebook 10)
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

# %% [markdown]
# ## Summary
#
# - A decode step reads every weight and the whole KV cache for one token, below one FLOP per byte in fp32:
#   far left of every ridge, so bytes per token over bandwidth bounds its time, here and (modelled) on Ascend.
# - The cache grows by K and V per K/V head per layer per token, and for a batch soon outweighs the weights;
#   grouped-query attention shrinks it by the group.
# - Rotary turns each query and key by its position, so keys are cached rotated; FlashDecoding splits one
#   query's attention over the sequence, exactly, by a log-sum-exp combine.

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
