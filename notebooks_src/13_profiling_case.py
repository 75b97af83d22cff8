# %% [markdown]
# # 13 · A profiling case: find where the time goes, apply the seed's three fixes, measure again
#
# **What you will be able to do**
#
# - profile an ONNX model with onnxruntime and read it the way msprof's `op_summary` is read on Ascend (op, type,
#   start, duration, the launch gap before each op), knowing what the profiler itself costs;
# - draw a timeline and write a trace for Perfetto, and see what fusion changes in a profile;
# - apply the seed's three fixes (§4.1), **launch gaps** → fusion and parallel branches, **frequent allocation** →
#   memory arena and IO binding, **low compute density** → threads, each measured with interleaved runs;
# - read the seed's evaluation model (§6.2) for this CPU and the Atlas presets, and find with `fusionlab blame` which
#   of onnxruntime's graph transformers changed an answer (§10).
#
# **What is measured and what is modelled.** Everything timed here runs on this machine's CPU with onnxruntime.
# The seed's numbers come from Ascend hardware (msprof on Atlas cards), which we do not have: for those devices
# the figures below come from the cost model and the devices' *published* specifications, and they are labelled
# "modelled". Cells whose output is a timing are marked `NBVAL_IGNORE_OUTPUT`: timings differ from run to run,
# so the prose never quotes a number; the code prints them and the verdicts.

# %%
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt

import fusionlab
from fusionlab import cost, exercises, profile, seed_claims, zoo
from fusionlab.cost import calibrate, devices, metrics
from fusionlab.passes import fuse
from fusionlab.text import wrap
from fusionlab.timing import bench, compare, compare_models, ratio_verdict
from fusionlab.verification.runtime import verify

plt.rcParams["figure.dpi"] = 80

# %% [markdown]
# ## 1. The model, and its fused twin
#
# A YOLOv5-style detector (the seed's §1 example) at width 0.25 and 160×160 input, so that every run takes a few
# milliseconds. It is exported the way `torch.onnx` writes it with `do_constant_folding=False` (the default
# folds BN itself): every Conv is followed by a separate BatchNormalization and a SiLU written as Sigmoid + Mul. The vertical pass folds the BN into the Conv and fuses
# the activation; the fused model is checked against the original before anything is timed.

# %%
model = zoo.yolov5s(image_size=160, width_mult=0.25)
fused = fuse(model, passes=("vertical",))
print(fused.summary())
report = verify(model, fused.graph)
print("fused model equivalent to the original (fp32, rtol 1e-4, atol 1e-5):", report.ok)

# %% [markdown]
# ## 2. Profile: the op table
#
# `profile.profile_model` runs the model with onnxruntime's profiler on (optimisations off, one thread), drops the
# warm-up runs, and parses the Chrome-trace JSON that onnxruntime writes (the file lives in a temporary folder
# and is deleted). onnxruntime records one `Node` event per kernel and one `model_run` event per run.
#
# The table mirrors the columns of msprof's `op_summary`. **Wait** is computed the way msprof computes
# `Task Wait Time`: the time between the end of the previous op and the start of this one. On an NPU that gap is
# the kernel-launch and scheduling cost; on this CPU it is onnxruntime's per-node overhead (finding the inputs,
# allocating the output, dispatching the kernel) plus, as §3 measures, the profiler's own bookkeeping. The run
# shown is the median one of fifteen.
#
# **Predict first:** the original graph has 258 nodes and the fused one 142. How many kernels does one run of each
# launch? (The table's last line answers it for the original; the next cell for both.)

# %%
# NBVAL_IGNORE_OUTPUT
before = profile.profile_model(model, runs=15, warmup=3, label="original")
after = profile.profile_model(fused.graph, runs=15, warmup=3, label="fused")
print(before.op_table(top=12, sort="duration"))

# %% [markdown]
# What does not vary from run to run is the structure: how many kernels one run launches and of which types.

# %%
print(f"kernels per run: original {before.ops_per_run}, fused {after.ops_per_run}")
counts_before = {t: r["count"] for t, r in sorted(before.by_op_type().items())}
counts_after = {t: r["count"] for t, r in sorted(after.by_op_type().items())}
print(wrap(f"original: {counts_before}", indent=" " * 10))
print(wrap(f"fused:    {counts_after}", indent=" " * 10))
print("graph nodes that launch no kernel:",
      sorted({n.op_type for n in fusionlab.load(model).topological_order()} - set(counts_before)))

# %% [markdown]
# The original launches 256 kernels, not 258: its two `Constant` nodes hold the Resize scales, and onnxruntime turns
# constants into initializers when it loads the model, so they never run. The fused model has no `Constant` left
# over, and runs all of its 142 nodes.
#
# ### The same on Ascend: msprof and its `op_summary`
#
# On an Ascend device the profiler is msprof. The seed's command, `msprof --application=python3 infer.py
# --output=timeline.json`, is not quite the real one: `--application` takes the whole command as one quoted string,
# and `--output` names a *directory*. Either form works:
#
# ```bash
# msprof --output=./prof --ascendcl=on --task-time=on --ai-core=on --aic-metrics=PipeUtilization python3 infer.py
# msprof --application="python3 infer.py" --output=./prof          # the legacy form
# ```
#
# msprof writes `./prof/PROF_*/mindstudio_profiler_output/`: `msprof_*.json` is the timeline (Chrome-trace format,
# like onnxruntime's), and `op_summary_*.csv` has one row per task. The columns our table mirrors, and the ones a
# CPU cannot give (names as msprof writes them; newer versions write `Block Num` for `Block Dim`: `shared/reference/cann_facts.md` §5, which the columns and the tool's options below follow):
#
# | msprof `op_summary` | here | meaning |
# |---|---|---|
# | `Op Name`, `OP Type` | Op Name, OP Type | the node and its operator |
# | `Task Start Time(us)` | Start(us) | when the task started (here: since the run started) |
# | `Task Duration(us)` | Duration(us) | scheduling + execution + completion of the task |
# | `Task Wait Time(us)` | Wait(us) | end of the previous task to the start of this one: the launch gap |
# | `Block Dim` | (Thread) | how many AI cores the launch used; on this CPU, which thread ran it |
# | `aicore_time(us)`, `total_cycles` | - | time on the AI Core alone (always ≤ Task Duration) |
# | `vec_ratio`, `mac_ratio`, `scalar_ratio`, `mte1_ratio`, `mte2_ratio`, `mte3_ratio` | - | share of cycles each pipe was busy (`--aic-metrics=PipeUtilization`; `aiv_*`/`aic_*` on A2) |
#
# The seed's other profiling call does not exist:

# %%
print(seed_claims.claim("s41-msprof-command").summary(), "\n")
print(seed_claims.claim("s41-acl-report-time").summary())

# %% [markdown]
# `aclrtSynchronizeStream` is real (it waits for a stream to finish), but ACL has no `aclmdlReportComputationTime`.
# From inside an application, profiling is `aclprofInit(path)`, `aclprofCreateConfig(devices, n, metrics, events,
# ACL_PROF_ACL_API | ACL_PROF_TASK_TIME | ACL_PROF_AICORE_METRICS)`, `aclprofStart(config)`, the model runs,
# `aclprofStop(config)`, `aclprofFinalize()`: the same data msprof collects, written to `path`. For per-operator
# times *at run time*, the subscription API: `aclprofCreateSubscribeConfig`, `aclprofModelSubscribe(modelId, config)`,
# then `aclprofGetOpNum`, `aclprofGetOpType`, `aclprofGetOpName` and `aclprofGetOpDuration` on the data read back from
# a pipe, and `aclprofModelUnSubscribe` at the end.
#
# ## 3. The profiler's own cost
#
# A profiler records two timestamps and an event per kernel, and that takes time. How much? Run the same model in
# two sessions, one with onnxruntime's profiler on and one with it off, interleaved (`compare`), and set the
# difference per kernel against the "no kernel running" time the profile reports per kernel:

# %%
# NBVAL_IGNORE_OUTPUT
with tempfile.TemporaryDirectory() as tmp:
    profiled_sess = fusionlab.session(model, "disable", 1, enable_profiling=True, profile_prefix=str(Path(tmp) / "ort"))
    profiled_feeds = fusionlab.make_feeds(model, seed=0, sess=profiled_sess)
    overhead = compare(profile.runner(model), lambda: profiled_sess.run(None, profiled_feeds), min_time=2.0,
                       label_a="profiler off", label_b="profiler on")
    profiled_sess.end_profiling()
print(overhead.table())
per_kernel = (overhead.b.median - overhead.a.median) * 1e6 / before.ops_per_run
gap = before.gap_us / before.ops_per_run
print(f"\nthe profiler adds {per_kernel:.1f} us per kernel to a run; the profile shows {gap:.1f} us per kernel with no "
      "kernel running")
print("-> the profiler's own cost is as large as the whole gap: the gaps say little about the launch cost"
      if per_kernel >= gap else f"-> the profiler's own cost is {per_kernel / gap:.0%} of the gap")
cal = calibrate.calibrate(quick=True)
print("\n" + cal.summary())

# %% [markdown]
# The last block is `fusionlab.cost.calibrate`, measured on a chain of tiny ops: what one more kernel costs onnxruntime
# with the profiler off (the *launch overhead*, the figure the cost model of notebook 07 charges this machine for
# each kernel), and with it on. Their difference is the profiler's bookkeeping per kernel, measured a second way.
# Part of that bookkeeping lands between kernels and part inside them, so the profile both lengthens the run and
# widens its gaps: where the profiler's cost per kernel is as large as the gap per kernel, **most of what the
# profile shows as "no kernel running" is the profiler itself**, and the launch cost without it is the calibrated
# launch overhead printed above. Gaps still count kernels, and fewer kernels still means fewer gaps; but what fusion saves must be
# measured with the profiler off, as §6 does.
#
# ## 4. The timeline, and a trace for Perfetto
#
# One lane per thread; each bar is a kernel, coloured by op type. The grey band is the whole run: where it
# shows between bars, no kernel is running. That is where launch gaps live. At the scale of a whole run the gaps
# are a few microseconds wide, too narrow to see, so the lower two rows zoom in on the same part of the network in
# both models: block `model.8` (a C3 block of the backbone).

# %%
def window(prof, prefix="/model.8/"):
    """(start, end) in ms of the ops whose node names start with `prefix` in the median run."""
    ops = [e for e in prof.ops() if e.node.startswith(prefix)] or prof.ops()[len(prof.ops()) // 3:len(prof.ops()) // 2]
    return min(e.start_us for e in ops) / 1000 - 0.01, max(e.end_us for e in ops) / 1000 + 0.01


fig, axes = plt.subplots(4, 1, figsize=(10, 7.2))
profile.draw_timeline(before, ax=axes[0], title="original: one run")
profile.draw_timeline(after, ax=axes[1], title="fused: one run")
for ax, prof, name in ((axes[2], before, "original"), (axes[3], after, "fused")):
    profile.draw_timeline(prof, ax=ax, title=f"{name}, zoomed in on block model.8")
    ax.set_xlim(*window(prof))
fig.tight_layout()
plt.close(fig)
fig

# %% [markdown]
# Zoomed in, the white gaps between kernels show. In the original, every Conv is followed by three short kernels
# (BatchNormalization, Sigmoid, Mul), each with a gap before it; in the fused model each Conv is followed by one
# (`QuickGelu`, onnxruntime's x·sigmoid(αx) kernel, here with α = 1: SiLU).

# %% [markdown]
# Zoom in further with a real trace viewer: `write_trace` writes both profiles into one Chrome-trace file, one process
# each (the file is written atomically). Open it at <https://ui.perfetto.dev> or in `chrome://tracing`. From the
# command line, `fusionlab profile model.onnx --fuse -o trace.json` does the same and prints the op tables.

# %%
with tempfile.TemporaryDirectory() as tmp:
    trace = profile.write_trace(Path(tmp) / "yolov5_profile.json", before, after)
    import json

    events = json.loads(trace.read_text())["traceEvents"]
print("trace file:", trace.name)
print("kernel events:", sum(e.get("cat") == "Node" for e in events),
      "=", before.n_runs, "runs x", before.ops_per_run, "+", after.n_runs, "runs x", after.ops_per_run)

# %% [markdown]
# ## 5. Before and after fusion, side by side
#
# The table gives medians over the fifteen profiled runs: run time, time inside kernels, and time with no kernel
# running, each row the median of its own fifteen values. A median of differences is not the difference of
# medians, so the rows need not add up exactly; the figures of one run, which do, are the last line of §2's op
# table (the median run). Below it, time per op type: the BatchNormalization, Sigmoid and Mul kernels are gone, and the fused
# activation (`QuickGelu`) takes their place.
#
# **Predict first:** if every kernel launch leaves the same gap, what should the fused model's "no kernel running"
# time be? (Scale the original's gap by 142 / 256.) The last line of the next cell compares.

# %%
# NBVAL_IGNORE_OUTPUT
print(profile.side_by_side(before, after))
predicted_gap = before.gap_us * after.ops_per_run / before.ops_per_run
print(f"\nsame gap per kernel: {before.gap_us:.0f} x {after.ops_per_run} / {before.ops_per_run} = {predicted_gap:.0f} us "
      f"predicted,"
      f" {after.gap_us:.0f} us measured")

# %%
fig = profile.draw_op_types(before, after)
plt.close(fig)
fig

# %% [markdown]
# ## 6. Fix 1: launch gaps → fusion, and parallel branches

# %%
print(seed_claims.claim("s41-fix-launch-gaps").summary())

# %% [markdown]
# **Fusion.** Fewer kernels means fewer gaps, and the folded BN removes arithmetic and memory traffic too.
# `compare_models` runs the two models interleaved (A, B, B, A, ...) on the same input and reports the median of
# the per-round time ratios with a 95% confidence interval.

# %%
# NBVAL_IGNORE_OUTPUT
fusion = compare_models(model, fused.graph, min_time=2.0, label_a="original", label_b="fused")
print(fusion.table())
gap_per_op = before.gap_us / before.ops_per_run
print(f"\nprofile: gaps {before.gap_us:.0f} -> {after.gap_us:.0f} us per run, {gap_per_op:.1f} us per launched op "
      f"with the profiler on")
print(f"launch overhead with the profiler off: {cal.launch_overhead_us:.2f} us per op (§3)")
saved = (fusion.a.median - fusion.b.median) * 1e6
print(f"measured without the profiler: {saved:.0f} us saved per run for {before.ops_per_run - after.ops_per_run} "
      f"fewer kernels, {saved / (before.ops_per_run - after.ops_per_run):.1f} us per kernel removed")

from IPython.display import Markdown, display

per_removed = saved / (before.ops_per_run - after.ops_per_run)
profiled_ratio = before.run_us / after.run_us
display(Markdown(
    f"Side by side, original over fused: under the profiler (§5) {profiled_ratio:.2f}× (the ratio of the median "
    f"runs); without it, interleaved, {fusion.speedup:.2f}× ({fusion.ci_low:.2f}–{fusion.ci_high:.2f}): "
    f"{fusion.verdict()}. The profiler charges its bookkeeping per kernel, and the original has "
    f"{before.ops_per_run - after.ops_per_run} more kernels, which would make a profile show more saved than there is; "
    f"here the profiled ratio lies "
    + ("above" if profiled_ratio > fusion.ci_high else "below" if profiled_ratio < fusion.ci_low else "within")
    + " the interleaved interval. "
    + ("Without the profiler the interval includes 1, so this run cannot tell the saving per removed kernel "
       "from zero." if ratio_verdict(fusion.ci_low, fusion.ci_high) != "faster" else
       f"The saving per removed kernel, {per_removed:.1f} µs with the profiler off, is "
       + (f"{per_removed / cal.launch_overhead_us:.0f}× the calibrated launch overhead ({cal.launch_overhead_us:.2f} µs): "
          f"each removed BatchNormalization, Sigmoid and Mul also read and wrote a whole feature map."
          if per_removed > cal.launch_overhead_us else
          f"no more than the calibrated launch overhead ({cal.launch_overhead_us:.2f} µs)."))))

# %% [markdown]
#
# **Parallel branches.** The seed's fix for launch gaps on Ascend is to run independent work on several streams.
# onnxruntime's CPU equivalent is `ExecutionMode.ORT_PARALLEL` with `inter_op_num_threads > 1`. We try it on an
# Inception-style model, whose blocks have four independent branches.
#
# Expect nothing: since onnxruntime 1.14 the execution plan puts all CPU nodes into one stream, so the parallel
# mode has no independent streams to run (reported upstream as microsoft/onnxruntime#16158). The profile below
# shows the proof: in parallel mode the kernels still run one after another, on one lane (a worker thread). What
# the mode does change is who runs the kernels (a worker of the inter-op pool, handed each run): a hand-over
# per run, and possibly a different core on a shared machine. So the ratio can land either way, and is read
# from the interval:

# %%
branchy = zoo.inception(image_size=96, width=0.25)
serial_run = profile.runner(branchy)
parallel_run = profile.runner(branchy, parallel=True, inter_threads=2)
parallel_profile = profile.profile_model(branchy, runs=3, warmup=1, parallel=True, inter_threads=2, label="parallel")
print("lanes used in ORT_PARALLEL mode:", len({e.lane for e in parallel_profile.ops()}))

# %%
# NBVAL_IGNORE_OUTPUT
branches = compare(serial_run, parallel_run, min_time=2.0, label_a="sequential", label_b="ORT_PARALLEL, 2 inter-op threads")
print(branches.table())
display(Markdown(f"Sequential against ORT_PARALLEL: {branches.speedup:.2f}× ({branches.ci_low:.2f}–"
                 f"{branches.ci_high:.2f}), {branches.verdict()}, with every kernel on one lane either way: whatever "
                 f"the mode gains or loses here, it is not parallel branches."))

# %% [markdown]
# ## 7. Fix 2: frequent allocation → preallocated buffers
#
# The seed's second fix is a preallocated workspace instead of allocating and freeing per op. onnxruntime has
# two such mechanisms, both on by default: the **CPU memory arena** (a caching allocator) with **memory
# patterns** (the plan of every intermediate's offset, computed on the first run and reused). We switch both off
# to see what they are worth. **IO binding** goes one step further for the outputs: the output buffers are
# allocated once and bound to the session, so a run neither allocates them nor copies them into new numpy arrays.

# %%
print(seed_claims.claim("s41-fix-workspace").summary())

# %%
# NBVAL_IGNORE_OUTPUT
plain = profile.runner(model)
no_arena = profile.runner(model, mem_arena=False, mem_pattern=False)
bound = profile.runner(model, io_binding=True)
arena = compare(no_arena, plain, min_time=2.0, label_a="arena + patterns off", label_b="arena + patterns on")
iobind = compare(plain, bound, min_time=2.0, label_a="run()", label_b="IO binding")
print(arena.table(), "\n")
print(iobind.table())
display(Markdown(f"Arena and memory patterns off against on: {arena.speedup:.2f}× ({arena.ci_low:.2f}–"
                 f"{arena.ci_high:.2f}), {arena.verdict()}. `run()` against IO binding: {iobind.speedup:.2f}× "
                 f"({iobind.ci_low:.2f}–{iobind.ci_high:.2f}), {iobind.verdict()}."))

# %% [markdown]
# A speed-up is worth nothing if the answer changes. IO binding writes into buffers we allocated once; check
# that they hold exactly what a plain `run()` returns:

# %%
import numpy as np

reference = plain()
bound_out = bound()
print("IO binding outputs identical to run():",
      all(np.array_equal(r, b) for r, b in zip(reference, bound_out.values())))
print("outputs:", {name: tuple(a.shape) for name, a in bound_out.items()})

# %% [markdown]
# Both comparisons print their own verdict from the confidence interval: "faster" only when the whole interval
# lies on one side of 1, otherwise "no clear difference". A small model whose intermediates are tiny gives the
# allocator little to do, so a verdict of no clear difference is a real result, not a failure to measure.

# %% [markdown]
# ## 8. Fix 3: low compute density → more parallelism, shown as utilisation
#
# On Ascend the seed tunes `blockDim` (how many AI cores a kernel uses; "gridDim" is CUDA's word, an Ascend launch
# has only the one). The CPU knob is onnxruntime's
# `intra_op_num_threads`: how many cores one kernel is split across. We measure one thread against two and turn
# each median time into **compute utilisation**: the model's FLOPs (from the cost model) per second, divided by a
# peak. For the peak of this CPU we *measure* the roof onnxruntime itself can reach: its own MatMul kernel on
# large matrices, with the same number of threads. (A datasheet peak would need the clock and vector units of a
# virtual CPU we cannot see.) This CPU's power draw is unknown, so no TOPS/W is given for it.

# %%
print(seed_claims.claim("s41-fix-blockdim").summary(), "\n")
costs = cost.node_costs(model)
calibrated = devices.get("this machine")
cpu_1 = metrics.with_peak(calibrated, metrics.ort_matmul_gflops(512, threads=1), "this CPU, 1 thread")
cpu_2 = metrics.with_peak(calibrated, metrics.ort_matmul_gflops(512, threads=2), "this CPU, 2 threads")
print(f"model: {sum(c.flops for c in costs) / 1e9:.3f} GFLOP, {sum(c.bytes for c in costs) / 1e6:.2f} MB moved per run "
      "(cost model, unfused)")

# %%
# NBVAL_IGNORE_OUTPUT
threads = compare(profile.runner(model, threads=1), profile.runner(model, threads=2), min_time=2.0,
                  label_a="1 intra-op thread", label_b="2 intra-op threads")
util_1 = metrics.utilisation(threads.a.median, costs, cpu_1)
util_2 = metrics.utilisation(threads.b.median, costs, cpu_2)
print(threads.table(), "\n")
print(metrics.table([util_1, util_2]))
print(f"\nroof (onnxruntime MatMul): {cpu_1.peak_flops('float32') / 1e9:.1f} GFLOP/s with 1 thread, "
      f"{cpu_2.peak_flops('float32') / 1e9:.1f} GFLOP/s with 2")
print(f"DRAM streaming bandwidth {calibrated.mem_bandwidth_gbs:.1f} GB/s "
      f"(fusionlab.cost.calibrate, the figure every notebook uses)")
roof_ratio = cpu_2.peak_flops("float32") / cpu_1.peak_flops("float32")
display(Markdown(f"This run: numpy matmul {cal.matmul_gflops:.1f} GFLOP/s (§3), onnxruntime MatMul "
                 f"{cpu_1.peak_flops('float32') / 1e9:.1f} GFLOP/s, both one thread. With two threads the MatMul "
                 f"roof is {roof_ratio:.2f}× the one-thread roof (two idle cores would make it close to 2×). One "
                 f"thread against two on the model: {threads.speedup:.2f}× ({threads.ci_low:.2f}–{threads.ci_high:.2f}), "
                 f"{threads.verdict()}."))


# %% [markdown]
# Two peaks of this CPU appear in this notebook, and they are different measurements: §3's `calibrate` block
# times numpy's OpenBLAS matmul (fusionlab's "this machine" device, the cost model's peak), while the roof here
# is onnxruntime's own MatMul kernel (MLAS), the roof a model run in onnxruntime can reach. Utilisation uses the
# second.
#
# When the cores are shared with other work, a second thread can only help as much as another core is idle,
# and that holds for the roof too: the line above says how the two-thread MatMul roof compares with the
# one-thread one in this run. Each roof is measured under the same conditions as its model run, so the
# utilisation column says how much of the roof at hand the model really used. A small model gives each kernel little work to split, so do not expect the
# second thread to double the speed: read the verdict line.
#
# ## 9. The seed's evaluation model, modelled for the Atlas presets
#
# For the Ascend devices there is no profile to read, so the time comes from the cost model: each kernel takes
# max(FLOPs / peak, bytes / bandwidth) plus a launch overhead, at fp16 (ATC's default precision mode runs an
# operator in float16 wherever it supports both: [`--precision_mode_v2`](https://www.hiascend.com/doc_center/source/zh/canncommercial/80RC2/devaids/auxiliarydevtool/atlasatc_16_0099.html)). These are *predictions from published specs*, not measurements. The seed's targets for a good
# fused op on Atlas 300I Duo: compute utilisation above 65%, bandwidth below 80%, more than 4 TOPS/W.
#
# The 300I Duo is a card of two 310P3 chips, each with its own memory: 408 GB/s is the whole card's, about 204 per
# chip (`shared/reference/cann_facts.md` §4). One model instance runs on one chip (Huawei's cluster scheduler
# hands out a Duo's two "Ascend AI processors" one by one:
# [MindCluster](https://www.hiascend.com/document/detail/en/mindcluster/730/clustersched/schedulingug/dl_affinity_0009.html)),
# so the table models one chip of the Duo (`Device.one_chip()`: every card figure halved) beside the other presets, which are one chip
# each already.

# %%
presets = devices.load_devices()
targets = [dev.one_chip() for dev in presets.values()]
modelled = [metrics.modelled(model, dev, fused.plan) for dev in targets]
print(metrics.table(modelled))

# %% [markdown]
# Most of each modelled time is one term the specifications do not give: the launch overhead, *assumed* at
# 5 µs per kernel on every preset (`data/devices.json` lists it as uncertain). How much of the figure is that
# assumption, and what the table becomes at a fifth of it and at twice it:

# %%
from dataclasses import replace as with_field

rows = []
for dev, m in zip(targets, modelled):
    at = {us: metrics.modelled(model, with_field(dev, launch_overhead_us=us), fused.plan).time_s for us in (1.0, 10.0)}
    launches = round((at[10.0] - at[1.0]) / 9e-6)  # the model is linear in the launch overhead: its slope counts them
    launch_share = launches * dev.launch_overhead_us * 1e-6 / m.time_s
    rows.append(f"  {dev.name:<28} {m.time_s * 1e3:.3f} ms, {launch_share:.0%} = {launches} launches; 1 µs: "
                f"{at[1.0] * 1e3:.3f} ms, 10 µs: {at[10.0] * 1e3:.3f} ms")
print(f"modelled time; its share that is launches at the assumed {presets['Atlas 300I Pro'].launch_overhead_us:g} µs "
      f"each; the time at 1 µs and at 10 µs:")
print("\n".join(rows))

# %% [markdown]
# Two things stand out, and both follow from the numbers, not from opinion:
#
# - a small detector at 160×160 uses a tiny share of these accelerators: its kernels are short, so the fixed
#   launch overhead (assumed, as the last cell shows, and most of each modelled time) and memory traffic
#   dominate; the utilisation figures scale with that assumption. Utilisation is a property of the *workload*
#   on the device, not of a fused op alone;
# - the TOPS/W target cannot be met by the 300I Duo at its rated power even in theory, as the next cell computes
#   (for the card, as the seed states it; one chip has half the peak and, derived, half the power: the same ratio).

# %%
print(seed_claims.claim("s62-targets-300i-duo").summary())

# %%
duo = presets["Atlas 300I Duo"]
best = metrics.peak_efficiency(duo, "int8")
print(f"{duo.name}: peak INT8 {duo.peak_int8_tops:g} TOPS / {duo.power_w:g} W rated = {best:.2f} TOPS/W at best; "
      f"the seed's target is > {metrics.TARGETS['tops_per_watt']:g} TOPS/W")
for dev in list(presets.values()) + [duo.one_chip()]:
    print(f"  {dev.name:<30} best {metrics.peak_efficiency(dev, 'int8'):.2f} TOPS/W (INT8 peak / rated power)")

# %% [markdown]
# The roofline puts it together: the black line is what a device can do at a given arithmetic intensity (FLOPs
# per byte moved), with its bandwidth the streaming bandwidth to DRAM (small CPU kernels whose data stays in cache
# can sit above it); the dashed green line is the seed's 65%-of-peak target, the dotted red line 80% of the memory
# bandwidth, and the purple line the throughput that 4 TOPS/W at rated power would need (above the roof: out of
# reach). Small dots are kernels, big markers the whole model. Left: this CPU, measured, one thread. Right: one
# chip of the Atlas 300I Duo, modelled (its roof, and the power line at its half of the card's rated power).

# %%
fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
metrics.draw_roofline(cpu_1, [metrics.utilisation(before, costs, cpu_1)], ax=axes[0],
                      title="this CPU (measured, 1 thread)")
metrics.draw_roofline(duo.one_chip(), [modelled[list(presets).index("Atlas 300I Duo")]], ax=axes[1],
                      title="Atlas 300I Duo, one chip (modelled)")
fig.tight_layout()
plt.close(fig)
fig

# %% [markdown]
# ## 10. When a fusion changes the answer: `fusionlab blame`
#
# The seed's first troubleshooting row (§11 below) is an accuracy anomaly after fusion. Before guessing at a
# cause, find *which* optimisation changed the outputs. `fusionlab blame` runs the model unoptimised
# (DISABLE_ALL) and at the level you deploy, compares the two with the dtype's tolerance, and, if they differ,
# bisects onnxruntime's `disabled_optimizers` until one graph transformer is left.
#
# The model, built in code (`zoo.offset_layernorm`): float16 rows whose mean (100) is large next to their
# spread (0.1), through a LayerNorm written out as exporters write it (ReduceMean, Sub, Pow, ReduceMean, Add,
# Sqrt, Div, Mul, Add), then Relu. At BASIC level onnxruntime fuses those nine ops into one
# `LayerNormalization`.
#
# **Predict first:** will the fused model agree with the unfused one within float16's tolerance? If not, which of
# the two is nearer a float64 computation of the same graph?

# %%
from dataclasses import replace

from fusionlab.blame import blame_ort
from fusionlab.commands.blame import ort_lines

ln16 = zoo.offset_layernorm()  # float16, rows of mean 100 and spread 0.1
found = blame_ort(ln16, level="all", shrink_budget=None, time_budget=0.3, rounds=7)
for line in ort_lines(replace(found, cost=None), "offset_layernorm"):
    print(wrap(line))

# %% [markdown]
# The answer, read from the lines above: the outputs differ beyond float16's tolerance, one transformer is
# responsible, and the float64 reference says which result to trust. Here the *unfused* graph is the accurate one:
# it subtracts the mean before it squares. onnxruntime's CPU `LayerNormalization` kernel accumulates the sum and
# the sum of squares in one pass and takes the variance as E[x²] − E[x]² (in float32): with a mean of 100 and a
# spread of 0.1 the two terms are `100² + 0.1² = 10000.01` and `100² = 10000.00`, equal to six significant digits of float32's seven, so
# the subtraction keeps mostly rounding. (The "with it ... without it" line shows what runs instead: without
# LayerNormFusionL1 the graph keeps ReduceMean and Sub and a `SimplifiedLayerNormalization` takes over the rest of
# the pattern, and the error line shows that result within tolerance.)
# That is a property of the kernel, not of fusion as such; fusion is what routed the model onto that kernel.
#
# The fix blame prints is one line of session options. What it costs, measured (interleaved runs, the ratio
# with its 95% interval):

# %%
# NBVAL_IGNORE_OUTPUT
print(found.cost.table())
display(Markdown(f"Deploying without {', '.join(found.culprits)}: time at ALL with it over time without it "
                 f"{found.cost.speedup:.2f}× (95% CI {found.cost.ci_low:.2f}–{found.cost.ci_high:.2f}×), "
                 f"{found.cost.verdict()}."))

# %% [markdown]
# On the command line the same is `fusionlab blame model.onnx --level all`; it also shrinks the model to the
# smallest subgraph that still differs and writes it next to the input, a repro to attach to a bug report.
# `--only fusionlab` asks the same question of fusionlab's own passes (rule and group). Here is the shrink:

# %%
# NBVAL_IGNORE_OUTPUT
repro_dir = Path(tempfile.mkdtemp())
shrunk = blame_ort(ln16, level="all", shrink_budget=20, repro=repro_dir / "ln16.repro.onnx", rounds=3,
                   time_budget=0.1)
print(f"repro: {shrunk.repro.name}, {shrunk.repro_nodes[0]} -> {shrunk.repro_nodes[1]} nodes; still blamed on "
      f"{', '.join(shrunk.culprits)}")

# %% [markdown]
# ## 11. The seed's troubleshooting table (§4.2), checked
#
# The write-up ends its performance advice with a table of symptoms, causes and fixes. One row is right, one is
# plausible but not checkable here, one is vague, one fix is wrong, and the last is a rule of thumb. Here each row is set against what is true, and against the place in this workbook
# where you can see it happen.
#
# | symptom | the seed's cause → fix | what is true, and where it is shown |
# |---|---|---|
# | accuracy anomaly after fusion | "value range changed by fusion" → "add a normalisation layer" | Vague cause, wrong fix. The real causes are folding in fp16 (rounding, and overflow when $\gamma/\sqrt{\sigma^2+\epsilon}$ is large), a rewrite whose legality was not checked (BN in training mode, a second consumer), or a tolerance that is too strict for the depth of the network. Notebook `02` §4 shows the fp16 cases; §10 here finds the responsible optimisation with `fusionlab blame`; every fusion in this workbook is compared with the unfused model (`fusionlab.verify`). |
# | memory leak | "workspace not freed" → "use the `ACL_MEM_MALLOC_HUGE` flag" | The cause is right, the fix is not. `ACL_MEM_MALLOC_HUGE_FIRST` is an `aclrtMalloc` page policy: a block over 1 MB comes from huge pages while there are any ([AscendCL `aclrtMemMallocPolicy`](https://www.hiascend.com/document/detail/en/canncommercial/800/apiref/appdevgapi/aclcppdevg_03_1349.html)). It frees nothing. The fix for a leak is to pair every `aclrtMalloc` with `aclrtFree` and destroy datasets and buffers after use. Better still, allocate the workspace once and reuse it, as onnxruntime's arena does (§7). |
# | build failure | TBE / driver version mismatch | Plausible, not checked: no build fails here. The CANN toolkit, driver and firmware versions must match (compatibility tables in the CANN release notes), and `--soc_version` must name the chip exactly (`Ascend310P3`, `Ascend910B4`, ...), but we found no documented case of a TBE version mismatch breaking an operator build. Notebook `12` generates the package and the `atc` command with that parameter. |
# | slower after fusion | bad fusion strategy → analyse with msprof | Right: fusion can make a model slower. Notebook `05` §6 measures it (horizontally fused Inception is slower than the original once onnxruntime optimises both), and notebook `07` §5 shows, with the over-fusion curve, that in the cost model bigger groups are not the cause on YOLOv5 or BERT (latency falls with group size, then flattens: no group outgrows a core's UB). Profile before and after (§5 here, with the profiler's own cost in mind, §3); switch off a single CANN fusion pass with a `fusion_switch.cfg` (notebook `12`). |
# | custom op with more than 5 basic ops on Atlas 800I A2 | split it | A rule of thumb for one device. Notebooks `06` and `07` make it a parameter (`max_group_ops`) beside the UB budget. The cost model does not support it on YOLOv5 or BERT: its minimum is at the largest group TVM's rules form, and a limit of 5 makes BERT slower in the cost model (notebook `07` §5 prints by how much). |

# %% [markdown]
# The ledger's verdict on each row, with the evidence it cites (`docs/seed_claims.md`):

# %%
for cid in ("s42-accuracy-anomaly", "s42-memory-leak", "s42-build-failure", "s42-slower-after-fusion",
            "s42-split-above-5-ops"):
    c = seed_claims.claim(cid)
    print(f"{c.says}\n  -> {c.verdict}; shown in {c.where_shown()}")

# %% [markdown]
# ## Summary
#
# - A profile answers "where does the time go?" per kernel, with the gaps between kernels; the profiler costs time
#   of its own (§3), so measure what a change saves with it off.
# - The seed's three fixes, measured: fusion removes kernels and gaps, parallel branches do not run in parallel on
#   this CPU (onnxruntime ≥ 1.14), preallocation is already the default, and §8 shows what threads do to utilisation.
# - When a fusion changes the answer, `fusionlab blame` names the graph transformer that did it (§10).
#
# ## Exercises
#
# The exercises check themselves: write your answer in the cell under each task, run it, then run the `check` cell.
# `check` grades it at once on hidden cases and prints PASS with what it checked, or FAIL with a hint naming the
# first case your answer gets wrong and the mistake it looks like. The notebook is stored unanswered; reference
# answers are in the repository's `solutions/` folder, outside the notebooks (try first).
#
# **Exercise 1: the time with no kernel running.** Write `idle_us(run_us, ops)`: the microseconds of a run of
# `run_us` during which no kernel ran, given its kernels as `Profile.ops()` returns them (`start_us` from the run's
# start, `dur_us`, `end_us`, `lane`, `wait_us`): the last figure of §2's op table (try it on `before`). The hidden
# runs include back-to-back kernels, kernels overlapping on two lanes (parallel branches on two streams, the
# seed's fix of §6), one kernel inside another, a long kernel outlasting the one that starts last, and a late
# first kernel.

# %%
def idle_us(run_us, ops):
    """Microseconds of the run during which no kernel was running."""
    ...  # your code here


# %%
exercises.idle.check(idle_us)

# %% [markdown]
# **Exercise 2: utilisation of one chip.** Write `utilisation(flops, nbytes, seconds, device)` returning
# `(compute, bandwidth)`: the seed's two utilisation figures (§8), as fractions, for a run that did `flops` FLOPs
# and moved `nbytes` bytes in `seconds`, on one chip of `device`, a preset as `devices.load_devices()` gives it,
# at the fp16 peak (§9). The hidden runs include the 300I Duo's preset (the whole card) and a preset that also
# lists an fp32 peak.

# %%
def utilisation(flops, nbytes, seconds, device):
    """(compute utilisation, bandwidth utilisation) of the run on one chip of `device`, as fractions."""
    ...  # your code here


# %%
exercises.utilisation.check(utilisation)
