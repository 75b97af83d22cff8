# %% [markdown]
# # 20 · Dynamic shapes: gears, a cache keyed by shape, and exact padding
#
# **What you will be able to do**
#
# - say why a static-shape compiler such as Ascend's ATC compiles a model *per input shape*, and handle variable
#   sequence lengths with shape **gears** (档位) or a shape *range*;
# - fix the seed's `DynamicFusionOp` cache (a key that is a hash of a string, no bound on its size) with a cache
#   keyed by the shape itself;
# - weigh a set of gears by the compute its padding wastes on a stream of requests;
# - show that padding a request up to a gear does not change the answer, on a real BERT-style encoder.
#
# **Where this comes from.** The seed's §5.1 proposes "dynamic fusion for Transformers": a class that compiles a
# fused operator for each combination of input shapes it sees and keeps it in a dict, and says that in BERT this
# raised long-sequence throughput 2.1 times (notebook 21 §3 weighs that). We have no Ascend hardware. The compiler
# here is onnxruntime: a session built for one fixed input shape is our "compiled model for one shape". The Ascend
# side is described from the CANN documentation. Notebook 21 measures what compiling per shape costs, and replays a
# stream of requests through caching policies.

# %%
import matplotlib.pyplot as plt
import numpy as np
from onnx import numpy_helper

from fusionlab import exercises, seed_claims, zoo
from fusionlab.lessons import dynamic_shapes
from fusionlab.passes import fuse
from fusionlab.text import text_table, wrap
from fusionlab.verification.runtime import make_feeds, session
from IPython.display import Markdown, display

plt.rcParams["figure.dpi"] = 80

# %% [markdown]
# ## 1. Why a static-shape compiler compiles per shape
#
# ATC turns an ONNX model into an offline model (`.om`) for an Ascend NPU. Like most ahead-of-time compilers it
# plans for fixed tensor shapes: how each operator's data is cut into tiles that fit the AI Core's on-chip
# buffers, which fused kernels to generate, where every intermediate tensor lives. Change the sequence length
# and the plan changes.
#
# A Transformer's requests do not all have the same length. ATC's answer for this case is `--dynamic_dims`:
# mark the variable dimensions with `-1` in `--input_shape` and list a few values for them, the *gears*. ATC
# compiles the model once per gear into one `.om`; at run time the application calls `aclmdlSetInputDynamicDims`
# to select a gear, and pads the request up to it. The
# [ATC documentation](https://www.hiascend.com/document/detail/zh/CANNCommunityEdition/81RC1alpha001/devaids/devtools/atc/atlasatcparam_16_0020.html)
# allows from 2 to 100 gears and recommends 3 to 4. Each gear lists one value for *every* `-1`, in order, so
# with two inputs of shape `(1, -1)` a gear of 128 is written `128,128`. `dynamic_shapes.atc_dynamic_dims` writes
# the arguments:

# %%
GEARS = dynamic_shapes.gears(512, 4)  # halvings of 512: the "pow2" policy
args = dynamic_shapes.atc_dynamic_dims({"input_ids": (1, -1), "attention_mask": (1, -1)}, GEARS)
print("gears:", GEARS)
print("atc --model=bert.onnx --framework=5 --output=bert_gears --soc_version=Ascend310P3 \\\n    " + args)
print("linear gears instead:", dynamic_shapes.gears(512, 4, "linear"))
for n in (1, 64, 65, 300, 512):
    print(f"a request of {n:3d} tokens runs on gear {dynamic_shapes.gear_for(n, GEARS)}")
try:
    dynamic_shapes.gear_for(600, GEARS)
except ValueError as exc:
    print("600 tokens:", exc)

# %% [markdown]
# Gears are not ATC's only answer. It also compiles a real **dynamic-shape** model: give a dimension a *range*
# instead of a value, and one `.om` serves every length in it, with no padding and no gear to choose (the
# [`--input_shape` documentation](https://www.hiascend.com/document/detail/zh/canncommercial/700/inferapplicationdev/atctool/atlasatc_16_0050.html),
# which also says the Atlas 200/300/500 inference products, the Ascend 310, cannot take a range).
#
# ```bash
# atc --model=bert.onnx --framework=5 --output=bert_dyn --soc_version=Ascend310P3 \
#     --input_shape="input_ids:1,1~512;attention_mask:1,1~512"    # or -1: any length >= 0
# # older releases: --input_shape_range="input_ids:[1,1~512];attention_mask:[1,1~512]" (now deprecated;
# # its status in CANN 6.0.1, the seed's release, is not checked here)
# ```
#
# At run time the application sets the real input shape with `aclmdlSetDatasetTensorDesc` before
# `aclmdlExecute`, and reads the output shapes back with `aclmdlGetDatasetTensorDesc`. The operators were compiled
# for the range, not for one shape, so each one computes its **tiling at run time**: the host-side tiling function
# of an Ascend C operator (the `TilingFunc` in `op_host/<op>.cpp` of notebook 16's package, filling the
# `TilingData` that `op_host/<op>_tiling.h` declares) runs for every
# call with the actual shapes and hands the kernel its block and tile sizes. The price is that tiling work per
# call, and kernels that cannot be specialised for one shape; the gain is one model, no padding and no
# compile-per-shape. Which is faster is a measurement on the device; notebook 21 §1 makes it on this CPU.

# %% [markdown]
# ## 2. The seed's cache, and its two flaws
#
# Here is the seed's class as published (comments translated). `_compile` is not shown in the seed; ours only
# counts calls. `max_ops` is accepted and never used.
#
# **Predict first:** 2000 requests arrive with lengths between 8 and 512 tokens (below). How many compiled kernels
# will the seed's cache hold at the end?

# %%
class DynamicFusionOp:
    def __init__(self, max_ops=3):
        self.fusion_cache = {}

    def __call__(self, op_sequence):
        # choose the fusion from the input shapes automatically
        key = hash(str([op.shape for op in op_sequence]))
        if key not in self.fusion_cache:
            self.fusion_cache[key] = self._compile(op_sequence)
        return self.fusion_cache[key]

    def _compile(self, op_sequence):
        return f"kernel #{len(self.fusion_cache)}"  # stands in for minutes of compilation

# %% [markdown]
# A realistic stream: 2000 requests whose token counts follow a log-normal distribution (median parameter 96 tokens, a
# long tail), cut at BERT's maximum of 512 tokens as tokenizers do, and never shorter than 8.
# `dynamic_shapes.request_lengths` draws them from a seeded generator, so every run sees the same stream.

# %%
stream = dynamic_shapes.request_lengths(2000, seed=0, median=96, sigma=0.8, min_len=8, max_len=512)
print(f"{len(stream)} requests, lengths {stream.min()}..{stream.max()}, median {int(np.median(stream))}, "
      f"mean {stream.mean():.1f}; {len(set(stream.tolist()))} distinct lengths")

op = DynamicFusionOp()
sizes = []
for n in stream:
    op([np.zeros((1, n), np.int64), np.ones((1, n), np.int64)])  # input_ids, attention_mask
    sizes.append(len(op.fusion_cache))
print(f"compiled kernels held by the seed's cache after the stream: {len(op.fusion_cache)}")
print(f"after the first 100 requests: {sizes[99]}, after 1000: {sizes[999]}, after 2000: {sizes[-1]}")

# %%
print(seed_claims.claim("s51-shape-cache").summary())

# %% [markdown]
# **Flaw 1: the cache never stops growing.** Every new sequence length costs one compilation and one more
# compiled model kept forever. The tail of the distribution keeps producing lengths not seen before, so the
# cache is still growing after 2000 requests. A compiled model is not small: onnxruntime keeps its own copy of
# the weights in every session (notebook 21 §1 measures the memory), and the small encoder we use below has:

# %%
model = zoo.get("bert_tiny")
weights = sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
print(f"bert_tiny ({zoo.MODELS['bert_tiny']}): {weights / 2**20:.1f} MiB of weights")
print(f"{len(op.fusion_cache)} specialised copies hold at least {len(op.fusion_cache) * weights / 2**30:.1f} GiB")

# %% [markdown]
# **Flaw 2: the key is a hash of a string.** That is two problems at once.
#
# - *A string is not a shape.* `str` spells the same shape differently depending on where the numbers came
#   from: a tuple or a list, Python ints or NumPy integers (NumPy 2 prints `np.int64(128)`). Each spelling is a
#   separate entry and a separate compilation.
# - *A hash is not the key.* A dict keyed by `hash(...)` compares only the hash, so two different shapes with the
#   same hash get the same compiled kernel, which then runs on inputs of the wrong shape. For strings CPython's
#   64-bit SipHash makes such a collision very unlikely, but it is also salted per process, so the key cannot
#   name a compiled model saved to disk for the next process. The obvious "fix", hashing the tuple, collides for
#   real: in CPython `hash(-1) == hash(-2)`, and -1 and -2 are exactly how CANN's graph engine writes an unknown
#   dimension and an unknown rank (`ge::UNKNOWN_DIM`, `ge::UNKNOWN_DIM_NUM`).
#
# The cure is to use the shape itself as the key. `dynamic_shapes.shape_key` normalises a shape to nested tuples of
# Python ints, and `dynamic_shapes.ShapeCache` is keyed by it, so equal shapes share one entry and different shapes
# can never share one:

# %%
spellings = {"tuple of ints": [(1, 128)], "list of ints": [[1, 128]], "NumPy ints": [(1, np.int64(128))]}
print(wrap(f"the seed's strings: {({name: str(s) for name, s in spellings.items()})}"))
print("distinct seed keys for one shape:", len({hash(str(s)) for s in spellings.values()}))
print("hash((1, -1)) == hash((1, -2)):", hash((1, -1)) == hash((1, -2)))

cache = dynamic_shapes.ShapeCache(lambda key: f"kernel for {key}", capacity=None)
for s in spellings.values():
    cache.get(s)
print("ShapeCache entries for the three spellings:", len(cache), cache.keys())
print("(1, -1) and (1, -2) are different keys:", dynamic_shapes.shape_key((1, -1)) != dynamic_shapes.shape_key((1, -2)))

# %% [markdown]
# `ShapeCache(build, capacity)` is also bounded: when a new entry would exceed `capacity`, the least recently
# used one is evicted (`capacity=None` reproduces the seed's unbounded cache). It counts hits, misses (=
# compilations) and evictions, and the time spent building. Bounding the cache alone does not help when every
# request has a new length, though: it just recompiles. What bounds the number of *shapes* is padding to gears.

# %%
def cache_growth(key_of, capacity=None):
    c = dynamic_shapes.ShapeCache(lambda key: key, capacity)
    held = []
    for n in stream:
        c.get(key_of(n))
        held.append(len(c))
    return c, held


exact_cache, exact_held = cache_growth(lambda n: (1, n))
gear_cache, gear_held = cache_growth(lambda n: (1, dynamic_shapes.gear_for(n, GEARS)))
for name, c in (("per exact shape (the seed)", exact_cache), ("gears 64/128/256/512", gear_cache)):
    s = c.stats()
    print(f"{name:<28} compiles {s['misses']:4d}  hits {s['hits']:5d}  entries {s['entries']:4d}")

fig, ax = plt.subplots(figsize=(7, 3.4))
ax.plot(np.arange(1, len(stream) + 1), exact_held, label="per exact shape (the seed): never stops growing")
ax.plot(np.arange(1, len(stream) + 1), gear_held, label="gears 64/128/256/512: 4 models at most")
ax.set(xlabel="requests served", ylabel="compiled models held", title="cache size over a stream of 2000 requests")
ax.legend(fontsize="small")
plt.close(fig)
fig

# %% [markdown]
# ## 3. Gears: padding wastes compute, and is exact thanks to the mask
#
# Gears trade compilations for padding: a request of 65 tokens runs on gear 128 and computes `128 − 65 = 63` tokens for
# nothing. We measure the waste as *computed tokens / useful tokens* over the stream. Fewer gears mean fewer
# compilations and more padding; the stream's distribution decides where gears should sit.

# %%
def waste(gear_set):
    return sum(dynamic_shapes.gear_for(n, gear_set) for n in stream) / stream.sum()


rows = [["one static model (512)", "1", f"{waste((512,)):.2f}x"]]
for policy in ("pow2", "linear"):
    for k in (2, 3, 4, 6):
        g = dynamic_shapes.gears(512, k, policy)
        rows.append([f"{policy} {'/'.join(map(str, g))}", str(k), f"{waste(g):.2f}x"])
print("\n".join(text_table(["gears", "compiles", "waste"], rows)))

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
ax1.hist(stream, bins=64, color="tab:gray")
for g in GEARS:
    ax1.axvline(g, color="tab:red", lw=1)
ax1.set(xlabel="request length (tokens); red: gears", ylabel="requests", title="the stream and the pow2 gears")
ks = range(1, 9)
ax2.plot(list(ks), [waste(dynamic_shapes.gears(512, k, "pow2")) for k in ks], "o-", label="pow2 (halvings of 512)")
ax2.plot(list(ks), [waste(dynamic_shapes.gears(512, k, "linear")) for k in ks], "s-", label="linear (equal steps)")
ax2.axhline(1, color="black", lw=1, ls="--")
ax2.set(xlabel="number of gears (= compilations)", ylabel="computed / useful tokens",
        title="padding waste against number of gears")
ax2.legend(fontsize="small")
fig.tight_layout()
plt.close(fig)
fig

# %% [markdown]
# With three or four gears, the number the ATC documentation recommends, halvings beat equal steps for this
# stream: most requests are short, and that is where halvings put their gears. Four gears already bring the
# waste from about 4× (everything padded to 512) to about 1.4×. Beyond four, halvings stop helping (their new
# gears, 32 tokens and below, are where few requests are), while equal steps keep splitting the wide gaps at the top.
# Neither rule knows the distribution; gears chosen for the real traffic can do better than both (Exercise 2).
#
# **Is padding exact?** BERT adds `(1 - attention_mask) × -10000` to the attention scores before the softmax.
# A padded position has mask 0, so its score drops by 10000, and `exp(-10000)` is exactly 0 in fp32 (the
# smallest positive fp32 number is about `exp(-103)`): padded keys get attention weight exactly 0, so the real
# positions see the same weighted sums as without padding. Every other operation in BERT works on one position at
# a time.

# %%
print("exp(-10000) in fp32:", np.exp(np.float32(-10000.0)))
print("smallest positive fp32 (subnormal):", np.finfo(np.float32).smallest_subnormal)

# %% [markdown]
# Now on a real encoder: `zoo`'s BERT-tiny (2 layers, hidden 128), fused with our vertical pass (LayerNorm and
# bias+GELU groups become single kernels), run by onnxruntime with all its optimisations. For eight lengths from 1
# to 511 we run the exact shape, then the same request padded to its gear (`dynamic_shapes.pad_feeds`: input ids with the
# [PAD] id 0, mask with 0) and sliced back (`dynamic_shapes.unpad`), and compare every value at the real positions with
# fp32 tolerances (rtol 1e-4, atol 1e-5, unscaled). Twice: on the same dynamic-shape session, and on a static
# session built for the gear (`dynamic_shapes.static_session`, notebook 21 §1).

# %%
fused = fuse(model, passes=("vertical",))
print(fused.summary())
fused_model = fused.graph
dynamic_sess = session(fused_model, "all")
checks = []
for n in (1, 7, 64, 65, 100, 129, 300, 511):
    g = dynamic_shapes.gear_for(n, GEARS)
    feeds = make_feeds(model, dims={"batch": 1, "sequence": n}, seed=n)
    same = dynamic_shapes.verify_padding(dynamic_sess, feeds, g)
    gear_session = dynamic_shapes.static_session(fused_model, {"batch": 1, "sequence": g})
    static = dynamic_shapes.verify_padding(dynamic_sess, feeds, g, padded_session=gear_session)
    checks.append((n, g, same, static))
print("\n".join(text_table(
    ["length", "gear", "padded, same session", "padded, static gear session"],
    [[str(n), str(g), "equal within tol" if a.ok else "DIFFERENT", "equal within tol" if b.ok else "DIFFERENT"]
     for n, g, a, b in checks])))

# %% [markdown]
# The mask is what makes this work. Pad the same way but leave the mask at 1 on the padding, and the real
# positions attend to the [PAD] tokens:

# %%
feeds = make_feeds(model, dims={"batch": 1, "sequence": 100}, seed=100)
names = [o.name for o in dynamic_sess.get_outputs()]
exact = dynamic_sess.run(names, feeds)[0]
unmasked = dynamic_sess.run(names, dynamic_shapes.pad_feeds(feeds, 128, pad_values={"attention_mask": 1}))[0][:, :100]
print("padded without masking the padding: equal within tol?",
      bool(np.allclose(unmasked, exact, rtol=1e-4, atol=1e-5)))
print("largest difference above 0.1:", bool(np.abs(unmasked - exact).max() > 0.1))

# %% [markdown]
# The exact errors, in a cell the tests do not compare (they depend on the CPU's code paths), and what they say:

# %%
# NBVAL_IGNORE_OUTPUT
same_err, static_err = (max(c[i].max_abs for c in checks) for i in (2, 3))
print(f"padded vs exact, same dynamic session: max abs error {same_err:.1e}")
print(f"padded on the static gear session vs exact on the dynamic one: {static_err:.1e}")
display(Markdown(
    ("On the same session the padded run agrees to the last bit on this machine: the zero attention weights add "
     "exact zeros." if same_err == 0 else
     f"On the same session the padded run differs by at most {same_err:.1e} on this machine: the zero attention "
     "weights add exact zeros, but a longer sequence can change the order of the kernels' sums.")
    + (" The static session agrees to the last bit too." if static_err == 0 else
       f" The static session differs by at most {static_err:.1e}, not because of padding but because it runs "
       "different kernels (notebook 21 §1 counts the ops a session built for one shape runs).")
    + (" Both are far inside fp32 tolerance." if all(c[2].ok and c[3].ok for c in checks) else "")))

# %% [markdown]
# ## Summary
#
# - A static-shape compiler compiles per input shape: bound the shapes with gears (ATC's `--dynamic_dims`) or
#   compile for a range; key a cache of compiled models by the shape tuple itself, and bound its size.
# - Gears trade compilations for padding: four halvings of 512 cut the waste on our stream from about 4× (one
#   static model) to about 1.4×; gears that know the distribution can do better.
# - Padding up to a gear is exact thanks to the attention mask, checked on a real BERT encoder at every gear.
#
# ## Exercises
#
# The exercises check themselves: write your answer in the cell under each task, run it, then run the `check` cell.
# `check` grades it at once on hidden cases and prints PASS with what it checked, or FAIL with a hint naming the
# first case your answer gets wrong and the mistake it looks like. The notebook is stored unanswered; reference
# answers are in the repository's `solutions/` folder, outside the notebooks (try first).
#
# **Exercise 1: the compute padding to gears wastes.** Write `padded_waste(lengths, gears)`: pad each request up to
# the smallest gear that holds it (§1's rule; pick the gear yourself, without `gear_for`) and return the tokens
# computed over the tokens asked for, over the whole stream (§3's waste). The hidden streams include a 65-token
# request, lengths equal to a gear, gears out of order, one gear, and 2000 requests like §2's.

# %%
def padded_waste(lengths, gears):
    """Computed tokens / useful tokens, each request padded up to its gear."""
    ...  # your code here


# %%
exercises.gears.check(padded_waste)

# %% [markdown]
# **Exercise 2: the gears that pad a stream least.** Write `best_gears(lengths, k)`: at most `k` gears under which the
# stream computes the fewest tokens (the waste of Exercise 1 and §3). An optimal gear sits at some request's length
# and the top one at the longest; trying every combination of lengths is fast enough for the hidden streams (at most
# four gears). They include two clusters, a longest request short of 512 tokens, more gears than distinct lengths,
# and a stream like §2's; several sets can be optimal, and any of them passes.

# %%
def best_gears(lengths, k):
    """At most k gears (token counts) that minimise the tokens computed over the stream."""
    ...  # your code here


# %%
exercises.bestgears.check(best_gears)
