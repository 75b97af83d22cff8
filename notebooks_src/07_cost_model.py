# %% [markdown]
# # 07 · What fusion buys, predicted: a roofline cost model for devices we do not have
#
# **What you will be able to do**
#
# 1. predict a fusion plan's latency and peak memory on a device from shapes alone, with a **roofline cost model**
#    (FLOPs and bytes per kernel, the kernels each lowering launches, memory liveness);
# 2. size a fused kernel's on-chip working set **in tiles**, with the model the mixed pass of notebook 06 uses;
# 3. read the Ascend presets: which figures they use, where they come from, which are uncertain;
# 4. cost a network's fusion plans on every preset, and say what limits each fused group (launches, memory or
#    compute).
#
# What elementwise fusion buys when it *really* runs fused (a generated one-pass loop against onnxruntime's
# unfused kernels, in bytes and GB/s) is notebook 01. Notebook 08 uses this model to ask when fusing more stops
# paying, and checks it against what onnxruntime measures on this CPU.
#
# We have no Ascend hardware. Everything said about Ascend devices here is a **prediction of the model** from
# published specifications, not a measurement.

# %%

import matplotlib.pyplot as plt
import numpy as np

import fusionlab
from fusionlab import cost, exercises, widgets, zoo
from fusionlab.analysis import working_set
from fusionlab.cost import calibrate, devices
from fusionlab.passes import mixed
from fusionlab.text import wrap
from IPython.display import Markdown, display

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
# * The presets assume that an fp32 model runs on the cube unit as fp16 (what we take ATC's default precision
#   for inference to be; our references do not document that default, so treat it as unverified), so they cost
#   float tensors at 2 bytes and use the fp16 peak.

# %%
print(devices.devices_table())

# %% [markdown]
# "This machine" is not a preset: `devices.this_machine()` measures it with `fusionlab.cost.calibrate`, which
# defines each quantity once; notebook 17 §3 and notebook 18 §3 read the same function, so the three notebooks quote
# the same quantities (each run measures them again, so the figures below vary from run to run):
#
# * **bandwidth**: DRAM streaming bandwidth, the better of a copy and an add over fp32 arrays of at least four
#   times the last-level cache (smaller arrays stay partly in the cache and read high);
# * **launch**: what one more node costs onnxruntime with the profiler off (a chain of tiny ops, per op). A
#   profile shows larger gaps between kernels, because the profiler adds its own cost per kernel (notebook 17 §3
#   measures both);
# * **peak**: single-thread numpy fp32 matmul.

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
relu_cost = cost.node_costs(toy, precision="fp16")[-1]
print(f"relu by hand: 2 x {relu_cost.bytes / 2 / 2**20:.0f} MiB / {pro.mem_bandwidth_gbs:g} GB/s = "
      f"{relu_cost.bytes / pro.bandwidth * 1e6:.0f} us, plus a {pro.launch_overhead_us:g} us launch")

# %% [markdown]
# The answer for the Relu: 2 × 32 MiB ÷ 204.8 GB/s = 328 µs (the last line above), plus the assumed 5 µs launch: the 333 µs printed
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
# Now fuse `Add` and `Relu` into the MatMul. The intermediates `c` and `d` never leave the chip: the fused
# kernel computes a tile of `c`, adds the matching tile of `a`, applies the Relu and writes that tile of `y`.
#
# **Predict:** unfused, the three kernels move 256 MiB (96 + 96 + 64). How many MiB does the fused kernel move?

# %%
from fusionlab.plan import FusionGroup, FusionPlan

group = FusionPlan([FusionGroup("g0", "mixed", "hand", ["matmul", "add", "relu"], ["MatMul", "Add", "Relu"])])
fused_cost = cost.plan_cost(toy, group, pro)
print(f"unfused: {toy_cost.kernels} kernels, {toy_cost.bytes_moved / 2**20:.1f} MiB, {toy_cost.latency_s * 1e6:.1f} us")
print(f"fused:   {fused_cost.kernels} kernel,  {fused_cost.bytes_moved / 2**20:.1f} MiB, {fused_cost.latency_s * 1e6:.1f} us")
(k,) = fused_cost.kernels_detail
for b in k.buffers.transfers():
    print(f"  {b.key}: {b.bytes / 2**20:.0f} MiB, {'to the cube through L1' if b.role == 'l1' else 'through the UB'}"
          f"{' (written)' if b.role == 'out' else ''}")

# %% [markdown]
# 128 MiB, not 96: each external tensor is read once *per path*. `a` is an operand of the MatMul, which reads it
# in panels through L1 into the cube unit, and an operand of the `Add`, which needs the tile of `a` that matches
# the output tile, through the Unified Buffer into the vector unit. Those are different tiles and different
# buffers, so `a` travels twice. Nothing else is charged: no intermediate is written, nothing "spills". For a
# group of elementwise ops alone (no cube operand), the bytes are exactly the group's external reads plus its
# writes; `tests/test_cost.py` checks that to the byte.
#
# ## 3. The working set, in tiles
#
# A fused kernel does not hold whole tensors on chip. It streams them through each AI core's Unified Buffer
# (UB) in **tiles**, as the canonical Ascend C kernel does (`TQue<..., BUFFER_NUM=2>`, `tileLength`;
# `cann_facts.md` §3.2). `fusionlab.analysis.working_set` is the one model of that, used by the mixed pass to decide
# whether a group fits (notebook 06 §5) and by the cost model to price it:
#
# * a tensor read from or written to device memory through the UB takes **two** tiles (double buffering: the
#   copy of tile *i + 1* overlaps the compute on tile *i*);
# * an intermediate takes **one** tile, from the op that makes it to its last reader in the group;
# * Conv/MatMul operands travel through L1 to the cube, not through the UB; their output tile lands in the UB
#   for the epilogue.
#
# Tiles of 16 KiB are the efficient size: Huawei's Ascend C best-practice guide says that transfers of more
# than 16 KB reach the best bandwidth ([*Transferring a Large Data Block at a Time*](https://www.hiascend.com/document/detail/en/canncommercial/800/opdevg/ascendcbestP/atlas_ascendc_best_practices_10_0013.html),
# `atlas_ascendc_best_practices_10_0013`). The cost model gives each kernel the largest tile that fits one
# core's UB; if that is below 16 KiB, its transfers are slower. How much slower is **modelled**: a fixed cost per
# transfer, chosen so that a 16 KiB transfer spends a tenth of its time on it (the guide shows a curve of this shape
# but publishes no numbers for it). The device's published bandwidth is taken as what transfers of 16 KiB or more
# reach, so the table below reads 100.0 % from 16 KiB up and falls below it: 90.9 % at 8 KiB.

# %%
sizes_kib = np.array([0.5, 1, 2, 4, 8, 16, 32, 64])
eff = [working_set.transfer_efficiency(int(s * 1024)) for s in sizes_kib]
for s, e in zip(sizes_kib, eff):
    print(f"transfer of {s:>4g} KiB: {e:5.1%} of the bandwidth (modelled)")
fig, ax = plt.subplots(figsize=(6, 3))
ax.semilogx(sizes_kib, eff, "o-", base=2)
ax.axvline(16, color="grey", ls=":", label="16 KB: 'best bandwidth' (Ascend C best practices)")
ax.set_xlabel("bytes per transfer (KiB)")
ax.set_ylabel("share of bandwidth (modelled)")
ax.legend(loc="lower right")
fig.tight_layout()

# %% [markdown]
# One YOLOv5 group, Conv + BN + Sigmoid + Mul + the residual Add, as the mixed pass forms it. **Predict:** how
# many 16 KiB tiles does it hold at once? Count two for the residual input, two for the output, and one for each
# intermediate that is live while the next op runs.

# %%
yolo = fusionlab.load(zoo.get("yolov5s", image_size=320, width_mult=0.25, depth_mult=0.33))
yolo_mixed = mixed.plan(yolo, max_group_ops=5)
g5 = next(g for g in yolo_mixed if g.size == 5)
print(g5.pattern, f"-> working set at 16 KiB tiles: {mixed.working_set(yolo, g5.nodes):.1f} KiB (mixed pass, fp32)")
k5 = {k.id: k for k in cost.plan_cost(yolo, yolo_mixed, pro, precision="fp32").kernels_detail}[g5.id]
print(f"the cost model, same group:           {k5.working_set / 1024:.1f} KiB")
tiles5 = {}
for dev in devices.load_devices().values():
    k = {k.id: k for k in cost.plan_cost(yolo, yolo_mixed, dev).kernels_detail}[g5.id]
    tiles5[dev.name] = k
    print(f"{dev.name:<28} UB {dev.ub_kb:>4g} KiB: tile {k.tile / 1024:6.1f} KiB, transfers x{k.transfer_factor:.2f}")
account5 = mixed.working_set_detail(yolo, g5.nodes)
print(wrap("what fills it (fusionlab.analysis.working_set, the function both call): "
           + account5.describe(int(working_set.DEFAULT_TILE_KB * 1024))))

# %%
rows5 = account5.account(int(working_set.DEFAULT_TILE_KB * 1024))
full5 = sum(c for b, c, _ in rows5 if b.bytes >= working_set.DEFAULT_TILE_KB * 1024)
small_tiles = min(k.tile for k in tiles5.values()) / 1024
display(Markdown(
    f"{full5} tiles, counted in the last line above, which comes from the same function as the totals: the "
    f"intermediates that are live at once (every output kept on chip until its last reader in the group has run, "
    f"so the BN's output, read by the Sigmoid *and* the Mul, is still live when the Mul writes its own) take one "
    f"tile each, the residual input and the group's output two each, and the BN's per-channel parameters are "
    f"smaller than a tile. The mixed pass and the cost model compute the same number because they call the "
    f"same function (`tests/test_working_set.py` checks it on every group of this model). It fits every preset's "
    f"UB with room to spare, so its tiles (the largest that fit, at fp16: {small_tiles:.1f} KiB or more) stay above "
    f"16 KiB and its transfers run at nearly the full bandwidth: what the factor adds (up to "
    f"x{max(k.transfer_factor for k in tiles5.values()):.2f}) is the BN's tiny parameter tensors, which move in small "
    f"transfers whatever the tile. Keep this in mind for notebook 08 §1."))

# %% [markdown]
# ## 4. A plan's cost on every device
#
# Now the whole network: YOLOv5's architecture at YOLOv5n's size (`width_mult=0.25, depth_mult=0.33`: the
# multipliers of YOLOv5n, not of YOLOv5s), 320×320 input, exported the way `torch.onnx`
# does. We make a plan per fusion kind and cost each on every preset; the speedup is against the unfused model on
# the same device. A group costs the kernels its lowering launches: the vertical pass lowers Conv + BN + SiLU to
# `Conv` + onnxruntime's `QuickGelu`, **two** kernels (notebook 03 §3). A backend with a fused kernel for the whole
# chain (CANN's UB fusion, a custom op) launches **one**; `cost.one_kernel_per_group` costs the same plan that way.

# %%
plans = {"unfused": None}
for kind in ("vertical", "horizontal", "mixed"):
    plans[kind] = widgets.make_plan(yolo, (kind,), max_group_ops=5)
    print(f"{kind:<10} {len(plans[kind]):>3} groups, {sum(g.size for g in plans[kind]):>3} nodes in "
          f"{sum(g.kernels for g in plans[kind]):>3} kernels")
plans["vertical, 1 kernel"] = cost.one_kernel_per_group(plans["vertical"])
print(cost.compare(yolo, plans).table())
mixed_launched = cost.as_launched(plans["mixed"])
print(f"mixed as onnxruntime launches it (cost.as_launched), {pro.name}: "
      f"{cost.plan_cost(yolo, mixed_launched, pro).kernels} kernels, "
      f"{cost.predicted_speedup(yolo, mixed_launched, pro):.2f}x")

# %% [markdown]
# Read the vertical rows together. As lowered for onnxruntime (Conv + QuickGelu), the plan launches 142 kernels
# and the model predicts about 1.8× on every card; as one kernel per group, 85 kernels and 2.9–3.0×. The
# difference is 57 launches of an assumed 5 µs each, plus the Conv outputs QuickGelu still reads back. The
# "1 kernel" row is also what ATC does **by default**: its built-in passes are on unless switched off, it folds
# BatchNormalization into the Conv (`ConvBatchnormFusionPass`) and its UB fusion merges a Conv with the
# elementwise ops after it (`cann_facts.md` §6; that YOLOv5's SiLU, a Sigmoid and a Mul, is among the patterns
# it takes in is not in our references: unverified). So against a model converted by ATC with its defaults, a
# hand-written Conv+BN+SiLU custom op is predicted to gain nothing; its 2.9–3.0×
# is against a model with every op a kernel. Notebook 03 §7 puts the seed's 23 % against both baselines.
#
# The mixed row costs each group as one kernel, as a fusing backend runs it; its other kernels are the nodes no
# group took. The mixed pass emits each group as an ONNX function, which onnxruntime inlines: costed as onnxruntime
# launches it (`cost.as_launched`, the last line) the plan runs the unfused model's kernels and predicts no gain,
# which is what notebook 08 §2 measures.
#
# `peak MiB` is the model's **peak memory**: the weights, always resident, plus the most activation bytes live at
# once while the kernels run in order (a tensor lives from the kernel that writes it to the last kernel that reads
# it, and a fused kernel needs all its inputs and outputs at once). An intermediate a fused group keeps on chip is
# never written, so it adds nothing to the peak; notebook 08 §1 asks whether fusing more can raise the peak.
#
# Per group, the model shows what fusion saves (MiB unfused → fused), the group's UB footprint, the tile it uses
# and what limits it. On the Atlas 300I Pro most groups are **launch-bound** (the count under the table): at
# 320×320 and batch 1 the assumed 5 µs launch costs more than moving the group's data.

# %%
vertical_pro = cost.plan_cost(yolo, plans["vertical"], "Atlas 300I Pro")
print(vertical_pro.table(max_rows=6))
bounds = [k.bound for k in vertical_pro.groups()]
print(f"{bounds.count('launch')} of the {len(bounds)} groups launch-bound, {bounds.count('memory')} memory-bound, "
      f"{bounds.count('compute')} compute-bound")

# %% [markdown]
# ## Summary
#
# * A roofline cost model turns shapes into FLOPs and bytes per kernel (`max(FLOPs / peak, bytes / bandwidth)` plus
#   a launch), and a plan into the kernels its lowering launches; the Ascend figures are published specs, the
#   launch cost an assumption, this machine's figures a calibration.
# * On chip a fused kernel works in tiles: two for each tensor it moves, one for each live intermediate, counted by
#   the working-set model the mixed pass shares; tiles below 16 KiB make its transfers slower.
# * On YOLOv5 at 320×320 most fused groups are launch-bound on the Atlas 300I Pro, so how many kernels a group's
#   lowering launches (Conv + QuickGelu, or one kernel per group) moves the predicted speedup most.

# %% [markdown]
# ## Exercises
#
# The exercises check themselves: write your answer in the cell under each task, run it, then run the `check` cell.
# `check` grades it at once on hidden cases and prints PASS with what it checked, or FAIL with a hint naming the
# first case your answer gets wrong and the mistake it looks like. The notebook is stored unanswered; a reference
# answer is in the repository's `solutions/` folder, outside the notebooks (try first).
#
# **Exercise 1: a kernel's time on the roofline.** Write `kernel_time(flops, nbytes, device)`: the seconds the cost
# model predicts for one node run as its own kernel on a preset (a `devices.Device`), from its FLOPs and the bytes
# it moves (§2's rule; the presets run float models at fp16, §1). The hidden nodes, on four presets, include
# memory-, compute- and launch-bound ones and a MatMul at the ridge. Try yours on §2's Relu first
# (`relu_cost.flops`, `relu_cost.bytes`, `pro`).

# %%
def kernel_time(flops, nbytes, device):
    """Seconds one node takes as its own kernel on `device`, by the roofline."""
    ...  # your code here


# %%
exercises.roofline.check(kernel_time)

# %% [markdown]
# **Exercise 2: the working set in tiles.** Write `ub_bytes(members, tile)`: the UB bytes a fused group needs with
# tiles of `tile` bytes, by §3's rules, without calling `working_set`. `members` lists the group's ops in execution
# order, each a `working_set.Member`: `cube` (its reads go to the cube through L1), `reads` and `writes` (`(name,
# bytes)` of the tensors it reads from or writes to device memory) and `keeps` (`(name, bytes, position of the
# last reader)` of its intermediates). A tensor smaller than a tile takes its own bytes. §3's group is
# `mixed.working_set_members(yolo, g5.nodes)`, and §3 printed its answer at 16 KiB; the hidden groups also include
# a tensor read by two ops, LayerNorms and a chain of Adds, each bringing in one more input.

# %%
def ub_bytes(members, tile):
    """UB bytes of a fused group (its members in execution order) with tiles of `tile` bytes."""
    ...  # your code here


# %%
exercises.tiles.check(ub_bytes)
