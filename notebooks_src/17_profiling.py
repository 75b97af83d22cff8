# %% [markdown]
# # 17 · Profiling a fused model: where the time goes, and which optimisation changed the answer
#
# **What you will be able to do**
#
# - profile an ONNX model with onnxruntime and read it the way msprof's `op_summary` is read on Ascend (op, type,
#   start, duration, the launch gap before each op), knowing what the profiler itself costs;
# - draw a timeline and write a trace for Perfetto, and see what fusion changes in a profile;
# - find with `fusionlab blame` which of onnxruntime's graph transformers changed an answer, and what switching it
#   off costs.
#
# Notebook 18 applies the seed's three fixes, mostly to the same two models. **What is measured here:** everything runs on
# this machine's CPU with onnxruntime; the seed's profiles come from msprof on Ascend hardware, which we do not
# have, so §2 sets msprof's table beside ours. Cells whose output is a timing are marked `NBVAL_IGNORE_OUTPUT`:
# timings differ from run to run, so the prose never quotes a number; the code prints them and the verdicts.

# %%
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
from IPython.display import Markdown, display

import fusionlab
from fusionlab import exercises, profile, seed_claims, zoo
from fusionlab.blame import blame_ort
from fusionlab.commands.blame import ort_lines
from fusionlab.cost import calibrate
from fusionlab.passes import fuse
from fusionlab.text import wrap
from fusionlab.timing import compare
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
# measured with the profiler off, as notebook 18 §1 does.
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
# Zoomed in, the white gaps between kernels show. In this block of the original, every Conv is followed by three
# short kernels (BatchNormalization, Sigmoid, Mul), each with a gap before it; in the fused model's, each Conv is
# followed by one (`QuickGelu`, onnxruntime's x·sigmoid(αx) kernel, here with α = 1: SiLU).

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
# ## 6. When a fusion changes the answer: `fusionlab blame`
#
# A faster fused model is worth nothing if its answer changed (§1 checked the detector's). The seed's first
# troubleshooting row (notebook 18 §5 checks the whole table) is an accuracy anomaly after fusion. Before guessing
# at a cause, find *which* optimisation changed the outputs. `fusionlab blame` runs the model unoptimised
# (DISABLE_ALL) and at the level you deploy, compares the two with the dtype's tolerance, and, if they differ,
# bisects onnxruntime's `disabled_optimizers` until one graph transformer is left.
#
# The model, built in code (`zoo.offset_layernorm()`, whose defaults are `offset=100.0` and `spread=0.1`):
# float16 rows whose mean is large next to their spread, through a LayerNorm written out as exporters write it
# (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add), then Relu. At BASIC level onnxruntime fuses those nine ops into one
# `LayerNormalization`.
#
# **Predict first:** will the fused model agree with the unfused one within float16's tolerance? If not, which of
# the two is nearer a float64 computation of the same graph?

# %%
from dataclasses import replace

ln16 = zoo.offset_layernorm()  # float16, rows of mean 100 and spread 0.1
found = blame_ort(ln16, level="all", shrink_budget=None, time_budget=0.3, rounds=7)
for line in ort_lines(replace(found, cost=None), "offset_layernorm"):
    print(wrap(line))

# %% [markdown]
# The answer, read from the lines above: the outputs differ beyond float16's tolerance, one transformer is
# responsible, and the float64 reference says which result to trust. Here the *unfused* graph is the accurate one:
# it subtracts the mean before it squares. onnxruntime's CPU `LayerNormalization` kernel accumulates the sum and
# the sum of squares in one pass and takes the variance as E[x²] − E[x]² (in float32): with `offset=100.0` and
# `spread=0.1` the two terms are `100² + 0.1² = 10000.01` and `100² = 10000.00`, equal to six significant digits of float32's seven, so
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
# ## Summary
#
# - A profile answers "where does the time go?" per kernel and per op type, with the gaps between kernels (§2,
#   §5); the profiler costs time of its own (§3), so what a change saves is measured with it off (notebook 18).
# - Fusion shows in a profile as fewer kernels, so fewer gaps: the timeline (§4) and the side-by-side table (§5)
#   show the BatchNormalization, Sigmoid and Mul kernels gone and `QuickGelu` in their place.
# - When a fusion changes the answer, `fusionlab blame` bisects onnxruntime's graph transformers down to the one
#   that did it, sets both results against a float64 reference, and measures what switching it off costs (§6).
#
# ## Exercises
#
# The exercises check themselves: write your answer in the cell under each task, run it, then run the `check` cell.
# `check` grades it at once on hidden cases and prints PASS with what it checked, or FAIL with a hint naming the
# first case your answer gets wrong and the mistake it looks like. The notebook is stored unanswered; reference
# answers are in the repository's `solutions/` folder, outside the notebooks (try first).
#
# **Exercise 1: the time with no kernel running.** Write `idle_us(run_us, ops)`: the microseconds of a run of
# `run_us` during which no kernel ran, given its kernels as `Profile.ops()` returns them (`OpEvent`s with
# `op_type`, `start_us` from the run's start, `dur_us`, `end_us`, `lane`, `wait_us`): the last figure of §2's op
# table (try `idle_us(before.run_us, before.ops())`). The hidden runs include back-to-back kernels, kernels
# overlapping on two lanes (parallel branches on two streams, the seed's fix of notebook 18 §1), one kernel inside
# another, a long kernel outlasting the one that starts last, and a late first kernel.

# %%
def idle_us(run_us, ops):
    """Microseconds of the run during which no kernel was running."""
    ...  # your code here


# %%
exercises.idle.check(idle_us)

# %% [markdown]
# **Exercise 2: the op type where the time goes.** Write `top_op_type(ops)` returning `(op_type, share)`: the op
# type whose kernels take the most time in one run, and that time as a fraction of the time in kernels (the sum of
# every kernel's duration: §2's Share column, summed per type), given the run's kernels as `Profile.ops()` returns
# them (each `e` has `e.op_type` and `e.dur_us`; try it on `before.ops()`; §5 prints medians over all runs, so
# expect close, not equal). The hidden runs include many short kernels outweighing one long one, a frequent but
# cheap type, long gaps, and two lanes.

# %%
def top_op_type(ops):
    """(the op type with the most kernel time, its share of the time in kernels as a fraction)."""
    ...  # your code here


# %%
exercises.hotspot.check(top_op_type)
