"""A model zoo of real architectures with deterministic random weights, exported the way exporters do.

Every builder writes plain ONNX shaped like a ``torch.onnx`` export of the real network:
BatchNormalization kept as its own node after a bias-free Conv, node names such as
``/layer1/layer1.0/conv1/Conv``, initializers such as ``layer1.0.conv1.weight``, scalar constants as
``Constant`` nodes, SiLU as ``Sigmoid`` + ``Mul``, GELU in its ``Erf`` form, LayerNorm decomposed into
ReduceMean/Sub/Pow/... and ReLU6 as ``Clip`` with min/max inputs.  Weights come from
``numpy.random.default_rng(seed)`` with He (conv) / LeCun (linear) scaling and realistic BatchNorm
statistics, so activations stay O(1) through deep nets.  The same parameters give byte-identical models.

``get(name, **params)`` and ``path(name, **params)`` build on demand and cache the ``.onnx`` file under
``$FUSIONLAB_CACHE`` (or ``<repo>/.cache/models``), keyed by a hash of the full parameter set and of
this file, so an edited builder never serves a stale model.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import onnx
from onnx import helper

from .build import make_model, tensor, value_info
from .files import atomic_write
from .graph import onnx_opset
from .verification.runtime import model_bytes

__all__ = [
    "MODELS", "get", "path", "build", "cache_dir", "summary", "extract", "conv_bn_relu", "tanh_gelu", "resnet50", "resnet18",
    "resnet_small", "yolov5s", "bert", "inception", "mobilenet_v2",
]

#: Part of every cache key (with a hash of this file's source, so an edited builder never reuses stale files).
ZOO_VERSION = 1
#: Opsets the builders can write (IR 10, pinned by `make_model`, covers up to opset 21).
MIN_ZOO_OPSET, MAX_ZOO_OPSET = 13, 21

# --------------------------------------------------------------------------------------------------
# the exporter-like graph writer
# --------------------------------------------------------------------------------------------------

class _Net:
    """Accumulates nodes and initializers with torch.onnx-style names."""

    def __init__(self, seed: int, opset: int, identity_weights: bool = False):
        if not MIN_ZOO_OPSET <= opset <= MAX_ZOO_OPSET:
            raise ValueError(f"opset {opset} not supported by the zoo (use {MIN_ZOO_OPSET}..{MAX_ZOO_OPSET})")
        self.rng = np.random.default_rng(seed)
        self.opset = opset
        self.identity_weights = identity_weights
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._init_names: set[str] = set()
        self._node_names: set[str] = set()

    # -- naming --------------------------------------------------------------------------------------
    def _unique(self, scope: str, op: str) -> str:
        base = f"{scope}/{op}"
        name, i = base, 0
        while name in self._node_names:
            i += 1
            name = f"{base}_{i}"
        self._node_names.add(name)
        return name

    def node(self, op: str, inputs: Sequence[str], scope: str = "", *, outputs: int = 1,
             **attrs) -> str | list[str]:
        """Add a node named ``{scope}/{op}`` (made unique); returns its output name(s)."""
        name = self._unique(scope, op)
        outs = [f"{name}_output_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=name, **attrs))
        return outs[0] if outputs == 1 else outs

    def const(self, scope: str, value, dtype=np.float32) -> str:
        """A ``Constant`` node holding `value` (scalars stay 0-d)."""
        arr = np.asarray(value, dtype=dtype)
        name = self._unique(scope, "Constant")
        out = f"{name}_output_0"
        self.nodes.append(helper.make_node("Constant", [], [out], name=name, value=tensor("", arr)))
        return out

    def param(self, name: str, array: np.ndarray) -> str:
        if name in self._init_names:
            raise ValueError(f"duplicate initializer {name!r}")
        self._init_names.add(name)
        self.inits.append(tensor(name, array))
        return name

    def weight(self, name: str, array: np.ndarray, scope: str) -> str:
        """A weight initializer, routed through an ``Identity`` node when ``identity_weights``."""
        p = self.param(name, array)
        return self.node("Identity", [p], scope) if self.identity_weights else p

    # -- random tensors ------------------------------------------------------------------------------
    def normal(self, shape, std: float) -> np.ndarray:
        return (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    def uniform(self, shape, lo: float, hi: float) -> np.ndarray:
        return self.rng.uniform(lo, hi, size=shape).astype(np.float32)

    # -- layers --------------------------------------------------------------------------------------
    def conv(self, x: str, scope: str, pname: str, cin: int, cout: int, k, stride=1, pad=None, group: int = 1,
             bias: bool = False, gain: float = 2.0) -> str:
        """Conv with He-scaled weight ``{pname}.weight`` (and ``{pname}.bias``)."""
        kh, kw = (k, k) if isinstance(k, int) else k
        sh, sw = (stride, stride) if isinstance(stride, int) else stride
        if pad is None:
            pad = (kh // 2, kw // 2)
        ph, pw = (pad, pad) if isinstance(pad, int) else pad
        fan_in = (cin // group) * kh * kw
        w = self.weight(f"{pname}.weight", self.normal((cout, cin // group, kh, kw), math.sqrt(gain / fan_in)), scope)
        inputs = [x, w]
        if bias:
            inputs.append(self.weight(f"{pname}.bias", self.normal((cout,), 0.1), scope))
        return self.node("Conv", inputs, scope, dilations=[1, 1], group=group, kernel_shape=[kh, kw],
                         pads=[ph, pw, ph, pw], strides=[sh, sw])

    def bn(self, x: str, scope: str, pname: str, c: int, eps: float = 1e-5, momentum: float = 0.9) -> str:
        """BatchNormalization (5 inputs, inference form) with realistic running statistics."""
        gamma = self.param(f"{pname}.weight", self.uniform((c,), 0.5, 1.5))
        beta = self.param(f"{pname}.bias", self.normal((c,), 0.1))
        mean = self.param(f"{pname}.running_mean", self.normal((c,), 0.1))
        var = self.param(f"{pname}.running_var", self.uniform((c,), 0.5, 1.5))
        return self.node("BatchNormalization", [x, gamma, beta, mean, var], scope, epsilon=eps, momentum=momentum)

    def relu6(self, x: str, scope: str) -> str:
        lo = self.const(scope, 0.0)
        hi = self.const(scope, 6.0)
        return self.node("Clip", [x, lo, hi], scope)

    def silu(self, x: str, scope: str) -> str:
        s = self.node("Sigmoid", [x], scope)
        return self.node("Mul", [x, s], scope)

    def gemm(self, x: str, scope: str, pname: str, cin: int, cout: int) -> str:
        w = self.param(f"{pname}.weight", self.normal((cout, cin), 1.0 / math.sqrt(cin)))
        b = self.param(f"{pname}.bias", self.normal((cout,), 0.1))
        return self.node("Gemm", [x, w, b], scope, alpha=1.0, beta=1.0, transB=1)

    def reduce_mean(self, x: str, scope: str, axes: list[int], keepdims: int = 1) -> str:
        if self.opset >= 18:
            return self.node("ReduceMean", [x, self.const(scope, axes, np.int64)], scope, keepdims=keepdims)
        return self.node("ReduceMean", [x], scope, axes=axes, keepdims=keepdims)

    def unsqueeze(self, x: str, scope: str, axes: list[int]) -> str:
        return self.node("Unsqueeze", [x, self.const(scope, axes, np.int64)], scope)

    def rename_output(self, old: str, new: str) -> str:
        """Make the node producing `old` write `new` instead (graph outputs get friendly names)."""
        for n in self.nodes:
            for i, o in enumerate(n.output):
                if o == old:
                    n.output[i] = new
            for i, v in enumerate(n.input):
                if v == old:
                    n.input[i] = new
        return new

    def model(self, inputs, outputs, name: str) -> onnx.ModelProto:
        return make_model(self.nodes, inputs, outputs, self.inits, opset=self.opset, name=name)


def _make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    """torchvision/YOLOv5 channel rounding: nearest multiple of `divisor`, never below 90% of `v`."""
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


def _image_input(batch, image_size: int, channels: int = 3) -> onnx.ValueInfoProto:
    return value_info("input", np.float32, [batch, channels, image_size, image_size])


# --------------------------------------------------------------------------------------------------
# single layer
# --------------------------------------------------------------------------------------------------

def conv_bn_relu(in_ch: int = 3, out_ch: int = 16, k: int = 3, stride: int = 1, *, image_size: int = 32,
                 seed: int = 0, batch: int | str = "batch", identity_weights: bool = False, eps: float = 1e-5,
                 opset: int = 17) -> onnx.ModelProto:
    """A single Conv → BatchNormalization → Relu layer (nodes ``/conv/Conv``, ``/bn/...``, ``/relu/Relu``)."""
    net = _Net(seed, opset, identity_weights)
    x = net.conv("input", "/conv", "conv", in_ch, out_ch, k, stride)
    x = net.bn(x, "/bn", "bn", out_ch, eps)
    x = net.rename_output(net.node("Relu", [x], "/relu"), "output")
    out = (image_size + 2 * (k // 2) - k) // stride + 1
    return net.model([_image_input(batch, image_size, in_ch)],
                     [value_info("output", np.float32, [batch, out_ch, out, out])], "conv_bn_relu")


def offset_layernorm(n: int = 64, *, offset: float = 100.0, spread: float = 0.1, rows: int = 4,
                     dtype=np.float16, seed: int = 0, opset: int = 18) -> onnx.ModelProto:
    """``x * spread + offset``, then a LayerNorm written out as exporters write it, then Relu.

    Rows far from zero mean with a small spread: the written-out graph subtracts the mean before it squares, so
    it keeps its accuracy; a kernel that takes the variance as E[x²] - E[x]² in one pass loses it. A model on
    which onnxruntime's LayerNormFusion changes the outputs (notebook 17 walks `fusionlab blame` through it).
    """
    rng = np.random.default_rng(seed)
    inits = [tensor("spread", np.array(spread, dtype)), tensor("offset", np.array(offset, dtype)),
             tensor("axes", np.array([-1], np.int64)), tensor("two", np.array(2.0, dtype)),
             tensor("eps", np.array(1e-5, dtype)),
             tensor("gamma", (1 + 0.1 * rng.standard_normal(n)).astype(dtype)),
             tensor("beta", (0.1 * rng.standard_normal(n)).astype(dtype))]
    nodes = [helper.make_node("Mul", ["x", "spread"], ["xs"], name="spread"),
             helper.make_node("Add", ["xs", "offset"], ["xo"], name="offset"),
             helper.make_node("ReduceMean", ["xo", "axes"], ["m"], name="mean"),
             helper.make_node("Sub", ["xo", "m"], ["d"], name="sub"),
             helper.make_node("Pow", ["d", "two"], ["sq"], name="pow"),
             helper.make_node("ReduceMean", ["sq", "axes"], ["var"], name="var"),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="add_eps"),
             helper.make_node("Sqrt", ["ve"], ["std"], name="sqrt"),
             helper.make_node("Div", ["d", "std"], ["nrm"], name="div"),
             helper.make_node("Mul", ["nrm", "gamma"], ["sc"], name="scale"),
             helper.make_node("Add", ["sc", "beta"], ["y"], name="shift"),
             helper.make_node("Relu", ["y"], ["z"], name="relu")]
    return make_model(nodes, [value_info("x", dtype, [rows, n])], [value_info("z", dtype, [rows, n])], inits,
                      opset=opset)


def tanh_gelu(form: str = "pow", x: str = "x", out: str = "y", k: float = 0.044715):
    """A decomposed tanh-GELU, 0.5·x·(1 + tanh(√(2/π)·(x + k·x³))), in one of the ways exporters write it.

    Returns (nodes, initializers) to put in a model. `form`: "pow" (torch's GPT-2 ``gelu_new``, x³ as
    Pow), "ort" (onnxruntime's test models, x·(x·k) + 1), "div" (x/2, x³ as x·x·x), "sub" (1 + t
    written as 2 - (1 - t)). `k` other than 0.044715 gives a function that is *not* GELU (for tests).
    """
    a = math.sqrt(2 / math.pi)
    inits = [tensor(name, np.float32(v)) for name, v in (("k3", k), ("a", a), ("one", 1.0), ("half", 0.5),
                                                          ("three", 3.0), ("two", 2.0), ("ak", a * k))]
    n = helper.make_node
    if form == "ort":  # x * (x * 0.044715) + 1, times x * sqrt(2/pi)
        nodes = [n("Mul", [x, "k3"], ["m1"]), n("Mul", [x, "m1"], ["m2"]), n("Add", ["m2", "one"], ["a1"]),
                 n("Mul", [x, "a"], ["m3"]), n("Mul", ["m3", "a1"], ["m4"]), n("Tanh", ["m4"], ["t"]),
                 n("Add", ["t", "one"], ["a2"]), n("Mul", [x, "half"], ["m5"]), n("Mul", ["m5", "a2"], [out])]
    elif form == "pow":  # (x + 0.044715 * x^3) * sqrt(2/pi), x^3 as Pow
        nodes = [n("Pow", [x, "three"], ["p"]), n("Mul", ["p", "k3"], ["m1"]), n("Add", [x, "m1"], ["a1"]),
                 n("Mul", ["a1", "a"], ["m2"]), n("Tanh", ["m2"], ["t"]), n("Add", ["one", "t"], ["a2"]),
                 n("Mul", [x, "a2"], ["m3"]), n("Mul", ["m3", "half"], [out])]
    elif form == "div":  # x / 2 * (1 + tanh(a x + a k x^3)), cube as x * x * x
        nodes = [n("Mul", [x, x], ["sq"]), n("Mul", ["sq", x], ["cube"]), n("Mul", ["cube", "ak"], ["m1"]),
                 n("Mul", [x, "a"], ["m2"]), n("Add", ["m2", "m1"], ["a1"]), n("Tanh", ["a1"], ["t"]),
                 n("Add", ["t", "one"], ["a2"]), n("Div", [x, "two"], ["d"]), n("Mul", ["d", "a2"], [out])]
    elif form == "sub":  # 0.5x * (1 - (-tanh(...)))  (a Sub on the outer chain)
        nodes = [n("Mul", [x, x], ["sq"]), n("Mul", ["sq", "k3"], ["m1"]), n("Add", ["m1", "one"], ["a1"]),
                 n("Mul", ["a1", x], ["m2"]), n("Mul", ["m2", "a"], ["m3"]), n("Tanh", ["m3"], ["t"]),
                 n("Sub", ["one", "t"], ["s1"]), n("Sub", ["two", "s1"], ["s2"]),  # 2 - (1 - t) = 1 + t
                 n("Mul", ["half", x], ["m5"]), n("Mul", ["s2", "m5"], [out])]
    else:
        raise ValueError(form)
    for i, node in enumerate(nodes):
        node.name = f"g{i}_{node.op_type}"
    return nodes, inits


# --------------------------------------------------------------------------------------------------
# ResNet (torchvision v1.5: stride in the 3x3 conv of the bottleneck)
# --------------------------------------------------------------------------------------------------

def _resnet(block: str, layers: Sequence[int], image_size: int, width: int, num_classes: int, seed: int,
            batch, identity_weights: bool, opset: int, name: str) -> onnx.ModelProto:
    net = _Net(seed, opset, identity_weights)
    expansion = 4 if block == "bottleneck" else 1
    x = net.conv("input", "/conv1", "conv1", 3, width, 7, 2, 3)
    x = net.bn(x, "/bn1", "bn1", width)
    x = net.node("Relu", [x], "/relu")
    x = net.node("MaxPool", [x], "/maxpool", ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3],
                 pads=[1, 1, 1, 1], strides=[2, 2])
    inplanes = width
    # Scaling that keeps activations O(1) with fixed (not data-matched) BatchNorm statistics: He gain 2
    # for a conv followed by ReLU, gain 1 for one that is not (the downsample and the branch's last conv
    # feed an Add), and the branch damped to 1/4 of that so the residual sum grows ~1.25x per block and
    # the ReLU after a downsample Add halves it back (the idea of torchvision's zero_init_residual).
    branch_gain = 0.25
    for li, blocks in enumerate(layers):
        planes = width * 2 ** li
        for bi in range(blocks):
            stride = 2 if (li > 0 and bi == 0) else 1
            p = f"layer{li + 1}.{bi}"
            s = f"/layer{li + 1}/layer{li + 1}.{bi}"
            identity = x
            if block == "bottleneck":
                y = net.conv(x, f"{s}/conv1", f"{p}.conv1", inplanes, planes, 1, 1, 0)
                y = net.node("Relu", [net.bn(y, f"{s}/bn1", f"{p}.bn1", planes)], f"{s}/relu")
                y = net.conv(y, f"{s}/conv2", f"{p}.conv2", planes, planes, 3, stride, 1)
                y = net.node("Relu", [net.bn(y, f"{s}/bn2", f"{p}.bn2", planes)], f"{s}/relu_1")
                y = net.conv(y, f"{s}/conv3", f"{p}.conv3", planes, planes * 4, 1, 1, 0, gain=branch_gain)
                y = net.bn(y, f"{s}/bn3", f"{p}.bn3", planes * 4)
                last_relu = f"{s}/relu_2"
            else:
                y = net.conv(x, f"{s}/conv1", f"{p}.conv1", inplanes, planes, 3, stride, 1)
                y = net.node("Relu", [net.bn(y, f"{s}/bn1", f"{p}.bn1", planes)], f"{s}/relu")
                y = net.conv(y, f"{s}/conv2", f"{p}.conv2", planes, planes, 3, 1, 1, gain=branch_gain)
                y = net.bn(y, f"{s}/bn2", f"{p}.bn2", planes)
                last_relu = f"{s}/relu_1"
            if stride != 1 or inplanes != planes * expansion:
                identity = net.conv(x, f"{s}/downsample/downsample.0", f"{p}.downsample.0", inplanes,
                                    planes * expansion, 1, stride, 0, gain=1.0)
                identity = net.bn(identity, f"{s}/downsample/downsample.1", f"{p}.downsample.1", planes * expansion)
            x = net.node("Relu", [net.node("Add", [y, identity], s)], last_relu)
            inplanes = planes * expansion
    x = net.node("GlobalAveragePool", [x], "/avgpool")
    x = net.node("Flatten", [x], "", axis=1)
    x = net.rename_output(net.gemm(x, "/fc", "fc", inplanes, num_classes), "logits")
    return net.model([_image_input(batch, image_size)], [value_info("logits", np.float32, [batch, num_classes])],
                     name)


def resnet50(image_size: int = 224, width: int = 64, num_classes: int = 1000, seed: int = 0,
             batch: int | str = "batch", *, layers: Sequence[int] = (3, 4, 6, 3), identity_weights: bool = False,
             opset: int = 17) -> onnx.ModelProto:
    """ResNet-50 v1.5 (bottleneck blocks [3,4,6,3]); `width` is the stem/first-stage width (64)."""
    return _resnet("bottleneck", layers, image_size, width, num_classes, seed, batch, identity_weights, opset,
                   "resnet50")


def resnet18(image_size: int = 224, width: int = 64, num_classes: int = 1000, seed: int = 0,
             batch: int | str = "batch", *, layers: Sequence[int] = (2, 2, 2, 2), identity_weights: bool = False,
             opset: int = 17) -> onnx.ModelProto:
    """ResNet-18 (basic blocks [2,2,2,2])."""
    return _resnet("basic", layers, image_size, width, num_classes, seed, batch, identity_weights, opset, "resnet18")


def resnet_small(image_size: int = 64, width: int = 16, num_classes: int = 10, seed: int = 0,
                 batch: int | str = "batch", *, layers: Sequence[int] = (2, 2, 2, 2), identity_weights: bool = False,
                 opset: int = 17) -> onnx.ModelProto:
    """ResNet-18 topology at a small width and image size (fast tests and demos)."""
    return _resnet("basic", layers, image_size, width, num_classes, seed, batch, identity_weights, opset,
                   "resnet_small")


# --------------------------------------------------------------------------------------------------
# YOLOv5 (v6.x yaml: 6x6 stem conv, C3, SPPF, PANet neck, Detect)
# --------------------------------------------------------------------------------------------------

def yolov5s(image_size: int = 640, width_mult: float = 0.50, depth_mult: float = 0.33, seed: int = 0,
            batch: int | str = "batch", *, num_classes: int = 80, identity_weights: bool = False, eps: float = 1e-3,
            opset: int = 17) -> onnx.ModelProto:
    """YOLOv5 (s by default; width_mult=0.25 gives n): backbone, SPPF, PANet neck, three detect convs."""
    if image_size % 32:
        raise ValueError(f"yolov5 image_size must be a multiple of 32, got {image_size}")
    net = _Net(seed, opset, identity_weights)
    momentum = 0.97  # YOLOv5's BatchNorm2d(eps=0.001, momentum=0.03); torch.onnx writes 1 - momentum

    def ch(c: int) -> int:
        return _make_divisible(c * width_mult, 8)

    def depth(n: int) -> int:
        return max(round(n * depth_mult), 1)

    def conv(x, p, s, c1, c2, k=1, stride=1, pad=None, gain=2.0):
        y = net.conv(x, f"{s}/conv", f"{p}.conv", c1, c2, k, stride, pad, gain=gain)
        y = net.bn(y, f"{s}/bn", f"{p}.bn", c2, eps, momentum)
        return net.silu(y, f"{s}/act")

    def c3(x, i, c1, c2, n, shortcut=True):
        p, s = f"model.{i}", f"/model.{i}"
        c_ = c2 // 2
        a = conv(x, f"{p}.cv1", f"{s}/cv1", c1, c_)
        for j in range(n):
            bp, bs = f"{p}.m.{j}", f"{s}/m/m.{j}"
            y = conv(a, f"{bp}.cv1", f"{bs}/cv1", c_, c_, 1)
            # a residual branch is damped (see _resnet) so chains of bottlenecks stay O(1)
            y = conv(y, f"{bp}.cv2", f"{bs}/cv2", c_, c_, 3, gain=0.5 if shortcut else 2.0)
            a = net.node("Add", [a, y], bs) if shortcut else y
        b = conv(x, f"{p}.cv2", f"{s}/cv2", c1, c_)
        y = net.node("Concat", [a, b], s, axis=1)
        return conv(y, f"{p}.cv3", f"{s}/cv3", 2 * c_, c2)

    def sppf(x, i, c1, c2, k=5):
        p, s = f"model.{i}", f"/model.{i}"
        c_ = c1 // 2
        x = conv(x, f"{p}.cv1", f"{s}/cv1", c1, c_)
        ys = [x]
        for j in range(3):
            ys.append(net.node("MaxPool", [ys[-1]], f"{s}/m" + (f"_{j}" if j else ""), ceil_mode=0,
                               dilations=[1, 1], kernel_shape=[k, k], pads=[k // 2] * 4, strides=[1, 1]))
        y = net.node("Concat", ys, s, axis=1)
        return conv(y, f"{p}.cv2", f"{s}/cv2", 4 * c_, c2, gain=0.5)  # max-pooled inputs are larger

    def upsample(x, i):
        scales = net.const(f"/model.{i}", [1.0, 1.0, 2.0, 2.0])
        return net.node("Resize", [x, "", scales], f"/model.{i}", coordinate_transformation_mode="asymmetric",
                        cubic_coeff_a=-0.75, mode="nearest", nearest_mode="floor")

    c = [ch(v) for v in (64, 128, 256, 512, 1024)]
    x0 = conv("input", "model.0", "/model.0", 3, c[0], 6, 2, 2)            # P1/2
    x1 = conv(x0, "model.1", "/model.1", c[0], c[1], 3, 2)                 # P2/4
    x2 = c3(x1, 2, c[1], c[1], depth(3))
    x3 = conv(x2, "model.3", "/model.3", c[1], c[2], 3, 2)                 # P3/8
    x4 = c3(x3, 4, c[2], c[2], depth(6))
    x5 = conv(x4, "model.5", "/model.5", c[2], c[3], 3, 2)                 # P4/16
    x6 = c3(x5, 6, c[3], c[3], depth(9))
    x7 = conv(x6, "model.7", "/model.7", c[3], c[4], 3, 2)                 # P5/32
    x8 = c3(x7, 8, c[4], c[4], depth(3))
    x9 = sppf(x8, 9, c[4], c[4])
    x10 = conv(x9, "model.10", "/model.10", c[4], c[3], 1, 1)
    x12 = net.node("Concat", [upsample(x10, 11), x6], "/model.12", axis=1)
    x13 = c3(x12, 13, 2 * c[3], c[3], depth(3), shortcut=False)
    x14 = conv(x13, "model.14", "/model.14", c[3], c[2], 1, 1)
    x16 = net.node("Concat", [upsample(x14, 15), x4], "/model.16", axis=1)
    x17 = c3(x16, 17, 2 * c[2], c[2], depth(3), shortcut=False)           # P3/8 out
    x18 = conv(x17, "model.18", "/model.18", c[2], c[2], 3, 2)
    x19 = net.node("Concat", [x18, x14], "/model.19", axis=1)
    x20 = c3(x19, 20, 2 * c[2], c[3], depth(3), shortcut=False)           # P4/16 out
    x21 = conv(x20, "model.21", "/model.21", c[3], c[3], 3, 2)
    x22 = net.node("Concat", [x21, x10], "/model.22", axis=1)
    x23 = c3(x22, 23, 2 * c[3], c[4], depth(3), shortcut=False)           # P5/32 out
    no = 3 * (num_classes + 5)
    outputs = []
    for j, (feat, cin, stride) in enumerate(((x17, c[2], 8), (x20, c[3], 16), (x23, c[4], 32))):
        y = net.conv(feat, f"/model.24/m.{j}", f"model.24.m.{j}", cin, no, 1, 1, 0, bias=True, gain=1.0)
        name = f"p{3 + j}"
        net.rename_output(y, name)
        outputs.append(value_info(name, np.float32, [batch, no, image_size // stride, image_size // stride]))
    return net.model([_image_input(batch, image_size)], outputs, "yolov5")


# --------------------------------------------------------------------------------------------------
# BERT (HuggingFace BertModel as exported by torch.onnx, opset 13+)
# --------------------------------------------------------------------------------------------------

def bert(layers: int = 12, hidden: int = 768, heads: int = 12, intermediate: int = 3072, vocab: int = 30522,
         max_position: int = 512, seq: int | str = "sequence", seed: int = 0, decomposed_layernorm: bool = True,
         *, batch: int | str = "batch", type_vocab: int = 2, eps: float = 1e-12, opset: int = 17) -> onnx.ModelProto:
    """BERT encoder (base by default): Gather embeddings, LayerNorm, self-attention, Erf-GELU FFN."""
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
    if not decomposed_layernorm and opset < 17:
        raise ValueError("LayerNormalization needs opset >= 17; use decomposed_layernorm=True")
    net = _Net(seed, opset)
    head_dim = hidden // heads

    def linear(x, p, s, cin, cout):
        w = net.param(f"onnx::MatMul_{p}", net.normal((cin, cout), 1.0 / math.sqrt(cin)))
        b = net.param(f"{p}.bias", net.normal((cout,), 0.02))
        y = net.node("MatMul", [x, w], s)
        return net.node("Add", [b, y], s)  # torch.onnx writes Add(bias, MatMul) for nn.Linear

    def layer_norm(x, p, s):
        gamma = net.param(f"{p}.weight", (1.0 + net.normal((hidden,), 0.1)).astype(np.float32))
        beta = net.param(f"{p}.bias", net.normal((hidden,), 0.1))
        if not decomposed_layernorm:
            return net.node("LayerNormalization", [x, gamma, beta], s, axis=-1, epsilon=eps)
        mean = net.reduce_mean(x, s, [-1])
        d = net.node("Sub", [x, mean], s)
        sq = net.node("Pow", [d, net.const(s, 2.0)], s)
        var = net.reduce_mean(sq, s, [-1])
        std = net.node("Sqrt", [net.node("Add", [var, net.const(s, eps)], s)], s)
        y = net.node("Div", [d, std], s)
        return net.node("Add", [net.node("Mul", [y, gamma], s), beta], s)

    # embeddings: word + position (buffered ids sliced to the sequence length) + token type (buffered zeros)
    e = "/embeddings"
    word = net.param("embeddings.word_embeddings.weight", net.normal((vocab, hidden), 1.0))
    pos_table = net.param("embeddings.position_embeddings.weight", net.normal((max_position, hidden), 1.0))
    type_table = net.param("embeddings.token_type_embeddings.weight", net.normal((type_vocab, hidden), 1.0))
    pos_ids = net.param("embeddings.position_ids", np.arange(max_position, dtype=np.int64)[None, :])
    type_ids = net.param("embeddings.token_type_ids", np.zeros((1, max_position), dtype=np.int64))
    seq_len = net.node("Gather", [net.node("Shape", ["input_ids"], ""), net.const("", 1, np.int64)], "", axis=0)
    seq_end = net.unsqueeze(seq_len, "", [0])
    zero, one = net.const(e, [0], np.int64), net.const(e, [1], np.int64)
    type_slice = net.node("Slice", [type_ids, zero, seq_end, one, one], e)
    pos_slice = net.node("Slice", [pos_ids, zero, seq_end, one, one], e)
    x = net.node("Gather", [word, "input_ids"], f"{e}/word_embeddings")
    x = net.node("Add", [x, net.node("Gather", [type_table, type_slice], f"{e}/token_type_embeddings")], e)
    x = net.node("Add", [x, net.node("Gather", [pos_table, pos_slice], f"{e}/position_embeddings")], e)
    x = layer_norm(x, "embeddings.LayerNorm", f"{e}/LayerNorm")

    # extended attention mask: (1 - mask[:, None, None, :]) * -10000
    m = net.unsqueeze(net.unsqueeze("attention_mask", "", [1]), "", [2])
    m = net.node("Cast", [m], "", to=onnx.TensorProto.FLOAT)
    m = net.node("Sub", [net.const("", 1.0), m], "")
    mask_bias = net.node("Mul", [m, net.const("", -10000.0)], "")

    for i in range(layers):
        p, s = f"encoder.layer.{i}", f"/encoder/layer.{i}"
        a, ap = f"{s}/attention/self", f"{p}.attention.self"
        q = linear(x, f"{ap}.query", f"{a}/query", hidden, hidden)
        k = linear(x, f"{ap}.key", f"{a}/key", hidden, hidden)
        v = linear(x, f"{ap}.value", f"{a}/value", hidden, hidden)

        def heads_of(t, perm):
            t = net.node("Reshape", [t, net.const(a, [0, 0, heads, head_dim], np.int64)], a)
            return net.node("Transpose", [t], a, perm=perm)

        k = heads_of(k, [0, 2, 3, 1])
        q = heads_of(q, [0, 2, 1, 3])
        scores = net.node("MatMul", [q, k], a)
        scores = net.node("Div", [scores, net.const(a, math.sqrt(head_dim))], a)
        scores = net.node("Add", [scores, mask_bias], a)
        probs = net.node("Softmax", [scores], a, axis=-1)
        v = heads_of(v, [0, 2, 1, 3])
        ctx = net.node("MatMul", [probs, v], a)
        ctx = net.node("Transpose", [ctx], a, perm=[0, 2, 1, 3])
        ctx = net.node("Reshape", [ctx, net.const(a, [0, 0, hidden], np.int64)], a)
        o, op_ = f"{s}/attention/output", f"{p}.attention.output"
        y = linear(ctx, f"{op_}.dense", f"{o}/dense", hidden, hidden)
        x = layer_norm(net.node("Add", [y, x], o), f"{op_}.LayerNorm", f"{o}/LayerNorm")
        g = f"{s}/intermediate/intermediate_act_fn"
        h = linear(x, f"{p}.intermediate.dense", f"{s}/intermediate/dense", hidden, intermediate)
        erf = net.node("Erf", [net.node("Div", [h, net.const(g, 1.4142135381698608)], g)], g)
        h = net.node("Mul", [net.node("Mul", [h, net.node("Add", [erf, net.const(g, 1.0)], g)], g),
                             net.const(g, 0.5)], g)
        o = f"{s}/output"
        y = linear(h, f"{p}.output.dense", f"{o}/dense", intermediate, hidden)
        x = layer_norm(net.node("Add", [y, x], o), f"{p}.output.LayerNorm", f"{o}/LayerNorm")
    net.rename_output(x, "last_hidden_state")
    inputs = [value_info("input_ids", np.int64, [batch, seq]), value_info("attention_mask", np.int64, [batch, seq])]
    outputs = [value_info("last_hidden_state", np.float32, [batch, seq, hidden])]
    return net.model(inputs, outputs, "bert")


# --------------------------------------------------------------------------------------------------
# Inception-v3 (torchvision): stem, Mixed_5b-5d (A), Mixed_6a (B), Mixed_6b (C), classifier
# --------------------------------------------------------------------------------------------------

def inception(image_size: int = 299, width: float = 1.0, seed: int = 0, batch: int | str = "batch", *,
              num_classes: int = 1000, c_blocks: int = 1, identity_weights: bool = False, eps: float = 1e-3,
              opset: int = 17) -> onnx.ModelProto:
    """Inception-v3 stem + 3 Inception-A, Inception-B and `c_blocks` Inception-C blocks; `width` scales channels."""
    if image_size < 75:
        raise ValueError(f"inception needs image_size >= 75, got {image_size}")
    net = _Net(seed, opset, identity_weights)

    def ch(c: int) -> int:
        return _make_divisible(c * width, 8)

    def basic(x, name, cin, cout, k, stride=1, pad=0):
        s = f"/{name}"
        # gain 1.5, not 2: three max-pools on the way inflate the second moment by ~1.5x each
        y = net.conv(x, f"{s}/conv", f"{name.replace('/', '.')}.conv", cin, cout, k, stride, pad, gain=1.5)
        y = net.bn(y, f"{s}/bn", f"{name.replace('/', '.')}.bn", cout, eps)  # BasicConv2d: eps=0.001
        return net.node("Relu", [y], s)

    def avg_pool(x, s):
        return net.node("AveragePool", [x], s, ceil_mode=0, count_include_pad=1, kernel_shape=[3, 3],
                        pads=[1, 1, 1, 1], strides=[1, 1])

    def max_pool(x, s):
        return net.node("MaxPool", [x], s, ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3], pads=[0, 0, 0, 0],
                        strides=[2, 2])

    def block_a(x, b, cin, pool):
        o1 = basic(x, f"{b}/branch1x1", cin, ch(64), 1)
        o2 = basic(x, f"{b}/branch5x5_1", cin, ch(48), 1)
        o2 = basic(o2, f"{b}/branch5x5_2", ch(48), ch(64), 5, pad=2)
        o3 = basic(x, f"{b}/branch3x3dbl_1", cin, ch(64), 1)
        o3 = basic(o3, f"{b}/branch3x3dbl_2", ch(64), ch(96), 3, pad=1)
        o3 = basic(o3, f"{b}/branch3x3dbl_3", ch(96), ch(96), 3, pad=1)
        o4 = basic(avg_pool(x, f"/{b}"), f"{b}/branch_pool", cin, ch(pool), 1)
        return net.node("Concat", [o1, o2, o3, o4], f"/{b}", axis=1), ch(64) + ch(64) + ch(96) + ch(pool)

    def block_b(x, b, cin):
        o1 = basic(x, f"{b}/branch3x3", cin, ch(384), 3, stride=2)
        o2 = basic(x, f"{b}/branch3x3dbl_1", cin, ch(64), 1)
        o2 = basic(o2, f"{b}/branch3x3dbl_2", ch(64), ch(96), 3, pad=1)
        o2 = basic(o2, f"{b}/branch3x3dbl_3", ch(96), ch(96), 3, stride=2)
        o3 = max_pool(x, f"/{b}")
        return net.node("Concat", [o1, o2, o3], f"/{b}", axis=1), ch(384) + ch(96) + cin

    def block_c(x, b, cin, c7):
        c7 = ch(c7)
        o1 = basic(x, f"{b}/branch1x1", cin, ch(192), 1)
        o2 = basic(x, f"{b}/branch7x7_1", cin, c7, 1)
        o2 = basic(o2, f"{b}/branch7x7_2", c7, c7, (1, 7), pad=(0, 3))
        o2 = basic(o2, f"{b}/branch7x7_3", c7, ch(192), (7, 1), pad=(3, 0))
        o3 = basic(x, f"{b}/branch7x7dbl_1", cin, c7, 1)
        o3 = basic(o3, f"{b}/branch7x7dbl_2", c7, c7, (7, 1), pad=(3, 0))
        o3 = basic(o3, f"{b}/branch7x7dbl_3", c7, c7, (1, 7), pad=(0, 3))
        o3 = basic(o3, f"{b}/branch7x7dbl_4", c7, c7, (7, 1), pad=(3, 0))
        o3 = basic(o3, f"{b}/branch7x7dbl_5", c7, ch(192), (1, 7), pad=(0, 3))
        o4 = basic(avg_pool(x, f"/{b}"), f"{b}/branch_pool", cin, ch(192), 1)
        return net.node("Concat", [o1, o2, o3, o4], f"/{b}", axis=1), 4 * ch(192)

    x = basic("input", "Conv2d_1a_3x3", 3, ch(32), 3, stride=2)
    x = basic(x, "Conv2d_2a_3x3", ch(32), ch(32), 3)
    x = basic(x, "Conv2d_2b_3x3", ch(32), ch(64), 3, pad=1)
    x = max_pool(x, "/maxpool1")
    x = basic(x, "Conv2d_3b_1x1", ch(64), ch(80), 1)
    x = basic(x, "Conv2d_4a_3x3", ch(80), ch(192), 3)
    x = max_pool(x, "/maxpool2")
    x, c = block_a(x, "Mixed_5b", ch(192), 32)
    x, c = block_a(x, "Mixed_5c", c, 64)
    x, c = block_a(x, "Mixed_5d", c, 64)
    x, c = block_b(x, "Mixed_6a", c)
    for j, c7 in zip(range(c_blocks), (128, 160, 160, 192)):
        x, c = block_c(x, f"Mixed_6{'bcde'[j]}", c, c7)
    x = net.node("GlobalAveragePool", [x], "/avgpool")
    x = net.node("Flatten", [x], "", axis=1)
    net.rename_output(net.gemm(x, "/fc", "fc", c, num_classes), "logits")
    return net.model([_image_input(batch, image_size)], [value_info("logits", np.float32, [batch, num_classes])],
                     "inception")


# --------------------------------------------------------------------------------------------------
# MobileNetV2 (torchvision)
# --------------------------------------------------------------------------------------------------

def mobilenet_v2(image_size: int = 224, width_mult: float = 1.0, seed: int = 0, batch: int | str = "batch", *,
                 num_classes: int = 1000, identity_weights: bool = False, opset: int = 17) -> onnx.ModelProto:
    """MobileNetV2: inverted residuals with depthwise 3x3 convs and ReLU6 exported as Clip."""
    net = _Net(seed, opset, identity_weights)

    def cna(x, p, s, cin, cout, k, stride=1, group=1, act=True):
        """Conv2dNormActivation: Conv (.0) + BN (.1) + ReLU6 (.2)."""
        y = net.conv(x, f"{s}/{s.rsplit('/', 1)[-1]}.0", f"{p}.0", cin, cout, k, stride, k // 2, group)
        y = net.bn(y, f"{s}/{s.rsplit('/', 1)[-1]}.1", f"{p}.1", cout)
        return net.relu6(y, f"{s}/{s.rsplit('/', 1)[-1]}.2") if act else y

    settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1)]
    cin = _make_divisible(32 * width_mult, 8)
    last = _make_divisible(1280 * max(1.0, width_mult), 8)
    x = cna("input", "features.0", "/features/features.0", 3, cin, 3, 2)
    idx = 1
    for t, c, n, s in settings:
        cout = _make_divisible(c * width_mult, 8)
        for i in range(n):
            stride = s if i == 0 else 1
            p, sc = f"features.{idx}.conv", f"/features/features.{idx}/conv"
            hidden = cin * t
            y, j = x, 0
            if t != 1:
                y = cna(y, f"{p}.0", f"{sc}/conv.0", cin, hidden, 1)
                j = 1
            y = cna(y, f"{p}.{j}", f"{sc}/conv.{j}", hidden, hidden, 3, stride, group=hidden)
            y = net.conv(y, f"{sc}/conv.{j + 1}", f"{p}.{j + 1}", hidden, cout, 1, 1, 0, gain=1.0)
            y = net.bn(y, f"{sc}/conv.{j + 2}", f"{p}.{j + 2}", cout)
            if stride == 1 and cin == cout:
                y = net.node("Add", [x, y], f"/features/features.{idx}")
            x, cin = y, cout
            idx += 1
    x = cna(x, f"features.{idx}", f"/features/features.{idx}", cin, last, 1)
    x = net.node("GlobalAveragePool", [x], "")
    x = net.node("Flatten", [x], "", axis=1)
    net.rename_output(net.gemm(x, "/classifier/classifier.1", "classifier.1", last, num_classes), "logits")
    return net.model([_image_input(batch, image_size)], [value_info("logits", np.float32, [batch, num_classes])],
                     "mobilenet_v2")


# --------------------------------------------------------------------------------------------------
# registry, cache, summary, extract
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Entry:
    builder: Callable[..., onnx.ModelProto]
    description: str
    defaults: tuple = ()


_REGISTRY: dict[str, _Entry] = {
    "resnet50": _Entry(resnet50, "ResNet-50 v1.5, 224x224, 53 Conv + 53 BatchNormalization, 25.6 M params"),
    "resnet18": _Entry(resnet18, "ResNet-18, basic blocks [2,2,2,2], 224x224"),
    "resnet_small": _Entry(resnet_small, "ResNet-18 topology at width 16 and 64x64 input, for fast demos"),
    "yolov5s": _Entry(yolov5s, "YOLOv5s (v6): Conv+BN+SiLU, C3, SPPF, PANet neck, 3 detect heads, 640x640"),
    "yolov5n": _Entry(yolov5s, "YOLOv5n: YOLOv5s topology at width 0.25", (("width_mult", 0.25),)),
    "bert": _Entry(bert, "BERT-base encoder (12 layers, hidden 768), decomposed LayerNorm, Erf GELU"),
    "bert_tiny": _Entry(bert, "BERT-tiny encoder (2 layers, hidden 128, 2 heads)",
                        (("layers", 2), ("hidden", 128), ("heads", 2), ("intermediate", 512))),
    "inception": _Entry(inception, "Inception-v3 stem + Mixed_5b-5d, 6a, 6b, 299x299 (sibling 1x1 branches)"),
    "mobilenet_v2": _Entry(mobilenet_v2, "MobileNetV2, inverted residuals, depthwise convs, ReLU6 as Clip"),
    "conv_bn_relu": _Entry(conv_bn_relu, "A single Conv -> BatchNormalization -> Relu layer"),
}

#: Model names and one-line descriptions.
MODELS: dict[str, str] = {name: e.description for name, e in _REGISTRY.items()}


def _params(name: str, params: dict) -> dict:
    if name not in _REGISTRY:
        raise KeyError(f"unknown zoo model {name!r}; choose from {sorted(_REGISTRY)}")
    entry = _REGISTRY[name]
    merged = {**dict(entry.defaults), **params}
    bound = inspect.signature(entry.builder).bind(**merged)
    bound.apply_defaults()
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in bound.arguments.items()}


def cache_dir() -> Path:
    """Where built models are cached: ``$FUSIONLAB_CACHE`` or ``<repo>/.cache/models``."""
    env = os.environ.get("FUSIONLAB_CACHE")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[1]
    if (repo / "pyproject.toml").exists():
        return repo / ".cache" / "models"
    return Path.home() / ".cache" / "fusionlab" / "models"


_SOURCE_HASH: list[str] = []


def _source_hash() -> str:
    if not _SOURCE_HASH:
        _SOURCE_HASH.append(hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16])
    return _SOURCE_HASH[0]


def _cache_file(name: str, params: dict) -> Path:
    key = json.dumps({"zoo": ZOO_VERSION, "source": _source_hash(), "name": name, "params": params}, sort_keys=True)
    return cache_dir() / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.onnx"


def build(name: str, **params) -> onnx.ModelProto:
    """Build a zoo model by name without touching the cache."""
    full = _params(name, params)
    return _REGISTRY[name].builder(**full)


def path(name: str, **params) -> Path:
    """The cached ``.onnx`` file of a zoo model, building and writing it (atomically) on first use."""
    full = _params(name, params)
    target = _cache_file(name, full)
    if not target.exists():
        atomic_write(target, _REGISTRY[name].builder(**full).SerializeToString())
    return target


def get(name: str, *, cache: bool = True, **params) -> onnx.ModelProto:
    """A zoo model by name (see `MODELS`); loaded from / saved to the cache unless ``cache=False``."""
    full = _params(name, params)
    if not cache:
        return _REGISTRY[name].builder(**full)
    target = _cache_file(name, full)
    if target.exists():
        return onnx.load_model_from_string(target.read_bytes())
    model = _REGISTRY[name].builder(**full)
    atomic_write(target, model.SerializeToString())
    return model


def _as_proto(model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model

    return onnx.load_model_from_string(model_bytes(model))


def _shape(vi: onnx.ValueInfoProto) -> list:
    t = vi.type.tensor_type
    return [d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else None)
            for d in t.shape.dim] if t.HasField("shape") else []


def summary(model) -> dict:
    """Nodes, op counts, parameter count and size of a model (ModelProto, Graph, path or bytes)."""
    proto = _as_proto(model)
    g = proto.graph
    ops: dict[str, int] = {}
    for n in g.node:
        key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}"
        ops[key] = ops.get(key, 0) + 1
    params = sum(int(np.prod(t.dims)) for t in g.initializer
                 if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE))
    init_names = {t.name for t in g.initializer}
    return {
        "name": g.name,
        "opset": onnx_opset(proto, None),
        "nodes": len(g.node),
        "ops": dict(sorted(ops.items())),
        "params": params,
        "initializers": len(g.initializer),
        "mb": round(proto.ByteSize() / 1e6, 2),
        "inputs": {i.name: _shape(i) for i in g.input if i.name not in init_names},
        "outputs": {o.name: _shape(o) for o in g.output},
    }


def extract(model, nodes: str | Iterable[str]) -> onnx.ModelProto:
    """A runnable sub-model of the nodes named (exactly, or by ``/scope`` prefix such as ``"/layer1/layer1.0"``)."""
    # Constant and Identity-of-initializer producers of the selection come along; inputs are the values
    # the selection reads from outside, outputs the values it hands to the rest (or its last node's).
    proto = _as_proto(model)
    g = proto.graph
    keys = [nodes] if isinstance(nodes, str) else list(nodes)

    def matches(n: onnx.NodeProto) -> bool:
        return any(n.name == k or n.name.startswith(k.rstrip("/") + "/") for k in keys)

    inits = {t.name: t for t in g.initializer}
    producer = {o: i for i, n in enumerate(g.node) for o in n.output}
    chosen = {i for i, n in enumerate(g.node) if matches(n)}
    if not chosen:
        raise ValueError(f"no node matches {keys!r}")
    # pull in constant feeders (Constant nodes, Identity of an initializer) so weights stay constants
    stack = list(chosen)
    while stack:
        for v in g.node[stack.pop()].input:
            j = producer.get(v)
            if j is None or j in chosen:
                continue
            src = g.node[j]
            if src.op_type == "Constant" or (src.op_type == "Identity" and src.input[0] in inits):
                chosen.add(j)
                stack.append(j)
    selected = [g.node[i] for i in sorted(chosen)]
    produced = {o for n in selected for o in n.output}
    graph_outputs = {o.name for o in g.output}

    inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
    types = {vi.name: vi for vi in list(inferred.graph.value_info) + list(g.input) + list(g.output)}

    def vi(name: str) -> onnx.ValueInfoProto:
        if name in types:
            out = onnx.ValueInfoProto()
            out.CopyFrom(types[name])
            return out
        return helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)

    inputs, used_inits, seen = [], [], set()
    for n in selected:
        for v in n.input:
            if not v or v in produced or v in seen:
                continue
            seen.add(v)
            if v in inits:
                used_inits.append(inits[v])
            else:
                inputs.append(vi(v))
    outside = {v for i, n in enumerate(g.node) if i not in chosen for v in n.input}
    outputs = [o for n in selected for o in n.output if o and (o in outside or o in graph_outputs)]
    if not outputs:
        outputs = [o for o in selected[-1].output if o]
    opset = onnx_opset(proto, 17)
    extra = {o.domain: o.version for o in proto.opset_import if o.domain not in ("", "ai.onnx")}
    return make_model(selected, inputs, [vi(o) for o in outputs], used_inits, opset=opset,
                      name=f"{g.name}_extract", extra_opsets=extra)
