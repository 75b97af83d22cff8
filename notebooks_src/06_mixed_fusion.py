# %% [markdown]
# # 06 · Mixed fusion: grouping ops in any topology
#
# **What you will be able to do**
#
# - classify ops for fusion (elementwise, broadcast, injective, reduction, out-elementwise-fusable, opaque), the
#   vocabulary of TVM's `FuseOps`;
# - build a **post-dominator tree** and follow the grouping algorithm step by step through diamonds and branches;
# - predict how backend thresholds change the groups: **maximum ops per group** (the seed's rule: split above 5 on
#   Atlas 800I A2), an **on-chip buffer budget**, and recompute of a multi-consumer result;
# - lower the groups to ONNX functions and check that the model still computes the same.
#
# The seed (§2.2) calls this "mixed fusion" (complex topologies), with 40–60% gains on Ascend. We cannot
# measure Ascend kernels here; this notebook is about *which* groups form and *why*.

# %%
import collections

import numpy as np
from onnx import helper

from fusionlab import exercises, seed_claims, viz, zoo
from fusionlab.analysis import opclass
from fusionlab.build import make_model, tensor, value_info
from fusionlab.graph import load
from fusionlab.passes import fuse, mixed
from fusionlab.text import wrap
from fusionlab.verification.runtime import verify
from IPython.display import Markdown, display

rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. Op classes
#
# Every op gets a pattern kind; combining two kinds takes the larger one.

# %%
by_kind = {}
for op, kind in opclass.table():
    by_kind.setdefault(kind, []).append(op)
for kind, ops in by_kind.items():
    print(wrap(f"{opclass.OpKind[kind].value}  {kind:<18} {', '.join(ops[:12])}{' ...' if len(ops) > 12 else ''}",
               indent=" " * 22))
print("anything else (Softmax, control flow, custom domains): OPAQUE")

# %% [markdown]
# The rules follow from what a fused kernel can do in one pass over its output:
#
# - elementwise and broadcast ops can be fused into almost anything — they are computed on the fly;
# - injective ops (reshape, transpose, concat) move data; they join when every path stays injective;
# - a reduction can *end* a group (its elementwise inputs are computed on the fly) but nothing is fused after it.
#   This is the rule of TVM's graph partitioner (`graph_partitioner.cc`, which this pass follows: a `kCommReduce`
#   group never fuses into its post-dominator), and it is conservative: a reduction's consumers need the finished
#   result, so fusing them means a kernel that reduces first and then reuses the result on chip. TVM itself does
#   that in its newer Relax pipeline: in TVM 0.27, a `ReduceMean` takes its elementwise *consumers* into its
#   group (`mean + exp`, `mean + sub + square`), but not the elementwise op that *produces* its input, which stays
#   alone (`tests/test_compilers_tvm.py` checks both on TVM; notebook 15 §5 meets the difference on BERT). The
#   legalised `mean` is a sum followed by a division, and Relax treats it like a Conv: an anchor that absorbs
#   elementwise ops after it. Other compilers fuse on both sides: XLA's GPU backend fuses the elementwise ops
#   after a reduction into it (reduction epilogue fusion, on by default:
#   `--xla_gpu_enable_reduction_epilogue_fusion`) and its Triton softmax rewriter makes a whole softmax one
#   kernel, PyTorch Inductor writes softmax or LayerNorm (reductions and the elementwise ops around them) as one
#   kernel, and CANN's graph fusion replaces ONNX's decomposed LayerNorm (ReduceMean, Sub, Pow, ReduceMean, Add,
#   Sqrt, Div, Mul, Add) by one `LayerNorm` kernel (`LayerNormONNXFusionPass`, a built-in graph fusion pass of
#   CANN's ops source, `ops/built-in/fusion_pass/graph_fusion/ai_core/layer_norm_onnx_fusion_pass.h`; our reference notes,
#   `cann_facts.md`, do not list it). Notebook 09 fuses reductions with
#   their consumers;
# - Conv/MatMul (out-elementwise-fusable) can absorb elementwise ops into their output, never another
#   Conv/MatMul;
# - opaque ops stand alone.
#
# ## 2. A branchy graph
#
# A Conv whose output splits into two branches that meet again (a diamond), a second Conv, a
# decomposed LayerNorm-style reduction, and a Softmax.

# %%
def branchy():
    c = 16
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "W1", "b1"], ["c1"], name="conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["r1"], name="relu1"),
        n("Sigmoid", ["r1"], ["s1"], name="sigmoid"),
        n("Mul", ["r1", "s1"], ["m1"], name="silu_mul"),
        n("Tanh", ["r1"], ["t1"], name="tanh"),
        n("Add", ["m1", "t1"], ["a1"], name="join"),
        n("Conv", ["a1", "W2"], ["c2"], name="conv2", kernel_shape=[1, 1]),
        n("Add", ["c2", "b2"], ["c2b"], name="bias2"),
        n("ReduceMean", ["c2b"], ["mu"], name="mean", axes=[1], keepdims=1),
        n("Sub", ["c2b", "mu"], ["d"], name="center"),
        n("Mul", ["d", "d"], ["d2"], name="square"),
        n("ReduceMean", ["d2"], ["var"], name="variance", axes=[1], keepdims=1),
        n("Add", ["var", "eps"], ["ve"], name="add_eps"),
        n("Sqrt", ["ve"], ["sd"], name="sqrt"),
        n("Div", ["d", "sd"], ["nrm"], name="normalise"),
        n("Reshape", ["nrm", "shape"], ["flat"], name="flatten"),
        n("Softmax", ["flat"], ["y"], name="softmax", axis=-1),
    ]
    inits = [tensor("W1", rng.standard_normal((c, 3, 3, 3)).astype(np.float32) * 0.3),
             tensor("b1", rng.standard_normal(c).astype(np.float32)),
             tensor("W2", rng.standard_normal((c, c, 1, 1)).astype(np.float32) * 0.3),
             tensor("b2", rng.standard_normal((c, 1, 1)).astype(np.float32)),
             tensor("eps", np.array(1e-5, np.float32)), tensor("shape", np.array([1, -1], np.int64))]
    return make_model(nodes, [value_info("x", np.float32, [1, 3, 32, 32])],
                      [value_info("y", np.float32, [1, c * 32 * 32])], inits)


g = load(branchy())
for node in g:
    print(f"{node.name:<10} {node.op_type:<11} {opclass.classify(node).name}")

# %% [markdown]
# ## 3. The post-dominator tree
#
# Node *B* post-dominates node *A* when every path from *A* to the end of the graph goes through *B*.
# The immediate post-dominator is the closest one. Fusion only ever merges a node with its immediate
# post-dominator and everything in between — so the merged group has one exit, and no path can leave the
# group and come back (no cycle). The tree is built in one sweep from the outputs backwards: a node's
# post-dominator is the lowest common ancestor, in the tree built so far, of all its consumers.

# %%
tree = mixed.post_dominator_tree(g)
for node, pd in tree.items():
    print(f"{node:<10} -> {pd}")

# %% [markdown]
# `relu1` feeds three ops, yet every path from it meets again at `join`: `join` is its post-dominator.
# `center` feeds `square` and `normalise`; the paths meet at `normalise`. `softmax` has none (`None`): nothing
# post-dominates a node whose output leaves the graph, since a path from it ends there, even when its result is
# also read further.
#
# ## 4. The grouping, step by step
#
# Each node, in topological order, tries to fuse into its post-dominator's group. All nodes on all paths
# in between must pass a condition that depends on the kind; if they do (and the thresholds allow it)
# union-find merges them. Phase 0 lets Conv/MatMul take their elementwise tails and elementwise ops fuse
# forward; phase 1 adds injective ops, after the Conv groups are complete (as TVM does).

# %%
plan, steps = mixed.plan(g, max_group_ops=None, trace=True)
for s in steps:
    print(wrap(s, indent=" " * 15))

# %%
print(plan.table())
for grp in plan:
    print(wrap(f"{grp.id}: stopped because {grp.reason}"))

# %%
viz.draw(g, plan, title="FuseOps groups, no thresholds")

# %% [markdown]
# Read the picture with the trace: `conv1` takes the whole diamond (everything between it and `join` is
# elementwise or broadcast; the trace calls `join` and `square` elementwise although the table above says
# BROADCAST: the planner treats a broadcasting op whose inputs have equal shapes, as theirs do here, as
# elementwise), but stops at `conv2` — one Conv per group. `center` cannot join `normalise`:
# one of its paths runs through a reduction (`variance`), which may only *end* a group. Under the partitioner's
# rule the decomposed LayerNorm takes three or more kernels; a compiler that fuses reductions with their
# consumers (XLA, Inductor, CANN's `LayerNormONNXFusionPass`) runs it as one.
#
# Two nodes' stops in the trace name a **multi-consumer output**: `bias2` feeds `mean` and `center`, and `center` feeds
# `square` and `normalise`. A result read by several ops can join its post-dominator's group only together with
# every path to it; when one of those paths is blocked (here by a reduction), the result must be written to
# memory for the consumers outside the group anyway, so it stays a group's output. `allow_recompute=True` (§5)
# copies a cheap op into each consumer's group instead.
#
# ## 5. Thresholds
#
# **Maximum ops per group.** The seed's rule for Atlas 800I A2 is to split a custom op that fuses more
# than 5 basic ops. TVM's equivalent knob was Relay's `relay.FuseOps.max_depth` (default `256`).
#
# **Predict first:** the graph has 17 nodes. With no limit it makes the groups above; how many kernels will it
# run with `max_group_ops=2`?

# %%
print(f"the graph: {len(g)} nodes")
for max_ops in (None, 5, 3, 2):
    p = mixed.plan(g, max_group_ops=max_ops)
    sizes = [grp.size for grp in p]
    print(f"max_group_ops={str(max_ops):<5} groups={len(p)} sizes={sizes} kernels={len(g) - p.saved_launches}")

# %% [markdown]
# The seed's rule, as the ledger records it. Its verdict waits for notebook 08 §1, which asks you to predict it
# first and then prices the rule on real networks:

# %%
s42 = seed_claims.claim("s42-split-above-5-ops")
print(wrap(f"The seed (§{s42.section}): {s42.says}\n(the ledger's verdict [{s42.id}]: notebook 08 §1)", indent="    "))

# %%
p3 = mixed.plan(g, max_group_ops=3)
viz.draw(g, p3, title="max_group_ops=3")

# %% [markdown]
# **On-chip buffer budget.** A fused kernel keeps its intermediates on chip. On an Ascend AI core that is
# the Unified Buffer: 192 KB on Ascend 910B, 256 KB on 310P3, according to the published specifications
# (`cann_facts.md` §3.3 in the reference notes). A kernel streams its tensors through the UB in tiles, and
# `fusionlab.analysis.working_set` models that, once, for this pass and for the cost model of notebook 07:
#
# - every tensor the group touches takes a tile of `min(size, 16 KB)`: 16 KB is the efficient transfer size
#   (Huawei's Ascend C best-practice guide, [*Transferring a Large Data Block at a Time*](https://www.hiascend.com/document/detail/en/canncommercial/800/opdevg/ascendcbestP/atlas_ascendc_best_practices_10_0013.html): transfers
#   of more than 16 KB reach the best bandwidth);
# - group inputs and outputs are double-buffered (copy-in and copy-out overlap compute): two tiles each;
# - an intermediate takes one tile from the op that makes it to its last reader;
# - Conv/MatMul inputs travel through L1/L0 to the cube unit, not through the UB.
#
# With `buffer_kb`, a group's working set at 16 KB tiles must fit the budget; a group that does not is split.
# (Each feature map here is 16 channels of 32x32 fp32, 64 KB, so every feature map takes a full 16 KB tile; a
# reduction's output, one value per position, is smaller.) The cost
# model asks the converse question, what tile a group gets in a real core's UB and what small tiles cost
# (notebook 07 §3).

# %%
for kb in (None, 96, 64, 48):
    p = mixed.plan(g, max_group_ops=None, buffer_kb=kb)
    ws = [grp.extra["working_set_kb"] for grp in p]
    print(f"buffer_kb={str(kb):<5} groups={len(p)} sizes={[grp.size for grp in p]} working sets KB={ws}")
print(mixed.plan(g, max_group_ops=None, buffer_kb=64)[0].reason)
print(mixed.plan(g, max_group_ops=None, buffer_kb=64)[-1].reason)

# %% [markdown]
# **Recompute.** `center` has two consumers and cannot fuse into its post-dominator. With
# `allow_recompute=True` a cheap (elementwise/broadcast) op like it is *copied* into each consumer's group:
# the subtraction runs twice, but its result is never written to memory.

# %%
pr = mixed.plan(g, max_group_ops=None, allow_recompute=True)
print(pr.table())
print(pr.notes[0])

# %% [markdown]
# ## 6. Lowering and verifying
#
# onnxruntime has no kernel for an arbitrary group, but ONNX can still *express* one: `apply` moves each
# group into a model-local function (`fusionlab.passes.functions.to_functions`) and calls it once. onnxruntime
# inlines the functions when it loads the model, so this shows the grouping rather than speeding it up —
# on Ascend, each function is what would become one custom op. The result must compute the same.

# %%
for opts in ({"max_group_ops": 5}, {"max_group_ops": None, "allow_recompute": True}):
    res = fuse(g, ("mixed",), **opts)
    report = verify(g, res.graph)
    print(wrap(f"{opts} -> {len(res.graph)} nodes; {[grp.lowered_to for grp in res.plan]} "
               f"{'equivalent' if report.ok else 'NOT equivalent'}"))

# %% [markdown]
# ## 7. A zoo model: YOLOv5n
#
# The same algorithm runs unchanged on a real network. YOLOv5 exports Conv+BN+SiLU (SiLU as
# Sigmoid+Mul): each Conv takes its BN and SiLU; residual Adds and Concats decide where groups end.

# %%
yolo = load(zoo.get("yolov5n", image_size=160))
launching = sum(1 for n in yolo.nodes() if n.op_type != "Constant")  # a Constant node launches no kernel
print(f"{len(yolo)} nodes, {launching} of them kernels unfused (the {len(yolo) - launching} Constant nodes launch none)")
count = {}
for max_ops in (None, 5, 3):
    for kb in (None, 192, 64):
        p = mixed.plan(yolo, max_group_ops=max_ops, buffer_kb=kb)
        count[max_ops, kb] = launching - p.saved_launches
        print(f"max_group_ops={str(max_ops):<5} buffer_kb={str(kb):<5} groups={len(p):>3} "
              f"kernels={count[max_ops, kb]:>3} / {launching}")
display(Markdown(
    f"Without a buffer limit a cap of 5 ops gives {count[5, None]} kernels and a cap of 3 {count[3, None]} (no cap: "
    f"{count[None, None]}). A 192 KB budget "
    f"{'changes nothing' if all(count[m, 192] == count[m, None] for m in (None, 5, 3)) else 'changes some counts'}; "
    f"a 64 KB one raises the count to {count[None, 64]} without a "
    f"cap ({count[None, 64] / count[None, None]:.1f}×) and to {count[3, 64]} with a cap of 3 "
    f"({count[3, 64] / count[3, None]:.1f}×)."))

# %% [markdown]
# Why such a jump at 64 KB? Compare the groups the pass forms at 192 KB and at 64 KB, and the working sets it computes for them:

# %%
for kb in (192, 64):
    p = mixed.plan(yolo, max_group_ops=None, buffer_kb=kb)
    patterns = collections.Counter("+".join(g.op_types) for g in p)
    ws = [g.extra["working_set_kb"] for g in p]
    print(f"buffer_kb={kb}: {launching - p.saved_launches} kernels; working sets {min(ws)}-{max(ws)} KB, "
          f"{sum(w > 64 for w in ws)} of {len(ws)} groups above 64 KB")
    for pattern, n in patterns.most_common():
        print(f"  {n:>3} x {pattern}")
_, steps = mixed.plan(yolo, max_group_ops=None, buffer_kb=64, trace=True)
print("why a left-over Sigmoid cannot join its Mul at 64 KB:",
      next(s for s in steps if s.node == "/model.1/act/Sigmoid").reason)
p192 = mixed.plan(yolo, max_group_ops=None, buffer_kb=192)
for size in (4, 5):
    largest = max((grp for grp in p192 if grp.size == size), key=lambda grp: grp.extra["working_set_kb"])
    print(wrap(f"the largest {size}-op group at 16 KB tiles: "
               + mixed.working_set_detail(yolo, largest.nodes).describe(16 * 1024)))

# %%
# the same counts in words, computed from the two plans (so the sentence and the tables cannot disagree)
plans = {kb: mixed.plan(yolo, max_group_ops=None, buffer_kb=kb) for kb in (192, 64)}
kernels = {kb: launching - p.saved_launches for kb, p in plans.items()}
sets = collections.defaultdict(list)
for grp in plans[192]:
    sets[grp.size].append(grp.extra["working_set_kb"])
four, five = sets[4], sets[5]
total = len(plans[192])
above = sum(w > 64 for w in four + five)
stopped = sum(grp.size == 2 for grp in plans[64])
assert kernels[192] + 2 * stopped + len(five) == kernels[64]  # the arithmetic of the last sentence
display(Markdown(
    f"It is a cliff, not a slope. In this tile model (the two accounts above) a Conv + BN + SiLU group holds at most "
    f"four 16 KB tiles at once: the Conv's inputs travel through L1, so the UB holds at most two intermediates at a "
    f"time (the BN's output stays live until both the Sigmoid and the Mul have read it) and the group's output (two "
    f"tiles, double-buffered), plus the BN's per-channel parameters (small, double-buffered too): "
    f"{min(four)}–{max(four)} KB for the {len(four)} four-op groups (less where a tensor is smaller than a tile). "
    f"The {len(five)} five-op groups add the residual input (two tiles, double-buffered), and the Mul's output "
    f"becomes an intermediate, live with the BN's and the Sigmoid's while the Mul runs (one tile more): "
    f"{min(five)}–{max(five)} KB, up to {int(max(five) // 16)} tiles. {above} of the "
    f"{total} groups need more than 64 KB. At 192 KB every Conv takes its BN, Sigmoid and Mul, and the residual "
    f"`Add`s ride along. A 64 KB budget is just under that: {stopped} of the {total} groups stop after the BN. The "
    f"Sigmoid and Mul left behind cannot even pair up, because their input now arrives from memory, double-buffered "
    f"(two tiles instead of one), and the pair needs more than the budget (the \"why a left-over Sigmoid\" line above). So each Conv group "
    f"that stopped leaves two single-op kernels behind, and the residual `Add`s run alone too: {kernels[192]} + 2 × "
    f"{stopped} + {len(five)} = {kernels[64]}. A budget that sits just below the working set of a common pattern "
    f"changes the plan of the whole network at once."))

# %% [markdown]
# No Ascend core has a 64 KB UB, though: at the real 192 KB (910B) or 256 KB (310P3, `cann_facts.md` §3.3) every group of this network
# fits at 16 KB tiles, and the pass forms as many kernels as without a budget (the `buffer_kb=192` rows above). Is the seed's "split above 5
# ops" a step like this one, set by one device's buffer? Notebook 08 §1 asks you to predict that for YOLOv5 and
# BERT on the Atlas 800I A2 preset, the card of the rule, and then answers it.

# %%
yp = mixed.plan(yolo, max_group_ops=5, buffer_kb=192)
reasons = {}
for grp in yp:
    key = grp.reason.split(";")[-1].split("(")[0].strip()
    reasons[key] = reasons.get(key, 0) + 1
for key, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
    print(f"{n:>3} groups stopped: {key}")

# %%
first = yp[4]
viz.draw(yolo, yp, nodes=viz.neighbourhood(yolo, first.nodes, hops=1), title=f"YOLOv5n around {first.id}")

# %%
yres = fuse(yolo, ("mixed",), max_group_ops=5, buffer_kb=192)
print(len(yolo), "->", len(yres.graph), "nodes;", "equivalent" if verify(yolo, yres.graph).ok else "NOT equivalent")

# %% [markdown]
# The seed's 40–60% for mixed fusion, and the ledger's verdict:

# %%
print(seed_claims.claim("s22-mixed-40-60pct").summary())

# %% [markdown]
# ## Summary
#
# - Ops are classified by how their output depends on their inputs, and fusion follows the post-dominator tree, so
#   groups have one exit and never form cycles.
# - Backend limits reshape the groups (a cap on ops per group, the on-chip buffer, recompute), each group records why
#   it stopped, and a budget just below a common pattern's working set is a cliff.
# - Lowered to ONNX functions the model still verifies; onnxruntime inlines them, so the seed's 40–60% is not
#   measured here (notebook 07 models it).

# %% [markdown]
# ## Exercises
#
# The exercises check themselves: write your answer in the cell under each task, run it, then run the `check` cell.
# `check` grades it at once on hidden cases and prints PASS with what it checked, or FAIL with a hint naming the
# first case your answer gets wrong and the mistake it looks like. The notebook is stored unanswered; reference
# answers are in the repository's `solutions/` folder, outside the notebooks (try first).
#
# **Exercise 1: choose a `max_group_ops` that meets a memory budget.** The model below is a chain of elementwise
# ops on maps of the size of §5's; some of its ops read another full-size input. The mixed pass groups the chain,
# and every group's working set, by §5's tile rule (two tiles for each tensor read from or written to memory, one
# for each intermediate still live), must fit the Unified Buffer of one core of the device printed below. Which is
# the **largest** `max_group_ops` whose plan has every group's working set at most the budget (a working set
# equal to it fits)? Work it out from the tile rule first (the chain is short), then answer with an int; `check`
# plans the chain at every cap to grade it.

# %%
chain = load(exercises.thresholds.model())
print(wrap(" -> ".join(f"{n.op_type}({', '.join(v.name for v in n.inputs)})" for n in chain.nodes())))
print(f"each map {chain.graph.inputs[0].shape} float32, {np.prod(chain.graph.inputs[0].shape.numpy()) * 4 // 1024} KB; "
      f"budget {exercises.thresholds.BUDGET_KB:g} KB, the UB of one {exercises.thresholds.DEVICE} core")

# %%
max_group_ops = ...  # your answer: an int

# %%
exercises.thresholds.check(max_group_ops)

# %% [markdown]
# **Exercise 2: the post-dominator tree.** Write `post_dominators(consumers, outputs)`: every node's immediate
# post-dominator, or None, as §3 builds them. A DAG comes as `consumers`, {node: [the nodes that read its result]}
# in topological order, and `outputs`, the nodes whose result is also a graph output. `exercises.postdom.as_dag(g)`
# gives §3's graph in this form (the cell below prints a node of it): your answer on it should give §3's tree.
# `check` builds hidden DAGs as ONNX graphs and compares with `mixed.post_dominator_tree`: diamonds, unbalanced
# and nested branches, a graph output mid-graph, a shortcut past a join.

# %%
def post_dominators(consumers, outputs):
    """{node: its immediate post-dominator, or None}, for every node of the DAG."""
    ...  # your code here


consumers, outputs = exercises.postdom.as_dag(g)
print("relu1 ->", consumers["relu1"], "| graph outputs:", outputs)

# %%
exercises.postdom.check(post_dominators)
