"""The machinery every fusion rule shares: find a pattern at an anchor, check it is legal, rewrite it.

A rule is a small unit, shaped after onnxscript's rewriter (pattern, condition, replacement):

- `Rule.match(cx, anchor)` looks for the rule's whole pattern anchored on one node, whichever rules are on, and
  checks that rewriting it is legal. It returns a `Match`, returns None when the pattern is simply not there, or
  raises `Refused(reason)` when the pattern is there but the rewrite would not compute the same thing (the reason
  is kept: "why was this not fused?"). A part of the pattern that is refused while the rest stands (a chain
  stopped at an illegal step) travels as a `Refused` in `Match.refusals`: one channel for every refusal.
- `Rule.cut(match, rules, limit)` cuts the whole pattern to the enabled rules (and a chain to the group-size
  limit); the engine calls it, so no matcher asks which rules are on. By default a match of a rule that is off
  falls back to `Match.fallback` (the same pattern without the part that rule adds).
- `Rule.rewrite(cx, match)` builds the replacement nodes over the group's external inputs, from the rule's own
  typed `Match.data`.

Everything generic lives here, once: which nodes a rule may take (`Context.free`: while planning, nodes no
earlier group claimed; while applying a plan, exactly the members of the group being applied, so a
re-checked group can neither grow nor shrink), "no intermediate escapes the group", fresh node and tensor
names, new initializers, replacing uses (the values a group hands on keep their names), opset and domain
imports, provenance (which loaded nodes a new node stands for), and the tracer of refusals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import onnx_ir as ir

from ..graph import DEFAULT_DOMAIN, Graph, attr, consumers, is_op, sole_consumer
from ..plan import FusionGroup, FusionPlan, PlanError, Refusal
from ..shapes import ShapeInfo
from .options import Lowering

__all__ = ["Refused", "StaleGroup", "Match", "Rule", "Context", "is_op", "attr", "sole_consumer", "consumers",
           "other_input", "only_read_by", "readers_text", "next_reader", "scalar", "exact", "escapes", "find",
           "recheck", "replace", "written",
           "import_domains", "annotate", "node_index", "copy_attrs", "DEFAULT_DOMAIN"]

class Refused(Exception):
    """The pattern is there but the rewrite is not legal; the message says why.

    Optionally in parts (see `fusionlab.plan.Refusal`): `condition` (what the rule needs), `found` (the value
    that failed it) and `matched` (pattern nodes in place); the message is then "needs <condition>; found
    <found>" unless one is given.
    """

    def __init__(self, reason: str = "", *, condition: str = "", found: str = "", matched: int = 0, rule: str = "",
                 node: ir.Node | None = None):
        if not reason and condition:
            reason = f"needs {condition}" + (f"; found {found}" if found else "")
        super().__init__(reason)
        self.condition, self.found, self.matched = condition, found, matched
        #: the rule refused and the node it is recorded at (defaults: the rule family's first name, the anchor); a
        #: refusal naming a rule counts only while that rule is on
        self.rule, self.node = rule, node

    def at(self, rule: str, node: ir.Node) -> "Refused":
        """This refusal, recorded under `rule` at `node`."""
        self.rule, self.node = rule, node
        return self


class StaleGroup(PlanError):
    """A plan group whose nodes no longer match its rule: the plan does not fit this model."""


@dataclass
class Match:
    """What a rule found: its members (execution order), why it is legal, and what the rewrite needs."""

    rule: str
    anchor: ir.Node
    nodes: list[ir.Node]
    reason: str = ""
    lowered_to: str = ""
    kernels: int = 1
    #: bytes of intermediates the emitted lowering still writes (None: (kernels - 1) x the group's output)
    emitted_bytes: int | None = None
    #: saved traffic when the rule computes it itself (horizontal: shared reads minus the Split's copy)
    saved_bytes: int | None = None
    #: the values the group hands on (None: the last member's first output)
    outputs: list[ir.Value] | None = None
    #: nodes the rewrite relies on without taking them (an operand's Transpose it reads through): no other
    #: group of the pass may take them, and the match is refused if another group already has
    reads: list[ir.Node] = field(default_factory=list)
    #: what the rule's rewrite needs: the rule's own frozen dataclass
    data: object = None
    #: whether the target is one fused runtime kernel (False: a function-lowering candidate)
    kernel: bool = True
    #: the activation the group ends with, by name ("Relu", "SiLU"), when it has one
    activation: str | None = None
    #: parts of the pattern refused while the rest stands (recorded when the match is planned; `Rule.cut` keeps
    #: those of the part it keeps)
    refusals: list[Refused] = field(default_factory=list)
    #: the same pattern without the part this rule adds, for when this rule is off (a Refused: refused then)
    fallback: "Match | Refused | None" = None

    def handed_on(self) -> list[ir.Value]:
        return self.outputs if self.outputs is not None else [self.nodes[-1].outputs[0]]


class Rule:
    """A fusion rule: `names` it can produce, `anchors` (op types it starts from), `match` and `rewrite`.

    `fixed` rules become one runtime op whatever their size (a decomposed GELU is one `Gelu`), so the
    group-size limit does not split them; chain rules stop growing at the limit instead.
    """

    names: tuple[str, ...] = ()
    anchors: tuple[str, ...] = ()
    domains: tuple[str, ...] = DEFAULT_DOMAIN
    fixed: bool = False
    same_shape: bool = True  # every emitted intermediate has the shape of the group's output

    def enabled(self, cx: "Context") -> bool:
        return any(n in cx.rules for n in self.names)

    def cut(self, m: Match, rules: frozenset[str], limit: int | None) -> Match | None:
        """The whole pattern `m` cut to the enabled `rules` (and chains to `limit` ops); None: nothing of it is on.

        By default the match, or its fallback while its rule is off; a Refused fallback whose rule is on is raised.
        """
        found: Match | Refused | None = m
        while isinstance(found, Match) and found.rule not in rules:
            found = found.fallback
        if isinstance(found, Refused):
            if found.rule in rules:
                raise found
            return None
        return found

    def anchored_on(self, node: ir.Node) -> bool:
        return node.op_type in self.anchors and node.domain in self.domains

    def match(self, cx: "Context", anchor: ir.Node) -> Match | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def rewrite(self, cx: "Context", m: Match) -> list[ir.Node]:  # pragma: no cover - abstract
        raise NotImplementedError

    def outputs(self, m: Match, new_nodes: list[ir.Node]) -> list[tuple[ir.Value, ir.Value]]:
        """(old value, new value) pairs: what the group hands on and what replaces it (default: the last output)."""
        return [(m.handed_on()[0], new_nodes[-1].outputs[0])]


# --------------------------------------------------------------------------------------------------
# the pattern vocabulary rules are written in
# --------------------------------------------------------------------------------------------------

def other_input(node: ir.Node, value: ir.Value) -> ir.Value | None:
    """The other operand of a binary node that reads `value` exactly once."""
    if len(node.inputs) != 2 or sum(v is value for v in node.inputs) != 1:
        return None
    return node.inputs[1] if node.inputs[0] is value else node.inputs[0]


def readers_text(value: ir.Value, besides: ir.Node | None = None) -> str:
    """Why `value` is not one node's alone, in words: "a graph output", "also read by Relu relu_2 (+1 more)"."""
    if value.is_graph_output():
        return f"{value.name} is a graph output"
    others = [n for n in consumers(value) if n is not besides]
    if not others:
        return f"{value.name} is read {len(list(value.uses()))} times by {besides.name if besides else '?'}"
    more = f" (+{len(others) - 1} more)" if len(others) > 1 else ""
    return f"{value.name} is also read by {others[0].op_type} {others[0].name}{more}"


def next_reader(cx: "Context", value: ir.Value, rule: str, anchor: ir.Node, wanted,
                matched: int) -> "ir.Node | Refused | None":
    """The only node reading `value` (`sole_consumer`); when there is none but a reader is the node the pattern
    takes next (`wanted(node)`), the near miss as a Refused of `rule` at `anchor`: the value is a graph output or
    has another reader, so fusing would lose it (`matched`: pattern nodes in place before this step)."""
    n = sole_consumer(value)
    if n is not None:
        return n
    fits = [r for r in consumers(value) if cx.free(r) and wanted(r)]
    if not fits:
        return None
    producer = value.producer()
    what = producer.op_type if producer is not None else "value"
    return Refused(condition=f"the {what}'s output read by the {fits[0].op_type} alone (fusing removes it)",
                   found=readers_text(value, fits[0]), matched=matched, rule=rule, node=anchor)


def only_read_by(value: ir.Value, nodes: Iterable[ir.Node]) -> bool:
    allowed = set(map(id, nodes))
    return not value.is_graph_output() and all(id(u.node) in allowed for u in value.uses())


def scalar(c: np.ndarray | None) -> float | None:
    """The value of a size-1 constant, or None (rank is checked separately, see `Context.broadcasts_up`)."""
    if c is None or c.size != 1 or c.dtype.kind not in "fiu":
        return None
    return float(np.asarray(c, dtype=np.float64).reshape(-1)[0])


def exact(c: np.ndarray | None, target: float, ulps: int = 1) -> bool:
    """Whether a size-1 constant equals `target` rounded to the constant's own dtype (within `ulps` units).

    A rewrite into a fused op is a fusion only if it computes the same function: 0.4996 is not 0.5, and
    Pow(d, 2.0015) is not a square. One unit in the last place allows exporters that round differently.
    """
    v = scalar(c)
    if v is None:
        return False
    dt = c.dtype if c.dtype.kind == "f" else np.dtype(np.float64)
    want = float(np.asarray(target, dtype=dt))
    if v == want:
        return True
    return c.dtype.kind == "f" and math.isfinite(v) and abs(v - want) <= ulps * float(np.spacing(np.asarray(want, dtype=dt)))


# --------------------------------------------------------------------------------------------------
# the context of one pass run
# --------------------------------------------------------------------------------------------------

class Context:
    """One pass run over one graph: shapes, names, options, claimed nodes and the refusals met."""

    def __init__(self, graph: Graph, *, rules: Iterable[str] = (), lower: str = Lowering.RUNTIME,
                 dims: dict | None = None, max_group_ops: int | None = None, info: ShapeInfo | None = None):
        self.graph = graph
        self.g = graph.graph
        self.info = info if info is not None else ShapeInfo.of(graph, dims)
        self.names = graph.names()
        self.rules = frozenset(rules)
        self.lower = Lowering(lower)
        self.max_ops = max_group_ops
        self.claimed: set[int] = set()
        self.relied: set[int] = set()  # nodes a planned group reads through (Match.reads): no group may take them
        self.only: set[int] | None = None
        self.refusals: list[Refusal] = []

    # -- which nodes a rule may take ---------------------------------------------------------------
    def free(self, *nodes: ir.Node) -> bool:
        if self.only is not None:
            return all(id(n) in self.only for n in nodes)
        return not any(id(n) in self.claimed for n in nodes)

    def room(self, nodes: Sequence[ir.Node]) -> bool:
        """Whether a chain of `nodes` may take one more member under the group-size limit."""
        return self.max_ops is None or len(nodes) < self.max_ops

    def refuse(self, rule: str, node: ir.Node, reason: "str | Refused", *, condition: str = "", found: str = "",
               matched: int = 0) -> None:
        """Record a refused candidate (while planning; a re-checked group raises instead)."""
        if self.only is not None:
            return
        if isinstance(reason, Refused):
            condition, found, matched = reason.condition or condition, reason.found or found, reason.matched or matched
            reason = str(reason)
        elif not reason and condition:
            reason = f"needs {condition}" + (f"; found {found}" if found else "")
        self.refusals.append(Refusal(rule, node.name, reason, condition, found, matched))

    def refused(self, exc: Refused, rule: str, anchor: ir.Node) -> None:
        """Record `exc`, met by `rule`'s family at `anchor`, under its own rule and node if it names them; a
        refusal of a rule that is off is not recorded."""
        if exc.rule and exc.rule not in self.rules:
            return
        self.refuse(exc.rule or rule, exc.node if exc.node is not None else anchor, exc)

    # -- facts about values ------------------------------------------------------------------------
    def constant(self, value: ir.Value | None) -> np.ndarray | None:
        return None if value is None else self.graph.constant(value)

    def shape(self, value: ir.Value | None) -> tuple | None:
        return self.info.shape(value)

    def rank(self, value: ir.Value | None) -> int | None:
        return self.info.rank(value)

    def dtype(self, value: ir.Value | None) -> np.dtype | None:
        return self.info.dtype(value)

    def nbytes(self, value: ir.Value | None) -> int:
        return self.info.nbytes(value) or 0

    def broadcasts_up(self, const: np.ndarray, x: ir.Value) -> bool:
        """Whether combining `x` with a constant of this shape could give a result of higher rank than x."""
        r = self.rank(x)
        return r is None or const.ndim > r

    # -- building the replacement ------------------------------------------------------------------
    def initializer(self, base: str, array: np.ndarray) -> ir.Value:
        """A new initializer with a name no tensor of the graph uses."""
        name = self.names.value(base)
        value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                         const_value=ir.tensor(np.array(array, order="C", copy=True), name=name))
        self.g.register_initializer(value)
        return value

    def node(self, op: str, inputs, attrs: dict | None = None, *, domain: str = "", base: str,
             num_outputs: int = 1) -> ir.Node:
        """A new node with a fresh node name and freshly named outputs."""
        attributes = {k: v for k, v in (attrs or {}).items() if v is not None}
        node = ir.node(op, list(inputs), attributes=attributes, domain=domain, name=self.names.node(base),
                       num_outputs=num_outputs)
        for i, out in enumerate(node.outputs):
            out.name = self.names.value(f"{node.name}_out{i}" if num_outputs > 1 else f"{node.name}_out")
        return node


def copy_attrs(node: ir.Node, skip: Iterable[str] = ()) -> dict:
    skip = set(skip)
    return {k: a.value for k, a in node.attributes.items() if k not in skip}


# --------------------------------------------------------------------------------------------------
# planning: every rule at every anchor, in priority order
# --------------------------------------------------------------------------------------------------

def escapes(m: Match) -> str | None:
    """The name of an intermediate read outside the group (or a graph output), or None."""
    handed = {id(v) for v in m.handed_on()}
    for n in m.nodes:
        for o in n.outputs:
            if id(o) in handed or not o.name:
                continue
            if not only_read_by(o, m.nodes) and (o.uses() or o.is_graph_output()):
                return o.name
    return None


def _cut_match(cx: Context, rule: Rule, node: ir.Node) -> Match | None:
    """The rule's whole pattern at `node` cut to the enabled rules; raises Refused."""
    m = rule.match(cx, node)
    return None if m is None else rule.cut(m, cx.rules, cx.max_ops)


def _try(cx: Context, rule: Rule, node: ir.Node) -> Match | None:
    """The match at `node`, its refusals recorded; None when there is none, or only the anchor is left of it."""
    try:
        m = _cut_match(cx, rule, node)
    except Refused as exc:
        cx.refused(exc, rule.names[0], node)
        return None
    if m is None:
        return None
    for exc in m.refusals:  # the cut kept these: they count
        cx.refuse(exc.rule or rule.names[0], exc.node if exc.node is not None else node, exc)
    return m if len(m.nodes) > 1 else None


def find(cx: Context, rules: Sequence[Rule]) -> list[Match]:
    """All non-overlapping matches, rule by rule in priority order, anchors in topological order."""
    order = cx.graph.topological_order()
    matches: list[Match] = []
    for rule in rules:
        if not rule.enabled(cx):
            continue
        for node in order:
            if not rule.anchored_on(node) or id(node) in cx.claimed:
                continue
            m = _try(cx, rule, node)
            if m is None or not cx.free(*m.nodes):
                continue
            leak = escapes(m)
            if leak is not None:
                value = next(o for n in m.nodes for o in n.outputs if o.name == leak)
                inside = {id(n) for n in m.nodes}
                outside = next((r for r in consumers(value) if id(r) not in inside), None)
                found = f"{leak} is a graph output" if value.is_graph_output() else \
                    f"{leak} is also read by {outside.op_type} {outside.name}" if outside is not None else leak
                cx.refuse(m.rule, node, f"intermediate {leak} is read outside the group",
                          condition="every intermediate read inside the group only (fusing removes it)",
                          found=found,
                          matched=len(m.nodes))
                continue
            clash = next((n for n in m.nodes if id(n) in cx.relied), None) or \
                next((n for n in m.reads if id(n) in cx.claimed), None)
            if clash is not None:
                cx.refuse(m.rule, node, f"node {clash.name!r} is both rewritten by one group and read through by "
                                        f"another; the earlier group keeps it")
                continue
            cx.claimed.update(id(n) for n in m.nodes)
            cx.relied.update(id(n) for n in m.reads)
            matches.append(m)
    pos = {id(n): i for i, n in enumerate(order)}
    for m in matches:
        m.nodes.sort(key=lambda n: pos[id(n)])
    matches.sort(key=lambda m: pos[id(m.nodes[0])])
    return matches


def saved_bytes(cx: Context, m: Match) -> int:
    """Intermediate traffic the emitted lowering removes: each intermediate is written once and read once
    by each node that reads it (a BN output read by both a Sigmoid and a Mul moves three times)."""
    if m.saved_bytes is not None:
        return m.saved_bytes
    handed = {id(v) for v in m.handed_on()}
    inner = [o for n in m.nodes for o in n.outputs if o.name and id(o) not in handed and o.uses()]
    emitted = m.emitted_bytes if m.emitted_bytes is not None else (m.kernels - 1) * cx.nbytes(m.handed_on()[0])
    return sum((1 + readers(v)) * cx.nbytes(v) for v in inner) - 2 * emitted


def readers(value: ir.Value) -> int:
    """How many distinct nodes read `value` (Mul(x, x) reads x once)."""
    return len({id(use.node) for use in value.uses()})


def to_group(cx: Context, m: Match, gid: str, kind: str) -> FusionGroup:
    """The plan's record of a match."""
    return FusionGroup(id=gid, kind=kind, rule=m.rule, nodes=[n.name for n in m.nodes],
                       op_types=[n.op_type for n in m.nodes], saved_bytes=int(saved_bytes(cx, m)),
                       saved_launches=len(m.nodes) - m.kernels, lowered_to=m.lowered_to, reason=m.reason,
                       anchor=m.anchor.name, covers=_covers(cx.graph, m.nodes), kernels=m.kernels)


def _covers(graph: Graph, nodes: Iterable[ir.Node]) -> list[str]:
    out: list[str] = []
    for n in nodes:
        for c in graph.covers(n.name):
            if c not in out:
                out.append(c)
    return out


# --------------------------------------------------------------------------------------------------
# applying a plan: re-check each group with its own rule on its anchor, then rewrite it
# --------------------------------------------------------------------------------------------------

def node_index(graph: Graph) -> dict[str, ir.Node]:
    return {n.name: n for n in graph.graph}


def written(plan: FusionPlan, groups: Iterable[FusionGroup]) -> FusionPlan:
    """What a pass's `apply` returns: `plan` with copies of `groups`, in which the rewrite records what it decided
    (what each group was lowered to); the caller's plan is never changed."""
    return FusionPlan([FusionGroup.from_dict(g.to_dict()) for g in groups], model=plan.model, notes=list(plan.notes),
                      options=dict(plan.options), refusals=list(plan.refusals))


def recheck(cx: Context, rule: Rule, group: FusionGroup, index: dict[str, ir.Node]) -> Match:
    """The group's rule matched again on its anchor, over exactly the group's nodes; StaleGroup otherwise."""
    where = f"group {group.id} ({group.rule} at {group.anchor})"
    missing = [n for n in group.nodes if n not in index]
    if missing:
        raise StaleGroup(f"{where}: node {missing[0]!r} is not in the model")
    members = [index[n] for n in group.nodes]
    cx.only = {id(n) for n in members}
    try:
        m = _cut_match(cx, rule, index[group.anchor])
    except Refused as exc:
        raise StaleGroup(f"{where}: no longer legal: {exc}") from None
    finally:
        cx.only = None
    if m is None or len(m.nodes) < 2:
        raise StaleGroup(f"{where}: its nodes no longer form the pattern")
    if m.rule != group.rule:
        raise StaleGroup(f"{where}: its nodes now match {m.rule}, not {group.rule}")
    got, want = {n.name for n in m.nodes}, set(group.nodes)
    if got != want:
        extra = sorted(want - got) or sorted(got - want)
        raise StaleGroup(f"{where}: its nodes no longer match (differs at {extra[0]})")
    leak = escapes(m)
    if leak is not None:
        raise StaleGroup(f"{where}: intermediate {leak} is now read outside the group")
    return m


def replace(cx: Context, m: Match, new_nodes: list[ir.Node], pairs: list[tuple[ir.Value, ir.Value]],
            *, same_shape: bool = True) -> None:
    """Put `new_nodes` in place of the match's nodes; each old value in `pairs` hands its uses and name on."""
    g = cx.g
    covers = tuple(_covers(cx.graph, m.nodes))
    for old, new in pairs:
        annotate(cx.info, old)
        new.type, new.shape = old.type, old.shape
    if same_shape and pairs:
        old0 = pairs[-1][0]
        for n in new_nodes:
            for o in n.outputs:
                if o.type is None:
                    o.type, o.shape = old0.type, old0.shape
    elif pairs:  # other shapes (a wide op before its Split): a new value computed from the group's element type has it
        old0 = pairs[-1][0]
        for n in new_nodes:
            first = n.inputs[0] if n.inputs else None
            if first is None or old0.type is None or n.op_type not in _KEEPS_INPUT_TYPE or len(n.outputs) != 1:
                continue
            same = first.type == old0.type if first.type is not None else cx.dtype(first) == cx.dtype(old0)
            for o in n.outputs:
                if o.type is None and same:
                    o.type = old0.type  # its shape stays unknown
    g.insert_before(_insertion_point(g, m.nodes, new_nodes), new_nodes)
    for old, new in pairs:
        name = old.name
        old.name = cx.names.value(f"{name}__replaced")
        old.replace_all_uses_with(new, replace_graph_outputs=True)
        new.name = name
    g.remove(m.nodes, safe=True)
    for n in new_nodes:
        cx.graph.origin[n.name] = covers
    ensure_sorted(g)


#: ops whose one output has their first input's element type (a new value of theirs may be typed from it)
_KEEPS_INPUT_TYPE = frozenset({
    "Conv", "ConvTranspose", "FusedConv", "MatMul", "Gemm", "FusedGemm", "FusedMatMul", "BatchNormalization",
    "Add", "Sub", "Mul", "Div", "Relu", "LeakyRelu", "Tanh", "Sigmoid", "HardSigmoid", "HardSwish", "Gelu",
    "FastGelu", "BiasGelu", "QuickGelu", "Erf", "Clip", "Elu", "Selu", "Softplus", "Neg", "Abs", "Sqrt", "Exp",
})


def annotate(info: ShapeInfo, value: ir.Value) -> None:
    """Give a value its inferred type and shape when the model stores none (fused ops need typed values).

    Graph outputs keep exactly what the model declares: the interface of a model is never changed.
    """
    if value.is_graph_output():
        return
    if value.type is None:
        dt = info.dtype(value)
        if dt is not None:
            value.type = ir.TensorType(ir.DataType.from_numpy(dt))
    if value.shape is None:
        shape = info.shape(value)
        if shape is not None:
            value.shape = ir.Shape([d if d is not None else None for d in shape])


def _insertion_point(body: ir.Graph, members: list[ir.Node], new_nodes: list[ir.Node]) -> ir.Node:
    """The earliest member when every external input of the new nodes is defined before it, else the last."""
    produced = {id(o) for n in new_nodes for o in n.outputs}
    order = {id(n): i for i, n in enumerate(body)}
    first = min(members, key=lambda n: order[id(n)])
    limit = order[id(first)]
    for n in new_nodes:
        for v in n.inputs:
            if v is None or id(v) in produced:
                continue
            p = v.producer()
            if p is not None and p.graph is body and order.get(id(p), -1) >= limit:
                return max(members, key=lambda n: order[id(n)])
    return first


def ensure_sorted(body: ir.Graph) -> None:
    """Sort the graph topologically if some node reads a value defined after it."""
    seen: set[int] = {id(v) for v in body.inputs} | {id(v) for v in body.initializers.values()}
    for node in body:
        for v in node.inputs:
            if v is not None and v.producer() is not None and id(v) not in seen and v.producer().graph is body:
                body.sort()
                return
        seen.update(id(v) for v in node.outputs)


def import_domains(graph: Graph) -> None:
    """Import every operator domain the main graph uses (com.microsoft at version 1)."""
    imports = graph.graph.opset_imports
    for node in graph.graph:
        if node.domain == "com.microsoft" and "com.microsoft" not in imports:
            imports["com.microsoft"] = 1
