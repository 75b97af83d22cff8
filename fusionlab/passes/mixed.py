"""Mixed fusion: TVM's FuseOps grouping on an ONNX graph, with the thresholds real backends add.

The algorithm (after `tvm/src/relay/analysis/graph_partitioner.cc`):

1. **Indexed forward graph.** Nodes in topological order; each edge producer -> consumer carries the
   consumer's pattern kind (`fusionlab.analysis.opclass`), a broadcast edge whose input already has the output's
   shape counting as elementwise. A node whose result is a graph output is an *external reference*: it
   must be written out, so nothing fuses *past* it.
2. **Post-dominator tree.** The immediate post-dominator of a node is the closest node that every path
   from it to the end goes through. Built in one reverse-topological sweep: a node's parent is the least
   common ancestor (in the tree built so far) of all its consumers; the sweep also combines the pattern
   kinds met on the way (`edge pattern` of the dominator relation).
3. **Union-find grouping in phases.** Each node tries to fuse into the group of its immediate
   post-dominator. All nodes on all paths between them must satisfy a condition (`CheckPath`), then
   all of them join one group (`CommitFuse`):
   * phase 0: an out-elementwise-fusable op (Conv, MatMul) fuses into its post-dominator when the
     dominator relation is elementwise and every op on the way is at most broadcast (Conv+Add+Relu);
   * phases 0 and 1: an elementwise/broadcast op fuses into an injective/reduction post-dominator when
     the ops on the way are at most injective (the sink may also be an out-fusable group);
   * phase 1: injective ops fuse when every path is injective (deferred so Conv groups finish first).
   TVM's phase 2 fuses injective ops into *tuples*; ONNX has multi-output nodes instead of tuples, so
   it has nothing to do here. Reductions only end groups; opaque ops never fuse.
4. **Thresholds** (what a real backend adds to the pure algorithm):
   * `max_group_ops`: a group may hold at most this many ops (the seed's rule for Atlas 800I A2: split
     custom ops of more than 5 basic ops). TVM's equivalent is `relay.FuseOps.max_depth` (256).
   * `buffer_kb`: the group's working set must fit the on-chip Unified Buffer (see `working_set`).
   * `allow_recompute`: a cheap (elementwise/broadcast) op with several consumers whose paths cannot
     fuse may be *recomputed* — copied into each consumer's group — instead of written out once.

Every group records why it stopped growing (`FusionGroup.reason`); `trace()` returns every decision.

**Working-set model (on-chip buffer).** The one tile model of `fusionlab.analysis.working_set`, which the
cost model uses too: the fused kernel streams its data through the Unified Buffer (UB) in tiles; group
inputs and outputs take two tiles each (double buffering), intermediates one tile from the op that makes
them to their last reader, and Conv/MatMul/Gemm/pooling inputs go to the cube through L1, not the UB:

    working set = Σ input tiles × 2 + Σ output tiles × 2 + max over the schedule of Σ live intermediate tiles

with tiles of `min(tensor bytes, tile_kb)`. `buffer_kb` asks that a group fit the UB at the efficient
tile (`tile_kb`, 16 KiB: transfers of at least 16 KB reach the best bandwidth); the cost model charges a
group that does not fit with smaller tiles and their less efficient transfers. Ascend 910B's AI core
has a 192 KB UB (`cann_facts.md` §3.3); 310P3 has 256 KB.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir

from ..analysis import working_set as ws_model
from ..analysis.opclass import OpKind, classify, combine
from ..analysis.working_set import Member as WSMember
from ..graph import Graph
from ..plan import FusionGroup, FusionPlan, MIXED
from ..shapes import ShapeInfo
from . import engine, functions
from .fold import is_host_side
from .options import check_options

__all__ = ["plan", "apply", "trace", "check_group", "Step", "PostDomTree", "post_dominator_tree", "working_set",
           "working_set_detail", "working_set_members", "OPTIONS", "DEFAULT_MAX_GROUP_OPS", "DEFAULT_TILE_KB"]

#: the seed's rule for Atlas 800I A2: split a fused op of more than 5 basic ops
DEFAULT_MAX_GROUP_OPS = 5
#: tile of one tensor in the working-set model (the efficient transfer size, `fusionlab.analysis.working_set`)
DEFAULT_TILE_KB = ws_model.DEFAULT_TILE_KB
#: the options this pass takes, with their defaults
OPTIONS = {"max_group_ops": DEFAULT_MAX_GROUP_OPS, "buffer_kb": None, "allow_recompute": False,
           "tile_kb": DEFAULT_TILE_KB, "dims": None}

_E, _B, _I, _R, _O, _X = (OpKind.ELEMWISE, OpKind.BROADCAST, OpKind.INJECTIVE, OpKind.REDUCTION,
                          OpKind.OUT_EWISE_FUSABLE, OpKind.OPAQUE)


def _a(word: str) -> str:
    return ("an " if word[:1] in "aeiou" else "a ") + word


# --------------------------------------------------------------------------------------------------
# the indexed forward graph
# --------------------------------------------------------------------------------------------------

@dataclass
class _GNode:
    index: int
    name: str
    node: ir.Node
    kind: OpKind
    outputs: list[tuple[int, OpKind]] = field(default_factory=list)  # (consumer index, edge pattern)
    extern_ref: bool = False
    recompute_of: str = ""
    host: bool = False  # host-side shape arithmetic: never a kernel, never grouped


def _edge_pattern(consumer: ir.Node, kind: OpKind, value: ir.Value, info: ShapeInfo) -> OpKind:
    """TVM: a broadcast edge whose argument already has the result's shape is elementwise."""
    if kind == _B and consumer.outputs:
        a, r = info.concrete(value), info.concrete(consumer.outputs[0])
        if a is not None and a == r:
            return _E
    return kind


def _build(graph: Graph, info: ShapeInfo, recompute: set[str] = frozenset()) -> list[_GNode]:
    order = graph.topological_order()
    host = {id(n) for n in order if is_host_side(n, info)}
    kinds = {id(n): (_X if id(n) in host else classify(n, info.concrete_shapes)) for n in order}
    # recomputed nodes become one copy per consumer node
    gnodes: list[_GNode] = []
    slots: dict[int, list[int]] = {}  # id(node) -> gnode indices (several for a recomputed node)
    consumer_copy: dict[tuple[int, int], int] = {}  # (id(producer), id(consumer)) -> copy index
    for n in order:
        name = n.name
        if name in recompute:
            consumers = []
            for out in n.outputs:
                for c in Graph.consumers(out):
                    if c not in consumers:
                        consumers.append(c)
            slots[id(n)] = []
            for j, c in enumerate(consumers):
                g = _GNode(len(gnodes), f"{name}#rc{j}", n, kinds[id(n)], recompute_of=name)
                consumer_copy[(id(n), id(c))] = g.index
                slots[id(n)].append(g.index)
                gnodes.append(g)
        else:
            g = _GNode(len(gnodes), name, n, kinds[id(n)], host=id(n) in host)
            slots[id(n)] = [g.index]
            gnodes.append(g)
    index_of = {}
    for g in gnodes:
        index_of.setdefault(id(g.node), []).append(g.index)
    for g in gnodes:
        n = g.node
        if any(out.is_graph_output() for out in n.outputs):
            g.extern_ref = True
        for out in n.outputs:
            for use in out.uses():
                c = use.node
                if id(c) not in slots or c.graph is not n.graph:
                    g.extern_ref = True  # used inside a subgraph: keep it materialised
                    continue
                if g.recompute_of and consumer_copy.get((id(n), id(c))) != g.index:
                    continue
                for ci in slots[id(c)]:
                    edge = _edge_pattern(c, kinds[id(c)], out, info)
                    g.outputs.append((ci, edge))
    return gnodes


# --------------------------------------------------------------------------------------------------
# post-dominator tree
# --------------------------------------------------------------------------------------------------

@dataclass
class PostDomTree:
    """Immediate post-dominator (`parent`), tree depth and dominator-relation pattern per node index."""

    parent: list[int | None]
    depth: list[int]
    pattern: list[OpKind]

    @classmethod
    def build(cls, gnodes: list[_GNode]) -> "PostDomTree":
        n = len(gnodes)
        parent: list[int | None] = [None] * n
        depth = [0] * n
        pattern = [_E] * n
        for i in range(n - 1, -1, -1):  # reverse topological order: consumers first
            g = gnodes[i]
            if g.extern_ref:
                parent[i], depth[i], pattern[i] = None, 1, _X
                continue
            p, pat = cls._lca_all(g.outputs, parent, depth, pattern)
            parent[i] = p
            depth[i] = depth[p] + 1 if p is not None else 1
            pattern[i] = pat
        return cls(parent, depth, pattern)

    @staticmethod
    def _lca_all(edges, parent, depth, pattern):
        pat = _E
        if not edges:
            return None, pat
        lca = edges[0][0]
        pat = combine(pat, edges[0][1])
        for idx, edge_pat in edges[1:]:
            lhs, rhs = lca, idx
            while lhs != rhs:
                if lhs is None or rhs is None:
                    lca = None
                    break
                if depth[lhs] < depth[rhs]:
                    pat = combine(pat, pattern[rhs])
                    rhs = parent[rhs]
                elif depth[rhs] < depth[lhs]:
                    pat = combine(pat, pattern[lhs])
                    lhs = parent[lhs]
                else:
                    pat = combine(combine(pat, pattern[lhs]), pattern[rhs])
                    lhs, rhs = parent[lhs], parent[rhs]
            else:
                lca = lhs
            pat = combine(pat, edge_pat)
            if lca is None:
                return None, pat
        return lca, pat


def _info(graph: Graph, shapes, dims: dict | None) -> ShapeInfo:
    """The shape service to use: the one given, else one computed now (a plain dict of shapes is not enough)."""
    return shapes if isinstance(shapes, ShapeInfo) else ShapeInfo.of(graph, dims)


def post_dominator_tree(graph: Graph, shapes: ShapeInfo | None = None) -> dict[str, str | None]:
    """{node name: name of its immediate post-dominator, or None} for every node, in topological order."""
    gnodes = _build(graph, _info(graph, shapes, None))
    tree = PostDomTree.build(gnodes)
    return {g.name: (gnodes[p].name if p is not None else None) for g, p in zip(gnodes, tree.parent)}


# --------------------------------------------------------------------------------------------------
# working set (on-chip buffer model)
# --------------------------------------------------------------------------------------------------

def _members(gnodes: list[_GNode], members: list[int], info: ShapeInfo) -> list[WSMember]:
    """The group's members as the shared working-set model sees them (`fusionlab.analysis.working_set`)."""
    inside = set(members)
    inside_nodes = {id(gnodes[i].node) for i in members}
    order = sorted(members)
    pos = {i: k for k, i in enumerate(order)}
    out = []
    for i in order:
        g = gnodes[i]
        reads = []
        for v in g.node.inputs:
            if v is None:
                continue
            prod = v.producer()
            if prod is not None and id(prod) in inside_nodes:
                continue
            reads.append((v.name, _bytes(v, info)))
        consumers_in = sorted({ci for ci, _ in g.outputs if ci in inside})
        escapes = g.extern_ref or any(ci not in inside for ci, _ in g.outputs) or not g.outputs
        writes, keeps = [], []
        for v in g.node.outputs:
            if escapes:
                writes.append((v.name + g.name, _bytes(v, info)))
            elif consumers_in:
                keeps.append((v.name + g.name, _bytes(v, info), pos[consumers_in[-1]]))
        out.append(WSMember(cube=g.kind == _O, reads=tuple(reads), writes=tuple(writes), keeps=tuple(keeps),
                            op=g.node.op_type))
    return out


def _bytes(v: ir.Value, info: ShapeInfo) -> int:
    """A tensor's bytes; an unknown size counts as one whole tile (larger than any tile the model uses)."""
    b = info.nbytes(v)
    return 1 << 40 if b is None else b


def _working_set(gnodes: list[_GNode], members: list[int], info: ShapeInfo, tile: int) -> int:
    return ws_model.working_set(_members(gnodes, members, info)).bytes_at(tile)


def working_set(graph: Graph, nodes: list[str], *, tile_kb: float = DEFAULT_TILE_KB,
                shapes: ShapeInfo | None = None, dims: dict | None = None) -> float:
    """Working set in KB of a candidate group of named nodes, under the tile model above."""
    shapes = _info(graph, shapes, dims)
    gnodes = _build(graph, shapes)
    return _working_set(gnodes, _indices(gnodes, nodes), shapes, int(tile_kb * 1024)) / 1024


def working_set_detail(graph: Graph, nodes: list[str], *, shapes: ShapeInfo | None = None,
                       dims: dict | None = None) -> ws_model.WorkingSet:
    """The buffers behind `working_set` (the same model): `.account(tile)` and `.describe(tile)` say what fills it."""
    return ws_model.working_set(working_set_members(graph, nodes, shapes=shapes, dims=dims))


def working_set_members(graph: Graph, nodes: list[str], *, shapes: ShapeInfo | None = None,
                        dims: dict | None = None) -> list[ws_model.Member]:
    """A candidate group of named nodes as the working-set model sees it: its members in execution order."""
    shapes = _info(graph, shapes, dims)
    gnodes = _build(graph, shapes)
    return _members(gnodes, _indices(gnodes, nodes), shapes)


def _indices(gnodes, nodes: list[str]) -> list[int]:
    """The planner's indices of the named nodes; KeyError naming the first that is not in the graph."""
    by_name = {g.name: g.index for g in gnodes}
    missing = [n for n in nodes if n not in by_name]
    if missing:
        raise KeyError(f"no node named {missing[0]!r}")
    return [by_name[n] for n in nodes]


# --------------------------------------------------------------------------------------------------
# the partitioner
# --------------------------------------------------------------------------------------------------

@dataclass
class Step:
    """One decision of the partitioner: node tried to fuse into its post-dominator `target`."""

    phase: int
    node: str
    op: str
    kind: str
    target: str
    fused: bool
    reason: str

    def __str__(self) -> str:
        verdict = "fuse " if self.fused else "stop "
        tgt = f" -> {self.target}" if self.target else ""
        return f"phase {self.phase}  {verdict} {self.node} ({self.op}, {self.kind}){tgt}: {self.reason}"


class _Partitioner:
    def __init__(self, gnodes, tree, shapes, max_ops, buffer_bytes, tile, allow_recompute):
        self.g = gnodes
        self.tree = tree
        self.shapes = shapes
        self.max_ops = max_ops
        self.buffer = buffer_bytes
        self.tile = tile
        self.allow_recompute = allow_recompute
        n = len(gnodes)
        self.parent = list(range(n))
        self.members = {i: [i] for i in range(n)}
        self.pattern = [g.kind for g in gnodes]
        self.anchor = [g.kind == _O for g in gnodes]
        self.steps: list[Step] = []
        self.stop: dict[int, str] = {}

    def root(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def _merge(self, child: int, target: int) -> None:
        c, p = self.root(child), self.root(target)
        if c == p:
            return
        self.parent[c] = p
        self.members[p].extend(self.members.pop(c))
        # as TVM's MergeFromTo: the group takes over the child's pattern only if the child holds the anchor
        if self.anchor[c]:
            self.anchor[p] = True
            self.pattern[p] = combine(self.pattern[p], self.pattern[c])

    def _paths(self, src: int, sink: int) -> list[int]:
        """Nodes on every path src -> sink (excluding src and sink)."""
        seen, stack, out = set(), [ci for ci, _ in self.g[src].outputs], []
        while stack:
            i = stack.pop()
            if i == sink or i in seen:
                continue
            seen.add(i)
            out.append(i)
            stack.extend(ci for ci, _ in self.g[i].outputs)
        return out

    def _check_path(self, src: int, sink: int, fcond) -> tuple[bool, str]:
        for i in self._paths(src, sink):
            k = self.pattern[self.root(i)]
            if not fcond(k, False):
                return False, f"path to {self.g[sink].name} passes {self.g[i].name} ({self.g[i].node.op_type}, {k.name.lower()} group)"
        k = self.pattern[self.root(sink)]
        if not fcond(k, True):
            return False, f"post-dominator {self.g[sink].name} is {_a(k.name.lower())} group"
        return True, ""

    def _candidate(self, src: int, sink: int) -> list[int]:
        roots = {self.root(src), self.root(sink)} | {self.root(i) for i in self._paths(src, sink)}
        return sorted(m for r in roots for m in self.members[r])

    def _limits(self, src: int, sink: int) -> str:
        cand = self._candidate(src, sink)
        if self.max_ops is not None and len(cand) > self.max_ops:
            return f"max ops reached ({len(cand)} > {self.max_ops})"
        if self.buffer is not None:
            ws = _working_set(self.g, cand, self.shapes, self.tile)
            if ws > self.buffer:
                return f"buffer budget exceeded ({ws / 1024:.1f} KB > {self.buffer / 1024:g} KB)"
        return ""

    def _record(self, phase, i, target, fused, reason):
        g = self.g[i]
        tname = self.g[target].name if target is not None else ""
        if fused:
            self.stop.pop(i, None)
        else:
            n_cons = len({ci for ci, _ in g.outputs})
            if n_cons > 1 and g.kind <= _B and not self.allow_recompute and not g.extern_ref:
                reason = f"multi-consumer output ({n_cons} consumers) and recompute not allowed; {reason}"
            self.stop[i] = reason
        self.steps.append(Step(phase, g.name, g.node.op_type, g.kind.name.lower(), tname, fused, reason))

    def run(self, phase: int) -> None:
        for i, g in enumerate(self.g):
            kind = self.pattern[self.root(i)]
            if g.kind == _X:
                if phase == 0:
                    self._record(phase, i, None, False, "host-side shape arithmetic (small int64 values): not a kernel"
                                 if g.host else f"opaque op {g.node.op_type}")
                continue
            pd = self.tree.parent[i]
            if pd is None:
                if phase == 0:
                    if g.extern_ref:
                        why = "graph output: its result must be written out"
                    elif not g.outputs:
                        why = "end of the graph"
                    else:
                        why = "no post-dominator: its consumers' paths never meet again"
                    self._record(phase, i, None, False, why)
                continue
            if self.root(i) == self.root(pd):
                continue
            dom_pat = self.tree.pattern[i]
            if kind == _O:
                if phase != 0:
                    continue
                if dom_pat != _E:
                    self._record(phase, i, pd, False,
                                 f"post-dominator {self.g[pd].name} ({self.g[pd].node.op_type}) is reached through "
                                 f"{_a(dom_pat.name.lower())} op; an out-fusable group only grows through elementwise ops")
                    continue
                ok, why = self._check_path(i, pd, lambda k, sink: k <= _B)
            elif kind <= _B:
                if not (dom_pat <= _I or dom_pat == _R):
                    self._record(phase, i, pd, False,
                                 f"post-dominator {self.g[pd].name} is reached through {_a(dom_pat.name.lower())} op")
                    continue
                ok, why = self._check_path(
                    i, pd, lambda k, sink: k <= _I if not sink else (k <= _B or k in (_R, _I, _O)))
            elif kind == _I:
                if phase != 1:
                    continue
                ok, why = self._check_path(i, pd, lambda k, sink: k <= _I)
            else:  # reduction
                if phase == 0:
                    self._record(phase, i, pd, False, "reduction: only the end of a group")
                continue
            if ok:
                why = self._limits(i, pd)
                ok = not why
            if ok:
                for m in [i] + self._paths(i, pd):
                    self._merge(m, pd)
                self._record(phase, i, pd, True, f"fused into {self.g[pd].name}'s group")
            else:
                self._record(phase, i, pd, False, why)

    def groups(self) -> list[list[int]]:
        out = [sorted(m) for r, m in self.members.items()]
        return sorted(out, key=lambda m: m[0])


def _recompute_candidates(gnodes: list[_GNode], part: _Partitioner) -> set[str]:
    names = set()
    for i, g in enumerate(gnodes):
        if len(part.members[part.root(i)]) != 1 or g.kind > _B or g.extern_ref:
            continue
        consumers = {ci for ci, _ in g.outputs}
        if len(consumers) < 2:
            continue
        if all(pat <= _I or pat == _R for _, pat in g.outputs):
            names.add(g.name)
    return names


def _partition(graph: Graph, max_group_ops, buffer_kb, allow_recompute, tile_kb, shapes):
    buffer = None if buffer_kb is None else int(buffer_kb * 1024)
    tile = int(tile_kb * 1024)

    def once(recompute):
        gnodes = _build(graph, shapes, recompute)
        tree = PostDomTree.build(gnodes)
        part = _Partitioner(gnodes, tree, shapes, max_group_ops, buffer, tile, allow_recompute)
        part.run(0)
        part.run(1)
        return gnodes, tree, part

    gnodes, tree, part = once(frozenset())
    recomputed: set[str] = set()
    if allow_recompute:
        recomputed = _recompute_candidates(gnodes, part)
        if recomputed:
            first_steps = part.steps
            gnodes, tree, part = once(recomputed)
            part.steps = first_steps + [
                Step(-1, name, "", "", "", True, "recompute in each consumer's group; partition again")
                for name in sorted(recomputed)] + part.steps
    return gnodes, part, recomputed


def _saved_bytes(gnodes, members, info: ShapeInfo) -> int:
    inside = set(members)
    total = 0
    for i in members:
        g = gnodes[i]
        if g.extern_ref or not g.outputs or any(ci not in inside for ci, _ in g.outputs):
            continue
        for v in g.node.outputs:
            total += (1 + engine.readers(v)) * (info.nbytes(v) or 0)
    return total


def _check_options(max_group_ops, buffer_kb, tile_kb) -> None:
    if max_group_ops is not None and max_group_ops < 1:
        raise ValueError(f"max_group_ops must be >= 1 or None, got {max_group_ops}")
    if buffer_kb is not None and buffer_kb <= 0:
        raise ValueError(f"buffer_kb must be > 0 or None, got {buffer_kb}")
    if tile_kb <= 0:
        raise ValueError(f"tile_kb must be > 0, got {tile_kb}")


def _group(graph: Graph, gnodes, part, members: list[int], k: int, info: ShapeInfo, tile: int) -> FusionGroup:
    sink = members[-1]
    anchor = next((m for m in members if gnodes[m].kind == _O), sink)
    names = list(dict.fromkeys(gnodes[m].recompute_of or gnodes[m].name for m in members))
    return FusionGroup(
        id=f"mixed{k}", kind=MIXED, rule="fuse_ops", nodes=names,
        op_types=[next(gnodes[m].node.op_type for m in members if (gnodes[m].recompute_of or gnodes[m].name) == n)
                  for n in names],
        saved_bytes=_saved_bytes(gnodes, members, info), saved_launches=len(names) - 1,
        reason=part.stop.get(sink, "nothing left to fuse"), lowered_to="function",
        anchor=gnodes[anchor].recompute_of or gnodes[anchor].name,
        covers=[c for n in names for c in graph.covers(n)],
        recompute=sorted({gnodes[m].recompute_of for m in members if gnodes[m].recompute_of}),
        extra={"pattern": part.pattern[part.root(sink)].name.lower(),
               "working_set_kb": round(_working_set(gnodes, members, info, tile) / 1024, 1)})


def trace(graph: Graph, *, max_group_ops: int | None = DEFAULT_MAX_GROUP_OPS, buffer_kb: float | None = None,
          allow_recompute: bool = False, tile_kb: float = DEFAULT_TILE_KB, dims: dict | None = None,
          shapes: ShapeInfo | None = None) -> tuple[FusionPlan, list[Step]]:
    """The plan and every step the partitioner took (phase, node, post-dominator, fused or why not)."""
    _check_options(max_group_ops, buffer_kb, tile_kb)
    info = _info(graph, shapes, dims)
    gnodes, part, recomputed = _partition(graph, max_group_ops, buffer_kb, allow_recompute, tile_kb, info)
    opts = {"max_group_ops": max_group_ops, "buffer_kb": buffer_kb, "allow_recompute": allow_recompute,
            "tile_kb": tile_kb, "dims": dims}
    result = FusionPlan(model=graph.name, options={"mixed": opts})
    tile = int(tile_kb * 1024)
    for members in part.groups():
        if len({gnodes[m].recompute_of or gnodes[m].name for m in members}) >= 2:
            result.add(_group(graph, gnodes, part, members, len(result), info, tile))
    result.notes.append(
        f"fuse_ops: max_group_ops={max_group_ops}, buffer_kb={buffer_kb}, allow_recompute={allow_recompute}, "
        f"tile_kb={tile_kb:g}; {len(result)} groups"
        + (f"; recomputed {', '.join(sorted(recomputed))}" if recomputed else ""))
    return result, part.steps


def plan(graph: Graph, *, trace: bool = False, shapes: ShapeInfo | None = None, **options):
    """Group nodes FuseOps-style under the thresholds; with trace=True returns (plan, steps)."""
    opts = {**OPTIONS, **check_options("mixed", options, OPTIONS)}
    result, steps = globals()["trace"](graph, shapes=shapes, **opts)
    return (result, steps) if trace else result


# --------------------------------------------------------------------------------------------------
# applying a plan: re-check each group, copy recomputed ops, lower to functions
# --------------------------------------------------------------------------------------------------

def check_group(graph: Graph, group: FusionGroup, opts: dict, info: ShapeInfo, index: dict) -> None:
    """The fuse_ops rule's legality for one group of a plan, on the graph as it is; StaleGroup if it fails."""
    where = f"group {group.id} (fuse_ops at {group.anchor})"
    missing = [n for n in group.nodes if n not in index]
    if missing:
        raise engine.StaleGroup(f"{where}: node {missing[0]!r} is not in the model")
    members = [index[n] for n in group.nodes]
    kinds = [classify(n, info.concrete_shapes) for n in members]
    if any(k == _X for k in kinds):
        bad = members[kinds.index(_X)]
        raise engine.StaleGroup(f"{where}: {bad.op_type} {bad.name} is opaque (cannot fuse)")
    if sum(k == _O for k in kinds) > 1:
        raise engine.StaleGroup(f"{where}: holds more than one out-fusable op (Conv/MatMul/pooling)")
    if opts["max_group_ops"] is not None and len(members) > opts["max_group_ops"]:
        raise engine.StaleGroup(f"{where}: {len(members)} ops > max_group_ops {opts['max_group_ops']}")
    if opts["buffer_kb"] is not None:
        ws = working_set(graph, group.nodes, tile_kb=opts["tile_kb"], shapes=info)
        if ws > opts["buffer_kb"]:
            raise engine.StaleGroup(f"{where}: working set {ws:.1f} KB > buffer_kb {opts['buffer_kb']:g}")
    for r in group.recompute:
        if kinds[group.nodes.index(r)] > _B:
            raise engine.StaleGroup(f"{where}: recomputes {r}, which is not elementwise/broadcast")


def _materialise_recompute(graph: Graph, group: FusionGroup, index: dict, names) -> list[str]:
    """Give the group its own copy of each recomputed node, read by the group's members only; returns the
    members, the copies in place of the recomputed nodes."""
    members = list(group.nodes)
    inside = {id(index[n]) for n in group.nodes if n not in group.recompute}
    for base in group.recompute:
        node = index[base]
        copy = ir.Node(node.domain, node.op_type, list(node.inputs), list(node.attributes.values()),
                       num_outputs=len(node.outputs), name=names.node(f"{base}_rc_{group.id}"), version=node.version)
        for old, new in zip(node.outputs, copy.outputs):
            new.name, new.type, new.shape = names.value(f"{old.name}_rc_{group.id}"), old.type, old.shape
            for use in list(old.uses()):
                if id(use.node) in inside:
                    use.node.replace_input_with(use.idx, new)
        graph.graph.insert_before(node, copy)
        graph.origin[copy.name] = graph.covers(base)
        members[members.index(base)] = copy.name
        index[copy.name] = copy
    return members


def apply(graph: Graph, fplan: FusionPlan, **options) -> FusionPlan:
    """Lower every mixed group of the plan to one ONNX local-function call (in place), each re-checked first;
    returns the groups as written (`engine.written`: the function each became), the plan itself unchanged."""
    written = engine.written(fplan, [g for g in fplan if g.kind == MIXED])
    groups = list(written)
    if not groups:
        return written
    opts = {**OPTIONS, **check_options("mixed", {**fplan.options.get("mixed", {}), **options}, OPTIONS)}
    info = ShapeInfo.of(graph, opts["dims"])
    index = engine.node_index(graph)
    for group in groups:
        check_group(graph, group, opts, info, index)
        for n in group.nodes:  # a function body is type-checked from its call's values: give them types
            for v in list(index[n].inputs) + list(index[n].outputs):
                if v is not None:
                    engine.annotate(info, v)
    names = graph.names()
    members = {group.id: _materialise_recompute(graph, group, index, names) for group in groups}
    for base in {r for g in groups for r in g.recompute}:
        node = index[base]
        if not any(o.uses() or o.is_graph_output() for o in node.outputs):
            graph.graph.remove(node, safe=True)
    functions.to_functions(graph, written, members=members)
    return written
