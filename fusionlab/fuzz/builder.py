"""The model under construction: nodes, weights and inputs, with every tensor's shape tracked as it is made.

A `Builder` is what the generator's pattern emitters write into. It knows the model's float dtype and
opset, gives every tensor and node a name, keeps a shape for every tensor (ints and symbolic dim
names), and turns constants into initializers, `Constant` nodes or *overridable* initializers (also
listed as graph inputs) as the generator asks. All randomness comes from the `random.Random` it is given,
so the same seed builds the same model byte for byte.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["Builder", "Shape", "broadcast", "DTYPES", "Pattern", "is_map", "static_last"]

Shape = tuple  # of int | str (a symbolic dim name)

#: numpy dtype -> ONNX element type, for the dtypes the generator uses
DTYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
          np.dtype(np.float64): TensorProto.DOUBLE, np.dtype(np.int64): TensorProto.INT64,
          np.dtype(np.int32): TensorProto.INT32,
          np.dtype(np.bool_): TensorProto.BOOL}


def broadcast(*shapes: Shape) -> Shape:
    """Numpy broadcasting of shapes whose dims are ints or symbolic names (a name beats 1)."""
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        real = [d for d in dims if d != 1]
        if not real:
            out.append(1)
            continue
        if len(set(map(str, real))) > 1:
            raise ValueError(f"shapes {shapes} do not broadcast")
        out.append(real[0])
    return tuple(out)


@dataclass(frozen=True)
class Pattern:
    """One emitter and where it applies: `weight(b, x)` is its relative chance on tensor `x` (0: not here).

    Each emitter module lists its patterns in `PATTERNS`; `generate` draws among the patterns of every module
    in `generate.MODULES` that apply to the tensor at hand. `emit(b, x, pool)` writes into the builder and
    returns the tensor(s) it leaves live.
    """

    emit: Callable
    weight: Callable

    @property
    def name(self) -> str:
        return self.emit.__name__


def static_last(b: "Builder", x: str) -> bool:
    """`x` has a rank and a static last dimension."""
    shape = b.shape(x)
    return bool(shape) and isinstance(shape[-1], int)


def is_map(b: "Builder", x: str) -> bool:
    """`x` is an NCHW map with static C, H and W (the batch may be symbolic)."""
    shape = b.shape(x)
    return len(shape) == 4 and all(isinstance(d, int) for d in shape[1:])


@dataclass
class Builder:
    """Accumulates one ONNX model; `rng` drives every choice."""

    rng: random.Random
    dtype: np.dtype
    opset: int
    nodes: list = field(default_factory=list)
    inits: list = field(default_factory=list)
    inputs: list = field(default_factory=list)          # ValueInfoProtos of real inputs
    overridable: list = field(default_factory=list)     # ValueInfoProtos of initializers that are also inputs
    shapes: dict = field(default_factory=dict)          # tensor name -> Shape
    types: dict = field(default_factory=dict)           # tensor name -> numpy dtype (when not the model's)
    uses: dict = field(default_factory=dict)            # tensor name -> number of reads
    inner: list = field(default_factory=list)           # intermediates of patterns (near-miss targets)
    tags: list = field(default_factory=list)            # what the patterns built, for reports
    weights: dict = field(default_factory=dict)         # (shape, role) -> initializer names, for sharing
    extra_outputs: list = field(default_factory=list)   # tensors that must become graph outputs
    node_style: str = "named"
    near: float = 0.1                                   # probability of each near miss the patterns offer
    _count: int = 0

    def __post_init__(self):
        self.dtype = np.dtype(self.dtype)
        self.np = np.random.default_rng(self.rng.getrandbits(63))

    def miss(self, kind: str) -> bool:
        """Whether to build the near miss `kind` here (the emitter tags what it built)."""
        return self.rng.random() < self.near

    # -- names ---------------------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        self._count += 1
        return f"{base}{self._count}"

    def _node_name(self, op: str) -> str:
        style = self.node_style
        if style == "unnamed" or (style == "some" and self.rng.random() < 0.5):
            return ""
        self._count += 1
        if style == "exporter":
            return f"/{op.lower()}_{self._count}/{op}"
        return f"{op.lower()}_{self._count}"

    # -- values --------------------------------------------------------------------------------------
    def shape(self, name: str) -> Shape:
        return self.shapes[name]

    def dtype_of(self, name: str) -> np.dtype:
        return self.types.get(name, self.dtype)

    def input(self, shape: Shape, base: str = "x", dtype=None) -> str:
        name = self.fresh(base)
        dt = np.dtype(dtype or self.dtype)
        self.inputs.append(helper.make_tensor_value_info(name, DTYPES[dt], list(shape)))
        self.shapes[name] = tuple(shape)
        if dt != self.dtype:
            self.types[name] = dt
        return name

    def rand(self, shape, scale: float = 1.0, positive: bool = False, dtype=None) -> np.ndarray:
        a = self.np.standard_normal(tuple(int(d) for d in shape)) * scale
        if positive:
            a = np.abs(a) + 0.1 * scale
        return a.astype(dtype or self.dtype)

    def const(self, array, base: str = "c", *, form: str | None = None) -> str:
        """A constant tensor: an initializer (default), a Constant node, or an overridable initializer."""
        array = np.asarray(array)
        form = form or "init"
        name = self.fresh(base)
        self.shapes[name] = tuple(array.shape)
        if array.dtype != self.dtype:
            self.types[name] = array.dtype
        tensor = numpy_helper.from_array(array, name)
        if form == "constant":
            self.nodes.append(helper.make_node("Constant", [], [name], name=self._node_name("Constant"), value=tensor))
        else:
            self.inits.append(tensor)
            if form == "overridable":
                self.overridable.append(helper.make_tensor_value_info(name, DTYPES[array.dtype], list(array.shape)))
        return name

    def param(self, array, base: str = "c", *, near_miss: bool = False) -> str:
        """A constant whose form varies: mostly an initializer, sometimes a Constant node; an overridable
        initializer (or a graph input) only as a deliberate near miss."""
        r = self.rng.random()
        if near_miss and r < 0.5:
            return self.const(array, base, form="overridable")
        if near_miss and r < 0.7:
            array = np.asarray(array)
            name = self.input(array.shape, base + "_in", dtype=array.dtype)
            return name
        return self.const(array, base, form="constant" if r > 0.85 else "init")

    def weight(self, shape, base: str, role: str, *, scale: float = 0.5, near_miss: bool = False) -> str:
        """A weight initializer; sometimes shared with an earlier weight of the same shape and role."""
        key = (tuple(shape), role)
        if self.weights.get(key) and self.rng.random() < 0.15:
            self.tags.append("shared_weight")
            return self.rng.choice(self.weights[key])
        name = self.param(self.rand(shape, scale), base, near_miss=near_miss)
        if name in {t.name for t in self.inits}:
            self.weights.setdefault(key, []).append(name)
        return name

    def scalar(self, value: float, base: str = "k", *, rank_up: bool = False, vector: int = 0,
               dtype=None) -> str:
        """A scalar constant: shape (), [1], or (rank_up) [1,1,1]; `vector` gives it shape [vector]."""
        if rank_up:
            shape = (1,) * self.rng.choice((3, 4, 5))
        elif vector:
            shape = (vector,)
        else:
            shape = self.rng.choice(((), (), (1,)))
        return self.const(np.full(shape, value, dtype=dtype or self.dtype), base,
                          form="constant" if self.rng.random() < 0.2 else "init")

    def ints(self, values, base: str = "i") -> str:
        """An int64 1-D constant (pads, axes, shapes), as an initializer or a Constant node."""
        constant = self.opset >= 9 and self.rng.random() < 0.3  # Constant holds only floats before opset 9
        return self.const(np.asarray(values, dtype=np.int64), base, form="constant" if constant else "init")

    # -- nodes ---------------------------------------------------------------------------------------
    def node(self, op: str, inputs, shape: Shape | list, *, n_out: int = 1, domain: str = "", dtype=None,
             **attrs) -> str | list[str]:
        """Add a node; `shape` is its (first) output's shape (a list of shapes for several outputs)."""
        outs = [self.fresh(op.lower()) for _ in range(n_out)]
        for i in inputs:
            if i:
                self.uses[i] = self.uses.get(i, 0) + 1
        node = helper.make_node(op, list(inputs), outs, name=self._node_name(op), domain=domain or None, **attrs)
        self.nodes.append(node)
        shapes = shape if isinstance(shape, list) else [shape]
        for o, s in zip(outs, shapes):
            self.shapes[o] = tuple(s)
            if dtype is not None and np.dtype(dtype) != self.dtype:
                self.types[o] = np.dtype(dtype)
        return outs[0] if n_out == 1 else outs

    def unary(self, op: str, x: str, **attrs) -> str:
        return self.node(op, [x], self.shape(x), **attrs)

    def binary(self, op: str, a: str, b: str, *, swap: bool | None = None) -> str:
        """a <op> b, with operands swapped at random for commutative ops (or when `swap` says so)."""
        if swap is None:
            swap = op in ("Add", "Mul", "Max", "Min") and self.rng.random() < 0.5
        if swap:
            a, b = b, a
        return self.node(op, [a, b], broadcast(self.shape(a), self.shape(b)))

    def mark_inner(self, *names: str) -> None:
        self.inner.extend(n for n in names if n)

    # -- the model -----------------------------------------------------------------------------------
    def value_info(self, name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, DTYPES[self.dtype_of(name)], list(self.shapes[name]))

    def model(self, outputs: list[str], *, ir_version: int, graph_name: str = "fuzz") -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, graph_name, self.inputs + self.overridable,
                                  [self.value_info(o) for o in outputs], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                  producer_name="fusionlab.fuzz")
        model.ir_version = ir_version
        return model
