# %% [markdown]
# # 14 · Quantization meets fusion in a transformer, where the two collide, and on Ascend
#
# **What you will be able to do**
#
# 1. quantize a small BERT three ways with onnxruntime's static quantizer and read what it runs: `QLinearMatMul`,
#    `MatMulIntegerToFloat`, `QGemm`, and which float fusions (LayerNorm, GELU) a quantize/dequantize pair blocks;
# 2. judge the int8 BERT against float32: accuracy, and speed measured on this CPU with intervals;
# 3. say where fusion and quantization get in each other's way: a per-channel factor folded into int8 weights,
#    and a residual `Add` of two differently scaled tensors;
# 4. map all of it onto CANN's AMCT quantizer and ATC's requant / dequant fusion passes.
#
# Notebook 13 built the int8 arithmetic, showed why BN is folded before quantizing, and quantized a CNN with
# `quantize_static` (its helpers live in `fusionlab.lessons.quantization`); this notebook rebuilds that CNN and
# its spread layer where it needs them. Everything marked *measured* runs on this machine's CPU with onnxruntime;
# we have no Ascend hardware, and every Ascend statement below is cited from the project's CANN notes
# (`shared/reference/cann_facts.md`), not measured.

# %%
import numpy as np
import onnx

from fusionlab import exercises, timing, zoo
from fusionlab.lessons import quantization as quant
from fusionlab.passes import fuse
from fusionlab.text import text_table, wrap
from IPython.display import Markdown, display

np.set_printoptions(precision=4, suppress=True)


# %% [markdown]
# ## 1. A transformer block: QLinearMatMul, MatMulIntegerToFloat, and the fusions QDQ blocks
#
# The zoo's BERT with two layers (hidden 128, two heads, sequence 32, batch 4). Three ways to quantize it: every
# operator the quantizer knows; only the `MatMul`s; only the `MatMul`s and without a quantize on their outputs.
# Under the table, each one's *float islands* (`quant.float_islands`, notebook 13 §2): the ops that read a
# dequantized tensor, so compute in float between the int8 kernels.
#
# **Predict:** onnxruntime fuses a float BERT's written-out LayerNorm and GELU into single kernels (notebook 04).
# Will it still, once quantize/dequantize pairs sit between their ops?

# %%
bert = zoo.bert(layers=2, hidden=128, heads=2, intermediate=512, vocab=1000, batch=4, seq=32)
bert_calib = quant.token_batches(8, 4, 32, 1000, seed=1)
bert_test = quant.token_batches(16, 4, 32, 1000, seed=2)
bert_all = quant.quantize(bert, bert_calib)
bert_mm = quant.quantize(bert, bert_calib, op_types=["MatMul"])
bert_mm_float_out = quant.quantize(bert, bert_calib, op_types=["MatMul"],
                                   extra_options={"OpTypesToExcludeOutputQuantization": ["MatMul"]})
cols = {"float32": quant.op_counts(quant.optimized(bert)), "all ops": quant.op_counts(quant.optimized(bert_all)),
        "MatMul only": quant.op_counts(quant.optimized(bert_mm)),
        "MatMul, float out": quant.op_counts(quant.optimized(bert_mm_float_out))}
shown = ["MatMul", "QLinearMatMul", "MatMulIntegerToFloat", "QGemm", "Gemm", "FusedMatMul", "QLinearAdd",
         "QLinearMul", "QLinearSoftmax", "Softmax", "LayerNormalization", "SkipLayerNormalization", "BiasGelu",
         "Gelu", "ReduceMean", "Pow", "Sqrt", "Erf", "QuantizeLinear", "DequantizeLinear"]
print("op types onnxruntime runs at level ALL (a selection; 'nodes' counts all of them)")
print(quant.op_table(cols, [op for op in shown if any(c[op] for c in cols.values())]))
for name, m in (("all ops", bert_all), ("MatMul only", bert_mm), ("MatMul, float out", bert_mm_float_out)):
    print(f"float islands, {name}: {dict(quant.float_islands(quant.optimized(m)))}")
fusions = {"LayerNorm": ("LayerNormalization", "SkipLayerNormalization"), "GELU": ("Gelu", "BiasGelu"),
           "scores' MatMul + scale": ("FusedMatMul",)}
for name, c in cols.items():
    print(f"float fusions that fire, {name}: {[f for f, ops in fusions.items() if any(c[op] for op in ops)]}")

# %% [markdown]
# - *All ops*: every `MatMul` is a `QLinearMatMul`, every `Add` a `QLinearAdd`, but the LayerNorms and GELUs are
#   still written out (`ReduceMean`, `Pow`, `Sqrt`, `Erf`): their float fusions look for a chain of float ops,
#   and a Q/DQ pair between every two of them breaks the chain. Quantization blocked fusion.
# - *MatMul only*: the `MatMul`s are `QLinearMatMul` (an output quantize follows, so the result is requantised to
#   uint8 inside the kernel); the LayerNorm and GELU fusions fire (`LayerNormalization`, `SkipLayerNormalization`,
#   `BiasGelu`), but not the scores' MatMul + scale that float32 runs as one `FusedMatMul` (notebook 04): a Q/DQ
#   pair now sits between the MatMul and the scaling `Div`, which stays a float island. So do the bias `Add`s
#   after the projections: the float32 model folds them into its `Gemm`s, a `QLinearMatMul` has no bias input.
# - *MatMul, float out*: with no quantize after a MatMul, `DQ, DQ → MatMul` becomes **`MatMulIntegerToFloat`**
#   (integer product, int32 accumulation, scaled back to float inside). Not every time, though: there are
#   `QGemm`s, two `QLinearMatMul`s, and the float islands show `Gemm`s reading two dequantizes. The next cell
#   says which MatMul of the first layer became what.

# %%
ran = quant.optimized(bert_mm_float_out)
became = {}
for n in ran.graph.node:  # a fused node keeps the exported MatMul's name, a Gemm with a suffix
    if n.op_type in ("QLinearMatMul", "MatMulIntegerToFloat", "QGemm", "Gemm") and "/layer.0/" in n.name:
        key = n.name.removesuffix("/MatMulAddFusion").removeprefix("/encoder/layer.0/")
        became[key] = (n.op_type, n.name.endswith("MatMulAddFusion"))
readers = {}
for n in bert_mm_float_out.graph.node:
    for i in n.input:
        readers.setdefault(i, []).append(n)


def after(name, steps=4):
    """The op types that follow node `name` in the QDQ model (first reader each step), up to a QuantizeLinear."""
    out, node = [], next(n for n in bert_mm_float_out.graph.node if n.name == name)
    while len(out) < steps and out[-1:] != ["QuantizeLinear"]:
        node = readers[node.output[0]][0]
        out.append(node.op_type)
    return " → ".join(out)


show_rows = [[k, op, "yes" if gemm else "no", after("/encoder/layer.0/" + k)] for k, (op, gemm) in became.items()]
print("\n".join(text_table(["layer 0 MatMul", "runs as", "Add folded in", "after it in the QDQ model"],
                            show_rows)))
qgemm = next(n for n in ran.graph.node if n.op_type == "QGemm" and "/layer.0/attention/self/query/" in n.name)
bias_type = onnx.helper.tensor_dtype_to_np_dtype(
    next(t for t in ran.graph.initializer if t.name == qgemm.input[6]).data_type)
print(wrap(f"query's QGemm: bias input of type {bias_type}; output scale {qgemm.input[7].rsplit('/', 1)[-1]!r} "
           f"(the scale of the QuantizeLinear after the Transpose), so its output is requantised to uint8"))

# %% [markdown]
# Read the rows:
#
# - the two `QLinearMatMul`s are the attention's probabilities × values (`self/MatMul_1`), one per layer. The
#   option left that MatMul without a quantize of its own, but a Transpose and a Reshape (ops that only move
#   data) lead from it to the `QuantizeLinear` of the next projection's input; onnxruntime moves a quantize
#   across such ops, so the MatMul met a quantize after all and was fused with its output requantised;
# - the scores `Q·Kᵀ` (`self/MatMul`), whose output goes on in float to the scaling `Div` (its quantize comes
#   only after the `Softmax`), became `MatMulIntegerToFloat`, as the option intends;
# - the projections became `Gemm`s with their bias `Add` folded in first (names ending `MatMulAddFusion`:
#   onnxruntime's float `MatMul + Add → Gemm` rewrite). Those of query, key and value became `QGemm`s by the
#   same rule as `MatMul_1`: a Reshape and a Transpose lead to a `QuantizeLinear`, so the `QGemm` takes an
#   int32 bias and requantises its output to that quantize's scale (the line under the table). The attention
#   output and the two MLP projections meet no quantize: their output goes into a residual `Add` and a
#   LayerNorm, or into the GELU's `Div` and `Erf`, ops that compute in float. They stay float `Gemm`s reading
#   dequantized activations and weights.
#
# ## 2. Accuracy against float32
#
# Each int8 BERT against its float32 original (optimisations off) on the test inputs, which calibration never
# saw: the largest absolute error, and the relative error `‖int8 − fp32‖ / ‖fp32‖` over all outputs.
#
# **Predict:** which of §1's three quantizations loses least? Their QDQ models round nested sets of tensors: "all
# ops" every activation, "MatMul only" the MatMuls' inputs and outputs, "MatMul, float out" their inputs only.

# %%
acc = {"all ops": quant.accuracy(bert, bert_all, bert_test),
       "MatMul only": quant.accuracy(bert, bert_mm, bert_test),
       "MatMul, float out": quant.accuracy(bert, bert_mm_float_out, bert_test)}
print("\n".join(text_table(["int8 BERT", "max |error|", "relative error"],
                           [[k] + a.row()[:2] for k, a in acc.items()])))
print(wrap(f"({len(bert_test)} test batches of 4 x 32 tokens; the hidden states of a random-weight model, so a "
           f"relative error, not a task score)"))
order = sorted(acc, key=lambda k: acc[k].rel)
nested = order == ["MatMul, float out", "MatMul only", "all ops"]
display(Markdown("By the relative error: " + ", then ".join(f"{k} ({acc[k].rel:.3f})" for k in order) + (
    "; the fewer tensors rounded, the smaller the error." if nested else
    "; not the order of how many tensors each rounds.")))

# %% [markdown]
# ## 3. Speed on this CPU: does int8 pay?
#
# Notebook 13 §5 timed the int8 CNN against float32 and set the ratio beside the 4× of multiply-adds per
# instruction that AVX-512 VNNI gives int8.
#
# **Predict:** the BERT with its MatMuls in int8 (the fastest-looking variant of §1, the LayerNorm and GELU
# fusions intact), both at full optimisations, one thread each: how close to 4× will it come?

# %%
# NBVAL_IGNORE_OUTPUT
bert_cmp = timing.compare_models(bert, bert_mm, level_a="all", level_b="all", threads=1, feeds=bert_test[0],
                                 label_a="float32", label_b="int8 MatMuls", min_time=3.0)
print(bert_cmp.table())
vnni = quant.VNNI_MACS["int8 (vpdpbusd)"] / quant.VNNI_MACS["fp32 (vfmadd)"]
display(Markdown(bert_cmp.markdown("The BERT with int8 MatMuls") + f" The ratio, {bert_cmp.speedup:.2f}×, is "
                 f"{'below' if bert_cmp.speedup < vnni else 'above'} the {vnni:.0f}× of multiply-adds per "
                 "instruction."))

# %% [markdown]
# Only the MatMuls' inner loops run in int8 instructions. The quantize of every MatMul input, the bias `Add`s
# and scaling `Div`s that §1 found left as float islands, and the LayerNorms, Softmaxes and GELUs run in float as
# before; how much they weigh against the MatMuls depends on the shapes (hidden 128, sequence 32 here). Where the
# ratio lands is the measurement's to say (the sentence above).
#
# ## 4. Where fusion breaks quantization
#
# ### 4.1 Per-channel scales: what a fold must do with them
#
# Fusion after quantization means folding a per-channel multiplier (a BN, a `Mul` by a constant vector, a layer
# scale) into weights that are *already* int8. Per channel, that is exact: `w_c · a_c = (q_c · s_c) · a_c =
# q_c · (s_c · a_c)`, so the integers stay and only the scales change (a negative factor negates the channel's
# integers, exact in −127..127). Per tensor there is one `s` for every channel, which cannot absorb a different
# `a_c` each: the folded weights must be re-rounded onto a new grid.
#
# **Predict:** fold the BN factors of notebook 13 §2's spread layer (rebuilt below) into the int8 weights of its
# first conv, quantized per channel and per tensor. How large is each error against folding in float?

# %%
layer = quant.bn_spread_layer(100.0)
bn = quant.bn_scales(layer)["/bn/BatchNormalization"]
w_raw = quant.weight_of(layer, "/conv1/Conv")
s_pc = (quant.channel_ranges(w_raw) / 127).astype(np.float32)
q_pc = quant.quantize_array(w_raw, s_pc, 0, "int8", axis=0)
s_pt, _ = quant.qparams(w_raw.min(), w_raw.max(), "int8", symmetric=True)
q_pt = quant.quantize_array(w_raw, s_pt, 0, "int8")
a = bn.reshape(-1, 1, 1, 1)
rows = []
for name, qw, sw, axis in (("per channel", q_pc, s_pc, 0), ("per tensor", q_pt, s_pt, None)):
    want = quant.dequantize_array(qw, sw, 0, axis) * a  # the int8 weights' own values, folded in float
    q2, s2 = quant.fold_channel_scale(qw, sw, bn)
    got = quant.dequantize_array(q2, s2, 0, axis if np.size(s2) > 1 else None)
    per_ch = (np.abs(got - want).reshape(len(bn), -1).max(1) / np.abs(want).reshape(len(bn), -1).max(1))
    rows.append([name, "unchanged" if np.array_equal(np.abs(q2), np.abs(qw)) else "re-rounded",
                 f"{np.abs(got - want).max() / np.abs(want).max():.1e}", f"{per_ch.max():.1e}",
                 f"{bn[per_ch.argmax()]:.3f}"])
print("\n".join(text_table(["int8 weights", "integers after the fold", "max error / max |w|",
                            "worst channel", "its BN factor"], rows)))
print(f"BN factors range over {bn.min():.3f} .. {bn.max():.3f}")

# %% [markdown]
# Per channel the fold is exact up to the float32 rounding of the new scales; per tensor it adds a second
# rounding to every weight, and the channel that loses most (relative to its own weights) is one with a small
# factor: its folded weights use only a few of the grid's steps. This is why a compiler that folds after
# quantization (or fuses a scale into an int8 conv) wants per-channel weight scales, and why fusing BN *before*
# calibration is simpler still.
#
# ### 4.2 A residual Add between two differently scaled tensors
#
# Two int8 tensors with different scales cannot be added as integers: `3` in one means `3 · s_a`, in the other
# `3 · s_b`. Each residual `Add` of notebook 13's CNN meets two such tensors, and onnxruntime's `QLinearAdd`
# requantises: `y = round((s_a/s_y)·(q_a − z_a) + (s_b/s_y)·(q_b − z_b)) + z_y`, one multiplier per input.
#
# **Predict:** are the two inputs of the CNN's residual Adds quantized with similar scales?

# %%
cnn = zoo.resnet_small(image_size=64, width=32, batch=4)  # notebook 13 §3's CNN: BNs folded, int8 per channel
cnn_folded = fuse(cnn, rules=("conv_bn",)).graph
cnn_pc = quant.quantize(cnn_folded, quant.image_batches(8, (4, 3, 64, 64), seed=1), per_channel=True)
adds = quant.add_scales(cnn_pc)
print("\n".join(text_table(["Add", "s_a", "s_b", "s_y", "s_a / s_y", "s_b / s_y"],
                           [[d["node"].rsplit("/", 2)[1], f"{d['a'][0]:.4f}", f"{d['b'][0]:.4f}",
                             f"{d['y'][0]:.4f}", f"{d['a'][0] / d['y'][0]:.3f}", f"{d['b'][0] / d['y'][0]:.3f}"]
                            for d in adds])))
ratios = [max(d["a"][0], d["b"][0]) / min(d["a"][0], d["b"][0]) for d in adds]
print(f"{len(adds)} Adds; their two inputs' scales differ by {min(ratios):.2f}x to {max(ratios):.2f}x")

# %% [markdown]
# Our numpy requantisation against onnxruntime's `QLinearAdd` kernel, on the first Add's real scales and random
# uint8 inputs:

# %%
d = adds[0]
rng = np.random.default_rng(0)
qa, qb = (rng.integers(0, 256, 10_000).astype(np.uint8) for _ in range(2))
args = (qa, *d["a"], qb, *d["b"], *d["y"])
ours, ort = quant.requantize_add(*args), quant.run_qlinear_add(*args)
diff = np.abs(ours.astype(int) - ort.astype(int))
print(f"{qa.size} elements: identical {int((diff == 0).sum())}, off by one step {int((diff == 1).sum())}, "
      f"more {int((diff > 1).sum())}")
if diff.any():
    print("(where they differ the exact value is within float32 rounding of a half: the kernel sums in another order)")

# %% [markdown]
# What onnxruntime does *not* do is fuse the Add into the convolution before it. In float at level ALL the
# residual `Add` and its `Relu` go into the conv kernel (the fusion of notebook 03's `conv_add_act`); in int8 they
# cannot, because `QLinearConv` has no input for a second, differently scaled tensor. Count what runs:

# %%
float_all, int8_all = quant.op_counts(quant.optimized(cnn_folded)), quant.op_counts(quant.optimized(cnn_pc))
print(quant.op_table({"float32 at ALL": float_all, "int8 (QDQ) at ALL": int8_all}))
print(f"kernels: float32 {sum(float_all.values())}, int8 {sum(int8_all.values())}; residual Adds run as their own "
      f"kernel: float32 {float_all['Add']}, int8 {int8_all['QLinearAdd']}")

# %% [markdown]
# Each `QLinearAdd` is one more pass over two int8 tensors and one more requantisation per residual block. An int8
# accelerator that wants the conv, the dequantize, the add, the Relu and the next quantize in one kernel needs a
# fusion pass made for exactly that pattern: which is what CANN has.
#
# ## 5. The same picture on Ascend: AMCT and ATC's requant / dequant fusion
#
# On Ascend, quantization is AMCT's job and fusion ATC's. From the project's CANN notes (`cann_facts.md` §8.A;
# documentation read, not run: we have no Ascend device):
#
# - **AMCT folds BN itself.** `quantize_model` applies the BN fusion and the weight calibration (its sample's
#   comment: "Phase1: do conv+bn fusion, weights calibration and generate calibration model"); the switch is
#   `do_fusion`, on by default (`cann_facts.md` §8.A A1, A4). That is notebook 13 §2's lesson built into the
#   tool.
# - **Per-channel weights, per-tensor activations.** Weights are quantized by ARQ with `channel_wise` true or
#   false; activations per tensor only: "The current hardware does not support per-channel quantization for
#   activations and only supports per-channel quantization for weights" (`cann_facts.md` §8.A A3). So on Ascend
#   too, per-channel scales could not rescue notebook 13 §2's unfolded layer, whose harmful tensor is an
#   activation; AMCT avoids it by folding first.
# - **Fake-quant vs deploy model.** AMCT's `save_model` writes a *fake_quant* model that runs on ONNX Runtime in
#   FP32 (our QDQ model plays that part when run with optimisations off; at EXTENDED onnxruntime itself turns the
#   same file into integer kernels) and a *deploy* model with `AscendQuant` (to int8) → int8 Conv → int32 →
#   `AscendDequant` (to float), which only ATC can compile (`cann_facts.md` §8.A A1, A2).
# - **ATC fuses the chains.** The UB fusion passes `TbeConvDequantQuantFusionPass`,
#   `TbeConvDequantVaddReluQuantFusionPass` and `TbeConvDequantVaddReluFusionPass` fuse Conv2D + Dequant
#   (+ Add + Relu) + Quant into one conv2d kernel: the first is our `QLinearConv`, the second the residual block
#   that onnxruntime leaves as `QLinearConv` + `QLinearAdd`. The graph pass `V200RequantFusionPass` (Atlas inference
#   series, the 310P) turns AscendDequant + Relu/Concat + AscendQuant into one `AscendRequant`, and requires equal
#   AscendQuant scales (`cann_facts.md` §8.A A5). According to the same notes, AMCT rewrites
#   AscendDequant + Relu6 + AscendQuant to use a Relu when `(127 - offset) / scale < 6`, since a Relu6 blocks the
#   requant fusion (`cann_facts.md` §8.A A4).
# - **Turning fusion off to compare.** `--fusion_switch_file` with lines such as `RequantFusionPass:off` is how
#   one compares the quantized model layer by layer (`cann_facts.md` §8.A A5), as the BASIC column of notebook 13
#   §3 shows the QDQ model before onnxruntime's integer fusions.

# %%
print(quant.cann_table())

# %% [markdown]
# How much int8 gains on an Ascend card is not something this CPU can measure. The figure the notes give is a
# specification, not a measurement: an Atlas 300I Pro (one Ascend 310P3) is quoted at 140 TOPS INT8 against 70
# TFLOPS FP16, a 2:1 ratio, from repositories that quote Huawei's product page (`cann_facts.md` §8.A A6, marked
# secondary there). Whether a given model reaches it depends, as §3 here and notebook 13 §5 showed, on how much
# of it runs inside the fused int8 kernels.
#
# %% [markdown]
# ## Summary
#
# - A quantized MatMul becomes `QLinearMatMul` (or `QGemm`, its bias folded in) when a quantize follows it, even
#   behind a Reshape or Transpose, and `MatMulIntegerToFloat` (or a float `Gemm`) when its output goes on in
#   float; quantizing every op puts Q/DQ pairs between the ops that the float LayerNorm and GELU fusions need.
# - Per-channel weight scales let a later fold of per-channel factors keep the int8 weights (only the scales
#   change); with one scale per tensor the folded weights are re-rounded onto a new grid.
# - A residual Add of two differently scaled tensors needs its own requantisation: onnxruntime runs it as a
#   separate `QLinearAdd`, ATC's `TbeConvDequantVaddReluQuantFusionPass` fuses it into the conv, and AMCT folds
#   BN itself before calibrating.

# %% [markdown]
# ## Exercises
#
# The exercises check themselves: write your answer in the cell under each task, run it, then run the `check` cell.
# `check` grades it at once on hidden cases and prints PASS with what it checked, or FAIL with a hint naming the
# first case your answer gets wrong and the mistake it looks like. The notebook is stored unanswered; reference
# answers are in the repository's `solutions/` folder, outside the notebooks (try first).
#
# **Exercise 1: which kernel does a quantized MatMul become?** Write `runs_as(after)`: `after` lists the op types
# that follow a `MatMul` with dequantized inputs in a QDQ model, as §1's table did, up to the first
# `QuantizeLinear` or the graph's output (`"Add"` right after the MatMul adds a constant bias, `"Add (residual)"`
# another activation). Return the op onnxruntime runs the MatMul as at level ALL: `"QLinearMatMul"`,
# `"MatMulIntegerToFloat"`, `"QGemm"` or `"Gemm"`. `check` builds each hidden chain as a small QDQ graph and
# reads what onnxruntime made of it; the cases include a quantize behind a Transpose and a Reshape, and one behind
# an op that computes.

# %%
def runs_as(after):
    """The op type onnxruntime runs a MatMul with dequantized inputs as, given the op types after it."""
    raise NotImplementedError  # your code here


# %%
exercises.qkernels.check(runs_as)


# %% [markdown]
# **Exercise 2: add two differently scaled uint8 tensors.** Write `qlinear_add(qa, sa, za, qb, sb, zb, sy, zy)`:
# the uint8 tensor a `QLinearAdd` writes for the uint8 inputs `qa` (scale `sa`, zero point `za`) and `qb`, onto
# the output's grid (`sy`, `zy`), as §4.2 wrote it, without calling `quant.requantize_add`,
# `quant.quantize_array` or `quant.dequantize_array`. `check` compares your answer with onnxruntime's
# (`quant.run_qlinear_add`: DQ, DQ → Add → Q, fused into `QLinearAdd`); the hidden cases include equal scales,
# inputs whose scales differ several times, exact ties and outputs that saturate.

# %%
def qlinear_add(qa, sa, za, qb, sb, zb, sy, zy):
    """uint8 qa + qb, each with its own scale and zero point, requantised onto (sy, zy)."""
    raise NotImplementedError  # your code here


# %%
exercises.qadd.check(qlinear_add)
