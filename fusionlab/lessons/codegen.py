"""Elementwise fusion that really runs fused: generate one loop for a chain of ONNX elementwise ops.

An unfused chain of elementwise ops makes one pass over memory per op: each op reads its inputs and
writes a full-size intermediate. A fused kernel reads the chain's inputs once, keeps every
intermediate in registers, and writes the outputs once. `compile_chain` turns a set of ONNX
elementwise nodes into Python source for such a loop, compiled with numba (`@njit`, single thread),
so the saving in bytes can be measured, not just counted.

Broadcasting is handled at compile time: adjacent dimensions that every operand treats the same way
(full or broadcast) are merged, so a per-channel constant over NCHW becomes a 3-deep loop over
(N, C, H*W) and a plain chain over same-shaped tensors becomes one flat loop.

Transcendentals. A call to libm (``math.erf``, ``math.exp``, ``math.tanh``) inside the loop stops LLVM
from vectorising it: numba's LLVM has no vector math library here, so with or without fastmath
flags each element pays a scalar call. Float32 kernels therefore compute Erf, Tanh, Exp (and
Sigmoid through Exp) with branch-free polynomial helpers, emitted once above the loop (`_HELPERS`):

* erf: Eigen's and XLA's float32 rational approximation, x*P(x^2)/Q(x^2) with x clamped to [-4, 4];
* tanh: the rational approximation whose coefficients Eigen, XLA and onnxruntime's MLAS share, x clamped to [-9, 9] (MLAS's clamp);
* exp: Cody-Waite range reduction, the Cephes expf polynomial, 2**n built from its float32 bits.

Measured against float64 references on 1e7-point grids (this machine, with FMA; `_FASTMATH`):
max |erf error| 3.8e-7 over [-6, 6] (4.7e-7 where no FMA contraction happens; the approximation
itself, evaluated in float64, is within 6.9e-8: the rest is float32 rounding); max |tanh error|
3.3e-7 over [-10, 10]; max exp relative error 8.5e-8 (at most 3 ulp from numpy's float32 exp) over
[-87, 88.7]; max |sigmoid error| 8.9e-8 over [-30, 30]. tests/test_codegen.py asserts 5e-7, 5e-7,
2e-7 and 2e-7. Special values follow libm: erf(+-inf) = +-1, tanh(+-inf) = +-1, exp(inf) = inf,
exp(-inf) = 0, sigmoid(+-inf) = 1 or 0, and NaN propagates. Float64 kernels call libm (exact, scalar).
"""

from __future__ import annotations

import keyword
import math
import re
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from ..build import make_model, tensor, value_info
from ..cost import calibrate
from ..graph import Graph, load
from ..timing import compare

__all__ = ["SUPPORTED", "FusedKernel", "BytesMoved", "compile_chain", "fuse_elementwise", "chain_model",
           "unfused", "bytes_moved", "LoopComparison", "loop_vs_loop"]

#: op type -> number of tensor operands it takes (Clip bounds and Pow exponents must be constants)
SUPPORTED = {"Add": 2, "Sub": 2, "Mul": 2, "Div": 2, "Relu": 1, "Sigmoid": 1, "Tanh": 1, "Exp": 1, "Erf": 1,
             "Clip": 1, "Neg": 1, "Sqrt": 1, "Pow": 1, "Abs": 1, "Log": 1, "Reciprocal": 1, "Identity": 1}

_COMPILED: dict[str, object] = {}

#: LLVM fast-math flags for the generated code. The loop vectorises with none; "contract" only lets
#: a*b + c become one fused multiply-add (one rounding instead of two), which cuts the helpers'
#: instruction count by about a third and lowers their error. No flag that assumes away NaN/inf or
#: reorders arithmetic ("nnan", "ninf", "reassoc", "afn"): the helpers' range reductions rely on both.
_FASTMATH = {"contract"}

# Vectorisable float32 helpers, emitted once above the loop of a float32 kernel that needs them.
# A libm call (math.erf, math.exp, math.tanh) inside the loop keeps LLVM from vectorising it: with no
# vector math library in numba's LLVM, each element pays one scalar call, fastmath or not. These are
# branch-free (clamps are selects) polynomial forms of the kind Eigen, XLA and onnxruntime's MLAS use;
# their measured errors are in the module docstring and asserted in tests/test_codegen.py.
_HELPERS = {
    "erf": '''
# erf(x): the float32 rational approximation of Eigen and XLA, x * P(x^2) / Q(x^2),
# with x clamped to [-4, 4] (erf(4) rounds to 1 in float32). NaN stays NaN.
ERF_CLAMP = np.float32(4.0)
ERF_A1, ERF_A3 = np.float32(-1.60960333262415e-02), np.float32(-2.95459980854025e-03)
ERF_A5, ERF_A7 = np.float32(-7.34990630326855e-04), np.float32(-5.69250639462346e-05)
ERF_A9, ERF_A11 = np.float32(-2.10102402082508e-06), np.float32(2.77068142495902e-08)
ERF_A13 = np.float32(-2.72614225801306e-10)
ERF_B0, ERF_B2 = np.float32(-1.42647390514189e-02), np.float32(-7.37332916720468e-03)
ERF_B4, ERF_B6 = np.float32(-1.68282697438203e-03), np.float32(-2.13374055278905e-04)
ERF_B8 = np.float32(-1.45660718464996e-05)

def erf(x):
    x = ERF_CLAMP if x > ERF_CLAMP else x  # a select, not a branch; NaN compares false and passes through
    x = -ERF_CLAMP if x < -ERF_CLAMP else x
    x2 = x * x
    p = ((((((ERF_A13 * x2 + ERF_A11) * x2 + ERF_A9) * x2 + ERF_A7) * x2 + ERF_A5) * x2 + ERF_A3)
         * x2 + ERF_A1)
    q = ((((ERF_B8 * x2 + ERF_B6) * x2 + ERF_B4) * x2 + ERF_B2) * x2 + ERF_B0)
    return x * p / q
''',
    "tanh": '''
# tanh(x): the float32 rational approximation whose coefficients Eigen, XLA and onnxruntime (MLAS) share,
# x * P(x^2) / Q(x^2), with x clamped to [-9, 9] as MLAS does (Eigen and XLA clamp near 7.9). NaN stays NaN.
TANH_CLAMP = np.float32(9.0)
TANH_A1, TANH_A3 = np.float32(4.89352455891786e-03), np.float32(6.37261928875436e-04)
TANH_A5, TANH_A7 = np.float32(1.48572235717979e-05), np.float32(5.12229709037114e-08)
TANH_A9, TANH_A11 = np.float32(-8.60467152213735e-11), np.float32(2.00018790482477e-13)
TANH_A13 = np.float32(-2.76076847742355e-16)
TANH_B0, TANH_B2 = np.float32(4.89352518554385e-03), np.float32(2.26843463243900e-03)
TANH_B4, TANH_B6 = np.float32(1.18534705686654e-04), np.float32(1.19825839466702e-06)

def tanh(x):
    x = TANH_CLAMP if x > TANH_CLAMP else x
    x = -TANH_CLAMP if x < -TANH_CLAMP else x
    x2 = x * x
    p = ((((((TANH_A13 * x2 + TANH_A11) * x2 + TANH_A9) * x2 + TANH_A7) * x2 + TANH_A5) * x2 + TANH_A3)
         * x2 + TANH_A1)
    q = (((TANH_B6 * x2 + TANH_B4) * x2 + TANH_B2) * x2 + TANH_B0)
    return x * p / q
''',
    "exp": '''
# exp(x): write x = n*ln2 + r with n an integer and |r| <= ln2/2 (ln2 split in two parts, so n*ln2
# is exact), take e**r from the Cephes expf polynomial and 2**n from its float32 bits, in two
# halves so that subnormal results and overflow to inf come out right. NaN stays NaN.
EXP_LO, EXP_HI = np.float32(-104.0), np.float32(89.0)  # e**x rounds to 0 below, overflows above
EXP_LOG2E = np.float32(1.44269504088896341)
EXP_LN2_HI, EXP_LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)  # ln2 = HI + LO, HI exact
EXP_P0, EXP_P1, EXP_P2 = np.float32(5.0000001201e-1), np.float32(1.6666665459e-1), np.float32(4.1665795894e-2)
EXP_P3, EXP_P4, EXP_P5 = np.float32(8.3334519073e-3), np.float32(1.3981999507e-3), np.float32(1.9875691500e-4)
EXP_HALF, EXP_ONE = np.float32(0.5), np.float32(1.0)
EXP_BIAS, EXP_MANTISSA = np.float32(127.0), np.float32(2.0**23)

def exp(x):
    c = x if x > EXP_LO else EXP_LO  # NaN becomes EXP_LO here, and is put back at the end
    c = c if c < EXP_HI else EXP_HI
    n = np.floor(c * EXP_LOG2E + EXP_HALF)
    r = c - n * EXP_LN2_HI - n * EXP_LN2_LO
    p = ((((((EXP_P5 * r + EXP_P4) * r + EXP_P3) * r + EXP_P2) * r + EXP_P1) * r + EXP_P0) * r * r
         + r + EXP_ONE)
    h = np.floor(n * EXP_HALF)
    two_h = np.int32((h + EXP_BIAS) * EXP_MANTISSA).view(np.float32)  # 2**h: exponent field h + 127
    two_n_h = np.int32((n - h + EXP_BIAS) * EXP_MANTISSA).view(np.float32)  # 2**(n - h)
    y = p * two_h * two_n_h
    return y if x == x else x
''',
}


# --------------------------------------------------------------------------------------------------
# the chain as plain data
# --------------------------------------------------------------------------------------------------

@dataclass
class _Op:
    op: str
    out: str
    args: list[tuple[str, object]]  # ("in"|"val"|"const", name) or ("scalar", float)
    lo: float | None = None
    hi: float | None = None
    exponent: float | None = None


@dataclass
class BytesMoved:
    """Bytes read and written by the unfused chain (one pass per op) and by the fused kernel (one pass)."""

    before: int
    after: int

    @property
    def ratio(self) -> float:
        """before / after: the speedup a purely memory-bound chain can expect from fusion."""
        return self.before / self.after if self.after else float("inf")

    def __str__(self) -> str:
        unit, scale = ("MiB", 2**20) if self.before >= 2**20 else ("KiB", 1024)
        return (f"unfused {self.before / scale:.1f} {unit}, fused {self.after / scale:.1f} {unit} "
                f"({self.ratio:.2f}x less traffic)")


def _const_of(v: ir.Value) -> np.ndarray | None:
    """The constant a value holds (initializer that is not a graph input, or a Constant node), else None."""
    if v.is_graph_input():
        return None
    if v.const_value is not None:
        return v.const_value.numpy()
    p = v.producer()
    if p is not None and p.op_type == "Constant":
        for key in ("value", "value_float", "value_floats"):
            if key in p.attributes:
                attr = p.attributes[key]
                return attr.as_tensor().numpy() if key == "value" else np.asarray(attr.value, dtype=np.float32)
    if p is not None and p.op_type == "Identity" and p.inputs and p.inputs[0] is not None:
        return _const_of(p.inputs[0])
    return None


def _scalar(arr: np.ndarray | None, what: str) -> float:
    if arr is None or arr.size != 1:
        raise ValueError(f"{what} must be a scalar constant to fuse")
    return float(np.asarray(arr).reshape(()))


# --------------------------------------------------------------------------------------------------
# the fused kernel
# --------------------------------------------------------------------------------------------------

@dataclass
class FusedKernel:
    """A chain of elementwise ops compiled into one loop; call it like a function of its inputs."""

    name: str
    inputs: list[str]
    outputs: list[str]
    ops: list[_Op]
    constants: dict[str, np.ndarray]
    dtype: np.dtype
    input_shapes: dict[str, tuple] = field(default_factory=dict)

    # -- shapes and code ---------------------------------------------------------------------------
    def _operands(self) -> list[str]:
        return self.inputs + list(self.constants)

    def _shapes(self, shapes: dict[str, tuple] | None) -> dict[str, tuple]:
        shapes = dict(shapes or self.input_shapes)
        for c, arr in self.constants.items():
            shapes[c] = arr.shape
        missing = [i for i in self.inputs if i not in shapes]
        if missing:
            raise ValueError(f"shapes of inputs {missing} are unknown; pass shapes={{name: shape}}")
        return shapes

    def _layout(self, shapes: dict[str, tuple]) -> tuple[tuple, dict[str, tuple]]:
        """(merged output shape, {operand: merged shape}) after dropping size-1 dims and merging alike dims."""
        names = self._operands()
        try:
            out = np.broadcast_shapes(*(tuple(shapes[n]) for n in names))
        except ValueError:
            raise ValueError(f"input shapes {[tuple(shapes[n]) for n in names]} do not broadcast") from None
        rank = len(out)
        aligned = {n: (1,) * (rank - len(shapes[n])) + tuple(shapes[n]) for n in names}
        merged_out: list[int] = []
        merged = {n: [] for n in names}
        last_pattern = None
        for d in range(rank):
            if out[d] == 1:
                continue
            pattern = tuple(aligned[n][d] == out[d] for n in names)
            if pattern == last_pattern:
                merged_out[-1] *= out[d]
                for n, full in zip(names, pattern):
                    merged[n][-1] *= out[d] if full else 1
            else:
                merged_out.append(out[d])
                for n, full in zip(names, pattern):
                    merged[n].append(out[d] if full else 1)
                last_pattern = pattern
        if not merged_out:
            merged_out = [1]
            merged = {n: [1] for n in names}
        return tuple(merged_out), {n: tuple(s) for n, s in merged.items()}

    def source_for(self, shapes: dict[str, tuple] | None = None) -> str:
        """Python source of the fused loop for these input shapes (numba compiles it)."""
        out_shape, layout = self._layout(self._shapes(shapes))
        rank = len(out_shape)
        idx = [f"i{d}" for d in range(rank)]
        pyname = _identifiers(self._operands())
        outname = {o: f"out{k}" for k, o in enumerate(self.outputs)}
        params = [pyname[n] for n in self._operands()] + [outname[o] for o in self.outputs]
        lines = [f"def {self.name}({', '.join(params)}):"]
        ndims = ", ".join(f"n{d}" for d in range(rank))
        lines.append(f"    {ndims}{',' if rank == 1 else ''} = {outname[self.outputs[0]]}.shape")
        pad = "    "
        for d in range(rank):
            lines.append(f"{pad}for i{d} in range(n{d}):")
            pad += "    "
        local = {}
        for k, n in enumerate(self._operands()):
            ix = ", ".join(i if s > 1 else "0" for i, s in zip(idx, layout[n]))
            lines.append(f"{pad}v{k} = {pyname[n]}[{ix}]")
            local[n] = f"v{k}"
        consts: dict[float, str] = {}

        def lit(x: float) -> str:
            if x not in consts:
                consts[x] = f"K{len(consts)}"
            return consts[x]

        def ref(arg) -> str:
            kind, val = arg
            return lit(float(val)) if kind == "scalar" else local[val]

        # float32: the vectorisable helpers emitted above the loop; float64: libm (exact, but scalar)
        fn = "" if self.dtype == np.float32 else "math."
        for t, op in enumerate(self.ops):
            a = [ref(x) for x in op.args]
            x = a[0]
            expr = {
                "Add": lambda: f"{a[0]} + {a[1]}", "Sub": lambda: f"{a[0]} - {a[1]}",
                "Mul": lambda: f"{a[0]} * {a[1]}", "Div": lambda: f"{a[0]} / {a[1]}",
                "Relu": lambda: f"{x} if {x} > {lit(0.0)} else {lit(0.0)}",
                "Sigmoid": lambda: f"{lit(1.0)} / ({lit(1.0)} + {fn}exp(-{x}))",
                "Tanh": lambda: f"{fn}tanh({x})", "Exp": lambda: f"{fn}exp({x})", "Erf": lambda: f"{fn}erf({x})",
                "Neg": lambda: f"-{x}", "Sqrt": lambda: f"math.sqrt({x})", "Abs": lambda: f"abs({x})",
                "Log": lambda: f"math.log({x})", "Reciprocal": lambda: f"{lit(1.0)} / {x}", "Identity": lambda: x,
                "Clip": lambda: _clip_expr(x, op, lit), "Pow": lambda: _pow_expr(x, op.exponent, lit),
            }[op.op]()
            lines.append(f"{pad}t{t} = {expr}  # {op.op}")
            local[op.out] = f"t{t}"
        for o in self.outputs:
            lines.append(f"{pad}{outname[o]}[{', '.join(idx)}] = {local[o]}")
        helper = []
        if self.dtype == np.float32:
            used = {op.op for op in self.ops}
            for name, needed_by in (("erf", {"Erf"}), ("tanh", {"Tanh"}), ("exp", {"Exp", "Sigmoid"})):
                if used & needed_by:
                    helper += ["", _HELPERS[name].strip("\n"), ""]
        dt = "float32" if self.dtype == np.float32 else "float64"
        head = [f"{name} = np.{dt}({value!r})" for value, name in consts.items()]
        return "\n".join(head + helper + [""] + lines) + "\n"

    @property
    def source(self) -> str:
        """The generated source for the shapes known at compile time (or flat, same-shaped inputs)."""
        shapes = self.input_shapes or {i: (1024,) for i in self.inputs}
        return self.source_for(shapes)

    def _compiled(self, src: str):
        fn = _COMPILED.get(src)
        if fn is None:
            import numba

            namespace = {"math": math, "np": np}
            exec(compile(src, f"<fused {self.name}>", "exec"), namespace)
            for name in _HELPERS:
                if name in namespace:
                    namespace[name] = numba.njit(inline="always", error_model="numpy",
                                                 fastmath=_FASTMATH)(namespace[name])
            fn = numba.njit(parallel=False, cache=False, error_model="numpy", fastmath=_FASTMATH)(namespace[self.name])
            _COMPILED[src] = fn
        return fn

    # -- running -----------------------------------------------------------------------------------
    def _feeds(self, args, feeds) -> dict[str, np.ndarray]:
        if args and feeds:
            raise TypeError("pass inputs either positionally or by name, not both")
        if args:
            if len(args) != len(self.inputs):
                raise TypeError(f"{self.name} takes {len(self.inputs)} inputs {self.inputs}, got {len(args)}")
            feeds = dict(zip(self.inputs, args))
        missing = [i for i in self.inputs if i not in feeds]
        if missing:
            raise TypeError(f"missing inputs {missing}")
        return {i: np.asarray(feeds[i]) for i in self.inputs}

    def __call__(self, *args, out: dict | np.ndarray | None = None, **feeds):
        """Run the fused loop; returns the output array (one output) or {name: array}."""
        feeds = self._feeds(args, feeds)
        for name, arr in feeds.items():
            if arr.dtype != self.dtype:
                raise TypeError(f"input {name!r} is {arr.dtype}, the kernel was built for {self.dtype}")
        shapes = {n: a.shape for n, a in feeds.items()}
        full = np.broadcast_shapes(*shapes.values(), *(c.shape for c in self.constants.values()))
        out_shape, layout = self._layout(self._shapes(shapes))
        fn = self._compiled(self.source_for(shapes))
        operands = [np.ascontiguousarray(feeds[n]).reshape(layout[n]) for n in self.inputs]
        operands += [np.ascontiguousarray(c, dtype=self.dtype).reshape(layout[n]) for n, c in self.constants.items()]
        if out is None:
            results = {o: np.empty(full, dtype=self.dtype) for o in self.outputs}
        else:
            results = out if isinstance(out, dict) else {self.outputs[0]: out}
        fn(*operands, *(results[o].reshape(out_shape) for o in self.outputs))
        return results[self.outputs[0]] if len(self.outputs) == 1 else results

    def unfused(self, *args, **feeds):
        """The same chain in numpy, one full pass (and one intermediate array) per op."""
        return unfused(self, self._feeds(args, feeds))

    def bytes_moved(self, shapes: dict[str, tuple] | None = None) -> BytesMoved:
        """Traffic of the unfused chain and of the fused kernel for these input shapes."""
        return bytes_moved(self, shapes)


def _identifiers(names: list[str]) -> dict[str, str]:
    """Readable, unique Python identifiers for ONNX value names."""

    out: dict[str, str] = {}
    for n in names:
        base = re.sub(r"\W", "_", n).strip("_") or "v"
        if (base[0].isdigit() or keyword.iskeyword(base) or base in ("math", "np", *_HELPERS)
                or base.startswith(tuple(f"{h.upper()}_" for h in _HELPERS))):
            base = "v_" + base
        cand, k = base, 1
        while cand in out.values() or cand.startswith(("out", "t", "n", "i", "K", "v")) and cand[1:].isdigit():
            cand, k = f"{base}_{k}", k + 1
        out[n] = cand
    return out


def _clip_expr(x: str, op: _Op, lit) -> str:
    e = x
    if op.lo is not None:
        e = f"max({e}, {lit(op.lo)})"
    if op.hi is not None:
        e = f"min({e}, {lit(op.hi)})"
    return e


def _pow_expr(x: str, p: float, lit) -> str:
    if p == 1.0:
        return x
    if p == 2.0:
        return f"{x} * {x}"
    if p == 3.0:
        return f"{x} * {x} * {x}"
    if p == 0.5:
        return f"math.sqrt({x})"
    if p == -1.0:
        return f"{lit(1.0)} / {x}"
    return f"{x} ** {lit(p)}"


# --------------------------------------------------------------------------------------------------
# building kernels
# --------------------------------------------------------------------------------------------------

def _chain_nodes(graph_or_nodes) -> list[ir.Node]:
    """The nodes to fuse (a whole Graph/model in topological order, or a list), Constants left out."""
    if isinstance(graph_or_nodes, (Graph, onnx.ModelProto, str, bytes)) or hasattr(graph_or_nodes, "__fspath__"):
        graph = graph_or_nodes if isinstance(graph_or_nodes, Graph) else load(graph_or_nodes)
        nodes = graph.topological_order()
    else:
        nodes = list(graph_or_nodes)
    nodes = [n for n in nodes if n.op_type != "Constant"]
    if not nodes:
        raise ValueError("no nodes to fuse")
    for n in nodes:
        if n.domain not in ("", "ai.onnx") or n.op_type not in SUPPORTED:
            raise ValueError(f"node {n.name!r} ({n.op_type}) is not an elementwise op this generator supports "
                             f"({', '.join(sorted(SUPPORTED))})")
    return nodes


@dataclass
class _Operands:
    """What the chain reads from outside: runtime inputs (with known shapes and dtype) and constants."""

    produced: set[str]  # values computed inside the chain
    inputs: list[str] = field(default_factory=list)
    input_shapes: dict[str, tuple] = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    dtype: np.dtype | None = None

    def arg(self, n: ir.Node, v: ir.Value | None) -> tuple[str, object]:
        """One operand of node `n`: ("val"|"in"|"const", name) or ("scalar", float)."""
        if v is None:
            raise ValueError(f"node {n.name!r} has a missing input")
        if v.name in self.produced:
            return ("val", v.name)
        c = _const_of(v)
        if c is not None:
            if c.dtype.kind != "f":
                raise ValueError(f"node {n.name!r}: constant {v.name!r} is {c.dtype}, not floating point")
            if c.size == 1:
                return ("scalar", float(c.reshape(())))
            self.constants.setdefault(v.name, c)
            return ("const", v.name)
        if v.name not in self.inputs:
            self._add_input(v)
        return ("in", v.name)

    def _add_input(self, v: ir.Value) -> None:
        """Record a runtime input, its static shape if known, and the chain's floating-point dtype."""
        self.inputs.append(v.name)
        if v.shape is not None and all(isinstance(d, int) for d in v.shape):
            self.input_shapes[v.name] = tuple(v.shape)
        if v.dtype is not None:
            dt = np.dtype(v.dtype.numpy())
            if dt.kind != "f":
                raise ValueError(f"input {v.name!r} is {dt}: only floating-point chains are fused")
            self.dtype = self.dtype or dt


def _constant_params(op: _Op, n: ir.Node, extra: list) -> None:
    """Clip bounds (attributes before opset 11, else constant inputs) and the Pow exponent, onto `op`."""
    if n.op_type == "Clip":
        if "min" in n.attributes or "max" in n.attributes:  # opset < 11
            op.lo = n.attributes["min"].value if "min" in n.attributes else None
            op.hi = n.attributes["max"].value if "max" in n.attributes else None
        else:
            bounds = [None if (v is None or v.name == "") else v for v in extra] + [None, None]
            op.lo = _scalar(_const_of(bounds[0]), f"Clip min of {n.name!r}") if bounds[0] is not None else None
            op.hi = _scalar(_const_of(bounds[1]), f"Clip max of {n.name!r}") if bounds[1] is not None else None
    if n.op_type == "Pow":
        if not extra or extra[0] is None:
            raise ValueError(f"Pow {n.name!r} has no exponent")
        op.exponent = _scalar(_const_of(extra[0]), f"the exponent of Pow {n.name!r}")


def _chain_outputs(nodes: list[ir.Node]) -> list[str]:
    """Values read outside the chain or graph outputs (else the last node's first output)."""
    inside = {id(n) for n in nodes}
    outputs = [o.name for n in nodes for o in n.outputs
               if o.is_graph_output() or any(id(u.node) not in inside for u in o.uses())]
    return outputs or [nodes[-1].outputs[0].name]


def compile_chain(graph_or_nodes, shapes: dict[str, tuple] | None = None, name: str = "fused_kernel") -> FusedKernel:
    """A FusedKernel for a set of ONNX elementwise nodes (a whole Graph/model, or a list of its nodes)."""
    nodes = _chain_nodes(graph_or_nodes)
    operands = _Operands(produced={o.name for n in nodes for o in n.outputs})
    ops: list[_Op] = []
    for n in nodes:
        n_tensors = SUPPORTED[n.op_type]
        op = _Op(n.op_type, n.outputs[0].name, [operands.arg(n, v) for v in list(n.inputs)[:n_tensors]])
        _constant_params(op, n, list(n.inputs)[n_tensors:])
        ops.append(op)
    if not operands.inputs:
        raise ValueError("the chain has no runtime input (everything is constant: fold it instead)")
    outputs = _chain_outputs(nodes)
    dtype = np.dtype(operands.dtype or np.float32)
    input_shapes = operands.input_shapes
    if shapes:
        input_shapes.update({k: tuple(v) for k, v in shapes.items()})
    return FusedKernel(name=name, inputs=operands.inputs, outputs=outputs, ops=ops,
                       constants={k: v.astype(dtype) for k, v in operands.constants.items()}, dtype=dtype,
                       input_shapes=input_shapes)


def chain_model(spec, shape=("n",), dtype=np.float32, input_shapes: dict[str, tuple] | None = None) -> onnx.ModelProto:
    """An ONNX model for a chain spec: steps ``(op, *operands)`` applied to input ``x`` in turn.

    An operand is a float (scalar constant), an array (constant, broadcast), or a string naming
    another runtime input. ``("Clip", lo, hi)`` and ``("Pow", p)`` take their constants directly.
    """
    input_shapes = dict(input_shapes or {})
    nodes, inits, extra_inputs = [], [], []
    cur = "x"
    for k, step in enumerate(spec):
        op, *operands = step if isinstance(step, (tuple, list)) else (step,)
        if op not in SUPPORTED:
            raise ValueError(f"unsupported op {op!r}; choose from {', '.join(sorted(SUPPORTED))}")
        out = f"t{k}" if k < len(spec) - 1 else "y"
        names = [cur]
        if op == "Clip":
            lo, hi = (list(operands) + [None, None])[:2]
            for j, b in enumerate((lo, hi)):
                if b is None:
                    names.append("")
                else:
                    inits.append(tensor(f"c{k}_{j}", np.asarray(b, dtype=dtype)))
                    names.append(f"c{k}_{j}")
            while names and names[-1] == "":
                names.pop()
        else:
            for j, o in enumerate(operands):
                if isinstance(o, str):
                    if o != "x" and o not in extra_inputs:
                        extra_inputs.append(o)
                    names.append(o)
                else:
                    inits.append(tensor(f"c{k}_{j}", np.asarray(o, dtype=dtype)))
                    names.append(f"c{k}_{j}")
        need = SUPPORTED[op] + (1 if op == "Pow" else 0)
        if op != "Clip" and len(names) != need:
            raise ValueError(f"step {k} ({op}) needs {need - 1} operand(s) after the running value, "
                             f"got {len(names) - 1}")
        nodes.append(helper.make_node(op, names, [out], name=f"{op.lower()}_{k}"))
        cur = out
    inputs = [value_info("x", dtype, list(shape))]
    inputs += [value_info(e, dtype, list(input_shapes.get(e, shape))) for e in extra_inputs]
    out_shape = list(shape)
    dims = [tuple(shape)] + [tuple(input_shapes.get(e, shape)) for e in extra_inputs] + [tuple(t.dims) for t in inits]
    if all(isinstance(d, int) for s in dims for d in s):
        out_shape = list(np.broadcast_shapes(*dims))
    return make_model(nodes, inputs, [value_info("y", dtype, out_shape)], inits, name="elementwise_chain")


def fuse_elementwise(spec, shape=("n",), dtype=np.float32, input_shapes: dict[str, tuple] | None = None,
                     name: str = "fused_kernel") -> FusedKernel:
    """Compile a chain spec (see `chain_model`) into a fused kernel."""
    model = chain_model(spec, shape, dtype, input_shapes)
    shapes = None
    if all(isinstance(d, int) for d in shape):
        shapes = {"x": tuple(shape), **{k: tuple(v) for k, v in (input_shapes or {}).items()}}
    return compile_chain(load(model), shapes=shapes, name=name)


# --------------------------------------------------------------------------------------------------
# the unfused reference and the byte count
# --------------------------------------------------------------------------------------------------

_ERF = None
def _np_erf(x: np.ndarray) -> np.ndarray:
    global _ERF
    if _ERF is None:
        import numba

        _ERF = numba.vectorize(["float32(float32)", "float64(float64)"])(lambda v: math.erf(v))
    return _ERF(x)


def unfused(kernel: FusedKernel, feeds: dict[str, np.ndarray]):
    """Evaluate the kernel's chain op by op with numpy, materialising every intermediate."""
    dt = kernel.dtype.type
    env: dict[str, np.ndarray] = {**{k: np.asarray(v) for k, v in feeds.items()}, **kernel.constants}

    def get(arg):
        kind, val = arg
        return dt(val) if kind == "scalar" else env[val]

    with np.errstate(all="ignore"):
        for op in kernel.ops:
            a = [get(x) for x in op.args]
            x = a[0]
            if op.op == "Clip":
                r = x
                if op.lo is not None:
                    r = np.maximum(r, dt(op.lo))
                if op.hi is not None:
                    r = np.minimum(r, dt(op.hi))
            elif op.op == "Pow":
                r = np.power(x, dt(op.exponent))
            else:
                r = {
                    "Add": lambda: np.add(a[0], a[1]), "Sub": lambda: np.subtract(a[0], a[1]),
                    "Mul": lambda: np.multiply(a[0], a[1]), "Div": lambda: np.divide(a[0], a[1]),
                    "Relu": lambda: np.maximum(x, dt(0)), "Sigmoid": lambda: dt(1) / (dt(1) + np.exp(-x)),
                    "Tanh": lambda: np.tanh(x), "Exp": lambda: np.exp(x), "Erf": lambda: _np_erf(x),
                    "Neg": lambda: np.negative(x), "Sqrt": lambda: np.sqrt(x), "Abs": lambda: np.abs(x),
                    "Log": lambda: np.log(x), "Reciprocal": lambda: dt(1) / x, "Identity": lambda: x.copy(),
                }[op.op]()
            env[op.out] = np.asarray(r, dtype=kernel.dtype)
    outs = {o: env[o] for o in kernel.outputs}
    return outs[kernel.outputs[0]] if len(outs) == 1 else outs


def bytes_moved(kernel: FusedKernel, shapes: dict[str, tuple] | None = None) -> BytesMoved:
    """Bytes the unfused chain reads+writes (one pass per op) and the fused kernel reads+writes (one pass)."""
    shapes = kernel._shapes(shapes)
    item = kernel.dtype.itemsize
    size = {n: int(np.prod(s, dtype=np.int64)) * item for n, s in shapes.items()}
    shape_of = {n: tuple(s) for n, s in shapes.items()}
    before = 0
    for op in kernel.ops:
        arg_shapes = []
        for kind, val in op.args:
            if kind != "scalar":
                before += int(np.prod(shape_of[val], dtype=np.int64)) * item
                arg_shapes.append(shape_of[val])
        shape_of[op.out] = np.broadcast_shapes(*arg_shapes)
        before += int(np.prod(shape_of[op.out], dtype=np.int64)) * item
    after = sum(size[n] for n in kernel.inputs) + sum(size[c] for c in kernel.constants)
    after += sum(int(np.prod(shape_of[o], dtype=np.int64)) * item for o in kernel.outputs)
    return BytesMoved(before=before, after=after)


# --------------------------------------------------------------------------------------------------
# the intuition: the same loops, once per op and once fused
# --------------------------------------------------------------------------------------------------

#: the chain loop_vs_loop shows by default: scale, shift, Relu, scale (cheap ops: memory-bound)
DEFAULT_LOOP_CHAIN = (("Mul", 2.0), ("Add", 1.0), ("Relu",), ("Mul", 0.5))


@dataclass
class LoopComparison:
    """An elementwise chain run as one compiled loop per op and as one fused loop: bytes, sources, times."""

    spec: tuple
    n: int
    unfused_bytes: int
    fused_bytes: int
    unfused_source: str
    fused_source: str
    max_abs_diff: float
    comparison: object = None  # fusionlab.timing.Comparison when measured

    @property
    def ratio(self) -> float:
        """unfused bytes / fused bytes: the speed-up a purely memory-bound chain can expect."""
        return self.unfused_bytes / self.fused_bytes

    def bytes_table(self) -> str:
        """Bytes each variant moves, counted (no timing)."""
        mib = 2**20
        return (f"{len(self.spec)} ops on {self.n:,} float32 values ({self.n * 4 / mib:.0f} MiB per tensor)\n"
                f"  one loop per op: {self.unfused_bytes / mib:8.0f} MiB moved (each op reads its input, writes its output)\n"
                f"  one fused loop:  {self.fused_bytes / mib:8.0f} MiB moved (read the input once, write the output once)\n"
                f"  ratio {self.ratio:.2f}x; the two give the same values: max |difference| {self.max_abs_diff:.1e}")

    def gbs(self, bandwidth_gbs: float | None = None) -> str:
        """Effective GB/s of each variant (bytes / median time), optionally against a bandwidth; then the speed-up."""
        if self.comparison is None:
            raise ValueError("not measured: call loop_vs_loop(..., measure=True)")
        c = self.comparison
        parts = [f"one loop per op {self.unfused_bytes / c.a.median / 1e9:.1f} GB/s",
                 f"fused {self.fused_bytes / c.b.median / 1e9:.1f} GB/s"]
        if bandwidth_gbs:
            parts.append(f"DRAM streaming bandwidth {bandwidth_gbs:.1f} GB/s")
        return "; ".join(parts) + f"\nspeed-up {c.speedup:.2f}x against a bytes ratio of {self.ratio:.2f}x"


def loop_vs_loop(spec=DEFAULT_LOOP_CHAIN, n: int | None = None, *, measure: bool = True, min_time: float = 1.0,
                 seed: int = 0) -> LoopComparison:
    """Run `spec` as one generated loop per op (intermediates in memory) and as one fused loop; count and time both.

    Both variants are numba loops from the same generator, so they do the same arithmetic with the same
    compiler: the only difference is how many passes they make over memory. `spec` steps take scalar or
    constant operands only (no second runtime input). `n` defaults to `fusionlab.cost.calibrate.stream_elements()`,
    tensors of at least four times the last-level cache, so every pass really goes to DRAM.
    """

    spec = tuple(tuple(step) if isinstance(step, (tuple, list)) else (step,) for step in spec)
    for step in spec:
        if any(isinstance(o, str) for o in step[1:]):
            raise ValueError(f"step {step!r}: loop_vs_loop takes scalar or constant operands only")
    n = calibrate.stream_elements() if n is None else int(n)
    steps = [fuse_elementwise([step], shape=(n,), name=f"op{k}_{step[0].lower()}") for k, step in enumerate(spec)]
    fused = fuse_elementwise(list(spec), shape=(n,), name="fused_chain")
    x = np.random.default_rng(seed).standard_normal(n, dtype=np.float32)
    bufs = [np.empty(n, dtype=np.float32) for _ in range(2)]
    out = np.empty(n, dtype=np.float32)

    def run_unfused():
        cur = x
        for k, kernel in enumerate(steps):
            cur = kernel(cur, out=bufs[k % 2])  # every intermediate is written to memory and read back
        return cur

    def run_fused():
        return fused(x, out=out)

    diff = float(np.max(np.abs(run_unfused() - run_fused())))
    result = LoopComparison(spec=spec, n=n, unfused_bytes=sum(k.bytes_moved().after for k in steps),
                            fused_bytes=fused.bytes_moved().after,
                            unfused_source="\n".join(k.source for k in steps), fused_source=fused.source,
                            max_abs_diff=diff)
    if measure:
        result.comparison = compare(run_unfused, run_fused, min_time=min_time, label_a="one loop per op",
                                    label_b="one fused loop")
    return result
