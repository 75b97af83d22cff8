"""Reading an exported model the way a fusion-rule author needs to: runtime shapes, module scopes, and
"SSA dumps" of a region in which host-side shape arithmetic and constants are written inline.

Used by tools/corpus_survey.py (workbook .venv: onnx, onnxruntime, numpy only).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

#: a node whose outputs are all integer/bool tensors of at most this many elements is host-side shape
#: arithmetic (Shape, Gather on a shape, Unsqueeze, Concat, ...): never a kernel worth fusing
HOST_MAX_ELEMENTS = 8
#: attributes worth printing, with the defaults that are left out
_ATTRS = {"perm": None, "axis": None, "axes": None, "to": None, "epsilon": None, "alpha": None, "beta": None,
          "transA": 0, "transB": 0, "approximate": "none", "keepdims": 1, "group": 1, "kernel_shape": None,
          "strides": None, "pads": None, "dilations": None, "mode": None, "allowzero": 0, "split": None,
          "num_outputs": None, "stash_type": 1, "start": 0, "end": None, "batch_dims": 0, "value": None,
          "value_float": None,
          "value_int": None, "value_ints": None}
_SHORT_DTYPES = {"float32": "", "int64": "i64", "int32": "i32", "bool": "b", "float16": "f16", "float64": "f64"}


def module_path(node: onnx.NodeProto) -> str:
    """The node's module path, e.g. 'model.encoder.layer.0.attention.self.query', for both exporters.

    TorchScript names nodes '/model/encoder/layer.0/.../MatMul'; dynamo keeps 'pkg.torch.onnx.name_scopes'.
    A segment that repeats its parent's name as a prefix ('features' / 'features.1') is shortened.
    """
    scopes = None
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            scopes = [s for s in ast.literal_eval(prop.value)[:-1] if s]
    if scopes is None:
        scopes = [s for s in node.name.split("/")[:-1] if s] if node.name.startswith("/") else []
    out: list[str] = []
    prev = ""
    for seg in scopes:
        out.append(seg[len(prev) + 1:] if prev and seg.startswith(prev + ".") else seg)
        prev = seg
    return ".".join(out)


def in_scope(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


def _fmt_number(x) -> str:
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    x = float(x)
    if np.isinf(x):
        return "-inf" if x < 0 else "inf"
    if x == int(x) and abs(x) < 1e6:
        return f"{x:.1f}"
    return f"{x:.6g}"


def literal(a: np.ndarray) -> str:
    """A small constant as a literal: 0.420448, [0, 2, 1, 3], i64[-1]."""
    a = np.asarray(a)
    if a.ndim == 0:
        return _fmt_number(a.item())
    flat = ", ".join(_fmt_number(v) for v in a.reshape(-1).tolist())
    return f"[{flat}]" if a.ndim == 1 else f"{list(a.shape)}[{flat}]"


def type_str(dtype: str, shape) -> str:
    return f"{_SHORT_DTYPES.get(dtype, dtype)}{list(shape)}"


@dataclass
class Analysed:
    """One model with what a reader needs: producers, constants, runtime values, scopes, host-side nodes."""

    proto: onnx.ModelProto
    producer: dict[str, int] = field(default_factory=dict)
    consumers: dict[str, list[int]] = field(default_factory=dict)
    consts: dict[str, np.ndarray] = field(default_factory=dict)  # initializers and Constant outputs
    initializers: set[str] = field(default_factory=set)
    runtime: dict[str, tuple[str, tuple]] = field(default_factory=dict)  # value -> (dtype, shape)
    values: dict[str, np.ndarray] = field(default_factory=dict)  # small runtime values
    scope: list[str] = field(default_factory=list)
    host: set[int] = field(default_factory=set)

    @property
    def nodes(self) -> list[onnx.NodeProto]:
        return list(self.proto.graph.node)

    def shape(self, value: str) -> tuple:
        return self.runtime.get(value, ("?", ()))[1]

    def dtype(self, value: str) -> str:
        return self.runtime.get(value, ("?", ()))[0]

    def data_inputs(self, i: int) -> list[str]:
        """Inputs of node i that are neither constants nor host-side values."""
        return [v for v in self.nodes[i].input if v and v not in self.consts and self.producer.get(v) not in self.host]


def _constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    for a in node.attribute:
        if a.name == "value":
            return numpy_helper.to_array(a.t)
        if a.name in ("value_float", "value_int"):
            return np.array(onnx.helper.get_attribute_value(a))
        if a.name in ("value_floats", "value_ints"):
            return np.array(onnx.helper.get_attribute_value(a))
    return None


def run_everything(proto: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    """Every intermediate value of one onnxruntime run (optimisations off)."""
    m = onnx.ModelProto()
    m.CopyFrom(proto)
    have = {o.name for o in m.graph.output}
    for node in m.graph.node:
        for o in node.output:
            if o and o not in have:
                m.graph.output.append(onnx.ValueInfoProto(name=o))
                have.add(o)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def analyse(path: Path, feeds: dict) -> Analysed:
    """Load `path` and run it once on `feeds`, keeping what the dumps need."""
    proto = onnx.load(str(path))
    a = Analysed(proto)
    for init in proto.graph.initializer:
        a.consts[init.name] = numpy_helper.to_array(init)
        a.initializers.add(init.name)
    for i, node in enumerate(proto.graph.node):
        for o in node.output:
            a.producer[o] = i
        for v in node.input:
            a.consumers.setdefault(v, []).append(i)
        if node.op_type == "Constant":
            val = _constant_value(node)
            if val is not None:
                a.consts[node.output[0]] = val
        a.scope.append(module_path(node))
    out = run_everything(proto, feeds)
    for name, val in {**feeds, **out}.items():
        arr = np.asarray(val)
        a.runtime[name] = (arr.dtype.name, tuple(arr.shape))
        if arr.size <= HOST_MAX_ELEMENTS:
            a.values[name] = arr
    for i, node in enumerate(proto.graph.node):
        if node.op_type != "Constant" and all(_is_host_value(a, o) for o in node.output if o):
            a.host.add(i)
    return a


def _is_host_value(a: Analysed, value: str) -> bool:
    dtype, shape = a.runtime.get(value, ("?", ()))
    return dtype in ("int64", "int32", "bool") and int(np.prod(shape)) <= HOST_MAX_ELEMENTS


def attrs_str(node: onnx.NodeProto) -> str:
    """The attributes that matter, without defaults: 'perm=[0, 2, 1, 3]'."""
    parts = []
    for at in sorted(node.attribute, key=lambda at: at.name):
        if at.name not in _ATTRS or at.type in (onnx.AttributeProto.TENSOR, onnx.AttributeProto.GRAPH):
            continue
        v = onnx.helper.get_attribute_value(at)
        if isinstance(v, bytes):
            v = v.decode()
        if at.name == "to":
            v = onnx.helper.tensor_dtype_to_np_dtype(v).name
        if _ATTRS[at.name] is not None and v == _ATTRS[at.name]:
            continue
        parts.append(f"{at.name}={_fmt_number(v) if isinstance(v, float) else v}")
    return " ".join(parts)


# --------------------------------------------------------------------------------------------------
# regions and SSA dumps
# --------------------------------------------------------------------------------------------------

def scope_region(a: Analysed, prefix: str) -> list[int]:
    """Node indices under a module path."""
    return [i for i, s in enumerate(a.scope) if in_scope(s, prefix)]


def backward_slice(a: Analysed, value: str, stop: set[int] | None = None) -> list[int]:
    """Every node `value` depends on, not looking through the data input of Shape (only its shape is used)."""
    seen: set[int] = set()
    todo = [value]
    while todo:
        p = a.producer.get(todo.pop())
        if p is None or p in seen or (stop and p in stop):
            continue
        seen.add(p)
        node = a.nodes[p]
        todo.extend(v for v in (node.input[1:] if node.op_type == "Shape" else node.input) if v)
    return sorted(seen)


class Dump:
    """An SSA listing of a region: data nodes as statements, host-side shape arithmetic and constants inline."""

    def __init__(self, a: Analysed, region: list[int], prefix: str = "", depth: int = 5):
        self.a, self.region, self.prefix, self.depth = a, sorted(region), prefix, depth
        self.names: dict[str, str] = {}
        self.external: dict[str, str] = {}
        self.legend: list[str] = []

    def _ssa(self, value: str) -> str:
        if value not in self.names:
            self.names[value] = f"%{len(self.names) + 1}"
        return self.names[value]

    def _outside(self, value: str) -> str:
        if value not in self.external:
            tag = f"${chr(ord('a') + len(self.external))}" if len(self.external) < 26 else f"$x{len(self.external)}"
            self.external[value] = tag
            p = self.a.producer.get(value)
            src = "graph input" if p is None else f"{self.a.nodes[p].op_type} in {self.a.scope[p] or '(top level)'}"
            self.legend.append(f"{tag} {type_str(*self.a.runtime.get(value, ('?', ())))} = {value!r} ({src})")
        return self.external[value]

    def expr(self, value: str, depth: int | None = None) -> str:
        """How an input reads: a literal, W[shape] for a weight, an inline host expression or an SSA name."""
        a = self.a
        depth = self.depth if depth is None else depth
        if not value:
            return "∅"
        if value in self.names:
            return self.names[value]
        if value in a.consts:
            arr = a.consts[value]
            if arr.size <= HOST_MAX_ELEMENTS:
                return literal(arr)
            return f"{'W' if arr.ndim > 1 else 'b'}{list(arr.shape)}"
        p = a.producer.get(value)
        if p is not None and p in a.host:
            if depth <= 0:
                return f"⟨={literal(a.values[value])}⟩" if value in a.values else "…"
            node = a.nodes[p]
            args = [self.expr(v, depth - 1) for v in node.input]
            at = attrs_str(node)
            idx = f"#{list(node.output).index(value)}" if len(node.output) > 1 else ""
            return f"{node.op_type}({', '.join(args + ([at] if at else []))}){idx}"
        return self._outside(value)

    def lines(self) -> list[str]:
        out = []
        a = self.a
        for i in self.region:
            node = a.nodes[i]
            if i in a.host or node.op_type == "Constant":
                continue
            args = ", ".join(self.expr(v) for v in node.input)
            for o in node.output:
                if o:
                    self._ssa(o)
            outs = ", ".join(f"{self.names[o]} {type_str(*a.runtime.get(o, ('?', ())))}" for o in node.output if o)
            at = attrs_str(node)
            where = a.scope[i][len(self.prefix) + 1:] if self.prefix and a.scope[i] != self.prefix else a.scope[i]
            op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
            out.append(f"{outs} = {op}({args}){' ' + at if at else ''}" + (f"   # {where}" if where else ""))
        return out

    def text(self) -> str:
        body = self.lines()
        host = sum(1 for i in self.region if i in self.a.host)
        consts = sum(1 for i in self.region if self.a.nodes[i].op_type == "Constant")
        head = [f"# {len(body)} statements; inline: {host} host-side shape/index nodes, {consts} Constant nodes"]
        return "\n".join(head + [f"# {line}" for line in self.legend] + body)


# --------------------------------------------------------------------------------------------------
# attention anatomy
# --------------------------------------------------------------------------------------------------

def softmaxes(a: Analysed) -> list[int]:
    """Softmax nodes over rank-4 scores whose probabilities reach a MatMul (attention; not YOLO's DFL)."""
    return [i for i, n in enumerate(a.nodes) if n.op_type == "Softmax" and len(a.shape(n.input[0])) == 4
            and _feeds_matmul(a, i, 3)]


def _feeds_matmul(a: Analysed, start: int, depth: int) -> bool:
    frontier = [start]
    for _ in range(depth):
        frontier = [c for i in frontier for o in a.nodes[i].output for c in a.consumers.get(o, [])]
        if any(a.nodes[c].op_type == "MatMul" for c in frontier):
            return True
    return False


def _reaches(a: Analysed, value: str, op: str, depth: int) -> bool:
    p = a.producer.get(value)
    if p is None or depth < 0 or p in a.host:
        return False
    if a.nodes[p].op_type == op:
        return True
    return any(_reaches(a, v, op, depth - 1) for v in a.data_inputs(p))


def scores_path(a: Analysed, softmax: int) -> tuple[int | None, list[int], list[str]]:
    """(QK MatMul, nodes between it and the Softmax, mask operands added on the way)."""
    path, masks = [], []
    value = a.nodes[softmax].input[0]
    for _ in range(8):
        p = a.producer.get(value)
        if p is None:
            return None, path, masks
        if a.nodes[p].op_type == "MatMul":
            return p, path[::-1], masks
        path.append(p)
        ins = a.data_inputs(p)
        onward = [v for v in ins if _reaches(a, v, "MatMul", 4)]
        if not onward:
            return None, path, masks
        masks += [v for v in ins if v != onward[0]]
        value = onward[0]
    return None, path, masks


def chain_back(a: Analysed, value: str, stops: tuple[str, ...], limit: int = 12) -> list[int]:
    """Nodes from the nearest `stops` op (included) down to `value`'s producer, following the first data input."""
    out: list[int] = []
    for _ in range(limit):
        p = a.producer.get(value)
        if p is None or p in a.host:
            break
        out.append(p)
        if a.nodes[p].op_type in stops:
            break
        ins = a.data_inputs(p)
        if not ins:
            break
        value = ins[0]
    return out[::-1]


def chain_forward(a: Analysed, node: int, stops: tuple[str, ...], limit: int = 12) -> list[int]:
    """Nodes after `node` along its only data consumer, up to and including the first `stops` op."""
    out: list[int] = []
    for _ in range(limit):
        users = [c for o in a.nodes[node].output for c in a.consumers.get(o, []) if c not in a.host]
        if len(users) != 1:
            break
        node = users[0]
        out.append(node)
        if a.nodes[node].op_type in stops:
            break
    return out


def step(a: Analysed, i: int, generic: bool = False) -> str:
    """One node of a chain: 'Transpose[0, 2, 1, 3]', 'Mul(0.420448)', 'Add(b[128], ·)', 'MatMul(·, W[128, 128])'.

    `generic` drops weight shapes and writes non-scalar constants as 'c', so blocks of other widths count alike.
    """
    node = a.nodes[i]
    if node.op_type == "Transpose":
        return f"Transpose{attrs_str(node).replace('perm=', '')}"
    consts = [v for v in node.input if v in a.consts or _weight_transpose(a, v)]
    if not consts:
        at = attrs_str(node)
        return node.op_type + (f"[{at}]" if at else "")
    args = []
    for k, v in enumerate(node.input):
        p = a.producer.get(v)
        if v in a.consts:
            arr = a.consts[v]
            if generic and arr.size > 1:
                args.append("W" if arr.ndim > 1 else "c")
            else:
                args.append(literal(arr) if arr.size <= HOST_MAX_ELEMENTS
                            else f"{'W' if arr.ndim > 1 else 'b'}{list(arr.shape)}")
        elif p is not None and a.nodes[p].op_type == "Transpose" and a.nodes[p].input[0] in a.consts:
            args.append(f"Transpose(W{list(a.consts[a.nodes[p].input[0]].shape)})")
        elif v and p in a.host:
            args.append("shape")
        else:
            args.append("·")
    return f"{node.op_type}({', '.join(args)})"


def _weight_transpose(a: Analysed, v: str) -> bool:
    p = a.producer.get(v)
    return p is not None and a.nodes[p].op_type == "Transpose" and a.nodes[p].input[0] in a.consts


def chain_str(a: Analysed, nodes: list[int], generic: bool = False) -> str:
    return " → ".join(step(a, i, generic) for i in nodes)


def constant_only(a: Analysed) -> list[int]:
    """Nodes computing from constants alone (Constant nodes included): what constant folding removes."""
    const = set(a.consts)
    out = []
    for i, node in enumerate(a.nodes):
        if all(not v or v in const for v in node.input):
            out.append(i)
            const.update(node.output)
    return out
