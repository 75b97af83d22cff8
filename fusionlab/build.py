"""Small helpers to build ONNX models in code (tests, zoo and notebooks all use these)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["IR_VERSION", "DEFAULT_OPSET", "make_model", "tensor", "value_info", "save_with_external_weight"]

#: onnx 1.23 writes IR 14 by default; onnxruntime 1.31 reads up to IR 13. IR 10 covers opset <= 21.
IR_VERSION = 10
DEFAULT_OPSET = 17

_DTYPES = {
    np.dtype(np.float32): onnx.TensorProto.FLOAT, np.dtype(np.float16): onnx.TensorProto.FLOAT16,
    np.dtype(np.float64): onnx.TensorProto.DOUBLE, np.dtype(np.int64): onnx.TensorProto.INT64,
    np.dtype(np.int32): onnx.TensorProto.INT32, np.dtype(np.bool_): onnx.TensorProto.BOOL,
}


def tensor(name: str, array) -> onnx.TensorProto:
    """An initializer from a numpy array."""
    return numpy_helper.from_array(np.asarray(array), name)


def value_info(name: str, dtype=np.float32, shape=None) -> onnx.ValueInfoProto:
    """A typed graph input/output; `shape` entries may be ints or symbolic names (give one: the checker needs it)."""
    return helper.make_tensor_value_info(name, _DTYPES[np.dtype(dtype)], shape)


def make_model(nodes, inputs, outputs, initializers=(), *, opset: int = DEFAULT_OPSET, name: str = "model",
               extra_opsets: dict[str, int] | None = None, functions=()) -> onnx.ModelProto:
    """A ModelProto that onnxruntime can load (IR version pinned)."""
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), list(initializers))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets, functions=list(functions), producer_name="fusionlab")
    model.ir_version = IR_VERSION
    return model


def save_with_external_weight(model: onnx.ModelProto, folder, *, index: int = 0, location: str = "weights.bin",
                              write: bool = True) -> tuple["Path", bytes]:
    """Write `model` to `folder/model.onnx` with initializer `index` stored as external data at `location`.

    The weight's bytes go to `folder/weights.bin` (unless `write` is False), whatever `location` says: tests
    of the loader point `location` elsewhere (``../``, absolute paths, symlinks) to check it refuses them.
    Returns (model path, the weight's bytes). `model` itself is not changed.
    """

    folder = Path(folder)
    ext = onnx.ModelProto()
    ext.CopyFrom(model)
    init = ext.graph.initializer[index]
    raw = numpy_helper.to_array(init).tobytes()
    if write:
        (folder / "weights.bin").write_bytes(raw)
    for field in ("raw_data", "float_data", "double_data", "int32_data", "int64_data"):
        init.ClearField(field)
    init.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(len(raw)))):
        entry = init.external_data.add()
        entry.key, entry.value = key, value
    path = folder / "model.onnx"
    path.write_bytes(ext.SerializeToString())
    return path, raw
