"""Post-training int8 quantization meets fusion: the QDQ arithmetic, onnxruntime's static quantizer, what its
optimiser fuses the QDQ pairs into, and where folding and quantization get in each other's way (notebooks 13
and 14).

A QDQ model keeps every operator in float and marks where tensors *would* be int8 with a pair
``QuantizeLinear`` → ``DequantizeLinear`` (q = saturate(round(x / scale) + zero_point), x' = (q - zero_point)
· scale). onnxruntime's optimiser (level EXTENDED and above) then fuses ``DQ → Conv → Q`` into one
``QLinearConv``, ``DQ → MatMul → Q`` into ``QLinearMatMul`` (``MatMulIntegerToFloat`` when no Q follows),
``DQ → Add → Q`` into ``QLinearAdd``, and so on: the integer kernels.

This module holds the pieces the notebook calls: the scale / zero-point arithmetic in numpy (`qparams`,
`quantize_array`, `dequantize_array`, `qlinear_matmul`, `requantize_add`), checked against onnxruntime's own
kernels (`run_qdq`, `run_qlinear_matmul`, `run_qlinear_add`); calibration data (`image_batches`,
`token_batches`, `FeedsReader`); `quantize` (onnxruntime's ``quantize_static`` in QDQ format, uint8 activations
and int8 weights, as its documentation recommends for x86); `preprocess` (its recommended pre-processing);
`optimized`, `op_counts`, `op_table` and `float_islands` (what onnxruntime turns a model into, and which
operators it leaves in float between int8 kernels); `accuracy` (against float32); `bn_spread_layer` (a Conv +
BatchNormalization whose channels differ in scale, as a trained layer's do), `bn_scales`, `channel_ranges`;
`fold_channel_scale` (folding a per-channel multiplier into quantized weights: exact per channel, re-rounded
per tensor); `add_scales` (the scales a residual Add meets) and `CANN_COUNTERPARTS` (the same picture on
Ascend, from the project's CANN notes).
"""

from __future__ import annotations

import logging
import tempfile
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

from ..build import make_model, tensor, value_info
from ..text import text_table
from ..verification import runtime

__all__ = [
    "QRANGE", "VNNI_MACS", "levels_off", "qparams", "quantize_array", "dequantize_array", "run_qdq", "qlinear_matmul",
    "run_qlinear_matmul", "requantize_add", "run_qlinear_add", "image_batches", "token_batches", "FeedsReader",
    "quantize", "optimized", "op_counts", "op_table", "float_islands", "preprocess", "Accuracy", "accuracy",
    "bn_spread_layer", "bn_scales", "channel_ranges", "weight_of", "fold_channel_scale", "add_scales", "cpu_flags",
    "CANN_COUNTERPARTS", "cann_table",
]

#: (qmin, qmax) of the two integer types onnxruntime's quantizer uses on CPU: activations uint8 (asymmetric,
#: with a zero point), weights int8 symmetric (zero point 0, -128 left out so that negating a weight is exact).
QRANGE = {"uint8": (0, 255), "int8": (-127, 127)}
_NP = {"uint8": np.uint8, "int8": np.int8}
_ONNX = {"uint8": onnx.TensorProto.UINT8, "int8": onnx.TensorProto.INT8}

#: multiply-adds one 512-bit instruction does: AVX-512 VNNI's vpdpbusd (64 u8 x s8 products summed into 16
#: int32 lanes) against an fp32 FMA (16 lanes). An ISA fact, not a measurement.
VNNI_MACS = {"int8 (vpdpbusd)": 64, "fp32 (vfmadd)": 16}


# --------------------------------------------------------------------------------------------------
# the arithmetic, in numpy, and the same through onnxruntime's kernels
# --------------------------------------------------------------------------------------------------

def qparams(lo: float, hi: float, dtype: str = "uint8", symmetric: bool = False) -> tuple[float, int]:
    """(scale, zero_point) that map [lo, hi] (widened to hold 0) onto `dtype`'s range, as onnxruntime's
    quantizer computes them: scale = (hi - lo) / (qmax - qmin), zero_point = round(qmin - lo / scale)."""
    qmin, qmax = QRANGE[dtype]
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if symmetric:
        m = max(abs(lo), abs(hi))
        lo, hi = -m, m
    scale = (hi - lo) / (qmax - qmin)
    if scale == 0:
        return 1.0, 0
    zp = round((qmax + qmin) / 2) if symmetric else int(np.round(qmin - lo / scale))
    return float(np.float32(scale)), int(np.clip(zp, qmin, qmax))


def quantize_array(x, scale, zero_point, dtype: str = "uint8", axis: int | None = None) -> np.ndarray:
    """QuantizeLinear: saturate(round_half_even(x / scale) + zero_point); per channel along `axis`."""
    x = np.asarray(x, np.float32)
    scale, zero_point = np.asarray(scale, np.float32), np.asarray(zero_point, np.int32)
    if axis is not None:
        shape = [1] * x.ndim
        shape[axis] = -1
        scale, zero_point = scale.reshape(shape), zero_point.reshape(shape)
    qmin, qmax = QRANGE[dtype] if dtype == "uint8" else (-128, 127)
    q = np.rint(x / scale) + zero_point
    return np.clip(q, qmin, qmax).astype(_NP[dtype])


def dequantize_array(q, scale, zero_point, axis: int | None = None) -> np.ndarray:
    """DequantizeLinear: (q - zero_point) * scale, in float32; per channel along `axis`."""
    q = np.asarray(q)
    scale, zero_point = np.asarray(scale, np.float32), np.asarray(zero_point, np.int32)
    if axis is not None:
        shape = [1] * q.ndim
        shape[axis] = -1
        scale, zero_point = scale.reshape(shape), zero_point.reshape(shape)
    return ((q.astype(np.int32) - zero_point) * scale).astype(np.float32)


def _qdq_model(scale: float, zero_point: int, dtype: str, n: int) -> onnx.ModelProto:
    inits = [tensor("s", np.float32(scale)), tensor("zp", np.array(zero_point, _NP[dtype]))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="Q"),
             helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], name="DQ")]
    q_out = helper.make_tensor_value_info("q", _ONNX[dtype], [n])
    return make_model(nodes, [value_info("x", np.float32, [n])], [q_out, value_info("y", np.float32, [n])],
                      inits, opset=13)


def run_qdq(x, scale: float, zero_point: int, dtype: str = "uint8") -> tuple[np.ndarray, np.ndarray]:
    """(q, x') from onnxruntime's own QuantizeLinear and DequantizeLinear kernels (optimisations off)."""
    x = np.asarray(x, np.float32).ravel()
    q, y = runtime.session(_qdq_model(scale, zero_point, dtype, x.size), "disable").run(["q", "y"], {"x": x})
    return q, y


def qlinear_matmul(qa, sa, za, qb, sb, sy, zy) -> tuple[np.ndarray, float, np.ndarray]:
    """What QLinearMatMul computes for uint8 `qa` (scale `sa`, zero point `za`) times int8 symmetric `qb`
    (scale `sb`): the integer products summed in int32, then one multiply by M = sa·sb / sy and a rounding
    onto the output's uint8 grid (`sy`, `zy`). Returns (int32 accumulator, M, uint8 output)."""
    acc = (np.asarray(qa, np.int32) - za) @ np.asarray(qb, np.int32)
    m = float(np.float32(sa) * np.float32(sb) / np.float32(sy))
    return acc, m, quantize_array(acc * np.float32(m), 1.0, zy, "uint8")


def run_qlinear_matmul(qa, sa, za, qb, sb, sy, zy) -> tuple[np.ndarray, list[str]]:
    """onnxruntime's answer: DQ(qa), DQ(qb) → MatMul → Q at level ALL; returns (uint8 output, the op types it
    ran, which show the pairs fused into one QLinearMatMul)."""
    qa, qb = np.asarray(qa, np.uint8), np.asarray(qb, np.int8)
    inits = [tensor("sa", np.float32(sa)), tensor("za", np.array(za, np.uint8)), tensor("qb", qb),
             tensor("sb", np.float32(sb)), tensor("zb", np.array(0, np.int8)), tensor("sy", np.float32(sy)),
             tensor("zy", np.array(zy, np.uint8))]
    nodes = [helper.make_node("DequantizeLinear", ["qa", "sa", "za"], ["a"], name="DQa"),
             helper.make_node("DequantizeLinear", ["qb", "sb", "zb"], ["b"], name="DQb"),
             helper.make_node("MatMul", ["a", "b"], ["y"], name="MatMul"),
             helper.make_node("QuantizeLinear", ["y", "sy", "zy"], ["qy"], name="Q")]
    u8 = onnx.TensorProto.UINT8
    model = make_model(nodes, [helper.make_tensor_value_info("qa", u8, list(qa.shape))],
                       [helper.make_tensor_value_info("qy", u8, [qa.shape[0], qb.shape[1]])], inits, opset=13)
    out = runtime.session(model, "all").run(["qy"], {"qa": qa})[0]
    return out, [n.op_type for n in optimized(model).graph.node]


def requantize_add(qa, sa, za, qb, sb, zb, sy, zy, dtype: str = "uint8") -> np.ndarray:
    """What QLinearAdd computes: both inputs back to real numbers, added, re-quantized to the output's scale.

    y = saturate(round((sa·(qa - za) + sb·(qb - zb)) / sy) + zy): two differently scaled int8 tensors cannot
    be added as integers; one multiply per input and a rounding are the requantisation."""
    real = dequantize_array(qa, sa, za) + dequantize_array(qb, sb, zb)
    return quantize_array(real, sy, zy, dtype)


def run_qlinear_add(qa, sa, za, qb, sb, zb, sy, zy) -> np.ndarray:
    """onnxruntime's answer for the same uint8 Add: DQ, DQ → Add → Q, fused by its optimiser into QLinearAdd."""
    qa, qb = np.asarray(qa, np.uint8).ravel(), np.asarray(qb, np.uint8).ravel()
    n = qa.size
    inits = [tensor(k, np.float32(v)) for k, v in (("sa", sa), ("sb", sb), ("sy", sy))]
    inits += [tensor(k, np.array(v, np.uint8)) for k, v in (("za", za), ("zb", zb), ("zy", zy))]
    nodes = [helper.make_node("DequantizeLinear", ["qa", "sa", "za"], ["a"], name="DQa"),
             helper.make_node("DequantizeLinear", ["qb", "sb", "zb"], ["b"], name="DQb"),
             helper.make_node("Add", ["a", "b"], ["s"], name="Add"),
             helper.make_node("QuantizeLinear", ["s", "sy", "zy"], ["y"], name="Q")]
    u8 = onnx.TensorProto.UINT8
    model = make_model(nodes, [helper.make_tensor_value_info("qa", u8, [n]), helper.make_tensor_value_info("qb", u8, [n])],
                       [helper.make_tensor_value_info("y", u8, [n])], inits, opset=13)
    sess = runtime.session(model, "all")
    return sess.run(["y"], {"qa": qa, "qb": qb})[0]


# --------------------------------------------------------------------------------------------------
# calibration data
# --------------------------------------------------------------------------------------------------

def image_batches(n: int, shape: Sequence[int], *, seed: int = 0, name: str = "input") -> list[dict]:
    """`n` feeds of smooth random images (`shape` NCHW): white noise blurred and rescaled to unit spread.

    Not real photographs: the point is a fixed, seeded stream with spatial structure, so that calibration and
    test inputs are different draws from the same distribution."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal(shape).astype(np.float32)
        for axis in (2, 3):  # a [1 2 1] blur along each spatial axis, twice
            for _ in range(2):
                x = (np.roll(x, 1, axis) + 2 * x + np.roll(x, -1, axis)) / 4
        x /= x.std()
        out.append({name: x.astype(np.float32)})
    return out


def token_batches(n: int, batch: int, seq: int, vocab: int, *, seed: int = 0) -> list[dict]:
    """`n` feeds of random token ids (and an all-ones attention mask) for the zoo's BERT."""
    rng = np.random.default_rng(seed)
    return [{"input_ids": rng.integers(0, vocab, (batch, seq)).astype(np.int64),
             "attention_mask": np.ones((batch, seq), np.int64)} for _ in range(n)]


class FeedsReader(CalibrationDataReader):
    """onnxruntime's calibration reader over a list of feeds: `get_next` hands them out one by one."""

    def __init__(self, feeds: Iterable[Mapping[str, np.ndarray]]):
        self.feeds = [dict(f) for f in feeds]
        self._it = iter(self.feeds)

    def get_next(self):
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = iter(self.feeds)


# --------------------------------------------------------------------------------------------------
# quantizing, and what onnxruntime makes of it
# --------------------------------------------------------------------------------------------------

@contextmanager
def _quiet_quantizer():
    # onnxruntime.quantization reports through the root logger: "Please consider to run pre-processing before
    # quantization" (its shape inference + optimiser pass; we fold BN ourselves and say so) and, for a
    # BatchNormalization quantized per channel, "Axis 1 is out-of-range for weight ... with rank 1" (a 1-D
    # BN parameter has only axis 0; the quantizer falls back to per tensor). Both would land in the notebook.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def quantize(model, calibration: Sequence[Mapping[str, np.ndarray]], *, per_channel: bool = False,
             op_types: Sequence[str] | None = None, extra_options: dict | None = None,
             reduce_range: bool = True) -> onnx.ModelProto:
    """`model` quantized by onnxruntime's own ``quantize_static``: QDQ format, uint8 activations (asymmetric),
    int8 weights (symmetric), MinMax calibration on `calibration` (a list of feeds), weights per channel or
    per tensor; `op_types` limits which operator types are quantized."""
    proto = onnx.load_model_from_string(runtime.model_bytes(model))
    with tempfile.TemporaryDirectory(prefix="fusionlab-quant-") as tmp, _quiet_quantizer():
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "qdq.onnx"
        src.write_bytes(proto.SerializeToString())
        quantize_static(str(src), str(dst), FeedsReader(calibration), quant_format=QuantFormat.QDQ,
                        per_channel=per_channel, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax, reduce_range=reduce_range,
                        op_types_to_quantize=list(op_types) if op_types else None,
                        extra_options=dict(extra_options or {}))
        return onnx.load_model_from_string(dst.read_bytes())


def optimized(model, level: str = "all") -> onnx.ModelProto:
    """The model onnxruntime runs after its graph optimisations at `level`
    (``SessionOptions.optimized_model_filepath``)."""
    with tempfile.TemporaryDirectory(prefix="fusionlab-opt-") as tmp:
        path = Path(tmp) / "optimized.onnx"
        runtime.session(model, level, optimized_path=path)
        return onnx.load_model_from_string(path.read_bytes())


def op_counts(model) -> Counter:
    """How many nodes of each op type (top-level graph)."""
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load_model_from_string(runtime.model_bytes(model))
    return Counter(n.op_type for n in proto.graph.node)


def op_table(columns: Mapping[str, Counter], ops: Sequence[str] | None = None) -> str:
    """Op counts side by side, one column per model (an empty cell for none), rows by first appearance."""
    if ops is None:
        ops = list(dict.fromkeys(op for c in columns.values() for op, _ in c.most_common()))
    rows = [[op] + [str(c[op]) if c[op] else "" for c in columns.values()] for op in ops]
    rows.append(["nodes"] + [str(sum(c.values())) for c in columns.values()])
    return "\n".join(text_table(["op type", *columns], rows))


def float_islands(model) -> Counter:
    """Op types of the nodes that read a DequantizeLinear's output, the QuantizeLinear of a requantisation aside:
    in a model onnxruntime has optimised, the operators left computing in float between int8 kernels."""
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load_model_from_string(runtime.model_bytes(model))
    dq_out = {n.output[0] for n in proto.graph.node if n.op_type == "DequantizeLinear"}
    return Counter(n.op_type for n in proto.graph.node
                   if n.op_type not in ("QuantizeLinear", "DequantizeLinear") and dq_out & set(n.input))


def preprocess(model) -> onnx.ModelProto:
    """onnxruntime's recommended step before quantizing (``quant_pre_process``: shape inference, then its
    optimiser at the BASIC level, which folds BatchNormalization into the Conv before it)."""
    proto = onnx.load_model_from_string(runtime.model_bytes(model))
    with tempfile.TemporaryDirectory(prefix="fusionlab-pre-") as tmp, _quiet_quantizer():
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "pre.onnx"
        src.write_bytes(proto.SerializeToString())
        quant_pre_process(str(src), str(dst))
        return onnx.load_model_from_string(dst.read_bytes())


@dataclass(frozen=True)
class Accuracy:
    """A quantized model against its float32 original on test inputs it was not calibrated on."""

    max_abs: float  # largest |int8 - fp32| over every output element
    rel: float  # ||int8 - fp32|| / ||fp32|| over all test inputs
    top1: float | None  # fraction of rows whose argmax agrees (classifiers), else None
    n: int  # test inputs (feeds)

    def row(self, digits: int = 3) -> list[str]:
        top1 = "" if self.top1 is None else f"{self.top1:.0%}"
        return [f"{self.max_abs:.{digits}f}", f"{self.rel:.{digits}f}", top1]


def accuracy(reference, quantized, feeds: Sequence[Mapping[str, np.ndarray]], *, classifier: bool = False,
             level: str = "all") -> Accuracy:
    """`quantized` (run at `level`, its integer kernels) against `reference` (float32, optimisations off)."""
    ref = runtime.session(reference, "disable")
    qs = runtime.session(quantized, level)
    name = ref.get_outputs()[0].name
    diffs, refs, agree, rows = [], [], 0, 0
    for f in feeds:
        r = ref.run([name], dict(f))[0].astype(np.float64)
        q = qs.run([name], dict(f))[0].astype(np.float64)
        diffs.append((q - r).ravel())
        refs.append(r.ravel())
        if classifier:
            agree += int((q.argmax(-1) == r.argmax(-1)).sum())
            rows += r.reshape(-1, r.shape[-1]).shape[0]
    d, r = np.concatenate(diffs), np.concatenate(refs)
    return Accuracy(float(np.abs(d).max()), float(np.linalg.norm(d) / np.linalg.norm(r)),
                    agree / rows if classifier else None, len(feeds))


# --------------------------------------------------------------------------------------------------
# BatchNormalization before quantization
# --------------------------------------------------------------------------------------------------

def bn_spread_layer(spread: float = 100.0, *, c_in: int = 8, c_mid: int = 32, c_out: int = 16, image_size: int = 16,
                    batch: int = 4, seed: int = 0) -> onnx.ModelProto:
    """Conv → BatchNormalization → Relu → Conv whose first conv's output channels differ in scale by up to
    `spread` (log-uniform), with BN statistics measured on `image_batches` data, as training leaves them: the
    BN normalises each channel back to unit spread, so its per-channel scale gamma / sqrt(var + eps) spans
    about `spread` too."""
    rng = np.random.default_rng(seed)
    gains = np.exp(rng.uniform(-0.5, 0.5, c_mid) * np.log(spread)).astype(np.float32)
    w1 = (rng.standard_normal((c_mid, c_in, 3, 3)) * np.sqrt(2 / (9 * c_in))).astype(np.float32)
    w1 *= gains[:, None, None, None]
    w2 = (rng.standard_normal((c_out, c_mid, 3, 3)) * np.sqrt(2 / (9 * c_mid))).astype(np.float32)
    # the running statistics a trained BN would hold: the conv's own per-channel mean and variance on data
    probe = make_model([helper.make_node("Conv", ["input", "w1"], ["y"], name="/conv1/Conv", pads=[1, 1, 1, 1])],
                       [value_info("input", np.float32, [batch, c_in, image_size, image_size])],
                       [value_info("y", np.float32, None)], [tensor("w1", w1)])
    sess = runtime.session(probe, "disable")
    ys = np.concatenate([sess.run(["y"], f)[0] for f in image_batches(4, (batch, c_in, image_size, image_size),
                                                                      seed=seed + 1000)])
    mean, var = ys.mean(axis=(0, 2, 3)), ys.var(axis=(0, 2, 3))
    gamma = rng.uniform(0.5, 1.5, c_mid).astype(np.float32)
    beta = (0.1 * rng.standard_normal(c_mid)).astype(np.float32)
    inits = [tensor("conv1.weight", w1), tensor("bn.weight", gamma), tensor("bn.bias", beta),
             tensor("bn.running_mean", mean.astype(np.float32)), tensor("bn.running_var", var.astype(np.float32)),
             tensor("conv2.weight", w2)]
    nodes = [helper.make_node("Conv", ["input", "conv1.weight"], ["c1"], name="/conv1/Conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "bn.weight", "bn.bias", "bn.running_mean",
                                                     "bn.running_var"], ["b"], name="/bn/BatchNormalization",
                              epsilon=1e-5),
             helper.make_node("Relu", ["b"], ["r"], name="/relu/Relu"),
             helper.make_node("Conv", ["r", "conv2.weight"], ["output"], name="/conv2/Conv", pads=[1, 1, 1, 1])]
    return make_model(nodes, [value_info("input", np.float32, [batch, c_in, image_size, image_size])],
                      [value_info("output", np.float32, [batch, c_out, image_size, image_size])], inits,
                      name="bn_spread_layer")


def _inits(model) -> dict[str, np.ndarray]:
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load_model_from_string(runtime.model_bytes(model))
    return {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}


def bn_scales(model) -> dict[str, np.ndarray]:
    """{BatchNormalization node: its per-channel multiplier gamma / sqrt(running_var + eps)}."""
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load_model_from_string(runtime.model_bytes(model))
    inits = _inits(proto)
    out = {}
    for n in proto.graph.node:
        if n.op_type == "BatchNormalization":
            eps = next((a.f for a in n.attribute if a.name == "epsilon"), 1e-5)
            out[n.name] = inits[n.input[1]] / np.sqrt(inits[n.input[4]] + eps)
    return out


def channel_ranges(weight: np.ndarray) -> np.ndarray:
    """max |w| of each output channel (axis 0): what a per-channel int8 scale is computed from."""
    return np.abs(weight.reshape(weight.shape[0], -1)).max(axis=1)


def weight_of(model, node_name: str) -> np.ndarray:
    """The float weight (input 1) of node `node_name`."""
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load_model_from_string(runtime.model_bytes(model))
    node = next(n for n in proto.graph.node if n.name == node_name)
    return _inits(proto)[node.input[1]]


# --------------------------------------------------------------------------------------------------
# where fusion meets the scales
# --------------------------------------------------------------------------------------------------

def fold_channel_scale(q: np.ndarray, scale, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fold a per-output-channel multiplier `s` into int8 weights `q` (symmetric, zero point 0) with `scale`.

    Per-channel `scale` (one per output channel): exact, the integers stay and scale_c becomes scale_c·|s_c|
    (a negative s_c negates channel c's integers, exact in [-127, 127]). Per-tensor `scale` (one number): one
    scale cannot hold a different factor per channel, so the folded weights are re-rounded onto a new grid.
    Returns (q', scale')."""
    q = np.asarray(q, np.int8)
    s = np.asarray(s, np.float32)
    scale = np.asarray(scale, np.float32)
    if int(q.min()) < -127:
        raise ValueError("-128 has no int8 negation: symmetric weights use [-127, 127]")
    sign = np.where(s < 0, -1, 1).astype(np.int8).reshape((-1,) + (1,) * (q.ndim - 1))
    if scale.size == s.size and scale.size > 1:
        return (q * sign).astype(np.int8), (scale * np.abs(s)).astype(np.float32)
    folded = dequantize_array(q, scale, 0) * s.reshape((-1,) + (1,) * (q.ndim - 1))
    new_scale, _ = qparams(folded.min(), folded.max(), "int8", symmetric=True)
    return quantize_array(folded, new_scale, 0, "int8"), np.asarray(new_scale, np.float32)


def _producers(proto: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in proto.graph.node for o in n.output}


def _qparams_of(proto: onnx.ModelProto, value: str, inits: dict, prod: dict) -> tuple[float, int] | None:
    """The (scale, zero point) of the DequantizeLinear producing `value`, or the QuantizeLinear consuming it."""
    n = prod.get(value)
    if n is not None and n.op_type == "DequantizeLinear":
        return float(inits[n.input[1]]), int(inits[n.input[2]]) if len(n.input) > 2 else 0
    for m in proto.graph.node:
        if m.op_type == "QuantizeLinear" and m.input[0] == value:
            return float(inits[m.input[1]]), int(inits[m.input[2]]) if len(m.input) > 2 else 0
    return None


def add_scales(qdq_model) -> list[dict]:
    """For every Add of a QDQ model: the (scale, zero point) of its two inputs and of its output."""
    proto = qdq_model if isinstance(qdq_model, onnx.ModelProto) else onnx.load_model_from_string(
        runtime.model_bytes(qdq_model))
    inits, prod = _inits(proto), _producers(proto)
    out = []
    for n in proto.graph.node:
        if n.op_type != "Add":
            continue
        a, b, y = (_qparams_of(proto, v, inits, prod) for v in (n.input[0], n.input[1], n.output[0]))
        if a and b and y:
            out.append({"node": n.name, "a": a, "b": b, "y": y})
    return out


def levels_off(weight_bits: int, *, trials: int = 8, seed: int = 0) -> int:
    """The most output levels onnxruntime's QLinearMatMul departs from the exact integer arithmetic
    (`qlinear_matmul`) over `trials` random uint8 activations times int8 weights of `weight_bits` bits
    (8: -127..127; 7: -64..64, what `quantize` writes). 0 on every x86 CPU for 7 bits; for 8 bits it depends on
    the CPU: without VNNI, AVX2's vpmaddubsw adds two uint8 x int8 products in int16 and saturates."""
    top = 127 if weight_bits == 8 else 2 ** (weight_bits - 1)
    worst = 0
    for t in range(trials):
        rng = np.random.default_rng(seed + t)
        qa = rng.integers(0, 256, (8, 64)).astype(np.uint8)
        qb = rng.integers(-top, top + 1, (64, 8)).astype(np.int8)
        _, _, exact = qlinear_matmul(qa, 0.013, 120, qb, 0.0071, 0.6, 128)
        ort, _ = run_qlinear_matmul(qa, 0.013, 120, qb, 0.0071, 0.6, 128)
        worst = max(worst, int(np.abs(ort.astype(np.int64) - exact.astype(np.int64)).max()))
    return worst


def cpu_flags(*names: str) -> dict[str, bool]:
    """Whether this CPU advertises each flag in /proc/cpuinfo (False where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    return {n: n in flags for n in names}


# --------------------------------------------------------------------------------------------------
# the same picture on Ascend (from ../shared/reference/cann_facts.md, section 8.A)
# --------------------------------------------------------------------------------------------------

#: (what this notebook does with onnxruntime, its counterpart in CANN's AMCT / ATC, cann_facts.md section)
CANN_COUNTERPARTS = (
    ("fold BN before quantize_static", "AMCT quantize_model folds Conv+BN itself (do_fusion, default true)", "8.A A4"),
    ("FeedsReader + MinMax calibration", "calibration forward passes, batch_num batches, ifmr by default", "8.A A1, A3"),
    ("weights per channel or per tensor", "ARQ weights, channel_wise true (per channel) or false", "8.A A3"),
    ("activations per tensor, uint8 + zero point", "activations per tensor only; activation_offset", "8.A A3"),
    ("the QDQ model, run in float", "the fake_quant model (runs on ONNX Runtime, FP32)", "8.A A1"),
    ("QuantizeLinear / DequantizeLinear", "AscendQuant (to int8) / AscendDequant (int32 to float)", "8.A A2"),
    ("QLinearConv (Q of its output inside)", "TbeConvDequantQuantFusionPass: Conv2D+Dequant+Quant", "8.A A5"),
    ("QLinearAdd after QLinearConv (2 kernels)", "TbeConvDequantVaddReluQuantFusionPass: one conv kernel", "8.A A5"),
    ("DQ -> Relu -> Q: the Q's clamp", "V200RequantFusionPass: Dequant+Relu+Quant -> AscendRequant", "8.A A5"),
    ("session level DISABLE/BASIC: no QLinear*", "fusion_switch.cfg: RequantFusionPass:off, ...", "8.A A5, 8.C C3"),
)


def cann_table() -> str:
    """`CANN_COUNTERPARTS` as text, two lines an entry (what we did here; its CANN counterpart and section)."""
    return "\n".join(f"{here}\n    CANN: {there}  [cann_facts.md {where}]" for here, there, where in CANN_COUNTERPARTS)
