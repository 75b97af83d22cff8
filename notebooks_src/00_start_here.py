# %% [markdown]
# # 00 · Start here: operator fusion, done for real
#
# **What you will be able to do after this notebook**
#
# - say what *operator fusion* is, and find your way through the course, in order;
# - name the one pipeline every notebook follows: model → analysis → fusion plan → rewrite → verify → measure → explain;
# - run the notebooks and their tests;
# - build a three-node model, look at it, run it, time it, and say what fusing it would save.
#
# ## Where this comes from
#
# The workbook grew out of a Chinese practitioner's write-up, *Operator fusion in practice in the CANN
# ecosystem*. CANN is the software stack of Huawei's Ascend AI processors. The write-up makes claims such as
# "Conv+BN+ReLU fusion cut YOLOv5 latency by 23%" and "over-fusion raised peak memory by 15–20%". We do not
# repeat any claim blindly: each notebook checks the idea on real ONNX models, with
# [onnxruntime](https://onnxruntime.ai) as the engine. Where the write-up simplifies or is wrong, the notebook
# says so and shows the correct version.
#
# Every quantitative or factual claim of the write-up is listed in one ledger, `docs/seed_claims.md` (in the
# repository, beside `notebooks/`): what it says, our verdict, the evidence and the notebook section that shows
# it. It is generated from `data/seed_claims.json`, and the notebooks print their verdicts from the same file
# (`fusionlab.seed_claims`), so a figure cannot differ between them.
#
# **No Ascend hardware is available here.** Numbers for Ascend devices come from a cost model built on their
# *published* specifications. They are predictions, and they are labelled as such. Numbers for the CPU you
# are running on are *measured*.

# %% [markdown]
# ## What fusion is, in one paragraph
#
# A neural network is a graph of small operators (Conv, BatchNormalization, Relu, MatMul, Add...). Run one
# at a time, each operator reads its input from memory and writes its output back, and each one costs a
# kernel launch. **Fusion** merges several operators into one kernel, so the intermediate tensors never
# make the round trip to memory and there are fewer launches. Sometimes the maths even collapses: a
# BatchNormalization after a Conv can be folded into the Conv's weights, so it disappears entirely.
# Fusion is not free, though. A fused kernel can need more on-chip memory, and fusing too much can be
# slower. Deciding *what* to fuse is the real subject of this workbook.
#
# ## The notebooks, in order
#
# Click a name to open it. Each notebook starts with what you will be able to do and ends with a short summary,
# then exercises that check your answer at once.
#
# | notebook | what it teaches |
# |---|---|
# | [00_start_here](00_start_here.ipynb) | this page: the map, the set-up check, a first taste |
# | [01_fused_loops](01_fused_loops.ipynb) | fusion made real: one generated loop against one pass per op, bytes and GB/s measured |
# | [02_conv_bn_folding](02_conv_bn_folding.ipynb) | fold BatchNormalization into a Conv: the algebra, the edge cases the write-up misses, and checking the result |
# | [03_vertical_cnn](03_vertical_cnn.ipynb) | fuse producer→consumer chains on a CNN (Conv+BN+SiLU): the plan, the legality rules, the saved memory traffic, measured |
# | [04_vertical_transformer](04_vertical_transformer.ipynb) | the same on a transformer export (BERT as torch writes it): BiasGelu, LayerNorm, fused attention, and measured selection |
# | [05_horizontal_fusion](05_horizontal_fusion.ipynb) | fuse sibling branches that read the same input (concatenated weights) |
# | [06_mixed_fusion](06_mixed_fusion.ipynb) | both at once, on real topologies (residual blocks, attention) |
# | [07_cost_model](07_cost_model.ipynb) | a roofline cost model: what a kernel costs on a device, from shapes alone, and working sets in tiles |
# | [08_fusion_thresholds](08_fusion_thresholds.ipynb) | when fusion stops paying: the over-fusion curve, predictions against this CPU, the threshold explorer |
# | [09_reductions](09_reductions.ipynb) | fusing through reductions: softmax and LayerNorm in one pass, measured against the bandwidth |
# | [10_attention](10_attention.ipynb) | attention's N×N intermediate and the kernel that never writes it (FlashAttention), measured and modelled |
# | [11_decoding](11_decoding.ipynb) | LLM decoding: why one token at a time is bandwidth-bound, the KV cache, GQA, rotary, FlashDecoding |
# | [12_llama_decoder](12_llama_decoder.ipynb) | a LLaMA-style decoder fused: the same outputs, tokens per second, CANN's decoding operators |
# | [13_quantization](13_quantization.ipynb) | int8 models: QDQ pairs, what onnxruntime fuses them into on a CNN, why BN is folded first |
# | [14_int8_transformer](14_int8_transformer.ipynb) | int8 in a transformer, where fusion breaks quantization, AMCT and ATC |
# | [15_real_compilers](15_real_compilers.ipynb) | IREE runs the graphs fused, TVM's FuseOps checks the mixed pass, CANN ATC's fusion report |
# | [16_custom_op](16_custom_op.ipynb) | a fused operator of your own: prototype, kernel, and registering it with onnxruntime |
# | [17_profiling](17_profiling.ipynb) | profile a model: op tables, timelines, the profiler's own cost, before and after fusion, and `blame` for a fusion that changed an answer |
# | [18_profiling_fixes](18_profiling_fixes.ipynb) | the seed's three fixes measured (launch gaps, allocation, utilisation) and its evaluation model on the Atlas presets |
# | [19_double_buffering](19_double_buffering.ipynb) | overlap data movement with compute: the pipeline behind "+18%" |
# | [20_dynamic_shapes](20_dynamic_shapes.ipynb) | dynamic shapes on a static-shape compiler: gears, a cache keyed by shape, padding made exact |
# | [21_shape_cache](21_shape_cache.ipynb) | compiling per shape measured: build against run, four caching policies, the seed's "×2.1" |

# %% [markdown]
# ## One pipeline, every time
#
# ```
#  model.onnx ──load──▶ Graph ──analyse──▶ FusionPlan ──rewrite──▶ fused model
#                                              │                       │
#                                              ├── explain (why each group, what it saves)
#                                              └── picture / table     │
#                          verify (same outputs?) ◀────────────────────┤
#                          measure (faster? by how much, how sure?) ◀──┘
# ```
#
# - **model**: an ONNX model, built in code or loaded from a file (`fusionlab.load` checks it first);
# - **analysis**: who produces and who consumes each tensor, what is constant, in what order nodes run;
# - **fusion plan**: which nodes form which group, of what kind (vertical / horizontal / mixed), and why;
# - **rewrite**: a new model where each group is one node;
# - **verify**: run both models on the same random inputs and compare every output within tolerances;
# - **measure**: interleaved timings with confidence intervals, never a single lucky run;
# - **explain**: a table and a picture of what fused, and what it saved.
#
# ## How to run it
#
# From the repository root, `make lab` installs everything into `.venv/` on first use and opens JupyterLab on
# `notebooks/` (bound to 127.0.0.1), on this page. It keeps Jupyter's own files in `.venv/jupyter/`, not
# in your home, and trusts the shipped notebooks, so their stored widgets show without re-running them.
# `make test` runs the unit tests and re-executes every notebook with
# [nbval](https://github.com/computationalmodelling/nbval). nbval compares each cell's output with the stored
# one, so the notebooks stay true. Cells whose output depends on your machine (timings, CPU name) are marked
# `# NBVAL_IGNORE_OUTPUT`.

# %% [markdown]
# ## The ledger of the write-up's claims
#
# How the write-up's claims fare, counted from the ledger (each verdict is explained in `docs/seed_claims.md`):

# %%
from collections import Counter

from fusionlab import seed_claims
from fusionlab.text import wrap

claims = seed_claims.load()
print(f"{len(claims)} claims checked:")
for verdict, n in Counter(c.verdict for c in claims.values()).most_common():
    print(wrap(f"  {n:>2} {verdict:<17} {seed_claims.VERDICTS[verdict]}", indent=" " * 23))

# %% [markdown]
# ## Set-up check
#
# The versions are pinned in `pyproject.toml`: printed numbers and numerics must not drift under the stored
# notebooks. If this cell's output differs from what is stored, your environment is not the pinned one.
# Run `make env` to fix it.

# %%
import numpy as np
from onnx import helper

import fusionlab
from fusionlab import timing, viz
from fusionlab.build import make_model, tensor, value_info

info = timing.machine_info()
for package in ("fusionlab", "numpy", "onnx", "onnx_ir", "onnxruntime", "matplotlib"):
    version = fusionlab.__version__ if package == "fusionlab" else info[package]
    print(f"{package:<12} {version}")

# %% [markdown]
# The machine itself varies from reader to reader, so the next cell is not compared by the tests. Timings
# in this workbook use **one thread** unless a notebook says otherwise. Fusion's effect then does not get
# mixed up with how well a kernel spreads over cores.

# %%
# NBVAL_IGNORE_OUTPUT
for key in ("cpu", "machine", "logical_cores", "usable_cores", "os", "python", "onnxruntime_providers"):
    print(f"{key:<22} {info[key]}")

# %% [markdown]
# ## A first taste: Conv → BatchNormalization → Relu
#
# This is the most common pattern in convolutional networks, and the write-up's first example. We build it
# in code with `fusionlab.build`: a 3×3 convolution from 8 to 16 channels, a BatchNormalization with random
# (but seeded) statistics, and a Relu. Weights are *initializers*: constants stored in the model.

# %%
rng = np.random.default_rng(0)
C_in, C_out, H, W = 8, 16, 64, 64

nodes = [
    helper.make_node("Conv", ["x", "conv.W", "conv.B"], ["conv_out"], name="conv", pads=[1, 1, 1, 1]),
    helper.make_node("BatchNormalization", ["conv_out", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["bn_out"],
                     name="bn", epsilon=1e-5),
    helper.make_node("Relu", ["bn_out"], ["y"], name="relu"),
]
weights = [
    tensor("conv.W", rng.standard_normal((C_out, C_in, 3, 3)).astype(np.float32) * 0.2),
    tensor("conv.B", rng.standard_normal(C_out).astype(np.float32) * 0.1),
    tensor("bn.scale", rng.uniform(0.5, 1.5, C_out).astype(np.float32)),
    tensor("bn.bias", rng.standard_normal(C_out).astype(np.float32) * 0.1),
    tensor("bn.mean", rng.standard_normal(C_out).astype(np.float32) * 0.1),
    tensor("bn.var", rng.uniform(0.5, 2.0, C_out).astype(np.float32)),
]
proto = make_model(nodes, [value_info("x", np.float32, [1, C_in, H, W])],
                   [value_info("y", np.float32, [1, C_out, H, W])], weights, name="conv_bn_relu")

model = fusionlab.load(proto)  # checks the model, then wraps it in a Graph with the queries passes need
print(model)
print("op counts:", model.op_counts())
print("execution order:", [n.name for n in model.topological_order()])

# %% [markdown]
# A picture of it. Boxes are operators; grey pills are the graph's inputs and outputs. Weights are not drawn
# as boxes. `viz.to_dot(model)` gives the same graph as Graphviz DOT text, with the weight shapes in the
# labels, if you have Graphviz elsewhere.

# %%
viz.draw(model, title="Conv → BatchNormalization → Relu")

# %% [markdown]
# ## Run it
#
# `fusionlab.run` builds an onnxruntime session with onnxruntime's own graph optimisations **off**, so
# what runs is exactly our graph, and it feeds seeded random inputs. Relu clips negative values to zero,
# so about half the outputs should be zero.

# %%
outputs = fusionlab.run(model, seed=0)
y = outputs["y"]
print("output y:", y.shape, y.dtype)
print(f"share of zeros after Relu: {np.mean(y == 0):.2f}")
print(f"intermediate tensors (conv_out, bn_out): 2 × {y.nbytes // 1024} KiB each")

# %% [markdown]
# ## What fusing it would save
#
# Unfused, the Conv writes `conv_out` (256 KiB here) to memory and the BatchNormalization reads it back. The
# same happens again for `bn_out` before the Relu. A plan that fuses all three into one kernel removes both
# round trips and two kernel launches. Here is that plan, written by hand. From notebook 03 on, passes find
# such groups themselves.
#
# **Predict before you run the next cell:** each intermediate is 256 KiB, written once and read once. How many
# bytes of memory traffic does fusing all three save?

# %%
intermediate = y.nbytes  # conv_out and bn_out have y's shape and dtype
members = ["conv", "bn", "relu"]
plan = fusionlab.FusionPlan(model="conv_bn_relu")
_ = plan.add(fusionlab.FusionGroup(
    id="g0", kind="vertical", rule="conv_bn_relu", nodes=members,
    op_types=["Conv", "BatchNormalization", "Relu"],
    saved_bytes=2 * 2 * intermediate,  # two tensors, each written once and read once
    kernels=1, saved_launches=len(members) - 1,  # three kernels become one: two launches fewer
    lowered_to="FusedConv (BN folded, Relu fused)",
    reason="a chain: each intermediate has a single consumer and is not a graph output",
))
print(plan)

# %%
viz.draw(model, plan, title="the plan: one vertical group")

# %% [markdown]
# ## A first measurement
#
# `timing.bench_session` runs a session repeatedly after a warm-up and reports the **median**, with a 95%
# confidence interval, and the number of runs. A single run on a shared machine tells you little. Your
# numbers will differ from the stored ones.

# %%
# NBVAL_IGNORE_OUTPUT
sess = fusionlab.session(model, "disable", threads=1)
feeds = fusionlab.make_feeds(model, seed=0, sess=sess)
unfused = timing.bench_session(sess, feeds, label="Conv→BN→Relu, unfused")
print(unfused)

# %% [markdown]
# onnxruntime has fusions of its own. At its `"all"` optimisation level it folds the BatchNormalization into
# the Conv and fuses the Relu too. Below, `timing.interleaved` runs our model in three onnxruntime sessions (its
# optimisations off, at `"extended"`, at `"all"`) **interleaved**: every round runs each once, the order rotated
# from round to round, so that machine drift hits all three alike. `timing.Comparison.from_samples` pairs two of
# them and reports the median of the per-round ratios with a 95% confidence interval; a speedup above 1 means the
# second is faster. (`timing.compare_models` does the same for two models, from notebook 02 on.)

# %%
# NBVAL_IGNORE_OUTPUT
sessions = timing.session_at_each_level(model)  # one thread each
rounds = timing.interleaved({level: (lambda s=sessions[level]: s.run(None, feeds)) for level in ("disable", "extended", "all")},
                            min_time=3)


def paired(a, b, label_a, label_b):
    """B against A, from the same interleaved rounds."""
    return timing.Comparison.from_samples(rounds[a], rounds[b], label_a=label_a, label_b=label_b)


comparison = paired("disable", "all", "ours, unfused", "onnxruntime 'all' (fused)")
comparison

# %% [markdown]
# Not all of that is fusion. Level `"basic"` already folds the BatchNormalization into the Conv (onnxruntime's
# `ConvBNFusion` is a basic-level rewrite); `"extended"` keeps that and adds its fusions, here Conv + Relu into one
# `FusedConv`; `"all"` adds a layout transform on top, rewriting the Conv into its blocked NCHWc form (channels in
# blocks of 8 or 16, which its vector kernels prefer). Separate the fusions (off → extended) from the layout
# (extended → all), from the same rounds as the comparison above:

# %%
# NBVAL_IGNORE_OUTPUT
fusion_only = paired("disable", "extended", "off", "extended")
layout_only = paired("extended", "all", "extended", "all")
together = comparison  # all vs off, the same rounds: one measurement, one figure
for name, c in (("fusions  (extended vs off)", fusion_only), ("layout   (all vs extended)", layout_only),
                ("together (all vs off)     ", together)):
    print(f"{name}: {c.speedup:.2f}x (95% CI {c.ci_low:.2f}-{c.ci_high:.2f})")
print(f"the first two multiplied: {fusion_only.speedup * layout_only.speedup:.2f}x")

# what this means in words, built from the values; which of the two gains more is decided by the two intervals
from IPython.display import Markdown, display

if layout_only.ci_low > fusion_only.ci_high:
    worth = "worth more than the fusions"
elif layout_only.ci_high < fusion_only.ci_low:
    worth = "worth less than the fusions"
else:
    worth = "worth about as much as the fusions (their intervals overlap)"
product = fusion_only.speedup * layout_only.speedup
if together.ci_low <= product <= together.ci_high:
    multiply = (f"The two effects multiply: their product, {product:.2f}×, lies in the interval of all against off "
                f"in the same rounds, {together.speedup:.2f}× (95% CI {together.ci_low:.2f}–{together.ci_high:.2f}).")
else:
    multiply = (f"The two effects multiply only roughly: their product, {product:.2f}×, beside "
                f"{together.speedup:.2f}× (95% CI {together.ci_low:.2f}–{together.ci_high:.2f}) for all against off in "
                f"the same rounds. Each round's ratio of all to off is exactly the product of that round's two factors, "
                f"but the `extended` session's round-to-round noise enters the two factors in opposite directions, and "
                f"the product of two medians is not the median of the products.")
display(Markdown(f"{multiply} On this layer the layout transform "
         f"({layout_only.speedup:.2f}×) is {worth} ({fusion_only.speedup:.2f}×), so \"onnxruntime at `all` is "
         f"{together.speedup:.2f}× faster\" is not a measure of fusion: always say which level you compare with which."))

# %% [markdown]
# Faster is only half the story. A fusion must also give the **same answers**. `fusionlab.verify` runs both
# models on the same random inputs and compares every output within float32 tolerances:

# %%
report = fusionlab.verify(model, model, fused_level="all")
print("onnxruntime's fused model is equivalent:", report.ok)

# %% [markdown]
# ## Summary
#
# - Fusion merges operators so intermediate tensors skip the trip to memory and kernels launch less often;
#   sometimes, as with Conv+BN, the algebra removes an operator outright.
# - Every notebook follows the same pipeline: model → analysis → fusion plan → rewrite → verify → measure → explain.
# - Measurements here are medians with confidence intervals from interleaved runs on this CPU; Ascend numbers are
#   modelled from published specifications, not measured.

# %% [markdown]
# ## Exercises
#
# The exercises check themselves: write your answer in the cell under each task, run it, then run the `check` cell.
# `check` grades it at once on hidden cases and prints PASS with what it checked, or FAIL with a hint naming the
# first case your answer gets wrong and the mistake it looks like. The notebook is stored unanswered; reference
# answers are in the repository's `solutions/` folder, outside the notebooks (try first).
#
# **Exercise 1: BatchNormalization as a scale and a shift.** At inference, BatchNormalization computes
# `gamma * (x - mean) / sqrt(var + eps) + beta` per channel (the model's `bn.scale`, `bn.bias`, `bn.mean`, `bn.var`
# and `epsilon`). That is one multiply and one add, which is why it folds into the Conv before it (notebook 02
# does it by hand). Write `bn_affine(gamma, beta, mean, var, eps)` returning `(scale, shift)`, one value per channel
# each, so that `scale * x + shift` gives the same. `check` compares that with onnxruntime running the
# BatchNormalization; the hidden cases include a negative `gamma`, a variance of 0 and a large `eps`.

# %%
def bn_affine(gamma, beta, mean, var, eps):
    ...  # your code here

# %%
from fusionlab import exercises

exercises.bnaffine.check(bn_affine)

# %% [markdown]
# **Exercise 2: what onnxruntime runs at each level.** "A first measurement" said what each optimisation level
# does to the block: `"basic"` folds the BatchNormalization into the Conv, `"extended"` also fuses the Conv and
# its Relu into one `FusedConv`. Write `ort_ops(ops, level)`: the op types onnxruntime runs, in any order, when it
# loads the chain `ops` (each op reading the one before, such as `["Conv", "BatchNormalization", "Relu"]`) at
# `level`, one of `"disable"`, `"basic"`, `"extended"`. `check` compares your list with the graph onnxruntime
# itself optimises (`fusionlab.compilers.ort.optimized_ops`). The hidden chains include a Conv without BN, a BN
# after the Relu, a BN with no Conv and two blocks in a row.

# %%
def ort_ops(ops, level):
    ...  # your code here

# %%
exercises.levels.check(ort_ops)
