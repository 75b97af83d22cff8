# %% [markdown]
# # 13 · Quantization meets fusion: int8 on a CPU, from the bytes to QLinearConv
#
# **What you will be able to do**
#
# 1. compute an int8 scale and zero point by hand, check your numbers against onnxruntime's own
#    `QuantizeLinear` / `DequantizeLinear` kernels, and requantise an int32 accumulator as an int8 kernel does;
# 2. explain why a BatchNormalization must be folded into its convolution *before* quantizing, and show on a
#    measured example what goes wrong when it is not;
# 3. quantize a small CNN with onnxruntime's own static quantizer (`quantize_static`, QDQ format, calibration data
#    made here), and read what onnxruntime's optimiser fuses the QDQ pairs into: `QLinearConv`, `QLinearAdd`;
# 4. judge the int8 CNN against float32: accuracy, and speed measured on this CPU with intervals.
#
# You know Conv+BN folding (notebook 02) and vertical fusion (notebook 03). Everything here runs on this machine's
# CPU with onnxruntime. Notebook 14 takes the same quantizer to a transformer, shows where fusion and quantization
# get in each other's way, and maps it all onto CANN's AMCT and ATC.

# %%
import numpy as np
import onnx

import fusionlab
from fusionlab import exercises, timing, zoo
from fusionlab.lessons import quantization as quant
from fusionlab.passes import fuse
from fusionlab.text import text_table, wrap
from fusionlab.verification import runtime
from IPython.display import Markdown, display

np.set_printoptions(precision=4, suppress=True)


def as_proto(model):
    """A fusionlab Graph (what `fuse` returns) as a plain ModelProto."""
    return onnx.load_model_from_string(runtime.model_bytes(model))


# %% [markdown]
# ## 1. The bytes: what an int8 tensor is
#
# An int8 tensor is a float tensor stored as small integers plus a rule to get the floats back. Each tensor
# (or each output channel of a weight) gets two numbers, a **scale** `s` and a **zero point** `z`:
#
# - quantize: `q = saturate(round(x / s) + z)` (round half to even; saturate to the type's range);
# - dequantize: `x' = (q − z) · s`.
#
# We ask onnxruntime's quantizer, as its documentation recommends for x86, to store **activations as uint8**
# (`activation_type=QUInt8`; its default is int8) with a zero point (asymmetric: the calibrated range `[lo, hi]`,
# widened to contain 0, maps onto 0..255) and **weights as int8** symmetric (zero point 0, range −127..127). For
# uint8, `s = (hi − lo) / 255` and `z = round(−lo / s)`.
#
# **Predict:** an activation was calibrated to the range `[−1, 2]`. What are `s` and `z`? What integer does 0.31
# become, and what does it come back as? And 2.5, outside the range?

# %%
x = np.array([-1.0, 0.0, 0.31, 0.52, 2.0, 2.5], np.float32)
s, z = quant.qparams(-1.0, 2.0, "uint8")
q = quant.quantize_array(x, s, z, "uint8")
back = quant.dequantize_array(q, s, z)
q_ort, back_ort = quant.run_qdq(x, s, z, "uint8")
print(f"scale s = 3 / 255 = {s:.6f}, zero point z = round(1 / s) = {z}")
print("\n".join(text_table(["x", "x / s + z", "q (uint8)", "(q - z) * s", "error"],
                           [[f"{a:.2f}", f"{a / s + z:.2f}", str(b), f"{c:.4f}", f"{c - a:+.4f}"]
                            for a, b, c in zip(x, q, back)])))
print("onnxruntime's QuantizeLinear gives the same integers:", np.array_equal(q, q_ort),
      "| its DequantizeLinear the same floats:", np.array_equal(back, back_ort))

# %% [markdown]
# Zero comes back exactly (that is what the zero point is for: padding and Relu's zeros stay zeros); 0.31 lands
# on the nearest step of `s`; 2.5 saturates at 255 and comes back as 2.0. The error inside the range is at most
# half a step, `s / 2`.
#
# What int8 buys is bytes: a weight tensor shrinks four times, plus its scales. The first convolution of the CNN
# used below:

# %%
cnn = zoo.resnet_small(image_size=64, width=32, batch=4)
w = quant.weight_of(cnn, "/conv1/Conv")
per_tensor = w.size * 1 + 4
per_channel = w.size * 1 + 4 * w.shape[0]
print(f"conv1 weight {tuple(w.shape)}: {w.size} values")
print(f"  float32: {w.nbytes} bytes; int8 + one scale: {per_tensor} bytes")
print(f"  int8 + {w.shape[0]} scales (one per output channel): {per_channel} bytes ({w.nbytes / per_channel:.2f}x "
      f"smaller than float32)")

# %% [markdown]
# **Inside an int8 kernel.** What a fused `QLinearMatMul` (or `QLinearConv`) does with those integers: multiply
# `q_x − z_x` by the int8 weights and sum in **int32** (VNNI's `vpdpbusd` multiplies the raw uint8 `q_x` by the
# int8 weights; the kernel then subtracts `z_x · Σ q_w`, a per-column constant computed once from the weights), then
# apply one multiplier `M = s_x · s_w / s_y` and round onto the *output's* uint8 grid,
# `q_y = saturate(round(M · acc) + z_y)`. That
# last step is the **requantisation**: the float result never exists in memory. A 1×4 activation times a 4×2
# weight, small enough to check by hand:
#
# **Predict:** the integer path rounds three times (the input, the weight, the output). How far will its answer
# be from the float32 product `x @ w`?

# %%
xa = np.array([[0.52, -0.2, 1.3, 0.0]], np.float32)
wa = np.array([[0.5, -0.25], [1.0, 0.1], [-0.4, 0.8], [0.3, -0.6]], np.float32)
sx, zx = quant.qparams(-1.0, 2.0, "uint8")  # the activation's calibrated range, as above
sw, _ = quant.qparams(wa.min(), wa.max(), "int8", symmetric=True)
sy, zy = quant.qparams(-2.0, 2.0, "uint8")  # the output's calibrated range
qx, qw = quant.quantize_array(xa, sx, zx, "uint8"), quant.quantize_array(wa, sw, 0, "int8")
acc, m, qy = quant.qlinear_matmul(qx, sx, zx, qw, sw, sy, zy)
print(f"q_x - z_x = {(qx.astype(int) - zx).tolist()},  q_w (columns) = {qw.T.tolist()},  s_w = {sw:.6f}")
print(f"int32 accumulators: {acc.tolist()}; M = s_x * s_w / s_y = {m:.6f}; q_y = round(M * acc) + {zy} = "
      f"{qy.tolist()}")
print("back to float:", ", ".join(f"{v:.4f}" for v in quant.dequantize_array(qy, sy, zy).ravel()),
      "| float32 x @ w:", ", ".join(f"{v:.4f}" for v in (xa @ wa).ravel()), f"| half an output step: {sy / 2:.4f}")
qy_ort, ran = quant.run_qlinear_matmul(qx, sx, zx, qw, sw, sy, zy)
print(f"onnxruntime, DQ, DQ -> MatMul -> Q at level ALL, ran {ran}: {qy_ort.tolist()}, the same: "
      f"{np.array_equal(qy, qy_ort)}")

# %% [markdown]
# The int32 sum itself is exact; the error comes from the three roundings, and here it stays within about half a
# step of the output grid. onnxruntime ran the four nodes as one kernel.
#
# **Seven-bit weights.** "The int32 sum is exact" holds for the instruction that computes it only if nothing
# overflows on the way. AVX-512 VNNI's `vpdpbusd` adds four uint8 × int8 products straight into an int32 lane. A
# CPU without VNNI uses AVX2's `vpmaddubsw`, which adds *two* neighbouring products in **int16** and saturates at
# `32,767`: `255 × 127 × 2 = 64,770` does not fit. onnxruntime's quantizer has an option for it, `reduce_range`:
# weights in 7 bits (−64..64), so that `255 × 64 × 2 = 32,640` always fits. `quant.quantize` in this notebook uses it,
# so every int8 model below computes the same on every x86 CPU, at the price of one bit of weight precision.
# `quant.levels_off(bits)` runs random uint8 × int8 products through onnxruntime's `QLinearMatMul` and returns the
# most output levels it lands from the exact integer arithmetic:

# %%
# NBVAL_IGNORE_OUTPUT
flags = quant.cpu_flags("avx512_vnni", "avx_vnni", "avx2")
vnni = flags["avx512_vnni"] or flags["avx_vnni"]
off8, off7 = quant.levels_off(8), quant.levels_off(7)
print("this CPU:", flags)
display(Markdown(f"This CPU {'has' if vnni else 'has no'} VNNI. With 8-bit weights onnxruntime's answer is "
                 f"{off8} output level{'s' if off8 != 1 else ''} off the exact one at worst"
                 f"{' (the int16 saturation)' if off8 and not vnni else ''}; with 7-bit weights, {off7}."))

# %% [markdown]
# ## 2. Why BatchNormalization must be folded before quantizing
#
# A BatchNormalization multiplies each channel `c` by its own factor `γ_c / √(var_c + ε)` and shifts it. In a
# trained network those factors can differ a lot from channel to channel, because the channels coming *out of the
# convolution* differ in scale and the BN exists to normalise them. Quantize the unfolded graph and the tensor
# between Conv and BN, whose channels still differ in scale, gets **one** uint8 scale for all channels: channels
# with a small range use only a few of the levels `0..255`. Fold first (notebook 02) and that tensor is gone: the
# per-channel factor moves into the conv's **weights**, which can have one scale per output channel.
#
# `quant.bn_spread_layer(spread)` builds such a layer: Conv → BN → Relu → Conv, whose first conv's output channels
# differ in scale by up to `spread`, and whose BN statistics are measured on data, as training leaves them:

# %%
layer = quant.bn_spread_layer(100.0)
folded_layer = as_proto(fuse(layer, rules=("conv_bn",)).graph)
print(fusionlab.verify(layer, folded_layer))
bn = quant.bn_scales(layer)["/bn/BatchNormalization"]
conv1 = next(n.name for n in folded_layer.graph.node if n.op_type == "Conv")
raw, fold = quant.channel_ranges(quant.weight_of(layer, "/conv1/Conv")), quant.channel_ranges(
    quant.weight_of(folded_layer, conv1))
print(f"BN factor per channel: {bn.min():.3f} .. {bn.max():.3f} ({bn.max() / bn.min():.0f}x apart)")
print(f"max |w| per output channel, unfolded conv: {raw.min():.3f} .. {raw.max():.3f} "
      f"({raw.max() / raw.min():.0f}x apart)")
print(f"max |w| per output channel, folded conv:   {fold.min():.3f} .. {fold.max():.3f} "
      f"({fold.max() / fold.min():.1f}x apart)")

# %% [markdown]
# **Predict:** we quantize both graphs with onnxruntime's `quantize_static` (next section says how), weights per
# tensor and per channel, and compare each with the float32 layer on test inputs. Which of the four is worst? Does
# quantizing the unfolded conv's weights *per channel* rescue it? And what happens as the channels' spread grows?

# %%
shape = (4, 8, 16, 16)
calib, test = quant.image_batches(8, shape, seed=1), quant.image_batches(8, shape, seed=2)
errs = {}
for spread in (1.0, 10.0, 100.0, 1000.0):
    m = quant.bn_spread_layer(spread)
    f = as_proto(fuse(m, rules=("conv_bn",)).graph)
    errs[spread] = [quant.accuracy(m, quant.quantize(g, calib, per_channel=pc), test).rel
                    for g in (m, f) for pc in (False, True)]
print("relative error ||int8 - fp32|| / ||fp32|| of the layer's output, 8 test batches")
print("\n".join(text_table(["spread", "unfolded, per tensor", "unfolded, per channel", "folded, per tensor",
                            "folded, per channel"], [[f"{k:g}"] + [f"{e:.3f}" for e in v] for k, v in errs.items()])))
above = [k for k, e in errs.items() if e[1] > max(e[2:])]  # unfolded per channel worse than both folded
display(Markdown("Unfolded with per-channel weights, the layer is worse than both folded ones at a spread of "
                 + ", ".join(f"{k:g}" for k in above) + f" ({len(above)} of the {len(errs)} rows)." if above else
                 "Unfolded with per-channel weights, the layer is never worse than both folded ones here."))

# %% [markdown]
# The folded layer's error does not depend on the spread; the unfolded one's grows with it, and per-channel weights
# do not rescue it once the spread is large (the line under the table says at which spreads its per-channel
# column lies above both folded ones), because the damage is done in the *activation* between Conv and BN, which is
# quantized per tensor.
# What onnxruntime runs shows the second cost: it cannot fold a BN into a `QLinearConv` (the conv's weight is no
# longer a float constant but the output of a `DequantizeLinear`), so the BN stays a float island, with
# dequantizes before it (of its input, of its scale, stored as int8, and of its bias, stored as int32) and a
# quantize after it. `quant.float_islands` lists the operators that read a dequantized tensor:

# %%
unfolded_q = quant.optimized(quant.quantize(layer, calib))
folded_q = quant.optimized(quant.quantize(folded_layer, calib))
print(wrap("unfolded, as onnxruntime runs it: " + " -> ".join(n.op_type for n in unfolded_q.graph.node)))
print(wrap("folded, as onnxruntime runs it:   " + " -> ".join(n.op_type for n in folded_q.graph.node)))
print("float islands, unfolded:", dict(quant.float_islands(unfolded_q)), "| folded:",
      dict(quant.float_islands(folded_q)))

# %% [markdown]
# So fold first, then calibrate and quantize: the calibration must see the tensors the int8 kernels will
# compute. The quantizer's own log recommends a pre-processing step, `quant_pre_process` (shape inference and
# onnxruntime's optimiser); it folds the BN too:

# %%
print("after onnxruntime's quant_pre_process:", dict(quant.op_counts(quant.preprocess(layer))))

# %% [markdown]
# (CANN's AMCT does the fold itself, notebook 14 §5.)
#
# ## 3. onnxruntime's static quantizer on a CNN: QDQ pairs, then QLinearConv
#
# `quantize_static` needs the float model and a `CalibrationDataReader`, an object whose `get_next()` hands out
# one feed dict at a time. It runs the model on them, records each activation's range (MinMax), and writes a
# **QDQ** model: the same float operators, with a `QuantizeLinear → DequantizeLinear` pair on every tensor that
# will be int8 and a `DequantizeLinear` on every int8 weight. The calibration images are made here (seeded,
# smoothed noise); the test images are other draws from the same generator.
#
# The CNN is the zoo's `resnet_small` (ResNet-18's topology at width 32, 64×64 inputs, batch 4), with its 20 BNs
# folded by fusionlab's `conv_bn` rule first, and checked.

# %%
cnn_folded = as_proto(fuse(cnn, rules=("conv_bn",)).graph)
print(fusionlab.verify(cnn, cnn_folded))
images = (4, 3, 64, 64)
cnn_calib = quant.image_batches(8, images, seed=1)
cnn_test = quant.image_batches(16, images, seed=2)
reader = quant.FeedsReader(cnn_calib)
print(f"{type(reader).__name__}: {len(reader.feeds)} calibration batches of {images}; first get_next() -> "
      f"{ {k: v.shape for k, v in reader.get_next().items()} }")
cnn_pt = quant.quantize(cnn_folded, cnn_calib, per_channel=False)
cnn_pc = quant.quantize(cnn_folded, cnn_calib, per_channel=True)

# %% [markdown]
# `quant.optimized(model, level)` opens an onnxruntime session with `SessionOptions.optimized_model_filepath` set
# and reads back the model onnxruntime wrote: what it really runs at that level.
#
# **Predict:** the folded CNN has 20 `Conv`, 8 residual `Add`, 17 `Relu`, one `MaxPool`, one
# `GlobalAveragePool` and one `Gemm`. How many `QuantizeLinear` and `DequantizeLinear` nodes will the QDQ model
# hold? And what will onnxruntime run in their place: at its BASIC level, at EXTENDED, and at ALL (the default)?

# %%
cols = {"float32": quant.op_counts(cnn_folded), "QDQ model": quant.op_counts(cnn_pc),
        "QDQ at BASIC": quant.op_counts(quant.optimized(cnn_pc, "basic")),
        "QDQ at EXTENDED": quant.op_counts(quant.optimized(cnn_pc, "extended")),
        "QDQ at ALL": quant.op_counts(quant.optimized(cnn_pc, "all"))}
print(quant.op_table(cols))
qconv = next(n for n in quant.optimized(cnn_pc, "all").graph.node if n.op_type == "QLinearConv")
print(f"a QLinearConv at ALL: domain {qconv.domain!r}, {len(qconv.input)} inputs, attributes "
      f"{ {a.name: onnx.helper.get_attribute_value(a) for a in qconv.attribute if a.name == 'channels_last'} }")

# %% [markdown]
# Read the columns left to right:
#
# - the **QDQ model** still computes in float: every Conv reads dequantized inputs and weights; the `Relu`s are
#   gone already, because a Relu followed by a uint8 quantize whose range starts at 0 is the quantize's own clamp
#   (the quantizer drops it);
# - at **BASIC** onnxruntime only prepares the pairs: no integer kernel yet, and even more `DequantizeLinear`s,
#   because a dequantize read by two nodes is duplicated so that each node has its own (each
#   `DQ → op → Q` group must be self-contained before it can be fused);
# - at **ALL** each `DQ(x), DQ(w) → Conv → Q` became one **`QLinearConv`** (uint8 in, int8 weights, int32
#   accumulation, the requantisation to the output's scale inside); each `DQ, DQ → Add → Q` a **`QLinearAdd`**;
#   the pool and the classifier `QLinearGlobalAveragePool` and `QGemm`. What is left of the pairs is one
#   `QuantizeLinear` at the input and one `DequantizeLinear` at the output. The integer fusions happen at
#   **EXTENDED** already; ALL adds layout work: the int8 convolutions run channels-last (`com.microsoft`
#   `QLinearConv` with `channels_last`, and `NhwcMaxPool`), so two `Transpose`s switch the layout once at the
#   input and once at the output.

# %% [markdown]
# ## 4. Accuracy against float32
#
# Each int8 CNN against its float32 original (optimisations off) on the test images, which calibration never
# saw: the largest absolute error of the logits, the relative error `‖int8 − fp32‖ / ‖fp32‖` over all of them,
# and the share of images whose top-1 class agrees.
#
# **Predict:** weights per channel or per tensor: which is more accurate, and by how much?

# %%
acc = {"weights per tensor": quant.accuracy(cnn, cnn_pt, cnn_test, classifier=True),
       "weights per channel": quant.accuracy(cnn, cnn_pc, cnn_test, classifier=True)}
print("\n".join(text_table(["int8 CNN", "max |error|", "relative error", "top-1 agrees"],
                           [[k] + a.row() for k, a in acc.items()])))
n_images = sum(f["input"].shape[0] for f in cnn_test)
(better, b), (_, w) = sorted(acc.items(), key=lambda kv: kv[1].rel)
top1 = (f"top-1 agreement {b.top1:.0%} against {w.top1:.0%}" if b.top1 >= w.top1 else
        f"though top-1 agreement goes the other way, {b.top1:.0%} against {w.top1:.0%}: "
        f"{round(abs(w.top1 - b.top1) * n_images)} of {n_images} test images, a count too small to rank them by")
display(Markdown(f"The answer: {better} are the more accurate by the relative error, {b.rel:.3f} against "
                 f"{w.rel:.3f}; {top1}."))

# %% [markdown]
# The CNN has deterministic random weights, so "top-1 agrees" means the int8 classifier picks the same class as
# the float32 one, not that either is right. A real deployment judges the int8 model on its task's metric; the
# relative error is what this notebook can measure honestly.
#
# ## 5. Speed on this CPU: does int8 pay?
#
# AVX-512 VNNI's `vpdpbusd` multiplies 64 uint8 × int8 pairs and adds them into 16 int32 lanes, where a float32
# fused multiply-add does 16 (§1 printed whether this CPU has it; without it, AVX2 does 32 pairs per `256-bit`
# instruction pair, `vpmaddubsw` then `vpmaddwd`):

# %%
print("multiply-adds per 512-bit instruction:", quant.VNNI_MACS)

# %% [markdown]
# **Predict:** the float32 CNN against its int8 versions, all at onnxruntime's full optimisations, one thread
# each (the machine is shared with other work, and one thread keeps the comparison about the kernels, not about
# threading). Four times the multiply-adds per instruction: will int8 be four times faster? And the int8 model
# whose BNs were not folded?

# %%
# NBVAL_IGNORE_OUTPUT
cnn_unfolded_q = quant.quantize(cnn, cnn_calib, per_channel=True)
feeds = cnn_test[0]
sessions = {name: runtime.session(m, "all", threads=1) for name, m in
            (("float32", cnn), ("int8 per tensor", cnn_pt), ("int8 per channel", cnn_pc),
             ("int8, BN not folded", cnn_unfolded_q))}
times = timing.interleaved({name: (lambda s=s: s.run(None, feeds)) for name, s in sessions.items()}, min_time=4.0)
cnn_cmp = {name: timing.Comparison.from_samples(times["float32"], times[name], label_a="float32", label_b=name)
           for name in sessions if name != "float32"}
print(timing.comparisons_table(cnn_cmp, ("CNN, batch 4", "float32", "int8", "fp32/int8", "95% CI", "verdict")))
fold_cmp = timing.Comparison.from_samples(times["int8, BN not folded"], times["int8 per channel"],
                                          label_a="int8, BN not folded", label_b="int8, BN folded")
best = max(c.speedup for c in cnn_cmp.values())
vnni = quant.VNNI_MACS["int8 (vpdpbusd)"] / quant.VNNI_MACS["fp32 (vfmadd)"]
display(Markdown(" ".join([cnn_cmp["int8 per tensor"].markdown("The int8 CNN, weights per tensor,"),
                           cnn_cmp["int8 per channel"].markdown("The int8 CNN, weights per channel,"),
                           cnn_cmp["int8, BN not folded"].markdown("The int8 CNN whose BNs were not folded"),
                           fold_cmp.markdown("Folding the BNs first", than="quantizing them unfolded"),
                           f"The best ratio, {best:.2f}×, is {'below' if best < vnni else 'above'} the "
                           f"{vnni:.0f}× of multiply-adds per instruction."])))

# %% [markdown]
# The instruction count is not a prediction for a whole model. Only the convolutions' inner loops run in int8
# instructions; the quantize at the input, the requantisation of every output, the layout `Transpose`s and the
# residual `QLinearAdd`s (float32 fuses its Adds into the convolutions, notebook 14 §4.2) are work of their own;
# on the other side a float32 convolution is not limited by its multiply-adds alone, and int8 tensors are a
# quarter of the bytes to move. Where the ratio lands is the measurement's to say (the sentences above). The
# unfolded CNN also runs each BN in float, with a dequantize before and a quantize after it. How much int8 gains
# depends on the shapes: build §1's CNN with `zoo.resnet_small(width=16)` or a smaller image, run the notebook
# again, and see how the fixed costs weigh.

# %% [markdown]
# ## Summary
#
# - An int8 tensor is integers plus a scale and a zero point; an int8 kernel sums uint8 × int8 products in int32
#   and requantises once onto the output's grid (7-bit weights keep AVX2's int16 pairs from saturating).
# - Fold BN into the weights *before* calibrating: activations get one scale per tensor, so an unfolded Conv→BN
#   tensor loses its small channels, and the BN stays a float island between a dequantize and a quantize.
# - onnxruntime's QDQ model is float plus quantize/dequantize marks; at level EXTENDED and above they fuse into
#   `QLinearConv` and `QLinearAdd`; what that buys is measured, in error and in time, not read off the 4× of
#   multiply-adds per instruction.

# %% [markdown]
# ## Exercises
#
# The exercises check themselves: write your answer in the cell under each task, run it, then run the `check` cell.
# `check` grades it at once on hidden cases and prints PASS with what it checked, or FAIL with a hint naming the
# first case your answer gets wrong and the mistake it looks like. The notebook is stored unanswered; reference
# answers are in the repository's `solutions/` folder, outside the notebooks (try first).
#
# **Exercise 1: quantize to uint8 as onnxruntime does.** Write `quantize(x, lo, hi)` returning `(q, scale,
# zero_point)`: the asymmetric uint8 scale and zero point that map the calibrated range `[lo, hi]` onto 0..255
# (§1: widened to hold 0, so that 0 is exact), and `q`, the float32 array `x` quantized with them (a uint8 array),
# without calling `quant.qparams` or `quant.quantize_array`. Compute the zero point from the scale in float64, as
# the quantizer does (the scale it stores is float32). `check` compares your parameters with the quantizer's and
# your `q` with onnxruntime's own `QuantizeLinear` run on the same `x` with your parameters; the hidden cases
# include a range that does not hold 0, values outside the range, exact ties and a zero point that is a tie.

# %%
def quantize(x, lo, hi):
    """(q, scale, zero_point) of float32 x in uint8, asymmetric, from the calibrated range [lo, hi]."""
    raise NotImplementedError  # your code here


# %%
exercises.qparams.check(quantize)


# %% [markdown]
# **Exercise 2: requantise an int32 accumulator.** Write `requantize(acc, x_scale, w_scale, y_scale,
# y_zero_point)`: the uint8 output an int8 kernel writes from its int32 accumulator `acc` [M, N], as §1 ("Inside
# an int8 kernel") describes it; `w_scale` is one number, or one per output column for per-channel weights.
# `check` compares your output with onnxruntime's own `QLinearMatMul` on the same integers and scales; the hidden
# cases include outputs that saturate at 0 and at 255, exact ties and per-column weight scales.

# %%
def requantize(acc, x_scale, w_scale, y_scale, y_zero_point):
    """uint8 [M, N] from the int32 accumulator acc [M, N]."""
    raise NotImplementedError  # your code here


# %%
exercises.requant.check(requantize)
