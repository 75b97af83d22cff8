"""IREE on the same ONNX graphs: import, compile for this CPU, count dispatches, run, and unfuse.

IREE (``iree-base-compiler`` + ``iree-base-runtime``) imports ONNX through torch-mlir's ONNX
dialect, lowers it to linalg, and *forms dispatch regions*: each dispatch is one kernel of the
compiled program, so the dispatch regions are IREE's fusion groups. `count_dispatches` compiles up
to the ``flow`` phase (no code generation, a fraction of a second for small models) and counts the
``flow.dispatch`` ops that the program issues; `dispatch_names` gives IREE's names for them, which
say what each region holds (``elementwise``, ``reduction``, ``matmul``...).

`compile_model` produces a ``.vmfb`` for the host CPU (``llvm-cpu``, ``--iree-llvmcpu-target-cpu=host``),
cached on disk by a hash of the MLIR, the flags and the compiler version. `Module` runs one on the
``local-sync`` driver: one thread, no worker pool, like fusionlab's one-thread onnxruntime sessions.

`PerOp` is the unfused baseline: every ONNX node compiled as its own module and run in sequence,
results handed from one to the next on the device, so nothing can fuse across nodes. IREE has no
flag that turns dispatch-region fusion off (its ``--iree-dispatch-creation-*`` options only add or
block particular fusions), so per-node modules are the honest "each op its own dispatch" build.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib.metadata import version as v
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
from onnx import helper

from ..files import atomic_write
from ..graph import Graph, load
from ..zoo import cache_dir

__all__ = ["available", "version", "import_onnx", "compile_model", "count_dispatches", "dispatch_names", "Module",
           "PerOp", "node_models", "dispatches_per_node", "FLAGS"]

#: Flags for the host CPU build (one definition: counts, timings and the cache all use it).
FLAGS = ("--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
         "--iree-llvmcpu-target-cpu=host")


def available() -> bool:
    """True when both iree-base-compiler and iree-base-runtime import."""
    try:
        import iree.compiler  # noqa: F401
        import iree.runtime  # noqa: F401
    except ImportError:
        return False
    return True


def version() -> str:
    """The installed iree-base-compiler version."""

    return v("iree-base-compiler")


def _proto(model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    return model.to_proto() if isinstance(model, Graph) else load(model).to_proto()


def import_onnx(model) -> str:
    """The model (ModelProto, Graph or path) as MLIR text in torch-mlir's ONNX dialect."""
    from iree.compiler import ir
    from iree.compiler.extras import onnx_importer

    proto = onnx.shape_inference.infer_shapes(_proto(model), data_prop=True)
    info = onnx_importer.ModelInfo(proto)
    module = info.create_module(context=ir.Context()).operation
    onnx_importer.NodeImporter.define_function(info.main_graph, module).import_all()
    return module.get_asm()


def _cache_dir() -> Path:
    return cache_dir().parent / "iree"


def _compile(mlir: str, flags: Sequence[str]) -> bytes:
    from iree.compiler import compile_str

    return compile_str(mlir, input_type="onnx", extra_args=list(flags))


def compile_model(model, extra_flags: Sequence[str] = (), *, cache: bool = True) -> bytes:
    """A ``.vmfb`` of the model for this CPU (cached under .cache/iree by content and flags)."""
    mlir = model if isinstance(model, str) else import_onnx(model)
    flags = [*FLAGS, *extra_flags]
    key = hashlib.sha256("\0".join([version(), mlir, *flags]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"{key}.vmfb"
    if cache and target.exists():
        return target.read_bytes()
    blob = _compile(mlir, flags)
    if cache:
        atomic_write(target, blob)
    return blob


def _flow(model, extra_flags: Sequence[str] = ()) -> str:
    mlir = model if isinstance(model, str) else import_onnx(model)
    from iree.compiler import compile_str

    out = compile_str(mlir, input_type="onnx", extra_args=[*FLAGS, *extra_flags, "--compile-to=flow"])
    return out.decode() if isinstance(out, bytes) else out


_DISPATCH = re.compile(r'flow\.dispatch @"?([\w$./-]+)"?::@"?([\w$./-]+)"?')


def dispatch_names(model, extra_flags: Sequence[str] = ()) -> list[str]:
    """IREE's name of every dispatch the compiled program issues, in program order."""
    return [m.group(2) for m in _DISPATCH.finditer(_flow(model, extra_flags))]


def count_dispatches(model, extra_flags: Sequence[str] = ()) -> int:
    """How many dispatches (IREE's fused kernels) the program issues per run."""
    return len(dispatch_names(model, extra_flags))


# --------------------------------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------------------------------

_CONFIG = None


def _config():
    global _CONFIG
    if _CONFIG is None:
        import iree.runtime as rt

        _CONFIG = rt.Config("local-sync")  # one thread, no task pool
    return _CONFIG


@dataclass
class Module:
    """A compiled model loaded on the local-sync (single-thread) driver; call it with input arrays."""

    vmfb: bytes
    entry: str = ""

    def __post_init__(self):
        import iree.runtime as rt

        self._ctx = rt.SystemContext(config=_config())
        vm = rt.VmModule.copy_buffer(self._ctx.instance, self.vmfb)
        self._ctx.add_vm_module(vm)
        names = [n for n in vm.function_names if not n.endswith("$async") and not n.startswith("__")]
        self.entry = self.entry or names[0]
        self._fn = self._ctx.modules[vm.name][self.entry]

    def __call__(self, *inputs):
        """Run on numpy arrays or device arrays; returns device arrays (``np.asarray`` copies them out)."""
        out = self._fn(*inputs)
        return out if isinstance(out, (tuple, list)) else (out,)

    def run(self, *inputs) -> list[np.ndarray]:
        """Run and copy every output to a numpy array."""
        return [np.asarray(o.to_host() if hasattr(o, "to_host") else o) for o in self(*inputs)]


# --------------------------------------------------------------------------------------------------
# one module per node: the unfused baseline
# --------------------------------------------------------------------------------------------------

def node_models(model) -> list[tuple[onnx.ModelProto, list[str], list[str]]]:
    """Every non-Constant node as its own model: (model, input names, output names), in graph order.

    A node's constant inputs (initializers and Constant nodes) travel with it, so IREE sees the same
    constants it sees in the whole model; every other input is a graph input of the one-node model.
    """
    proto = onnx.shape_inference.infer_shapes(_proto(model), data_prop=True)
    g = proto.graph
    inits = {t.name: t for t in g.initializer}
    consts = {n.output[0]: n for n in g.node if n.op_type == "Constant"}
    types = {vi.name: vi for vi in list(g.input) + list(g.value_info) + list(g.output)}
    opset = [o for o in proto.opset_import]
    out = []
    for node in g.node:
        if node.op_type == "Constant":
            continue
        ins, init_list, const_nodes = [], [], []
        for name in node.input:
            if not name or name in ins:
                continue
            if name in inits:
                init_list.append(inits[name])
            elif name in consts:
                const_nodes.append(consts[name])
            else:
                ins.append(name)
        missing = [n for n in [*ins, *node.output] if n and n not in types]
        if missing:
            raise ValueError(f"no shape known for {missing} (node {node.name!r})")
        symbol = re.sub(r"\W", "_", node.name or node.op_type).strip("_") or "node"  # a plain MLIR symbol
        graph = helper.make_graph([*const_nodes, node], symbol, [types[n] for n in ins],
                                  [types[n] for n in node.output if n], init_list)
        m = helper.make_model(graph, opset_imports=opset, producer_name="fusionlab")
        m.ir_version = proto.ir_version
        out.append((m, ins, [n for n in node.output if n]))
    return out


class PerOp:
    """The model run node by node, each node its own IREE module (so each op is at least one dispatch)."""

    def __init__(self, model, extra_flags: Sequence[str] = ()):
        proto = _proto(model)
        self.inputs = [i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}]
        self.outputs = [o.name for o in proto.graph.output]
        self.steps = [(Module(compile_model(m, extra_flags)), ins, outs) for m, ins, outs in node_models(proto)]

    def __len__(self) -> int:
        return len(self.steps)

    def __call__(self, *inputs):
        """Run every node module in order; returns the graph outputs as device arrays."""
        env = dict(zip(self.inputs, inputs))
        for module, ins, outs in self.steps:
            for name, value in zip(outs, module(*(env[i] for i in ins))):
                env[name] = value
        return tuple(env[o] for o in self.outputs)

    def run(self, *inputs) -> list[np.ndarray]:
        """Run and copy the outputs to numpy arrays."""
        return [np.asarray(o.to_host() if hasattr(o, "to_host") else o) for o in self(*inputs)]


def dispatches_per_node(model, extra_flags: Sequence[str] = ()) -> list[tuple[str, str, int]]:
    """(node name, op type, dispatches IREE issues for that node alone) for every non-Constant node."""
    rows = []
    for m, _, _ in node_models(model):
        node = m.graph.node[-1]
        rows.append((node.name, node.op_type, count_dispatches(m, extra_flags)))
    return rows

