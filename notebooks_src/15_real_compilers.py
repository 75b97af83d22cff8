# %% [markdown]
# # 15 · Real compilers side by side: IREE runs fused, TVM groups, CANN ATC reports
#
# **What you will be able to do**
#
# 1. compile an ONNX graph with **IREE**, count its *dispatches* (its fusion groups), run it on this CPU and check
#    it against onnxruntime, and measure what running fused buys;
# 2. count the kernels each tool runs for the same models: fusionlab's plan, onnxruntime's optimised graph, IREE;
# 3. measure how far fusionlab's mixed pass agrees with **TVM Relax**'s `FuseOps`, with every disagreement explained;
# 4. read how **CANN's ATC** decides fusion (graph fusion, then UB fusion), turn its passes off with
#    `--fusion_switch_file`, and write fusionlab's plan as ATC's `fusion_result.json`.
#
# Until now the mixed-fusion groups were lowered to ONNX functions that onnxruntime inlines, so nothing
# ran fused and the gain of mixed fusion was only modelled (notebook 07). Here a compiler runs the
# groups. IREE (`iree-base-compiler` and `iree-base-runtime`, pinned in `pyproject.toml`) is part of
# the workbook's environment. TVM is not: it is about 320 MB more [src: `du` of its wheel installed into `.venv`] and is used only for its grouping,
# so `benchmarks/bench_tvm_agreement.py` (with the `oracle` extra) ran it once and this notebook reads
# its committed output, `data/tvm_groups.json`.

# %%
import json
import re
from pathlib import Path

import numpy as np

from fusionlab import exercises, timing, zoo
from fusionlab.compilers import MODELS, grouping, iree, ort
from fusionlab.export import cann
from fusionlab.graph import load
from fusionlab.lessons import reductions as R
from fusionlab.passes import plan as fusion_plan
from fusionlab.text import text_table, wrap
from fusionlab.verification import runtime

print("IREE", iree.version())

# %% [markdown]
# ## 1. IREE: from ONNX to dispatches
#
# IREE imports ONNX into MLIR with torch-mlir's ONNX importer. There is no ONNX dialect: every node arrives
# as a generic `torch.operator "onnx.<Op>"` of the torch dialect, which torch-mlir's TorchOnnxToTorch
# conversion turns into torch ops. IREE lowers those to `linalg` (loops described as data), and then *forms dispatch regions*: it decides which ops share one kernel. Each dispatch is
# compiled for the target (here `llvm-cpu` for this machine's CPU, with its vector extensions) and
# launched once per run. A dispatch region is therefore exactly a fusion group.
#
# Issue 13's check graph is a LayerNormalization followed by the exported erf-GELU (Div, Erf, Add, Mul,
# Mul) on 2048 × 768 float32. Here is how it arrives in MLIR:

# %%
ln_gelu = R.layernorm_gelu_model(2048, 768)
mlir = iree.import_onnx(ln_gelu)
for line in mlir.splitlines():
    if "torch.operator" in line and "Constant" not in line:
        print(re.sub(r"\s+", " ", line.split(" : ")[0]).strip())

# %% [markdown]
# **Predict** before running the next cell: six ONNX ops, two of them reductions inside the
# LayerNormalization (mean and variance). How many dispatches will IREE make?

# %%
names = iree.dispatch_names(ln_gelu)
print(f"{len(names)} dispatches:")
for n in names:
    print("  ", n)

# %% [markdown]
# Two. IREE's names say both are *reductions* over the 768-wide rows. What each holds is in the program
# IREE forms (`--compile-to=flow`): every dispatch is a `flow.executable` whose function reads and writes
# whole tensors and holds `linalg.generic` loop nests. Condensed to its arguments, its loop nests and the
# arithmetic in their bodies:

# %%
flow = iree._flow(ln_gelu)
for block in re.split(r"(?=flow\.executable private @)", flow)[1:]:
    name = re.search(r"flow\.executable\.export public @\"?([\w$]+)", block).group(1)
    signature = re.search(r"func\.func @[^(]+\((.*?)\) \{", block.split("builtin.module", 1)[1]).group(1)
    body = block.split("builtin.module", 1)[1].split("util.global", 1)[0]
    print(name.split("$")[-1])
    print("  reads", ", ".join(re.findall(r"readonly:tensor<([\dx]+)xf32>", signature)),
          "| writes", ", ".join(re.findall(r"writeonly:tensor<([\dx]+)xf32>", signature)))
    for nest in re.split(r"(?=linalg\.generic)", body)[1:]:
        loops = re.search(r"iterator_types = \[([^\]]*)\]", nest).group(1).replace('"', "")
        ops = [o.split(".")[1] for o in re.findall(r"= ((?:arith|math)\.\w+)", nest.split("} ->", 1)[0])]
        print(f"  linalg.generic [{loops}]: {' '.join(o for o in ops if o != 'constant')}")

# %% [markdown]
# The first dispatch reduces each row to its mean and, in a second loop nest, writes `x − mean`: one full
# 2048 × 768 tensor goes to memory. The second reduces the squares of that tensor to the variance and then,
# in the same dispatch, does everything elementwise that follows (normalise, scale, shift and the whole
# GELU: `divf erf addf mulf mulf`) on the fly, writing only `y`. No intermediate of the GELU ever reaches
# memory; the centred input does. For comparison, the same nodes compiled one at a time give:

# %%
per_node = iree.dispatches_per_node(ln_gelu)
for node, op, n in per_node:
    print(f"{node:<10} {op:<20} {n} dispatch{'es' if n > 1 else ''}")
print("total", sum(n for *_, n in per_node), "dispatches without cross-node fusion, against", len(names))

# %% [markdown]
# ## 2. Run it, and check it
#
# `iree.compile_model` builds the `.vmfb` (cached under `.cache/iree`, keyed by the MLIR, the flags and
# the compiler version; the first build takes seconds). `iree.Module` runs it on IREE's `local-sync`
# driver: one thread and no worker pool, like the workbook's one-thread onnxruntime sessions.

# %%
x = np.random.default_rng(0).standard_normal((2048, 768)).astype(np.float32)
fused = iree.Module(iree.compile_model(ln_gelu))
ort_off = runtime.session(ln_gelu, "disable", 1)
reference = ort_off.run(["y"], {"x": x})[0]
print("IREE vs onnxruntime (optimisations off) within fp32 tolerance:",
      np.allclose(fused.run(x)[0], reference, rtol=1e-4, atol=1e-5))
print("max |difference| below 1e-5:", float(np.abs(fused.run(x)[0] - reference).max()) < 1e-5)

# %% [markdown]
# ## 3. Measuring fusion
#
# To measure what IREE's fusion is worth we need the same compiler *without* it. IREE has no switch
# for that: its `--iree-dispatch-creation-*` options enable or block particular fusions, none turns
# dispatch formation off. So the unfused build is `iree.PerOp`: each ONNX node compiled as its own
# module (with its constants), the modules run in sequence, each result handed to the next on the
# device without a copy. Every op is then at least one dispatch, and nothing fuses across nodes. It
# also adds what one module call costs (a call from Python into IREE's VM, output buffers allocated per
# call) six times over: part of any difference is that overhead, not fusion. The measurement below
# bounds it against onnxruntime's six unfused kernels.
#
# **Predict**: the fused program (§1's two dispatches) reads `x`, writes the centred tensor and reads it
# back, and writes `y`: four full 6 MiB transfers; per-op, each of the six nodes reads and writes a full
# 6 MiB tensor. How much faster is the fused build? And against onnxruntime,
# unfused (six kernels) and at level ALL (which rewrites the graph into two hand-written kernels,
# LayerNormalization and Gelu)?

# %%
per_op = iree.PerOp(ln_gelu)
print(len(per_op), "modules;", "per-op matches onnxruntime:",
      np.allclose(per_op.run(x)[0], reference, rtol=1e-4, atol=1e-5))
print("onnxruntime's graph at level ALL:", ", ".join(f"{k.split(':')[-1]} x{v}" for k, v in ort.optimized_ops(ln_gelu, "all").items()))

# %%
# NBVAL_IGNORE_OUTPUT
ort_all = runtime.session(ln_gelu, "all", 1)
candidates = {"IREE per-op (6 modules)": lambda: per_op(x), "onnxruntime unfused (6 kernels)": lambda: ort_off.run(["y"], {"x": x}),
              "onnxruntime ALL (2 kernels)": lambda: ort_all.run(["y"], {"x": x}), "IREE fused": lambda: fused(x)}
samples = timing.interleaved(candidates, min_time=4.0)  # all four in the same rounds: one fused time, not three
short = {"IREE per-op (6 modules)": "per-op", "onnxruntime unfused (6 kernels)": "ORT unfused",
         "onnxruntime ALL (2 kernels)": "ORT ALL"}
against_fused = {label: timing.Comparison.from_samples(samples[label], samples["IREE fused"], label_a=short[label],
                                                        label_b="IREE fused")
                 for label in short}
print(timing.comparisons_table(against_fused, header=("A", "median A", "IREE fused", "A/B", "95% CI", "verdict")))

# %%
# NBVAL_IGNORE_OUTPUT
from IPython.display import Markdown, display

per_op_c = against_fused["IREE per-op (6 modules)"]
ort_c = against_fused["onnxruntime unfused (6 kernels)"]
all_c = against_fused["onnxruntime ALL (2 kernels)"]
overhead = timing.Comparison.from_samples(samples["IREE per-op (6 modules)"], samples["onnxruntime unfused (6 kernels)"],
                                          label_a="IREE per-op", label_b="ORT unfused")


def said(c) -> str:
    return f"{c.speedup:.2f}× ({c.ci_low:.2f}–{c.ci_high:.2f}): {c.verdict(brief=True)}"


display(Markdown(
    f"In the same rounds: IREE fused against per-op {said(per_op_c)}; against onnxruntime's unfused graph "
    f"{said(ort_c)}; against onnxruntime ALL {said(all_c)}. The same six unfused ops run as onnxruntime kernels "
    f"compare with IREE per-op at {said(overhead)}. IREE per-op runs the same six ops unfused, so the "
    f"part of its {timing.format_seconds(per_op_c.a.median)} that six unfused kernels do not need, up to "
    f"{timing.format_seconds(max(0.0, per_op_c.a.median - ort_c.a.median))} here, is per-module cost and IREE's "
    f"per-op code, not missing fusion: the per-op ratio is an upper bound on what fusion buys, and the ratio to "
    f"onnxruntime's unfused kernels, a different compiler's, is the other reading."))

# %% [markdown]
# So fusion inside one compiler is not as clean a comparison as it looks: the same code generator, the
# same inputs, but the per-op build also pays six module calls, which the comparison above cannot separate
# from IREE's own per-op code (it bounds the two together). Against
# onnxruntime the question changes to *whose kernels are better*. onnxruntime at level ALL also fuses
# (into two kernels: LayerNormalization, then Gelu, with one 6 MiB intermediate between them) and its
# kernels are hand-vectorised MLAS code; IREE's are generated, with its own polynomial for `erf`. The
# table above says which is faster in this run, and the ratio moves with the machine's load;
# `benchmarks/bench_compilers.py` records the same comparison with longer runs
# (`benchmarks/results/compilers.md`).
#
# ## 4. Kernels per run, three ways, on zoo models
#
# For two zoo models (batch 1, static shapes) we count what each tool launches per run:
#
# * **fusionlab's plan**: compute nodes minus the nodes merged by the vertical, horizontal and mixed
#   passes (`fusion_plan(model, passes=("vertical", "horizontal", "mixed"))`), the plan a fused backend
#   would run;
# * **onnxruntime**: the nodes of its optimised graph at level EXTENDED (fusions) and ALL (fusions and
#   the NCHWc layout, which adds reorder nodes);
# * **IREE**: the dispatches of the compiled program.
#
# **Predict**: ResNet-style Conv+BN+ReLU blocks are what every tool fuses. Which of the three will
# launch the fewest kernels on ResNet? On BERT?

# %%
print(f"{'model':<13} {'ONNX nodes':>10} {'fusionlab':>9} {'ORT EXT':>8} {'ORT ALL':>8} {'IREE':>5}")
iree_names, kernels = {}, {}
for name in ("resnet_small", "bert_tiny"):
    model = zoo.get(name, **MODELS[name])
    graph = load(model)
    plan = fusion_plan(graph, passes=("vertical", "horizontal", "mixed"))
    compute = [n for n in graph if n.op_type != "Constant"]
    iree_names[name] = iree.dispatch_names(model)
    kernels[name] = {"ONNX nodes": len(compute), "fusionlab": len(compute) - sum(g.size - 1 for g in plan),
                     "ORT EXTENDED": ort.kernel_count(model, "extended"), "ORT ALL": ort.kernel_count(model, "all"),
                     "IREE": len(iree_names[name])}
    print(f"{name:<13} {len(compute):>10} {len(compute) - sum(g.size - 1 for g in plan):>9} "
          f"{ort.kernel_count(model, 'extended'):>8} {ort.kernel_count(model, 'all'):>8} {len(iree_names[name]):>5}")

# %% [markdown]
# Why onnxruntime at ALL runs fewer kernels than at EXTENDED on ResNet, and the same on BERT: the op types of
# its optimised graph at each level.

# %%
for name in ("resnet_small", "bert_tiny"):
    model = zoo.get(name, **MODELS[name])
    for level in ("extended", "all"):
        ops = ort.optimized_ops(model, level)
        print(wrap(f"{name:<13} {level:<9} " + ", ".join(f"{k.split(':')[-1]} x{v}" for k, v in sorted(ops.items()))))

# %%
from IPython.display import Markdown, display

ops = {(name, level): ort.optimized_ops(zoo.get(name, **MODELS[name]), level)
       for name in ("resnet_small", "bert_tiny") for level in ("extended", "all")}
ext, al = ops["resnet_small", "extended"], ops["resnet_small", "all"]
resnet_rules = fusion_plan(load(zoo.get("resnet_small", **MODELS["resnet_small"])), passes=("vertical",)).rule_counts()
fused_conv = ext.get("com.microsoft:FusedConv", 0)
plain_conv = ext.get("Conv", 0)
after_add = resnet_rules.get("conv_add_act", 0)  # Conv + BN + Add + ReLU: the ReLU comes after the block's Add
no_act = resnet_rules.get("conv_bn", 0)  # Conv + BN with no activation (the shortcut convolutions)
why = (f": {after_add} are the second Conv of a residual block, whose ReLU comes only after the block's `Add`, "
       f"and {no_act} are shortcut Convs with no activation at all (fusionlab's plan of the same graph finds "
       f"{after_add} Conv+BN+Add+ReLU and {no_act} Conv+BN chains)" if after_add + no_act == plain_conv else "")
nchwc = sum(v for k, v in al.items() if k.endswith(":Conv") or k == "Conv")
display(Markdown(
    f"On ResNet, EXTENDED fuses {fused_conv} of its {fused_conv + plain_conv} Convs with their BatchNorm (folded at "
    f"BASIC) and the ReLU right after them into a `FusedConv`; the other {plain_conv} stay `Conv`s{why}. The "
    f"residual `Add`s and the ReLUs after them stay kernels of their own ({ext.get('Add', 0)} and "
    f"{ext.get('Relu', 0)}). At ALL the NCHWc layout transformer rewrites the {nchwc} Convs into its blocked "
    f"`nchwc:Conv`, which takes the residual Add and the activation in (the graph keeps {al.get('Add', 0)} `Add`s "
    f"and {al.get('Relu', 0)} `Relu`s), at the price of {al.get('com.microsoft.nchwc:ReorderOutput', 0)} "
    f"`ReorderOutput` back to NCHW. NCHWc applies to convolutions only, so on BERT ALL "
    + ("changes nothing." if ops["bert_tiny", "extended"] == ops["bert_tiny", "all"] else
       "changes only the op counts above that differ.")))

# %%
import matplotlib.pyplot as plt

fig, axes = plt.subplots(1, 2, figsize=(8, 2.8))
for ax, (name, counts) in zip(axes, kernels.items()):
    ax.barh(list(counts), list(counts.values()), color=["#bbb", "#2a7", "#8ab", "#8ab", "#c84"])
    for i, v in enumerate(counts.values()):
        ax.text(v, i, f" {v}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_title(f"{name}: kernels per run", fontsize=9)
    ax.set_xlim(0, max(counts.values()) * 1.2)
fig.tight_layout()

# %% [markdown]
# IREE's dispatch names tell what it fused. Counted by kind:

# %%
for name, names_ in iree_names.items():
    kinds = {}
    for n in names_:
        kind = re.sub(r"^.*?dispatch_\d+_", "", n)
        kind = re.sub(r"_\d.*$", "", kind)
        kinds[kind] = kinds.get(kind, 0) + 1
    print(f"{name:<13}", ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])))

# %% [markdown]
# Where the real compiler fuses something fusionlab does not, or the reverse, and which is right:
#
# * **ResNet, Conv + BN + ReLU (+ residual Add)**: fusionlab, IREE and onnxruntime at ALL put each in one
#   kernel (IREE folds BN into the weights at compile time and keeps the ReLU and the residual Add in the
#   conv's dispatch). onnxruntime at EXTENDED stops short of the residual Add, as the op counts above
#   show. Agreement where the Add is taken in, and that is right.
# * **ResNet, the `slow_memcpy` dispatches**: IREE materialises a conv's zero padding as a copy into a
#   padded buffer. There are nine: by their count, one for the graph input and one for the input of
#   each of the eight residual blocks, a tensor that also feeds the skip path, so the padding cannot be
#   folded into the op that produces it. onnxruntime's and fusionlab's Conv pad inside the kernel. Here
#   fusionlab's plan (and onnxruntime) is better: those copies are pure memory traffic. (IREE also
#   names the MaxPool dispatch `conv`: pooling is a convolution-shaped loop nest to it.)
# * **BERT, LayerNorm**: IREE makes two reduction dispatches per LayerNorm (statistics, then normalise
#   with the elementwise tail). fusionlab's vertical `layernorm` rule rewrites the nine ops into one
#   `LayerNormalization` node, one kernel. fusionlab is better by one launch and one round trip of a
#   full-size tensor (IREE's first dispatch writes `x - mean` for the second to read);
#   notebook 09's fused kernel shows that one pass over a cached row is enough.
# * **BERT, bias + GELU after the FFN MatMul**: IREE puts the bias and the whole GELU in the MatMul's
#   dispatch (an epilogue). fusionlab's `bias_gelu` rule makes a `BiasGelu` node after the MatMul: two
#   kernels and one intermediate of 32 × 512 floats. IREE is better; a GEMM epilogue is the right place.
# * **BERT, Q/K/V projections**: IREE keeps three separate MatMul dispatches; fusionlab's horizontal
#   pass concatenates the three weights into one GEMM, which reads the input once and launches once;
#   whether that is faster depends on the shapes (notebook 05 measures when it pays).
#
# ## 5. TVM Relax: the oracle for the mixed pass
#
# fusionlab's mixed pass imitates TVM's `FuseOps` (notebook 06). TVM itself is the natural referee.
# `benchmarks/bench_tvm_agreement.py` imports each model with `tvm.relax.frontend.onnx.from_onnx`,
# runs TVM's own pipeline (its `static_shape_tuning_pipeline` without the tuning: DecomposeOpsForInference,
# CanonicalizeBindings, LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR), and traces
# every fused function back to the ONNX nodes it covers (`fusionlab.compilers.tvm`: Relax keeps no node
# names, so each binding is tagged at import and the fused functions are matched back by value). TVM's
# untuned CPU code is naive, so it is used for its grouping only, never for timing. We read the result:

# %%
tvm_data = json.loads((Path("..") / "data" / "tvm_groups.json").read_text())
print(wrap(f"apache-tvm {tvm_data['tvm_version']} | " + " -> ".join(tvm_data["pipeline"])))
rows = []
for name, entry in tvm_data["models"].items():
    graph = load(zoo.get(name, **entry["params"]))
    present = {n.name for n in graph}
    stale = [n for g in entry["groups"] for n in g if n not in present]
    constants = sum(n.op_type == "Constant" for n in graph)
    rows.append([name, f"{entry['nodes']} ({constants})", str(entry["functions_before"]), str(entry["functions_after"]),
                 str(len(entry["groups"])), str(not stale)])
print("\n".join(text_table(["model", "ONNX nodes (Constant)", "TVM functions", "after FuseTIR", "kernels",
                            "node names match today's zoo model"], rows)))

# %% [markdown]
# *ONNX nodes* counts every node of the export, its `Constant` nodes too (their number in brackets); §4's table
# counts only the compute nodes, which is why BERT has more nodes here than there (MobileNetV2, ResNet-50 and
# YOLOv5n are not in §4's table).
# *TVM functions* and *after FuseTIR* count the functions in TVM's module before fusion and after it, and a
# fused module holds one function per *distinct* kernel: groups that compute the same thing on the same
# shapes (BERT's two layers, ResNet's repeated blocks) share one. *Kernels* counts the calls `main` makes,
# one per group per run: the count to set beside fusionlab's column in §4.

# %% [markdown]
# **Agreement as a number.** Two groupings of one graph can be compared edge by edge: over every data
# edge between two compute nodes (producer → consumer), do both fuse it (both ends in one group), or
# both leave it unfused? *Edge agreement* is the share decided alike; the disagreeing edges are the
# cases to explain. *Pair Jaccard* is the stricter summary: of the node pairs either grouping puts
# together, the share both put together. Nodes TVM folds away (shape arithmetic) are left out. We
# compare fusionlab's mixed pass with its default threshold (at most 5 ops per group, the seed's rule
# for Atlas 800I A2) and without one (TVM's own limit is 256 ops):

# %%
agreements = {}
print(f"{'model':<13} {'threshold':<10} {'edges alike':>12} {'agreement':>9} {'pair Jaccard':>12}")
for name, entry in tvm_data["models"].items():
    graph = load(zoo.get(name, **entry["params"]))
    covered = [n for g in entry["groups"] for n in g]
    for label, opts in (("5 ops", {}), ("none", {"max_group_ops": None})):
        plan = fusion_plan(graph, passes=("mixed",), **opts)
        a = grouping.compare_groupings(graph, entry["groups"], grouping.plan_groups(plan), name_a="TVM",
                                       name_b="fusionlab", covered_a=covered)
        agreements[name, label] = a
        alike = sum(e.fused_a == e.fused_b for e in a.edges)
        print(f"{name:<13} {label:<10} {alike:>5} / {len(a.edges):<5} {a.edge_agreement:>9.1%} {a.pair_jaccard:>12.2f}")

# %% [markdown]
# Every disagreement, grouped by the ops at the two ends of the edge:

# %%
for (name, label), a in agreements.items():
    if a.disagreements:
        print(f"{name}, fusionlab threshold {label}:")
        print(a.table(), end="\n\n")

# %% [markdown]
# Each pattern explained, and judged:
#
# * **`Add -> Div`, `Add -> Mul` (BERT, only TVM, only with the 5-op threshold)**: the FFN's bias Add feeds
#   the erf-GELU (Div, Erf, Add, Mul, Mul). TVM puts MatMul, bias and GELU in one group (7 ops);
#   fusionlab stops at 5. A threshold, not a rule: without it the two agree. For a CPU or GPU, TVM's
#   group is right (a GEMM epilogue costs no traffic). The seed states its 5-op limit for an Ascend custom op
#   and gives no reason (notebook 08 §1 finds none on real networks in the UB model); whether it holds there needs a
#   measurement we cannot make here.
# * **`ReduceMean -> Sub`, `ReduceMean -> Add` (BERT LayerNorm, only TVM)**: TVM fuses the `mean` with
#   its elementwise *consumers* (not by a rule for reductions: the legalised `mean`, a sum and a division,
#   is labelled like a Conv, an anchor that takes in what follows; a `ReduceSum` only ends a group): the mean with the `x - mean` that follows, the variance with `+ ε`,
#   `sqrt`, divide, scale and shift. fusionlab's mixed pass lets a reduction only *end* a group.
# * **`Pow -> ReduceMean` (BERT LayerNorm, only fusionlab)**: the mirror image. fusionlab fuses the
#   square into the variance reduction (a prologue computed on the fly); TVM 0.27 leaves the square
#   alone. Both rules are checked on TVM itself in `tests/test_compilers_tvm.py` (a reduction takes its
#   consumers, not its producers). Which is right? Both fusions are legal, and they save different
#   things: fusionlab's saves writing and reading the full-size squared tensor (2 × M × N × 4 bytes),
#   TVM's save a launch and only a row-sized vector. By bytes fusionlab's choice is the better one; by
#   launches TVM's. The best choice is both: one kernel per LayerNorm, as fusionlab's vertical
#   `layernorm` rule, XLA, Inductor and CANN do, and as notebook 09's fused kernel runs.
# * **`Gather -> Add` (BERT embeddings, only fusionlab)**: TVM lowers the embedding Gather to an index
#   fix-up plus a `take` and keeps the `take` alone; fusionlab lets the (injective) gather feed the Adds
#   that sum the three embeddings. Legal, and it saves writing the gathered rows once: fusionlab is right,
#   at a small gain (32 × 128 floats here).
# * **`Resize -> Concat` (YOLOv5n neck, only TVM)**: TVM classes a nearest-neighbour Resize as injective
#   (an index mapping) and computes it inside the Concat's copy; fusionlab's op classes treat Resize as
#   opaque. TVM is right: the upsampled tensor need never be written. A candidate for fusionlab's op
#   table (`fusionlab.analysis.opclass`).
#
# `benchmarks/results/tvm_agreement.md` has the same tables for all five models, with TVM's run time.
#
# ## 6. CANN ATC: how it decides, and fusionlab's plan in its format
#
# ATC (the Ascend model converter: `atc --model=m.onnx --framework=5 --soc_version=Ascend310P3 ...`)
# fuses in two stages, according to CANN's published documentation (`cann_facts.md` §6):
#
# 1. **Graph fusion** passes rewrite the graph: `ConvBatchnormFusionPass` folds BatchNorm into the conv
#    weights at compile time, `MatMulBiasAddFusionPass` merges a MatMul with its bias, and so on;
# 2. **UB fusion** passes then merge ops whose intermediate would otherwise go Unified Buffer → global
#    memory → Unified Buffer into one kernel: "UB融合指A算子的计算结果在Unified Buffer上 … 将A和B算子合并成
#    一个算子，省去了数据搬移的过程" (the result of A stays in UB for B). `TbeCommonRules0FusionPass` is one of
#    the documented UB fusion passes (`cann_facts.md` §6); which patterns its common rules match is not in our
#    references (unverified), and fusionlab files its Conv + elementwise chains under it.
#
# Every built-in pass is on by default. `--fusion_switch_file` can only turn passes off (some cannot
# be turned off at all), in a JSON or a line format. After conversion ATC writes `fusion_result.json`,
# with the number of matches and of applied fusions per pass. `fusionlab.export.cann` writes
# fusionlab's plan in exactly that format: each fusionlab rule is filed under the real ATC pass that does
# the same fusion where one is documented, and under a `Fusionlab…` name otherwise, so that nobody takes
# it for an ATC pass. ResNet's plan:

# %%
resnet = load(zoo.get("resnet_small", **MODELS["resnet_small"]))
resnet_plan = fusion_plan(resnet, passes=("vertical", "horizontal", "mixed"))
print(resnet_plan.rule_counts())
print(cann.fusion_result_json(resnet_plan))

# %% [markdown]
# And the switch file that turns the two documented passes off (to compare a conversion with and
# without them on a real device), next to a published `fusion_result.json` read back with the same
# parser (from `Ascend/samples`, quoted in `cann_facts.md`):

# %%
print(cann.fusion_switch(["ConvBatchnormFusionPass", "TbeCommonRules0FusionPass"]))
published = ('{"graph_fusion": {"ConvToFullyConnectionFusionPass": {"effect_times": "0", "match_times": "3"}, '
             '"TransdataCastFusionPass": {"effect_times": "0", "match_times": "5"}}, "session_and_graph_id": "0_0", '
             '"ub_fusion": {"TbeCommonRules0FusionPass": {"effect_times": "2", "match_times": "2"}}}')
for stage, passes in cann.read_fusion_result(published).items():
    for name, (match, effect) in passes.items():
        print(f"{stage:<13} {name:<34} matched {match}, applied {effect}")

# %% [markdown]
# Reading a real `fusion_result.json` this way tells you what ATC did to *your* model, pass by pass;
# comparing it with fusionlab's export for the same model shows where fusionlab's plan and ATC's
# passes part ways. Where ATC counts a pass as matched but not applied (`match_times` > `effect_times`), the
# pass found the pattern and did not rewrite it; our reading is that a legality check refused it, the question
# fusionlab's legality module asks (the reference notes give the file's format, not that meaning: unverified).
#
# ## Summary
#
# * A real compiler's fusion groups can be counted (IREE's dispatches, TVM's fused functions, ATC's
#   fusion_result.json) and set beside fusionlab's plan: all agree on Conv+BN+activation, and differ on BERT.
# * IREE's fused build against the same ops compiled one by one measures what running fused buys, an upper bound
#   (the per-op build also pays a module call per op).
# * fusionlab's mixed pass agrees with TVM's FuseOps on almost every edge of the CNNs; on BERT the two handle
#   reductions as mirror images.

# %% [markdown]
# ## Exercises
#
# The exercises check themselves: write your answer in the cell under each task, run it, then run the `check`
# cell. `check` grades it at once on hidden cases and prints PASS with what it checked, or FAIL with a hint naming
# the first case your answer gets wrong and the mistake it looks like. The notebook is stored unanswered; reference
# answers are in the repository's `solutions/` folder, outside the notebooks (try first).
#
# **Exercise 1: edges two groupings decide alike.** Write `edges_alike(graph, groups_a, groups_b)` returning
# `(alike, total)`, §5's *edges alike* column, from its definition: `total` counts the data edges producer →
# consumer between two nodes that are not `Constant`s, each edge once; `alike` counts those that both groupings fuse
# (one group holds both ends) or both leave unfused. A grouping is a list of lists of node names. Walk
# `for node in graph` and each value in `node.inputs`: `value.producer()` is its node (None for a graph input or a
# weight; a value may be None too). The hidden graphs include a node reading one producer twice, a `Constant`
# input, a graph output that nodes also read, a grouping that fuses nothing against one that fuses, and BERT-tiny's
# two mixed plans.

# %%
def edges_alike(graph, groups_a, groups_b):
    """(edges both groupings decide alike, edges between non-Constant nodes)."""
    ...  # your code here


# %%
exercises.agreement.check(edges_alike)

# %% [markdown]
# **Exercise 2: an ATC switch file for the plan's passes.** Write `switch_file(plan)` returning the text of the
# `--fusion_switch_file` (JSON, as `cann.fusion_switch` writes it) that turns off every ATC pass §6 files the plan's
# groups under, and nothing more: a conversion without this plan's passes, to compare on a device with ATC's
# default (`ALL` switches off other passes too, as notebook 16's baseline does for UB fusion). The hidden plans
# include ResNet's, BERT-tiny's (filed under `Fusionlab…` names only), a MatMul with its bias, and a plan with no
# group.

# %%
def switch_file(plan):
    """The JSON text of ATC's --fusion_switch_file for a conversion without the plan's fusions."""
    ...  # your code here


# %%
exercises.atcswitch.check(switch_file)
