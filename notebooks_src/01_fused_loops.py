# %% [markdown]
# # 01 · Fused code generation: one loop instead of one pass per op
#
# **What you will be able to do**
#
# 1. count the bytes an unfused chain moves (one pass over memory per op) against one fused loop (one pass in all),
#    and say what that does to the time on this machine;
# 2. generate such a loop from a chain of ONNX elementwise nodes with `fusionlab.lessons.codegen`, and check it
#    against onnxruntime;
# 3. judge a fused kernel honestly: its speed-up against onnxruntime's unfused kernels beside the bytes ratio, and
#    its GB/s beside the DRAM bandwidth this machine can stream, on tensors larger than the cache;
# 4. say why transcendental ops (`Erf`, `Tanh`, `Exp`) need vectorisable approximations of known error, and when a
#    chain heavy in them stops being memory-bound.
#
# This is the course's foundation: every later notebook counts bytes and launches the way this one does. Here the
# saving is *real*, a generated kernel that makes one pass over memory, measured (notebook 07 later puts the same
# counts into a cost model for whole networks and devices). Everything here runs on this machine's CPU.

# %%
import re

import numpy as np

from fusionlab import exercises, seed_claims, timing
from fusionlab.cost import calibrate, devices
from fusionlab.lessons import codegen
from fusionlab.text import wrap
from fusionlab.verification import runtime
from IPython.display import Markdown, display


# %% [markdown]
# ## 1. The intuition: an unfused loop against a fused loop
#
# Take four cheap elementwise ops, `y = relu(2x + 1) · 0.5`, on a float32 tensor of 2²⁵ values (128 MiB), far
# larger than any cache. Unfused, each op is its own loop: it reads a full tensor and writes a full tensor, and
# the next op reads it back. Fused, one loop reads `x`, keeps every intermediate in a register, and writes `y`.
# `codegen.loop_vs_loop` builds both from the same generator (the same compiler, the same arithmetic), so the only
# difference between them is the number of passes over memory.
#
# **Predict before you run the next cell:** how many MiB does the unfused chain move, and how many the fused loop?

# %%
N = 2**25
demo = codegen.loop_vs_loop(n=N, measure=False)
print(demo.bytes_table())

# %%
print(seed_claims.claim("s1-fusion-saves-traffic-and-launches").summary())

# %% [markdown]
# Four passes against one: 1024 MiB against 256 MiB, a ratio of 4. The two loops, side by side (the generator's
# source; numba compiles each):

# %%
print("--- one loop per op ---")
print(demo.unfused_source)
print("--- one fused loop ---")
print(demo.fused_source)

# %% [markdown]
# If the loops are memory-bound, time follows bytes: the fused loop should be about 4× faster, and each loop
# should stream close to what this machine's memory can deliver. The DRAM streaming bandwidth comes from
# `fusionlab.cost.calibrate` (the better of a copy and an add over arrays at least four times the last-level cache,
# the figure every notebook uses). The timings vary from run to run.
#
# Two conventions hold for every figure in this notebook. The bandwidth is **one core's**: `calibrate` streams
# on one thread, and so do both loops (and onnxruntime below, pinned to one intra-op thread); several cores
# together draw more from the same memory. The bytes are **logical**: what the ops must read and write, counted
# once per tensor pass as STREAM counts them, not what the memory controller sees (a write to a line not in the
# cache is first read, prefetchers fetch ahead); the counts compare two variants under one rule, they are not a
# DRAM traffic measurement.
#
# Read the last two lines of the timing: if the speed-up is close to the bytes ratio and both loops stream near
# the DRAM bandwidth, the chain is memory-bound and fusion's saving *is* the bytes it does not move. The speed-up
# is the bytes ratio times the ratio of the two loops' streaming rates, so a speed-up beyond the bytes ratio
# means the unfused loops moved their bytes more slowly than the fused loop did. The paragraph under the
# timing says which this run shows.

# %%
# NBVAL_IGNORE_OUTPUT
me = devices.this_machine()
cal = calibrate.calibrate(quick=True)
print(f"{N * 4 / 2**20:.0f} MiB per tensor; last-level cache {cal.l3_kb / 1024:.0f} MiB: "
      f"{'larger' if N * 4 > cal.l3_kb * 1024 else 'NOT larger'} than the cache")
demo = codegen.loop_vs_loop(n=N, min_time=2.0)
print(demo.comparison.table())
print(demo.gbs(me.mem_bandwidth_gbs))

c = demo.comparison
gbs_unfused, gbs_fused = demo.unfused_bytes / c.a.median / 1e9, demo.fused_bytes / c.b.median / 1e9
if c.ci_low > demo.ratio:
    where = (f"above the bytes ratio of {demo.ratio:.2f}×: its interval {c.ci_low:.2f}–{c.ci_high:.2f}× lies wholly "
             f"above it")
elif c.ci_high < demo.ratio:
    where = (f"below the bytes ratio of {demo.ratio:.2f}×: its interval {c.ci_low:.2f}–{c.ci_high:.2f}× lies wholly "
             f"below it")
else:
    where = f"consistent with the bytes ratio of {demo.ratio:.2f}×: its interval {c.ci_low:.2f}–{c.ci_high:.2f}× holds it"
text = (f"The speed-up, {c.speedup:.2f}×, is {where}. The unfused loops streamed {gbs_unfused:.1f} GB/s, the fused "
        f"loop {gbs_fused:.1f} GB/s ({gbs_fused / me.mem_bandwidth_gbs:.0%} of the one-core streaming bandwidth "
        f"measured above), and {demo.ratio:.2f} × {gbs_fused:.2f} / {gbs_unfused:.2f} = "
        f"{demo.ratio * gbs_fused / gbs_unfused:.2f}: the speed-up, up to the difference between a ratio of medians "
        f"and the median of paired ratios.")
if c.ci_low > demo.ratio or c.ci_high < demo.ratio:
    slower, faster = ("unfused", "fused") if gbs_unfused < gbs_fused else ("fused", "unfused")
    text += (f" The byte count is one logical count for both variants, so it cannot say why the {slower} variant "
             f"streams more slowly than the {faster} one; causes this notebook does not measure include each loop's "
             f"own start (the call, the prefetchers' ramp on a new array) and other work on a shared machine. The "
             f"bytes ratio still sets the scale of the saving.")
else:
    text += " Time followed bytes: the two loops streamed at about the same rate."
display(Markdown(text))

# %% [markdown]
# Everything else in this notebook (and the byte counts of notebooks 03 and 07) is this picture applied to
# bigger chains.
#
# ## 2. Generating the fused loop from ONNX nodes
#
# `codegen.compile_chain` turns a set of ONNX elementwise nodes into the Python source of one loop, compiled with
# numba (single-threaded); `codegen.fuse_elementwise` does it for a chain written as a list of steps. Here is a
# bias–scale–activation chain with a per-channel constant over an NCHW tensor of 8 × 16 × 512 × 512 values
# (128 MiB). The generator merges the H and W dimensions, because every operand treats them alike, and indexes the
# bias by channel only:

# %%
SHAPE = (8, 16, 512, 512)
bias = np.linspace(-0.5, 0.5, 16, dtype=np.float32).reshape(16, 1, 1)
spec = [("Mul", 0.5), ("Add", bias), ("Relu",), ("Sub", 0.1), ("Mul", "x"), ("Clip", -1.0, 1.0)]
kernel = codegen.fuse_elementwise(spec, shape=SHAPE)
print(kernel.source)

# %% [markdown]
# ## 3. Checking it
#
# The fused kernel must compute what the unfused chain computes. The reference is onnxruntime running the same
# chain as an ONNX model with its graph optimisations off (every op its own kernel), within the fp32 tolerances
# used everywhere (rtol 1e-4, atol 1e-5):

# %%
x = np.random.default_rng(0).standard_normal(SHAPE, dtype=np.float32)
chain_sess = runtime.session(codegen.chain_model(spec, SHAPE), "disable", 1)
ort_y = chain_sess.run(["y"], {"x": x})[0]
fused_y = kernel(x)
print("fused vs onnxruntime within fp32 tolerance:", np.allclose(fused_y, ort_y, rtol=1e-4, atol=1e-5))
moved = kernel.bytes_moved()
print(moved)

# %% [markdown]
# The unfused chain reads and writes a full tensor per op (the `Mul` by `x` reads two), 6.5× the fused kernel's
# one read of `x`, one write of `y` and the small bias.
#
# ## 4. Measured against onnxruntime, on tensors larger than the cache
#
# The fair baseline is not per-op numpy (which also allocates a fresh array per op) but onnxruntime's own unfused
# kernels: vectorised C++, one per op. On a memory-bound chain the speed-up should approach the bytes ratio, and
# the fused kernel's effective bandwidth (the bytes it must move ÷ its time) should approach what the machine
# can stream. Where it falls short, something other than memory traffic costs time; where it reads above 100 %, the
# loop streams faster than `calibrate`'s copy/add reference on the same logical bytes: read the percentage as a
# comparison with that reference, not as a fraction of a hardware limit. The benchmark
# `benchmarks/bench_elementwise.py` does the same with 64 MiB tensors and writes `benchmarks/results/elementwise.md`.

# %%
# NBVAL_IGNORE_OUTPUT
out = np.empty_like(x)
cmp = timing.compare(lambda: chain_sess.run(["y"], {"x": x}), lambda: kernel(x, out=out), min_time=2.0,
                     label_a="onnxruntime, unfused", label_b="fused loop")
print(cmp.table())
gbs = moved.after / cmp.b.median / 1e9
print(f"fused kernel: {gbs:.1f} GB/s = {gbs / me.mem_bandwidth_gbs:.0%} of the DRAM streaming bandwidth "
      f"({me.mem_bandwidth_gbs:.1f} GB/s)")
print(f"speed-up {cmp.speedup:.2f}x vs bytes ratio {moved.ratio:.2f}x")
bench_cell = seed_claims.benchmark_cell(
    seed_claims.ROOT / "benchmarks/results/elementwise.md", {"chain": "cheap", "baseline": "onnxruntime (opt off)"},
    "speedup baseline/fused (95% CI)")
bench_ratio = re.search(r"\*\*cheap\*\*: .*?\(([\d.]+)x less traffic\)",
                        (seed_claims.ROOT / "benchmarks/results/elementwise.md").read_text()).group(1)
print(wrap(f"benchmark (last run): {bench_cell} for the benchmark's chain (the same six ops, a second full-size "
           f"input in place of the bias, so a bytes ratio of {bench_ratio}x) on 64 MiB tensors"))

# %% [markdown]
# ## 5. Transcendentals: vectorisable helpers
#
# Fusion removes *memory* traffic, so it pays only while the loop is not busy computing. Transcendental ops
# (`Erf`, `Tanh`, `Exp`) are where a naive generator goes wrong: a call to the scalar C library (`math.erf`) inside
# the loop stops the compiler from vectorising it, and the fused loop then loses to numpy's and onnxruntime's SIMD
# kernels. So for float32 the generator emits small branch-free helpers once, above the loop: for `erf` the
# rational approximation Eigen and XLA use, for `tanh` the coefficients Eigen, XLA and onnxruntime's MLAS share (a
# polynomial over a polynomial, with MLAS's clamp of the argument to ±9, where Eigen and XLA clamp at about ±7.9:
# the coefficients below are those of `MlasTanhConstants` in onnxruntime's `core/mlas/lib/tanh.cpp`), and an `exp` built from range reduction, a polynomial and the float's
# exponent bits. MLAS's own `erf` is a different approximation (`MlasErfConstants` in `core/mlas/lib/erf.cpp`):
# two pieces split at |x| = `0.921875`, a polynomial in x² below and, above, a polynomial passed through `exp`. The loop calls them and stays
# vectorisable. Here is a GELU-like chain:

# %%
gelu_spec = [("Mul", 0.7071), ("Erf",), ("Add", 1.0), ("Mul", "x"), ("Mul", 0.5), ("Tanh",)]
gelu = codegen.fuse_elementwise(gelu_spec, shape=(N,))
print(gelu.source)

# %% [markdown]
# An approximation must be checked like any other rewrite. The module docstring of `fusionlab.lessons.codegen`
# gives each helper's maximum error measured on a dense grid, and the tests assert those bounds. The fused chain
# also stays within the fp32 tolerances against onnxruntime, and infinities and NaN come out as the library
# functions give them:

# %%
xg = np.random.default_rng(1).standard_normal(N, dtype=np.float32)
gelu_ort = runtime.session(codegen.chain_model(gelu_spec, (N,)), "disable", 1)
print("fused vs onnxruntime within fp32 tolerance:",
      np.allclose(gelu(xg), gelu_ort.run(["y"], {"x": xg})[0], rtol=1e-4, atol=1e-5))
print("erf at inf, -inf, nan:", codegen.fuse_elementwise([("Erf",)], shape=(3,))(np.float32([np.inf, -np.inf, np.nan])))
print(gelu.bytes_moved())

# %% [markdown]
# Vectorised is not the same as memory-bound. Each `erf` or `tanh` costs about a dozen multiply-adds and a
# division per element, so this chain does far more arithmetic per byte than the chains above. **Predict:** will
# the fused GELU-like loop reach the DRAM bandwidth, as the cheap chain did? The timing shows where it lands on this
# machine (it varies from run to run); if its GB/s stays well under the streaming bandwidth, the loop is
# compute-bound and the bytes saved are no longer the whole story.

# %%
# NBVAL_IGNORE_OUTPUT
gelu_out = np.empty_like(xg)
cmp_gelu = timing.compare(lambda: gelu_ort.run(["y"], {"x": xg}), lambda: gelu(xg, out=gelu_out),
                          label_a="onnxruntime, unfused", label_b="fused loop", min_time=2.0)
print(cmp_gelu.table())
gelu_gbs = gelu.bytes_moved().after / cmp_gelu.b.median / 1e9
print(f"fused GELU-like chain: {gelu_gbs:.1f} GB/s = {gelu_gbs / me.mem_bandwidth_gbs:.0%} of the DRAM streaming "
      f"bandwidth")
print(f"speed-up over onnxruntime {cmp_gelu.speedup:.2f}x vs bytes ratio {gelu.bytes_moved().ratio:.2f}x")

# %% [markdown]
# ## Summary
#
# - An unfused elementwise chain makes one pass over memory per op, a fused loop one in all: on tensors larger than
#   the cache a cheap chain is memory-bound, and the fused loop's speed-up follows the bytes ratio.
# - `codegen` generates the fused loop from ONNX nodes and checks it against onnxruntime; judge it by its speed-up
#   beside the bytes ratio and its GB/s beside the measured streaming bandwidth.
# - Transcendentals need vectorisable approximations of known error; a chain heavy in them can be compute-bound,
#   and then the bytes ratio overstates what fusion buys.

# %% [markdown]
# ## Exercises
#
# The exercises check themselves: write your answer in the cell under each task, run it, then run the `check` cell.
# `check` grades it at once on hidden cases and prints PASS with what it checked, or FAIL with a hint naming the
# first case your answer gets wrong and the mistake it looks like. The notebook is stored unanswered; reference
# answers are in the repository's `solutions/` folder, outside the notebooks (try first).
#
# **Exercise 1: predict a plan's bytes.** Count, as fusionlab's cost model does (notebook 07 uses it for whole
# networks), the bytes the block below moves through device memory: unfused, one kernel per node, each kernel
# reading every tensor it takes from memory and writing its output; fused, one kernel for the whole block (the
# mixed pass's plan), which reads what comes from outside, writes `y`, and keeps every intermediate on chip.

# %%
print(exercises.traffic.describe())

# %%
answer = {"unfused": ..., "fused": ...}  # your two counts, in bytes

# %%
exercises.traffic.check(answer)

# %% [markdown]
# **Exercise 2: fuse an op the generator has no template for.** `codegen` cannot emit `HardSwish` (MobileNetV3's
# activation), which ONNX defines as `x * max(0, min(1, x / 6 + 1 / 2))`. Write it as a chain of steps the generator
# does support (`codegen.SUPPORTED`), in the form of §2's `spec`: `("Mul", "x")` multiplies by the chain's input.
# `check` generates the fused loop with `codegen.fuse_elementwise` and compares it with onnxruntime running one
# `HardSwish` node, as §3 checked the kernel. The hidden inputs include values beyond the bends at ±3, exactly at
# them, NaN and infinities.

# %%
hard_swish = ...  # your steps: a list like spec in §2

# %%
exercises.hardswish.check(hard_swish)

# %% [markdown]
# **Exercise 3: a tanh helper that survives overflow.** Write `tanh(x)` for a float32 array as §5's helpers are
# written: whole-array `np.exp`, arithmetic and clamps (`np.clip`, `np.where`), no Python `if` on the array, and
# no `np.tanh` or `math.tanh` (`check` refuses them). `check` compares it with onnxruntime's `Tanh` at §3's
# tolerances; the hidden inputs include large arguments of both signs, NaN and infinities.

# %%
def tanh(x):
    raise NotImplementedError  # your code here

# %%
exercises.tanhhelper.check(tanh)
