"""The vertical fusion rules, one module per family; `VERTICAL_RULES` is their priority order.

Norms, gated MLPs (opt-in) and GELUs claim their nodes before the Conv and MatMul chains look at them, so a MatMul's bias Add
that belongs to a BiasGelu is not taken by matmul_add_gemm. transpose_cancel comes before layer_scale: the
first ConvNeXt block loses both its Transposes (and, with layer_scale on, its Mul) in one group.
"""

from .activation import HardActivation, SiLU
from .attention import Attention
from .conv import ConvChain
from .gelu import ErfGelu, GeluAfterBias, TanhGelu
from .glu import GatedMLP
from .linear import LinearChain
from .matmul import FusedMatMul
from .norm import DecomposedLayerNorm, SkipLayerNorm
from .pool import PadPool
from .rmsnorm import DecomposedRMSNorm, SkipRMSNorm
from .rotary import Rotary
from .slices import SliceSplit
from .transpose import LayerScale, TransposeCancel

__all__ = ["VERTICAL_RULES", "RULE_NAMES", "rule_for"]

#: the rule units in priority order
VERTICAL_RULES = (Attention(), Rotary(), DecomposedLayerNorm(), SkipLayerNorm(), DecomposedRMSNorm(), SkipRMSNorm(), GatedMLP(),
                  ErfGelu(),
                  GeluAfterBias(),
                  TanhGelu(), TransposeCancel(), ConvChain(), PadPool(), LinearChain(), FusedMatMul(), LayerScale(),
                  SiLU(), HardActivation(), SliceSplit())

#: every rule name, in the order docs/rules.md lists them
RULE_NAMES = (
    "pad_conv", "pad_pool", "conv_bn", "convtranspose_bn", "conv_scale_bias", "conv_act", "conv_bn_act", "conv_add_act",
    "matmul_add_gemm", "matmul_bn", "gemm_bn", "gemm_act", "fused_matmul", "layer_scale", "transpose_cancel",
    "gelu", "bias_gelu", "fast_gelu", "layernorm", "skip_layernorm", "rmsnorm", "skip_rmsnorm", "silu",
    "hard_sigmoid", "hard_swish", "slice_split", "attention", "gqa", "rotary", "swiglu", "geglu",
)


def rule_for(name: str, op_type: str):
    """The rule unit that produces rule `name` when anchored on an op of `op_type`."""
    for r in VERTICAL_RULES:
        if name in r.names and op_type in r.anchors:
            return r
    return None
