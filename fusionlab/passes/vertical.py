"""Vertical fusion: producer -> consumer chains that become one kernel.

Patterns (rule names in brackets):

- Conv / ConvTranspose followed by BatchNormalization and per-channel constant Mul/Add/Sub, folded into
  the weights [conv_bn, convtranspose_bn, conv_scale_bias]; a zero constant Pad folded into Conv's pads
  [pad_conv]; a trailing activation fused as ``com.microsoft:FusedConv`` where onnxruntime's CPU kernel
  supports it, and SiLU (``Sigmoid`` + ``Mul``) as Conv + ``com.microsoft:QuickGelu`` [conv_act, conv_bn_act].
- A constant Pad folded into AveragePool (count_include_pad=1) or into MaxPool when it pads with -inf
  [pad_pool].
- MatMul + Add -> Gemm [matmul_add_gemm]; MatMul / Gemm + BatchNormalization folded [matmul_bn, gemm_bn];
  Gemm + activation -> ``com.microsoft:FusedGemm`` [gemm_act].
- Decomposed erf-GELU -> ``Gelu`` [gelu]; Add + GELU -> ``com.microsoft:BiasGelu`` [bias_gelu].
- Decomposed tanh-GELU, in any arrangement of Mul/Add/Sub/Div/Pow (proved by multiplying out the
  polynomials), with an optional bias Add before it -> ``com.microsoft:FastGelu``, or ``Gelu(approximate=
  "tanh")`` at opset 20 with standard ops only; an opset-20 tanh ``Gelu`` after a bias Add -> FastGelu
  [fast_gelu].
- Decomposed LayerNorm -> ``LayerNormalization`` [layernorm]; Add + LayerNorm ->
  ``com.microsoft:SkipLayerNormalization`` [skip_layernorm]; Sigmoid + Mul -> QuickGelu [silu].

Every rewrite is checked first: each intermediate has a single consumer and is not a graph output,
parameters are constants (not overridable initializers), shapes and ranks make the fused op compute the
same thing, the op version and dtype are ones the target op accepts. When a check fails the nodes are
left alone. Folded weights are new initializers, so a weight shared with another node is never changed.

`lower` chooses the targets: ``"runtime"`` (default) uses onnxruntime's ``com.microsoft`` fused ops;
``"onnx"`` uses standard ONNX ops only (folding, Gemm, opset-17 LayerNormalization, opset-20 Gelu);
``"functions"`` is ``"runtime"`` plus groups with no fused kernel written as model-local functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np
import onnx
import onnx_ir as ir

from .. import derive
from ..graph import Graph
from ..plan import VERTICAL, FusionGroup, FusionPlan
from . import cleanup

__all__ = ["RULES", "LOWERINGS", "FUSED_CONV_ACTIVATIONS", "FUSED_GEMM_ACTIVATIONS", "plan", "apply", "conv_bn_verdict"]

RULES = (
    "pad_conv", "pad_pool", "conv_bn", "convtranspose_bn", "conv_scale_bias", "conv_act", "conv_bn_act", "conv_add_act",
    "matmul_add_gemm", "matmul_bn", "gemm_bn", "gemm_act",
    "gelu", "bias_gelu", "fast_gelu", "layernorm", "skip_layernorm", "silu",
)
LOWERINGS = ("runtime", "functions", "onnx")
#: Rules applied when none are named. `skip_layernorm` is opt-in: onnxruntime 1.31's CPU
#: SkipLayerNormalization kernel measured ~2% *slower* than Add + LayerNormalization on BERT-base
#: (seq 128, 1 thread, interleaved runs: ratio 0.98, 95% CI 0.976-0.981), so fusing it by default
#: would make the model slower. A fused kernel earns its place by measurement, not by existing.
DEFAULT_RULES = tuple(r for r in RULES if r != "skip_layernorm")

#: activations onnxruntime 1.31's CPU FusedConv kernel accepts -> (attribute, default) for its params
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
#: unary elementwise ops that can end a chain written as a local function (no runtime kernel needed)
_ELEMENTWISE = {"Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "Clip", "Softsign", "Softplus", "Elu",
                "Selu", "HardSwish", "Mish", "ThresholdedRelu", "Celu", "Gelu", "Abs", "Neg", "Exp"}
_DEFAULT = ("", "ai.onnx")
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16))
_F32 = np.dtype(np.float32)
_BN_OPSETS = (7, 9, 14, 15)


# --------------------------------------------------------------------------------------------------
# the match: what a rule found, and how to build its replacement
# --------------------------------------------------------------------------------------------------

@dataclass
class _Match:
    rule: str
    nodes: list[ir.Node]                       # members in execution order; the last one's output survives
    build: Callable[[], list[ir.Node]]         # replacement nodes; the last one's first output replaces it
    lowered_to: str
    reason: str
    kernel: bool = True                        # False: no fused runtime kernel (function lowering candidate)
    extra: dict = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes)


class _Refused(Exception):
    """A legality check failed; the message says which."""


def _is(node: ir.Node | None, *ops: str) -> bool:
    return node is not None and node.domain in _DEFAULT and node.op_type in ops


def _attr(node: ir.Node, name: str, default=None):
    a = node.attributes.get(name)
    return default if a is None else a.value


def _sole_consumer(value: ir.Value) -> ir.Node | None:
    """The only node reading `value` (reading it once), or None if it is a graph output or read elsewhere."""
    if value.is_graph_output():
        return None
    uses = list(value.uses())
    if len(uses) != 1:
        return None
    node = uses[0].node
    owner = value.producer().graph if value.producer() is not None else value.graph
    return node if node.graph is owner else None


def _consumers(value: ir.Value) -> list[ir.Node]:
    out: list[ir.Node] = []
    for use in value.uses():
        if use.node not in out:
            out.append(use.node)
    return out


def _only_read_by(value: ir.Value, nodes: Iterable[ir.Node]) -> bool:
    allowed = set(map(id, nodes))
    return not value.is_graph_output() and all(id(u.node) in allowed for u in value.uses())


def _own_dtype(value: ir.Value) -> np.dtype | None:
    try:
        return np.dtype(value.dtype.numpy()) if value.dtype is not None else None
    except Exception:
        return None


def _close(a, b: float, rtol: float = 1e-3) -> bool:
    if a is None:
        return False
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    return a.size == 1 and math.isclose(float(a[0]), b, rel_tol=rtol, abs_tol=1e-6)


class _Context:
    """Everything a matcher needs: the graph, options, claimed nodes and (lazily) symbolic shapes."""

    def __init__(self, graph: Graph, rules: set[str], lower: str, dims: dict | None):
        self.graph = graph
        self.rules = rules
        self.lower = lower
        self.dims = dims or {}
        self.claimed: set[int] = set()
        self._shapes: dict | None = None
        self._types: dict = {}
        self.refusals: list[str] = []
        self._names = {n.name for n in graph.graph} | set(graph.graph.initializers)

    # -- shapes ------------------------------------------------------------------------------------
    def shapes(self) -> dict[str, tuple]:
        if self._shapes is None:
            self._shapes, self._types = _symbolic_shapes(self.graph)
        return self._shapes

    def dtype(self, value: ir.Value) -> np.dtype | None:
        """Element type of a value: its own, else from shape inference."""
        own = _own_dtype(value)
        if own is not None:
            return own
        self.shapes()
        code = self._types.get(value.name)
        try:
            return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code)) if code else None
        except Exception:
            return None

    def shape(self, value: ir.Value) -> tuple | None:
        """Shape of a value: ints and dim names (str); None entries are unknown dims; None if rank unknown."""
        if value.const_value is not None:
            return tuple(value.const_value.shape)
        if value.shape is not None:
            dims = tuple(d if isinstance(d, int) else (d.value if getattr(d, "value", None) else None)
                         for d in value.shape)
            if all(d is not None for d in dims):
                return dims
        return self.shapes().get(value.name)

    def rank(self, value: ir.Value) -> int | None:
        s = self.shape(value)
        return None if s is None else len(s)

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self._names:
            k += 1
            name = f"{base}_{k}"
        self._names.add(name)
        return name

    def free(self, nodes: Iterable[ir.Node]) -> bool:
        return not any(id(n) in self.claimed for n in nodes)

    def constant(self, value: ir.Value | None) -> np.ndarray | None:
        return None if value is None else self.graph.constant(value)

    def new_initializer(self, base: str, array: np.ndarray) -> ir.Value:
        name = self.fresh(base)
        value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                         const_value=ir.tensor(array, name=name))
        self.graph.graph.register_initializer(value)
        return value


def _symbolic_shapes(graph: Graph) -> tuple[dict[str, tuple], dict[str, int]]:
    """{value name: shape} by onnx shape inference without binding symbolic dims (names kept as str)."""
    proto = graph.to_proto()
    for init in proto.graph.initializer:  # shapes only need dims; drop the bytes to keep it fast
        if init.ByteSize() > 4096:
            dims = list(init.dims)
            dtype = init.data_type
            name = init.name
            init.Clear()
            init.name, init.data_type = name, dtype
            init.dims.extend(dims)
            init.data_location = onnx.TensorProto.DEFAULT
            init.raw_data = b""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=False)
    except Exception:
        inferred = proto
    out: dict[str, tuple] = {}
    types: dict[str, int] = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        tt = vi.type.tensor_type
        if tt.elem_type:
            types[vi.name] = tt.elem_type
        if not tt.HasField("shape"):
            continue
        out[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
    for init in inferred.graph.initializer:
        out[init.name] = tuple(init.dims)
        types[init.name] = init.data_type
    return out, types


# --------------------------------------------------------------------------------------------------
# legality helpers shared by the rules
# --------------------------------------------------------------------------------------------------

def conv_bn_verdict(graph: Graph, producer: ir.Node, bn: ir.Node, shapes: dict | None = None) -> tuple[bool, str]:
    """Whether BN may fold into the Conv/ConvTranspose/MatMul/Gemm before it: fusionlab.legality plus our checks."""
    try:
        from .. import legality
    except ImportError:  # pragma: no cover - legality is optional
        legality = None
    if legality is not None:
        if producer.op_type in ("Conv", "ConvTranspose"):
            verdict = legality.conv_bn_legal(graph, producer, bn)
        else:
            verdict = legality.matmul_bn_legal(graph, producer, bn, shapes)
        if not verdict.ok:
            return False, str(verdict.reason)
    try:
        _bn_checks(graph, bn)
    except _Refused as exc:
        return False, str(exc)
    return True, "inference-mode BN with constant parameters"


def _bn_checks(graph: Graph, bn: ir.Node) -> None:
    if graph.opset not in range(7, 100) or not _is(bn, "BatchNormalization"):
        raise _Refused("not a BatchNormalization")
    if len(bn.inputs) != 5 or any(v is None for v in bn.inputs):
        raise _Refused("BatchNormalization needs 5 inputs")
    if any(v.name for v in bn.outputs[1:]):
        raise _Refused("BatchNormalization has optional (training) outputs")
    if int(_attr(bn, "training_mode", 0)) != 0:
        raise _Refused("BatchNormalization is in training mode")
    if int(_attr(bn, "spatial", 1)) != 1:
        raise _Refused("BatchNormalization spatial=0 (per-element statistics)")


def _bn_scale_shift(ctx: _Context, bn: ir.Node, channels: int, dtype: np.dtype):
    params = [ctx.constant(v) for v in bn.inputs[1:5]]
    if any(p is None for p in params):
        raise _Refused("BatchNormalization parameters are not constants (or are overridable)")
    if any(p.ndim != 1 or p.shape[0] != channels for p in params):
        raise _Refused(f"BatchNormalization parameters are not 1-D of length {channels}")
    if any(p.dtype not in _FLOATS for p in params):
        raise _Refused("BatchNormalization parameters are not floating point")
    eps = float(_attr(bn, "epsilon", 1e-5))
    var = params[3].astype(np.float64)
    if not np.all(var + eps > 0) or not all(np.all(np.isfinite(p)) for p in params):
        raise _Refused("BatchNormalization variance + epsilon is not positive (or parameters not finite)")
    return derive.bn_scale_shift(*params, eps)


def _channel_affine(ctx: _Context, node: ir.Node, cur: ir.Value, channels: int, rank: int, axis: int,
                    dtype: np.dtype):
    """(scale, shift) per channel of Mul/Add/Sub(cur, constant), or raise _Refused."""
    if len(node.inputs) != 2 or sum(v is cur for v in node.inputs) != 1:
        raise _Refused(f"{node.op_type} does not read the value once")
    other = node.inputs[1] if node.inputs[0] is cur else node.inputs[0]
    if node.op_type == "Sub" and node.inputs[0] is not cur:
        raise _Refused("Sub with the constant first is not an affine map of the input")
    c = ctx.constant(other)
    if c is None:
        raise _Refused(f"{node.op_type} operand is not a constant")
    if c.dtype != dtype:
        raise _Refused(f"{node.op_type} constant dtype {c.dtype} differs from {dtype}")
    if c.ndim > rank:
        raise _Refused(f"{node.op_type} constant has rank {c.ndim} > {rank}: it would broadcast the output")
    padded = (1,) * (rank - c.ndim) + tuple(c.shape)
    for i, d in enumerate(padded):
        if d != 1 and not (i == axis and d == channels):
            raise _Refused(f"{node.op_type} constant shape {c.shape} is not per-channel")
    vec = np.broadcast_to(c.astype(np.float64).reshape(-1) if c.size == channels else c.astype(np.float64).reshape(-1)[:1],
                          (channels,)).copy()
    if not np.all(np.isfinite(vec)):
        raise _Refused(f"{node.op_type} constant is not finite")
    if node.op_type == "Mul":
        return vec, np.zeros(channels)
    if node.op_type == "Add":
        return np.ones(channels), vec
    return np.ones(channels), -vec


def _activation(ctx: _Context, node: ir.Node | None, dtype: np.dtype, table: dict | None):
    """(op name, params dict) if `node` is an activation this target accepts (table None: any elementwise)."""
    if node is None or node.domain not in _DEFAULT or node.op_type not in _ELEMENTWISE:
        return None
    if len(node.outputs) != 1:
        return None
    op = node.op_type
    if table is not None and op not in table:
        return None
    if op == "Clip":
        lo, hi = -3.4028234663852886e38, 3.4028234663852886e38
        if ctx.graph.opset < 11:
            lo, hi = float(_attr(node, "min", lo)), float(_attr(node, "max", hi))
        else:
            for i, slot in ((1, "lo"), (2, "hi")):
                if len(node.inputs) > i and node.inputs[i] is not None:
                    c = ctx.constant(node.inputs[i])
                    if c is None or c.size != 1:
                        return None
                    if slot == "lo":
                        lo = float(c.reshape(-1)[0])
                    else:
                        hi = float(c.reshape(-1)[0])
        return op, {"min": lo, "max": hi}
    if len([v for v in node.inputs if v is not None]) != 1:
        return None
    defaults = dict((table or FUSED_GEMM_ACTIVATIONS).get(op, ()))
    return op, {k: float(_attr(node, k, d)) for k, d in defaults.items()}


def _silu_tail(value: ir.Value) -> tuple[ir.Node, ir.Node] | None:
    """(Sigmoid, Mul) if value's only readers compute value * sigmoid(value)."""
    if value.is_graph_output():
        return None
    readers = _consumers(value)
    if len(readers) != 2 or len(list(value.uses())) != 2:
        return None
    sig = next((n for n in readers if _is(n, "Sigmoid")), None)
    mul = next((n for n in readers if _is(n, "Mul")), None)
    if sig is None or mul is None:
        return None
    s = sig.outputs[0]
    if _sole_consumer(s) is not mul or set(map(id, mul.inputs)) != {id(value), id(s)}:
        return None
    return sig, mul


def _nbytes(ctx: _Context, value: ir.Value) -> int:
    shape = ctx.shape(value)
    dt = ctx.dtype(value)
    if shape is None or dt is None:
        return 0
    n = 1
    for d in shape:
        if isinstance(d, int):
            n *= d
        elif isinstance(d, str):
            low = d.lower()
            n *= ctx.dims.get(d, ctx.dims.get("batch", 1) if "batch" in low else ctx.dims.get("sequence", 8)
                              if ("seq" in low or "len" in low) else 1)
        else:
            return 0
    return n * dt.itemsize


def _new_node(ctx: _Context, op: str, inputs, attrs: dict, *, domain: str = "", name: str,
              num_outputs: int = 1) -> ir.Node:
    attributes = {k: v for k, v in attrs.items() if v is not None}
    return ir.node(op, inputs, attributes=attributes, domain=domain, name=ctx.fresh(name), num_outputs=num_outputs)


def _copy_attrs(node: ir.Node, skip: Iterable[str] = ()) -> dict:
    return {k: a.value for k, a in node.attributes.items() if k not in set(skip)}


# --------------------------------------------------------------------------------------------------
# Conv chains: [Pad] Conv [BN | Mul | Add | Sub]* [activation]
# --------------------------------------------------------------------------------------------------

def _match_conv(ctx: _Context, conv: ir.Node) -> _Match | None:
    if not _is(conv, "Conv", "ConvTranspose") or len(conv.inputs) < 2 or len(conv.outputs) != 1:
        return None
    transpose = conv.op_type == "ConvTranspose"
    if conv.inputs[1] is None or conv.inputs[0] is None:
        return None
    w = ctx.constant(conv.inputs[1])  # None: a run-time weight (activation and Pad fusion still legal)
    w_shape = tuple(w.shape) if w is not None else ctx.shape(conv.inputs[1])
    dtype = w.dtype if w is not None else ctx.dtype(conv.inputs[1])
    if w_shape is None or len(w_shape) < 3 or not all(isinstance(d, int) for d in w_shape) or dtype not in _FLOATS:
        return None
    group = int(_attr(conv, "group", 1))
    channels = w_shape[1] * group if transpose else w_shape[0]
    bias = None
    has_bias = len(conv.inputs) > 2 and conv.inputs[2] is not None
    if has_bias:
        bias = ctx.constant(conv.inputs[2])
        if bias is not None and (bias.shape != (channels,) or bias.dtype != dtype):
            return None
    can_fold = w is not None and (not has_bias or bias is not None)
    rank = len(w_shape)
    rules = ctx.rules
    reason = ""
    # -- optional Pad in front
    pad_node, pad_extra = None, None
    if not transpose and "pad_conv" in rules and conv.inputs[0] is not None:
        cand = conv.inputs[0].producer()
        if _is(cand, "Pad") and ctx.free([cand]):
            try:
                pad_extra = _pad_into_conv(ctx, cand, conv, rank)
                pad_node = cand
            except _Refused as exc:
                ctx.refusals.append(f"pad_conv {cand.name}: {exc}")
    # -- affine steps
    steps: list[tuple[ir.Node, np.ndarray, np.ndarray]] = []
    cur = conv.outputs[0]
    bn_rule = "convtranspose_bn" if transpose else "conv_bn"
    while True:
        nxt = _sole_consumer(cur)
        if nxt is None or not ctx.free([nxt]) or nxt.domain not in _DEFAULT or not can_fold:
            break
        try:
            if nxt.op_type == "BatchNormalization" and bn_rule in rules and nxt.inputs[0] is cur:
                ok, why = conv_bn_verdict(ctx.graph, conv, nxt)
                if not ok:
                    raise _Refused(why)
                s, t = _bn_scale_shift(ctx, nxt, channels, dtype)
            elif nxt.op_type in ("Mul", "Add", "Sub") and "conv_scale_bias" in rules:
                s, t = _channel_affine(ctx, nxt, cur, channels, rank, 1, dtype)
            else:
                break
        except _Refused as exc:
            reason = f"stopped at {nxt.op_type} {nxt.name}: {exc}"
            ctx.refusals.append(f"{conv.name}: {reason}")
            break
        steps.append((nxt, s, t))
        cur = nxt.outputs[0]
    # -- residual Add before the activation: FusedConv's optional 4th input Z computes act(conv(x) + b + Z)
    act_nodes: list[ir.Node] = []
    act = None
    add_node, z, act = _residual_add(ctx, cur, dtype) if (
        "conv_add_act" in rules and ctx.lower != "onnx" and not transpose and (can_fold or not steps)) \
        else (None, None, None)
    if add_node is not None:
        act_nodes = [_sole_consumer(add_node.outputs[0])]
    # -- activation
    act_rule = "conv_add_act" if add_node is not None else ("conv_bn_act" if steps else "conv_act")
    if add_node is None and (act_rule in rules or "conv_bn_act" in rules) and ctx.lower != "onnx":
        nxt = _sole_consumer(cur)
        silu = _silu_tail(cur)
        if silu is not None and ctx.free(silu) and dtype == _F32:
            act_nodes, act = list(silu), ("SiLU", {})
        elif nxt is not None and ctx.free([nxt]):
            table = FUSED_CONV_ACTIVATIONS if (dtype == _F32 and not transpose) else {}
            found = _activation(ctx, nxt, dtype, table)
            if found is None and ctx.lower == "functions":
                found = _activation(ctx, nxt, dtype, None)
            if found is not None:
                act_nodes, act = [nxt], found
    nodes = ([pad_node] if pad_node else []) + [conv] + [s[0] for s in steps] + \
        ([add_node] if add_node is not None else []) + act_nodes
    if len(nodes) == 1:
        return None
    has_bn = any(s[0].op_type == "BatchNormalization" for s in steps)
    rule = act_rule if act else (bn_rule if has_bn else ("conv_scale_bias" if steps else "pad_conv"))
    # fold the affine steps (float64, cast back once); refuse if folded weights overflow the dtype
    folded_cache: list = []

    def fold():
        if not folded_cache:
            scale, shift = np.ones(channels), np.zeros(channels)
            for _, s, t in steps:
                scale, shift = s * scale, s * shift + t
            folded_cache.append(derive.fold_conv_bn(w, bias, scale, shift, np.zeros(channels), np.ones(channels),
                                                    0.0, group=group, transpose=transpose))
        return folded_cache[0]

    if steps:
        # cheap bound first (folding every conv twice, in plan and apply, would dominate the pass time)
        s_max, t_max = 1.0, 0.0
        for _, s, t in steps:
            s_max, t_max = s_max * float(np.abs(s).max()), float(np.abs(s).max()) * t_max + float(np.abs(t).max())
        b_max = float(np.abs(bias).max()) if bias is not None else 0.0
        bound = max(float(np.abs(w).max()) * s_max, s_max * b_max + t_max)
        if not bound < float(np.finfo(w.dtype).max) / 4 and fold().overflow:
            ctx.refusals.append(f"{conv.name}: folded weights overflow {w.dtype}")
            return None
    fused_conv = act is not None and act[0] != "SiLU" and act[0] in FUSED_CONV_ACTIVATIONS and \
        dtype == _F32 and not transpose
    kernel = act is None or fused_conv or act[0] == "SiLU"
    if act is None:
        lowered = conv.op_type
    elif fused_conv:
        lowered = "com.microsoft:FusedConv"
    elif act[0] == "SiLU":
        lowered = "Conv+com.microsoft:QuickGelu"
    else:
        lowered = f"{conv.op_type}+{act[0]}"

    def build() -> list[ir.Node]:
        x = pad_node.inputs[0] if pad_node is not None else conv.inputs[0]
        if steps:
            folded = fold()
            wv = ctx.new_initializer(f"{conv.name}_W_fused", folded.weight)
            bv = ctx.new_initializer(f"{conv.name}_B_fused", folded.bias)
        else:
            wv = conv.inputs[1]
            bv = conv.inputs[2] if len(conv.inputs) > 2 else None
        attrs = _copy_attrs(conv)
        if pad_extra is not None:
            attrs["pads"] = pad_extra
        inputs = [x, wv] + ([bv] if bv is not None else [])
        if z is not None:
            if bv is None:  # Z is input 3: a bias must stand in slot 2
                bv = ctx.new_initializer(f"{conv.name}_B_zero", np.zeros(channels, dtype=dtype))
                inputs = [x, wv, bv]
            inputs.append(z)
        if fused_conv:
            op, params = act
            attrs["activation"] = op
            vals = [params[k] for k, _ in FUSED_CONV_ACTIVATIONS[op]] if op != "Clip" else [params["min"], params["max"]]
            if vals:
                attrs["activation_params"] = [float(v) for v in vals]
            return [_new_node(ctx, "FusedConv", inputs, attrs, domain="com.microsoft", name=f"{conv.name}_fused")]
        out = [_new_node(ctx, conv.op_type, inputs, attrs, name=f"{conv.name}_fused")]
        if act is not None and act[0] == "SiLU":
            out.append(_new_node(ctx, "QuickGelu", [out[0].outputs[0]], {"alpha": 1.0}, domain="com.microsoft",
                                 name=f"{conv.name}_silu"))
        elif act is not None:
            a = act_nodes[0]
            inputs2 = [out[0].outputs[0]] + list(a.inputs[1:])
            out.append(_new_node(ctx, a.op_type, inputs2, _copy_attrs(a), name=f"{a.name}_after_fold"))
        return out

    why = reason or ("single-consumer chain; constant parameters; per-channel affine steps fold into "
                     "the weights" if steps else "single-consumer chain")
    return _Match(rule, nodes, build, lowered, why, kernel=kernel,
                  extra={"activation": act[0] if act else None})


def _residual_add(ctx: _Context, cur: ir.Value, dtype: np.dtype):
    """(Add, Z, activation) when `cur` feeds only `Add(cur, Z)` whose only reader is a FusedConv activation.

    Legal only without broadcasting: Z must have exactly the conv output's shape (every dimension known
    and equal, symbolic names included) and dtype. Z cannot depend on the conv: the conv's output reaches
    nothing but this Add, and Z is the Add's *other* input. (None, None, None) when any check fails.
    """
    nothing = (None, None, None)
    if dtype != _F32:
        return nothing
    add = _sole_consumer(cur)
    if not _is(add, "Add") or not ctx.free([add]) or len(add.inputs) != 2 or add.outputs[0].is_graph_output():
        return nothing
    if add.inputs[0] is cur and add.inputs[1] is not cur:
        z = add.inputs[1]
    elif add.inputs[1] is cur and add.inputs[0] is not cur:
        z = add.inputs[0]
    else:
        return nothing
    a, b = ctx.shape(cur), ctx.shape(z)
    if a is None or b is None or len(a) != len(b) or any(x is None or y is None or x != y for x, y in zip(a, b)):
        ctx.refusals.append(f"conv_add_act {add.name}: cannot prove the residual has the conv output's shape")
        return nothing
    if ctx.dtype(z) != dtype:
        return nothing
    after = _sole_consumer(add.outputs[0])
    if after is None or not ctx.free([after]):
        return nothing
    found = _activation(ctx, after, dtype, FUSED_CONV_ACTIVATIONS)
    if found is None:
        return nothing
    return add, z, found


def _folded_pads(ctx: _Context, pad: ir.Node, consumer: ir.Node, rank: int) -> tuple[list[int], float]:
    """(consumer pads + Pad's spatial pads, pad value) if a constant Pad's padding can move into `consumer`."""
    kind = consumer.op_type
    if consumer.inputs[0] is not pad.outputs[0] or _sole_consumer(pad.outputs[0]) is not consumer:
        raise _Refused("Pad output is read elsewhere or is a graph output")
    if str(_attr(consumer, "auto_pad", "NOTSET")) != "NOTSET":
        raise _Refused(f"{kind} uses auto_pad")
    if str(_attr(pad, "mode", "constant")) != "constant":
        raise _Refused("Pad mode is not constant")
    if ctx.graph.opset < 11:
        pads = _attr(pad, "pads", None)
        value = float(_attr(pad, "value", 0.0))
        if pads is None:
            raise _Refused("Pad has no pads")
        pads = np.asarray(list(pads), dtype=np.int64)
    else:
        if len(pad.inputs) < 2 or pad.inputs[1] is None:
            raise _Refused("Pad has no pads input")
        pads = ctx.constant(pad.inputs[1])
        if pads is None:
            raise _Refused("Pad pads are not constant")
        value = 0.0
        if len(pad.inputs) > 2 and pad.inputs[2] is not None:
            c = ctx.constant(pad.inputs[2])
            if c is None or c.size != 1:
                raise _Refused("Pad value is not a constant scalar")
            value = float(c.reshape(-1)[0])
        if len(pad.inputs) > 3 and pad.inputs[3] is not None:
            raise _Refused("Pad with an axes input is not folded")
    pads = np.asarray(pads).reshape(-1).astype(np.int64)
    if pads.size != 2 * rank:
        raise _Refused(f"Pad has {pads.size} pads for a rank-{rank} input")
    if np.any(pads < 0):
        raise _Refused(f"negative pads (cropping) cannot fold into {kind}")
    begin, end = pads[:rank], pads[rank:]
    if begin[0] or begin[1] or end[0] or end[1]:
        raise _Refused("Pad pads the batch or channel axis")
    own = _attr(consumer, "pads", None)
    own = np.zeros(2 * (rank - 2), dtype=np.int64) if own is None else np.asarray(list(own))
    if own.size != 2 * (rank - 2):
        raise _Refused(f"{kind} has {own.size} pads for {rank - 2} spatial axes")
    spatial = np.concatenate([begin[2:], end[2:]])
    return [int(v) for v in own + spatial], value


def _pad_into_conv(ctx: _Context, pad: ir.Node, conv: ir.Node, rank: int) -> list[int]:
    pads, value = _folded_pads(ctx, pad, conv, rank)
    if value != 0.0:
        raise _Refused("Pad value is not zero")
    return pads


# --------------------------------------------------------------------------------------------------
# Pad + pooling: Pad -> AveragePool / MaxPool
# --------------------------------------------------------------------------------------------------

def _match_pool(ctx: _Context, pool: ir.Node) -> _Match | None:
    """Fold a constant Pad into the pool after it, where the pool's own padding computes the same thing.

    - AveragePool pads with zeros that count in the average only when ``count_include_pad=1``; explicit
      zeros from a Pad always count. So the fused pool gets ``count_include_pad=1``, which is legal only if
      the pool had no padding of its own or already counted it (onnxruntime PR #23190 fixed exactly this).
    - MaxPool's own padding never wins a max, like padding with -inf; a Pad with value 0 would win over
      negative inputs, so only a -inf Pad folds.
    - ``ceil_mode=1`` is refused (windows past the end behave differently), and onnxruntime requires every
      pad to be smaller than the kernel, so a fold that would break that is refused too.
    """
    if "pad_pool" not in ctx.rules or not _is(pool, "AveragePool", "MaxPool") or not pool.inputs or \
            pool.inputs[0] is None:
        return None
    pad = pool.inputs[0].producer()
    if not _is(pad, "Pad") or not ctx.free([pad]) or pad.inputs[0] is None:
        return None
    rank = ctx.rank(pad.inputs[0])
    kernel = _attr(pool, "kernel_shape", None)
    try:
        if rank is None or rank < 3 or kernel is None or len(list(kernel)) != rank - 2:
            raise _Refused("input rank or kernel shape unknown")
        if any(o.name and (o.uses() or o.is_graph_output()) for o in pool.outputs[1:]):
            raise _Refused("MaxPool's Indices output is used (it indexes the padded tensor)")
        if int(_attr(pool, "ceil_mode", 0)):
            raise _Refused("ceil_mode=1")
        pads, value = _folded_pads(ctx, pad, pool, rank)
        if pool.op_type == "AveragePool":
            if value != 0.0:
                raise _Refused("Pad value is not zero")
            if not int(_attr(pool, "count_include_pad", 0)) and any(_attr(pool, "pads", None) or []):
                raise _Refused("AveragePool has its own pads with count_include_pad=0")
        elif not (math.isinf(value) and value < 0):
            raise _Refused("MaxPool pads with -inf; this Pad's value is not -inf")
        k = [int(v) for v in kernel]
        half = len(pads) // 2
        if any(pads[i] >= k[i % half] for i in range(len(pads))):
            raise _Refused("a folded pad would not be smaller than the kernel (onnxruntime rejects it)")
    except _Refused as exc:
        ctx.refusals.append(f"pad_pool {pad.name}: {exc}")
        return None

    def build() -> list[ir.Node]:
        attrs = _copy_attrs(pool)
        attrs["pads"] = pads
        if pool.op_type == "AveragePool":
            attrs["count_include_pad"] = 1
        return [_new_node(ctx, pool.op_type, [pad.inputs[0]], attrs, name=f"{pool.name}_fused")]
    why = "constant Pad folded into the pool's own pads" + (
        " (count_include_pad=1: the zeros count, as they did)" if pool.op_type == "AveragePool" else " (-inf padding)")
    return _Match("pad_pool", [pad, pool], build, pool.op_type, why)


# --------------------------------------------------------------------------------------------------
# MatMul / Gemm chains: MatMul [Add | BN] [activation],  Gemm [BN] [activation]
# --------------------------------------------------------------------------------------------------

def _same_dim(a, b) -> bool:
    return a is not None and b is not None and a == b


def _bias_ok_for(c_shape: tuple, m, n) -> bool:
    """Whether a bias of shape c_shape broadcasts unidirectionally to (M, N) without growing it."""
    if len(c_shape) > 2:
        return False
    padded = (1,) * (2 - len(c_shape)) + tuple(c_shape)
    return all(d == 1 or _same_dim(d, full) for d, full in zip(padded, (m, n)))


def _match_linear(ctx: _Context, node: ir.Node) -> _Match | None:
    if not _is(node, "MatMul", "Gemm") or len(node.outputs) != 1 or any(v is None for v in node.inputs[:2]):
        return None
    a, b = node.inputs[0], node.inputs[1]
    first = _sole_consumer(node.outputs[0])
    if first is None or not ctx.free([first]) or first.domain not in _DEFAULT or \
            first.op_type not in ("Add", "BatchNormalization", *FUSED_GEMM_ACTIVATIONS):
        return None
    dt = ctx.dtype(a)
    if dt not in _FLOATS or ctx.dtype(b) != dt:
        return None
    a_shape, b_shape = ctx.shape(a), ctx.shape(b)
    is_gemm = node.op_type == "Gemm"
    two_d = a_shape is not None and b_shape is not None and len(a_shape) == 2 and len(b_shape) == 2
    if not is_gemm and not two_d:
        nxt = _sole_consumer(node.outputs[0])
        if nxt is not None and _is(nxt, "Add", "BatchNormalization"):
            ctx.refusals.append(f"{node.name}: MatMul operands are not both known rank 2 (Gemm needs 2-D)")
        return None
    trans_a = int(_attr(node, "transA", 0)) if is_gemm else 0
    trans_b = int(_attr(node, "transB", 0)) if is_gemm else 0
    m = n = None
    if two_d:
        m = a_shape[1] if trans_a else a_shape[0]
        n = b_shape[0] if trans_b else b_shape[1]
    wc = ctx.constant(b)
    if wc is not None and wc.ndim == 2:
        n = wc.shape[0] if trans_b else wc.shape[1]
    rules = ctx.rules
    cur = node.outputs[0]
    nodes = [node]
    add_node = bn_node = None
    c_value = None
    bn_fold = None
    reason = ""
    nxt = _sole_consumer(cur)
    if nxt is not None and ctx.free([nxt]):
        if not is_gemm and _is(nxt, "Add") and "matmul_add_gemm" in rules:
            others = [v for v in nxt.inputs if v is not cur]
            if len(nxt.inputs) == 2 and len(others) == 1 and ctx.dtype(others[0]) == dt:
                cs = ctx.shape(others[0])
                if cs is not None and None not in cs and _bias_ok_for(cs, m, n):
                    add_node, c_value = nxt, others[0]
                else:
                    reason = f"Add operand shape {cs} is not broadcastable to (M, N) = ({m}, {n})"
                    ctx.refusals.append(f"{node.name}: {reason}")
        elif _is(nxt, "BatchNormalization") and ("gemm_bn" if is_gemm else "matmul_bn") in rules \
                and nxt.inputs[0] is cur and isinstance(n, int):
            try:
                ok, why = conv_bn_verdict(ctx.graph, node, nxt, ctx.shapes())
                if not ok:
                    raise _Refused(why)
                w = ctx.constant(b)
                if w is None:
                    raise _Refused("weight is not a constant")
                c = None
                if is_gemm and len(node.inputs) > 2 and node.inputs[2] is not None:
                    c = ctx.constant(node.inputs[2])
                    if c is None:
                        raise _Refused("Gemm C is not a constant")
                s, t = _bn_scale_shift(ctx, nxt, n, w.dtype)
                folded = derive.fold_gemm_bn(w, None, s, t, np.zeros(n), np.ones(n), 0.0, trans_b=bool(trans_b))
                beta = float(_attr(node, "beta", 1.0)) if is_gemm else 1.0
                new_c = t if c is None else beta * c.astype(np.float64) * s + t
                if folded.overflow or not np.all(np.isfinite(new_c)) or np.any(np.abs(new_c) > np.finfo(w.dtype).max):
                    raise _Refused(f"folded weights overflow {w.dtype}")
                bn_node, bn_fold = nxt, (folded.weight, new_c.astype(w.dtype))
            except _Refused as exc:
                reason = f"BN not folded: {exc}"
                ctx.refusals.append(f"{node.name}: {reason}")
    if add_node is not None or bn_node is not None:
        nodes.append(add_node or bn_node)
        cur = nodes[-1].outputs[0]
    act = None
    if "gemm_act" in rules and ctx.lower != "onnx" and dt == _F32:
        nxt = _sole_consumer(cur)
        if nxt is not None and ctx.free([nxt]):
            found = _activation(ctx, nxt, dt, FUSED_GEMM_ACTIVATIONS)
            if found is not None and found[0] != "Clip":
                act = found
                nodes.append(nxt)
    if len(nodes) == 1:
        return None
    if is_gemm and act is None and bn_node is None:
        return None
    if act is not None:
        rule = "gemm_act"
    elif bn_node is not None:
        rule = "gemm_bn" if is_gemm else "matmul_bn"
    else:
        rule = "matmul_add_gemm"
    lowered = "com.microsoft:FusedGemm" if act else "Gemm"

    def build() -> list[ir.Node]:
        attrs = _copy_attrs(node) if is_gemm else {}
        inputs = [a]
        if bn_fold is not None:
            inputs += [ctx.new_initializer(f"{node.name}_W_fused", bn_fold[0]),
                       ctx.new_initializer(f"{node.name}_C_fused", bn_fold[1])]
            attrs["beta"] = 1.0
        else:
            inputs.append(b)
            if add_node is not None:
                inputs.append(c_value)
            elif is_gemm and len(node.inputs) > 2 and node.inputs[2] is not None:
                inputs.append(node.inputs[2])
        if act is None:
            return [_new_node(ctx, "Gemm", inputs, attrs, name=f"{node.name}_gemm")]
        op, params = act
        attrs["activation"] = op
        for k, v in params.items():
            attrs[f"activation_{k}"] = float(v)
        return [_new_node(ctx, "FusedGemm", inputs, attrs, domain="com.microsoft", name=f"{node.name}_fused")]

    return _Match(rule, nodes, build, lowered, reason or "rank-2 operands; bias broadcasts to (M, N); single consumers")


# --------------------------------------------------------------------------------------------------
# GELU: x * 0.5 * (1 + erf(x / sqrt 2))  (and Add + GELU -> BiasGelu)
# --------------------------------------------------------------------------------------------------

def _other(node: ir.Node, value: ir.Value) -> ir.Value | None:
    if len(node.inputs) != 2 or sum(v is value for v in node.inputs) != 1:
        return None
    return node.inputs[1] if node.inputs[0] is value else node.inputs[0]


def _match_gelu_core(ctx: _Context, erf: ir.Node) -> tuple[list[ir.Node], ir.Value] | None:
    """(nodes in order, x) for a decomposed erf-GELU whose Erf is `erf`."""
    if not _is(erf, "Erf") or erf.inputs[0] is None:
        return None
    scale = erf.inputs[0].producer()
    if not _is(scale, "Div", "Mul") or _sole_consumer(scale.outputs[0]) is not erf:
        return None
    x = scale.inputs[0]
    c = ctx.constant(scale.inputs[1]) if len(scale.inputs) == 2 else None
    if c is None or x is None:
        return None
    if not (_close(c, math.sqrt(2.0)) if scale.op_type == "Div" else _close(c, 1 / math.sqrt(2.0))):
        return None
    add = _sole_consumer(erf.outputs[0])
    if not _is(add, "Add") or not _close(ctx.constant(_other(add, erf.outputs[0])) if _other(add, erf.outputs[0]) is not None else None, 1.0):
        return None
    m1 = _sole_consumer(add.outputs[0])
    if not _is(m1, "Mul"):
        return None
    o = _other(m1, add.outputs[0])
    if o is None:
        return None
    nodes = [scale, erf, add, m1]
    if o is x:  # (x * (1 + erf)) * 0.5
        m2 = _sole_consumer(m1.outputs[0])
        if not _is(m2, "Mul") or not _close(ctx.constant(_other(m2, m1.outputs[0])) if _other(m2, m1.outputs[0]) is not None else None, 0.5):
            return None
        nodes.append(m2)
    elif o.producer() is not None and _is(o.producer(), "Mul") and _close(ctx.constant(_other(o.producer(), x)) if _other(o.producer(), x) is not None else None, 0.5) \
            and _sole_consumer(o) is m1:  # (x * 0.5) * (1 + erf)
        nodes.insert(0, o.producer())
    elif _close(ctx.constant(o), 0.5):  # ((1 + erf) * 0.5) * x
        m2 = _sole_consumer(m1.outputs[0])
        if not _is(m2, "Mul") or _other(m2, m1.outputs[0]) is not x:
            return None
        nodes.append(m2)
    else:
        return None
    dt = ctx.dtype(x)
    if dt not in _FLOATS:
        return None
    return nodes, x


def _gelu_target(ctx: _Context, dt) -> tuple[str, str] | None:
    if dt != _F32:
        return None
    if ctx.graph.opset >= 20:
        return "Gelu", ""
    if ctx.lower != "onnx" and dt == _F32:
        return "Gelu", "com.microsoft"
    return None


def _match_gelu(ctx: _Context, erf: ir.Node) -> _Match | None:
    core = _match_gelu_core(ctx, erf)
    if core is None:
        return None
    nodes, x = core
    if not ctx.free(nodes):
        return None
    dt = ctx.dtype(x)
    bias = _bias_before(ctx, x, nodes, dt) if "bias_gelu" in ctx.rules and ctx.lower != "onnx" and dt == _F32 else None
    if bias is not None:
        return _bias_op_match(ctx, "bias_gelu", "BiasGelu", bias, nodes,
                              "Add of a 1-D bias over the last axis, then erf-GELU")
    if "gelu" not in ctx.rules:
        return None
    target = _gelu_target(ctx, dt)
    if target is None:
        ctx.refusals.append(f"{erf.name}: no Gelu op for opset {ctx.graph.opset} with lower={ctx.lower!r}")
        return None
    op, dom = target

    def build() -> list[ir.Node]:
        return [_new_node(ctx, op, [x], {}, domain=dom, name=f"{erf.name}_gelu")]
    return _Match("gelu", nodes, build, f"{dom}:{op}" if dom else op, "x * 0.5 * (1 + erf(x / sqrt 2)) with single-consumer intermediates")


def _bias_before(ctx: _Context, x: ir.Value, readers: list[ir.Node], dt) -> tuple[ir.Node, ir.Value, ir.Value] | None:
    """(Add, input, bias) when x = Add(input, 1-D bias over the last axis) is read only by `readers`."""
    add = x.producer()
    if not _is(add, "Add") or len(add.inputs) != 2 or not ctx.free([add]) or not _only_read_by(x, readers):
        return None
    for inp, b in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        if inp is None or b is None or ctx.dtype(b) != dt or ctx.dtype(inp) != dt:
            continue
        bs, shape = ctx.shape(b), ctx.shape(inp)
        if bs is None or len(bs) != 1 or not isinstance(bs[0], int) or not shape or len(shape) < 2:
            continue
        if shape[-1] == bs[0]:  # the input keeps its shape: the bias only broadcasts over leading axes
            return add, inp, b
    return None


def _bias_op_match(ctx: _Context, rule: str, op: str, bias: tuple, nodes: list[ir.Node], reason: str) -> _Match:
    """`bias` = (Add, input, 1-D bias) before a GELU made of `nodes` -> one com.microsoft `op`(input, bias)."""
    add, inp, b = bias

    def build() -> list[ir.Node]:
        return [_new_node(ctx, op, [inp, b], {}, domain="com.microsoft", name=f"{add.name}_{op.lower()}")]
    return _Match(rule, [add] + list(nodes), build, f"com.microsoft:{op}", reason)


def _match_gelu_node(ctx: _Context, gelu: ir.Node) -> _Match | None:
    """An existing Gelu after a bias Add: contrib or opset-20 exact Gelu -> BiasGelu, opset-20 tanh Gelu -> FastGelu."""
    if ctx.lower == "onnx" or gelu.op_type != "Gelu" or gelu.domain not in _DEFAULT + ("com.microsoft",):
        return None
    approx = str(_attr(gelu, "approximate", "none")) if gelu.domain in _DEFAULT else "none"
    if approx not in ("none", "tanh"):
        return None
    rule, op = ("fast_gelu", "FastGelu") if approx == "tanh" else ("bias_gelu", "BiasGelu")
    x = gelu.inputs[0]
    dt = ctx.dtype(x) if x is not None else None
    if rule not in ctx.rules or x is None or dt != _F32 or not ctx.free([gelu]):
        return None
    found = _bias_before(ctx, x, [gelu], dt)
    if found is None:
        return None
    return _bias_op_match(ctx, rule, op, found, [gelu], f"Add of a 1-D constant bias, then Gelu ({approx})")


# --------------------------------------------------------------------------------------------------
# tanh-GELU: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), however it is written
# --------------------------------------------------------------------------------------------------

#: ops whose result is a polynomial in their inputs (with scalar constants); Cast only to the same type
_POLY_OPS = {"Mul", "Add", "Sub", "Div", "Pow", "Cast", "Identity"}
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_FAST_GELU_CUBIC = 0.044715

Poly = dict  # {(power of x, power of t): coefficient}


def _pmul(a: Poly, b: Poly) -> Poly:
    out: Poly = {}
    for (i, j), c in a.items():
        for (k, m), d in b.items():
            out[(i + k, j + m)] = out.get((i + k, j + m), 0.0) + c * d
    return out


def _padd(a: Poly, b: Poly, sign: float = 1.0) -> Poly:
    out = dict(a)
    for key, c in b.items():
        out[key] = out.get(key, 0.0) + sign * c
    return {k: v for k, v in out.items() if v != 0.0}


def _poly_is(p: Poly, want: dict, rtol: float = 1e-3) -> bool:
    """Whether polynomial `p` has exactly the terms of `want`, each coefficient within rtol."""
    p = {k: v for k, v in p.items() if abs(v) > 1e-9}
    return set(p) == set(want) and all(math.isclose(p[k], want[k], rel_tol=rtol) for k in want)


class _PolyOf:
    """Multiplies out the polynomial in one variable `x` that a value computes, collecting the nodes used.

    Only elementwise Mul/Add/Sub/Div-by-constant/Pow-by-small-integer/same-type Cast of `x` and scalar
    constants expand; anything else fails (None). Exact algebra, so a match is a proof, not a pattern.
    """

    def __init__(self, ctx: _Context, x: ir.Value, dt):
        self.ctx, self.x, self.dt = ctx, x, dt
        self.nodes: list[ir.Node] = []
        self.memo: dict[int, Poly | None] = {}

    def of(self, v: ir.Value | None, depth: int = 0) -> Poly | None:
        if v is None or depth > 16:
            return None
        if v is self.x:
            return {(1, 0): 1.0}
        if id(v) in self.memo:
            return self.memo[id(v)]
        c = self.ctx.constant(v)
        if c is not None:
            result = {(0, 0): float(c.reshape(-1)[0])} if c.size == 1 and c.dtype == self.dt else None
        else:
            result = self._node(v.producer(), depth)
        self.memo[id(v)] = result
        return result

    def _node(self, n: ir.Node | None, depth: int) -> Poly | None:
        if n is None or n.domain not in _DEFAULT or n.op_type not in _POLY_OPS or len(n.outputs) != 1 or \
                not self.ctx.free([n]):
            return None
        if n.op_type in ("Cast", "Identity"):
            if n.op_type == "Cast" and self.ctx.dtype(n.outputs[0]) != self.dt:
                return None
            r = self.of(n.inputs[0], depth + 1)
        elif len(n.inputs) != 2:
            return None
        else:
            a = self.of(n.inputs[0], depth + 1)
            if a is None:
                return None
            if n.op_type in ("Div", "Pow"):
                k = self.ctx.constant(n.inputs[1])
                if k is None or k.size != 1:
                    return None
                k = float(k.reshape(-1)[0])
                if n.op_type == "Div":
                    r = None if k == 0.0 else {key: c / k for key, c in a.items()}
                else:
                    r = None if k not in (1.0, 2.0, 3.0) else a
                    for _ in range(int(k) - 1 if r is not None else 0):
                        r = _pmul(r, a)
            else:
                b = self.of(n.inputs[1], depth + 1)
                if b is None:
                    return None
                r = _pmul(a, b) if n.op_type == "Mul" else _padd(a, b, 1.0 if n.op_type == "Add" else -1.0)
        if r is not None and n not in self.nodes:
            self.nodes.append(n)
        return r


def _gelu_leaves(ctx: _Context, start: ir.Value) -> list[ir.Value]:
    """Candidate x values behind `start`: non-constant inputs reachable through polynomial ops, nearest first."""
    seen, order, frontier = set(), [], [start]
    while frontier and len(order) < 32:
        nxt = []
        for v in frontier:
            n = v.producer()
            if n is None or n.domain not in _DEFAULT or n.op_type not in _POLY_OPS:
                continue
            for i in n.inputs:
                if i is not None and id(i) not in seen and ctx.constant(i) is None:
                    seen.add(id(i))
                    order.append(i)
                    nxt.append(i)
        frontier = nxt
    return order


def _match_fast_gelu(ctx: _Context, tanh: ir.Node) -> _Match | None:
    if "fast_gelu" not in ctx.rules or not _is(tanh, "Tanh") or tanh.inputs[0] is None or not ctx.free([tanh]):
        return None
    dt = ctx.dtype(tanh.inputs[0])
    if dt != _F32:
        return None
    inner_want = {(1, 0): _SQRT_2_OVER_PI, (3, 0): _SQRT_2_OVER_PI * _FAST_GELU_CUBIC}
    for x in _gelu_leaves(ctx, tanh.inputs[0]):
        inner = _PolyOf(ctx, x, dt)
        if ctx.dtype(x) != dt or not _poly_is(inner.of(tanh.inputs[0]) or {}, inner_want):
            continue
        # outward from tanh: follow single consumers until the value is 0.5 * x * (1 + t)
        outer = _PolyOf(ctx, x, dt)
        cur, poly, chain = tanh.outputs[0], {(0, 1): 1.0}, []
        for _ in range(6):
            n = _sole_consumer(cur)
            if n is None or n.domain not in _DEFAULT or n.op_type not in ("Mul", "Add", "Sub", "Div", "Cast") or \
                    not ctx.free([n]) or len(n.outputs) != 1:
                break
            if n.op_type == "Cast":
                if ctx.dtype(n.outputs[0]) != dt:
                    break
            else:
                other = _other(n, cur)
                o = outer.of(other) if other is not None else None
                if o is None or any(j for (_, j) in o):
                    break
                if n.op_type == "Mul":
                    poly = _pmul(poly, o)
                elif n.op_type == "Div":
                    if n.inputs[0] is not cur or set(o) != {(0, 0)} or o[(0, 0)] == 0.0:
                        break
                    poly = {k: c / o[(0, 0)] for k, c in poly.items()}
                elif n.op_type == "Add":
                    poly = _padd(poly, o)
                else:  # Sub(cur, other) or Sub(other, cur)
                    poly = _padd(poly, o, -1.0) if n.inputs[0] is cur else _padd(o, poly, -1.0)
            chain.append(n)
            cur = n.outputs[0]
            if _poly_is(poly, {(1, 0): 0.5, (1, 1): 0.5}, rtol=1e-6):
                nodes = list(dict.fromkeys(inner.nodes + [tanh] + outer.nodes + chain))
                return _fast_gelu_match(ctx, nodes, x, dt)
        return None
    return None


def _fast_gelu_match(ctx: _Context, nodes: list[ir.Node], x: ir.Value, dt) -> _Match | None:
    bias = _bias_before(ctx, x, nodes, dt) if ctx.lower != "onnx" else None
    if bias is not None:
        return _bias_op_match(ctx, "fast_gelu", "FastGelu", bias, nodes,
                              "Add of a 1-D bias over the last axis, then tanh-GELU (polynomials multiplied out)")
    if ctx.lower == "onnx":
        if ctx.graph.opset < 20:
            ctx.refusals.append(f"{nodes[0].name}: tanh-GELU has no standard op below opset 20")
            return None
        op, dom, attrs = "Gelu", "", {"approximate": "tanh"}
    else:
        op, dom, attrs = "FastGelu", "com.microsoft", {}

    def build() -> list[ir.Node]:
        return [_new_node(ctx, op, [x], attrs, domain=dom, name=f"{nodes[-1].name}_fastgelu")]
    return _Match("fast_gelu", nodes, build, f"{dom}:{op}" if dom else f"{op}(tanh)",
                  "0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), polynomials multiplied out")


# --------------------------------------------------------------------------------------------------
# LayerNorm: mean -> sub -> pow 2 -> mean -> + eps -> sqrt -> div -> * gamma -> + beta
# --------------------------------------------------------------------------------------------------

def _reduce_last_axis(ctx: _Context, node: ir.Node, rank: int | None) -> bool:
    if not _is(node, "ReduceMean") or int(_attr(node, "keepdims", 1)) != 1:
        return False
    if ctx.graph.opset >= 18:
        axes = ctx.constant(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    else:
        axes = _attr(node, "axes", None)
    if axes is None:
        return False
    axes = [int(a) for a in np.asarray(list(axes) if not isinstance(axes, np.ndarray) else axes).reshape(-1)]
    return axes == [-1] or (rank is not None and axes == [rank - 1])


def _match_layernorm_core(ctx: _Context, mean: ir.Node):
    """(nodes, x, gamma, beta, eps) of a decomposed LayerNorm whose first ReduceMean is `mean`."""
    x = mean.inputs[0] if mean.inputs else None
    if x is None:
        return None
    rank = ctx.rank(x)
    if not _reduce_last_axis(ctx, mean, rank):
        return None
    sub = _sole_consumer(mean.outputs[0])
    if not _is(sub, "Sub") or sub.inputs[0] is not x or sub.inputs[1] is not mean.outputs[0]:
        return None
    d = sub.outputs[0]
    readers = _consumers(d)
    if d.is_graph_output() or len(readers) != 2 or len(list(d.uses())) not in (2, 3):
        return None
    sq = next((n for n in readers if _is(n, "Pow") or (_is(n, "Mul") and n.inputs[0] is d and n.inputs[1] is d)), None)
    div = next((n for n in readers if _is(n, "Div") and n.inputs[0] is d), None)
    if sq is None or div is None:
        return None
    if sq.op_type == "Pow" and (sq.inputs[0] is not d or not _close(ctx.constant(sq.inputs[1]), 2.0)):
        return None
    var = _sole_consumer(sq.outputs[0])
    if var is None or not _reduce_last_axis(ctx, var, rank):
        return None
    add = _sole_consumer(var.outputs[0])
    if not _is(add, "Add"):
        return None
    eps_v = _other(add, var.outputs[0])
    eps = ctx.constant(eps_v) if eps_v is not None else None
    if eps is None or eps.size != 1 or not float(eps.reshape(-1)[0]) > 0:
        return None
    sqrt = _sole_consumer(add.outputs[0])
    if not _is(sqrt, "Sqrt") or _sole_consumer(sqrt.outputs[0]) is not div or div.inputs[1] is not sqrt.outputs[0]:
        return None
    nodes = [mean, sub, sq, var, add, sqrt, div]
    gamma = beta = None
    cur = div.outputs[0]
    x_shape = ctx.shape(x)
    h = x_shape[-1] if x_shape else None
    if not isinstance(h, int):
        return None

    def vector(v):  # a 1-D tensor of length H (a constant or a run-time input of known shape)
        return v is not None and ctx.shape(v) == (h,) and ctx.dtype(v) == ctx.dtype(x)

    mul = _sole_consumer(cur)
    if _is(mul, "Mul") and vector(_other(mul, cur)):
        gamma, cur = _other(mul, cur), mul.outputs[0]
        nodes.append(mul)
        badd = _sole_consumer(cur)
        if _is(badd, "Add") and vector(_other(badd, cur)):
            beta = _other(badd, cur)
            nodes.append(badd)
    dt = ctx.dtype(x)
    if dt not in (_F32, np.dtype(np.float16)):
        return None
    return nodes, x, gamma, beta, float(eps.reshape(-1)[0])


def _match_layernorm(ctx: _Context, mean: ir.Node) -> _Match | None:
    core = _match_layernorm_core(ctx, mean)
    if core is None or not ctx.free(core[0]):
        return None
    nodes, x, gamma, beta, eps = core
    if gamma is None:
        return None  # plain normalisation without scale: left alone (rare; needs a ones initializer)
    skip = None
    if "skip_layernorm" in ctx.rules and ctx.lower != "onnx":
        skip = _skip_add(ctx, x, [nodes[0], nodes[1]])
    if skip is not None:
        add, a, b = skip

        def build_skip() -> list[ir.Node]:
            ins = [a, b, gamma] + ([beta] if beta is not None else [])
            return [_new_node(ctx, "SkipLayerNormalization", ins, {"epsilon": eps}, domain="com.microsoft",
                              name=f"{add.name}_skipln")]
        return _Match("skip_layernorm", [add] + nodes, build_skip, "com.microsoft:SkipLayerNormalization",
                      "Add of two same-shape tensors, then LayerNorm over the last axis")
    if "layernorm" not in ctx.rules:
        return None
    if ctx.graph.opset < 17:
        ctx.refusals.append(f"{mean.name}: LayerNormalization needs opset 17 (model has {ctx.graph.opset})")
        return None

    def build() -> list[ir.Node]:
        ins = [x, gamma] + ([beta] if beta is not None else [])
        return [_new_node(ctx, "LayerNormalization", ins, {"axis": -1, "epsilon": eps}, name=f"{mean.name}_layernorm")]
    return _Match("layernorm", nodes, build, "LayerNormalization", "mean/variance over the last axis, constant gamma/beta")


def _skip_add(ctx: _Context, x: ir.Value, readers: list[ir.Node]):
    add = x.producer()
    if not _is(add, "Add") or len(add.inputs) != 2 or not ctx.free([add]) or not _only_read_by(x, readers):
        return None
    a, b = add.inputs
    if a is None or b is None or ctx.constant(a) is not None or ctx.constant(b) is not None:
        return None
    sa, sb = ctx.shape(a), ctx.shape(b)
    if sa is None or sb is None or sa != sb or None in sa or len(sa) not in (2, 3):
        return None
    if ctx.dtype(a) != _F32 or ctx.dtype(b) != _F32:
        return None
    return add, a, b


def _match_ln_node(ctx: _Context, ln: ir.Node) -> _Match | None:
    """An existing LayerNormalization after a residual Add -> SkipLayerNormalization."""
    if "skip_layernorm" not in ctx.rules or ctx.lower == "onnx" or not _is(ln, "LayerNormalization"):
        return None
    if len(ln.inputs) < 2 or any(o.name and (o.uses() or o.is_graph_output()) for o in ln.outputs[1:]):
        return None
    x, gamma = ln.inputs[0], ln.inputs[1]
    beta = ln.inputs[2] if len(ln.inputs) > 2 else None
    rank = ctx.rank(x) if x is not None else None
    axis = int(_attr(ln, "axis", -1))
    if x is None or rank is None or axis not in (-1, rank - 1):
        return None
    gs = ctx.shape(gamma) if gamma is not None else None
    if gs is None or len(gs) != 1 or (beta is not None and ctx.shape(beta) != gs):
        return None
    skip = _skip_add(ctx, x, [ln])
    if skip is None or not ctx.free([ln]):
        return None
    add, a, b = skip
    eps = float(_attr(ln, "epsilon", 1e-5))

    def build() -> list[ir.Node]:
        ins = [a, b, gamma] + ([beta] if beta is not None else [])
        return [_new_node(ctx, "SkipLayerNormalization", ins, {"epsilon": eps}, domain="com.microsoft",
                          name=f"{add.name}_skipln")]
    return _Match("skip_layernorm", [add, ln], build, "com.microsoft:SkipLayerNormalization",
                  "Add of two same-shape tensors, then LayerNormalization over the last axis")


# --------------------------------------------------------------------------------------------------
# SiLU: x * sigmoid(x) -> QuickGelu(alpha=1)
# --------------------------------------------------------------------------------------------------

def _match_silu(ctx: _Context, sig: ir.Node) -> _Match | None:
    if "silu" not in ctx.rules or ctx.lower == "onnx" or not _is(sig, "Sigmoid") or sig.inputs[0] is None:
        return None
    x = sig.inputs[0]
    if ctx.dtype(x) != _F32:
        return None
    mul = _sole_consumer(sig.outputs[0])
    if not _is(mul, "Mul") or _other(mul, sig.outputs[0]) is not x or not ctx.free([sig, mul]):
        return None

    def build() -> list[ir.Node]:
        return [_new_node(ctx, "QuickGelu", [x], {"alpha": 1.0}, domain="com.microsoft", name=f"{sig.name}_silu")]
    return _Match("silu", [sig, mul], build, "com.microsoft:QuickGelu", "x * sigmoid(x) with a single-consumer sigmoid")


# --------------------------------------------------------------------------------------------------
# plan / apply
# --------------------------------------------------------------------------------------------------

def _options(rules, lower) -> tuple[set[str], str]:
    if lower not in LOWERINGS:
        raise ValueError(f"unknown lowering {lower!r}; choose from {', '.join(LOWERINGS)}")
    if rules is None:
        return set(DEFAULT_RULES), lower
    if isinstance(rules, str):
        rules = [r.strip() for r in rules.split(",") if r.strip()]
    unknown = sorted(set(rules) - set(RULES))
    if unknown:
        raise ValueError(f"unknown vertical rule(s) {unknown}; choose from {', '.join(RULES)}")
    return set(rules), lower


def _find(ctx: _Context) -> list[_Match]:
    """All non-overlapping matches, in a fixed priority order (norms, GELU, conv, pool, linear, SiLU)."""
    order = ctx.graph.topological_order()
    matches: list[_Match] = []
    passes = (
        (("ReduceMean",), _match_layernorm), (("LayerNormalization",), _match_ln_node),
        (("Erf",), _match_gelu), (("Gelu",), _match_gelu_node), (("Tanh",), _match_fast_gelu),
        (("Conv", "ConvTranspose"), _match_conv), (("AveragePool", "MaxPool"), _match_pool),
        (("MatMul", "Gemm"), _match_linear),
        (("Sigmoid",), _match_silu),
    )
    for ops, matcher in passes:
        for node in order:
            if node.op_type not in ops or id(node) in ctx.claimed:
                continue
            m = matcher(ctx, node)
            if m is None or not ctx.free(m.nodes):
                continue
            if not all(_only_read_by(o, m.nodes) for n in m.nodes[:-1] for o in n.outputs if o.name):
                continue  # an intermediate escapes the group
            if any(o.name and (o.uses() or o.is_graph_output()) for o in m.nodes[-1].outputs[1:]):
                continue
            ctx.claimed.update(id(n) for n in m.nodes)
            matches.append(m)
    pos = {id(n): i for i, n in enumerate(order)}
    for m in matches:
        m.nodes.sort(key=lambda n: pos[id(n)])
    matches.sort(key=lambda m: pos[id(m.nodes[0])])
    return matches


def _working_graph(graph: Graph) -> Graph:
    """The graph plans are computed on: a cleaned copy when clean-up would change anything."""
    if not cleanup.needed(graph):
        return graph
    work = graph.copy()
    cleanup.clean(work)
    return work


def plan(graph: Graph, *, rules: Iterable[str] | str | None = None, lower: str = "runtime",
         dims: dict[str, int] | None = None, **_options_ignored) -> FusionPlan:
    """Find vertical fusion groups (the graph is not changed)."""
    rule_set, lower = _options(rules, lower)
    work = _working_graph(graph)
    ctx = _Context(work, rule_set, lower, dims)
    result = FusionPlan(model=graph.name)
    for i, m in enumerate(_find(ctx)):
        inner = [o for n in m.nodes[:-1] for o in n.outputs if o.name]
        saved = 2 * sum(_nbytes(ctx, v) for v in inner)
        lowered = m.lowered_to
        if lower == "functions" and not m.kernel:
            lowered = "function"
        result.add(FusionGroup(
            id=f"v{i}", kind=VERTICAL, rule=m.rule, nodes=list(m.key), op_types=[n.op_type for n in m.nodes],
            saved_bytes=int(saved), saved_launches=len(m.nodes) - (2 if "+" in m.lowered_to else 1),
            lowered_to=lowered, reason=m.reason, extra={"kernel": m.kernel, **{k: v for k, v in m.extra.items() if v}},
        ))
    result.notes.extend(f"vertical: not fused: {r}" for r in sorted(set(ctx.refusals)))
    return result


def apply(graph: Graph, plan: FusionPlan, *, rules: Iterable[str] | str | None = None, lower: str = "runtime",
          dims: dict[str, int] | None = None, **_options_ignored) -> None:
    """Rewrite `graph` in place for the plan's vertical groups (each re-checked before rewriting)."""
    rule_set, lower = _options(rules, lower)
    wanted = {tuple(g.nodes): g for g in plan if g.kind == VERTICAL}
    if not wanted:
        return
    cleanup.clean(graph)
    ctx = _Context(graph, rule_set, lower, dims)
    found = {m.key: m for m in _find(ctx)}
    g = graph.graph
    functions: list[str] = []
    replaced: dict[int, ir.Value] = {}  # values earlier rewrites retired -> their replacements
    for key, group in wanted.items():
        m = found.get(key)
        if m is None:
            plan.notes.append(f"vertical: group {group.id} no longer matches; left alone")
            group.lowered_to = "not applied"
            continue
        new_nodes = m.build()
        for n in new_nodes:
            for i, v in enumerate(n.inputs):
                if v is not None and id(v) in replaced:
                    while id(v) in replaced:
                        v = replaced[id(v)]
                    n.replace_input_with(i, v)
        last = m.nodes[-1]
        out = last.outputs[0]
        new_out = new_nodes[-1].outputs[0]
        new_out.type, new_out.shape = out.type, out.shape
        g.insert_before(last, new_nodes)
        name = out.name
        out.name = f"{name}__replaced"
        out.replace_all_uses_with(new_out, replace_graph_outputs=True)
        new_out.name = name
        replaced[id(out)] = new_out
        for n in new_nodes[:-1]:
            for o in n.outputs:
                o.name = ctx.fresh(f"{name}__{n.op_type.lower()}")
        g.remove(m.nodes, safe=True)
        group.extra["fused_nodes"] = [n.name for n in new_nodes]
        if lower == "functions" and not m.kernel:
            functions.append(group.id)
    cleanup.remove_dead(graph)
    _import_domains(graph)
    if functions:
        from ..lower import to_functions

        to_functions(graph, plan, groups=functions)


def _import_domains(graph: Graph) -> None:
    imports = graph.graph.opset_imports
    for node in graph.graph:
        if node.domain == "com.microsoft" and "com.microsoft" not in imports:
            imports["com.microsoft"] = 1
