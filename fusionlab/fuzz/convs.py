"""Generator patterns around Conv, ConvTranspose and pooling: the chains vertical fusion folds, and their near misses.

Each emitter takes the `Builder` and an NCHW tensor name and returns the tensor it ends in. A *near
miss* (`b.miss(...)`) is a variant that looks fusable but is not (or is only under a check a pass must
make): a non-zero pad, a pad on the channel axis, training-mode BN, a bias that is not per channel, an
overridable weight, a Clip bound that is a run-time input, ...
"""

from __future__ import annotations

import numpy as np

from .builder import Builder, Pattern, is_map

__all__ = ["conv_chain", "pool_chain", "activation", "channel_affine", "batchnorm", "conv_out", "pad", "conv_spec",
           "conv_apply", "PATTERNS"]


def conv_out(size: int, k: int, s: int, d: int, p0: int, p1: int) -> int:
    return (size + p0 + p1 - d * (k - 1) - 1) // s + 1


def pad(b: Builder, x: str, pads: list[int], value: float = 0.0, mode: str = "constant", *,
        axes: list[int] | None = None) -> str:
    """Pad in the form the opset wants (attributes before 11, inputs after; `axes` from 18)."""
    shape = b.shape(x)
    rank = len(shape)
    full = list(pads)
    if axes is not None:
        full = [0] * (2 * rank)
        k = len(axes)
        for j, a in enumerate(axes):
            full[a % rank], full[rank + a % rank] = pads[j], pads[k + j]
    out = tuple(d if full[i] == 0 and full[rank + i] == 0 else d + full[i] + full[rank + i]
                for i, d in enumerate(shape))
    attrs = {} if mode == "constant" and b.rng.random() < 0.5 else {"mode": mode}
    if b.opset < 11:
        attrs.update(pads=full)
        if value != 0.0 or b.rng.random() < 0.3:
            attrs["value"] = float(value)
        return b.node("Pad", [x], out, **attrs)
    ins = [x, b.ints(pads if axes is not None else full, "pads")]
    if value != 0.0 or (mode == "constant" and b.rng.random() < 0.4):
        ins.append(b.scalar(value, "padv") if b.rng.random() < 0.8 else b.const(np.array(value, b.dtype), "padv"))
    if axes is not None:
        ins += [""] * (3 - len(ins)) + [b.ints(axes, "axes")]
    return b.node("Pad", ins, out, **attrs)


def _spatial_pad(b: Builder, x: str, value: float, *, near_value: float | None = None) -> tuple[str, bool]:
    """A Pad before a conv or pool; returns (output, whether it is a deliberate near miss)."""
    rank = len(b.shape(x))
    sp = [b.rng.choice((0, 1, 1, 2)) for _ in range(2 * (rank - 2))]
    if not any(sp):
        sp[0] = 1
    nm = b.miss("pad")
    mode, v = "constant", value
    pads = [0, 0] + sp[: rank - 2] + [0, 0] + sp[rank - 2:]
    axes = None
    if nm:
        kind = b.rng.choice(("value", "mode", "channel", "negative"))
        b.tags.append(f"nm:pad_{kind}")
        if kind == "value":
            v = near_value if near_value is not None else b.rng.choice((0.5, -1.0, 1e-3))
        elif kind == "mode" and b.opset >= 11:
            mode = b.rng.choice(("reflect", "edge"))
            pads = [0, 0] + [1] * (rank - 2) + [0, 0] + [1] * (rank - 2)
        elif kind == "channel":
            pads[1] = 1
        elif kind == "negative" and b.opset >= 11:
            pads[2] = -1 if b.shape(x)[2] > 3 else 0
    if b.opset >= 18 and b.rng.random() < 0.3 and pads[1] == 0 and pads[rank + 1] == 0:
        axes = list(range(2, rank)) if b.rng.random() < 0.5 else list(range(-(rank - 2), 0))
        pads = pads[2:rank] + pads[rank + 2:]
    return pad(b, x, pads, v, mode, axes=axes), nm


def batchnorm(b: Builder, x: str) -> str:
    """BatchNormalization in the opset's form (spatial attr at 7, training_mode at 14+, stats dtype at 15+)."""
    shape = b.shape(x)
    c = int(shape[1])
    stats_dt = b.dtype
    if b.opset >= 15 and b.dtype == np.float16 and b.rng.random() < 0.25:
        stats_dt = np.dtype(np.float32)
        b.tags.append("bn15_mixed_dtype")
    var = b.rand((c,), 1.0, positive=True, dtype=stats_dt)
    if b.miss("bn_zero_var"):
        var[b.rng.randrange(c)] = 0.0
        b.tags.append("nm:bn_zero_var")
    nm_params = b.miss("bn_param")
    t1 = stats_dt if stats_dt != b.dtype and b.rng.random() < 0.5 else b.dtype
    ins = [x, b.param(b.rand((c,), 1.0).astype(t1), "gamma", near_miss=nm_params),
           b.param(b.rand((c,), 0.5).astype(t1), "beta"),
           b.param(b.rand((c,), 0.5).astype(stats_dt), "mean"), b.param(var, "var", near_miss=nm_params)]
    if nm_params:
        b.tags.append("nm:bn_param_not_const")
    attrs = {}
    if b.rng.random() < 0.5:
        attrs["epsilon"] = b.rng.choice((1e-5, 1e-3, 1e-6))
    if b.rng.random() < 0.3:
        attrs["momentum"] = 0.9
    if b.opset < 9 and b.rng.random() < 0.3:
        attrs["spatial"] = 1
    outs = 1
    if b.opset >= 14 and b.miss("bn_training"):
        attrs["training_mode"] = 1
        b.tags.append("nm:bn_training")
        outs = 3  # the checker insists on running mean and var outputs in training mode
    elif b.opset >= 14 and b.rng.random() < 0.2:
        attrs["training_mode"] = 0
    if outs == 1:
        return b.node("BatchNormalization", ins, shape, **attrs)
    y, m, v = b.node("BatchNormalization", ins, [shape, (c,), (c,)], n_out=3, **attrs)
    b.extra_outputs.append(b.rng.choice((m, v)))
    return y


def channel_affine(b: Builder, x: str) -> str:
    """A per-channel constant Mul/Add/Sub/Div (or a near miss that is not per channel)."""
    shape = b.shape(x)
    c, rank = int(shape[1]), len(shape)
    op = b.rng.choice(("Mul", "Add", "Add", "Sub", "Div"))
    cshape = b.rng.choice(((c,) + (1,) * (rank - 2), (1, c) + (1,) * (rank - 2), (), (1,)))
    swap = None
    if b.miss("affine"):
        kind = b.rng.choice(("rank_up", "not_per_channel", "runtime", "swap_sub"))
        b.tags.append(f"nm:affine_{kind}")
        if kind == "rank_up":
            cshape = (1, 1, c) + (1,) * (rank - 2)
        elif kind == "not_per_channel":
            cshape = (c,) + tuple(shape[2:3]) + (1,) * (rank - 3) if isinstance(shape[2], int) else (1, 1) + (1,) * (rank - 2)
        elif kind == "runtime":
            k = b.input(cshape, "scale")
            return b.binary(op, x, k)
        else:
            op, swap = "Sub", True
    val = b.rand(cshape, 1.0)
    if op == "Div":
        val = (np.abs(val) + 0.5).astype(b.dtype)
    k = b.const(val, op.lower() + "_k", form="constant" if b.rng.random() < 0.15 else "init")
    return b.binary(op, x, k, swap=swap)


def _clip(b: Builder, x: str) -> str:
    lo, hi = sorted((round(b.rng.uniform(-1, 0.5), 2), round(b.rng.uniform(0.5, 6), 2)))
    if b.opset < 11:
        attrs = {}
        if b.rng.random() < 0.8:
            attrs["min"] = lo
        if b.rng.random() < 0.8:
            attrs["max"] = hi
        return b.unary("Clip", x, **attrs)
    form = b.rng.choice(("both", "min", "max", "none"))
    ins = [x, b.const(np.array(lo, b.dtype), "lo") if form in ("both", "min") else "",
           b.const(np.array(hi, b.dtype), "hi") if form in ("both", "max") else ""]
    if b.miss("clip_runtime"):
        ins[2] = b.input((), "hi_in")
        b.tags.append("nm:clip_runtime_bound")
    while ins and ins[-1] == "":
        ins.pop()
    return b.node("Clip", ins, b.shape(x))


def activation(b: Builder, x: str, *, family: str = "conv") -> str:
    """One activation (FusedConv's, FusedGemm's, or SiLU as x*sigmoid(x)); near misses included."""
    ops = ["Relu", "LeakyRelu", "Clip", "HardSigmoid", "Sigmoid", "Tanh", "SiLU"]
    if family == "gemm":
        ops += ["Elu", "Selu", "Softsign", "Softplus", "ThresholdedRelu"]
    if b.opset >= 14:
        ops.append("HardSwish")
    op = b.rng.choice(ops)
    if op == "Clip":
        return _clip(b, x)
    if op == "SiLU":
        s = b.unary("Sigmoid", x)
        other = x
        if b.miss("silu_other"):
            other = b.unary("Relu", x)
            b.tags.append("nm:silu_other_operand")
        b.mark_inner(s)
        return b.binary("Mul", other, s)
    attrs = {}
    if op in ("LeakyRelu", "Elu", "ThresholdedRelu") and b.rng.random() < 0.7:
        attrs["alpha"] = b.rng.choice((0.01, 0.1, 0.2, 1.0, 0.5))
    if op == "HardSigmoid" and b.rng.random() < 0.7:
        attrs.update(alpha=b.rng.choice((0.2, 1 / 6)), beta=0.5)
    if op == "Selu" and b.rng.random() < 0.3:
        attrs.update(alpha=1.6, gamma=1.05)
    return b.unary(op, x, **attrs)


def conv_spec(b: Builder, x: str, transpose: bool) -> dict:
    """Random Conv/ConvTranspose attributes for input `x` (kernel, pads, strides, dilations, group, bias)."""
    n, c, hgt, wid = b.shape(x)
    c = int(c)
    spec: dict = {"transpose": transpose, "group": 1, "cout": b.rng.choice((2, 3, 4, 6, 8))}
    if not transpose and b.rng.random() < 0.15:
        spec["group"] = c
        spec["cout"] = c * b.rng.choice((1, 2))
    k = b.rng.choice((1, 3, 3)) if not transpose else b.rng.choice((1, 2, 3))
    kh, kw = (k, k) if b.rng.random() < 0.85 else (k, 1)
    s = 2 if b.rng.random() < 0.12 else 1
    d = 2 if not transpose and b.rng.random() < 0.06 and min(hgt, wid) >= 6 else 1
    spec.update(kh=kh, kw=kw, s=s, d=d, bias=b.rng.random() < 0.7, explicit_kernel=b.rng.random() < 0.8)
    pads = [kh // 2, kw // 2, kh // 2, kw // 2]
    if transpose:
        pads = [b.rng.choice((0, 1)) if kh > 1 else 0, 0, 0, 0]
    elif b.rng.random() < 0.2:
        pads = [b.rng.choice((0, 1)) for _ in range(4)]
    spec["pads"] = pads
    spec["auto_pad"] = b.rng.choice(("SAME_UPPER", "SAME_LOWER", "VALID")) if not transpose and b.rng.random() < 0.07 else None
    spec["write_pads"] = any(pads) or b.rng.random() < 0.5
    spec["write_strides"] = s != 1 or b.rng.random() < 0.3
    spec["write_group"] = spec["group"] != 1 or b.rng.random() < 0.1
    spec["output_padding"] = [1, 1] if transpose and s == 2 and b.rng.random() < 0.3 else [0, 0]
    return spec


def conv_apply(b: Builder, x: str, spec: dict, cout: int | None = None) -> str:
    """A Conv/ConvTranspose node on `x` as `spec` says (`cout` overrides its output channels)."""
    n, c, hgt, wid = b.shape(x)
    c = int(c)
    transpose, group, kh, kw, s, d, pads = (spec[k] for k in ("transpose", "group", "kh", "kw", "s", "d", "pads"))
    cout = cout or spec["cout"]
    if group != 1:
        cout = spec["cout"]
    attrs: dict = {}
    if spec["explicit_kernel"]:
        attrs["kernel_shape"] = [kh, kw]
    auto = spec["auto_pad"]
    if auto:
        attrs["auto_pad"] = auto
    elif spec["write_pads"]:
        attrs["pads"] = pads
    if spec["write_strides"]:
        attrs["strides"] = [s, s]
    if d != 1:
        attrs["dilations"] = [d, d]
    if spec["write_group"]:
        attrs["group"] = group
    if transpose:
        wshape = (c, cout, kh, kw)
        outp = spec["output_padding"]
        if any(outp):
            attrs["output_padding"] = outp
        oh = s * (hgt - 1) + outp[0] + kh - pads[0] - pads[2]
        ow = s * (wid - 1) + outp[1] + kw - pads[1] - pads[3]
    else:
        wshape = (cout, c // group, kh, kw)
        if auto and auto != "VALID":
            oh, ow = -(-hgt // s), -(-wid // s)
        elif auto:
            oh, ow = conv_out(hgt, kh, s, d, 0, 0), conv_out(wid, kw, s, d, 0, 0)
        else:
            oh, ow = conv_out(hgt, kh, s, d, pads[0], pads[2]), conv_out(wid, kw, s, d, pads[1], pads[3])
    if oh < 1 or ow < 1:
        raise ValueError("conv output would be empty")
    op = "ConvTranspose" if transpose else "Conv"
    w = b.weight(wshape, "W", op, near_miss=b.miss("conv_weight"))
    ins = [x, w]
    if spec["bias"]:
        ins.append(b.weight((cout,), "B", op + "_bias", scale=0.3, near_miss=b.miss("conv_bias")))
    return b.node(op, ins, (n, cout, oh, ow), **attrs)


def _conv_node(b: Builder, x: str, transpose: bool) -> str:
    return conv_apply(b, x, conv_spec(b, x, transpose))


def conv_chain(b: Builder, x: str, pool: list[str]) -> str:
    """[Pad] -> Conv/ConvTranspose -> [BN] -> [per-channel affine]* -> [activation] -> [residual Add]."""
    transpose = b.dtype != np.float64 and b.rng.random() < 0.15
    if not transpose and b.rng.random() < 0.25:
        x, _ = _spatial_pad(b, x, 0.0)
        b.mark_inner(x)
        b.tags.append("pad_conv")
    y = _conv_node(b, x, transpose)
    b.tags.append("convtranspose" if transpose else "conv")
    if b.rng.random() < 0.55:
        b.mark_inner(y)
        y = batchnorm(b, y)
        b.tags.append("bn")
    for _ in range(b.rng.choice((0, 0, 1, 1, 2))):
        b.mark_inner(y)
        y = channel_affine(b, y)
        b.tags.append("affine")
    if b.rng.random() < 0.6:
        b.mark_inner(y)
        y = activation(b, y)
        b.tags.append("act")
    if b.rng.random() < 0.35:
        same = [t for t in pool if b.shape(t) == b.shape(y) and t != y]
        if same:
            b.mark_inner(y)
            y = b.binary("Add", y, b.rng.choice(same))
            b.tags.append("residual")
            if b.rng.random() < 0.7:
                y = activation(b, y)
    return y


def pool_chain(b: Builder, x: str, pool: list[str]) -> str:
    """Pad -> AveragePool / MaxPool (the pad_pool rule), with count_include_pad, ceil_mode, -inf pads."""
    use_max = b.dtype == np.float64 or b.rng.random() < 0.5
    value = -np.inf if use_max and b.rng.random() < 0.75 else 0.0
    p, nm = _spatial_pad(b, x, value, near_value=0.0 if use_max and value != 0.0 else None)
    b.mark_inner(p)
    n, c, hgt, wid = b.shape(p)
    k = b.rng.choice((2, 3))
    s = b.rng.choice((1, 1, 2))
    attrs: dict = {"kernel_shape": [k, k]}
    if s != 1 or b.rng.random() < 0.3:
        attrs["strides"] = [s, s]
    own = [0, 0, 0, 0]
    if b.rng.random() < 0.25:
        own = [b.rng.choice((0, 1)) for _ in range(4)]
        own = [min(v, k - 1) for v in own]
        attrs["pads"] = own
    ceil = b.opset >= 10 and b.miss("pool_ceil")
    if ceil:
        attrs["ceil_mode"] = 1
    d = 1
    if use_max and b.opset >= 10 and b.rng.random() < 0.1:
        d = 2
        attrs["dilations"] = [2, 2]
    if not use_max:
        cip = b.rng.choice((0, 1, 1)) if b.rng.random() < 0.8 else None
        if cip is not None:
            attrs["count_include_pad"] = cip
    eff = d * (k - 1) + 1

    def out(size, p0, p1):
        num = size + p0 + p1 - eff
        o = (-(-num // s) if ceil else num // s) + 1
        if ceil and (o - 1) * s >= size + p0:
            o -= 1
        return o

    oh, ow = out(hgt, own[0], own[2]), out(wid, own[1], own[3])
    if oh < 1 or ow < 1:
        raise ValueError("pool output would be empty")
    op = "MaxPool" if use_max else "AveragePool"
    b.tags.append("pad_" + op.lower())
    if use_max and b.miss("maxpool_indices"):
        y, idx = b.node(op, [p], [(n, c, oh, ow), (n, c, oh, ow)], n_out=2, **attrs)
        b.types[idx] = np.dtype(np.int64)
        b.extra_outputs.append(idx)
        b.tags.append("nm:maxpool_indices")
        return y
    return b.node(op, [p], (n, c, oh, ow), **attrs)


PATTERNS = (
    Pattern(conv_chain, lambda b, x: 5.0 if is_map(b, x) and b.dtype != np.float64 else 0.0),
    Pattern(pool_chain, lambda b, x: 1.5 if is_map(b, x) else 0.0),
)
