"""The algebra behind each fusion, as small functions a notebook can show and a test can check.

Conv + BatchNormalization (inference mode) is an affine map per output channel after a linear op:

    BN(y) = γ · (y − μ) / √(σ² + ε) + β = s · y + (β − s·μ),   s = γ / √(σ² + ε)

and Conv is linear in its weights, so  BN(Conv(x, W) + b) = Conv(x, s·W) + (s·(b − μ) + β).
The seed's formula `b' = β − γμ/√(σ²+ε)` is the special case b = 0.

Folding is computed in float64 and cast back to the model's dtype once.

The module also holds readable numpy references (`conv_nd`, `conv_transpose_nd`, `batch_norm`) that
the tests and notebooks check folds against, the fp16 folding report, the work count behind the
seed's "5 steps become one conv" claim, and the weight concatenation behind horizontal fusion.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

__all__ = [
    "bn_scale_shift", "fold_affine", "fold_conv_bn", "fold_matmul_bn", "fold_gemm_bn", "fold_linear_affine", "Folded",
    "conv_nd", "conv_transpose_nd", "batch_norm",
    "Fp16FoldReport", "fold_fp16_report",
    "Work", "conv_bn_work", "work_table",
    "concat_conv_weights", "concat_matmul_weights",
]


@dataclass
class Folded:
    """Folded weight and bias, plus what folding in the model's own dtype would have cost."""

    weight: np.ndarray
    bias: np.ndarray
    overflow: bool = False  # folded values exceed the dtype's range (e.g. fp16 > 65504)
    underflow: bool = False  # a nonzero folded weight rounds to 0 in the dtype (its term, and inf·w, are lost)


# --------------------------------------------------------------------------------------------------
# folding
# --------------------------------------------------------------------------------------------------

def bn_scale_shift(gamma, beta, mean, var, eps: float = 1e-5):
    """Per-channel (scale, shift) of an inference-mode BatchNormalization, in float64."""
    gamma, beta, mean, var = (np.asarray(a, dtype=np.float64) for a in (gamma, beta, mean, var))
    scale = gamma / np.sqrt(var + float(eps))
    shift = beta - scale * mean
    return scale, shift


def _cast_back(w64: np.ndarray, b64: np.ndarray, dtype) -> Folded:
    dtype = np.dtype(dtype)
    overflow = False
    if dtype.kind == "f":
        big = np.finfo(dtype).max
        overflow = bool(np.any(np.abs(w64) > big) or np.any(np.abs(b64) > big))
    with np.errstate(over="ignore", under="ignore"):
        w_cast = w64.astype(dtype)
        underflow = bool(dtype.kind == "f" and np.any((w_cast == 0) & (w64 != 0)))
        return Folded(w_cast, b64.astype(dtype), overflow, underflow)


def _scale_weight(w: np.ndarray, scale: np.ndarray, group: int, transpose: bool) -> np.ndarray:
    """Multiply each output channel's slice of a Conv/ConvTranspose weight by its scale (dtype kept)."""
    c_out = scale.shape[0]
    if not transpose:
        if w.shape[0] != c_out:
            raise ValueError(f"Conv weight has {w.shape[0]} output channels, BN has {c_out}")
        return w * scale.reshape((-1,) + (1,) * (w.ndim - 1))
    c_in, per_group = w.shape[0], w.shape[1]
    if group < 1 or per_group * group != c_out or c_in % group:
        raise ValueError(f"ConvTranspose weight {w.shape} with group={group} does not give {c_out} channels")
    # (group, C_in/group, C_out/group, *k): scale axis 2 by the slice of `scale` for that group
    wg = w.reshape((group, c_in // group, per_group) + w.shape[2:])
    sg = scale.reshape(group, 1, per_group, *([1] * (w.ndim - 2)))
    return (wg * sg).reshape(w.shape)


def fold_affine(weight, bias, scale, shift, *, group: int = 1, transpose: bool = False) -> Folded:
    """Fold a per-output-channel affine map `scale · y + shift` after a Conv (or ConvTranspose) into its weight
    and bias: W' = scale·W, b' = scale·b + shift (`bias` may be None). Weights are laid out as in `fold_conv_bn`."""
    w = np.asarray(weight)
    scale, shift = np.asarray(scale, dtype=np.float64), np.asarray(shift, dtype=np.float64)
    b64 = np.zeros(scale.shape[0]) if bias is None else np.asarray(bias, dtype=np.float64)
    w_new = _scale_weight(w.astype(np.float64), scale, group, transpose)
    return _cast_back(w_new, scale * b64 + shift, w.dtype)


def fold_conv_bn(weight, bias, gamma, beta, mean, var, eps: float = 1e-5, *, group: int = 1,
                 transpose: bool = False) -> Folded:
    """Fold an inference-mode BN into the preceding Conv (or ConvTranspose) weight and bias.

    Conv weight is (C_out, C_in/group, *k): output channels are axis 0, whatever `group` is.
    ConvTranspose weight is (C_in, C_out/group, *k): output channel `g*C_out/group + j` lives at
    axis 1 index j of the rows belonging to group g.
    `bias` may be None (a Conv without bias).
    """
    w = np.asarray(weight)
    scale, _ = bn_scale_shift(gamma, beta, mean, var, eps)
    b64 = np.zeros(scale.shape[0]) if bias is None else np.asarray(bias, dtype=np.float64)
    w_new = _scale_weight(w.astype(np.float64), scale, group, transpose)
    b_new = scale * (b64 - np.asarray(mean, dtype=np.float64)) + np.asarray(beta, dtype=np.float64)
    return _cast_back(w_new, b_new, w.dtype)


def fold_matmul_bn(weight, bias, gamma, beta, mean, var, eps: float = 1e-5) -> Folded:
    """Fold BN over the last axis into `y = x @ W + b` (W is (K, N); BN channels are N)."""
    w = np.asarray(weight)
    scale, shift = bn_scale_shift(gamma, beta, mean, var, eps)
    b64 = np.zeros(w.shape[-1]) if bias is None else np.asarray(bias, dtype=np.float64)
    w_new = w.astype(np.float64) * scale
    b_new = scale * (b64 - np.asarray(mean, dtype=np.float64)) + np.asarray(beta, dtype=np.float64)
    return _cast_back(w_new, b_new, w.dtype)


def fold_linear_affine(weight, bias, scale, shift, *, trans_b: bool = False) -> Folded:
    """Fold a per-column affine map `scale · y + shift` after `y = x @ W + b` into W and b: W' = W·diag(scale),
    b' = scale·b + shift (`bias` may be None). W is (K, N), or (N, K) as Gemm's B with transB=1."""
    w = np.asarray(weight)
    scale, shift = np.asarray(scale, dtype=np.float64), np.asarray(shift, dtype=np.float64)
    b64 = np.zeros(scale.shape[0]) if bias is None else np.asarray(bias, dtype=np.float64)
    w64 = w.astype(np.float64)
    w_new = w64 * scale[:, None] if trans_b else w64 * scale
    return _cast_back(w_new, scale * b64 + shift, w.dtype)


def fold_gemm_bn(weight, bias, gamma, beta, mean, var, eps: float = 1e-5, *, trans_b: bool = False) -> Folded:
    """Fold BN into Gemm(A, B, C) with B (K, N), or (N, K) when transB=1."""
    w = np.asarray(weight)
    if trans_b:
        f = fold_matmul_bn(w.T, bias, gamma, beta, mean, var, eps)
        return Folded(np.ascontiguousarray(f.weight.T), f.bias, f.overflow)
    return fold_matmul_bn(w, bias, gamma, beta, mean, var, eps)


# --------------------------------------------------------------------------------------------------
# numpy references: the unfused computation, written to be read
# --------------------------------------------------------------------------------------------------

def _conv_attrs(spatial: int, strides, pads, dilations):
    strides = tuple(strides) if strides is not None else (1,) * spatial
    dilations = tuple(dilations) if dilations is not None else (1,) * spatial
    pads = tuple(pads) if pads is not None else (0,) * (2 * spatial)
    if len(strides) != spatial or len(dilations) != spatial or len(pads) != 2 * spatial:
        raise ValueError(f"{spatial}-D conv needs {spatial} strides/dilations and {2 * spatial} pads")
    return strides, pads, dilations


def conv_nd(x, w, b=None, strides=None, pads=None, dilations=None, group: int = 1) -> np.ndarray:
    """ONNX Conv in numpy, for 1-D/2-D/3-D: sum over kernel offsets of a strided input slice times a weight tap.

    x: (N, C_in, *spatial); w: (C_out, C_in/group, *k); pads in ONNX order (begins..., ends...).
    For each kernel offset `o`, output position `p` reads input position `p*stride + o*dilation`
    (after zero padding), so the convolution is a sum of prod(k) small matrix products.
    """
    x, w = np.asarray(x), np.asarray(w)
    nd = x.ndim - 2
    strides, pads, dilations = _conv_attrs(nd, strides, pads, dilations)
    n, c_in = x.shape[:2]
    c_out, cg = w.shape[:2]
    if c_in != cg * group or c_out % group:
        raise ValueError(f"input has {c_in} channels, weight {w.shape} with group={group} expects {cg * group}")
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[nd + i]) for i in range(nd)])
    k = w.shape[2:]
    out = [(xp.shape[2 + i] - dilations[i] * (k[i] - 1) - 1) // strides[i] + 1 for i in range(nd)]
    if min(out) < 1:
        raise ValueError("kernel larger than the padded input")
    xg = xp.reshape((n, group, cg) + xp.shape[2:])               # (N, G, C_in/G, *padded)
    wg = w.reshape((group, c_out // group, cg) + k)              # (G, C_out/G, C_in/G, *k)
    y = np.zeros((n, group, c_out // group, *out), dtype=np.result_type(x, w))
    for offset in itertools.product(*(range(kk) for kk in k)):
        window = tuple(slice(o * d, o * d + s * (m - 1) + 1, s)
                       for o, d, s, m in zip(offset, dilations, strides, out))
        patch = xg[(Ellipsis,) + window]                         # (N, G, C_in/G, *out)
        tap = wg[(Ellipsis,) + offset]                           # (G, C_out/G, C_in/G)
        y += np.einsum("ngc...,goc->ngo...", patch, tap)
    y = y.reshape((n, c_out, *out))
    if b is not None:
        y = y + np.asarray(b).reshape((-1,) + (1,) * nd)
    return y


def conv_transpose_nd(x, w, b=None, strides=None, pads=None, dilations=None, group: int = 1,
                      output_padding=None) -> np.ndarray:
    """ONNX ConvTranspose in numpy: every input position scatters `x · w` onto the output (the adjoint of conv_nd).

    x: (N, C_in, *spatial); w: (C_in, C_out/group, *k). Input position `p` with kernel offset `o`
    lands on output position `p*stride + o*dilation`; `pads` then crop the full result and
    `output_padding` adds zeros (plus bias) at the end.
    """
    x, w = np.asarray(x), np.asarray(w)
    nd = x.ndim - 2
    strides, pads, dilations = _conv_attrs(nd, strides, pads, dilations)
    output_padding = tuple(output_padding) if output_padding is not None else (0,) * nd
    n, c_in = x.shape[:2]
    if w.shape[0] != c_in or c_in % group:
        raise ValueError(f"input has {c_in} channels, ConvTranspose weight {w.shape} with group={group} disagrees")
    og, k, size = w.shape[1], w.shape[2:], x.shape[2:]
    full = [s * (m - 1) + d * (kk - 1) + 1 + op
            for s, m, d, kk, op in zip(strides, size, dilations, k, output_padding)]
    xg = x.reshape((n, group, c_in // group) + size)             # (N, G, C_in/G, *in)
    wg = w.reshape((group, c_in // group, og) + k)               # (G, C_in/G, C_out/G, *k)
    y = np.zeros((n, group, og, *full), dtype=np.result_type(x, w))
    for offset in itertools.product(*(range(kk) for kk in k)):
        window = tuple(slice(o * d, o * d + s * (m - 1) + 1, s)
                       for o, d, s, m in zip(offset, dilations, strides, size))
        y[(Ellipsis,) + window] += np.einsum("ngc...,gco->ngo...", xg, wg[(Ellipsis,) + offset])
    crop = tuple(slice(pads[i], full[i] - pads[nd + i]) for i in range(nd))
    y = y.reshape((n, group * og, *full))[(Ellipsis,) + crop]
    if b is not None:
        y = y + np.asarray(b).reshape((-1,) + (1,) * nd)
    return y


def batch_norm(y, gamma, beta, mean, var, eps: float = 1e-5, axis: int = 1) -> np.ndarray:
    """Inference-mode BatchNormalization in the seed's steps: (y − μ) ÷ √(σ² + ε) × γ + β, per channel on `axis`."""
    y = np.asarray(y)
    shape = [1] * y.ndim
    shape[axis] = -1

    def per_channel(a):
        return np.asarray(a).reshape(shape)

    centred = y - per_channel(mean)                             # step: subtract the running mean
    normed = centred / np.sqrt(per_channel(var) + eps)          # step: divide by the running std
    return normed * per_channel(gamma) + per_channel(beta)      # steps: scale by γ, shift by β


# --------------------------------------------------------------------------------------------------
# folding in fp16
# --------------------------------------------------------------------------------------------------

_FP16_MAX = float(np.finfo(np.float16).max)
_FP16_TINY = float(np.finfo(np.float16).tiny)  # smallest normal fp16, 6.1e-5


@dataclass
class Fp16FoldReport:
    """What folding an fp16 model's BN costs: overflow, and fp16-arithmetic vs fp64-then-cast error."""

    overflow: bool               # some folded value exceeds 65504: fp64-then-cast gives ±inf
    overflow_fp16_arith: bool    # folding in fp16 arithmetic produced inf/NaN somewhere
    max_rel_err_fp16: float      # max elementwise |fold in fp16 − truth| / |truth|
    max_rel_err_cast: float      # max elementwise |fold in fp64, cast − truth| / |truth|
    n_values: int                # folded weights + biases
    n_overflow: int              # values beyond the fp16 range
    n_subnormal: int             # nonzero values below the smallest normal fp16 (precision lost)
    n_differ: int                # values where fp16 arithmetic and fp64-then-cast disagree

    def summary(self) -> str:
        """One line per figure, fixed formatting (fit for notebook output)."""
        return "\n".join([
            f"values folded          {self.n_values}",
            f"overflow (> 65504)     {self.overflow} ({self.n_overflow} values)",
            f"fp16 arithmetic inf    {self.overflow_fp16_arith}",
            f"subnormal in fp16      {self.n_subnormal}",
            f"max rel err fp16 fold  {self.max_rel_err_fp16:.2e}",
            f"max rel err fp64->fp16 {self.max_rel_err_cast:.2e}",
            f"values that differ     {self.n_differ}",
        ])


def _rel_err(approx: np.ndarray, truth: np.ndarray) -> float:
    """Max elementwise relative error over values that are finite in fp64 and normal in fp16 range."""
    a = approx.astype(np.float64)
    mask = np.isfinite(truth) & (np.abs(truth) >= _FP16_TINY) & (np.abs(truth) <= _FP16_MAX)
    if not mask.any():
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a[mask] - truth[mask]) / np.abs(truth[mask])
    return float(np.nanmax(np.where(np.isfinite(err), err, np.inf)))


def fold_fp16_report(weight, bias, gamma, beta, mean, var, eps: float = 1e-5, *, group: int = 1,
                     transpose: bool = False) -> Fp16FoldReport:
    """Fold BN into an fp16 Conv both ways (fp16 arithmetic; fp64 then cast) and compare to fp64 truth.

    All parameters are first rounded to fp16 (that is what an fp16 model stores); the truth is the
    fold of those fp16 values computed in float64.
    """
    w16, g16, be16, m16, v16 = (np.asarray(a, dtype=np.float16) for a in (weight, gamma, beta, mean, var))
    b16 = np.zeros(g16.shape, np.float16) if bias is None else np.asarray(bias, dtype=np.float16)
    truth_scale, _ = bn_scale_shift(g16, be16, m16, v16, eps)
    w_true = _scale_weight(w16.astype(np.float64), truth_scale, group, transpose)
    b_true = truth_scale * (b16.astype(np.float64) - m16) + be16
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        s16 = g16 / np.sqrt(v16 + np.float16(eps))               # every operation rounds to fp16
        w_h = _scale_weight(w16, s16, group, transpose)
        b_h = (b16 - m16) * s16 + be16
        w_c, b_c = w_true.astype(np.float16), b_true.astype(np.float16)
    truth = np.concatenate([w_true.ravel(), b_true.ravel()])
    half = np.concatenate([w_h.ravel(), b_h.ravel()])
    cast = np.concatenate([w_c.ravel(), b_c.ravel()])
    big = np.abs(truth) > _FP16_MAX
    return Fp16FoldReport(
        overflow=bool(big.any()),
        overflow_fp16_arith=bool(not np.all(np.isfinite(half))),
        max_rel_err_fp16=_rel_err(half, truth),
        max_rel_err_cast=_rel_err(cast, truth),
        n_values=int(truth.size),
        n_overflow=int(big.sum()),
        n_subnormal=int(((truth != 0) & (np.abs(truth) < _FP16_TINY)).sum()),
        n_differ=int((half.astype(np.float64) != cast.astype(np.float64)).sum()
                     - (np.isnan(half) & np.isnan(cast)).sum()),
    )


# --------------------------------------------------------------------------------------------------
# counting the work: what "5 steps become one conv" saves
# --------------------------------------------------------------------------------------------------

@dataclass
class Work:
    """FLOPs, bytes moved and kernels launched by one way of computing a layer."""

    label: str
    flops: int
    bytes_moved: int          # every kernel's reads + writes (activations and parameters)
    intermediate_bytes: int   # of which: tensors written by one kernel only to be read by the next
    launches: int


def conv_bn_work(batch: int, c_in: int, c_out: int, in_size, kernel, *, strides=None, pads=None,
                 dilations=None, group: int = 1, conv_bias: bool = False, dtype_bytes: int = 4) -> list[Work]:
    """Work of Conv→BN computed three ways: the seed's 5 steps, Conv + one BN kernel, and the folded Conv.

    The seed's steps: (1) conv, (2) − μ, (3) ÷ √(σ²+ε), (4) × γ, (5) + β; each elementwise step reads
    and writes the whole conv output. One BN kernel does y·s + t in one pass. Folded: a conv with bias.
    """
    in_size, kernel = tuple(in_size), tuple(kernel)
    nd = len(in_size)
    strides, pads, dilations = _conv_attrs(nd, strides, pads, dilations)
    out = [(in_size[i] + pads[i] + pads[nd + i] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1
           for i in range(nd)]
    m = batch * c_out * int(np.prod(out))                      # conv output elements
    x_elems = batch * c_in * int(np.prod(in_size))
    w_elems = c_out * (c_in // group) * int(np.prod(kernel))
    macs = m * (c_in // group) * int(np.prod(kernel))
    conv_flops = 2 * macs
    b = dtype_bytes

    def conv(with_bias: bool) -> tuple[int, int]:
        return conv_flops + (m if with_bias else 0), b * (x_elems + w_elems + (c_out if with_bias else 0) + m)

    # the seed's five steps
    f0, by0 = conv(conv_bias)
    step = b * (m + c_out + m)                                  # read y and a per-channel vector, write y
    seed = Work("conv + 4 elementwise BN steps (seed)",
                f0 + 4 * m + 2 * c_out,                         # + sqrt(var + eps) on C values
                by0 + 4 * step + b * 2 * c_out, 2 * 4 * b * m, 5)
    # onnxruntime-style BatchNormalization kernel: y*s + t in one pass
    one = Work("conv + one BatchNormalization kernel", f0 + 2 * m + 4 * c_out,
               by0 + b * (m + 4 * c_out + m), 2 * b * m, 2)
    f1, by1 = conv(True)
    folded = Work("folded conv (bias added in the conv)", f1, by1, 0, 1)
    return [seed, one, folded]


def work_table(works: list[Work]) -> str:
    """Fixed-width table of `Work` rows with ratios against the first row."""
    base = works[0]
    lines = [f"{'computation':<40} {'MFLOP':>9} {'MB moved':>9} {'MB interm.':>10} {'launches':>8}"
             f" {'FLOP ratio':>10} {'bytes ratio':>11}"]
    for w in works:
        lines.append(f"{w.label:<40} {w.flops / 1e6:>9.2f} {w.bytes_moved / 1e6:>9.2f} "
                     f"{w.intermediate_bytes / 1e6:>10.2f} {w.launches:>8d} {w.flops / base.flops:>10.3f} "
                     f"{w.bytes_moved / base.bytes_moved:>11.3f}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# horizontal fusion: one wide op instead of several siblings
# --------------------------------------------------------------------------------------------------

def _biases(biases, sizes, dtype):
    if biases is None or all(bb is None for bb in biases):
        return None
    if len(biases) != len(sizes):
        raise ValueError(f"{len(sizes)} weights but {len(biases)} biases")
    out = []
    for bb, n in zip(biases, sizes):
        if bb is None:
            out.append(np.zeros(n, dtype))
            continue
        bb = np.asarray(bb)
        if bb.size not in (1, n):
            raise ValueError(f"bias of shape {bb.shape} does not broadcast to {n} output channels")
        out.append(np.broadcast_to(bb.reshape(-1), (n,)).astype(dtype))
    return np.concatenate(out)


def concat_conv_weights(weights, biases=None):
    """Stack sibling Conv weights along output channels: (W_cat, b_cat or None, split sizes).

    Why it is exact: output channel o of Conv(x, W, b) is  Σ_{c,k} W[o,c,k]·x[c, p+k] + b[o],  which
    reads only row o of W and b[o]. The rows of W_cat are the rows of W_1, W_2, … in order, so the
    channels of Conv(x, W_cat, b_cat) are those of Conv(x, W_1, b_1), Conv(x, W_2, b_2), … in
    order, and Split(axis=1, sizes) hands each consumer its own. This needs the same input x and
    the same strides/pads/dilations/kernel for all siblings, and group=1 (with group > 1 output
    channels are tied to input-channel groups, so stacking would re-partition the groups). A
    missing bias is a zero bias; the result has no bias only when none of the siblings had one.
    """
    ws = [np.asarray(w) for w in weights]
    if not ws:
        raise ValueError("no weights to concatenate")
    if any(w.shape[1:] != ws[0].shape[1:] for w in ws):
        raise ValueError(f"sibling Conv weights differ beyond the output axis: {[w.shape for w in ws]}")
    sizes = [int(w.shape[0]) for w in ws]
    return np.concatenate(ws, axis=0), _biases(biases, sizes, ws[0].dtype), sizes


def concat_matmul_weights(weights, biases=None, *, trans_b: bool = False):
    """Concatenate sibling MatMul/Gemm weights on the output axis: (W_cat, b_cat or None, split sizes).

    MatMul/Gemm W is (K, N): output column n reads only W[:, n] (and b[n]), so [x@W_1 | x@W_2] =
    x @ [W_1 | W_2] (concatenate on axis 1). Gemm with transB=1 stores W as (N, K): axis 0.
    All siblings must share the input x (and, for Gemm, alpha/beta/transA).
    """
    ws = [np.asarray(w) for w in weights]
    if not ws:
        raise ValueError("no weights to concatenate")
    if any(w.ndim != 2 for w in ws):
        raise ValueError(f"MatMul/Gemm weights must be 2-D, got {[w.shape for w in ws]}")
    axis, keep = (0, 1) if trans_b else (1, 0)
    if any(w.shape[keep] != ws[0].shape[keep] for w in ws):
        raise ValueError(f"sibling weights disagree on K: {[w.shape for w in ws]}")
    sizes = [int(w.shape[axis]) for w in ws]
    return np.concatenate(ws, axis=axis), _biases(biases, sizes, ws[0].dtype), sizes
