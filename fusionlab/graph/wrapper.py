"""The `Graph` wrapper around an `onnx_ir.Model` (use-def chains, no protobuf index juggling) and the
queries fusion passes ask again and again: who produces a value, who consumes it, what constant it
holds (seen through `Identity`), the topological order, the graph outputs; `ModelError`, and
`save_model` (atomic, never onto the input)."""

from __future__ import annotations

import heapq
import os
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from ..files import replacing
from .names import Names, name_nodes

__all__ = ["DEFAULT_DOMAIN", "Graph", "ModelError", "PROTOBUF_LIMIT", "attr", "consumers", "is_op", "onnx_opset", "save_model", "sole_consumer"]

#: protobuf cannot serialise a message of 2 GiB or more; bigger models must use external data.
PROTOBUF_LIMIT = 2**31 - 1


class ModelError(ValueError):
    """A model that cannot be loaded or processed; the message is one line naming the file and the problem."""

    def __init__(self, source: str, problem: str):
        self.source = source
        self.problem = problem
        super().__init__(f"{source}: {problem}")


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
    total = sum(
        (v.const_value.nbytes if v.const_value is not None else 0) for v in model.graph.initializers.values()
    )

    with replacing(path) as tmp:
        if total > external_data_threshold:
            ir.save(model, tmp, format="protobuf", external_data=f"{path.name}.data")
        else:
            tmp.write_bytes(ir.serde.serialize_model(model).SerializeToString())
    return path


# --------------------------------------------------------------------------------------------------
# the graph object and its queries
# --------------------------------------------------------------------------------------------------

class Graph:
    """A loaded model plus the queries passes need: fusionlab's `Graph`, not onnx-ir's.

    `graph.model` is the underlying `onnx_ir.Model` and `graph.graph` its main `ir.Graph` (the node list). Code
    in fusionlab names a `Graph` `graph` (or `g`) and an `ir.Graph` by what it is: `body`, `subgraph`."""

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
        return onnx_opset(self.model)

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



def onnx_opset(model, default: int | None = 0) -> int | None:
    """The default-domain opset (imported as "" or as "ai.onnx") of an `onnx.ModelProto`, an `onnx_ir.Model` or a
    `Graph`; `default` when the model imports none."""
    if isinstance(model, Graph):
        model = model.model
    if isinstance(model, onnx.ModelProto):
        imports = {o.domain: o.version for o in model.opset_import}
    else:
        imports = model.graph.opset_imports
    return imports.get("", imports.get("ai.onnx", default))


# --------------------------------------------------------------------------------------------------
# the pattern vocabulary rules are written in (fusionlab.passes.engine hands it on)
# --------------------------------------------------------------------------------------------------
#: The default ONNX domain, under both of its names.
DEFAULT_DOMAIN = ("", "ai.onnx")


def is_op(node: ir.Node | None, *ops: str, domain: Sequence[str] = DEFAULT_DOMAIN) -> bool:
    return node is not None and node.domain in domain and node.op_type in ops


def attr(node: ir.Node, name: str, default=None):
    a = node.attributes.get(name)
    return default if a is None else a.value


def consumers(value: ir.Value) -> list[ir.Node]:
    """Distinct nodes reading `value`, in use order."""
    return Graph.consumers(value)


def sole_consumer(value: ir.Value) -> ir.Node | None:
    """The only node reading `value` (once), or None if it is a graph output or read elsewhere."""
    if value.is_graph_output():
        return None
    uses = list(value.uses())
    if len(uses) != 1:
        return None
    node = uses[0].node
    owner = value.producer().graph if value.producer() is not None else value.graph
    return node if node.graph is owner else None
