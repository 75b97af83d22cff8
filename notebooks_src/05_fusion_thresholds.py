# %% [markdown]
# # 05 · When to stop fusing: a cost model and the threshold explorer
#
# **What you will learn**
#
# 1. how a **roofline cost model** predicts a fusion plan's latency and peak memory on a device, from
#    shapes alone: FLOPs and bytes per kernel, launch overhead, spills when a group outgrows the on-chip
#    buffer, and memory liveness over the execution order;
# 2. what device figures the Ascend presets use, where they come from, and which ones are uncertain;
# 3. how well the model predicts the speedups we measure on this CPU, with the error shown;
# 4. why "fuse as much as possible" is not the rule: the curve of cost against group size, and the
#    mechanism by which over-fusion can *raise* peak memory.
#
# What elementwise fusion buys when it *really* runs fused (a generated one-pass loop against onnxruntime's
# unfused kernels, in bytes and GB/s) is notebook 06.
#
# The seed reports two numbers this notebook is about: "over-fusion raised peak device memory by 15–20 %
# on an Atlas 800T" and "on Atlas 800I A2, split custom ops of more than 5 basic ops". We have no Ascend
# hardware. Everything said about Ascend devices here is a **prediction of the model** from published
# specifications, not a measurement; what this machine measures is shown next to it.

# %%
import matplotlib.pyplot as plt
import numpy as np

import fusionlab
from fusionlab import cost, runtime, seed_claims, timing, widgets, zoo
from fusionlab.cost import calibrate, devices
from fusionlab.passes import fuse, options_for

print(seed_claims.claim("s42-split-above-5-ops").summary())

# %% [markdown]
# ## 1. The devices
#
# Four Ascend presets come from `data/devices.json`, each with a source note that points to the
# reference notes (`cann_facts.md` §3.3 for on-chip buffers, §4 for device specifications). A `?` marks a
# figure that is derived, disputed or assumed. Two matter most below:
#
# * **launch overhead** (5 µs on every Ascend preset) is an assumption: no published per-task figure
#   exists in our references. On real hardware, msprof's *Task Wait Time* measures it. Most predicted
#   gains for small models come from launches, so treat them as "if launches cost 5 µs".
# * The Ascend cube unit runs fp32 models as fp16 (ATC's default for inference), so these presets cost
#   float tensors at 2 bytes and use the fp16 peak.

# %%
print(devices.devices_table())

# %% [markdown]
# "This machine" is not a preset: `devices.this_machine()` measures it with `fusionlab.cost.calibrate`, which
# defines each quantity once for every notebook:
#
# * **bandwidth**: DRAM streaming bandwidth, the better of a copy and an add over fp32 arrays of at least four
#   times the last-level cache (smaller arrays stay partly in the cache and read high);
# * **launch**: what one more node costs onnxruntime with the profiler off (a chain of tiny ops, per op). A
#   profile shows larger gaps between kernels, because the profiler adds its own cost per kernel (notebook 10 §3
#   measures both);
# * **peak**: single-thread numpy fp32 matmul.
#
# Its numbers vary from run to run.

# %%
# NBVAL_IGNORE_OUTPUT
me = devices.this_machine()
print(devices.devices_table([me]))
print(calibrate.calibrate(quick=True).summary())

# %% [markdown]
# ## 2. The roofline, one node at a time
#
# Each kernel takes `max(FLOPs / peak, bytes / bandwidth) + launch overhead`. Whether compute or memory
# wins depends on the **arithmetic intensity** (FLOPs per byte) against the device's *ridge point*
# (peak / bandwidth: ≈ 342 FLOP/B for an Atlas 300I Pro). A big MatMul sits far right of the ridge; an
# elementwise Add does one FLOP per 6 bytes (fp16) and can only ever be memory-bound. That is why
# elementwise ops are the first candidates for fusion: their cost *is* their traffic.
#
# **Predict before you run the next cell:** the Relu below reads and writes 4096 × 4096 fp16 values, 32 MiB each
# way, on an Atlas 300I Pro's 204.8 GB/s. How long does it take, before the launch overhead is added?

# %%
from onnx import helper

from fusionlab.build import make_model, value_info

n = 4096
toy = fusionlab.load(make_model(
    [helper.make_node("MatMul", ["a", "b"], ["c"], name="matmul"),
     helper.make_node("Add", ["c", "a"], ["d"], name="add"),
     helper.make_node("Relu", ["d"], ["y"], name="relu")],
    [value_info("a", np.float32, [n, n]), value_info("b", np.float32, [n, n])],
    [value_info("y", np.float32, [n, n])]))
pro = devices.get("Atlas 300I Pro")
toy_cost = cost.plan_cost(toy, None, pro)
for c, k in zip(cost.node_costs(toy, precision="fp16"), toy_cost.kernels_detail):
    print(f"{c.name:<7} {c.flops / 1e6:>9.1f} MFLOP {c.bytes / 2**20:>6.1f} MiB  "
          f"intensity {c.flops / c.bytes:>7.1f} FLOP/B  -> {k.bound}-bound, {k.time_s * 1e6:.1f} us")
print(f"ridge point of {pro.name}: {pro.ridge_flop_per_byte:.0f} FLOP/B")

# %% [markdown]
# The answer for the Relu: 2 × 32 MiB ÷ 204.8 GB/s = 328 µs, plus the assumed 5 µs launch, the 333 µs printed
# above. The MatMul's 1365 FLOP/B puts it far to the right of the ridge; the Add and the Relu, at 0.2 FLOP/B,
# far to the left.

# %%
fig, ax = plt.subplots(figsize=(6.5, 3.6))
xs = np.logspace(-1, 4, 200)
for dev, style in ((pro, "-"), (devices.get("Atlas 800I A2"), "--")):
    ax.loglog(xs, np.minimum(dev.peak_flops("float16"), xs * dev.bandwidth) / 1e12, style, label=dev.name)
for c in cost.node_costs(toy, precision="fp16"):
    ai = c.flops / c.bytes
    ax.plot([ai], [min(pro.peak_flops("float16"), ai * pro.bandwidth) / 1e12], "o")
    ax.annotate(c.name, (ai, min(pro.peak_flops("float16"), ai * pro.bandwidth) / 1e12),
                textcoords="offset points", xytext=(5, -12))
ax.set_xlabel("arithmetic intensity (FLOP/byte)")
ax.set_ylabel("attainable TFLOP/s")
ax.set_title("Roofline (fp16, published peaks)")
ax.legend(loc="lower right")
fig.tight_layout()

# %% [markdown]
# Fusing `Add` and `Relu` into the MatMul removes the traffic of the intermediate results: the group reads
# `a`, `b` once and writes `y` once. The model counts exactly that:

# %%
from fusionlab.plan import FusionGroup, FusionPlan

group = FusionPlan([FusionGroup("g0", "mixed", "hand", ["matmul", "add", "relu"], ["MatMul", "Add", "Relu"])])
fused_cost = cost.plan_cost(toy, group, pro)
print(f"unfused: {toy_cost.kernels} kernels, {toy_cost.bytes_moved / 2**20:.1f} MiB, {toy_cost.latency_s * 1e6:.1f} us")
print(f"fused:   {fused_cost.kernels} kernel,  {fused_cost.bytes_moved / 2**20:.1f} MiB, {fused_cost.latency_s * 1e6:.1f} us")

# %% [markdown]
# ## 3. A plan's cost on every device
#
# Now a real network: a YOLOv5s-style detector (width ×0.25, 320×320 input) exported the way `torch.onnx`
# does. We make a plan per fusion kind and cost each on every preset. The speedup is relative to the
# unfused model on the same device.

# %%
yolo = fusionlab.load(zoo.get("yolov5s", image_size=320, width_mult=0.25, depth_mult=0.33))
plans = {"unfused": None}
for kind in ("vertical", "horizontal", "mixed"):
    plans[kind] = widgets.make_plan(yolo, (kind,), max_group_ops=5)
    print(f"{kind:<10} {len(plans[kind]):>3} groups, {sum(g.size for g in plans[kind]):>3} nodes fused")
print(cost.compare(yolo, plans).table())

# %% [markdown]
# Per group, the model shows what fusion saves (MiB unfused → fused), the group's working set, and what
# limits it. It predicts that on the Atlas 300I Pro most groups are **launch-bound**: at 320×320 and batch 1,
# the assumed 5 µs launch costs more than moving the group's data. That is why the launch figure matters so
# much.

# %%
print(wrap(cost.plan_cost(yolo, plans["vertical"], "Atlas 300I Pro").table(max_rows=8)))

# %% [markdown]
# ## 4. Predicted against measured, on this CPU
#
# The only device we can measure is this one. For each fusion kind we fuse the model, verify it against
# the original (onnxruntime, optimisations off), time both interleaved (one thread), and compare with the
# speedup the model predicts for `this machine`. Two things to expect:
#
# * **vertical** groups become real onnxruntime kernels (folded Conv+BN, `FusedConv` with the activation),
#   so the measured speedup is real;
# * **mixed** groups become ONNX local functions. onnxruntime *inlines* functions when it loads the model,
#   so at run time nothing is fused and the measured speedup is about 1×. The model predicts what a
#   backend with a fused kernel would get. The gap is not a model error: on this CPU, nothing runs the
#   fused kernel.

# %%
# NBVAL_IGNORE_OUTPUT
rows = []
for name, model in (("resnet_small", fusionlab.load(zoo.get("resnet_small"))), ("yolov5s/320", yolo)):
    for kind in ("vertical", "horizontal", "mixed"):
        result = fuse(model, passes=[kind], **options_for([kind], max_group_ops=5))
        if not len(result.plan):
            rows.append((name, kind, 0, float("nan"), float("nan")))
            continue
        assert runtime.verify(model, result.graph).ok
        predicted = cost.predicted_speedup(model, result.plan, me)
        measured = timing.compare_models(model, result.graph, min_time=0.5).speedup
        rows.append((name, kind, len(result.plan), predicted, measured))
print(f"{'model':<13} {'kind':<10} {'groups':>6} {'predicted':>9} {'measured':>8} {'error':>7}")
for name, kind, groups, p, m in rows:
    if not groups:
        print(f"{name:<13} {kind:<10} {groups:>6} {'-':>9} {'-':>8} {'-':>7}  (nothing to fuse)")
        continue
    print(f"{name:<13} {kind:<10} {groups:>6} {p:>8.2f}x {m:>7.2f}x {(p - m) / m:>+7.0%}")

# %% [markdown]
# Read the error column with the model's assumptions in mind. It charges every unfused intermediate at
# DRAM bandwidth, although on a CPU small tensors stay in the L2/L3 cache. It ignores what onnxruntime's
# kernels do inside, for example im2col buffers in convolutions. The launch cost is one number for every
# op. A model that is off by tens of percent can still rank plans correctly. That is what the explorer
# uses it for.
#
# ## 5. The trade-off: cost against group size
#
# The mixed pass groups ops TVM-style and stops a group at `max_group_ops`. Sweeping that limit gives the
# curve behind "fusion is not always better". We use the 640×640 detector on an Atlas 300I Pro twice:
#
# * with the whole chip as on-chip buffer ((256 KiB UB + 1 MiB L1) × 8 cores = 10 MiB);
# * with a single core's UB (256 KiB) as the budget. This is closer to one kernel that keeps every
#   intermediate of the group on one core at once.

# %%
yolo640 = fusionlab.load(zoo.get("yolov5s", image_size=640, width_mult=0.25, depth_mult=0.33))
sizes = (1, 2, 3, 4, 5, 6, 8)
whole_chip = widgets.sweep_group_size(yolo640, sizes, "Atlas 300I Pro")
one_core = widgets.sweep_group_size(yolo640, sizes, "Atlas 300I Pro", chip_buffer_kb=256)
print("on-chip buffer: whole chip (10 MiB)")
print(widgets.sweep_table(whole_chip))
print("\non-chip buffer: one core's UB (256 KiB)")
print(widgets.sweep_table(one_core))

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
widgets.plot_sweep(whole_chip, ax=axes[0], title="10 MiB on chip: fusion keeps paying")
widgets.plot_sweep(one_core, ax=axes[1], title="256 KiB on chip: spills, peak memory up")
fig.tight_layout()

# %% [markdown]
# **The mechanism, as the model predicts it.** Two things can make a fused kernel hold *more* memory than
# the ops it replaces:
#
# 1. **Spill workspace.** A group keeps its intermediates on chip. When the largest set that is live at
#    once (its *working set*) exceeds the buffer, the excess goes to device memory as a workspace. The
#    workspace lives for the whole kernel, *together with* the group's inputs and outputs. Unfused, the
#    same tensors would have been allocated and freed one op at a time.
# 2. **Longer lifetimes.** A fused kernel needs all its inputs and all its outputs at the same time.
#    Unfused, a large input can be freed before a large output is allocated.
#
# With the 256 KiB budget, groups of four or more ops spill. The predicted peak memory then rises above
# the unfused model's (`peak_vs_unfused` > 1), by a margin of the same order as the seed's 15–20 %, while
# latency still falls, because launches dominate at this size. With the whole chip's 10 MiB nothing
# spills, and fusion lowers both. So the model does **not** say "over-fusion raises memory by 15–20 %" as a
# fact. It says when it would happen: when groups outgrow the buffer their kernel can use. Splitting such
# a group (a lower `max_group_ops`, or the mixed pass's `buffer_kb` budget) trades a launch for a smaller
# workspace. The seed's "split above 5 ops" rule is one fixed point on this curve.
#
# ## 6. The explorer
#
# The widget below wires the same functions to controls: max ops per group, the mixed pass's UB budget,
# the fusion kinds, the device. A button measures the fused model on this CPU. It needs a live kernel; in
# a static view of the notebook only the controls' text shows.

# %%
# NBVAL_IGNORE_OUTPUT
resnet = fusionlab.load(zoo.get("resnet_small"))
box = widgets.explore(resnet)

# %% [markdown]
# The widget is a thin layer: each setting calls `widgets.explore_state`, which you can call directly.
# Here is one setting, printed, so the numbers above can be checked:

# %%
state = widgets.explore_state(resnet, max_group_ops=3, kinds=("vertical", "mixed"), device="Atlas 800I A2")
print(wrap(state.summary()))
print(state.plan.table(max_rows=5))

# %% [markdown]
# ## Summary
#
# * The cost model turns shapes into FLOPs and bytes per node, and a plan into kernels, each with a
#   roofline time plus a launch. Intermediates inside a group cost nothing until they outgrow the on-chip
#   buffer; then they spill, adding traffic and a workspace.
# * Peak memory comes from liveness over the execution order. Fusion usually *lowers* it, because
#   intermediates are never written. It raises it when groups spill or hold large inputs and outputs
#   together. That is the mechanism behind the seed's "over-fusion raised peak memory 15–20 %", shown
#   here as a prediction, not a measurement.
# * Saved bytes are only collected by a kernel that really makes one pass over memory, such as the
#   generated loop of notebook 06.
# * The Ascend numbers are predictions from published specs, with an assumed launch overhead. On this
#   CPU the model's predicted speedups are checked against measurement, with the error shown.
#
# **What to try next**
#
# * In the explorer, lower the UB budget and watch groups split; switch between the 300I Pro and the
#   800I A2 (less UB per core, more bandwidth).
# * Change `launch_overhead_us` of a preset (copy `data/devices.json`, then `devices.load_devices(path)`)
#   and see how much of the predicted gain was launches.
# * `fusionlab explain model.onnx --device "Atlas 800I A2" --max-group-ops 3` prints the same tables for
#   any model.
