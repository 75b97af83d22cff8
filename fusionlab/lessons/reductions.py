"""Reductions and attention, fused: the code notebooks 09 (softmax, LayerNorm) and 10 (attention) teach with.

Four parts, in the order the notebooks use them:

1. **Graphs and their traffic.** `softmax_model` / `layernorm_model` / `attention_model` build the
   decomposed ONNX graphs an exporter writes (and the single-op forms); `traffic` counts what each
   node reads and writes, the Triton fused-softmax argument made for any graph.
2. **Loops.** The one-pass forms as plain numpy loops over blocks of a row: `online_softmax`
   (running max and rescaled sum), `welford` and `two_moment` (mean and variance), and
   `flash_attention` (FlashAttention's tiling: the score matrix is never built). Each is checked
   against the unfused computation in tests/test_reductions.py.
3. **Generated kernels.** `softmax_kernel` / `layernorm_kernel` write the source of a fused row
   kernel (numba, one thread), as `fusionlab.lessons.codegen` does for elementwise chains: one read of
   each row from memory, every intermediate in registers or the L1 cache, one write.
4. **Attention traffic and tiles** (notebook 10). `attention_bytes` models the memory traffic of unfused and
   tiled attention as a function of sequence length; `ascend_flash_tile` chooses (with `flash_block`) a
   FlashAttention tile that fits an Ascend AI core's L1 and Unified Buffer (figures from data/devices.json). The
   Ascend numbers are a model, not a measurement.

Vectorisation of the kernels. A reduction (row max, row sum) vectorises only if the compiler may
reorder it: the kernels use LLVM's ``reassoc`` (and ``nsz``) fast-math flags on top of
``contract``, as every parallel softmax does by summing in lanes. The row max does not vectorise
from a single accumulator in numba's LLVM even so, so the generator unrolls it over `LANES`
independent accumulators. ``exp`` is the branch-free helper below (Cody-Waite reduction and the
Cephes polynomial, as in `fusionlab.lessons.codegen`, specialised for the arguments ``x - max <= 0`` of a
softmax: no overflow branch, and 2**n built in one step because results below 2**-126 are flushed
to zero, which changes a softmax output by less than 1e-38). Its measured maximum relative error
over [-87, 0] under these flags is 3.0e-7 (8.4e-8 with ``contract`` alone); tests assert 5e-7.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from .. import timing
from ..build import make_model, tensor, value_info
from ..cost.devices import get

__all__ = [
    "softmax_model", "layernorm_model", "layernorm_gelu_model", "attention_model", "mha_model", "traffic", "Traffic",
    "softmax_reference", "online_softmax", "welford", "two_moment", "layernorm_reference", "layernorm_loop",
    "attention_reference", "flash_attention", "softmax_kernel", "layernorm_kernel", "RowKernel", "exp_neg",
    "stream_fraction", "StreamFraction", "attention_bytes", "AttentionBytes", "square_tile", "flash_buffers", "flash_block", "ascend_flash_tile", "FlashTile", "LANES",
]

#: Independent accumulators the generated kernels keep for the row max (one AVX2 register's worth).
LANES = 8
_FASTMATH = {"contract", "reassoc", "nsz"}

# --------------------------------------------------------------------------------------------------
# 1. graphs and their traffic
# --------------------------------------------------------------------------------------------------


def softmax_model(m: int, n: int, decomposed: bool = True) -> onnx.ModelProto:
    """Softmax over the last axis of an (m, n) input: five ops as exporters write it, or one Softmax."""
    h = helper.make_node
    if decomposed:
        nodes = [h("ReduceMax", ["x", "axes"], ["mx"], name="max", keepdims=1),
                 h("Sub", ["x", "mx"], ["d"], name="sub"), h("Exp", ["d"], ["e"], name="exp"),
                 h("ReduceSum", ["e", "axes"], ["s"], name="sum", keepdims=1), h("Div", ["e", "s"], ["y"], name="div")]
        inits = [tensor("axes", np.array([-1], np.int64))]
    else:
        nodes, inits = [h("Softmax", ["x"], ["y"], name="softmax", axis=-1)], []
    return make_model(nodes, [value_info("x", np.float32, [m, n])], [value_info("y", np.float32, [m, n])], inits,
                      opset=18, name="softmax")


def layernorm_model(m: int, n: int, decomposed: bool = True, eps: float = 1e-5, seed: int = 0) -> onnx.ModelProto:
    """LayerNorm over the last axis of (m, n): the nine-op export (ReduceMean, Sub, Pow, ...) or one op."""
    rng = np.random.default_rng(seed)
    gamma = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    beta = (0.1 * rng.standard_normal(n)).astype(np.float32)
    h = helper.make_node
    inits = [tensor("gamma", gamma), tensor("beta", beta)]
    if decomposed:
        nodes = [h("ReduceMean", ["x", "axes"], ["mu"], name="mean", keepdims=1), h("Sub", ["x", "mu"], ["d"], name="sub"),
                 h("Pow", ["d", "two"], ["d2"], name="pow"),
                 h("ReduceMean", ["d2", "axes"], ["var"], name="var", keepdims=1),
                 h("Add", ["var", "eps"], ["ve"], name="add_eps"), h("Sqrt", ["ve"], ["sd"], name="sqrt"),
                 h("Div", ["d", "sd"], ["z"], name="div"), h("Mul", ["z", "gamma"], ["zg"], name="mul"),
                 h("Add", ["zg", "beta"], ["y"], name="add")]
        inits += [tensor("axes", np.array([-1], np.int64)), tensor("two", np.array(2.0, np.float32)),
                  tensor("eps", np.array(eps, np.float32))]
    else:
        nodes = [h("LayerNormalization", ["x", "gamma", "beta"], ["y"], name="layernorm", axis=-1, epsilon=eps)]
    return make_model(nodes, [value_info("x", np.float32, [m, n])], [value_info("y", np.float32, [m, n])], inits,
                      opset=18, name="layernorm")


def layernorm_gelu_model(m: int = 2048, n: int = 768, eps: float = 1e-5, seed: int = 0) -> onnx.ModelProto:
    """LayerNormalization followed by the exported erf-GELU (Div, Erf, Add, Mul, Mul): issue 13's IREE check."""
    rng = np.random.default_rng(seed)
    h = helper.make_node
    nodes = [h("LayerNormalization", ["x", "gamma", "beta"], ["ln"], name="layernorm", axis=-1, epsilon=eps),
             h("Div", ["ln", "sqrt2"], ["d"], name="div"), h("Erf", ["d"], ["e"], name="erf"),
             h("Add", ["e", "one"], ["a"], name="add"), h("Mul", ["ln", "a"], ["p"], name="mul"),
             h("Mul", ["p", "half"], ["y"], name="mul_half")]
    inits = [tensor("gamma", (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)),
             tensor("beta", (0.1 * rng.standard_normal(n)).astype(np.float32)),
             tensor("sqrt2", np.array(math.sqrt(2.0), np.float32)), tensor("one", np.array(1.0, np.float32)),
             tensor("half", np.array(0.5, np.float32))]
    return make_model(nodes, [value_info("x", np.float32, [m, n])], [value_info("y", np.float32, [m, n])], inits,
                      name="layernorm_gelu")


def attention_model(batch: int, seq: int, heads: int, head_dim: int) -> onnx.ModelProto:
    """Scaled dot-product attention on (batch, seq, heads*head_dim) q, k, v: MatMul, Mul, Softmax, MatMul."""
    h = helper.make_node
    hidden = heads * head_dim
    nodes = [
        h("Reshape", ["q", "split"], ["q4"], name="q_heads"), h("Transpose", ["q4"], ["qh"], name="q_t", perm=[0, 2, 1, 3]),
        h("Reshape", ["k", "split"], ["k4"], name="k_heads"), h("Transpose", ["k4"], ["kt"], name="k_t", perm=[0, 2, 3, 1]),
        h("Reshape", ["v", "split"], ["v4"], name="v_heads"), h("Transpose", ["v4"], ["vh"], name="v_t", perm=[0, 2, 1, 3]),
        h("MatMul", ["qh", "kt"], ["s"], name="scores"), h("Mul", ["s", "scale"], ["ss"], name="scale"),
        h("Softmax", ["ss"], ["p"], name="softmax", axis=-1), h("MatMul", ["p", "vh"], ["oh"], name="context"),
        h("Transpose", ["oh"], ["o4"], name="o_t", perm=[0, 2, 1, 3]), h("Reshape", ["o4", "merge"], ["y"], name="merge"),
    ]
    inits = [tensor("split", np.array([batch, seq, heads, head_dim], np.int64)),
             tensor("merge", np.array([batch, seq, hidden], np.int64)),
             tensor("scale", np.array(1.0 / math.sqrt(head_dim), np.float32))]
    io = [value_info(n, np.float32, [batch, seq, hidden]) for n in ("q", "k", "v")]
    return make_model(nodes, io, [value_info("y", np.float32, [batch, seq, hidden])], inits, name="attention")


def mha_model(batch: int, seq: int, heads: int, head_dim: int) -> onnx.ModelProto:
    """The same attention as one onnxruntime ``com.microsoft.MultiHeadAttention`` node."""
    hidden = heads * head_dim
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], name="mha", domain="com.microsoft",
                            num_heads=heads)
    io = [value_info(n, np.float32, [batch, seq, hidden]) for n in ("q", "k", "v")]
    return make_model([node], io, [value_info("y", np.float32, [batch, seq, hidden])],
                      extra_opsets={"com.microsoft": 1}, name="mha")


@dataclass
class Traffic:
    """Bytes each node of a graph reads and writes, and what one fused kernel would move instead."""

    rows: list[tuple[str, str, int, int]]  # (node, op, bytes read, bytes written)
    fused: int

    @property
    def unfused(self) -> int:
        return sum(r + w for _, _, r, w in self.rows)

    @property
    def ratio(self) -> float:
        return self.unfused / self.fused

    def table(self, unit: int = 2**20) -> str:
        """Per-node reads and writes in MiB (plain text)."""
        lines = [f"{'node':<10} {'op':<12} {'read MiB':>9} {'written MiB':>12}"]
        for name, op, r, w in self.rows:
            lines.append(f"{name:<10} {op:<12} {r / unit:>9.2f} {w / unit:>12.2f}")
        reads, writes = sum(r for *_, r, _ in self.rows), sum(w for *_, w in self.rows)
        lines.append(f"{'total':<23} {reads / unit:>9.2f} {writes / unit:>12.2f}")
        lines.append(f"unfused {self.unfused / unit:.2f} MiB, one fused kernel {self.fused / unit:.2f} MiB: "
                     f"{self.ratio:.2f}x less traffic")
        return "\n".join(lines)


def traffic(model: onnx.ModelProto) -> Traffic:
    """Per-node bytes read (every input, constants too) and written; fused = graph inputs + outputs, once."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    g = inferred.graph
    size: dict[str, int] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        t = vi.type.tensor_type
        item = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).itemsize
        size[vi.name] = int(np.prod([d.dim_value for d in t.shape.dim], dtype=np.int64)) * item
    for init in g.initializer:
        size[init.name] = int(np.prod(init.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
    rows = [(n.name, n.op_type, sum(size[i] for i in n.input if i), sum(size[o] for o in n.output)) for n in g.node]
    data_inits = [i.name for i in g.initializer if int(np.prod(i.dims, dtype=np.int64)) > 1 and i.data_type == 1]
    fused = sum(size[i.name] for i in g.input) + sum(size[i] for i in data_inits) + sum(size[o.name] for o in g.output)
    return Traffic(rows, fused)


# --------------------------------------------------------------------------------------------------
# 2. the one-pass forms as numpy loops (blocks of a row; numpy across rows)
# --------------------------------------------------------------------------------------------------


def softmax_reference(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in float64, the safe three-pass way."""
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def online_softmax(x: np.ndarray, block: int = 64) -> np.ndarray:
    """Softmax with the row max and sum found in ONE pass over blocks (the running sum is rescaled)."""
    x = np.asarray(x, np.float32)
    rows, n = x.shape
    m = np.full((rows, 1), -np.inf, np.float32)  # running max
    s = np.zeros((rows, 1), np.float32)  # running sum of exp(x - m)
    for j in range(0, n, block):
        xb = x[:, j:j + block]
        m_new = np.maximum(m, xb.max(axis=1, keepdims=True))
        s = s * np.exp(m - m_new) + np.exp(xb - m_new).sum(axis=1, keepdims=True)  # old sum, rescaled
        m = m_new
    return np.exp(x - m) / s  # the second pass only writes


def welford(x: np.ndarray, block: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """(mean, variance) of each row in one pass: per-block moments merged with Chan's update (stable)."""
    x = np.asarray(x, np.float32)
    rows, n = x.shape
    count, mean, m2 = 0, np.zeros(rows, np.float32), np.zeros(rows, np.float32)
    for j in range(0, n, block):
        xb = x[:, j:j + block]
        nb = xb.shape[1]
        mb = xb.mean(axis=1)
        m2b = ((xb - mb[:, None]) ** 2).sum(axis=1)
        delta = mb - mean
        total = count + nb
        mean = mean + delta * (nb / total)
        m2 = m2 + m2b + delta * delta * (count * nb / total)
        count = total
    return mean, m2 / count


def two_moment(x: np.ndarray, block: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """(mean, variance) in one pass from the running sums of x and x**2: E[x^2] - E[x]^2 (can cancel)."""
    x = np.asarray(x, np.float32)
    rows, n = x.shape
    s1, s2 = np.zeros(rows, np.float32), np.zeros(rows, np.float32)
    for j in range(0, n, block):
        xb = x[:, j:j + block]
        s1 += xb.sum(axis=1)
        s2 += (xb * xb).sum(axis=1)
    mean = s1 / n
    return mean, s2 / n - mean * mean


def layernorm_reference(x, gamma, beta, eps: float = 1e-5) -> np.ndarray:
    """LayerNorm over the last axis in float64."""
    x = np.asarray(x, np.float64)
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


def layernorm_loop(x, gamma, beta, eps: float = 1e-5, moments=welford, block: int = 64) -> np.ndarray:
    """LayerNorm from one-pass moments (`welford` or `two_moment`), then one pass that writes."""
    mean, var = moments(x, block)
    rstd = 1.0 / np.sqrt(var + np.float32(eps))
    return ((np.asarray(x, np.float32) - mean[:, None]) * rstd[:, None] * gamma + beta).astype(np.float32)


def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(q k^T / sqrt(d)) v for (..., n, d) arrays, in float64, with the (n, n) score matrix."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    return softmax_reference(s) @ v


def flash_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                    block_q: int = 64, block_k: int = 64) -> np.ndarray:
    """FlashAttention's forward pass as loops over tiles, for one head: q, k, v are (n, d).

    Each query tile keeps its output accumulator ``o``, running max ``m`` and running sum ``l`` on chip;
    key/value tiles stream past. Only a (block_q, block_k) tile of scores ever exists.
    """
    q, k, v = (np.asarray(a, np.float32) for a in (q, k, v))
    n, d = q.shape
    scale = np.float32(1.0 / math.sqrt(d))
    out = np.empty_like(q)
    for i in range(0, n, block_q):
        qi = q[i:i + block_q] * scale
        o = np.zeros((qi.shape[0], d), np.float32)
        m = np.full((qi.shape[0], 1), -np.inf, np.float32)
        l = np.zeros((qi.shape[0], 1), np.float32)
        for j in range(0, k.shape[0], block_k):
            s = qi @ k[j:j + block_k].T  # one tile of scores
            m_new = np.maximum(m, s.max(axis=1, keepdims=True))
            p = np.exp(s - m_new)
            alpha = np.exp(m - m_new)  # rescale what was accumulated under the old max
            l = alpha * l + p.sum(axis=1, keepdims=True)
            o = alpha * o + p @ v[j:j + block_k]
            m = m_new
        out[i:i + block_q] = o / l
    return out


# --------------------------------------------------------------------------------------------------
# 3. generated fused row kernels (numba)
# --------------------------------------------------------------------------------------------------

_EXP_NEG = '''
# exp(x) for x <= 0 (a softmax's x - max): Cody-Waite reduction x = n*ln2 + r, the Cephes expf
# polynomial for e**r, 2**n from the float's exponent bits. Below -87.3 the result is flushed to 0.
EXP_LO = np.float32(-87.3)
EXP_LOG2E = np.float32(1.44269504088896341)
EXP_LN2_HI, EXP_LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)  # ln2 = HI + LO, HI exact
EXP_P0, EXP_P1, EXP_P2 = np.float32(5.0000001201e-1), np.float32(1.6666665459e-1), np.float32(4.1665795894e-2)
EXP_P3, EXP_P4, EXP_P5 = np.float32(8.3334519073e-3), np.float32(1.3981999507e-3), np.float32(1.9875691500e-4)
EXP_HALF, EXP_ONE = np.float32(0.5), np.float32(1.0)
EXP_BIAS, EXP_MANTISSA = np.float32(127.0), np.float32(2.0**23)
EXP_ZERO = np.float32(0.0)

def exp_neg(x):
    c = EXP_LO if x < EXP_LO else x  # NaN compares false and flows through as NaN
    n = np.floor(c * EXP_LOG2E + EXP_HALF)
    r = c - n * EXP_LN2_HI - n * EXP_LN2_LO
    p = ((((((EXP_P5 * r + EXP_P4) * r + EXP_P3) * r + EXP_P2) * r + EXP_P1) * r + EXP_P0) * r * r
         + r + EXP_ONE)
    y = p * np.int32((n + EXP_BIAS) * EXP_MANTISSA).view(np.float32)
    return EXP_ZERO if x < EXP_LO else y
'''


def _row_max(lanes: int, src: str, out: str, pad: str) -> list[str]:
    """Source lines: `out` = max of row `src`, with `lanes` independent accumulators (vectorisable)."""
    acc = [f"m{k}" for k in range(lanes)]
    lines = [f"{pad}{' = '.join(acc)} = NEG_INF",
             f"{pad}full = n - n % {lanes}",
             f"{pad}for j in range(0, full, {lanes}):"]
    lines += [f"{pad}    v = {src}[j + {k}]; m{k} = v if v > m{k} else m{k}" for k in range(lanes)]
    lines.append(f"{pad}{out} = NEG_INF")
    lines += [f"{pad}{out} = m{k} if m{k} > {out} else {out}" for k in range(lanes)]
    lines += [f"{pad}for j in range(full, n):", f"{pad}    v = {src}[j]; {out} = v if v > {out} else {out}"]
    return lines


def _softmax_source(lanes: int) -> str:
    lines = ["NEG_INF = np.float32(-np.inf)", "ZERO, ONE = np.float32(0.0), np.float32(1.0)", _EXP_NEG,
             "def softmax_rows(x, y):",
             "    rows, n = x.shape",
             "    for i in range(rows):",
             "        xr = x[i]  # one row: read from memory once, then it sits in L1",
             "        yr = y[i]",
             "        # pass 1 (memory): the row max"]
    lines += _row_max(lanes, "xr", "m", " " * 8)
    lines += ["        # pass 2 (in cache): e = exp(x - max), stored, and summed",
              "        s = ZERO",
              "        for j in range(n):",
              "            e = exp_neg(xr[j] - m)",
              "            yr[j] = e",
              "            s += e",
              "        # pass 3 (in cache): scale by 1 / sum",
              "        r = ONE / s",
              "        for j in range(n):",
              "            yr[j] *= r"]
    return "\n".join(lines) + "\n"


def _layernorm_source() -> str:
    lines = ["ZERO, ONE = np.float32(0.0), np.float32(1.0)", "",
             "def layernorm_rows(x, gamma, beta, eps, y):",
             "    rows, n = x.shape",
             "    inv_n = ONE / np.float32(n)",
             "    for i in range(rows):",
             "        xr = x[i]  # one row: read from memory once, then it sits in L1",
             "        yr = y[i]",
             "        # pass 1 (memory): the mean",
             "        s = ZERO",
             "        for j in range(n):",
             "            s += xr[j]",
             "        mu = s * inv_n",
             "        # pass 2 (in cache): the variance around the mean (exact, no cancellation)",
             "        q = ZERO",
             "        for j in range(n):",
             "            d = xr[j] - mu",
             "            q += d * d",
             "        rstd = ONE / np.sqrt(q * inv_n + eps)",
             "        # pass 3 (in cache, writes): normalise, scale, shift",
             "        for j in range(n):",
             "            yr[j] = (xr[j] - mu) * rstd * gamma[j] + beta[j]"]
    return "\n".join(lines) + "\n"


_COMPILED: dict[str, object] = {}


def _compile(src: str, name: str):
    fn = _COMPILED.get(src)
    if fn is None:
        import numba

        namespace = {"np": np}
        exec(compile(src, f"<fused {name}>", "exec"), namespace)
        if "exp_neg" in namespace:
            # inline="always": numba inlines it before LLVM sees the loop, so the loop vectorises
            namespace["exp_neg"] = numba.njit(inline="always", error_model="numpy", fastmath=_FASTMATH)(namespace["exp_neg"])
        fn = numba.njit(error_model="numpy", fastmath=_FASTMATH)(namespace[name])
        _COMPILED[src] = fn
    return fn


@dataclass
class RowKernel:
    """A generated fused kernel over the rows of a 2-D float32 array (numba, one thread)."""

    name: str
    source: str

    def __call__(self, x: np.ndarray, *args, out: np.ndarray | None = None) -> np.ndarray:
        x = np.ascontiguousarray(x, np.float32)
        if x.ndim != 2:
            raise ValueError(f"{self.name} takes a 2-D array, got shape {x.shape}")
        y = np.empty_like(x) if out is None else out
        _compile(self.source, self.name)(x, *args, y)
        return y


def softmax_kernel(lanes: int = LANES) -> RowKernel:
    """The fused softmax: per row, max (memory), exp + sum and scale (cache); one read, one write."""
    return RowKernel("softmax_rows", _softmax_source(lanes))


class _LayerNormKernel(RowKernel):
    def __call__(self, x, gamma, beta, eps: float = 1e-5, out=None):
        g = np.ascontiguousarray(gamma, np.float32)
        b = np.ascontiguousarray(beta, np.float32)
        return super().__call__(x, g, b, np.float32(eps), out=out)


def layernorm_kernel() -> RowKernel:
    """The fused LayerNorm: per row, mean (memory), variance and the normalised write (cache)."""
    return _LayerNormKernel("layernorm_rows", _layernorm_source())


def exp_neg(x: np.ndarray) -> np.ndarray:
    """The kernels' exp helper applied to an array (compiled with the kernels' flags), for checking."""
    src = _EXP_NEG + "\ndef exp_array(x, y):\n    for i in range(x.size):\n        y[i] = exp_neg(x[i])\n"
    x = np.ascontiguousarray(x, np.float32).ravel()
    y = np.empty_like(x)
    _compile(src, "exp_array")(x, y)
    return y


@dataclass
class StreamFraction:
    """A kernel's effective bandwidth as a fraction of streaming bandwidth, both timed in the same rounds."""

    fraction: float
    kernel_gbs: float
    copy_gbs: float
    add_gbs: float

    @property
    def stream_gbs(self) -> float:
        """The limit, as `fusionlab.cost.calibrate` defines it: the better of copy and add."""
        return max(self.copy_gbs, self.add_gbs)


def stream_fraction(fn, moved: int, *, elements: int = 16 * 2**20, min_time: float = 1.0) -> StreamFraction:
    """`fn`'s GB/s (``moved`` bytes per call) against STREAM copy and add, interleaved with it, one thread.

    The copy and add are `fusionlab.cost.calibrate.stream_bandwidth`'s (fp32 arrays of `elements`, counted
    STREAM-style: 2 and 3 arrays' bytes). Timing them in the same interleaved rounds as the kernel
    makes the fraction a paired ratio, so a busy machine slows both sides alike.
    """

    a = np.ones(elements, np.float32)
    b = np.ones(elements, np.float32)
    c = np.empty(elements, np.float32)
    vs_copy = timing.compare(lambda: np.copyto(c, a), fn, min_time=min_time)  # speedup = t_copy / t_fn
    vs_add = timing.compare(lambda: np.add(a, b, out=c), fn, min_time=min_time)
    copy_gbs = 2 * a.nbytes / vs_copy.a.median / 1e9
    add_gbs = 3 * a.nbytes / vs_add.a.median / 1e9
    fraction = min(vs_copy.speedup * moved / (2 * a.nbytes), vs_add.speedup * moved / (3 * a.nbytes))
    kernel_gbs = moved / _median([*vs_copy.b.samples, *vs_add.b.samples]) / 1e9
    return StreamFraction(fraction, kernel_gbs, copy_gbs, add_gbs)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2]


# --------------------------------------------------------------------------------------------------
# 4. attention: traffic against sequence length, and a tile for an Ascend core (modelled)
# --------------------------------------------------------------------------------------------------


@dataclass
class AttentionBytes:
    """Memory traffic of one attention head, unfused (scores in memory) and tiled (FlashAttention)."""

    seq: int
    head_dim: int
    unfused: int
    flash: int
    block_q: int


def square_tile(head_dim: int, on_chip_bytes: int, item: int = 4, step: int = 16) -> int:
    """The largest tile b (a multiple of `step`) whose Q and output accumulator (b x d), K and V tiles
    (b x d each) and score tile (b x b) fit `on_chip_bytes` together."""
    d, b = head_dim, step
    while (4 * (b + step) * d + (b + step) ** 2) * item <= on_chip_bytes:
        b += step
    return b


def attention_bytes(seq: int, head_dim: int, *, item: int = 4, on_chip_bytes: int = 1 << 20) -> AttentionBytes:
    """Bytes one head moves to and from memory: MatMul, Mul (scale), Softmax, MatMul unfused, or tiled.

    Unfused, every intermediate goes to memory: Q and K read, scores S written; S read and written by
    the scale, again by the softmax; P and V read, O written. Tiled (FlashAttention): Q read and O
    written once; K and V read once per query tile, the tile as large as `on_chip_bytes` allows
    (`square_tile`). Both grow as seq**2; only the unfused one holds a seq x seq tensor.
    """
    n, d = seq, head_dim
    unfused = (2 * n * d + n * n) * item + 2 * n * n * item + 2 * n * n * item + (n * n + 2 * n * d) * item
    b = min(square_tile(d, on_chip_bytes, item), max(16, n))
    tiles = math.ceil(n / b)
    flash = 2 * n * d * item + tiles * 2 * n * d * item
    return AttentionBytes(seq=n, head_dim=d, unfused=unfused, flash=flash, block_q=b)


@dataclass
class FlashTile:
    """A FlashAttention tile for one AI core, and what it moves for one head (modelled)."""

    device: str
    block_q: int
    block_k: int
    l1_bytes: int
    ub_bytes: int
    hbm_bytes: int
    unfused_bytes: int
    time_us: float
    unfused_time_us: float


def flash_buffers(block: int, head_dim: int) -> tuple[int, int]:
    """(L1 bytes, UB bytes) of a square FlashAttention tile: fp16 Q and double-buffered K, V tiles in
    L1; fp32 scores, fp16 probabilities, the fp32 output accumulator and the row max and sum in UB."""
    b, d = block, head_dim
    return (b * d + 2 * 2 * b * d) * 2, b * b * (4 + 2) + b * d * 4 + 2 * b * 4


def flash_block(ub_bytes: float, l1_bytes: float, head_dim: int, *, seq: int | None = None, step: int = 16) -> int:
    """The largest square tile b, a multiple of `step`, whose `flash_buffers` fit both `l1_bytes` and `ub_bytes`
    (0 if none does). With `seq`, b stops at the first multiple of `step` that covers the sequence."""
    b = 0
    while seq is None or b < seq:
        l1, ub = flash_buffers(b + step, head_dim)
        if l1 > l1_bytes or ub > ub_bytes:
            break
        b += step
    return b


def ascend_flash_tile(device, seq: int, head_dim: int = 128, *, step: int = 16) -> FlashTile:
    """The largest square tile (multiple of 16) whose buffers fit the core's L1 and UB; its traffic and time.

    fp16 Q, K, V in L1 (K and V double-buffered); fp32 scores, fp16 probabilities, the fp32 output
    accumulator and the row max/sum in the Unified Buffer. Sizes from data/devices.json (ub_kb,
    l1_kb); time = max(bytes / bandwidth, FLOPs / fp16 peak) for one head on one whole chip (a card of two
    chips, the 300I Duo, runs one head on one of them: half the card's bandwidth and peak).
    """

    dev = get(device)
    d, half = head_dim, 2
    b = flash_block(dev.ub_kb * 1024, dev.l1_kb * 1024, d, seq=seq, step=step)
    if b == 0:
        raise ValueError(f"no {step}-multiple tile of head_dim {d} fits {dev.name}")
    l1, ub = flash_buffers(b, d)
    tiles = math.ceil(seq / b)
    hbm = 2 * seq * d * half + tiles * 2 * seq * d * half
    unfused = attention_bytes(seq, d, item=half).unfused
    flops = 4 * seq * seq * d
    peak, bw = dev.chip_peak_flops("float16"), dev.chip_bandwidth
    t = max(hbm / bw, flops / peak) * 1e6
    tu = max(unfused / bw, flops / peak) * 1e6
    return FlashTile(dev.name, b, b, l1, ub, hbm, unfused, t, tu)
