# %% [markdown]
# # 12 · A LLaMA-style decoder, fused: the same function, tokens per second, and CANN's operators
#
# **What you will be able to do after this notebook**
#
# - fuse a LLaMA-style decoder that reads and writes its KV cache, say which onnxruntime ops its patterns became
#   and where rule `gqa` refuses, and check that the fused model computes the same function;
# - say what GroupQueryAttention on the cache saves over attention after `repeat_kv`, counted and measured;
# - measure tokens per second, unfused and fused, and set the bytes a step reads against this machine's bandwidth;
# - read what CANN's decoding operators (IncreFlashAttention, PromptFlashAttention, RotaryMul) do, and model an
#   upper bound on tokens per second on an Ascend card from its published bandwidth.
#
# Notebook 11 counted the bytes of one decode step and placed it on the roofline, and worked rotary embeddings
# and decode attention on a few numbers; notebook 04 fused a transformer's norms and attention. This notebook
# builds the decoder those counts describe, fuses it, and times it. Everything marked *measured* runs on this
# machine's CPU with onnxruntime, one thread; the machine is shared with other work, so every time comes as a
# median with an interval. The Ascend figures are *modelled* from published specifications, not measured.

# %%
import matplotlib.pyplot as plt
import numpy as np

import fusionlab
from fusionlab import exercises, timing, viz, zoo
from fusionlab.cost import calibrate, devices
from fusionlab.cost import model as cost_model
from fusionlab.lessons import decoding as dec
from fusionlab.passes import fuse, vertical
from fusionlab.text import text_table, wrap
from fusionlab.verification import runtime
from IPython.display import Markdown, display

plt.rcParams["figure.dpi"] = 80
MiB = 2**20


def show(header, rows):
    """Print a plain-text table (fusionlab.text.text_table narrows it to the notebook's width)."""
    print("\n".join(text_table(header, rows)))

# %% [markdown]
# ## 1. A LLaMA-style decoder, unfused and fused
#
# The decoder is notebook 11's (`dec.LlamaConfig()`, printed below: two layers, 12 query heads of 64 sharing 4
# K/V heads). `dec.llama_decoder(cfg)` writes it as the exporters write LLaMA: RMSNorm decomposed (Pow,
# ReduceMean, Add, Sqrt, Div, Mul, Mul), rotary written out with cos and sin computed from the positions,
# grouped-query attention with the explicit `repeat_kv` (Unsqueeze, Expand, Reshape), SiLU as Sigmoid and Mul.
# The cache is part of the graph's interface: inputs `past_key_i` / `past_value_i` of shape [batch, K/V heads,
# past, head size] and outputs `present_key_i` / `present_value_i` with this step's keys and values appended.
# The positions (for the rotation and the causal mask) start at the cache's length, so one graph runs the
# prefill (an empty cache) and every decode step (one token). It serves one request at a time: `batch=1`.
#
# **Predict before you run the next cell:** which of the patterns of notebook 04 (norms after residual Adds, an
# activation, attention) will fuse here, and into which onnxruntime ops?

# %%
cfg = dec.LlamaConfig()
print(wrap(str(cfg)))
model = dec.llama_decoder(cfg, batch=1)
result = fuse(fusionlab.load(model), passes=("vertical",))
fused = result.graph.to_proto()
print(result.plan.table())

# %% [markdown]
# The rotary groups are not accounted alike. The next cell prints what each rewrite wrote and what the plan
# charges it:

# %%
rot = [g for g in result.plan.groups if g.rule == "rotary"]
made = {o: n for n in model.graph.node for o in n.output}


def projection(g):
    """The projection whose output the group rotates: Transpose <- Reshape <- MatMul (q_proj or k_proj)."""
    matmul = made[made[made[g.reason.rsplit(" of ", 1)[1]].input[0]].input[0]]
    parts = matmul.name.split("/")  # /model/layers.0/self_attn/q_proj/MatMul
    return f"{parts[2]} {parts[4]}"


show(["group", "rotates", "kernels", "saved KiB", "nodes its rewrite wrote"],
     [[g.id, projection(g), str(g.kernels), f"{g.saved_bytes / 1024:.0f}",
       ", ".join(n.rsplit("/", 1)[-1] for n in g.extra["fused_nodes"])] for g in rot])
first, plain = rot[0], [g for g in rot if g.kernels == 1]
q_kib = max(g.saved_bytes for g in plain) / 1024
k_kib = min(g.saved_bytes for g in plain) / 1024
print(wrap(f"{first.id} also wrote {first.kernels - 1} nodes: the Slice and Reshape that cut the graph's cos and sin "
           f"tables to the [S, D/2] caches every RotaryEmbedding reads; the other groups reuse them. The groups that "
           f"wrote nothing else save {q_kib:.0f} KiB (queries, {cfg.heads} heads) or {k_kib:.0f} KiB (keys, "
           f"{cfg.kv_heads} K/V heads): {q_kib / k_kib:.0f}x, the ratio of the heads."))
twin = next(g for g in plain if projection(g).endswith(projection(first).split()[-1]))
print(wrap(f"{first.id} saves {first.saved_bytes / 1024:.0f} KiB, {(twin.saved_bytes - first.saved_bytes) / 1024:.0f} KiB "
           f"less than {twin.id}, the same rotation one layer on: its caches, charged at their own size (the Slice "
           f"writes half of each table, the plan charges the Reshape as a copy, and each is read back once)."))

# %%
before, after = zoo.summary(model), zoo.summary(fused)
ops = sorted(set(before["ops"]) | set(after["ops"]), key=lambda o: (-before["ops"].get(o, 0), o))
show(["op", "exported", "fused"], [[o, str(before["ops"].get(o, 0)), str(after["ops"].get(o, 0))] for o in ops]
     + [["nodes in all", str(before["nodes"]), str(after["nodes"])]])

# %% [markdown]
# One layer's attention before and after (the coloured groups on the left are the plan; the filled ops on the
# right are onnxruntime's fused kernels, each naming the ops it replaces). The right side leaves out the
# few host-side shape ops the rewrite adds to compute `seqlens_k` and `total_sequence_length` from the
# shapes (Shape, Add, Cast, Sub, Expand of a handful of integers):

# %%
layer0 = "/model/layers.0/self_attn/"
lengths = ("_seq", "_past_len", "_total_len", "_seq32", "_total_seq", "_last", "_batch", "_seqlens_k")
viz.before_after(fusionlab.load(model), result.graph, plan=result.plan,
                 nodes_a=[n.name for n in model.graph.node if n.name.startswith(layer0)],
                 nodes_b=[n.name for n in fused.graph.node if n.name.startswith(layer0)
                          and not n.name.endswith(lengths)],
                 titles=("layer 0 attention, exported", "fused"))

# %% [markdown]
# What fused: each RMSNorm after a residual Add became `SkipSimplifiedLayerNormalization` (the Add and the
# norm in one kernel, the sum handed on to the next residual), the first one (no residual before it) the
# opset-23 `RMSNormalization`; each rotation became `RotaryEmbedding`, reading the graph's own cos/sin; SiLU
# became `QuickGelu` (x·sigmoid(α·x); the rule sets α = 1, which is SiLU). And the whole attention, with its cache, became one `GroupQueryAttention`: the rule
# `gqa` sees that the repeated K and V are `Concat(past, new)` on the sequence axis, with the past a graph
# input, and writes the op with `past_key` / `past_value` as inputs; its outputs 1 and 2 (the present cache)
# replace the Concats' outputs, and `repeat_kv` is gone: query head h reads K/V head h // group directly.
#
# The rule refuses, and says why, where onnxruntime's kernel would not compute the same thing. Two cases: the
# same decoder with a symbolic batch (the CPU kernel takes a past together with several new tokens only at
# batch 1), and a prefill-only export whose present V is a graph output the pattern would swallow:

# %%
for name, m in (("symbolic batch", dec.llama_decoder(cfg)), ("prefill only", dec.llama_decoder(cfg, past=False))):
    res = fuse(fusionlab.load(m), passes=("vertical",))
    counts = {k: v for k, v in res.plan.rule_counts().items() if k in ("gqa", "attention")}
    print(f"{name}: attention groups {counts or 'none'}")
    for r in res.plan.why_not():
        if r.rule == "gqa" and "layers.0" in r.node:
            print(wrap("  gqa refused: " + r.reason))

# %% [markdown]
# ## 2. Is the fused decoder the same function?
#
# Correctness first. The fused model is compared with the exported one, both run by onnxruntime with graph
# optimisations off, on a prefill (a prompt of 32 tokens, empty cache) and on a decode step (one token with
# that cache), every output: the logits and every present key and value. Float32 tolerances: rtol 1e-4, atol
# 1e-5 (scaled by the output's largest magnitude, `verify`'s default), tight enough to catch a wrong rotation
# or a missing mask, loose enough for a fused kernel's different order of summation. Then the cache itself: a
# prefill of the first 31 tokens plus one decode step must give the logits that a prefill of all 32 gives for
# its last token.

# %%
prompt = np.random.default_rng(1).integers(0, cfg.vocab, size=(1, 32))
steps = {"prefill, 32 tokens": dec.feeds_for(cfg, prompt)}
first = runtime.run(model, steps["prefill, 32 tokens"])
cache = {k.replace("present", "past"): v for k, v in first.items() if k.startswith("present")}
steps["decode, 1 token after 32"] = dec.feeds_for(cfg, first["logits"][:, -1:].argmax(-1), cache)
rows = []
for name, feeds in steps.items():
    rep = runtime.verify(model, fused, feeds=feeds)
    rows.append([name, f"logits and {len(rep.outputs) - 1} cache tensors", "yes" if rep.ok else "NO"])
show(["step", "outputs compared", "all within rtol 1e-4 / atol 1e-5"], rows)
head = runtime.run(model, dec.feeds_for(cfg, prompt[:, :31]))
past = {k.replace("present", "past"): v for k, v in head.items() if k.startswith("present")}
step = runtime.run(model, dec.feeds_for(cfg, prompt[:, 31:], past))
same = np.allclose(step["logits"][:, 0], first["logits"][:, 31], rtol=1e-4, atol=1e-5)
print(f"31-token prefill + 1 decode step {'matches' if same else 'DIFFERS from'} "
      "the 32-token prefill's last logits")
sa, sb = runtime.session(model, "disable"), runtime.session(fused, "disable")
ga, gb = dec.generate(sa, cfg, prompt, 16), dec.generate(sb, cfg, prompt, 16)
print(f"16 greedy tokens, unfused and fused: {'identical' if np.array_equal(ga, gb) else 'DIFFERENT'}")

# %% [markdown]
# ## 3. What GroupQueryAttention on the cache buys
#
# `dec.decode_attention(cfg)` is one layer's attention for a decode step as a model of its own: this token's
# q, k, v and the past cache in, the context and the present cache out, written as exported (Concat of the
# past, `repeat_kv`, softmax attention). Fused with rule `gqa` it becomes `GroupQueryAttention` on the cache;
# with the rule off, `MultiHeadAttention` after the repeat, which copies each K/V head once per query head of
# its group before attending. Both are checked against a float64 numpy reference (each query head's softmax
# over its K/V head) at a few context lengths, float32 tolerances rtol 1e-4 / atol 1e-5; the present caches
# must be exact.

# %%
exported = dec.decode_attention(cfg)
no_gqa = tuple(r for r in vertical.DEFAULT_RULES if r != "gqa")
forms = {"exported": exported,
         "rule gqa off: MultiHeadAttention after the repeat":
             fuse(fusionlab.load(exported), passes=("vertical",), rules=no_gqa).graph.to_proto(),
         "rule gqa on: GroupQueryAttention": fuse(fusionlab.load(exported), passes=("vertical",)).graph.to_proto()}
rows = []
for name, m in forms.items():
    checks = []
    for ctx in (0, 7, 4096):
        feeds = dec.decode_attention_feeds(cfg, ctx, seed=ctx)
        want, got = dec.decode_attention_reference(cfg, feeds), runtime.run(m, feeds)
        checks.append(np.allclose(got["out"], want["out"], rtol=1e-4, atol=1e-5)
                      and all(np.array_equal(got[k], want[k]) for k in ("present_key", "present_value")))
    made_by = {o: n.op_type for n in m.graph.node for o in n.output}
    repeat = any(n.op_type == "Expand" and made_by.get(n.input[0]) == "Unsqueeze" for n in m.graph.node)
    attention = next((n.op_type for n in m.graph.node if n.domain), "Softmax and MatMuls")
    rows.append([name, str(len(m.graph.node)), attention, "yes" if repeat else "no", "yes" if all(checks) else "NO"])
show(["form", "nodes", "attention", "repeat_kv", "within rtol 1e-4 / atol 1e-5 of float64 at contexts 0, 7, 4096"], rows)
CTX = 4096
b_rep, b_gqa = (dec.decode_attention_bytes(cfg, CTX, gqa=g) for g in (False, True))
print(f"one layer, {CTX} cached: {b_rep / MiB:.1f} MiB moved after the repeat, {b_gqa / MiB:.1f} MiB by "
      f"GroupQueryAttention ({b_rep / b_gqa:.2f}x)")

# %% [markdown]
# The bytes (the last line above): with the cache of one layer at P tokens, both forms read the past and write
# the present, P + 1 tokens. Then GroupQueryAttention reads the present once; the repeat reads the present, writes
# a copy of it `group` times over, and the attention reads that copy.
#
# **Predict before you run the next cell:** the repeat path moves that many times the bytes. How much slower
# will it be?

# %%
# NBVAL_IGNORE_OUTPUT
feeds4k = dec.decode_attention_feeds(cfg, CTX)
s_rep, s_gqa = (runtime.session(forms[k], "disable") for k in list(forms)[1:])
att = timing.interleaved({"repeat": lambda: s_rep.run(None, feeds4k), "gqa": lambda: s_gqa.run(None, feeds4k)},
                         min_time=3.0, min_rounds=20)
ca = timing.Comparison.from_samples(att["repeat"], att["gqa"], label_a="MultiHeadAttention after the repeat",
                                    label_b="GroupQueryAttention")
print(ca)
display(Markdown(ca.markdown("GroupQueryAttention on the cache", "MultiHeadAttention after the repeat")
                 + f" Counting each byte moved once, the repeat path moves {b_rep / b_gqa:.2f}× the bytes."))

# %% [markdown]
# Where fusion can pay in decoding, then: not in the small elementwise intermediates, but in not materialising
# a copy of the cache, the one tensor that grows with the context (and, for a small model on a device, in the
# launches it removes: §5). CANN's IncreFlashAttention takes the same grouping as an argument,
# `num_key_value_heads` (§5).
#
# ## 4. Tokens per second, and bytes per token against the bandwidth
#
# First the two phases on this machine, one thread, the unfused model: a prefill of 128 tokens against a
# single decode step, run interleaved (the order alternating each round, so drift hits both alike).
#
# **Predict before you run the next cell:** a prefill of 128 tokens does 128 times the arithmetic of one
# decode step. How many decode steps' time does it take?

# %%
# NBVAL_IGNORE_OUTPUT
long_prompt = np.random.default_rng(2).integers(0, cfg.vocab, size=(1, 128))
tok, cache128 = dec.prefill(sa, cfg, long_prompt)
names = [o.name for o in sa.get_outputs()]
pre_feeds, dec_feeds = dec.feeds_for(cfg, long_prompt), dec.feeds_for(cfg, tok, cache128)
phase = timing.interleaved({"prefill": lambda: sa.run(names, pre_feeds),
                            "decode": lambda: sa.run(names, dec_feeds)},
                           min_time=3.0, min_rounds=15)
c = timing.Comparison.from_samples(phase["prefill"], phase["decode"], label_a="prefill of 128",
                                   label_b="one decode step")
print(c)
display(Markdown(
    f"One prefill of 128 tokens costs **{c.speedup:.1f}** decode steps (95% CI {c.ci_low:.1f}–{c.ci_high:.1f}): "
    f"per token, the prefill is {128 / c.speedup:.0f} times cheaper, because its tokens share one read of the "
    f"weights."))

# %% [markdown]
# Now the decode loop, unfused against fused: 16 steps of one token each from the cache of a 32-token prompt,
# the present cache fed back as the next past each step, the two models run interleaved. The bytes a step must
# read (weights, the cache so far, the K/V it writes) over the time it takes is the bandwidth the step
# achieves; beside it, the bandwidth this machine streams (`fusionlab.cost.calibrate`'s streaming bandwidth, the
# better of copy and add, as in notebook 11 §2).
#
# **Predict before you run the next cell:** fusion removed many of the decoder's nodes (the table in §1). How
# much faster will a decode step be?

# %%
# NBVAL_IGNORE_OUTPUT
calib = calibrate.calibrate(quick=True)
N_STEPS = 16
start_tok, start_cache = dec.prefill(sa, cfg, prompt)
loops = timing.interleaved({"unfused": lambda: dec.decode(sa, cfg, start_tok, start_cache, N_STEPS),
                            "fused": lambda: dec.decode(sb, cfg, start_tok, start_cache, N_STEPS)},
                           min_time=6.0, min_rounds=15)
cmp = timing.Comparison.from_samples(loops["unfused"], loops["fused"], label_a="unfused", label_b="fused")
print(cmp)
step_bytes = np.mean([dec.token_bytes(cfg, 32 + i)["total"] for i in range(N_STEPS)])
rows = []
for name in ("unfused", "fused"):
    t = timing.median_ci(loops[name])[0] / N_STEPS
    rows.append([name, f"{1 / t:.0f}", f"{t * 1e3:.2f}", f"{step_bytes / t / 1e9:.1f}",
                 f"{step_bytes / t / 1e9 / calib.stream_gbs:.0%}"])
show(["model", "tokens/s", "ms per token", "GB/s achieved", "of streamed bandwidth"], rows)
display(Markdown(cmp.markdown("The fused decoder", "the unfused one") + (
    f" A step must read {step_bytes / MiB:.1f} MiB; at the {calib.stream_gbs:.1f} GB/s this machine streams, "
    f"that alone takes {step_bytes / calib.stream_gbs / 1e6:.2f} ms.")))

# %% [markdown]
# Whatever the interval says on the day, the reason is in the bytes: fusion removed the *intermediate* tensors
# between the small ops (each a few KiB for one token), but every weight still has to be read once per token,
# fused or not. The time of a decode step is mostly that read. What shortens it is fewer bytes: weights in
# float16 or int8 (notebook 13), a smaller cache (GQA, a quantized cache) read without a copy
# (GroupQueryAttention, §3), or more tokens per read of the weights (batching users, speculative decoding).
#
# ## 5. CANN's decoding operators, and a model of an Ascend card
#
# CANN has fused operators for exactly these phases (from the op-plugin documentation of `torch_npu`, as
# summarised in our reference notes):
#
# - **IncreFlashAttention** (`npu_incre_flash_attention`): decode attention, one query token against the KV
#   cache, with `num_key_value_heads` for grouped-query attention and a paged cache (`block_table`,
#   `block_size`). On the Atlas inference series (310P: the 300I Pro and Duo) the query must be fp16; the KV
#   cache may be fp16 or int8.
# - **PromptFlashAttention** (`npu_prompt_flash_attention`): prefill attention over the whole prompt. On 310P
#   it is restricted: fp16 only, and `num_key_value_heads` only 0, that is, no GQA.
# - **FusedInferAttentionScore** dispatches to one or the other: a query of one token goes to the
#   IncreFlashAttention branch, longer ones to PromptFlashAttention (documented for A2/A3; not listed for 310P).
# - **RotaryMul** (`npu_rotary_mul`): `out = r1 * x + r2 * rotate(x)`, the rotation of notebook 11 §4
#   on one tensor; on 310P only with `jit_compile=True`, half mode only, head size 128. `npu_apply_rotary_pos_emb`
#   rotates Q and K in one kernel.
# - **RmsNorm** and **AddRmsNorm**: RMSNorm, and the residual Add with it, the counterpart of
#   `SkipSimplifiedLayerNormalization` above.
#
# They are the same fusions as onnxruntime's `MultiHeadAttention` / `GroupQueryAttention`, `RotaryEmbedding`
# and `SkipSimplifiedLayerNormalization`, and none of them changes the bytes of weights a decode step reads.
# So a lower bound on an Ascend card's time per token needs no hardware: bytes per token over the bandwidth of
# the chip that holds the model. The cell below models the 8-billion-parameter shape of notebook 11 §3 in fp16, at
# a context of 4096 tokens, on one chip of each preset. These are **modelled from published specifications,
# not measured**; a real card reaches only part of its peak bandwidth, so real times are longer.
#
# **Predict before you run the next cell:** how many tokens per second at most can one 310P3 chip (about 205
# GB/s) generate for this model?

# %%
big = dec.LlamaConfig(vocab=128256, hidden=4096, heads=32, kv_heads=8, intermediate=14336, layers=32)
chips = [devices.get(n).one_chip() for n in ("Atlas 300I Pro", "Atlas 300I Duo", "Atlas 800I A2 (Ascend 910B)")]
rows = []
for d in chips:
    m = dec.modelled_decode(big, 4096, d)
    rows.append([m["device"], f"{d.mem_bandwidth_gbs:g}", f"{m['bytes'] / 2**30:.2f}", f"{m['intensity']:.2f}",
                 f"{m['ridge']:.0f}", f"{m['t_memory_s'] * 1e3:.1f}", f"{m['t_compute_s'] * 1e3:.2f}", f"{m['tokens_per_s_bound']:.1f}"])
show(["one chip of", "GB/s", "GiB per token", "FLOP/B", "ridge", "ms (bytes/bandwidth)", "ms (FLOPs/peak)",
      "tokens/s at most"], rows)
small = dec.modelled_decode(cfg, 128, chips[0])
print(f"this notebook's decoder in fp16 on one 310P3, 128 cached: at most {small['tokens_per_s_bound']:,.0f} "
      f"tokens/s ({small['bytes'] / MiB:.1f} MiB per token)")
pro = chips[0]
step_cost = cost_model.plan_cost(fusionlab.load(model), cost_model.as_launched(result.plan), pro,
                                 dims={"sequence": 1, "past": 128})
launch_ms = step_cost.kernels * pro.launch_overhead_us / 1e3
print(wrap(f"but the fused decoder launches {step_cost.kernels} kernels a step (the cost model's count, host-side shape "
           f"ops left out); at the preset's {pro.launch_overhead_us:g} us a launch (assumed) that is {launch_ms:.2f} ms, "
           f"{launch_ms / (small['t_memory_s'] * 1e3):.1f}x its memory time of {small['t_memory_s'] * 1e3:.2f} ms; the "
           f"cost model predicts {step_cost.latency_s * 1e3:.2f} ms a step, {1 / step_cost.latency_s:,.0f} tokens/s"))

# %% [markdown]
# On every chip the memory time is far larger than the compute time: decode runs at the bandwidth, and the
# FLOPs are nearly free. The same table says what the levers are: the 300I Duo's second chip doubles what the
# card serves (a second model instance with its own memory), not the speed of one request on one chip
# (splitting one model over both chips adds the traffic between them, which this model does not count); a chip
# with HBM (the 910B4) is several times faster per token; int8 weights nearly halve the bytes (the fp16 cache stays).
#
# The last lines say the bytes bound is not the whole story for a model this small: on the model of a 310P3 its
# decode step is limited by kernel launches, not bytes (compare the launch time with the memory time above), and
# the tokens per second fall well short of the bound. There fusion pays a second way, besides the cache copy of
# §3: every kernel it removes is one launch less per token. The launch cost is an assumption of the
# presets (no figure is published; msprof's task wait times would measure it).
#
# %% [markdown]
# ## Summary
#
# - The exporters' LLaMA patterns fuse into onnxruntime's RMSNormalization and SkipSimplifiedLayerNormalization,
#   RotaryEmbedding, QuickGelu and, with the cache, one GroupQueryAttention a layer (refused, with the reason,
#   where the kernel would compute something else); the fused decoder is checked against the exported one.
# - GroupQueryAttention reads the cache without `repeat_kv`'s copy: the one saving of fusion that grows with the
#   context. Removing the small intermediates leaves a step's main cost: one read of every weight.
# - So bandwidth over bytes per token bounds tokens per second, measured here and modelled on Ascend, whose
#   decoding operators are the same fusions; for a small model there, kernel launches, not bytes, set the time.

# %% [markdown]
# ## Exercises
#
# The exercises check themselves: write your answer in the cell under each task, run it, then run the `check` cell.
# `check` grades it at once on hidden cases and prints PASS with what it checked, or FAIL with a hint naming the
# first case your answer gets wrong and the mistake it looks like. The notebook is stored unanswered; reference
# answers are in the repository's `solutions/` folder, outside the notebooks (try first).
#
# **Exercise 1: the fused operators of a decoder.** Write `fused_ops(layers, heads, kv_heads, batch, past)`:
# predict, without running `fuse`, a dict from op type to how many of it `fuse(..., passes=("vertical",))` writes
# into `dec.llama_decoder` of that shape (`layers` layers, `heads` query heads over `kv_heads` K/V heads, `batch`
# an int or a name, `past` whether the graph takes a cache), for six ops: `RMSNormalization`,
# `SkipSimplifiedLayerNormalization`, `RotaryEmbedding`, `QuickGelu`, `GroupQueryAttention`, `MultiHeadAttention`
# (a missing key counts 0). §1's table and refusals say what to expect; rule `gqa` needs K/V heads shared, so with
# as many K/V heads as query heads rule `attention` writes `MultiHeadAttention`. The hidden decoders include
# multi-query attention, one without GQA, a symbolic batch, a batch of 2 and a prefill-only export.

# %%
def fused_ops(layers, heads, kv_heads, batch, past):
    """{op type: count} of the six fused ops in the vertical pass's output for this decoder."""
    ...  # your code here


# %%
exercises.decoderops.check(fused_ops)


# %% [markdown]
# **Exercise 2: tokens per second at most.** Write `tokens_per_second(cfg, context, batch, device)`: the most
# tokens per second one chip of `device` can generate for `batch` requests decoded together, each with `context`
# tokens cached, for the shape `cfg` in fp16, without calling `dec.modelled_decode`. A step reads the weights
# once for the whole batch, while each request reads its own embedding row and cache and writes its new K/V
# (all of `dec.token_bytes`'s total but the weights; notebook 11 §2), and takes at least the larger of its
# bytes over the chip's bandwidth and its FLOPs over the chip's fp16 peak (`device.one_chip()`,
# `.peak_flops("float16")`); `dec.token_bytes` and `dec.step_flops` count one request. §5 modelled one request;
# the hidden steps include the 300I Duo and a batch large enough to be compute-bound.

# %%
def tokens_per_second(cfg, context, batch, device):
    """An upper bound on the tokens/s one chip of `device` generates for `batch` requests at `context` cached."""
    ...  # your code here


# %%
exercises.tokenrate.check(tokens_per_second)
