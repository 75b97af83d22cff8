# %% [markdown]
# # 08 · When to stop fusing: the over-fusion curve and the threshold explorer
#
# **What you will be able to do**
#
# 1. sweep the mixed pass's `max_group_ops` and read the predicted over-fusion curve: latency and peak memory
#    against group size, and the three ways a larger group can cost more;
# 2. test the seed's "split above 5 ops" and "15–20 % more peak memory" against that curve;
# 3. tell when a group too large for the Unified Buffer is worth splitting;
# 4. compare the model's predicted speedups with what onnxruntime measures on this CPU, like with like, and
#    explore the thresholds with a widget.
#
# Notebook 07 built the cost model (the roofline per kernel, the working set in tiles, the device presets); this
# notebook uses it to ask when fusing more stops paying. The seed reports two numbers it is about: "over-fusion
# raised peak device memory by 15–20 % on an Atlas 800T" and "on Atlas 800I A2, split custom ops of more than 5
# basic ops". We have no Ascend hardware: everything said about Ascend devices here is a **prediction of the
# model** from published specifications; what this machine measures is shown next to it.

# %%
import matplotlib.pyplot as plt

import fusionlab
from fusionlab import cost, exercises, seed_claims, timing, widgets, zoo
from fusionlab.cost import devices
from fusionlab.lessons import overfusion
from fusionlab.passes import fuse, options_for
from fusionlab.text import wrap
from fusionlab.verification import runtime
from IPython.display import Markdown, display

# %% [markdown]
# ## 1. Does fusing more ever hurt? The over-fusion curve
#
# The mixed pass groups ops TVM-style and stops a group at `max_group_ops`. Sweeping that limit gives the curve
# behind "fusion is not always better". In this model three mechanisms can make a larger group cost more than the
# smaller groups it replaces:
#
# 1. **UB pressure.** A group that holds more tensors at once gets smaller tiles; below 16 KiB its transfers
#    waste bandwidth (notebook 07 §3). This bites when a group needs more than UB ÷ 16 KiB tiles: 16 on a 310P3 core
#    (256 KiB), 12 on a 910B core (192 KiB).
# 2. **Recompute.** With `allow_recompute`, a cheap op with several consumers is copied into each consumer's
#    group: it is computed, and its inputs read, once per copy.
# 3. **Longer lifetimes.** A fused kernel needs all its inputs and outputs at once, which can raise the peak of
#    live memory (the model's peak memory, defined under notebook 07 §4's table: weights plus the activations
#    live at once).
#
# Two real networks, the notebook 07 §4 detector at 640×640 and a BERT encoder (2 layers, hidden 256, sequence 128), on the Atlas
# 800I A2 preset (a 910B: the card of the seed's "split above 5 ops"), recompute allowed. In the tables, `ub KiB` is
# the largest group's UB footprint at 16 KiB tiles, `DMA x` how much longer the plan's transfers take than at full
# bandwidth (notebook 07 §3's "transfers x" factor, averaged over the bytes moved) and `peak vs unfused` the plan's
# peak memory over the unfused model's. **Predict:** where is the minimum of the latency curve, at 5 ops or beyond?

# %%
yolo640 = fusionlab.load(zoo.get("yolov5s", image_size=640, width_mult=0.25, depth_mult=0.33))
bert = fusionlab.load(zoo.get("bert", layers=2, hidden=256, heads=4, intermediate=1024, vocab=1000))
networks = {"YOLOv5 640": (yolo640, None), "BERT 2x256": (bert, {"batch": 1, "sequence": 128})}
limits = (1, 2, 3, 4, 5, 6, 7, 8, 12)
a2 = "Atlas 800I A2 (Ascend 910B)"
sweeps = {(net, a2): widgets.sweep_group_size(model, limits, a2, dims=dims, allow_recompute=True)
          for net, (model, dims) in networks.items()}
for (net, dev), rows in sweeps.items():
    print(f"{net} on the {dev}:")
    print(widgets.sweep_table(rows), end="\n\n")

# %%
print(f"{'network':<11} {'device':<27} {'best max ops':>12} {'at 5 ops':>9} {'best':>9} {'5 vs best':>9} "
      f"{'max UB KiB':>10} {'peak/unfused':>12}")
for (net, dev), rows in sweeps.items():
    best = min(rows, key=lambda r: (r["latency_us"], r["max_group_ops"]))
    at5 = next(r for r in rows if r["max_group_ops"] == 5)
    print(f"{net:<11} {dev:<27} {best['max_group_ops']:>12} {at5['latency_us']:>7.1f}us {best['latency_us']:>7.1f}us "
          f"{at5['latency_us'] / best['latency_us']:>8.2f}x {max(r['ub_KiB'] for r in rows):>10.1f} "
          f"{best['peak_vs_unfused']:>12.3f}")

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
for ax, ((net, dev), rows) in zip(axes.flat, sweeps.items()):
    widgets.plot_sweep(rows, ax=ax, title=f"{net}, {dev.split(' (')[0]}")
fig.tight_layout()

# %% [markdown]
# The seed's two claims and the ledger's verdicts, now that the curve is in:

# %%
for cid in ("s42-split-above-5-ops", "s1-overfusion-memory-15-20pct"):
    print(seed_claims.claim(cid).summary(), end="\n\n")

# %% [markdown]
# **The curve does not turn upward.** Predicted latency falls as groups grow and then stays flat:
# the minimum is at the largest group TVM's rules form on each network (5 ops on YOLOv5: one Conv per group, with
# its BN, SiLU and a residual Add; 7 on BERT: the FFN's MatMul, bias and erf-GELU), and the flat part is where
# the rules, not the limit, stop the groups. Peak memory falls with fusion too (to 0.70 of the unfused peak on
# YOLOv5), because fewer intermediates are ever written. Peak memory is a property of the plan and the execution
# order, not of the device: at the best limit it is the same fraction of the unfused peak on every preset, the
# Atlas 800T of the seed's "15–20 %" included:

# %%
for net, (model, dims) in networks.items():
    best_ops = min(sweeps[net, a2], key=lambda r: (r["latency_us"], r["max_group_ops"]))["max_group_ops"]
    peaks = {dev: widgets.sweep_group_size(model, (best_ops,), dev, dims=dims, allow_recompute=True)[0]["peak_vs_unfused"]
             for dev in devices.load_devices()}
    print(wrap(f"{net}, max {best_ops} ops, peak / unfused peak: "
               + ", ".join(f"{dev.split(' (')[0]} {p:.3f}" for dev, p in peaks.items())))

# %% [markdown]
# None of the three mechanisms bites here:

# %%
bert_rows = sweeps["BERT 2x256", a2]
bert_best = min(bert_rows, key=lambda r: (r["latency_us"], r["max_group_ops"]))
bert_plan = widgets.make_plan(bert, ("mixed",), bert_best["max_group_ops"], None, networks["BERT 2x256"][1],
                              allow_recompute=True)
recomputed = sorted(set().union(*(set(g.recompute) for g in bert_plan)))
layernorm_subs = [n for n in recomputed if "LayerNorm" in n]
dma = [r["DMA_x"] for rows in sweeps.values() for r in rows]
display(Markdown(
    f"* the largest group of either network needs at most {max(r['ub_KiB'] for rows in sweeps.values() for r in rows):.0f} "
    f"KiB at 16 KiB tiles (column `max UB KiB`), within every preset's UB, so no tile shrinks below 16 KiB "
    f"(column `DMA x` stays at {min(dma):.2f}–{max(dma):.2f}, and what it adds is the small tensors, which move in "
    f"small transfers whether fused or not);\n"
    f"* at BERT's best limit ({bert_best['max_group_ops']} ops) the plan recomputes {len(recomputed)} nodes"
    f"{f', the `Sub` (x − mean) of each of its {len(layernorm_subs)} LayerNorms' if len(layernorm_subs) == len(recomputed) else ''}"
    f", running {bert_best['recomputed']} copies (the `recomputed` column counts copies): each copy reads `x` and the "
    f"mean again, but saves writing `x − mean` and reading it back twice, so recompute *lowers* traffic here;\n"
    f"* no fused kernel holds tensors that the unfused ops would have freed before it runs."))

# %%
# the split rule's predicted cost, from the sweep (a model prediction: no interval, so no measured verdict)
at5_vs_best = {}
for (net, dev), rows in sweeps.items():
    best = min(rows, key=lambda r: (r["latency_us"], r["max_group_ops"]))
    at5 = next(r for r in rows if r["max_group_ops"] == 5)
    at5_vs_best[net] = (at5["latency_us"] / best["latency_us"], best["max_group_ops"])
(yolo_ratio, _), (bert_ratio, bert_best_ops) = at5_vs_best["YOLOv5 640"], at5_vs_best["BERT 2x256"]
display(Markdown(
    f"So this model does **not** support the seed's \"split above 5 ops\" on these networks: on YOLOv5 the limit of "
    f"5 costs {'nothing (no group is larger)' if yolo_ratio < 1.005 else 'a little'}, and on BERT a limit of 5 is "
    f"predicted to take {bert_ratio:.2f} times the latency of the best limit ({bert_best_ops} ops; the `5 vs best` "
    f"column), because it splits the FFN's group."))

# %% [markdown]
# Nor does this model reproduce "over-fusion raised peak memory by 15–20 %": at
# inference, fusion lowers the peak. The seed's figure is from an Atlas 800T, a *training* server, where a fused
# forward kernel must still save (or recompute) every intermediate the backward pass needs; that is a mechanism of
# training this inference model does not have.
#
# Peak memory also bounds the batch a card can hold. The seed (§2.2) says fusing a matrix multiplication with its
# activation let ResNet-50 run a 1.5× larger batch; ResNet-50's only MatMul, the classifier's `Gemm`, has no
# activation after it (notebook 02 §7). Its Conv+BN+ReLU chains are what shrink the live activations:

# %%
resnet50 = fusionlab.load(zoo.get("resnet50"))
r50_plan = widgets.make_plan(resnet50, ("vertical",), max_group_ops=None)
r50 = cost.Analysis(resnet50, {"batch": 8}, "fp16")
pro = devices.get("Atlas 300I Pro")
r50_unfused, r50_fused = (cost.plan_cost(resnet50, p, pro, analysis=r50) for p in (None, r50_plan))
print(wrap(f"ResNet-50, batch 8, fp16: peak live activations {r50_unfused.peak_activation_bytes / 2**20:.2f} MiB "
           f"unfused, {r50_fused.peak_activation_bytes / 2**20:.2f} MiB with its {len(r50_plan)} Conv+BN(+ReLU) groups "
           f"fused ({r50_unfused.peak_activation_bytes / r50_fused.peak_activation_bytes:.2f}x as many images in the "
           f"same activation memory); weights {r50_unfused.weight_bytes / 2**20:.2f} MiB"))

# %% [markdown]
# A quarter less activation memory, so about 1.33× the batch when activations fill the card (at batch 8 they are
# still smaller than the weights). That is the order of the seed's 1.5×, but from Conv+BN+ReLU fusion, which
# removes the BN and ReLU outputs, not from the MatMul.
#
# **When would it turn upward?** When a group holds more tiles than the UB has room for at 16 KiB: a group that
# sums or concatenates many feature maps, or a custom op that gives every intermediate its own buffer for the
# whole kernel (the canonical Ascend C kernel allocates each queue once with `pipe.InitBuffer` in its `Init`,
# `cann_facts.md` §3.2, so a hand-written kernel reuses a buffer only if its author does). The next cell is that
# case: `overfusion.add_chain(k)`, a chain of k elementwise Adds that each bring in one more input (not a zoo
# network: none of them forms such a group), fused whole and, in the `halves us` column, cut in two
# (`overfusion.chain_plan(chain, 2)`). Every added input costs two more tiles.

# %%
a2_device = devices.get("Atlas 800I A2")
print(f"{a2_device.name}: one core's UB {a2_device.ub_kb:g} KiB = {a2_device.ub_kb / 16:g} tiles of 16 KiB")
print(f"{'inputs':>6} {'UB KiB @16K':>11} {'tile KiB':>8} {'transfers':>9} {'fused us':>9} {'halves us':>9} "
      f"{'unfused us':>10} {'speedup':>7}")
for k in (2, 4, 6, 8, 12, 16, 24):
    chain = overfusion.add_chain(k)
    f, h, u = (cost.plan_cost(chain, p, a2_device)
               for p in (overfusion.chain_plan(chain, 1), overfusion.chain_plan(chain, 2), None))
    (kc,) = f.kernels_detail
    print(f"{k + 1:>6} {kc.working_set / 1024:>11.0f} {kc.tile / 1024:>8.1f} {kc.transfer_factor:>8.2f}x "
          f"{f.latency_s * 1e6:>9.1f} {h.latency_s * 1e6:>9.1f} {u.latency_s * 1e6:>10.1f} {u.latency_s / f.latency_s:>6.2f}x")

# %% [markdown]
# From 5 inputs on, the group no longer fits a 910B core's UB at 16 KiB tiles (224 KiB > 192 KiB): its tiles
# shrink and its transfers slow down, to 3.5 KiB tiles and transfers 1.35× slower at 25 inputs. The speedup over
# the unfused chain stops growing (4.24× at 17 inputs, 4.19× at 25), but the fused kernel still wins by far,
# because every unfused Add writes and re-reads a full intermediate: fusion removes far more traffic than small
# transfers waste. A split pays only when the group's slowdown outgrows what the split adds back: the running sum
# written and read back, and one more launch. Cut in two (`halves us`), every chain above is slower on this card;
# on a longer chain, or a card with other figures, it need not be (Exercise 1 finds where). Costs that grow faster
# with the group (registers or UB spilling whole tensors, recomputing expensive ops, a compiler's instruction
# budget) are not in this model: they are a measurement to make on the device (msprof's op summary columns
# `mte2_ratio`, `aiv_`-prefixed on A2, and `Task Duration(us)`, before and after the split: `cann_facts.md` §5).
#
# ## 2. Predicted against measured, on this CPU
#
# The only device we can measure is this one. For each fusion kind we fuse the model, verify it against the
# original (onnxruntime, optimisations off), time both interleaved (one thread, both with onnxruntime's
# optimisations off, so only our rewrite differs), and compare with the speedup the model predicts for
# `this machine`. To compare like with like, the model costs **the kernels onnxruntime runs** (`cost.as_launched`):
#
# * **vertical** groups become real onnxruntime kernels: a `Conv` with BN folded in or a `FusedConv` (one kernel),
#   or `Conv` + `QuickGelu` (two);
# * **horizontal** groups become one wide Conv per chain position and a `Split` (notebook 05);
# * **mixed** groups become ONNX local functions, which onnxruntime *inlines* when it loads the model: it runs the
#   same kernels as the original, so the like-with-like prediction is 1.00×, whatever a fusing backend would gain.
#
# The machine may be shared with other jobs, so the timings can be noisy; the speedups are medians of paired,
# interleaved ratios with their 95 % interval.

# %%
# NBVAL_IGNORE_OUTPUT
me = devices.this_machine()  # calibrated as in notebook 07 §1: each run measures again
print(devices.devices_table([me]))
yolo = fusionlab.load(zoo.get("yolov5s", image_size=320, width_mult=0.25, depth_mult=0.33))  # notebook 07 §4's
rows, fused = [], {}
for name, model in (("resnet_small", fusionlab.load(zoo.get("resnet_small"))), ("yolov5n-size/320", yolo)):
    base_cost = cost.plan_cost(model, None, me)
    for kind in ("vertical", "horizontal", "mixed"):
        result = fuse(model, passes=[kind], **options_for([kind], max_group_ops=5))
        if not len(result.plan):
            rows.append((name, kind, 0, 0, 0, float("nan"), None))
            continue
        assert runtime.verify(model, result.graph).ok
        fused[name, kind] = model, result.plan
        launched = cost.as_launched(result.plan)
        predicted = cost.predicted_speedup(model, launched, me)
        measured = timing.compare_models(model, result.graph, min_time=1.0)
        rows.append((name, kind, len(result.plan), base_cost.kernels, cost.plan_cost(model, launched, me).kernels,
                     predicted, measured))
print(f"{'model':<16} {'kind':<10} {'groups':>6} {'kernels':>11} {'predicted':>9} {'measured (95% CI)':>22} {'error':>7}")
for name, kind, groups, k0, k1, p, m in rows:
    if not groups:
        print(f"{name:<16} {kind:<10} {groups:>6} {'-':>11} {'-':>9} {'-':>22} {'-':>7}  (nothing to fuse)")
        continue
    ci = f"{m.speedup:.2f}x ({m.ci_low:.2f}-{m.ci_high:.2f})"
    print(f"{name:<16} {kind:<10} {groups:>6} {f'{k0} -> {k1}':>11} {p:>8.2f}x {ci:>22} {(p - m.speedup) / m.speedup:>+7.0%}")

# does the model rank the plans of one model as the measurements do? Only pairs whose measured intervals do not
# overlap can say, and only where the model does not predict a tie
agree, disagree, untested, tested = 0, 0, 0, []
for name in dict.fromkeys(r[0] for r in rows):
    measured_rows = [r for r in rows if r[0] == name and r[2]]
    for i, x in enumerate(measured_rows):
        for y in measured_rows[i + 1:]:
            mx, my = x[6], y[6]
            if abs(x[5] - y[5]) < 0.005 or not (mx.ci_low > my.ci_high or my.ci_low > mx.ci_high):
                untested += 1
                continue
            same = (x[5] > y[5]) == (mx.speedup > my.speedup)
            agree, disagree = agree + same, disagree + (not same)
            tested.append(f"{name} {x[1]} ({mx.ci_low:.3f}–{mx.ci_high:.3f}) against {y[1]} "
                          f"({my.ci_low:.3f}–{my.ci_high:.3f}): {'same order' if same else 'the other way'}")
display(Markdown(f"**The ranking, tested in this run:** of {agree + disagree + untested} pairs of plans on the same "
                 f"model, {agree + disagree} can test it (measured intervals apart, no predicted tie); the model orders "
                 f"{agree} of them as the measurement does and {disagree} the other way."
                 + ("".join(f"\n- {t}" for t in tested) if tested else "")))

# %% [markdown]
# Read the error column with the model's assumptions in mind. It charges every byte at the DRAM streaming
# bandwidth, although on this CPU a small model's tensors stay in the L2/L3 cache, so it overstates what a saved
# byte is worth here. It ignores what onnxruntime's kernels do inside (im2col buffers in convolutions; a fused
# `FusedConv` applying its activation in the convolution's output loop). The launch cost is one measured number
# for every op, though a removed kernel saves more than a launch (output allocation, a pass over the tensor in
# the cache). The mixed rows test the model's bookkeeping: onnxruntime runs the same kernels, and the prediction
# says so. A model that is off by tens of percent can still rank plans correctly, which is what the explorer uses
# it for; the line above tests that on the pairs this run can tell apart (it says how many: a test, not a proof).
#
# ## 3. The explorer
#
# The widget below wires the same functions to controls: max ops per group, the mixed pass's UB budget,
# the fusion kinds, the device. A button measures the fused model on this CPU. It needs a live kernel; in
# a static view of the notebook only the controls' text shows. On its own the explorer starts from the
# passes `fusionlab fuse` runs (vertical); here every kind is selected, since the thresholds govern the
# mixed pass. Below the controls it shows what the last change did, the plan's counts, and a table of the
# devices with two bars in each of its latency and peak-memory cells: grey for the unfused model, coloured for
# the plan, on that device's own scale (a bar shows what fusion does there; its label gives the values).

# %%
# NBVAL_IGNORE_OUTPUT
resnet = fusionlab.load(zoo.get("resnet_small"))
box = widgets.explore(resnet, kinds=widgets.KINDS)

# %% [markdown]
# The widget is a thin layer: each setting calls `widgets.explore_state`, which you can call directly.
# Here is another setting, printed (max 3 ops per group, vertical and mixed, on the 800I A2: not the widget's
# initial one above), the same call the widget makes when you move its controls. Its mixed groups take in
# vertically fused Convs (the table's "… more groups" include them), and the plan's last line counts each node and
# kernel of the model once; the sentence after the output reads it.

# %%
state = widgets.explore_state(resnet, max_group_ops=3, kinds=("vertical", "mixed"), device="Atlas 800I A2")
print(wrap(state.summary()))
print(state.plan.table(max_rows=5))
counted = state.plan.counts()
display(Markdown(f"The last line: the groups cover {counted.nodes} of the {len(resnet)} nodes as {counted.kernels} "
                 f"kernels, and the {state.cost.kernels - counted.kernels} nodes outside any group make the "
                 f"{state.cost.kernels} kernels the model launches."))

# %% [markdown]
# ## Summary
#
# * Swept over `max_group_ops` on YOLOv5 and BERT (Atlas 800I A2 preset), the predicted latency falls with group
#   size and then flattens, and peak memory falls too: the seed's "split above 5 ops" costs BERT latency in this
#   model, and its "15–20 % more peak memory" is a training effect the inference model does not have.
# * A larger group can cost more through UB pressure, recompute or longer lifetimes; on a chain of Adds that
#   outgrows the UB, tiles shrink and transfers slow, yet on every chain of §1's table one group beats two.
# * On this CPU the model is compared like with like (the kernels onnxruntime runs, mixed groups inlined) against
#   interval-backed measurements, error shown; the explorer wires the same functions to controls.

# %% [markdown]
# ## Exercises
#
# The exercises check themselves: write your answer in the cell under each task, run it, then run the `check` cell.
# `check` grades it at once on hidden cases and prints PASS with what it checked, or FAIL with a hint naming the
# first case your answer gets wrong and the mistake it looks like. The notebook is stored unanswered; a reference
# answer is in the repository's `solutions/` folder, outside the notebooks (try first).
#
# **Exercise 1: where to cut a long chain.** Write `best_parts(k, device)`: into how many consecutive groups
# (`overfusion.chain_plan(overfusion.add_chain(k), parts)`, 1 to k) the cost model would cut §1's chain of k Adds
# on a preset, the fewest parts at the lowest `cost.plan_cost` latency. The hidden chains, some longer than §1's,
# run on four presets; some are best whole, some not.

# %%
def best_parts(k, device):
    """Number of parts (1 .. k) with the lowest predicted latency for a chain of k Adds on `device`."""
    ...  # your code here


# %%
exercises.splits.check(best_parts)

# %% [markdown]
# **Exercise 2: the launch cost a measurement implies.** §2's model prices every launch at one calibrated figure.
# Which launch cost would make it predict what was measured? Write `launch_us(model, plan, device, measured)`: the
# launch overhead in µs at which the model predicts `measured` for what onnxruntime runs (`cost.as_launched(plan)`)
# on `device`, its other figures kept. Latency is linear in it (`dataclasses.replace(device,
# launch_overhead_us=0.0)` gives the rest), so as it grows from 0 the prediction moves from its value with free
# launches towards the ratio of the kernel counts. Return None for a measurement outside that range: no launch
# cost >= 0 explains it, another of §2's caveats must (below the free-launch value: bytes priced at DRAM
# bandwidth, which overstates what fusion saves here). The hidden cases, on two fixed CPU calibrations, include a
# mixed plan. The next cell prints that range for §2's plans and whether this run's measurement is in it; try
# yours on them, e.g.
# `launch_us(*fused["resnet_small", "vertical"], me, measured["resnet_small", "vertical"])`.

# %%
# NBVAL_IGNORE_OUTPUT
import dataclasses

measured = {(name, kind): m.speedup for name, kind, groups, *_, m in rows if groups}  # §2's measured speedups
print(f"{'model':<16} {'kind':<10} {'measured':>8} {'launch 0':>8} {'launch -> inf':>13}  a launch cost >= 0 fits?")
for (name, kind), (model, plan) in fused.items():
    launched = cost.as_launched(plan)
    k0, k1 = (cost.plan_cost(model, p, me).kernels for p in (None, launched))
    free = cost.predicted_speedup(model, launched, dataclasses.replace(me, launch_overhead_us=0.0))
    inside = min(free, k0 / k1) <= measured[name, kind] <= max(free, k0 / k1) and k0 != k1
    print(f"{name:<16} {kind:<10} {measured[name, kind]:>7.3f}x {free:>7.3f}x {k0 / k1:>12.3f}x  "
          f"{'yes' if inside else 'no: launch_us returns None'}")

# %%
def launch_us(model, plan, device, measured):
    """Launch overhead (µs) at which the model predicts the `measured` speedup for what onnxruntime runs, or None."""
    raise NotImplementedError  # your code here


# %%
exercises.launchfit.check(launch_us)
