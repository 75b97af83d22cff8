"""Clean-up before fusion: unique node names, Identity and inference-Dropout removal, dead code.

Exported models often route weights through `Identity` nodes or keep `Dropout` nodes that do nothing at
inference time; a fusion pass that looks for `Conv -> BatchNormalization` must see through them. This
module removes them without changing what the model computes:

- `Identity(x) -> y`: uses of `y` read `x` instead. When `y` is a graph output the node stays unless
  `x` is an ordinary intermediate value, which is then renamed `y` (graph-output names never change).
- `Dropout` is removed only when it is provably the identity: no `training_mode` input, or a constant
  false one, and its mask output unused.
- nodes none of whose outputs are used, and initializers nothing reads, are deleted;
- `Constant` nodes become initializers (IR version 4 and later): at run time a Constant is a kernel
  launch that copies its value every run, an initializer is not.

As a pass (`fuse(model, passes=("cleanup",))`) it plans no fusion groups; its plan carries notes.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..graph import Graph, name_nodes
from ..plan import FusionPlan
from . import engine
from .options import check_options

__all__ = ["clean", "needed", "ensure_node_names", "remove_dead", "lift_constants", "bypass", "plan", "apply", "OPTIONS"]

#: clean-up takes no options
OPTIONS: dict = {}

_DEFAULT = ("", "ai.onnx")


def ensure_node_names(graph: Graph) -> int:
    """Give every unnamed or duplicate-named node a unique name (`fusionlab.graph.name_nodes`); returns how many."""
    return len(name_nodes(graph.graph))


def _is_noop_dropout(graph: Graph, node: ir.Node) -> bool:
    if node.op_type != "Dropout" or node.domain not in _DEFAULT or not node.inputs or node.inputs[0] is None:
        return False
    if len(node.outputs) > 1 and (node.outputs[1].uses() or node.outputs[1].is_graph_output()):
        return False
    is_test = node.attributes.get("is_test")
    if graph.opset < 7 and (is_test is None or is_test.value == 0):
        return False
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        mode = graph.constant(node.inputs[2])
        if mode is None or (mode.size and bool(mode.reshape(-1)[0])):
            return False
    return True


def bypass(graph: Graph, node: ir.Node, *, keep: int) -> bool:
    """Remove `node`, which computes exactly its input `keep`: its readers read that input instead.

    The caller names the input the node forwards (an Identity or Dropout its input 0, a no-op ``ones * x`` its
    input 1): the operand that was proven to pass through is the one forwarded, by construction. False (nothing
    changed) if a graph-output name forbids it. A graph output taken over keeps its declared type and shape:
    that declaration is the model's interface.
    """
    g = graph.graph
    x, y = node.inputs[keep] if keep < len(node.inputs) else None, node.outputs[0]
    if x is None:
        return False
    if any(extra.uses() or extra.is_graph_output() for extra in node.outputs[1:]):
        return False
    if y.is_graph_output():
        # Only an intermediate value produced in this graph may take over the output's name.
        if x.is_graph_input() or x.is_initializer() or x.is_graph_output() or x.producer() is None:
            return False
        if x.producer().graph is not g:
            return False
        if y.type is not None:
            x.type = y.type
        if y.shape is not None:
            x.shape = y.shape
        name = y.name
        y.name = f"{name}__bypassed"
        y.replace_all_uses_with(x, replace_graph_outputs=True)
        x.name = name
    else:
        if x.type is None:
            x.type = y.type
        if x.shape is None:
            x.shape = y.shape
        y.replace_all_uses_with(x)
    g.remove(node, safe=True)
    return True


def remove_dead(graph: Graph) -> tuple[int, int]:
    """Delete nodes whose outputs nobody reads, then unread initializers; returns (nodes, initializers).

    A graph without outputs computes nothing anyone can see; it is left as it is rather than emptied.
    """
    g = graph.graph
    if not len(g.outputs):
        return 0, 0
    dead_nodes = 0
    for node in reversed(list(g)):
        if any(v.uses() or v.is_graph_output() for v in node.outputs):
            continue
        g.remove(node, safe=True)
        dead_nodes += 1
    dead_inits = 0
    for name, value in list(g.initializers.items()):
        if not value.uses() and not value.is_graph_output() and not value.is_graph_input():
            del g.initializers[name]
            dead_inits += 1
    return dead_nodes, dead_inits


def _liftable_constants(graph: Graph) -> int:
    if graph.model.ir_version is not None and graph.model.ir_version < 4:
        return 0  # before IR 4 every initializer must also be a graph input
    return sum(1 for n in graph.graph if n.op_type == "Constant" and n.domain in _DEFAULT
               and len(n.attributes) == 1 and not n.outputs[0].is_graph_output())


def lift_constants(graph: Graph) -> int:
    """Turn Constant nodes of the main graph into initializers (IR >= 4); returns how many."""
    if _liftable_constants(graph) == 0:
        return 0
    lifted = 0
    for node in list(graph.graph):
        if not (node.op_type == "Constant" and node.domain in _DEFAULT and len(node.attributes) == 1):
            continue
        out = node.outputs[0]
        if out.is_graph_output():
            continue
        array = graph.constant(out)  # reads value / value_float(s) / value_int(s) alike
        if array is None or out.name in graph.graph.initializers:
            continue
        # A new tensor, not the attribute's own: the attribute may be shared with the caller's model
        # (Graph.copy shares tensor data), and renaming it would change that model.
        value = ir.Value(name=out.name, shape=ir.Shape(array.shape),
                         type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                         const_value=ir.tensor(np.array(array), name=out.name))
        out.replace_all_uses_with(value)
        graph.graph.remove(node, safe=True)
        graph.graph.register_initializer(value)
        lifted += 1
    return lifted


def _counts(graph: Graph) -> dict[str, int]:
    identity = sum(1 for n in graph.graph if n.op_type == "Identity" and n.domain in _DEFAULT)
    dropout = sum(1 for n in graph.graph if _is_noop_dropout(graph, n))
    return {"Constant": _liftable_constants(graph), "Identity": identity, "Dropout": dropout}


def needed(graph: Graph) -> bool:
    """True if `clean` would change the graph (Identity/Dropout present, unnamed or duplicate node names, dead code)."""
    names = [n.name for n in graph.graph]
    if any(not n for n in names) or len(set(names)) != len(names):
        return True
    if any(_counts(graph).values()):
        return True
    for node in graph.graph:
        if not any(v.uses() or v.is_graph_output() for v in node.outputs):
            return True
    return any(not v.uses() and not v.is_graph_output() and not v.is_graph_input()
               for v in graph.graph.initializers.values())


def clean(graph: Graph) -> dict[str, int]:
    """Clean `graph` in place; returns what was removed or renamed, by kind (sorted)."""
    report = {"renamed nodes": ensure_node_names(graph), "Identity": 0, "Dropout": 0}
    for node in list(graph.graph):
        if node.graph is not graph.graph:
            continue
        if node.op_type == "Identity" and node.domain in _DEFAULT and len(node.inputs) == 1:
            report["Identity"] += int(bypass(graph, node, keep=0))
        elif _is_noop_dropout(graph, node):
            report["Dropout"] += int(bypass(graph, node, keep=0))
    report["Constant"] = lift_constants(graph)
    report["dead nodes"], report["dead initializers"] = remove_dead(graph)
    return dict(sorted(report.items()))


def plan(graph: Graph, **options) -> FusionPlan:
    """No fusion groups; notes say what clean-up would remove."""
    check_options("cleanup", options, OPTIONS)
    counts = _counts(graph)
    notes = [f"cleanup: {n} {kind} node(s) to remove" for kind, n in sorted(counts.items()) if n]
    return FusionPlan(model=graph.name, notes=notes)


def apply(graph: Graph, plan: FusionPlan, **options) -> FusionPlan:
    """Clean the graph in place; returns the plan as written, what was done in its notes (the plan is unchanged)."""
    check_options("cleanup", options, OPTIONS)
    done = clean(graph)
    written = engine.written(plan, plan)
    written.notes.append("cleanup: " + ", ".join(f"{k} {v}" for k, v in done.items() if v) if any(done.values())
                      else "cleanup: nothing to do")
    return written
