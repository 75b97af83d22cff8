"""Loading models safely: `load` is the one door untrusted models come through.

It checks the file, the protobuf, the opset and every external-data location before anything
else touches the model, and raises `ModelError` (a `ValueError`) with a one-line message naming
the file and the problem. The input file is only read."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from google.protobuf.message import DecodeError

from .wrapper import Graph, ModelError, PROTOBUF_LIMIT, attr

__all__ = ["IN_MEMORY_LIMIT", "MAX_OPSET", "MIN_OPSET", "as_graph", "has_external_tensors", "load"]


#: Oldest default-domain opset we accept (BatchNormalization-7 and Conv-1 semantics onward).
MIN_OPSET = 7
#: Newest default-domain opset this onnx build knows.
MAX_OPSET = onnx.defs.onnx_opset_version()
#: External weights up to this size are read into memory at load; bigger ones stay on disk (lazy).
IN_MEMORY_LIMIT = 2**30


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
