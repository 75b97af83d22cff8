# %% [markdown]
# # 09 · Reductions: softmax and LayerNorm fused through their row statistics
#
# **What you will be able to do**
#
# 1. count what an unfused Softmax and an unfused LayerNorm read and write, node by node, against one fused kernel;
# 2. write the **one-pass** forms that make the fusion possible, the *online softmax* and *Welford's* mean and
#    variance, and say why E[x²] − E[x]² is not good enough;
# 3. say when a fused kernel may still pass over a row more than once (while the row sits in the cache), and when
#    it needs the one-pass form (attention's long rows, notebook 10);
# 4. time generated fused softmax and LayerNorm kernels against the limit: their GB/s beside this machine's
#    streaming bandwidth and onnxruntime's own kernels.
#
# Notebook 06's partitioner follows TVM Relay's FuseOps rule, under which a reduction may only *end* a
# group: a decomposed LayerNorm took three or more kernels there, and Softmax stayed one opaque op. Here
# we fuse through the reductions, the way XLA, Inductor, Triton and CANN do. (TVM's newer Relax pipeline
# fuses a `mean` with its elementwise consumers, but not by a rule for reductions: the legalised `mean`, a sum
# followed by a division in one function, is labelled like a Conv, an anchor that takes in the elementwise ops
# after it; a plain `ReduceSum` still only ends a group, as in Relay. Notebook 06 §1 has the details.)
# Every section follows the same order: bytes first, the unfused loop, the fused loop checked, then
# timed against the limit. Before each measurement you are asked to predict it.

# %%
import inspect

import matplotlib.pyplot as plt
import numpy as np
from onnx import numpy_helper

from fusionlab import exercises, timing
from fusionlab.cost import calibrate
from fusionlab.lessons import reductions as R
from fusionlab.text import text_table
from fusionlab.verification import runtime
from IPython.display import Markdown, display

rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. Softmax: count the bytes first
#
# An exporter writes a numerically safe softmax over the last axis as five ops: subtract the row max
# (so `exp` cannot overflow), exponentiate, divide by the row sum. We take an input of 8192 rows of
# 2048 float32 values, 64 MiB, larger than this machine's last-level cache (the cell below prints both), so
# every pass really goes to memory.
#
# **Predict** before running the next cell: each of the five ops reads its inputs from memory and
# writes its output. How many times the input's size does the whole graph move? And one fused kernel
# that reads each row once and writes each result once?

# %%
M, N = 8192, 2048
caches = calibrate.cache_sizes_kb()
print(f"x: {M} x {N} fp32 = {M * N * 4 / 2**20:.0f} MiB, {M * N * 4 / (caches['l3'] * 1024):.1f}x this machine's "
      f"{caches['l3'] / 1024:.0f} MiB last-level cache")
print(f"one row: {N * 4 / 1024:.0f} KiB, against its {caches['l1d']} KiB L1 cache")
sm_traffic = R.traffic(R.softmax_model(M, N))
print(sm_traffic.table())

# %% [markdown]
# Reads of 5·M·N + 2·M elements and writes of 3·M·N + 2·M, against 2·M·N for a kernel that reads `x`
# once and writes `y` once: the same count as Triton's tutorial, so a memory-bound softmax has up
# to **4×** to gain from fusion. (The two reductions also read the tiny `axes` tensor.)
#
# ## 2. The unfused loop, and one pass instead of three
#
# Unfused, the row max must be known before anything is exponentiated, and the sum before anything is
# divided: three passes over each row. The **online softmax** (Milakov & Gimelshein, 2018) finds the
# max and the sum in *one* pass: it keeps a running max `m` and a running sum of `exp(x − m)`; when a
# new block raises the max, the sum so far is rescaled by `exp(m_old − m_new)`. Here it is over blocks
# of columns, with numpy doing the same work for every row at once:

# %%
print(inspect.getsource(R.online_softmax))

# %% [markdown]
# It must give the same answer as the three-pass softmax, for any block size, and survive logits large
# enough that a naive `exp(x)` would overflow float32:

# %%
x_small = (rng.standard_normal((64, 1000)) * 3).astype(np.float32)
reference = R.softmax_reference(x_small)
for block in (1, 16, 64, 1000):
    err = np.abs(R.online_softmax(x_small, block) - reference).max()
    print(f"block {block:>4}: max |online - three-pass| below 1e-6: {err < 1e-6}")
big = x_small + np.float32(100.0)  # exp(100) = inf in float32
with np.errstate(over="ignore"):  # the overflow is the point of the naive line: silence only its warning
    naive_finite = np.isfinite(np.exp(big)).all()
print("logits around 100: finite:", np.isfinite(R.online_softmax(big, 16)).all(), "| naive exp finite:", naive_finite)

# %% [markdown]
# ## 3. A generated fused kernel
#
# On a CPU the row (2048 floats, 8 KiB) fits the L1 cache (§1 printed its size). So a fused kernel can afford three
# passes over a row as long as only the *first* goes to memory: find the max while the row streams in,
# then exponentiate, sum and scale it in the cache, and write each result once. (The online form
# matters where a row does *not* fit on chip: attention, in notebook 10.) `R.softmax_kernel()` writes
# the source of that loop, as `fusionlab.elementwise` does for elementwise chains, and numba compiles
# it for one thread. Two details decide its speed: the row max is split over 8 independent
# accumulators (one AVX2 register) so that it vectorises, and `exp` is a branch-free polynomial inlined
# into the loop (its error is measured in the module docstring and bounded by the tests).

# %%
softmax = R.softmax_kernel()
print(softmax.source)

# %% [markdown]
# Checked against onnxruntime's `Softmax` (optimisations off) at the workbook's fp32 tolerances, and
# against the five-op graph:

# %%
x = rng.standard_normal((M, N)).astype(np.float32)
y_fused = softmax(x)
ort_softmax = runtime.session(R.softmax_model(M, N, decomposed=False), "disable", 1)
ort_five = runtime.session(R.softmax_model(M, N), "disable", 1)
y_ort = ort_softmax.run(["y"], {"x": x})[0]
print("fused vs onnxruntime Softmax:", np.allclose(y_fused, y_ort, rtol=1e-4, atol=1e-5))
print("fused vs the five-op graph:  ", np.allclose(y_fused, ort_five.run(["y"], {"x": x})[0], rtol=1e-4, atol=1e-5))

# %% [markdown]
# ## 4. Timed against the limit
#
# The limit is this machine's streaming bandwidth, measured by `fusionlab.cost.calibrate` with one thread on
# arrays far larger than the caches (the better of a copy and an add, counted STREAM-style). A fused
# kernel's *effective bandwidth* is the bytes it must move (2·M·N·4: read `x`, write `y`) over its time.
# This machine is shared, so the bandwidth moves from minute to minute; `R.stream_fraction` therefore
# times the same copy and add *interleaved with the kernel*, and reports the kernel's GB/s as a fraction
# of the bandwidth measured in the same rounds.
#
# **Predict**: what fraction of the streaming bandwidth will the fused kernel reach? How much faster
# than the five-op graph, given the 4× in bytes? And against onnxruntime's hand-written `Softmax`?

# %%
# NBVAL_IGNORE_OUTPUT
cal = calibrate.calibrate()
limit = cal.stream_gbs
moved = 2 * x.nbytes
out = np.empty_like(x)
runs = {
    "five-op graph (onnxruntime)": timing.compare(lambda: ort_five.run(["y"], {"x": x}), lambda: softmax(x, out=out),
                                                  label_a="five ops", label_b="fused", min_time=1.5),
    "onnxruntime Softmax": timing.compare(lambda: ort_softmax.run(["y"], {"x": x}), lambda: softmax(x, out=out),
                                          label_a="ORT Softmax", label_b="fused", min_time=1.5),
}
print(f"streaming bandwidth, one thread: {limit:.1f} GB/s (copy {cal.copy_gbs:.1f}, add {cal.add_gbs:.1f})")
fractions = {}
for name, fn in (("fused kernel", lambda: softmax(x, out=out)), ("onnxruntime Softmax", lambda: ort_softmax.run(["y"], {"x": x}))):
    f = fractions["softmax", name] = R.stream_fraction(fn, moved)
    print(f"{name:<20} {f.kernel_gbs:5.1f} GB/s = {f.fraction:.0%} of streaming, timed in the same rounds "
          f"({f.stream_gbs:.1f} GB/s then)")


def bandwidth_table(runs: dict) -> str:
    """A row per baseline: its median and GB/s, the fused kernel's, the paired speed-up of the fused kernel."""
    rows = []
    for name, c in runs.items():
        gbs_a, gbs_b = moved / c.a.median / 1e9, moved / c.b.median / 1e9
        rows.append([name, timing.format_seconds(c.a.median), f"{gbs_a:.1f} ({gbs_a / limit:.0%})",
                     timing.format_seconds(c.b.median), f"{gbs_b:.1f} ({gbs_b / limit:.0%})",
                     f"{c.speedup:.2f}x", f"{c.ci_low:.2f}-{c.ci_high:.2f}"])
    return (f"GB/s = bytes moved / median time (in brackets: share of the {limit:.1f} GB/s streaming bandwidth)\n"
            + "\n".join(text_table(["baseline", "median", "GB/s", "fused", "GB/s", "speed-up", "95% CI"], rows)))


print(bandwidth_table(runs))

# %%
fig, ax = plt.subplots(figsize=(6.5, 3.2))
names = ["five-op graph", "ORT Softmax", "fused kernel"]
vals = [moved / runs["five-op graph (onnxruntime)"].a.median / 1e9, moved / runs["onnxruntime Softmax"].a.median / 1e9,
        moved / runs["onnxruntime Softmax"].b.median / 1e9]
ax.barh(names, vals, color=["#bbb", "#8ab", "#2a7"])
ax.axvline(limit, color="k", ls="--", label=f"streaming bandwidth {limit:.0f} GB/s")
ax.axvline(0.7 * limit, color="k", ls=":", label="70% of it")
ax.set_xlabel("effective GB/s (2·M·N·4 bytes / time)")
ax.set_title(f"Softmax {M}x{N} fp32, one thread")
ax.legend(loc="lower right", fontsize=8)
fig.tight_layout()

# %% [markdown]
# How to read it. The five-op graph pays for its extra traffic: its two full-size intermediates (the
# shifted logits and their exponentials, 64 MiB each) are written and read back, and the output is
# written by a separate `Div`; so the fused kernel should beat it, by the full 4× of the bytes ratio only
# if the kernel itself runs at the bandwidth limit (the table says by how much it did). Against onnxruntime's `Softmax`, which is already one
# kernel, the comparison is kernel against kernel: both move the same bytes, so what separates them
# is how close each gets to the limit. Our kernel's three passes over a cached row cost arithmetic
# (the exp polynomial is about 20 operations per element), and on one shared core that can make it
# **compute-bound** below the bandwidth line. Where onnxruntime's kernel is faster, it is not because it
# moves fewer bytes (it moves the same): the difference is in how each computes (MLAS's softmax computes its
# exponentials in hand-written AVX2 / AVX-512 kernels), and this notebook does not count instructions. `benchmarks/bench_reductions.py` records the fraction of the bandwidth reached
# against the target it sets (`benchmarks/results/reductions.md`), and says so when it misses.
#
# ## 5. LayerNorm: the same story with two reductions
#
# The exported LayerNorm is nine ops: mean, subtract, square, mean again, add ε, square root, divide,
# scale, shift. **Predict** its traffic against one fused kernel before running the cell.

# %%
ln_traffic = R.traffic(R.layernorm_model(M, N))
print(ln_traffic.table())

# %% [markdown]
# Six full passes against one: a 6× gap. To fuse it, mean and variance should come from one pass over
# the row. There are two one-pass forms. **Two-moment** keeps Σx and Σx² and takes E[x²] − E[x]²;
# **Welford** (here Chan's blockwise form) keeps the mean and the sum of squared deviations and updates
# both per block. They agree on centred data, and part ways when the mean is large against the spread:
# E[x²] and E[x]² are then two huge, nearly equal numbers and their difference loses most of its digits.

# %%
print(inspect.getsource(R.welford))
gamma = np.ones(1000, np.float32)
beta = np.zeros(1000, np.float32)
for offset in (0.0, 1000.0):
    xo = x_small + np.float32(offset)
    exact = R.layernorm_reference(xo, gamma, beta)
    err_w = np.abs(R.layernorm_loop(xo, gamma, beta, moments=R.welford) - exact).max()
    err_t = np.abs(R.layernorm_loop(xo, gamma, beta, moments=R.two_moment) - exact).max()
    print(f"rows offset by {offset:>6}, within 1e-4: Welford {err_w < 1e-4}, two-moment {err_t < 1e-4}"
          f" (two-moment error {'>' if err_t > 100 * err_w else '<='} 100x Welford's)")

# %% [markdown]
# On this CPU, as for softmax, the row sits in L1 after its first pass, so the fused kernel can compute
# the variance *exactly* around the mean (a second, cached pass) instead of relying on either formula;
# one read of the row from memory, one write. Welford's merge is what a kernel uses when the row is
# split across tiles that never coexist on chip (a long row on an Ascend core's 192 KiB UB, say).

# %%
layernorm = R.layernorm_kernel()
print(layernorm.source)
ln_model = R.layernorm_model(M, N, decomposed=False)
ln_params = {t.name: numpy_helper.to_array(t) for t in ln_model.graph.initializer}
ort_ln = runtime.session(ln_model, "disable", 1)
ort_nine = runtime.session(R.layernorm_model(M, N), "disable", 1)
x_ln = (rng.standard_normal((M, N)) + 3.0).astype(np.float32)
y_ln = layernorm(x_ln, ln_params["gamma"], ln_params["beta"])
print("fused vs onnxruntime LayerNormalization:", np.allclose(y_ln, ort_ln.run(["y"], {"x": x_ln})[0], rtol=1e-4, atol=1e-5))
print("fused vs the nine-op graph:             ", np.allclose(y_ln, ort_nine.run(["y"], {"x": x_ln})[0], rtol=1e-4, atol=1e-5))

# %% [markdown]
# **Predict**: LayerNorm does no transcendental per element, only adds and multiplies. Closer to the
# bandwidth line than the softmax, or not?

# %%
# NBVAL_IGNORE_OUTPUT
ln_out = np.empty_like(x_ln)
g, b = ln_params["gamma"], ln_params["beta"]
ln_runs = {
    "nine-op graph (onnxruntime)": timing.compare(lambda: ort_nine.run(["y"], {"x": x_ln}), lambda: layernorm(x_ln, g, b, out=ln_out),
                                                  label_a="nine ops", label_b="fused", min_time=1.5),
    "onnxruntime LayerNormalization": timing.compare(lambda: ort_ln.run(["y"], {"x": x_ln}), lambda: layernorm(x_ln, g, b, out=ln_out),
                                                     label_a="ORT LayerNorm", label_b="fused", min_time=1.5),
}
for name, fn in (("fused kernel", lambda: layernorm(x_ln, g, b, out=ln_out)),
                 ("onnxruntime LayerNorm", lambda: ort_ln.run(["y"], {"x": x_ln}))):
    f = fractions["layernorm", name] = R.stream_fraction(fn, moved)
    print(f"{name:<22} {f.kernel_gbs:5.1f} GB/s = {f.fraction:.0%} of streaming, timed in the same rounds "
          f"({f.stream_gbs:.1f} GB/s then)")
print(bandwidth_table(ln_runs))
# the prediction's question, asked directly: both kernels move the same 2·M·N·4 bytes, so the ratio of their
# times, interleaved in the same rounds, is the ratio of their GB/s
ln_vs_sm = {
    "fused": timing.compare(lambda: softmax(x, out=out), lambda: layernorm(x_ln, g, b, out=ln_out),
                            label_a="fused softmax", label_b="fused LayerNorm", min_time=1.0),
    "onnxruntime": timing.compare(lambda: ort_softmax.run(["y"], {"x": x}), lambda: ort_ln.run(["y"], {"x": x_ln}),
                                  label_a="ORT Softmax", label_b="ORT LayerNorm", min_time=1.0),
}
print(timing.comparisons_table(ln_vs_sm, header=("", "softmax", "LayerNorm", "softmax/LN", "95% CI", "verdict")))

# %%
# NBVAL_IGNORE_OUTPUT
def closer(c) -> str:
    word = timing.ratio_verdict(c.ci_low, c.ci_high)
    what = {"faster": "closer to the bandwidth line than", "slower": "further from the bandwidth line than",
            "no clear difference": "not clearly closer to the bandwidth line than"}[word]
    return f"the {c.label_b} is {what} the {c.label_a} ({c.speedup:.2f}×, {c.ci_low:.2f}–{c.ci_high:.2f}, time of softmax over LayerNorm)"


words = {k: timing.ratio_verdict(c.ci_low, c.ci_high) for k, c in ln_vs_sm.items()}
first = closer(ln_vs_sm["fused"])
text = f"**The answer in this run.** {first[0].upper() + first[1:]}; {closer(ln_vs_sm['onnxruntime'])}. "
if words["fused"] == words["onnxruntime"] == "faster":
    text += ("Both pairs agree with the prediction: without a transcendental per element, each LayerNorm gets "
             "closer to the limit than the softmax of the same implementation.")
elif words["fused"] == "faster":
    text += ("The prediction holds for the two kernels generated here, which differ mainly by the softmax's exp "
             "polynomial, but not for onnxruntime's pair: the absence of a transcendental does not decide it on its "
             "own. How many passes a kernel makes over a row and how each vectorises count as much, and this "
             "notebook does not count instructions.")
else:
    text += ("So the absence of a transcendental does not decide it on its own: how many passes a kernel makes over "
             "a row and how each vectorises count as much, and this notebook does not count instructions.")
display(Markdown(text))

# %% [markdown]
# ## Summary
#
# * Count bytes first: an exported softmax moves 4× what one kernel must, an exported LayerNorm 6×.
# * One-pass forms make the fusion possible where a row does not stay on chip: the online softmax rescales its
#   running sum when the max rises, and Welford's merge keeps the variance that E[x²] − E[x]² loses to cancellation.
# * A generated fused kernel is checked against onnxruntime and judged by its GB/s against the measured bandwidth:
#   the bytes ratio is the ceiling; how each kernel computes (the exp polynomial, vectorisation) decides how close
#   it gets.

# %% [markdown]
# ## Exercises
#
# The exercises check themselves: write your answer in the cell under each task, run it, then run the `check` cell.
# `check` grades it at once on hidden cases and prints PASS with what it checked, or FAIL with a hint naming the
# first case your answer gets wrong. The notebook is stored unanswered; a reference answer is in the repository's
# `solutions/` folder, outside the notebooks (try first).
#
# **Exercise 1: write the online-softmax update, with a weighted sum.** §2's loop keeps a running max and a running
# sum per row; add a third running quantity, the softmax-weighted sum of value rows, `softmax(scores) @ v` (what
# attention computes, notebook 10). Write one block's step as `update(m, l, acc, scores, v) -> (m, l, acc)`, for a
# tile of rows: `m` (rows × 1) is the running max of the scores seen so far, `l` (rows × 1) the running sum of
# `exp(score - m)`, `acc` (rows × d) the running sum of `exp(score - m) · v`; `scores` (rows × block) are this
# block's scores (a masked score is `-inf`), and `v` (block × d) the block's value rows. The checker starts every
# row at `m = -inf`, `l = 0`, `acc = 0`, calls your `update` once per block and compares `acc / l` with a
# float64 `softmax(scores) @ v`, at float32 tolerances. Its cases include a single block, a block size that does not
# divide the number of keys, a max that rises block by block, blocks masked to `-inf` (the first one too: what is
# `exp(-inf - (-inf))`?) and logits around `1e4`.

# %%
def update(m, l, acc, scores, v):
    """The running (max, sum, accumulator) after one more key block."""
    ...  # your code here


# %%
exercises.softmax.check(update)

# %% [markdown]
# **Exercise 2: merge two blocks' mean and variance.** Write the step §5's `welford` takes per block as a function,
# `merge(a, b) -> (count, mean, m2)`: `a` and `b` hold two blocks of the same rows, each as `(count, mean, m2)`
# with `count` an int and `mean`, `m2` float32 arrays of one value per row (`m2`: the sum of squared deviations
# from the block's mean); return the statistics of both blocks together. The checker merges hidden blocks left to
# right from count 0, or as a tree, and compares the mean and `m2 / count` with float64 `np.mean` and `np.var` of
# the rows. Its cases include unequal blocks, a block of one value, blocks whose means differ, and rows around
# 1e4, where E[x²] − E[x]² in float32 loses the variance.

# %%
def merge(a, b):
    """(count, mean, m2) of blocks a and b together."""
    ...  # your code here


# %%
exercises.moments.check(merge)
