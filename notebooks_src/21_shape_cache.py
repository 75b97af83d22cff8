# %% [markdown]
# # 21 · A cache of compiled shapes: compile cost, policies and the seed's ×2.1
#
# **What you will be able to do**
#
# - measure with onnxruntime what compiling for one shape costs and gains: build time against run time, a static
#   session against a dynamic one, and the shape knowledge apart from the extra fusion it enables;
# - replay a stream of requests through four caching policies, in compilations and in seconds, and check the
#   replay against a real run;
# - say after how many requests compiling a shape of its own pays, and read the seed's "×2.1" for long sequences
#   against measurements.
#
# Notebook 20 showed why a static-shape compiler compiles per shape, replaced the seed's cache with `ShapeCache`
# (keyed by the shape, bounded), and padded requests to gears exactly. Here we measure what that costs. The
# compiler is again onnxruntime: a session built for one fixed input shape is our "compiled model for one shape".
# The setup re-creates notebook 20's fused BERT-tiny encoder, its dynamic-shape session, its stream of 2000
# requests and its four gears.

# %%
import time

import matplotlib.pyplot as plt
import numpy as np

from fusionlab import exercises, seed_claims, zoo
from fusionlab.lessons import dynamic_shapes
from fusionlab.passes import fuse
from fusionlab.text import text_table, wrap
from fusionlab.timing import Comparison, compare, interleaved
from fusionlab.verification.runtime import make_feeds, session
from IPython.display import Markdown, display

plt.rcParams["figure.dpi"] = 80

# %%
model = zoo.get("bert_tiny")
fused_model = fuse(model, passes=("vertical",)).graph
dynamic_sess = session(fused_model, "all")
names = [o.name for o in dynamic_sess.get_outputs()]
stream, GEARS = dynamic_shapes.request_lengths(2000), dynamic_shapes.gears(512, 4)
print(f"{len(stream)} requests, median {int(np.median(stream))} tokens; gears {GEARS}")

# %% [markdown]
# ## 1. Measured: compiling for one shape with onnxruntime
#
# `dynamic_shapes.static_session(model, {"batch": 1, "sequence": L})` fixes the symbolic input dimensions with
# onnxruntime's `SessionOptions.add_free_dimension_override_by_name`. onnxruntime then optimises the graph
# knowing every shape, and refuses inputs of any other shape, like an `.om` compiled for one gear. Building the
# session (graph optimisation, kernel selection, weight pre-packing) is our "compile".
#
# What changes when the shapes are known? `dynamic_shapes.ort_ops` counts the ops of the graph onnxruntime saves
# as the one it will actually run:

# %%
ops_dynamic = dynamic_shapes.ort_ops(fused_model)
ops_static = dynamic_shapes.ort_ops(fused_model, {"batch": 1, "sequence": 128})
rows = [[op, str(ops_dynamic[op]), str(ops_static[op])]
        for op in sorted(set(ops_dynamic) | set(ops_static)) if ops_dynamic[op] != ops_static[op]]
print("ops that differ in the graph onnxruntime runs:")
print("\n".join(text_table(["op", "dynamic", "static (128)"], rows)))

# %% [markdown]
# Knowing the shapes, onnxruntime folds the `Shape → Gather → Slice` chain that computes the position ids into a
# constant, rewrites the projections `MatMul + Add` as `Gemm` (with `Reshape`s around them), and fuses one more
# `Add` with the LayerNorm after it into a `SkipLayerNormalization` kernel (the dynamic graph already fuses the
# others: the op counts above show how many each has). That is the promise of
# compiling for a fixed shape: more fusion, decided at compile time. Whether it runs faster is a measurement.
#
# The measurement: for each length on a grid from 8 to 512 tokens, build a static session (timed), then time it
# against the one dynamic session on the same input, interleaved (`timing.compare`: the ratio is the median of
# per-round ratios, with a 95% confidence interval; > 1 means the static session is faster). One thread, so the
# two cores do not blur the comparison. We also note how much memory each session adds to the process.
#
# **Predict first:** one build of a static session costs the time of how many of its runs, at 8 tokens and at 512?

# %%
# NBVAL_IGNORE_OUTPUT
GRID = (8, 16, 32, 64, 128, 256, 384, 512)
rss_before = dynamic_shapes.rss_mib()
statics, build_s, cmp = {}, {}, {}
for n in GRID:
    t0 = time.perf_counter()
    statics[n] = dynamic_shapes.static_session(fused_model, {"batch": 1, "sequence": n})
    build_s[n] = time.perf_counter() - t0
    feeds = make_feeds(model, dims={"batch": 1, "sequence": n}, seed=n)
    cmp[n] = compare(lambda: dynamic_sess.run(names, feeds), lambda: statics[n].run(names, feeds),
                     min_time=0.3, label_a="dynamic", label_b="static")
mib_per_session = (dynamic_shapes.rss_mib() - rss_before) / len(GRID)
t0 = time.perf_counter()
session(fused_model, "all")
dynamic_build_s = time.perf_counter() - t0
run_dynamic = {n: c.a.median for n, c in cmp.items()}
run_static = {n: c.b.median for n, c in cmp.items()}
build_median = float(np.median(list(build_s.values())))

print("\n".join(text_table(
    ["length", "build", "run, dynamic", "per token", "run, static", "static speed-up (95% CI)", "verdict",
     "1 build = N runs"],
    [[str(n), f"{build_s[n] * 1e3:.1f} ms", f"{run_dynamic[n] * 1e3:.2f} ms", f"{run_dynamic[n] / n * 1e6:.0f} µs",
      f"{run_static[n] * 1e3:.2f} ms", f"{c.speedup:.2f}x ({c.ci_low:.2f}-{c.ci_high:.2f})", c.verdict(brief=True),
      f"{build_s[n] / run_static[n]:.0f}"] for n, c in cmp.items()])))
print(f"dynamic session build: {dynamic_build_s * 1e3:.1f} ms; memory per static session: {mib_per_session:.1f} MiB")
run_at = dynamic_shapes.interpolate(run_dynamic)
padded = run_at(128) / run_at(65)
display(Markdown(
    f"A 65-token request padded to gear 128 runs {padded:.2f}× as long as at its own length (interpolated), for "
    f"{128 / 65:.2f}× the tokens: " + ("about in proportion." if abs(padded / (128 / 65) - 1) < 0.05 else
                                       "more than in proportion." if padded > 128 / 65 else "less than in proportion.")))

# %% [markdown]
# Three things to read off (the numbers are this machine's, printed above):
#
# 1. **A compilation costs many runs** (the table's last column). We have not measured ATC; generating kernels
#    for every operator is far more work than an onnxruntime session build, so expect a larger ratio there.
#    Compiling while requests wait, as the seed's cache does on every new length, is expensive. The column is not
#    when compiling a length of its own pays, though: a compilation is paid back only by what padding costs each
#    request, the run at the gear minus the run at the length (Exercise 2 counts the requests).
# 2. **Padding costs real time.** Run time grows with the length, but not linearly (the time per token): at short
#    lengths a fixed cost per run weighs more, at long ones attention's work grows with the square of the length.
#    The line under the table sets the time of a 65-token request padded to gear 128 against its tokens. So
#    notebook 20 §3's waste (computed / useful *tokens*) is only a proxy for the time padding wastes; §3 measures
#    that time.
# 3. **Does knowing the shape make the static session faster?** The table's verdicts do not isolate the
#    shape: the static graph also fuses one more `Add` + LayerNorm into a `SkipLayerNormalization`, whose CPU kernel
#    is not necessarily faster than the ops it replaces. To separate them, time four sessions interleaved: dynamic
#    and static, each with and without `SkipLayerNormFusion`. Disabling it removes every `SkipLayerNormalization`,
#    not only the extra one, and in the dynamic graph each kernel replaces one op more than in the static one (its
#    bias `Add`, which the static graph has moved into a `Gemm`); the next cell counts them. Dynamic against static
#    with the fusion off in *both* is the shape knowledge alone; each session with against without it is the
#    fusion alone:

# %%
NO_SKIP = ("SkipLayerNormFusion",)
for kind, dims in (("dynamic", None), ("static", {"batch": 1, "sequence": 64})):
    on, off = dynamic_shapes.ort_ops(fused_model, dims), dynamic_shapes.ort_ops(fused_model, dims, disable=NO_SKIP)
    k = on["SkipLayerNormalization"]
    diff = ", ".join(f"{op} {off[op] - on[op]:+d}" for op in sorted(set(on) | set(off)) if off[op] != on[op])
    print(wrap(f"{kind}: {k} SkipLayerNormalization kernels, {off['SkipLayerNormalization']} with "
               f"SkipLayerNormFusion disabled; each replaces {(sum(off.values()) - sum(on.values())) / k + 1:g} ops "
               f"(disabling it: {diff})"))

# %%
# NBVAL_IGNORE_OUTPUT
split = {}
for n in (64, 512):
    feeds = make_feeds(model, dims={"batch": 1, "sequence": n}, seed=n)
    four = {"dynamic": dynamic_sess, "dynamic, no skip": session(fused_model, "all", disabled_optimizers=NO_SKIP),
            "static": statics[n],
            "static, no skip": dynamic_shapes.static_session(fused_model, {"batch": 1, "sequence": n}, disable=NO_SKIP)}
    t = interleaved({k: (lambda s=s: s.run(names, feeds)) for k, s in four.items()}, min_time=1.2)
    pair = lambda a, b: Comparison.from_samples(t[a], t[b], label_a=a, label_b=b)  # noqa: E731
    split[n] = {"shape knowledge alone": pair("dynamic, no skip", "static, no skip"),
                "the fusion, dynamic": pair("dynamic, no skip", "dynamic"),
                "the fusion, static": pair("static, no skip", "static"),
                "as in the table (static fuses one more)": pair("dynamic", "static")}
    for what, c in split[n].items():
        print(wrap(f"length {n}, {what}: {c.label_a} / {c.label_b} {c.speedup:.2f}x ({c.ci_low:.2f}-{c.ci_high:.2f})"
                   f" -> {c.verdict(brief=True)}"))

# %% [markdown]
# The fusion lines are no verdict on fusion in general: they measure one onnxruntime CPU kernel against the ops it
# replaces (counted above). Nor does the shape line carry over to an NPU: onnxruntime's CPU kernels choose their blocking at run
# time, so a compile-time shape has less to decide than in a compiler that plans tiling and on-chip buffers per
# shape. What carries over is the method: measure a specialised build against the general one, per length, one
# change at a time.
#
# ## 2. Replaying the stream through four policies
#
# `dynamic_shapes.replay(lengths, policy, ...)` runs the stream through a policy with a `ShapeCache` and counts
# compilations, hits, evictions, the largest number of models held, and the padding waste. The counts depend
# only on the stream:
#
# - **exact shape** (the seed): a static model per distinct length, unbounded;
# - **gears**: pad up to one of the four gears, a cache of capacity 4 (all gears) or 2 (too small);
# - **one static model**: everything padded to 512, the simplest static deployment (one gear);
# - **one dynamic session**: compiled once, every request runs at its own length (as ATC's shape-range mode of
#   notebook 20 §1 does).

# %%
def policies(run_static=None, run_dynamic=None, build=None, dynamic_build=None):
    kw = dict(run_seconds=run_static, build_seconds=build)
    return [
        dynamic_shapes.replay(stream, "gears", gears=(512,), capacity=1, label="one static model (512)", **kw),
        dynamic_shapes.replay(stream, "exact", **kw),
        dynamic_shapes.replay(stream, "gears", gears=GEARS, capacity=4, **kw),
        dynamic_shapes.replay(stream, "gears", gears=GEARS, capacity=2, **kw),
        dynamic_shapes.replay(stream, "dynamic", run_seconds=run_dynamic, build_seconds=dynamic_build),
    ]


print(dynamic_shapes.replay_table(policies()))

# %% [markdown]
# The seed's cache compiles once per distinct length; gears compile four times and pad. A cache smaller than the
# working set is the worst of both: with room for 2 of the 4 gears, the LRU cache keeps evicting a gear it needs
# again a few requests later and recompiles hundreds of times. Bound the number of shapes first (gears), then
# size the cache to hold them all.
#
# Now the same replay in seconds, using the costs measured in §1: the static run time at each computed
# length (interpolated between the grid points), the median build time per compilation, and for the dynamic
# policy its own run times and one build.

# %%
# NBVAL_IGNORE_OUTPUT
timed = policies(run_static, run_dynamic, build_median, dynamic_build_s)
print(dynamic_shapes.replay_table(timed, times=True))
print(f"memory for the models held, at {mib_per_session:.0f} MiB per session:")
for r in timed:
    print(f"  {r.label}: {r.peak_cached * mib_per_session:.0f} MiB")

fig, ax = plt.subplots(figsize=(8, 3.6))
labels = [r.label.replace(", ", "\n") for r in timed]
ax.bar(labels, [r.run_seconds for r in timed], label="running")
ax.bar(labels, [r.build_seconds for r in timed], bottom=[r.run_seconds for r in timed], label="compiling")
ax.set(ylabel="seconds for the 2000 requests", title="the stream replayed with this machine's measured costs")
ax.tick_params(axis="x", labelsize="small")
ax.legend(fontsize="small")
fig.tight_layout()
plt.close(fig)
fig

# %% [markdown]
# Is the replay's arithmetic a fair model of the real thing? Run the first 150 requests for real through a
# `ShapeCache` of static gear sessions (the thrashing capacity 2, so that compilations matter), and compare the
# wall time with what `replay` predicts from the measured costs:

# %%
# NBVAL_IGNORE_OUTPUT
prefix = stream[:150]
real = dynamic_shapes.ShapeCache(
    lambda key: dynamic_shapes.static_session(fused_model, {"batch": 1, "sequence": key[1]}), capacity=2)
prefix_feeds = [make_feeds(model, dims={"batch": 1, "sequence": int(n)}, seed=i) for i, n in enumerate(prefix)]
t0 = time.perf_counter()
for n, feeds in zip(prefix, prefix_feeds):
    g = dynamic_shapes.gear_for(int(n), GEARS)
    real.get((1, g)).run(names, dynamic_shapes.pad_feeds(feeds, g))
measured = time.perf_counter() - t0
predicted = dynamic_shapes.replay(prefix, "gears", gears=GEARS, capacity=2, run_seconds=run_static, build_seconds=build_median)
print(f"first 150 requests, gears with LRU 2: {real.misses} compilations; "
      f"measured {measured:.2f} s, replay predicts {predicted.total_seconds:.2f} s "
      f"({measured / predicted.total_seconds:.2f}x)")
loop_runs = measured - real.build_seconds
print(f"  compiling: measured {real.build_seconds:.2f} s ({real.build_seconds / real.misses * 1e3:.0f} ms per build), "
      f"replay {predicted.build_seconds:.2f} s ({build_median * 1e3:.0f} ms per build)")
print(f"  running (and padding): measured {loop_runs:.2f} s, replay {predicted.run_seconds:.2f} s")
ratio = measured / predicted.total_seconds
spread = (min(build_s.values()) / build_median, max(build_s.values()) / build_median)
build_ratio, runs_ratio = real.build_seconds / predicted.build_seconds, loop_runs / predicted.run_seconds
display(Markdown(
    f"The compilation count is exact by construction. The seconds are not: measured over predicted is "
    f"{ratio:.2f}×. The two lines under the total split it: this loop's builds took {build_ratio:.2f}× "
    f"what the replay charged for them, its runs {runs_ratio:.2f}×. The replay charges every compilation the median "
    f"build time of §1, and single builds there ranged from {spread[0]:.2f}× to {spread[1]:.2f}× that median: "
    + ("the builds' miss lies within that range, so the build times fed in can account for it. "
       if spread[0] <= build_ratio <= spread[1] else
       "the builds' miss lies outside even that range, so §1's build times do not represent these "
       "builds: a systematic difference, not their spread. ")
    + ("The runs' miss the build times do not explain: the replay charges each run the median of §1's warm "
       "runs, while this loop also pads its feeds and runs every freshly built session cold once (neither is "
       "measured apart here). " if abs(runs_ratio - 1) > 0.1 else "")
    + "The replay's seconds are as good as the measured costs fed into it, and no better."))

# %% [markdown]
# ## 3. The seed's "×2.1"
#
# %%
print(seed_claims.claim("s51-bert-2.1x").summary())

# %% [markdown]
# What each possible source of such a gain gives here:
#
# - **Avoiding padding.** Against one static model padded to 512, compiling per exact shape saves the padded
#   tokens. How much depends entirely on the length distribution: for our stream (mostly short requests) the
#   waste of padding to 512 is about 4×; for *long* sequences, by definition close to the maximum, there is
#   little padding to avoid:

# %%
long_stream = dynamic_shapes.request_lengths(2000, seed=1, median=384, sigma=0.25, min_len=257)
for name, s in ((f"our stream (median {int(np.median(stream))})", stream), ("long sequences (257-512)", long_stream)):
    w = 512 * len(s) / s.sum()
    print(f"{name:<26} padding to 512 computes {w:.2f}x the useful tokens")

# %% [markdown]
# Measured throughput, from the run times of §1 (no compilation counted, as if every model were
# already compiled), relative to one static model padded to 512:

# %%
# NBVAL_IGNORE_OUTPUT
gains, speedups = [], {}
for name, s in ((f"our stream (median {int(np.median(stream))})", stream), ("long sequences (257-512)", long_stream)):
    base = dynamic_shapes.replay(s, "gears", gears=(512,), capacity=1, run_seconds=run_static).run_seconds
    exact_s = dynamic_shapes.replay(s, "exact", run_seconds=run_static).run_seconds
    gears_s = dynamic_shapes.replay(s, "gears", gears=GEARS, capacity=4, run_seconds=run_static).run_seconds
    dynamic_s = dynamic_shapes.replay(s, "dynamic", run_seconds=run_dynamic).run_seconds
    speedups[name] = base / exact_s
    gains.append([name, f"{base / exact_s:.2f}x", f"{base / gears_s:.2f}x", f"{(base - gears_s) / (base - exact_s):.0%}",
                  f"{base / dynamic_s:.2f}x"])
print("\n".join(text_table(["stream", "exact shapes", "gears 64/128/256/512",
                            "time padding to 512 wastes, removed by gears", "one dynamic session"], gains)))
best = max(cmp, key=lambda n: cmp[n].speedup)
alone = {n: c["shape knowledge alone"] for n, c in split.items()}
long_w = 512 * len(long_stream) / long_stream.sum()
display(Markdown(
    f"For the long stream, padding to 512 computes {long_w:.2f}× the useful tokens, and exact shapes run it "
    f"{speedups['long sequences (257-512)']:.2f}× as fast as padding everything to 512, "
    + ("short of" if speedups["long sequences (257-512)"] < 2.1 else "not short of")
    + f" the seed's 2.1×. §1's largest static-over-dynamic "
    f"ratio on the grid: {cmp[best].speedup:.2f}× ({cmp[best].ci_low:.2f}–{cmp[best].ci_high:.2f}) at {best} "
    f"tokens; the shape knowledge alone, with the extra fusion off in both sessions: "
    + ", ".join(f"{c.speedup:.2f}× ({c.ci_low:.2f}–{c.ci_high:.2f}) at {n} tokens" for n, c in alone.items()) + "."))

# %% [markdown]
# - On short-request traffic, not padding everything to 512 is worth several times the throughput: that is
#   where a "×2" can easily come from. Four gears remove most of the time that padding to 512 wastes, with four
#   compilations instead of hundreds.
# - On long sequences, padding to 512 computes only about a third more tokens than needed; the time exact shapes
#   save (under the table) differs from that ratio by fixed costs, attention's square term and this machine's
#   noise. Our four gears do nothing for this stream (every request falls into the 512 gear); gears for long
#   traffic would sit at, say, `320/384/448/512`. The dynamic session's figure also holds §1's kernel
#   difference.
# - So a ×2.1 *for long sequences* is hard to get from avoiding padding alone, with BERT's maximum of 512 tokens:
#   it would have to come from kernels compiled per shape being faster, which on this CPU is §1's ratio
#   (under the table). On an Ascend NPU it may well differ, but that is the measurement the seed does not give,
#   and we cannot make it without the hardware.
#
# %% [markdown]
# ## Summary
#
# - Measured with onnxruntime, compiling for one shape costs the time of many runs, and padding costs run time
#   that the padded tokens only approximate; four sessions timed interleaved separate what the known shape gives
#   from the extra fusion it enables.
# - Replayed over the stream, the seed's per-length cache compiles once per distinct length and four gears four
#   times, while an LRU cache with room for fewer than its gears recompiles hundreds of times; the replay's seconds
#   are only as good as the measured costs fed into it.
# - The seed's ×2.1 for long sequences is hard to get from avoiding padding alone at BERT's 512 tokens: it needs
#   kernels compiled per shape to be faster, a measurement on the device that the seed does not give.
#
# ## Exercises
#
# The exercises check themselves: write your answer in the cell under each task, run it, then run the `check` cell.
# `check` grades it at once on hidden cases and prints PASS with what it checked, or FAIL with a hint naming the
# first case your answer gets wrong and the mistake it looks like. The notebook is stored unanswered; reference
# answers are in the repository's `solutions/` folder, outside the notebooks (try first).
#
# **Exercise 1: compilations of a bounded cache.** Write `compilations(shapes, capacity)`: how many times a cache
# of compiled models compiles over the stream `shapes` when it holds at most `capacity` of them (None: no bound) and,
# when full, evicts the least recently used, as `ShapeCache` does (notebook 20 §2; §2's replay uses it); write the
# eviction yourself. Key it by `dynamic_shapes.shape_key(shape)`: the hidden streams spell one shape as a tuple, a
# list and with NumPy ints, and include capacity 1, the seed's unbounded cache, and three gears cycling through room
# for two.

# %%
def compilations(shapes, capacity):
    """Misses (= compilations) of an LRU cache of `capacity` compiled shapes over the stream."""
    ...  # your code here


# %%
exercises.lru.check(compilations)

# %% [markdown]
# **Exercise 2: when compiling a shape pays.** Requests of one `length` keep arriving, and their gear's model is
# compiled already. Write `break_even(length, gears, run_seconds, build_seconds)`: the fewest requests for which
# compiling the length's own shape (one build, then runs at the length) costs no more in total than running them
# padded to the gear, or `math.inf` if it never does. `run_seconds` is {length: seconds} like §1's `run_static`
# (read it between the points as `dynamic_shapes.interpolate` does), `build_seconds` one compile. The hidden cases
# include a tie, a length equal to its gear, a gear measured faster than the length, and gears out of order. Then
# try `break_even(65, GEARS, run_static, build_median)`.

# %%
import math


def break_even(length, gears, run_seconds, build_seconds):
    """The fewest requests of `length` after which compiling its own shape pays, or math.inf."""
    ...  # your code here


# %%
exercises.breakeven.check(break_even)
