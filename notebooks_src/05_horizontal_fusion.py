# %% [markdown]
# # 05 · Horizontal fusion: Inception branches and Q/K/V
#
# **What you will be able to do**
#
# - turn sibling ops that read the same tensor into **one wide op plus a `Split`**, with the two lines of algebra
#   that make it exact;
# - find siblings with `fusionlab.passes.horizontal` (BERT's Q/K/V projections, Inception's 1x1 branches) and say
#   what makes a candidate *illegal*;
# - check the rewrite against the unfused model and measure it honestly, with onnxruntime's own optimisations off
#   and on, at small and larger batch sizes;
# - say when horizontal fusion helps, when it does not, and where onnxruntime's own horizontal fusion lives.
#
# The seed (§2.2) files horizontal fusion under "parallel branches", medium complexity, with a gain of
# 15–25%, and advises vertical fusion first. Those numbers come from Ascend hardware we do not have; here we
# measure what this machine does, running the vertical pass first as the seed advises.

# %%
import collections
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from fusionlab import exercises, seed_claims, timing, viz, zoo
from fusionlab.analysis import derive
from fusionlab.build import make_model, tensor, value_info
from fusionlab.graph import load
from fusionlab.passes import fuse, horizontal
from fusionlab.plan import FusionPlan
from fusionlab.timing import compare_models
from fusionlab.verification.runtime import session, verify
from IPython.display import Markdown, display

rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. The derivation
#
# A MatMul `y = x @ W + b` with `W` of shape (K, N): output column `n` reads only column `n` of `W` and
# `b[n]`. Put the weights of three siblings side by side, `W = [W_q | W_k | W_v]`, and the columns of
# `x @ W + b` are the columns of the three results, in order. Splitting the wide result on its last axis
# hands each consumer exactly what it had before. A Conv is the same along its output channels (axis 0
# of the weight, axis 1 of the result) — provided the siblings share strides, pads, dilations and kernel
# size, and `group = 1`.
#
# `fusionlab.analysis.derive.concat_matmul_weights` does the concatenation; let us check the claim numerically.

# %%
x = rng.standard_normal((4, 8)).astype(np.float32)
ws = [rng.standard_normal((8, n)).astype(np.float32) for n in (3, 5, 2)]
bs = [rng.standard_normal(n).astype(np.float32) for n in (3, 5, 2)]
w_cat, b_cat, sizes = derive.concat_matmul_weights(ws, bs)
wide = x @ w_cat + b_cat
parts = np.split(wide, np.cumsum(sizes)[:-1], axis=-1)
print("wide weight", w_cat.shape, "split sizes", sizes)
for i, (part, w, b) in enumerate(zip(parts, ws, bs)):
    print(f"branch {i}: equal to its own MatMul + Add within 1e-6: {np.allclose(part, x @ w + b, rtol=1e-6, atol=1e-6)}")

# %% [markdown]
# Each output column is the same dot product, computed from the same numbers, so the difference is zero
# or at rounding level (a BLAS library may sum a wide matrix in a different order than a narrow one).
#
# ## 2. A Q/K/V block, fused
#
# A transformer layer projects its input three times — query, key, value — with three MatMul+Add pairs
# that all read the same tensor. We build that block in code.

# %%
def qkv_block(hidden=64):
    nodes, inits = [], []
    for p in ("query", "key", "value"):
        nodes += [helper.make_node("MatMul", ["h", f"W_{p}"], [f"{p}_mm"], name=f"{p}/MatMul"),
                  helper.make_node("Add", [f"{p}_mm", f"b_{p}"], [p], name=f"{p}/Add")]
        inits += [tensor(f"W_{p}", rng.standard_normal((hidden, hidden)).astype(np.float32) * 0.1),
                  tensor(f"b_{p}", rng.standard_normal(hidden).astype(np.float32))]
    nodes += [helper.make_node("MatMul", ["query", "key_t"], ["scores"], name="scores"),
              helper.make_node("Transpose", ["key"], ["key_t"], name="key_T", perm=[0, 2, 1]),
              helper.make_node("MatMul", ["scores", "value"], ["y"], name="context")]
    nodes = [nodes[i] for i in (0, 1, 2, 3, 4, 5, 7, 6, 8)]  # keep topological order
    shape = ["batch", "sequence", hidden]
    return make_model(nodes, [value_info("h", np.float32, shape)], [value_info("y", np.float32, shape)], inits)


block = load(qkv_block())
plan = horizontal.plan(block)
print(plan.table())
print(plan[0].reason)

# %% [markdown]
# One group: six nodes (three MatMul, three Add) become one MatMul, one Add and one Split. The picture
# shows the group before the rewrite, and the graph after it.

# %%
result = fuse(block, ("horizontal",))
viz.before_after(block, result.graph, plan, titles=("before: three projections", "after: one wide MatMul + Split"))

# %%
print(result.summary())
print("graph outputs:", [o.name for o in result.graph.outputs()])
split = next(n for n in result.graph if n.op_type == "Split")
print("the Split hands on:", [o.name for o in split.outputs])

# %% [markdown]
# The values the branches handed on (`query`, `key`, `value`) keep their names: every downstream consumer
# and every graph output is untouched. Now the oracle: onnxruntime with optimisations **off** runs the
# original, and the fused model must match it (fp32: rtol 1e-4, atol 1e-5) at several input sizes.

# %%
for dims in ({"batch": 1, "sequence": 8}, {"batch": 4, "sequence": 32}):
    report = verify(block, result.graph, dims=dims)
    print(dims, "equivalent" if report.ok else "NOT equivalent", "| max abs error below 1e-5:", report.max_abs < 1e-5)

# %% [markdown]
# ## 3. What makes siblings *not* fusable
#
# The pass leaves a candidate alone unless it can prove the rewrite legal:
#
# | condition | why |
# |---|---|
# | weights (and biases) are constants, not graph inputs | the wide weight is computed once, at rewrite time |
# | same attributes (kernel, strides, pads, dilations), `group = 1` | otherwise the wide op computes something else |
# | no sibling depends on another | the fused node would need its own output: a cycle (AMDMIGraphX's horizontal fusion batched two dependent dot products this way and built one; its PR #5250 added this check, `docs/reliability_anchors.md` item 27) |
# | followers join only if *every* branch has the same one, with one consumer, not a graph output | a graph output must stay a real tensor |
#
# Two examples: a sibling with stride 2 among stride-1 siblings, and a MatMul whose weight is an input.

# %%
def three_convs(stride_b):
    nodes, inits = [], []
    for k, s in (("a", 1), ("b", stride_b), ("c", 1)):
        nodes.append(helper.make_node("Conv", ["x", f"W{k}"], [k], name=f"conv_{k}", kernel_shape=[1, 1],
                                      strides=[s, s]))
        inits.append(tensor(f"W{k}", rng.standard_normal((4, 8, 1, 1)).astype(np.float32)))
    outs = [value_info(k, np.float32, None) for k in "abc"]
    return make_model(nodes, [value_info("x", np.float32, [1, 8, 8, 8])], outs, inits)


p = horizontal.plan(load(three_convs(stride_b=2), check=False))
print("stride 2 in the middle ->", [sorted(g.nodes) for g in p])

nodes = [helper.make_node("MatMul", ["x", "W"], ["a"], name="fixed_weight"),
         helper.make_node("MatMul", ["x", "w_in"], ["b"], name="weight_is_an_input")]
m = make_model(nodes, [value_info("x", np.float32, [2, 8]), value_info("w_in", np.float32, [8, 8])],
               [value_info("a", np.float32, [2, 8]), value_info("b", np.float32, [2, 8])],
               [tensor("W", rng.standard_normal((8, 8)).astype(np.float32))])
p = horizontal.plan(load(m))
print("dynamic weight ->", len(p), "groups;", p.notes)

# %% [markdown]
# ## 4. BERT-tiny: Q/K/V in every layer
#
# The zoo's BERT is exported the way `torch.onnx` does it: Q, K and V are three sibling MatMul+Add pairs
# on the LayerNorm output. BERT-tiny has two layers. As the seed advises, the vertical pass runs first
# (`fuse(model, ("vertical", "horizontal"))` runs the passes in that order); it fuses the LayerNorms, the
# bias + GELU of the feed-forward block and each layer's scaled scores MatMul (`FusedMatMul`, the scale folded in:
# one MatMul node fewer per layer), and leaves the projections to the horizontal pass.
#
# **Predict first:** how many MatMul nodes will the two layers have after the horizontal pass, out of 16?

# %%
bert = load(zoo.get("bert_tiny"))
bert_vertical = fuse(bert, ("vertical",))
bert_fused = fuse(bert, ("vertical", "horizontal"))
print(FusionPlan([g for g in bert_fused.plan if g.kind == "horizontal"]).table())
print("MatMul:", bert_fused.before["MatMul"], "->", bert_fused.after["MatMul"],
      "| Add:", bert_fused.before["Add"], "->", bert_fused.after["Add"])
for dims in ({"batch": 1, "sequence": 16}, {"batch": 8, "sequence": 64}):
    report = verify(bert, bert_fused.graph, dims=dims)
    print(dims, "equivalent" if report.ok else "NOT equivalent")

# %% [markdown]
# ## 5. Inception: sibling 1x1 convolutions
#
# Each Inception-A block opens three of its four branches with a 1x1 Conv (+BN+ReLU) on the block input.
# Vertical fusion runs first: it folds every BN into its Conv and fuses the ReLU, so each branch opens with one
# `FusedConv`. The horizontal pass then stacks the three sibling `FusedConv`s into one and splits once.
# (Run the horizontal pass alone and it must stack Conv, BN and ReLU three times over: more work for the same
# result, which is why the vertical pass goes first.) A small Inception (75x75 input, a quarter of the
# channels) keeps this notebook fast.

# %%
inc = load(zoo.get("inception", image_size=75, width=0.25))
inc_vertical = fuse(inc, ("vertical",))
inc_fused = fuse(inc, ("vertical", "horizontal"))
inc_horizontal = FusionPlan([g for g in inc_fused.plan if g.kind == "horizontal"])
print(inc_horizontal.table())
print(inc_fused.summary())
for dims in ({"batch": 1}, {"batch": 8}):
    print(dims, "equivalent" if verify(inc, inc_fused.graph, dims=dims).ok else "NOT equivalent")

# %%
group = inc_horizontal[1]
after_vertical = inc_vertical.graph
viz.draw(after_vertical, inc_horizontal, nodes=viz.neighbourhood(after_vertical, group.nodes, hops=1),
         title=f"{group.id}: {len(group.extra['branches'])} sibling branches on {group.extra['input']}")

# %% [markdown]
# `saved KiB` in the table is the honest balance: the shared input is read once instead of three times,
# but the `Split` writes the outputs once more and the consumers read them back. The balance can be zero or
# negative. For BERT's Q/K/V the three outputs together are three times the size of the input, so the
# Split copies more bytes than the shared read saves (the negative BERT rows above). The gain must come from
# fewer launches and one wider GEMM, which is why the next section measures instead of assuming.
#
# ## 6. Measure: does it pay on this machine?
#
# `compare_models` runs two models interleaved, one intra-op thread, and reports the median of the per-round
# ratios time(A)/time(B) with a 95% confidence interval: above 1 means B is faster. To see what the horizontal pass
# adds, A is the model after the vertical pass and B the model after vertical and horizontal. We measure twice:
#
# - both models with onnxruntime's optimisations **off** (`disable`): the effect of our rewrite alone;
# - both with optimisations **on** (`all`): what is left once onnxruntime has done its own fusions.
#
# Timings vary from run to run and machine to machine, so these cells are not compared by the tests.
#
# **Predict first:** the seed promises 15–25% for horizontal fusion. For BERT-tiny's Q/K/V and Inception's 1x1
# branches, at batch 1 and batch 8, with onnxruntime off and at `all`: where will the fused model be faster, and by
# how much?

# %%
# NBVAL_IGNORE_OUTPUT
cases = [("BERT-tiny", bert_vertical.graph, bert_fused.graph, {"batch": 1, "sequence": 16}),
         ("BERT-tiny", bert_vertical.graph, bert_fused.graph, {"batch": 8, "sequence": 64}),
         ("Inception-tiny", inc_vertical.graph, inc_fused.graph, {"batch": 1}),
         ("Inception-tiny", inc_vertical.graph, inc_fused.graph, {"batch": 8})]
rows = []
for label, a, b, dims in cases:
    for level in ("disable", "all"):
        c = compare_models(a, b, level_a=level, level_b=level, dims=dims, min_time=1.0)
        rows.append((label, dims, level, c))
print(f"{'model':<15} {'sizes':<28} {'ORT level':<9} {'A/B':>6}  95% CI")
for label, dims, level, c in rows:
    print(f"{label:<15} {str(dims):<28} {level:<9} {c.speedup:>6.2f}  {c.ci_low:.2f}–{c.ci_high:.2f}  "
          f"{timing.ratio_verdict(c.ci_low, c.ci_high)}")

# %% [markdown]
# The seed's claim and the ledger's verdict, beside the measurement:

# %%
print(seed_claims.claim("s22-horizontal-15-25pct").summary())

# %% [markdown]
# ## 7. When it helps, and when it does not
#
# Read the table above with these mechanisms in mind:
#
# - **Fewer, bigger kernels.** Three small GEMMs become one GEMM three times as wide: one launch instead of
#   three, one pass over the input, and a wider matrix keeps the vector units busier. This matters most
#   when each sibling is small — batch 1, short sequences — where per-op overhead is a large share.
# - **The Split is not free.** onnxruntime's `Split` copies its input into new buffers. When the siblings
#   are large (big batch, long sequence), that extra write and read can eat the gain.
# - **onnxruntime has its own rewrites.** Its MatMul+Add→Gemm fusion is 2-D only (a BASIC pass), so it leaves
#   these 3-D projections alone, but its layout and activation fusions at `all` change what the siblings cost.
#   A rewrite that wins with optimisations off may be a wash with them on — the comparison at `all` is the one
#   deployment sees.
# - **Convolutions.** A 1x1 Conv is a GEMM too; stacking three of them widens it. Inception's small
#   feature maps at 75x75 make each branch tiny, which is where fewer launches should pay most. Yet at `all`
#   the horizontally fused Inception is *slower* in the benchmark (`benchmarks/results/horizontal.md`, its last
#   run printed below) at both batch sizes; the table above says what your run measured. The favourable case on
#   paper is not one in practice, and the next cell shows why.

# %%
bench_rows = {(sizes, level): seed_claims.benchmark_cell(
    seed_claims.ROOT / "benchmarks/results/horizontal.md",
    {"model": "Inception-v3-style (149 px, width 0.5)", "sizes": sizes, "ORT level (both)": level}, "A/B median")
    for sizes in ("batch 1", "batch 8") for level in ("disable", "all")}
print("benchmark, Inception-v3-style, horizontal pass alone, A/B (> 1: fused faster):")
for (sizes, level), ratio in bench_rows.items():
    print(f"  {sizes}, onnxruntime {level:<7}: {ratio}")

# %% [markdown]
# At `all`, onnxruntime rewrites convolutions into its blocked NCHWc layout (on x86 CPUs with AVX2 or better) and
# keeps the data in that layout from one conv to the next. A `Split` has no NCHWc kernel, so around every fused
# group the data must be reordered out of the blocked layout and back in. Count the kernels onnxruntime really
# runs at `all`, after the vertical pass alone and after vertical + horizontal:

# %%
# NBVAL_IGNORE_OUTPUT
def ort_kernels(graph, level="all"):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "optimised.onnx"
        session(graph, level, optimized_path=path)
        return collections.Counter(n.op_type for n in load(path, check=False).topological_order())


counted = {}
for name, graph in (("vertical", inc_vertical.graph), ("vertical + horizontal", inc_fused.graph)):
    k = ort_kernels(graph)
    print(f"{name:<22} {sum(k.values()):>3} kernels at 'all': Conv {k['Conv']}, Split {k['Split']}, "
          f"ReorderInput {k['ReorderInput']}, ReorderOutput {k['ReorderOutput']}")
    counted[name] = k

v, h = counted["vertical"], counted["vertical + horizontal"]
reorders = sum(h[op] - v[op] for op in ("ReorderInput", "ReorderOutput"))
display(Markdown(f"On this machine the horizontal pass removed {v['Conv'] - h['Conv']} convolutions but made "
                 f"onnxruntime run {sum(h.values()) - sum(v.values())} more kernels: {h['Split']} `Split`s and "
                 f"{reorders} more layout reorders. Fewer nodes in the graph we hand over is not fewer kernels in "
                 f"the graph that runs."))

# %% [markdown]
# **Where onnxruntime's own horizontal fusion lives.** onnxruntime has no general horizontal fusion. Its Q/K/V
# fusion is part of `AttentionFusion` (level `extended`): when it recognises a whole self-attention block (the
# three MatMul+Add projections, the reshapes and transposes, the softmax and the context MatMul), it replaces the
# block with one `com.microsoft:Attention` node whose weight is Q, K and V concatenated, exactly the wide GEMM
# above. It matches the forms its own exporter tools write; on this BERT-tiny export it does not fire:

# %%
ops = ort_kernels(bert, "extended")
print("Attention nodes after onnxruntime's extended level:", ops.get("Attention", 0),
      "| MatMul:", ops.get("MatMul", 0), "| FusedMatMul:", ops.get("FusedMatMul", 0))

# %% [markdown]
# TVM's older Relay pipeline had horizontal passes, `CombineParallelConv2D` and `CombineParallelDense`, moved to
# opt-level 4, off by default, because the wide op they create is a new workload whose speed nobody had tuned and
# they regressed performance (TVM PR #3248; the research notes `../shared/reference/reliability_anchors.md`, item 29).
# Relay was phased out of TVM after v0.19 (apache/tvm PR #17656), so the TVM 0.27 the benchmarks install (notebook 15
# reads their committed output) has neither pass. Its Relax pipeline has a horizontal pass for matmuls, `relax.transform.CombineParallelMatmul`:
# matmuls that share their left operand become one matmul and slices, with a bias add or activation they all share;
# we have not run it here. Horizontal fusion is a candidate to *measure*, never to assume; the seed's "15–25%" is a
# claim about Ascend kernels.
#
# ## Summary
#
# - Siblings that read the same tensor with constant weights and equal attributes become one wide op and a
#   `Split`, exact by the concatenated weights; the pass refuses what it cannot prove legal.
# - Run the vertical pass first, as the seed advises, so horizontal groups stack single fused ops.
# - Whether it is faster depends on sizes and on what onnxruntime already does (at `all` the `Split` breaks its NCHWc
#   layout): measure both ways.

# %% [markdown]
# ## Exercises
#
# The exercises check themselves: write your answer in the cell under each task, run it, then run the `check` cell.
# `check` grades it at once on hidden cases and prints PASS with what it checked, or FAIL with a hint naming the
# first case your answer gets wrong and the mistake it looks like. The notebook is stored unanswered; reference
# answers are in the repository's `solutions/` folder, outside the notebooks (try first).
#
# **Exercise 1: Q, K and V as one MatMul.** Write `fuse_qkv(Wq, bq, Wk, bk, Wv, bv)` returning `(W, b, split)`:
# the wide weight, the wide bias and the `Split`'s sizes, with numpy (§1 derived them; write them yourself rather
# than call `derive.concat_matmul_weights`). Each `W*` is (K, N); a `b*` may be None (a bare MatMul); return
# `b = None` when no projection has a bias. `check` runs one MatMul + Add + Split with your answer against
# onnxruntime running the three projections. The hidden cases include K and V narrower than Q (grouped-query
# attention), no biases, K alone without one (as in Whisper) and float16.

# %%
def fuse_qkv(Wq, bq, Wk, bk, Wv, bv):
    """(W, b, split): one wide MatMul + Add whose Split hands Q, K and V back."""
    ...  # your code here


# %%
exercises.qkv.check(fuse_qkv)

# %% [markdown]
# **Exercise 2: which siblings stack?** Write `can_stack(a, b)`: True when the horizontal pass puts ops `a` and `b`
# in one group (§3). Each is a `Sibling` with `name`, `op` (`"Conv"` or `"MatMul"`), `reads` (the tensor it
# reads), `weight` (a numpy array, or None when the weight is a graph input) and `attrs` (the node's attributes,
# as the cell below shows). `check` asks about every pair in hidden sets of siblings and compares with
# `horizontal.plan`: Q, K and V of different widths, Inception's 1x1 branches, and near misses (strides, kernel,
# dilation, `group=2`, a weight that is a graph input, another input tensor). §1 says which weight axis is stacked.

# %%
def can_stack(a, b):
    """Whether the horizontal pass stacks siblings a and b into one wide op."""
    ...  # your code here


print(exercises.siblings.Sibling("conv_b", "Conv", "x", np.zeros((4, 8, 1, 1), np.float32),
                                 {"kernel_shape": [1, 1], "strides": [2, 2]}))

# %%
exercises.siblings.check(can_stack)
