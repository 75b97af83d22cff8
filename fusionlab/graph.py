"""Loading models safely, and the graph queries every pass needs.

`load` is the one door untrusted models come through: it checks the file, the protobuf, the opset and
every external-data location before anything else touches the model, and raises `ModelError` (a
`ValueError`) with a one-line message naming the file and the problem.  The input file is only read.

The returned `Graph` wraps an `onnx_ir.Model` (use-def chains, no protobuf index juggling) and adds
the handful of queries fusion passes ask again and again: who produces a value, who consumes it, what
constant it holds (seen through `Identity`), the topological order, and the graph outputs.
"""

from __future__ import annotations

import heapq
import os
import stat
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from google.protobuf.message import DecodeError

from .files import default_mode

__all__ = ["ModelError", "Graph", "Names", "load", "as_graph", "save_model", "name_nodes", "has_external_tensors", "MAX_OPSET",
           "MIN_OPSET", "PROTOBUF_LIMIT"]

#: Oldest default-domain opset we accept (BatchNormalization-7 and Conv-1 semantics onward).
MIN_OPSET = 7
#: Newest default-domain opset this onnx build knows.
MAX_OPSET = onnx.defs.onnx_opset_version()
#: protobuf cannot serialise a message of 2 GiB or more; bigger models must use external data.
PROTOBUF_LIMIT = 2**31 - 1
#: External weights up to this size are read into memory at load; bigger ones stay on disk (lazy).
IN_MEMORY_LIMIT = 2**30


class ModelError(ValueError):
    """A model that cannot be loaded or processed; the message is one line naming the file and the problem."""

    def __init__(self, source: str, problem: str):
        self.source = source
        self.problem = problem
        super().__init__(f"{source}: {problem}")


# --------------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------------

def _describe(source) -> str:
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"<{len(source)} bytes>"
    if isinstance(source, onnx.ModelProto):
        return f"<ModelProto {source.graph.name or 'unnamed'}>"
    return f"<{type(source).__name__}>"


def _parse_bytes(data: bytes, name: str) -> onnx.ModelProto:
    if len(data) == 0:
        raise ModelError(name, "file is empty, not an ONNX model")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except DecodeError as exc:
        raise ModelError(name, f"not a valid ONNX protobuf (truncated or corrupt: {exc})") from None
    except Exception as exc:  # protobuf may raise RuntimeError for deeply nested junk
        raise ModelError(name, f"not a valid ONNX protobuf ({type(exc).__name__}: {exc})") from None
    return proto


def _check_header(proto: onnx.ModelProto, name: str) -> None:
    # protobuf parses many random byte strings "successfully" into an almost empty message,
    # so a real model is recognised by its content, not by the absence of a parse error.
    if proto.ir_version <= 0 or not proto.HasField("graph"):
        raise ModelError(name, "not an ONNX model (no ir_version or no graph)")
    if proto.ir_version > onnx.IR_VERSION:
        raise ModelError(name, f"IR version {proto.ir_version} is newer than supported ({onnx.IR_VERSION})")
    opsets = {o.domain: o.version for o in proto.opset_import}
    if proto.ir_version >= 3 and "" not in opsets and "ai.onnx" not in opsets:
        raise ModelError(name, "model imports no default ONNX opset")
    version = opsets.get("", opsets.get("ai.onnx"))
    if version is not None and not MIN_OPSET <= version <= MAX_OPSET:
        raise ModelError(name, f"unsupported opset {version} (supported: {MIN_OPSET}..{MAX_OPSET})")


def _text_fields(descriptor) -> tuple[list, list]:
    """(string fields, message fields) of a protobuf message type, as (name, repeated) pairs; cached."""
    known = _TEXT_FIELDS.get(descriptor.full_name)
    if known is None:
        def repeated(f) -> bool:  # protobuf >= 6 has is_repeated; older ones only the label
            return bool(f.is_repeated) if hasattr(f, "is_repeated") else f.label == f.LABEL_REPEATED

        strings = [(f.name, repeated(f)) for f in descriptor.fields if f.type == f.TYPE_STRING]
        messages = [(f.name, repeated(f)) for f in descriptor.fields if f.type == f.TYPE_MESSAGE]
        known = _TEXT_FIELDS[descriptor.full_name] = (strings, messages)
    return known


_TEXT_FIELDS: dict[str, tuple[list, list]] = {}


def _bad_text(message) -> str | None:
    """The first string field (a name, a doc string) that is not valid UTF-8, as 'NodeProto.name', else None.

    protobuf hands such a field over as bytes instead of failing to parse; the graph library cannot write it
    back out, so the model is refused at load rather than crashing a pass later."""
    stack = [message]
    while stack:
        m = stack.pop()
        strings, messages = _text_fields(m.DESCRIPTOR)
        for field, repeated in strings:
            values = getattr(m, field) if repeated else [getattr(m, field)]
            if any(isinstance(v, bytes) for v in values):
                return f"{m.DESCRIPTOR.name}.{field}"
        for field, repeated in messages:
            if repeated:
                stack.extend(getattr(m, field))
            elif m.HasField(field):
                stack.append(getattr(m, field))
    return None


def _all_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto in a graph and its subgraphs (initializers, sparse parts, attribute tensors)."""
    yield from graph.initializer
    for sp in graph.sparse_initializer:
        yield sp.values
        yield sp.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _all_tensors(attr.g)
            for g in attr.graphs:
                yield from _all_tensors(g)


def _tensors_with_external_data(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto in a graph and its subgraphs that points at external data."""
    return (t for t in _all_tensors(graph) if t.data_location == onnx.TensorProto.EXTERNAL)


_T = onnx.TensorProto
#: element types packed two to a byte
_PACKED = {getattr(_T, n) for n in ("INT4", "UINT4", "FLOAT4E2M1") if hasattr(_T, n)}
#: typed field that holds each element type's values, and how many entries one element takes
_FIELDS = {_T.FLOAT: ("float_data", 1), _T.COMPLEX64: ("float_data", 2), _T.DOUBLE: ("double_data", 1),
           _T.COMPLEX128: ("double_data", 2), _T.INT64: ("int64_data", 1), _T.UINT32: ("uint64_data", 1),
           _T.UINT64: ("uint64_data", 1), _T.STRING: ("string_data", 1)}


def _check_tensor_sizes(proto: onnx.ModelProto, name: str) -> None:
    """Every stored tensor holds exactly as many values as its dims say.

    The checker rejects data that is too short but not data that is too long; onnxruntime rejects both,
    and a fusion pass reading such a weight would fail deep inside numpy. Refuse it here, by name.
    """
    for t in _all_tensors(proto.graph):
        if t.data_location == _T.EXTERNAL or t.data_type == _T.UNDEFINED:
            continue
        if any(d < 0 for d in t.dims):
            raise ModelError(name, f"tensor {t.name or '<unnamed>'!r} has a negative dimension {list(t.dims)}")
        n = int(np.prod(t.dims, dtype=np.int64)) if t.dims else 1
        if t.HasField("raw_data"):
            if t.data_type == _T.STRING:
                continue
            if t.data_type in _PACKED:
                expected = (n + 1) // 2
            else:
                try:
                    expected = n * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
                except Exception:
                    continue  # an element type this onnx cannot size: leave it to the checker
            got = len(t.raw_data)
        else:
            field, per = _FIELDS.get(t.data_type, ("int32_data", 1))
            expected = ((n + 1) // 2) if t.data_type in _PACKED else n * per
            got = len(getattr(t, field))
            if got == 0 and n == 0:
                continue
        if got != expected:
            raise ModelError(name, f"tensor {t.name or '<unnamed>'!r} of shape {list(t.dims)} holds {got} "
                                   f"{'bytes' if t.HasField('raw_data') else 'values'}, expected {expected}")


def _check_external_data(proto: onnx.ModelProto, base_dir: Path | None, name: str) -> None:
    """Every external-data location must be a plain file inside the model's own folder."""
    tensors = list(_tensors_with_external_data(proto.graph))
    if not tensors:
        return
    if base_dir is None:
        raise ModelError(name, "model refers to external data but was not loaded from a file")
    root = base_dir.resolve()
    for t in tensors:
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location", "")
        unknown = set(info) - {"location", "offset", "length", "checksum", "basepath"}
        if unknown:
            raise ModelError(name, f"tensor {t.name!r}: unknown external-data keys {sorted(unknown)}")
        if not location:
            raise ModelError(name, f"tensor {t.name!r}: external data without a location")
        if os.path.isabs(location) or location.startswith(("/", "\\")) or (len(location) > 1 and location[1] == ":"):
            raise ModelError(name, f"tensor {t.name!r}: external data location {location!r} is an absolute path")
        parts = Path(location.replace("\\", "/")).parts
        if ".." in parts:
            raise ModelError(name, f"tensor {t.name!r}: external data location {location!r} leaves the model's folder")
        # Walk every component: a symlink anywhere on the way could point outside the folder.
        current = base_dir
        for part in parts:
            current = current / part
            if current.is_symlink():
                raise ModelError(name, f"tensor {t.name!r}: external data location {location!r} goes through a symlink")
        target = current
        try:
            resolved = target.resolve(strict=True)
        except (FileNotFoundError, RuntimeError, OSError):
            raise ModelError(name, f"tensor {t.name!r}: external data file {location!r} not found") from None
        if root != resolved and root not in resolved.parents:
            raise ModelError(name, f"tensor {t.name!r}: external data location {location!r} leaves the model's folder")
        st = resolved.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ModelError(name, f"tensor {t.name!r}: external data {location!r} is not a regular file")
        if st.st_nlink > 1:
            raise ModelError(name, f"tensor {t.name!r}: external data {location!r} is a hard link (refused)")
        try:
            offset = int(info.get("offset", 0) or 0)
            length = int(info["length"]) if info.get("length") not in (None, "") else st.st_size - offset
        except ValueError:
            raise ModelError(name, f"tensor {t.name!r}: external data offset/length are not integers") from None
        if offset < 0 or length < 0 or offset + length > st.st_size:
            raise ModelError(
                name,
                f"tensor {t.name!r}: external data range [{offset}, {offset + length}) "
                f"exceeds {location!r} ({st.st_size} bytes)",
            )


def _external_total(proto: onnx.ModelProto) -> int:
    total = 0
    for t in _tensors_with_external_data(proto.graph):
        info = {e.key: e.value for e in t.external_data}
        total += int(info.get("length") or 0)
    return total


def has_external_tensors(model: ir.Model) -> bool:
    """True when some initializer still lives in an external file (models over 2 GiB)."""
    return any(isinstance(v.const_value, ir.ExternalTensor) for g in model.graphs() for v in g.initializers.values())


def _from_path(path: Path) -> tuple[onnx.ModelProto, Path]:
    name = str(path)
    if not path.exists():
        raise ModelError(name, "no such file")
    if path.is_dir():
        raise ModelError(name, "is a directory, not an ONNX file")
    size = path.stat().st_size
    if size > PROTOBUF_LIMIT:
        raise ModelError(name, f"file is {size} bytes, over protobuf's 2 GiB limit; store weights as external data")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelError(name, f"cannot read file ({exc.strerror})") from None
    return _parse_bytes(data, name), path.parent


def _checker_problem(model) -> str | None:
    """The checker's complaint in one line, or None when the model passes."""
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        text = str(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
    except ValueError as exc:  # e.g. "too large" from the checker
        return str(exc).strip().splitlines()[0]
    return None


def _sort_nodes(proto: onnx.ModelProto) -> None:
    """Reorder the main graph's nodes topologically (stable), in place."""
    model = ir.serde.deserialize_model(proto)
    model.graph.sort()
    proto.graph.ClearField("node")
    proto.graph.node.extend(ir.serde.serialize_model(model).graph.node)


def _onnxruntime_accepts(proto: onnx.ModelProto) -> bool:
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


def load(source, *, check: bool = True) -> "Graph":
    """Load an ONNX model from a path, bytes or ModelProto into a checked `Graph` (a `Graph` is copied)."""
    if isinstance(source, Graph):
        return source.copy()
    name = _describe(source)
    base_dir: Path | None = None
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        proto, base_dir = _from_path(path)
    elif isinstance(source, (bytes, bytearray, memoryview)):
        proto = _parse_bytes(bytes(source), name)
    elif isinstance(source, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(source)  # never alias the caller's model
    elif isinstance(source, ir.Model):
        return Graph(source, name=name)
    else:
        raise TypeError(f"load() takes a path, bytes, onnx.ModelProto or Graph, not {type(source).__name__}")
    _check_header(proto, name)
    bad = _bad_text(proto)
    if bad:
        raise ModelError(name, f"a text field ({bad}) is not valid UTF-8: the file is corrupted")
    _check_tensor_sizes(proto, name)
    has_external = any(True for _ in _tensors_with_external_data(proto.graph))
    _check_external_data(proto, base_dir, name)
    notes: list[str] = []
    if check:
        problem = _checker_problem(str(source) if has_external else proto)
        if problem and "topologically sorted" in problem:
            _sort_nodes(proto)  # a stored order is no property of the model: sort it in memory
            notes.append("nodes were not topologically sorted; sorted on load")
            problem = _checker_problem(str(source) if has_external else proto) if not has_external else None
        if problem:
            # The checker is stricter than the engine (e.g. contrib LayerNormalization below opset 17,
            # IR<4 initializers not listed as inputs). onnxruntime is the engine we verify with: if it
            # accepts the model, so do we, and the checker's complaint is kept as a note.
            if has_external or not _onnxruntime_accepts(proto):
                raise ModelError(name, f"invalid ONNX model: {problem}")
            notes.append(f"onnx.checker: {problem} (onnxruntime accepts the model)")
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as exc:
        raise ModelError(name, f"cannot build the graph ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    if base_dir is not None:
        ir.external_data.set_base_dir(model.graph, str(base_dir))
        if has_external and _external_total(proto) < IN_MEMORY_LIMIT:
            # Small enough to hold in memory: later passes and onnxruntime need no file paths.
            ir.external_data.load_to_model(model)
    graph = Graph(model, name=name, path=Path(source) if base_dir is not None else None)
    graph.notes = notes + graph.notes
    return graph


def as_graph(model, *, check: bool = True) -> "Graph":
    """`model` itself when it is already a Graph, else `load(model)` (every entry point accepts either)."""
    return model if isinstance(model, Graph) else load(model, check=check)


# --------------------------------------------------------------------------------------------------
# saving (atomic, never onto the input)
# --------------------------------------------------------------------------------------------------

def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def save_model(model: "Graph | ir.Model | onnx.ModelProto", path, *, source: Path | str | None = None,
               external_data_threshold: int = PROTOBUF_LIMIT) -> Path:
    """Write a model atomically (temp file + rename); refuse to overwrite `source`.

    Models whose tensors add up to more than `external_data_threshold` bytes are written with their
    weights in `<name>.data` beside the model, as protobuf cannot hold 2 GiB.
    """
    path = Path(path)
    if source is not None and (_same_file(Path(source), path) or Path(source).resolve() == path.resolve()):
        raise ModelError(str(path), "refusing to overwrite the input model; choose another output path")
    if isinstance(model, Graph):
        model = model.model
    if isinstance(model, onnx.ModelProto):
        model = ir.serde.deserialize_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    total = sum(
        (v.const_value.nbytes if v.const_value is not None else 0) for v in model.graph.initializers.values()
    )

    mode = default_mode(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        if total > external_data_threshold:
            ir.save(model, tmp, format="protobuf", external_data=f"{path.name}.data")
        else:
            proto = ir.serde.serialize_model(model)
            with open(tmp, "wb") as f:
                f.write(proto.SerializeToString())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# --------------------------------------------------------------------------------------------------
# node identity and fresh names
# --------------------------------------------------------------------------------------------------

def name_nodes(graph: ir.Graph) -> list[str]:
    """Give every unnamed or duplicate-named node of `graph` a unique name `<op>_<position>`; returns the new names.

    This is the one identity of a node everywhere in fusionlab (plans, cost, pictures, widgets, custom ops).
    The first holder of a repeated name keeps it; deterministic: the same model gets the same names.
    """
    nodes = list(graph)
    counts: dict[str, int] = {}
    for n in nodes:
        if n.name:
            counts[n.name] = counts.get(n.name, 0) + 1
    used = set(counts)
    kept: set[str] = set()
    made: list[str] = []
    for i, node in enumerate(nodes):
        if node.name and (counts[node.name] == 1 or node.name not in kept):
            kept.add(node.name)
            continue
        base = f"{node.op_type}_{i}"
        name, k = base, 0
        while name in used:
            k += 1
            name = f"{base}_{k}"
        node.name = name
        used.add(name)
        made.append(name)
    return made


def _all_value_names(graph: ir.Graph) -> set[str]:
    names = {v.name for v in graph.inputs if v.name} | set(graph.initializers)
    for node in ir.traversal.RecursiveGraphIterator(graph):
        names.update(v.name for v in node.outputs if v.name)
        names.update(v.name for v in node.inputs if v is not None and v.name)
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                names.update(v.name for v in attr.value.inputs if v.name)
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub in attr.value:
                    names.update(v.name for v in sub.inputs if v.name)
    return names


def fresh_name(base: str, taken: set[str]) -> str:
    """`base`, or `base_1`, `base_2`, ... : the first that `taken` does not hold (then it is taken)."""
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


class Names:
    """Every name a graph uses, and fresh ones that clash with none of them (one service for every pass).

    Node names and tensor (value) names are separate namespaces in ONNX; a fresh value name is checked
    against graph inputs, initializers and every node output, subgraphs included, not only initializers.
    """

    def __init__(self, model: ir.Model, retired: set[str] | None = None):
        graph = model.graph
        self._nodes = {n.name for n in ir.traversal.RecursiveGraphIterator(graph) if n.name}
        if retired is not None:  # node names used before (removed by a rewrite): never handed out again
            retired.update(self._nodes)
            self._nodes = retired
        self._values = _all_value_names(graph)
        self._functions = {f.name for f in model.functions.values()}

    _fresh = staticmethod(fresh_name)

    def node(self, base: str) -> str:
        """A node name no node uses (base, else base_1, base_2, ...)."""
        return self._fresh(base or "node", self._nodes)

    def value(self, base: str) -> str:
        """A tensor name no input, initializer or node output uses."""
        return self._fresh(base or "value", self._values)

    def function(self, base: str) -> str:
        """A model-local function name not yet taken: base_0, base_1, ..."""
        k = 0
        while f"{base}_{k}" in self._functions:
            k += 1
        self._functions.add(f"{base}_{k}")
        return f"{base}_{k}"


# --------------------------------------------------------------------------------------------------
# the graph object and its queries
# --------------------------------------------------------------------------------------------------

class Graph:
    """A loaded model plus the queries passes need. `graph.model` is the underlying `onnx_ir.Model`."""

    def __init__(self, model: ir.Model, *, name: str = "<model>", path: Path | None = None):
        self.model = model
        self.name = name
        self.path = path
        self.notes: list[str] = []  # what loading had to accept or repair
        #: node name -> names of the model's nodes it stands for (set by rewrites; absent: itself)
        self.origin: dict[str, tuple[str, ...]] = {}
        #: node name -> id of the plan group whose rewrite made it, where `origin` alone cannot tell (two mixed
        #: groups over parts of one earlier group's product cover the same loaded nodes)
        self.made_by: dict[str, str] = {}
        #: every node name this graph has used, removed ones included (`names()` never hands them out again)
        self._retired: set[str] = set()
        #: graph output -> why its declared shape was dropped (it contradicted what the graph computes; `prepare`)
        self.undeclared_outputs: dict[str, str] = {}
        made = name_nodes(model.graph)
        if made:
            self.notes.append(f"{len(made)} node(s) had no name or a repeated one; named <op>_<position>: "
                              + ", ".join(made[:5]) + (" ..." if len(made) > 5 else ""))

    # -- basic views -------------------------------------------------------------------------------
    @property
    def graph(self) -> ir.Graph:
        return self.model.graph

    @property
    def opset(self) -> int:
        imports = self.model.graph.opset_imports
        return imports.get("", imports.get("ai.onnx", 0))

    def __iter__(self) -> Iterator[ir.Node]:
        return iter(self.model.graph)

    def __len__(self) -> int:
        return len(self.model.graph)

    def __repr__(self) -> str:
        return f"Graph({self.name}, {len(self)} nodes, opset {self.opset})"

    def nodes(self) -> list[ir.Node]:
        """Nodes in their stored order."""
        return list(self.model.graph)

    def node(self, name: str) -> ir.Node:
        """The node with this name (KeyError if none)."""
        for n in self.model.graph:
            if n.name == name:
                return n
        raise KeyError(name)

    def value(self, name: str) -> ir.Value:
        """The value (tensor) with this name: an input, initializer or node output."""
        g = self.model.graph
        for v in g.inputs:
            if v.name == name:
                return v
        if name in g.initializers:
            return g.initializers[name]
        for n in g:
            for v in n.outputs:
                if v.name == name:
                    return v
        raise KeyError(name)

    def op_counts(self) -> dict[str, int]:
        """How many nodes of each op type (domain-qualified for non-default domains), sorted by name."""
        counts: dict[str, int] = {}
        for n in self.model.graph:
            key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}"
            counts[key] = counts.get(key, 0) + 1
        return dict(sorted(counts.items()))

    # -- use-def queries ---------------------------------------------------------------------------
    @staticmethod
    def producer(value: ir.Value) -> ir.Node | None:
        """The node that computes `value` (None for graph inputs and initializers)."""
        return value.producer()

    @staticmethod
    def consumers(value: ir.Value) -> list[ir.Node]:
        """Distinct nodes that read `value`, in use order (subgraph uses count too)."""
        seen: list[ir.Node] = []
        for use in value.uses():
            if use.node not in seen:
                seen.append(use.node)
        return seen

    def is_graph_output(self, value: ir.Value) -> bool:
        return value.is_graph_output()

    def is_overridable(self, value: ir.Value) -> bool:
        """An initializer that is also a graph input can be replaced at run time: not a constant."""
        return value.is_graph_input() and value.name in self.model.graph.initializers

    def constant(self, value: ir.Value | None) -> np.ndarray | None:
        """The constant a value holds, seen through Identity and Constant nodes; None if not constant."""
        seen = 0
        while value is not None and seen < 64:
            seen += 1
            if value.is_graph_input():
                return None  # an overridable initializer is not a constant
            if value.const_value is not None:
                return value.const_value.numpy()
            node = value.producer()
            if node is None:
                return None
            if node.op_type == "Identity" and node.domain in ("", "ai.onnx") and node.inputs:
                value = node.inputs[0]
                continue
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                attr = node.attributes.get("value")
                if attr is not None and attr.type == ir.AttributeType.TENSOR:
                    return attr.as_tensor().numpy()
                for key, dtype in (("value_float", np.float32), ("value_int", np.int64)):
                    if key in node.attributes:
                        return np.array(node.attributes[key].value, dtype=dtype)
                for key, dtype in (("value_floats", np.float32), ("value_ints", np.int64)):
                    if key in node.attributes:
                        return np.array(list(node.attributes[key].value), dtype=dtype)
                return None
            return None
        return None

    def topological_order(self) -> list[ir.Node]:
        """Nodes ordered so that every producer precedes its consumers (stable for a sorted graph)."""
        graph = self.model.graph
        nodes = list(graph)
        index = {id(n): i for i, n in enumerate(nodes)}
        indeg = {id(n): 0 for n in nodes}
        succ: dict[int, list[ir.Node]] = {id(n): [] for n in nodes}
        for n in nodes:
            preds = {id(p) for p in _predecessors(n) if id(p) in index}
            indeg[id(n)] = len(preds)
            for p in preds:
                succ[p].append(n)

        ready = [(index[id(n)], n) for n in nodes if indeg[id(n)] == 0]
        heapq.heapify(ready)
        order: list[ir.Node] = []
        while ready:
            _, n = heapq.heappop(ready)
            order.append(n)
            for s in succ[id(n)]:
                indeg[id(s)] -= 1
                if indeg[id(s)] == 0:
                    heapq.heappush(ready, (index[id(s)], s))
        if len(order) != len(nodes):
            raise ModelError(self.name, "graph has a cycle")
        return order

    def outputs(self) -> list[ir.Value]:
        return list(self.model.graph.outputs)

    def inputs(self) -> list[ir.Value]:
        """Graph inputs that are real inputs (not overridable initializers)."""
        g = self.model.graph
        return [v for v in g.inputs if v.name not in g.initializers]

    # -- conversion --------------------------------------------------------------------------------
    def to_proto(self) -> onnx.ModelProto:
        return ir.serde.serialize_model(self.model)

    def copy(self) -> "Graph":
        """A copy whose nodes and values passes may rewrite without touching this graph.

        Tensor data is shared, not copied (onnx-ir's clone): passes never write into a tensor, they
        create new initializers, so sharing is safe and copying ResNet-50 takes milliseconds, not 0.25 s.
        """
        try:
            model = self.model.clone()
        except Exception:  # clone refuses some odd graphs (e.g. IR<4 inputs shadowing initializers)
            model = ir.serde.deserialize_model(self.to_proto())
            if self.path is not None:
                ir.external_data.set_base_dir(model.graph, str(self.path.parent))
        copy = Graph(model, name=self.name, path=self.path)
        copy.notes = list(self.notes)
        copy.origin = dict(self.origin)
        copy.made_by = dict(self.made_by)
        copy._retired = set(self._retired)
        copy.undeclared_outputs = dict(self.undeclared_outputs)
        return copy

    def names(self) -> Names:
        """The naming service over the graph as it is now (fresh node, tensor and function names).

        A fresh node name is also new to this graph's past: a name a rewrite removed (a vertical group's
        member) is never handed to a later node, so plans made by earlier passes, which name the nodes
        they grouped, cannot be confused with a later pass's new nodes.
        """
        return Names(self.model, self._retired)

    def covers(self, node_name: str) -> tuple[str, ...]:
        """The names of the loaded model's nodes that `node_name` stands for (itself unless a rewrite made it)."""
        return self.origin.get(node_name, (node_name,))

    def save(self, path, **kw) -> Path:
        return save_model(self, path, source=self.path, **kw)


def _predecessors(node: ir.Node) -> Iterable[ir.Node]:
    """Producers of a node's inputs, including values captured by its subgraphs."""
    for v in node.inputs:
        if v is not None and v.producer() is not None:
            yield v.producer()
    for attr in node.attributes.values():
        graphs = []
        if attr.type == ir.AttributeType.GRAPH:
            graphs = [attr.value]
        elif attr.type == ir.AttributeType.GRAPHS:
            graphs = list(attr.value)
        for g in graphs:
            for inner in ir.traversal.RecursiveGraphIterator(g):
                for v in inner.inputs:
                    if v is not None and v.producer() is not None and v.producer().graph is node.graph:
                        yield v.producer()
