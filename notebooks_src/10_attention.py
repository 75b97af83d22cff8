# %% [markdown]
# # 10 · Attention: the O(N²) intermediate, and the kernel that never writes it
#
# **What you will be able to do**
#
# 1. say why attention's score matrix grows with the square of the sequence, and count the bytes one head moves
#    unfused and tiled, at any length;
# 2. read FlashAttention's loop as notebook 09's online softmax with one more running quantity, the output
#    accumulator, and check it against the unfused computation;
# 3. time onnxruntime's fused `MultiHeadAttention` against the decomposed graph on this CPU, with and without its
#    flash path, and read the gain against the bytes model;
# 4. size the same kernel's tile for an Ascend AI core's L1 and Unified Buffer, and read what the model (not a
#    measurement) predicts there.
#
# Notebook 09 fused softmax and LayerNorm, whose rows fit in the L1 cache; notebook 09 §2 derived the *online
# softmax*: a running max and a running sum, the sum rescaled by `exp(m_old − m_new)` whenever the max rises, give
# a row's softmax in one pass. Attention's softmax rows are as long as the sequence, and a matrix product follows
# them. FlashAttention carries a third running quantity through the same update, the weighted sum of value rows
# (the update of notebook 09's Exercise 1), and so never writes the scores. Here we count what that saves, measure
# it on this CPU, and model it on an Ascend core.

# %%
import inspect
import os

import matplotlib.pyplot as plt
import numpy as np

from fusionlab import exercises, timing
from fusionlab.compilers import ort as ort_count
from fusionlab.cost import calibrate, devices
from fusionlab.lessons import reductions as R
from fusionlab.text import text_table
from fusionlab.verification import runtime
from IPython.display import Markdown, display

rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. Attention: an O(N²) intermediate
#
# Scaled dot-product attention for one head is `softmax(Q Kᵀ / √d) V`, with Q, K, V of N × d. The
# product `Q Kᵀ` is N × N: it grows with the *square* of the sequence length while the inputs and the
# output grow linearly. Exported, attention is MatMul, Mul (the scale), Softmax, MatMul, and the N × N
# scores are written and read back three times. For 12 heads of a 4096-token sequence that is
# 12 × 4096² × 4 bytes = 768 MiB per intermediate:

# %%
print(f"{'seq':>6} {'Q, K, V, O (one head, d=64)':>28} {'scores (one head)':>18} {'scores, 12 heads':>17}")
for seq in (128, 512, 1024, 2048, 4096, 8192):
    qkvo = 4 * seq * 64 * 4
    print(f"{seq:>6} {qkvo / 2**20:>24.2f} MiB {seq * seq * 4 / 2**20:>14.1f} MiB {12 * seq * seq * 4 / 2**20:>13.0f} MiB")

# %% [markdown]
# ## 2. FlashAttention: the online softmax, carried through V
#
# **FlashAttention** (Dao et al., 2022) never builds the scores. It takes a tile of queries, streams the
# keys and values past it in tiles, and for each tile of scores does an online-softmax step: raise the
# running max, rescale the running sum *and the output accumulator* by `exp(m_old − m_new)`, add the new
# tile's contribution. Set it beside notebook 09's `online_softmax`: `m` is its running max, `l` its running
# sum (`s` there), `alpha` its rescaling factor, and the accumulator `o` is the one addition. Only a
# (block_q × block_k) tile of scores exists at any time:

# %%
print(inspect.getsource(R.flash_attention))

# %% [markdown]
# Verified against the unfused computation (which builds the full N × N matrix), for tiles that do
# and do not divide the sequence length:

# %%
q, k, v = (rng.standard_normal((300, 64)).astype(np.float32) for _ in range(3))
exact = R.attention_reference(q, k, v)
for bq, bk in ((64, 64), (32, 100), (300, 16)):
    err = np.abs(R.flash_attention(q, k, v, bq, bk) - exact).max()
    print(f"tiles {bq:>3} x {bk:>3}: max |flash - unfused| below 1e-5: {err < 1e-5}")

# %% [markdown]
# **Bytes against sequence length.** Unfused, one head reads Q, K and V and writes O (N × d each), and moves the
# scores six times (written by the first MatMul, read and written by the scale and by the softmax, read by the
# second MatMul). Tiled, Q is read and O written once, and K and V once per query tile; the tile is as large as the
# fast memory allows (here 1 MiB, the model's `on_chip_bytes`: the order of one core's L2 cache). Both still grow as
# N² (K and V are re-read N / block times), but the tiled kernel's constant is far smaller, and it never *holds* an
# N × N tensor: its memory footprint stays linear in N. (A model of traffic to memory: on a CPU, small score
# matrices stay in the cache, so the unfused graph's real traffic is lower at short lengths.)

# %%
seqs = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
ab = [R.attention_bytes(s, 64) for s in seqs]
print(f"{'seq':>6} {'unfused MiB':>12} {'tiled MiB':>10} {'ratio':>6} {'tile':>5}")
for a in ab:
    print(f"{a.seq:>6} {a.unfused / 2**20:>12.1f} {a.flash / 2**20:>10.1f} {a.unfused / a.flash:>6.1f} {a.block_q:>5}")
fig, ax = plt.subplots(figsize=(6.5, 3.4))
ax.loglog(seqs, [a.unfused / 2**20 for a in ab], "o-", label="unfused: MatMul, Mul, Softmax, MatMul")
ax.loglog(seqs, [a.flash / 2**20 for a in ab], "s-", label="tiled (FlashAttention), 1 MiB on chip")
ax.loglog(seqs, [4 * s * 64 * 4 / 2**20 for s in seqs], ":", color="gray", label="Q, K, V read + O written once")
ax.set_xlabel("sequence length N")
ax.set_ylabel("MiB moved, one head, d = 64")
ax.legend(fontsize=8)
ax.set_title("Attention traffic (modelled)")
fig.tight_layout()

# %% [markdown]
# ## 3. onnxruntime's fused attention on this CPU
#
# onnxruntime has a `com.microsoft.MultiHeadAttention` kernel (and `Attention`, which also takes the Q/K/V
# projection weights; its graph optimiser fuses exported BERT attention into it). Its CPU implementation includes a
# flash-attention kernel from MLAS (onnxruntime's math library), which sizes its tiles by the L2 cache; setting
# `ORT_DISABLE_FLASH_ATTENTION=1` before the session is created turns that path off. We build the decomposed graph
# with `fusionlab.build` (reshape and transpose to heads, MatMul, Mul, Softmax, MatMul, back) and the one-node MHA
# graph, check they agree, and time them interleaved, one thread, 4 heads of 64.
#
# **Predict**: at the lengths timed below that §2's table covers (the next cell prints both lists), its ratio
# column gives the traffic the tiled kernel saves. Will the fused kernel be that much faster? Where might it lose?

# %%
B, H, D = 1, 4, 64
feeds_small = {n: rng.standard_normal((B, 32, H * D)).astype(np.float32) for n in "qkv"}
y_dec = runtime.run(R.attention_model(B, 32, H, D), feeds_small)["y"]
y_mha = runtime.session(R.mha_model(B, 32, H, D), "all", 1).run(None, feeds_small)[0]
print("MultiHeadAttention vs decomposed graph within fp32 tolerance:", np.allclose(y_mha, y_dec, rtol=1e-4, atol=1e-5))
timed = (16, 128, 512, 1024, 2048)
print(f"lengths timed below: {', '.join(map(str, timed))}; of them in §2's table: "
      f"{', '.join(str(n) for n in timed if n in seqs)}")

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'seq':>5} {'decomposed':>11} {'MHA':>9} {'no flash':>9}   {'MHA / decomposed':>20}   "
      f"{'no flash / decomposed':>21}")
mha_runs = {}
for seq in timed:
    feeds = {n: rng.standard_normal((B, seq, H * D)).astype(np.float32) for n in "qkv"}
    dec = runtime.session(R.attention_model(B, seq, H, D), "all", 1)
    mha = runtime.session(R.mha_model(B, seq, H, D), "all", 1)
    os.environ["ORT_DISABLE_FLASH_ATTENTION"] = "1"
    mha_plain = runtime.session(R.mha_model(B, seq, H, D), "all", 1)
    del os.environ["ORT_DISABLE_FLASH_ATTENTION"]
    t = timing.interleaved({"decomposed": lambda: dec.run(None, feeds), "MHA": lambda: mha.run(None, feeds),
                            "no flash": lambda: mha_plain.run(None, feeds)}, min_time=0.6 if seq <= 512 else 1.5)
    pair = lambda a, b: timing.Comparison.from_samples(t[a], t[b], label_a=a, label_b=b)  # noqa: E731
    mha_runs[seq] = {"mha": pair("decomposed", "MHA"), "plain": pair("decomposed", "no flash"),
                     "flash": timing.Comparison.from_samples(t["no flash"], t["MHA"], label_a="no flash",
                                                             label_b="flash")}
    c, p = mha_runs[seq]["mha"], mha_runs[seq]["plain"]
    print(f"{seq:>5} {timing.format_seconds(c.a.median):>11} {timing.format_seconds(c.b.median):>9} "
          f"{timing.format_seconds(p.b.median):>9}   {c.speedup:>7.2f}x ({c.ci_low:.2f}-{c.ci_high:.2f})   "
          f"{p.speedup:>8.2f}x ({p.ci_low:.2f}-{p.ci_high:.2f})")

# %%
# NBVAL_IGNORE_OUTPUT
def by_verdict(key: str) -> str:
    """'B faster at 16, 128; no clear difference at 512' from the comparisons of one column."""
    groups: dict[str, list[str]] = {}
    for seq, runs in mha_runs.items():
        c = runs[key]
        groups.setdefault(c.verdict(brief=True), []).append(f"{seq} ({c.speedup:.2f}×, {c.ci_low:.2f}–{c.ci_high:.2f})")
    return "; ".join(f"{v} at N = {', '.join(seqs)}" for v, seqs in groups.items())


display(Markdown(
    f"**What this run shows** (ratios are time of the first over time of the second, 95% CI in brackets). "
    f"Fused MHA against the decomposed graph: {by_verdict('mha')}. With the flash path off, MHA against the "
    f"decomposed graph: {by_verdict('plain')}. The flash path against the same kernel without it: "
    f"{by_verdict('flash')}."))

# %%
# NBVAL_IGNORE_OUTPUT
scores_1024 = 1024 * 1024 * 4
l3 = calibrate.cache_sizes_kb()["l3"] * 1024
model_ratios = {a.seq: a.unfused / a.flash for a in ab}
paired = [seq for seq in mha_runs if seq in model_ratios]  # lengths both timed and in the traffic table
display(Markdown(
    f"Read these with the bytes model in mind. For one head of d = 64 the two MatMuls do 4·N²·d FLOPs while the "
    f"softmax and scale move 4 bytes per score several times: at N = 1024 the score matrix of one head is "
    f"{scores_1024 / 2**20:.0f} MiB, and the {H} heads' {H * scores_1024 / 2**20:.0f} MiB "
    + (f"fit in this machine's {l3 / 2**20:.0f} MiB L3, so the \"memory traffic\" the fused kernel saves is mostly "
       f"cache traffic, and the MatMuls (the same in both) dominate. " if H * scores_1024 <= l3 else
       f"exceed this machine's {l3 / 2**20:.0f} MiB L3. ")
    + f"At N = {timed[0]} the decomposed graph runs "
    f"{ort_count.kernel_count(R.attention_model(B, timed[0], H, D), 'all')} tiny "
    f"kernels at level ALL, and what the fused kernel saves there is their per-kernel cost. At the lengths the "
    f"traffic model covers (§2's table) the fused kernel measured "
    + "; ".join(f"N = {seq}: {mha_runs[seq]['mha'].speedup:.2f}× ({mha_runs[seq]['mha'].ci_low:.2f}–"
                f"{mha_runs[seq]['mha'].ci_high:.2f}) against the model's {model_ratios[seq]:.1f}×" for seq in paired)
    + (", each far below it" if all(mha_runs[seq]["mha"].ci_high < 0.5 * model_ratios[seq] for seq in paired)
       else ", below it" if all(mha_runs[seq]["mha"].ci_high < model_ratios[seq] for seq in paired) else "")
    + f": that model assumes every intermediate goes to DRAM. The third comparison "
    f"separates the two things a fused kernel does: the no-flash MHA still does all heads in one kernel, so what "
    f"the flash path adds over it is the tiling. The benchmark (`benchmarks/bench_reductions.py`) repeats the "
    f"first comparison with longer runs and records it in `benchmarks/results/reductions.md`."))

# %% [markdown]
# ## 4. The same kernel on an Ascend AI core (modelled)
#
# CANN ships attention as fused operators (`cann_facts.md` §8.B, from the torch_npu and op-plugin
# documentation): `FlashAttentionScore` (`npu_fusion_attention`, for training on the Atlas A2/A3 series,
# not the 310P; layouts BSH, SBH, BSND and BNSD, with `head_num`; it also returns the softmax max and sum for
# the backward pass), and for inference `PromptFlashAttention` (prefill; on the 310P cards fp16 only, with
# further restrictions) and `FusedInferAttentionScore` (Atlas A2/A3). The seed names none of them.
#
# On an AI core the tile is decided by the on-chip buffers. Q·Kᵀ runs on the cube unit, whose operands come from L1
# (MTE1 moves L1 → L0A/L0B, `cann_facts.md` §3.1); the softmax runs on the vector unit, in the Unified Buffer. On
# the 310P3 (300I Pro and Duo) both units sit in one AI core: 8 AI cores of combined cube and vector units, plus 7
# standalone vector cores (`cann_facts.md` §3.3). How the 910's cores are laid out is not in our references
# (unverified). On the 910B the units are separate cores: the 910B4 has 20 cube cores (AIC), each with its L1, and
# 40 vector cores (AIV), each with its own UB (`cann_facts.md` §3.3); a tile of scores leaves the cube's L0C through
# the FixPipe (L0C → GM or L1 on A2, `cann_facts.md` §3.1) and a vector core reads it from global memory into its UB
# (traffic the chip's 192 MB L2, `cann_facts.md` §3.3, can keep off HBM). The model below applies one budget to
# every chip, the cube's tiles in one L1 and the softmax's in one UB, and does not count that hand-over. A square
# tile of b queries by b keys (multiples of 16, the cube's fractal size) needs in L1 the fp16 Q tile and
# double-buffered K and V tiles, and in UB the fp32 scores, the fp16 probabilities, the fp32 output accumulator and
# the running max and sum. `R.ascend_flash_tile` takes the largest b that fits the L1 and UB sizes of
# `data/devices.json`, then predicts one head's traffic and time with the roofline (bytes / bandwidth against FLOPs
# / fp16 peak) for one whole chip: the 300I Duo is two 310P3 chips, and one head runs on one of them, at half the
# card's bandwidth. **These are predictions of a model from published specifications, not measurements**; a real
# kernel also splits heads over cores and pipelines the cube and vector units.

# %%
seq_a, d_a = 4096, 128
print(f"one head, N = {seq_a}, d = {d_a}, fp16 (modelled)")
rows = []
for name in devices.load_devices():
    dev = devices.get(name)
    t = R.ascend_flash_tile(name, seq_a, d_a)
    rows.append([t.device, f"{dev.ub_kb:g}", f"{dev.l1_kb:g}", str(t.block_q), f"{t.l1_bytes / 1024:.0f} K",
                 f"{t.ub_bytes / 1024:.0f} K", f"{t.hbm_bytes / 2**20:.1f}", f"{t.unfused_bytes / 2**20:.1f}",
                 f"{t.time_us:.0f} µs", f"{t.unfused_time_us:.0f} µs"])
print("\n".join(text_table(["device", "UB KiB", "L1 KiB", "tile", "L1 used", "UB used", "HBM MiB tiled",
                            "HBM MiB unfused", "time tiled", "time unfused"], rows)))

# %%
tiles_a = {name: R.ascend_flash_tile(name, seq_a, d_a) for name in devices.load_devices()}
pro, a2 = tiles_a["Atlas 300I Pro"], tiles_a["Atlas 800I A2 (Ascend 910B)"]
dev_a2 = devices.get(a2.device)
flops_a = 4 * seq_a * seq_a * d_a
bound = {n: ("memory" if t.hbm_bytes / devices.get(n).chip_bandwidth > flops_a / devices.get(n).chip_peak_flops("float16")
             else "compute") for n, t in tiles_a.items()}
gains = [t.unfused_bytes / t.hbm_bytes for t in tiles_a.values()]
kv = 2 * seq_a * d_a * 2  # one head's K and V, fp16
once = 4 * seq_a * d_a * 2  # Q, K, V read and O written once
L2_910B_MB = 192  # cann_facts.md §3.3 (catlass arch.hpp L2CacheByte, Ascend910B1.ini l2_size)
all_memory = all(b == "memory" for b in bound.values())
display(Markdown(
    f"The 910B's smaller UB ({dev_a2.ub_kb:g} KiB against {devices.get(pro.device).ub_kb:g} KiB on the 310P3) "
    f"forces a smaller tile ({a2.block_q} against {pro.block_q}), so K and V are re-read more often "
    f"({a2.hbm_bytes / 2**20:.0f} against {pro.hbm_bytes / 2**20:.0f} MiB); its higher bandwidth "
    f"({dev_a2.mem_bandwidth_gbs:g} GB/s) more than makes up for it. At this length the model finds "
    + ("every preset memory-bound both ways" if all_memory else
       "these presets memory-bound: " + ", ".join(n for n, b in bound.items() if b == "memory"))
    + f" (the cube would finish the {flops_a / 1e9:.1f} GFLOP of one head sooner than the bytes arrive), so the "
    f"predicted gain is the bytes ratio, {min(gains):.1f}-{max(gains):.1f}×: traffic, not the launches saved, is "
    f"what FlashAttention buys. The Duo's row is the 300I Pro's within "
    f"{abs(tiles_a['Atlas 300I Duo'].time_us / pro.time_us - 1):.1%}: one head uses one of its two chips.\n\n"
    f"The model leaves out two things on the 910B, and they pull in opposite directions. One head's K and V are {kv / 2**20:.0f} MiB, "
    f"against an L2 of {L2_910B_MB} MB: the re-reads of K and V could be served from L2, so "
    f"{a2.hbm_bytes / 2**20:.0f} MiB is an upper bound on HBM traffic, and {once / 2**20:.0f} MiB (each of Q, K, V "
    f"read once, O written once) the lower one. And the score tiles' trips from the cube cores to the vector "
    f"cores through global memory are not counted at all."))

# %% [markdown]
# ## Summary
#
# * Attention's N × N scores grow with the square of the sequence; exported unfused they go to memory six times.
#   FlashAttention, notebook 09's online softmax carrying an output accumulator, never writes them: Q and O move
#   once, K and V once per query tile.
# * onnxruntime's fused `MultiHeadAttention` is timed here against the decomposed graph and read against that bytes
#   model, which sends every score to DRAM: on a CPU, scores that fit in the cache and MatMuls that are the same in
#   both graphs stand between the modelled gain and the measured one.
# * On an Ascend AI core the largest tile whose buffers fit L1 and the Unified Buffer sets how often K and V are
#   re-read; CANN ships the kernel as `FlashAttentionScore` and its inference forms, and its gain here is
#   modelled, not measured.

# %% [markdown]
# ## Exercises
#
# The exercises check themselves: write your answer in the cell under each task, run it, then run the `check` cell.
# `check` grades it at once on hidden cases and prints PASS with what it checked, or FAIL with a hint naming the
# first case your answer gets wrong. The notebook is stored unanswered; a reference answer is in the repository's
# `solutions/` folder, outside the notebooks (try first).
#
# **Exercise 1: the bytes of attention, unfused and tiled.** Write `attention_traffic(seq, head_dim, item, block) ->
# (unfused, tiled)`: the bytes one head moves to and from memory as §2's model counts them, for elements of `item`
# bytes (4 for fp32, 2 for fp16); unfused, the MatMul, Mul, Softmax, MatMul graph of §1, and tiled, FlashAttention
# with query tiles of `block` rows. The checker compares both numbers exactly with `R.attention_bytes` on hidden
# shapes, passing you the tile that model chooses; they include a sequence the tiles do not divide, a sequence
# that fits in one tile, fp16, and a smaller on-chip budget.

# %%
def attention_traffic(seq, head_dim, item, block):
    """(unfused, tiled): the bytes one attention head moves to and from memory."""
    ...  # your code here


# %%
exercises.attnbytes.check(attention_traffic)

# %% [markdown]
# **Exercise 2: the largest tile an AI core holds.** Write `flash_block(ub_kb, l1_kb, head_dim) -> int`: the
# largest square tile b (b queries by b keys, a multiple of 16) whose buffers fit both a core's L1 and its UB (in
# KiB, as §4's table prints them). The buffers are §4's: in L1 the fp16 Q tile and double-buffered fp16 K and V
# tiles (b × d each); in UB the fp32 scores and the fp16 probabilities (b × b), the fp32 output accumulator
# (b × d), and an fp32 running max and sum per query row. Do not call `R.flash_block`, the search
# `R.ascend_flash_tile` makes for §4's table: the checker compares your tile with it, on the presets' cores at
# head sizes 64 to 256 and on hypothetical cores where L1, or the running max and sum, decide.

# %%
def flash_block(ub_kb, l1_kb, head_dim):
    """The largest multiple of 16 whose L1 and UB buffers fit the core."""
    ...  # your code here


# %%
exercises.flashtile.check(flash_block)
