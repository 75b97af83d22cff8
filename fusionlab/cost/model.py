"""A roofline cost model of a fusion plan: predicted latency, bytes moved and peak memory per device.

The model, in five rules (each a simplification, stated so it can be checked against measurement):

1. **Per node**: FLOPs and bytes from static shapes (`node_costs`). Reshape-like views move no data.
2. **Per kernel** (a fusion group, or an ungrouped node on its own): time = max(FLOPs / peak,
   bytes / bandwidth) + launch overhead x the kernels its lowering launches. A group reads its external
   inputs and weights once per path (a tensor read by the cube through L1 *and* by the vector unit through
   the UB travels twice) and writes its outputs once; its intermediates stay on chip, tile by tile, and
   cost no traffic, except those its emitted lowering still writes (Conv + QuickGelu writes the Conv's
   output and reads it back: `FusionGroup.kernels`).
3. **Tiles** (`fusionlab.analysis.working_set`, the model the mixed pass uses too): a kernel streams its tensors
   through one core's Unified Buffer in tiles; the more tensors it holds at once, the smaller its tiles.
   Transfers below 16 KiB waste bandwidth (a modelled per-transfer overhead), so a group that holds many
   live tensors moves its bytes more slowly. Nothing spills unless not even one 32-byte block per buffer fits.
4. **Recompute**: a node a group recomputes (the mixed pass's `allow_recompute`) runs, and reads its inputs,
   in every group that recomputes it.
5. **Peak memory**: kernels run in topological order; a tensor lives from the kernel that writes it
   to the last kernel that reads it (graph inputs from the start, graph outputs to the end). A fused
   kernel needs all its inputs and outputs at once. Weights are always resident and added on top.

Float models run at the device's `precision` (Ascend presets: fp16, as ATC converts fp32 models for
inference; this machine: as stored).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field, replace

import numpy as np
import onnx
import onnx_ir as ir

from ..analysis import working_set as ws_model
from ..analysis.opclass import OpKind, classify
from ..graph import Graph, as_graph
from ..passes.fold import is_host_side
from ..passes.prepare import graph_of, settings
from ..plan import FusionPlan
from ..shapes import DEFAULT_DIMS, ShapeInfo
from ..text import text_table
from ..verification.runtime import run
from . import schedule
from .devices import Device, get as get_device, load_devices

__all__ = ["NodeCost", "KernelCost", "PlanCost", "CostTable", "node_costs", "plan_cost", "compare",
           "predicted_speedup", "as_launched", "one_kernel_per_group", "VIEW_OPS", "ELEMENTWISE_COST", "Analysis",
           "schedule_of", "run_of"]

#: ops that only relabel a tensor (no data moved by the kernel)
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Shape", "Size", "Dropout"})
#: FLOPs per output element of elementwise ops (transcendentals counted as 4: a rough, stated choice)
ELEMENTWISE_COST = {
    **dict.fromkeys(["Add", "Sub", "Mul", "Div", "Relu", "Neg", "Abs", "Max", "Min", "Clip", "Where", "Reciprocal",
                     "Sqrt", "Equal", "Greater", "Less", "Not", "And", "Or", "Cast", "LeakyRelu", "PRelu",
                     "Floor", "Ceil", "Round", "Sign", "Mod", "Sum", "Mean"], 1),
    **dict.fromkeys(["Sigmoid", "Tanh", "Exp", "Log", "Erf", "Pow", "Softplus", "HardSigmoid", "HardSwish",
                     "Gelu", "Elu", "Selu", "Mish"], 4),
}
_NORM_COST = {"BatchNormalization": 2, "InstanceNormalization": 8, "LayerNormalization": 8,
              "Softmax": 5, "LogSoftmax": 5}

_NP = {ir.DataType.FLOAT: "float32", ir.DataType.FLOAT16: "float16", ir.DataType.BFLOAT16: "bfloat16",
       ir.DataType.DOUBLE: "float64", ir.DataType.INT8: "int8", ir.DataType.UINT8: "uint8",
       ir.DataType.INT32: "int32", ir.DataType.INT64: "int64", ir.DataType.BOOL: "bool"}


@dataclass
class NodeCost:
    """FLOPs and bytes of one node: activations in, activations out, weights (constant inputs)."""

    name: str
    op_type: str
    flops: int
    bytes_in: int
    bytes_out: int
    weight_bytes: int
    dtype: str = "float32"
    known: bool = True
    host: bool = False  # shape arithmetic on small int64 values: computed on the host, no kernel

    @property
    def bytes(self) -> int:
        """Traffic of the node run on its own (zero for views and host-side shape arithmetic)."""
        return 0 if self.op_type in VIEW_OPS or self.host else self.bytes_in + self.bytes_out + self.weight_bytes


# --------------------------------------------------------------------------------------------------
# analysis of one graph
# --------------------------------------------------------------------------------------------------

def _prod(shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape is not None else 0


def _is_const(v: ir.Value) -> bool:
    for _ in range(16):
        if v.is_graph_input():
            return False
        if v.const_value is not None:
            return True
        p = v.producer()
        if p is None:
            return False
        if p.op_type == "Constant":
            return True
        if p.op_type != "Identity" or not p.inputs or p.inputs[0] is None:
            return False
        v = p.inputs[0]
    return False


class Analysis:
    """Shapes, dtypes, sizes and node costs of one graph at fixed dims and precision."""

    def __init__(self, graph: Graph, dims: dict | None, precision: str | None):
        self.graph = graph
        self.dims = dims
        #: {(prepare, fold) of a plan: the Analysis of the graph a plan made with it names} (see `for_plan`)
        self._planned: dict = {}
        self.info = ShapeInfo.of(graph, dims)
        self.shapes = self.info.concrete_shapes
        self.order = [n for n in graph.topological_order()]
        self.measured: dict[str, str] = {}
        if any(o.name not in self.shapes for n in self.order if n.op_type != "Constant" for o in n.outputs if o.name):
            self._shapes_from_a_run(dims)
        self.precision = precision
        self.dtypes: dict[str, str] = {}
        for v in list(graph.graph.inputs) + list(graph.graph.initializers.values()):
            if v.dtype is not None:
                self.dtypes[v.name] = _NP.get(v.dtype, "float32")
        self.dtypes.update(self.measured)
        for n in self.order:  # propagate dtypes where the file carries none (most ops keep their input's)
            for o in n.outputs:
                if o.name in self.measured:
                    continue
                if o.dtype is not None:
                    self.dtypes[o.name] = _NP.get(o.dtype, "float32")
                elif n.op_type in ("Shape", "Size", "NonZero", "ArgMax", "ArgMin"):
                    self.dtypes[o.name] = "int64"
                elif n.op_type == "Cast" and "to" in n.attributes:
                    self.dtypes[o.name] = _NP.get(ir.DataType(n.attributes["to"].value), "float32")
                elif n.op_type in ("Equal", "Greater", "Less", "Not", "And", "Or"):
                    self.dtypes[o.name] = "bool"
                else:
                    first = next((self.dtypes[i.name] for i in n.inputs if i is not None and i.name in self.dtypes
                                  and self.dtypes[i.name].startswith(("float", "bfloat"))), None)
                    self.dtypes[o.name] = first or next(
                        (self.dtypes[i.name] for i in n.inputs if i is not None and i.name in self.dtypes), "float32")
        self.costs = {n.name: self._node_cost(n) for n in self.order if n.op_type != "Constant"}

    def for_plan(self, plan: FusionPlan | None, prepared: dict | None = None) -> "Analysis":
        """The analysis of the graph `plan`'s groups name: this one, or (once) that of the prepared copy.

        A plan made by `fusionlab.passes.plan` names nodes of the prepared model (`passes.prepare.graph_of`);
        laid over the loaded model its groups can form cycles with the nodes preparation removed.
        `prepared` ({(prepare, fold): graph}) shares prepared copies between analyses of one graph.
        """
        how = settings(plan)
        if not how[0] or self._planned.get("self") == how:
            return self
        if how not in self._planned:
            cache = prepared if prepared is not None else {}
            if how not in cache:
                cache[how] = graph_of(self.graph, plan)
            target = cache[how]
            if target is self.graph:
                self._planned[how] = self
            else:
                done = Analysis(target, self.dims, self.precision)
                done._planned["self"] = how
                self._planned[how] = done
        return self._planned[how]

    def _shapes_from_a_run(self, dims: dict | None) -> None:
        """Fill shapes onnx inference could not (e.g. Slice ends computed from Shape) by running the model once."""

        proto = self.graph.to_proto()
        have = {o.name for o in proto.graph.output}
        for n in proto.graph.node:
            for o in n.output:
                if o and o not in have and n.op_type != "Constant":
                    proto.graph.output.append(onnx.ValueInfoProto(name=o))
                    have.add(o)
        try:
            out = run(proto, dims={**DEFAULT_DIMS, **(dims or {})})
        except Exception:  # a model onnxruntime cannot run keeps its unknown shapes (flagged per node)
            return
        for name, arr in out.items():
            if name not in self.shapes:
                self.shapes[name] = tuple(np.shape(arr))
                self.measured[name] = str(np.asarray(arr).dtype)

    def itemsize(self, name: str) -> int:
        dt = self.dtypes.get(name, "float32")
        if self.precision == "fp16" and dt in ("float32", "float64"):
            return 2
        if dt == "bfloat16":
            return 2
        return np.dtype(dt).itemsize

    def compute_dtype(self, node: ir.Node) -> str:
        dt = self.dtypes.get(node.outputs[0].name, "float32") if node.outputs else "float32"
        if self.precision == "fp16" and dt in ("float32", "float64"):
            return "float16"
        return dt

    def nbytes(self, v: ir.Value | None) -> int | None:
        if v is None or v.name not in self.shapes:
            return None
        return _prod(self.shapes[v.name]) * self.itemsize(v.name)

    def _node_cost(self, n: ir.Node) -> NodeCost:
        known = True
        b_in = b_w = b_out = 0
        for v in n.inputs:
            if v is None:
                continue
            size = self.nbytes(v)
            if size is None:
                known = False
                continue
            if _is_const(v):
                b_w += size
            else:
                b_in += size
        for v in n.outputs:
            size = self.nbytes(v)
            if size is None:
                known = False
            else:
                b_out += size
        try:
            flops = self._flops(n)
        except (KeyError, IndexError, TypeError, ValueError):
            flops, known = 0, False
        return NodeCost(n.name, n.op_type, int(flops), b_in, b_out, b_w, self.compute_dtype(n), known,
                        host=is_host_side(n, self.info))

    def _shape(self, v: ir.Value | None):
        return self.shapes[v.name] if v is not None and v.name in self.shapes else None

    def _flops(self, n: ir.Node) -> int:
        op = n.op_type
        out = self._shape(n.outputs[0]) if n.outputs else None
        if op == "Conv":
            w = self._shape(n.inputs[1])
            bias = len(n.inputs) > 2 and n.inputs[2] is not None
            return 2 * _prod(out) * _prod(w[1:]) + (_prod(out) if bias else 0)
        if op == "ConvTranspose":
            x, w = self._shape(n.inputs[0]), self._shape(n.inputs[1])
            return 2 * _prod(x) * _prod(w[1:])
        if op == "MatMul":
            a = self._shape(n.inputs[0])
            return 2 * _prod(out) * a[-1]
        if op == "Gemm":
            a = self._shape(n.inputs[0])
            trans_a = n.attributes["transA"].value if "transA" in n.attributes else 0
            k = a[0] if trans_a else a[1]
            return 2 * _prod(out) * k + _prod(out)
        if op in ELEMENTWISE_COST:
            return ELEMENTWISE_COST[op] * _prod(out)
        if op in _NORM_COST:
            return _NORM_COST[op] * _prod(out)
        if op.startswith("Reduce") or op in ("GlobalAveragePool", "GlobalMaxPool"):
            return _prod(self._shape(n.inputs[0]))
        if op in ("MaxPool", "AveragePool"):
            return _prod(out) * _prod(list(n.attributes["kernel_shape"].value))
        return 0


def node_costs(graph, dims: dict | None = None, precision: str | None = None) -> list[NodeCost]:
    """FLOPs and bytes of every node (Constant nodes excluded: they are weights), in topological order."""
    a = Analysis(as_graph(graph), dims, precision)
    return list(a.costs.values())


# --------------------------------------------------------------------------------------------------
# kernels and the plan
# --------------------------------------------------------------------------------------------------

@dataclass
class KernelCost:
    """One kernel of the plan: a fusion group (its lowering may launch several) or a single node.

    `bytes` is the traffic to device memory: what its transfers move (`working_set.WorkingSet.transfers`) plus
    what its emitted lowering still writes and reads back. `working_set` is its UB footprint at the efficient
    16 KiB tile; `tile` the largest tile it fits in one core's UB; `transfer_factor` how much longer its
    transfers take than at full bandwidth (1.0: tiles of 16 KiB or more).
    """

    id: str
    nodes: list[str]
    pattern: str
    flops: int
    bytes: int
    unfused_bytes: int
    working_set: int
    spill_bytes: int
    compute_s: float
    memory_s: float
    launch_s: float
    grouped: bool
    launches: int = 1  # 0 for host-side shape arithmetic
    tile: int = 0
    transfer_factor: float = 1.0
    recomputed: int = 0
    buffers: ws_model.WorkingSet | None = field(default=None, repr=False, compare=False)

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.launch_s

    @property
    def bound(self) -> str:
        """What limits the kernel: 'compute', 'memory' or 'launch'."""
        work = max(self.compute_s, self.memory_s)
        if self.launch_s >= work:
            return "launch"
        return "compute" if self.compute_s >= self.memory_s else "memory"


def _fmt_time(s: float) -> str:
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


@dataclass
class PlanCost:
    """Predicted cost of running a graph under a plan on one device."""

    device: str
    kernels_detail: list[KernelCost]
    peak_activation_bytes: int
    weight_bytes: int
    buffer_bytes: int
    peak_step: int = 0
    unknown_nodes: list[str] = field(default_factory=list)

    @property
    def latency_s(self) -> float:
        return sum(k.time_s for k in self.kernels_detail)

    @property
    def kernels(self) -> int:
        """Kernels launched: a group counts what its emitted lowering launches (Conv + QuickGelu: 2)."""
        return sum(k.launches for k in self.kernels_detail)

    @property
    def bytes_moved(self) -> int:
        return sum(k.bytes for k in self.kernels_detail)

    @property
    def flops(self) -> int:
        return sum(k.flops for k in self.kernels_detail)

    @property
    def spill_bytes(self) -> int:
        return sum(k.spill_bytes for k in self.kernels_detail)

    @property
    def peak_memory_bytes(self) -> int:
        """Weights plus the peak of live activations and spill workspaces."""
        return self.peak_activation_bytes + self.weight_bytes

    @property
    def launch_s(self) -> float:
        return sum(k.launch_s for k in self.kernels_detail)

    def groups(self) -> list[KernelCost]:
        return [k for k in self.kernels_detail if k.grouped]

    def summary(self) -> dict:
        """Headline numbers, rounded (deterministic for printing)."""
        return {
            "device": self.device, "kernels": self.kernels, "latency_us": round(self.latency_s * 1e6, 1),
            "launch_us": round(self.launch_s * 1e6, 1), "MiB_moved": round(self.bytes_moved / 2**20, 2),
            "spill_MiB": round(self.spill_bytes / 2**20, 2), "peak_MiB": round(self.peak_memory_bytes / 2**20, 2),
            "peak_activation_MiB": round(self.peak_activation_bytes / 2**20, 2),
        }

    def table(self, max_rows: int | None = 20) -> str:
        """Per fusion group: kernels, traffic before/after, UB footprint, tile, transfer slowdown, time, bound."""
        header = ["group", "pattern", "kernels", "MiB unfused", "MiB fused", "UB KiB @16K", "tile KiB", "DMA x",
                  "time", "bound"]
        rows = [[k.id, k.pattern[:40], str(k.launches), f"{k.unfused_bytes / 2**20:.3f}", f"{k.bytes / 2**20:.3f}",
                 f"{k.working_set / 1024:.1f}", f"{k.tile / 1024:.1f}", f"{k.transfer_factor:.2f}",
                 _fmt_time(k.time_s), k.bound]
                for k in self.groups()]
        shown = rows if max_rows is None else rows[:max_rows]
        out = [f"device: {self.device}"]
        if shown:
            out += text_table(header, shown)
        if len(shown) < len(rows):
            out.append(f"... {len(rows) - len(shown)} more groups")
        s = self.summary()
        out.append(f"{s['kernels']} kernels ({len(self.groups())} groups), predicted {_fmt_time(self.latency_s)} "
                   f"(launch {_fmt_time(self.launch_s)}), {s['MiB_moved']:.2f} MiB moved")
        out.append((f"spill {s['spill_MiB']:.2f} MiB, " if self.spill_bytes else "")
                   + f"peak memory {s['peak_MiB']:.2f} MiB (activations {s['peak_activation_MiB']:.2f})")
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()


def _emitted_bytes(a: "Analysis", group, ns, produced: dict, outs: dict) -> int:
    """Intermediates the group's emitted lowering still writes (and reads back): what it does *not* save.

    A vertical group lowered to two kernels (Conv + QuickGelu) writes one output-sized intermediate; a
    horizontal group runs one wide op per chain position and a Split that copies the branch outputs once more;
    a mixed group (one function, one kernel on a fusing backend) writes none.
    """
    if group.kernels <= 1:
        return 0
    if group.kind == "horizontal":
        inner = sum(a.nbytes(v) or 0 for name, v in produced.items() if name not in outs)
        return inner + sum(a.nbytes(v) or 0 for v in outs.values())
    return (group.kernels - 1) * sum(a.nbytes(v) or 0 for v in outs.values())


def plan_cost(graph, plan: FusionPlan | None, device: Device | str, dims: dict | None = None, *,
              buffer_kb: float | None = None, precision: str | None = None,
              analysis: Analysis | None = None) -> PlanCost:
    """Predicted latency, traffic and peak memory of `graph` run under `plan` on `device`.

    `buffer_kb` is the on-chip buffer one kernel's tiles share (default: one core's UB, `Device.ub_kb`).
    """
    device = get_device(device)
    graph = as_graph(graph)
    a = (analysis or Analysis(graph, dims, precision or device.precision)).for_plan(plan)
    graph = a.graph  # a prepared plan is laid over the prepared graph it names
    plan = plan or FusionPlan()
    budget = int(buffer_kb * 1024) if buffer_kb is not None else device.ub_bytes
    ks = schedule.kernels_of(a.order, plan)
    group_by_id = {g.id: g for g in plan}
    left = plan.left_over()
    kernels = [_kernel_cost(a, ks, k, group_by_id.get(k), plan, left, device, budget) for k in ks.order]
    workspace = [k.spill_bytes // 2 for k in kernels]
    peak, peak_step = schedule.peak_live(ks, graph.inputs(), a.nbytes, workspace)
    weight_values = {}
    for n in a.order:
        for v in n.inputs:
            if v is not None and _is_const(v):
                weight_values[v.name] = a.nbytes(v) or 0
    return PlanCost(device=device.name, kernels_detail=kernels, peak_activation_bytes=peak,
                    weight_bytes=sum(weight_values.values()), buffer_bytes=budget, peak_step=peak_step,
                    unknown_nodes=[c.name for c in a.costs.values() if not c.known])


def _members(a: Analysis, ks: schedule.Kernels, k: str) -> tuple[list[ws_model.Member], dict, dict]:
    """The kernel's members for the working-set model, its external inputs and the values it writes."""
    ns = ks.members[k]
    inside = ks.inside(k)
    pos = {id(n): i for i, n in enumerate(ns)}
    ext_in: dict[str, ir.Value] = {}
    outs: dict[str, ir.Value] = {}
    members = []
    for n in ns:
        reads, writes, keeps = [], [], []
        for v in n.inputs:
            if v is None or (v.producer() is not None and id(v.producer()) in inside):
                continue
            ext_in[v.name] = v
            reads.append((v.name, a.nbytes(v) or 0))
        for o in n.outputs:
            if ks.written(k, o):
                outs[o.name] = o
                writes.append((o.name, a.nbytes(o) or 0))
            else:
                last = [pos[id(u.node)] for u in o.uses() if id(u.node) in inside]
                if last:
                    keeps.append((o.name, a.nbytes(o) or 0, max(last)))
        members.append(ws_model.Member(cube=classify(n, a.shapes) == OpKind.OUT_EWISE_FUSABLE, reads=tuple(reads), writes=tuple(writes),
                                       keeps=tuple(keeps), op=n.op_type))
    return members, ext_in, outs


def _kernel_cost(a: Analysis, ks: schedule.Kernels, k: str, group, plan: FusionPlan, left: dict[str, int],
                 device: Device, budget: int) -> KernelCost:
    """One kernel: its transfers at the tile it fits, its emitted intermediates, FLOPs and launches.

    A group launches what its rewrite left in the model and the kernels of groups it absorbed that still run
    (`FusionPlan.launches_of`); their launch overhead is counted here, their traffic is priced as the group's
    (an approximation: the value between a left-over kernel and the group, e.g. MultiHeadAttention's output,
    is not charged)."""
    ns = ks.members[k]
    members, ext_in, outs = _members(a, ks, k)
    ws = ws_model.working_set(members)
    costs = [a.costs[n.name] for n in ns if n.name in a.costs]
    host = bool(costs) and all(c.host for c in costs)
    views = all(n.op_type in VIEW_OPS for n in ns)
    tile = ws.fit_tile(budget)
    spill = 0
    if tile is None:  # not even one 32-byte block per buffer fits: the intermediates go to device memory
        spill = sum(b.bytes for b in ws.intermediates())
        tile = ws_model.BLOCK_BYTES
    produced = {o.name: o for n in ns for o in n.outputs}
    emitted = _emitted_bytes(a, group, ns, produced, outs) if group is not None else 0
    moved = sum(b.bytes for b in ws.transfers())
    traffic = 0 if views or host else moved + 2 * spill + 2 * emitted
    factor = ws.transfer_time_factor(tile, device.efficient_transfer_kb)
    launches = 0 if host else (plan.launches_of(group, left) if group is not None else 1)
    dtype = a.compute_dtype(ns[-1])
    return KernelCost(
        id=k, nodes=[n.name for n in ns], pattern="+".join(n.op_type for n in ns), flops=sum(c.flops for c in costs),
        bytes=traffic, unfused_bytes=sum(c.bytes for c in costs),
        working_set=ws.bytes_at(int(ws_model.DEFAULT_TILE_KB * 1024)) if len(ns) > 1 else 0, spill_bytes=2 * spill,
        compute_s=sum(c.flops for c in costs) / device.peak_flops(dtype),
        memory_s=traffic * factor / device.bandwidth, launch_s=device.launch_overhead_us * 1e-6 * launches,
        grouped=group is not None, launches=launches, tile=tile, transfer_factor=factor,
        recomputed=sum(1 for n in ns if group is not None and n.name in group.recompute), buffers=ws)


def as_launched(plan: FusionPlan | None) -> FusionPlan:
    """The plan as onnxruntime runs the emitted model: groups lowered to model-local functions run unfused.

    onnxruntime inlines an ONNX function when it loads the model, so a mixed group (or a vertical group
    lowered to a function) launches its member ops one by one; every other group launches what its
    lowering emits (`FusionGroup.kernels`). Cost this plan to predict what onnxruntime measures.
    """
    plan = plan or FusionPlan()
    keep = {g.id for g in plan if g.lowered_to != "function" and "function" not in g.extra}
    # a kept group a dropped function took its kernels from (a vertical FusedConv inside a mixed group) runs its
    # whole lowering again, as the inlined function's member op: `_kept` restores its kernels
    return FusionPlan(plan._kept(keep), model=plan.model, notes=list(plan.notes), options=dict(plan.options))


def one_kernel_per_group(plan: FusionPlan | None) -> FusionPlan:
    """The plan as a fusing backend lowers it: every group one kernel (CANN's UB fusion, a custom op, a codegen)."""

    plan = plan or FusionPlan()
    groups = [replace(g, kernels=1, runs=None, saved_launches=len(g.nodes) - 1, covers=list(g.covers),
                      nodes=list(g.nodes)) for g in plan]  # runs: what fuse's lowering left, not this one's
    return FusionPlan(groups, model=plan.model, notes=list(plan.notes), options=dict(plan.options))


def predicted_speedup(graph, plan: FusionPlan, device: Device | str, dims: dict | None = None, **kw) -> float:
    """Predicted latency without fusion divided by latency with `plan`."""
    device = get_device(device)
    graph = as_graph(graph)
    a = Analysis(graph, dims, kw.pop("precision", None) or device.precision)
    base = plan_cost(graph, None, device, analysis=a, **kw)
    return base.latency_s / plan_cost(graph, plan, device, analysis=a, **kw).latency_s


@dataclass
class CostTable:
    """Plans x devices: predicted latency, speedup over the first plan, traffic and peak memory."""

    rows: list[dict]

    def table(self) -> str:
        header = ["plan", "device", "kernels", "latency", "speedup", "MiB moved", "peak MiB"]
        cells = [[r["plan"], r["device"], str(r["kernels"]), _fmt_time(r["latency_s"]), f"{r['speedup']:.2f}x",
                  f"{r['MiB_moved']:.2f}", f"{r['peak_MiB']:.2f}"] for r in self.rows]
        return "\n".join(text_table(header, cells))

    def __str__(self) -> str:
        return self.table()

    def _repr_html_(self) -> str:
        return "<pre>" + html.escape(self.table()) + "</pre>"


def compare(graph, plans: dict[str, FusionPlan | None], devices: list | None = None, dims: dict | None = None,
            **kw) -> CostTable:
    """Cost every plan on every device; speedup is against the first plan on the same device."""
    graph = as_graph(graph)
    devices = [get_device(d) for d in (devices if devices is not None else list(load_devices().values()))]
    rows = []
    prepared: dict = {}  # each plan's prepared graph made once, whatever the number of devices
    for dev in devices:
        a = Analysis(graph, dims, kw.get("precision") or dev.precision)
        base = None
        for name, plan in plans.items():
            c = plan_cost(graph, plan, dev, analysis=a.for_plan(plan, prepared), buffer_kb=kw.get("buffer_kb"))
            base = base if base is not None else c.latency_s
            rows.append({"plan": name, "device": dev.name, "kernels": c.kernels, "latency_s": c.latency_s,
                         "speedup": base / c.latency_s, "MiB_moved": round(c.bytes_moved / 2**20, 3),
                         "peak_MiB": round(c.peak_memory_bytes / 2**20, 3)})
    return CostTable(rows)


def schedule_of(model, plan: FusionPlan | None = None) -> tuple[Analysis, schedule.Kernels]:
    """(the `Analysis` of `model` under `plan`, its kernels in order): fp32, batch 1, the cost model's schedule."""
    a = Analysis(as_graph(model), None, None).for_plan(plan)
    return a, schedule.kernels_of(a.order, plan or FusionPlan())


def run_of(model, plan: FusionPlan | None = None) -> schedule.Run:
    """`model` (fp32, batch 1) run unfused or under `plan`, as the cost model's schedule sees it: per kernel in
    order, the tensors it reads from memory and those it writes, with their bytes (notebook 18 §2)."""
    a, ks = schedule_of(model, plan)
    steps = []
    for k in ks.order:
        reads: list[str] = []
        writes: dict[str, int] = {}
        for n in ks.members[k]:
            for v in n.inputs:
                if v is not None and not _is_const(v) and k in ks.readers(v) and v.name not in reads:
                    reads.append(v.name)
            for o in n.outputs:
                if ks.written(k, o):
                    writes[o.name] = a.nbytes(o) or 0
        steps.append(schedule.Step(k, tuple(reads), writes))
    return schedule.Run({v.name: a.nbytes(v) or 0 for v in a.graph.inputs()}, tuple(steps),
                        tuple(v.name for v in a.graph.outputs()))
