"""Lowering targets, chosen in one place: which runtime op a fusion group becomes.

Matchers decide *what* may fuse; this module decides what the group is written as, from the lowering mode,
the dtype and the opset:

- ``"runtime"`` (default): onnxruntime's ``com.microsoft`` fused kernels where the CPU build has one
  (FusedConv, FusedGemm, Gelu, BiasGelu, FastGelu, QuickGelu, SkipLayerNormalization, ...);
- ``"onnx"``: standard ONNX ops only (folding, Gemm, opset-17 LayerNormalization, opset-20 Gelu);
- ``"functions"``: ``"runtime"``, plus groups with no fused kernel written as model-local functions.

Every target is valid at the model's opset under onnx.checker (full check): a default-domain op onnx has no
schema for (onnxruntime's SimplifiedLayerNormalization) is never written, whatever onnxruntime would run.

A `Target` names the emitted ops and counts the kernels they launch, which is what a group saves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .engine import Refused
from .options import Lowering

__all__ = ["Target", "FUSED_CONV_ACTIVATIONS", "FUSED_GEMM_ACTIVATIONS", "ELEMENTWISE_ACTIVATIONS",
           "conv_target", "gemm_target", "gelu_target", "fast_gelu_target", "contrib_target", "layernorm_target",
           "attention_target", "gqa_target", "rmsnorm_target", "FLOAT16_CPU_KERNELS", "float16_refusal"]


_F32 = np.dtype(np.float32)

#: The ops fusionlab writes that onnxruntime 1.31's CPU build runs on float16 itself: the MLFloat16 kernel
#: registrations of contrib_ops/cpu/cpu_contrib_kernels.cc and providers/cpu/cpu_execution_provider.cc, each
#: checked by running a one-node float16 model on CPUExecutionProvider (these run with no Cast inserted).
#: Everything else fusionlab writes is float32-only there: FusedMatMul, FusedGemm, Gelu, BiasGelu, FastGelu,
#: QuickGelu, MultiHeadAttention (untyped or float-only registrations) and FusedConv, whose MLFloat16 kernel
#: is compiled only with MLAS_F16VEC_INTRINSICS_SUPPORTED (ARM64 builds with fp16 arithmetic, not x86-64);
#: so are the standard MatMul, Gemm, Conv, Gelu, Softmax, which onnxruntime runs in float32 between Casts it
#: inserts itself. A contrib op is written for float16 only when it is in this table (`float16_refusal`).
FLOAT16_CPU_KERNELS = frozenset({
    "LayerNormalization", "RMSNormalization", "com.microsoft:SkipLayerNormalization",
    "com.microsoft:SkipSimplifiedLayerNormalization", "com.microsoft:GroupQueryAttention",
    "com.microsoft:RotaryEmbedding",
})

#: activations onnxruntime 1.31's CPU FusedConv kernel accepts -> (attribute, default) of its params
FUSED_CONV_ACTIVATIONS = {
    "Relu": (), "Sigmoid": (), "Tanh": (), "LeakyRelu": (("alpha", 0.01),),
    "HardSigmoid": (("alpha", 0.2), ("beta", 0.5)), "Clip": (),
}
#: activations the CPU FusedGemm kernel accepts -> attributes copied as activation_<name>
FUSED_GEMM_ACTIVATIONS = {
    "Relu": (), "Sigmoid": (), "Tanh": (), "Softsign": (), "Softplus": (),
    "LeakyRelu": (("alpha", 0.01),), "HardSigmoid": (("alpha", 0.2), ("beta", 0.5)), "Elu": (("alpha", 1.0),),
    "Selu": (("alpha", 1.67326319217681884765625), ("gamma", 1.05070102214813232421875)),
    "ThresholdedRelu": (("alpha", 1.0),),
}
#: unary elementwise ops that may end a chain written as a local function (no runtime kernel needed)
ELEMENTWISE_ACTIVATIONS = {"Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "Clip", "Softsign", "Softplus",
                           "Elu", "Selu", "HardSwish", "Mish", "ThresholdedRelu", "Celu", "Gelu", "Abs", "Neg", "Exp"}


@dataclass(frozen=True)
class Target:
    """What a group is written as: `op` (domain-qualified, '+'-joined when several) and the kernels it launches."""

    op: str
    kernels: int = 1
    kernel: bool = True  # False: no fused runtime kernel (a function-lowering candidate)

    def __str__(self) -> str:
        return self.op


def float16_refusal(op: str, dtype, found: str = ""):
    """None when `op` (domain-qualified: "com.microsoft:FusedMatMul") may be written for `dtype`; for float16
    and an op outside `FLOAT16_CPU_KERNELS`, the `Refused` saying so (`found`: the group's nodes), for a rule
    to raise or record. One condition for every rule, so `explain --why-not` counts them together."""
    if dtype is None or np.dtype(dtype) != np.float16 or op in FLOAT16_CPU_KERNELS:
        return None
    return Refused(condition=f"a float16 CPU kernel for {op} (onnxruntime 1.31 has float32 only, and would run "
                   "it in float32 between Casts it inserts)", found=found or "float16 operands")


def conv_target(act: str | None, dtype, transpose: bool, lower: Lowering) -> Target:
    """Conv with folded affine steps and an optional activation (SiLU counts as one)."""
    op = "ConvTranspose" if transpose else "Conv"
    if act is None:
        return Target(op)
    if act == "SiLU":
        return Target(f"{op}+com.microsoft:QuickGelu", 2)
    if act in FUSED_CONV_ACTIVATIONS and dtype == _F32 and not transpose and lower != Lowering.ONNX:
        return Target("com.microsoft:FusedConv")
    return Target(f"{op}+{act}", 2, kernel=False)


def conv_activations(dtype, transpose: bool, lower: Lowering) -> dict | None:
    """The activation table a Conv chain may end with (None: any elementwise op, for function lowering)."""
    if lower == Lowering.ONNX:
        return {}
    if lower == Lowering.FUNCTIONS:
        return None
    return FUSED_CONV_ACTIVATIONS if (dtype == _F32 and not transpose) else {}


def gemm_target(act: str | None) -> Target:
    return Target("com.microsoft:FusedGemm") if act else Target("Gemm")


def gelu_target(dtype, opset: int, lower: Lowering) -> Target | None:
    """erf-GELU: the opset-20 `Gelu`, else onnxruntime's contrib `Gelu` (fp32 only); None if neither applies."""
    if dtype != _F32:
        return None
    if opset >= 20:
        return Target("Gelu")
    if lower != Lowering.ONNX:
        return Target("com.microsoft:Gelu")
    return None


def fast_gelu_target(opset: int, lower: Lowering) -> Target | None:
    """tanh-GELU: onnxruntime's FastGelu, or the opset-20 `Gelu(approximate="tanh")` with standard ops only."""
    if lower != Lowering.ONNX:
        return Target("com.microsoft:FastGelu")
    if opset >= 20:
        return Target("Gelu(tanh)")
    return None


def contrib_target(op: str, lower: Lowering) -> Target | None:
    """A com.microsoft op with no standard equivalent (BiasGelu, QuickGelu, SkipLayerNormalization, ...)."""
    return None if lower == Lowering.ONNX else Target(f"com.microsoft:{op}")


def attention_target(lower: Lowering) -> Target | None:
    """Scaled dot-product attention: onnxruntime's MultiHeadAttention (no standard op before opset 23)."""
    return None if lower == Lowering.ONNX else Target("com.microsoft:MultiHeadAttention")


def gqa_target(lower: Lowering) -> Target | None:
    """Grouped-query attention on the unrepeated K/V: onnxruntime's GroupQueryAttention (causal=0, the graph's mask
    as attention_bias)."""
    return None if lower == Lowering.ONNX else Target("com.microsoft:GroupQueryAttention")


def layernorm_target(opset: int) -> Target | None:
    return Target("LayerNormalization") if opset >= 17 else None


def rmsnorm_target(opset: int, lower: Lowering) -> Target | None:
    """RMSNorm: the opset-23 `RMSNormalization`; None below opset 23.

    onnxruntime's own `SimplifiedLayerNormalization` is registered in the ONNX domain only (not in
    com.microsoft, where onnxruntime does not find it), and onnx has no such op, so a model holding it fails
    onnx.checker at every opset: no valid lowering exists below 23 (the residual form has one,
    com.microsoft:SkipSimplifiedLayerNormalization)."""
    return Target("RMSNormalization") if opset >= 23 else None
