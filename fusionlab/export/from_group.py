"""From a fusion group to a custom op: derive the declaration, replace the group, keep the graph valid.

`declare_group(graph, group)` reads the member nodes and derives everything the declaration needs:

- inputs: the values flowing into the group (a Conv's data/weight/bias become CANN's x/filter/bias);
- attributes: inherited from the member ops under their CANN built-in names and layouts (ONNX Conv
  `group` becomes Conv2D `groups`; `strides`/`dilations` become 4-D NCHW lists; ONNX pads
  (top, left, bottom, right) become Conv2D pads (top, bottom, left, right));
- the name: from the member op types (`ConvRelu`);
- Conv+BatchNormalization is folded at declaration time (`fusionlab.analysis.derive.fold_conv_bn`), so a
  Conv+BN+ReLU group becomes a `ConvRelu` with folded weights: the kernel never sees BN, exactly as
  CANN's ConvBatchnormFusionPass folds BN into the filter before any kernel runs.

A group whose rewrite cannot be proven legal (several outputs, training-mode BN, non-constant BN
parameters, auto_pad, non-float32 tensors, ops without a kernel) raises `UnsupportedGroup` and nothing
is changed. `replace_groups` rewrites a copy of the graph, never the input.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from ..analysis.derive import fold_conv_bn
from ..graph import Graph
from ..passes.prepare import graph_of
from ..plan import FusionGroup, FusionPlan
from .declare import BUILTINS, OpDecl, Step, name_for, reg_op
from .kernels import DOMAIN, encode_attr, register

__all__ = ["UnsupportedGroup", "CustomOp", "CustomOpResult", "declare_group", "replace_groups", "FLOAT_TYPES"]

#: the types a fused float op declares (those of the CANN Conv2D built-in it replaces)
FLOAT_TYPES = ("DT_FLOAT16", "DT_FLOAT")


class UnsupportedGroup(ValueError):
    """A fusion group that cannot become a custom op; the message says why, in one line."""


@dataclass
class CustomOp:
    """One group turned into a custom op: its declaration and how the node is wired."""

    group_id: str
    decl: OpDecl
    inputs: list[str]  # graph value names, in declaration order ("" = new initializer below)
    attrs: dict  # declared attribute values for this node
    output: str  # graph value the op produces
    members: list[str]  # node names it replaces
    new_initializers: dict = field(default_factory=dict)  # decl input name -> array (folded weights ...)
    node_name: str = ""


@dataclass
class CustomOpResult:
    """The rewritten graph and one CustomOp per replaced group."""

    graph: Graph
    ops: list[CustomOp]

    def declarations(self) -> dict[str, OpDecl]:
        """Distinct declarations by name (groups of the same pattern share one op)."""
        out: dict[str, OpDecl] = {}
        for op in self.ops:
            out.setdefault(op.decl.name, op.decl)
        return dict(sorted(out.items()))


def _attr(node: ir.Node, name: str, default=None):
    a = node.attributes.get(name)
    return default if a is None else a.value


def _conv_attrs(node: ir.Node, group_id: str) -> dict:
    auto_pad = _attr(node, "auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", b"NOTSET"):
        raise UnsupportedGroup(f"group {group_id}: Conv {node.name!r} uses auto_pad={auto_pad}; explicit pads only")
    w = node.inputs[1]
    if w is None or w.shape is None or len(w.shape) != 4:
        raise UnsupportedGroup(f"group {group_id}: Conv {node.name!r} is not a 2-D convolution")
    s = list(_attr(node, "strides", [1, 1]))
    d = list(_attr(node, "dilations", [1, 1]))
    p = list(_attr(node, "pads", [0, 0, 0, 0]))
    return {"strides": [1, 1, *s], "pads": [p[0], p[2], p[1], p[3]], "dilations": [1, 1, *d],
            "groups": int(_attr(node, "group", 1)), "data_format": "NCHW"}


_CONV_DECL = [("strides", "ListInt", None), ("pads", "ListInt", None), ("dilations", "ListInt", [1, 1, 1, 1]),
              ("groups", "Int", 1), ("data_format", "String", "NCHW")]


def _members(graph: Graph, group: FusionGroup) -> list[ir.Node]:
    """The group's nodes in topological order, each a standard single-output op with a kernel."""
    gid = group.id
    try:
        members = [graph.node(n) for n in group.covers]
    except KeyError as exc:
        raise UnsupportedGroup(f"group {gid}: node {exc.args[0]!r} is not in the model") from None
    order = {id(n): i for i, n in enumerate(graph.topological_order())}
    members.sort(key=lambda n: order[id(n)])
    for n in members:
        if n.domain not in ("", "ai.onnx"):
            raise UnsupportedGroup(f"group {gid}: {n.domain}:{n.op_type} is not a standard ONNX op")
        if n.op_type not in BUILTINS:
            raise UnsupportedGroup(f"group {gid}: no kernel for {n.op_type} (supported: {', '.join(BUILTINS)})")
        if len([o for o in n.outputs if o is not None and o.name]) != 1:
            raise UnsupportedGroup(f"group {gid}: {n.op_type} {n.name!r} has more than one output")
    return members


@dataclass
class _Folded:
    """The group once BatchNormalization is folded into its Conv: the nodes the kernel computes."""

    kernel_nodes: list[ir.Node] = field(default_factory=list)
    weights: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # conv node id -> (W', b')
    alias: dict[int, ir.Value] = field(default_factory=dict)  # BN output -> conv output
    types: list[str] = field(default_factory=list)  # op types folded away

    def resolve(self, v: ir.Value) -> ir.Value:
        """The value that stands for `v` after folding (a BN output becomes its Conv's output)."""
        return self.alias.get(id(v), v)


def _fold_one_bn(graph: Graph, gid: str, bn: ir.Node, member_ids: set[int]):
    """(the Conv before `bn`, the folded weights) when folding is provably legal; else UnsupportedGroup."""
    src = bn.inputs[0]
    conv = src.producer() if src is not None else None
    if conv is None or id(conv) not in member_ids or conv.op_type != "Conv":
        raise UnsupportedGroup(f"group {gid}: BatchNormalization {bn.name!r} does not follow a Conv of the group")
    if len(Graph.consumers(src)) != 1 or graph.is_graph_output(src):
        raise UnsupportedGroup(f"group {gid}: the Conv output feeding {bn.name!r} is also used elsewhere")
    if int(_attr(bn, "training_mode", 0)):
        raise UnsupportedGroup(f"group {gid}: BatchNormalization {bn.name!r} is in training mode; never fold it")
    params = [graph.constant(v) for v in bn.inputs[1:5]]
    weight = graph.constant(conv.inputs[1])
    has_bias = len(conv.inputs) > 2 and conv.inputs[2] is not None
    bias = graph.constant(conv.inputs[2]) if has_bias else None
    if any(p is None for p in params) or weight is None or (has_bias and bias is None):
        raise UnsupportedGroup(f"group {gid}: weights or BN statistics of {bn.name!r} are not constants")
    f = fold_conv_bn(weight, bias, *params, eps=float(_attr(bn, "epsilon", 1e-5)), group=int(_attr(conv, "group", 1)))
    if f.overflow:
        raise UnsupportedGroup(f"group {gid}: folded weights overflow {weight.dtype}")
    return conv, f


def _fold_batchnorms(graph: Graph, gid: str, members: list[ir.Node]) -> _Folded:
    """Fold every BatchNormalization of the group into the Conv before it; at least two ops must remain."""
    member_ids = {id(n) for n in members}
    out = _Folded()
    for n in members:
        if n.op_type != "BatchNormalization":
            out.kernel_nodes.append(n)
            continue
        conv, f = _fold_one_bn(graph, gid, n, member_ids)
        out.weights[id(conv)] = (f.weight, f.bias)
        out.alias[id(n.outputs[0])] = conv.outputs[0]
        out.types.append("BatchNormalization")
    if len(out.kernel_nodes) < 2:
        kinds = "+".join(n.op_type for n in members)
        raise UnsupportedGroup(f"group {gid}: {kinds} is a single op after folding; no custom op is needed")
    return out


def _single_output(graph: Graph, gid: str, members: list[ir.Node]) -> ir.Value:
    """The one value that leaves the group (read outside it or a graph output)."""
    member_ids = {id(n) for n in members}
    outs = []
    for n in members:
        v = n.outputs[0]
        if graph.is_graph_output(v) or any(id(c) not in member_ids for c in Graph.consumers(v)):
            outs.append(v)
    if len(outs) != 1:
        raise UnsupportedGroup(f"group {gid}: {len(outs)} values leave the group; a custom op here needs exactly one")
    return outs[0]


class _Body:
    """The declaration's inputs, attributes and body steps, built one kernel node at a time."""

    def __init__(self, graph: Graph, gid: str, folded: _Folded, out_value: ir.Value):
        self.graph, self.gid, self.folded = graph, gid, folded
        self.out_value = folded.resolve(out_value)
        self.in_names: list[str] = []  # declaration input names
        self.in_values: list[str] = []  # graph value names ("" for new initializers)
        self.new_inits: dict[str, np.ndarray] = {}
        self.env: dict[int, str] = {}  # id(graph value) -> body name
        self.attrs: dict = {}
        self.steps: list[Step] = []
        self.dtypes: set = set()
        self._acts = self._consts = 0

    def external(self, v: ir.Value, role: str | None = None) -> str:
        """The body name of a value from outside the group, declared as an input on first use."""
        if id(v) in self.env:
            return self.env[id(v)]
        if role is None:
            if self.graph.constant(v) is not None:
                role = f"const{self._consts}"
                self._consts += 1
            else:
                role = "x" if self._acts == 0 else f"x{self._acts}"
                self._acts += 1
        self.env[id(v)] = role
        self.in_names.append(role)
        self.in_values.append(v.name)
        self.dtypes.add(v.dtype)
        return role

    def new_initializer(self, role: str, arr: np.ndarray) -> str:
        """An input the rewrite creates as a fresh initializer (folded weights, a stand-in zero bias)."""
        self.in_names.append(role)
        self.in_values.append("")
        self.new_inits[role] = arr
        return role

    def _claim_attr(self, name: str, op_type: str) -> None:
        """Refuse a second op of the same type: both would read one attribute name."""
        if name in self.attrs:
            raise UnsupportedGroup(f"group {self.gid}: two {op_type}s in one group would share attribute names")

    def _conv_inputs(self, n: ir.Node) -> list[str]:
        """x, filter and bias of a Conv (folded weights, or a zero bias where the Conv has none)."""
        names = [self.external(self.folded.resolve(n.inputs[0]))]
        if id(n) in self.folded.weights:
            w, bias = self.folded.weights[id(n)]
            return names + [self.new_initializer("filter", w), self.new_initializer("bias", bias)]
        names.append(self.external(n.inputs[1], "filter"))
        if len(n.inputs) > 2 and n.inputs[2] is not None:
            return names + [self.external(n.inputs[2], "bias")]
        # the PyOp bridge has a fixed arity: an all-zero bias stands in for the absent one
        c_out = n.inputs[1].shape[0] if n.inputs[1].shape is not None else None
        if not isinstance(c_out, int):
            raise UnsupportedGroup(f"group {self.gid}: Conv {n.name!r} weight shape unknown")
        return names + [self.new_initializer("bias", np.zeros(c_out, dtype=np.float32))]

    def add(self, n: ir.Node) -> None:
        """One body step for a kernel node, with the inputs and attributes it reads."""
        if n.op_type == "Conv":
            self._claim_attr("strides", "Conv")
            self.attrs.update(_conv_attrs(n, self.gid))
            names = self._conv_inputs(n)
            step_attrs: tuple = tuple(k for k, _, _ in _CONV_DECL)
        else:
            names = [self.external(self.folded.resolve(v)) for v in n.inputs if v is not None]
            step_attrs = ()
            if n.op_type == "LeakyRelu":
                self._claim_attr("negative_slope", "LeakyRelu")
                self.attrs["negative_slope"] = float(_attr(n, "alpha", 0.01))
                step_attrs = ("negative_slope",)
        out = self.folded.resolve(n.outputs[0])
        body_name = "y" if out is self.out_value else f"t{len(self.steps)}"
        self.env[id(out)] = body_name
        self.steps.append(Step(n.op_type, tuple(names), body_name, step_attrs))


def _declaration(op_name: str, body: _Body, kernel_types: tuple, folded_types: list[str]) -> OpDecl:
    """The REG_OP declaration of the fused op: float inputs, output y, the inherited attributes."""
    b = reg_op(op_name)
    for role in body.in_names:
        if role == "bias":
            b.OPTIONAL_INPUT(role, FLOAT_TYPES)
        else:
            b.INPUT(role, FLOAT_TYPES)
    b.OUTPUT("y", FLOAT_TYPES)
    if "strides" in body.attrs:
        for a, t, default in _CONV_DECL:
            if default is None:
                b.REQUIRED_ATTR(a, t)
            else:
                b.ATTR(a, t, default)
    if "negative_slope" in body.attrs:
        b.ATTR("negative_slope", "Float", 0.01)
    b.fuses(*kernel_types, folded=tuple(folded_types)).body(body.steps)
    return b.OP_END_FACTORY_REG(op_name)


def declare_group(graph: Graph, group: FusionGroup, name: str | None = None) -> CustomOp:
    """Derive the custom-op declaration for a fusion group (UnsupportedGroup if it cannot be one)."""
    gid = group.id
    members = _members(graph, group)
    folded = _fold_batchnorms(graph, gid, members)
    out_value = _single_output(graph, gid, members)
    body = _Body(graph, gid, folded, out_value)
    for n in folded.kernel_nodes:
        body.add(n)
    if any(d is not None and d != ir.DataType.FLOAT for d in body.dtypes):
        raise UnsupportedGroup(f"group {gid}: the onnxruntime prototype runs float32 tensors only")
    kernel_types = tuple(n.op_type for n in folded.kernel_nodes)
    op_name = name or name_for(kernel_types)
    decl = _declaration(op_name, body, kernel_types, folded.types)
    return CustomOp(gid, decl, body.in_values, body.attrs, out_value.name, [n.name for n in members], body.new_inits,
                    node_name=f"{op_name}_{gid}")


def _replace(graph: Graph, op: CustomOp) -> None:
    g = graph.graph
    members = [graph.node(n) for n in op.members]
    values: list[ir.Value] = []
    for role, vname in zip([t.name for t in op.decl.inputs], op.inputs):
        if vname:
            values.append(graph.value(vname))
        else:
            arr = op.new_initializers[role]
            v = ir.Value(name=f"{op.node_name}.{role}", shape=ir.Shape(arr.shape), type=ir.TensorType(ir.DataType.FLOAT),
                         const_value=ir.Tensor(np.ascontiguousarray(arr, dtype=np.float32), name=f"{op.node_name}.{role}"))
            g.register_initializer(v)
            values.append(v)
    wire = []
    for a in op.decl.attrs:
        value = encode_attr(a.type, op.attrs.get(a.name, a.default))
        if isinstance(value, str):
            wire.append(ir.AttrString(a.name, value))
        elif isinstance(value, float):
            wire.append(ir.AttrFloat32(a.name, value))
        else:
            wire.append(ir.AttrInt64(a.name, value))
    old = graph.value(op.output)
    new = ir.Value(name=f"{op.output}.custom", shape=old.shape, type=old.type)
    node = ir.Node(DOMAIN, op.decl.name, values, wire, outputs=[new], name=op.node_name)
    order = {id(n): i for i, n in enumerate(g)}
    last = max(members, key=lambda n: order[id(n)])
    g.insert_before(last, node)
    was_output = graph.is_graph_output(old)
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    old.name, new.name = f"{op.output}.replaced", op.output
    g.remove(members, safe=True)
    if was_output:
        assert new.is_graph_output()
    # drop initializers nothing reads any more (the unfolded weights, BN statistics)
    for name, v in list(g.initializers.items()):
        if not v.uses() and not v.is_graph_input() and not v.is_graph_output():
            del g.initializers[name]


def replace_groups(model, plan: FusionPlan | FusionGroup | list, ids: list[str] | None = None, *,
                   register_kernels: bool = True) -> CustomOpResult:
    """A copy of `model` with each chosen plan group replaced by its custom op (kernels registered).

    Given a whole `FusionPlan`, the groups are laid over the graph it names (`passes.prepare.graph_of`: the
    prepared copy for a plan made with preparation, where an Identity between a Conv and its BN is gone)."""
    source = model if isinstance(model, Graph) else __import__("fusionlab.graph", fromlist=["load"]).load(model)
    if isinstance(plan, FusionPlan):
        source = graph_of(source, plan)
    groups = [plan] if isinstance(plan, FusionGroup) else list(plan)
    if ids is not None:
        known = {g.id for g in groups}
        missing = [i for i in ids if i not in known]
        if missing:
            raise UnsupportedGroup(f"no group {', '.join(map(repr, missing))} in the plan")
        groups = [g for g in groups if g.id in set(ids)]
    ops = [declare_group(source, g) for g in groups]  # all derived first: nothing is changed on failure
    by_name: dict[str, OpDecl] = {}
    for op in ops:
        prev = by_name.setdefault(op.decl.name, op.decl)
        if prev.signature() != op.decl.signature():
            raise UnsupportedGroup(f"group {op.group_id}: derives a {op.decl.name} that differs from another "
                                   f"group's {op.decl.name}; replace them separately with distinct names")
    graph = source.copy()
    for op in ops:
        _replace(graph, op)
    graph.graph.opset_imports[DOMAIN] = 1
    if register_kernels:
        for decl in by_name.values():
            register(decl)
    return CustomOpResult(graph, ops)
