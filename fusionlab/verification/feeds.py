"""Input draws for a model: symbolic-dim bindings, random inputs, and overridden initializers.

A *draw* binds every symbolic dim to a size, fills every real input with random values, and (in some
draws) gives every overridable float initializer — an initializer also listed as a graph input — a new
value, as a user feeding it would. The generator validates its models on the same draws the oracle uses,
so a model that cannot run under a binding is never handed to the oracle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

__all__ = ["Draw", "draws", "symbolic_dims", "overridable", "feeds_for", "session", "NP_TYPES", "SIZES", "SCALES"]

NP_TYPES = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16,
            onnx.TensorProto.DOUBLE: np.float64, onnx.TensorProto.INT64: np.int64,
            onnx.TensorProto.INT32: np.int32, onnx.TensorProto.BOOL: np.bool_}

#: input scale of draw k (cycled): unsaturated activations show precision loss that saturated ones hide
SCALES = (1.0, 0.3, 2.0, 0.1)
#: sizes the k-th symbolic dim (sorted by name) takes in the two bindings: distinct, so a swapped pair shows
SIZES = ((2, 3, 4, 5), (1, 5, 2, 3))


@dataclass(frozen=True)
class Draw:
    """One set of inputs: which binding, which seed, whether overridable initializers get new values."""

    binding: int
    seed: int
    override: bool = False
    dims: dict = field(default_factory=dict, compare=False)


def symbolic_dims(model: onnx.ModelProto) -> list[str]:
    names = set()
    for vi in model.graph.input:
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param:
                names.add(d.dim_param)
    return sorted(names)


def overridable(model: onnx.ModelProto) -> list[str]:
    """Names of float initializers that are also graph inputs."""
    inits = {t.name: t for t in model.graph.initializer}
    return [i.name for i in model.graph.input
            if i.name in inits and NP_TYPES.get(inits[i.name].data_type, np.int64) in (np.float32, np.float16, np.float64)]


def draws(model: onnx.ModelProto, n: int = 3) -> list[Draw]:
    """`n` draws: binding 0 and 1 alternate when there are symbolic dims; the last overrides (if any)."""
    dims = symbolic_dims(model)
    over = bool(overridable(model))
    out = []
    for k in range(n):
        binding = k % 2 if dims else 0
        sizes = {d: SIZES[binding][i % len(SIZES[binding])] for i, d in enumerate(dims)}
        out.append(Draw(binding, seed=k, override=over and k == n - 1 and n > 1, dims=sizes))
    return out


def _shape(vi: onnx.ValueInfoProto, dims: dict) -> tuple:
    shape = []
    for d in vi.type.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            shape.append(d.dim_value)
        else:
            shape.append(dims.get(d.dim_param, 1))
    return tuple(shape)


def feeds_for(model: onnx.ModelProto, draw: Draw) -> dict[str, np.ndarray]:
    """The inputs of one draw: standard-normal floats, small integers, overridden initializers if asked."""
    rng = np.random.default_rng(1000 + draw.seed)
    inits = {t.name: t for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            if not draw.override or vi.name not in overridable(model):
                continue
            base = numpy_helper.to_array(inits[vi.name])
            # A new value of the same sign pattern and scale: a user's other weights, not garbage.
            new = base * rng.uniform(0.5, 2.0, base.shape) + rng.standard_normal(base.shape) * 0.05
            feeds[vi.name] = np.asarray(new).astype(base.dtype)
            continue
        dt = NP_TYPES.get(vi.type.tensor_type.elem_type, np.float32)
        shape = _shape(vi, draw.dims)
        if np.dtype(dt).kind == "f":
            feeds[vi.name] = np.asarray(rng.standard_normal(shape) * SCALES[draw.seed % len(SCALES)]).astype(dt)
        elif np.dtype(dt).kind == "b":
            feeds[vi.name] = np.ones(shape, dtype=dt)
        else:
            feeds[vi.name] = np.asarray(rng.integers(0, 3, shape)).astype(dt)
    return feeds


def session(model: onnx.ModelProto):
    """An onnxruntime CPU session with optimisations off, one thread, and no log output (what the draws run on)."""

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
