"""TVM Relax as an oracle for mixed fusion: which ONNX nodes its FuseOps puts in one kernel.

`relax_groups` imports an ONNX model with ``tvm.relax.frontend.onnx.from_onnx``, runs TVM's own
pipeline (``DecomposeOpsForInference → LegalizeOps → AnnotateTIROpPattern → FoldConstant → FuseOps →
FuseTIR``) and reports every fused function as the set of ONNX node names it covers.

Relax keeps no ONNX node names, and its passes rename variables, so the groups are traced back by
value: during import every binding a node's converter emits is tagged with that node; after
FuseOps, each fused function's body is replayed binding by binding against the unfused module
(same TIR function, same arguments) to find which tagged bindings it replaced. Nodes that emit no
binding (shape arithmetic and constants folded at import) are listed in `folded`.

TVM is optional (``pip install -e '.[oracle]'``): the notebooks read the committed result of
`benchmarks/oracle_tvm.py` (``data/tvm_groups.json``) instead of importing it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from ..graph import Graph, load

__all__ = ["TvmGrouping", "relax_groups", "available", "PIPELINE"]

#: The passes run, in order (names as in ``tvm.relax.transform``).
#: TVM's own `static_shape_tuning_pipeline` without tuning: the decomposition, then its `zero_pipeline`.
PIPELINE = ("DecomposeOpsForInference", "CanonicalizeBindings", "LegalizeOps", "AnnotateTIROpPattern", "FoldConstant",
            "FuseOps", "FuseTIR")


def available() -> bool:
    """True when apache-tvm (with Relax) can be imported."""
    try:
        import tvm.relax.frontend.onnx  # noqa: F401
    except Exception:  # ImportError, or a broken native library
        return False
    return True


@dataclass
class TvmGrouping:
    """TVM's fusion groups over one ONNX model, in ONNX node names."""

    groups: list[list[str]]
    folded: list[str] = field(default_factory=list)
    functions_before: int = 0
    functions_after: int = 0
    group_names: list[str] = field(default_factory=list)
    tvm_version: str = ""

    def to_dict(self) -> dict:
        return {"groups": self.groups, "folded": self.folded, "functions_before": self.functions_before,
                "functions_after": self.functions_after, "group_names": self.group_names,
                "tvm_version": self.tvm_version}

    @classmethod
    def from_dict(cls, d: dict) -> "TvmGrouping":
        return cls(**d)


@contextlib.contextmanager
def _recording_import(records: list):
    """Patch the ONNX importer to record (node name, the value it produced), every value bound."""
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as fe

    original = fe.ONNXGraphImporter._convert_operator

    def convert(self, op_name, inputs, attr, opset):
        op = original(self, op_name, inputs, attr, opset)
        if isinstance(op, relax.Call):  # not bound yet: bind it now, so it sits with this node's bindings
            op = self.bb.emit(op)
        records.append((attr["tvm_custom"]["name"], op))
        return op

    fe.ONNXGraphImporter._convert_operator = convert
    try:
        yield
    finally:
        fe.ONNXGraphImporter._convert_operator = original


def _rename(mod, owner_at: dict[int, str]) -> tuple[object, dict[str, str]]:
    """Rename binding k of main to ``fl<k>_``; returns the module and {new name: owner_at[k]}."""
    import tvm
    from tvm import relax

    tags: dict[str, str] = {}

    @relax.expr_functor.mutator
    class _Rename(relax.PyExprMutator):
        def __init__(self, module):
            super().__init__(module)
            self.k = 0

        def visit_var_binding_(self, binding):
            value = self.visit_expr(binding.value)
            name = f"fl{self.k}_"
            if self.k in owner_at:
                tags[name] = owner_at[self.k]
            self.k += 1
            emit = self.builder_.emit if isinstance(binding.var, relax.DataflowVar) else self.builder_.emit_output
            self.set_var_remap(binding.var, emit(value, name))

    functions = {gv: f for gv, f in mod.functions.items()}
    main = mod.get_global_var("main")
    functions[main] = _Rename(mod).visit_expr(mod["main"])
    return tvm.IRModule(functions), tags


def _tag_bindings(mod, records: list) -> tuple[object, dict[str, str]]:
    """Name every binding of the imported main ``fl<k>_`` and say which ONNX node made it."""
    from tvm import relax

    pos = {b.var: i for i, b in enumerate(_bindings(mod["main"]))}
    owner_at: dict[int, str] = {}
    cursor = -1
    for node, op in records:  # a node owns the bindings after the previous node's, up to its own output
        outs = list(op.fields) if isinstance(op, relax.Tuple) else [op]
        at = [pos[v] for v in outs if isinstance(v, relax.Var) and v in pos]
        if at and max(at) > cursor:
            for i in range(cursor + 1, max(at) + 1):
                owner_at[i] = node
            cursor = max(at)
    binds = _bindings(mod["main"])
    for i in range(cursor + 1, len(binds)):  # the outputs: aliases of a node's value, owned by that node
        value = binds[i].value
        if isinstance(value, relax.Var) and pos.get(value) in owner_at:
            owner_at[i] = owner_at[pos[value]]
    return _rename(mod, owner_at)


def _retag(mod, tags: dict[str, str]) -> tuple[object, dict[str, str]]:
    """After a pass: give bindings the pass made (a decomposition's steps) to the next tagged binding's node."""
    owner_at: dict[int, str] = {}
    pending: list[int] = []
    for i, b in enumerate(_bindings(mod["main"])):
        node = tags.get(b.var.name)
        if node is None:
            pending.append(i)
            continue
        for j in pending:
            owner_at[j] = node
        pending.clear()
        owner_at[i] = node
    return _rename(mod, owner_at)


def _shash():
    """tvm's structural hash (moved to tvm_ffi in recent releases)."""
    try:
        from tvm_ffi import structural_hash
    except ImportError:  # older TVM
        from tvm.ir import structural_hash
    return structural_hash


def _bindings(func) -> list:
    return [b for block in func.body.blocks for b in block.bindings]


def _atom(a, env: dict):
    """How a value is known: ("var", a Var of the unfused module), ("tuple", ...) or ("const", hash)."""
    from tvm import relax

    if isinstance(a, relax.Var):
        return env.get(a, ("var", a))
    if isinstance(a, relax.Tuple):
        return ("tuple",) + tuple(_atom(f, env) for f in a.fields)
    if hasattr(a, "name_hint"):  # a GlobalVar: the TIR function called
        return ("function", a.name_hint)
    return ("const", _shash()(a))


def _number(binding, env: dict) -> tuple | None:
    """Value-number one binding: alias tuples and tuple items in `env`; return the key of a call, else None."""
    from tvm import relax

    value = binding.value
    if isinstance(value, relax.Tuple):
        env[binding.var] = _atom(value, env)
        return None
    if isinstance(value, relax.TupleGetItem):
        whole = _atom(value.tuple_value, env)
        if whole[0] == "tuple":  # an item of a tuple built here: the item itself
            env[binding.var] = whole[1 + int(value.index)]
            return None
        return ("item", whole, int(value.index))
    if isinstance(value, relax.Call):
        op = value.op
        callee = op.name_hint if hasattr(op, "name_hint") else str(getattr(op, "name", op))
        return ("call", callee) + tuple(_atom(a, env) for a in value.args)
    return ("other", _atom(value, env)) if isinstance(value, relax.Var) else None


def _unfused_index(func, tags: dict[str, str]) -> tuple[dict, dict]:
    """For the unfused main: {value key: binding Var} and {binding Var: ONNX node name}."""
    by_key: dict[tuple, object] = {}
    owner: dict[object, str] = {}
    env: dict = {p: ("var", p) for p in func.params}
    pending: list = []
    for b in _bindings(func):
        key = _number(b, env)
        node = tags.get(b.var.name)
        if key is not None:
            by_key.setdefault(key, b.var)
            env[b.var] = ("var", by_key[key])
            if node is None and key[0] == "item" and key[1][0] == "var":
                node = owner.get(key[1][1])  # an item of a multi-output call belongs to that call's node
        if node is None:
            if key is not None:
                pending.append(b.var)  # made by a pass (a decomposition) for the next tagged binding
            continue
        for p in pending:
            owner[p] = node
        pending.clear()
        owner[b.var] = node
    return by_key, owner


def _replay(bindings, env: dict, by_key: dict, where: str):
    """Value-number bindings (of a fused function, or of main) against the unfused index; yields
    (binding, key, unfused Var)."""
    for b in bindings:
        key = _number(b, env)
        if key is None:
            continue
        found = by_key.get(key)
        if found is None:
            raise RuntimeError(f"cannot trace binding {b.var.name} of {where} back to the unfused module")
        env[b.var] = ("var", found)
        yield b, key, found


def _fused_groups(fused, unfused, by_key: dict, owner: dict) -> tuple[list[list[str]], list[str]]:
    """Replay the fused main against the unfused index: every kernel as (ONNX node names, TVM function name)."""
    from tvm import relax

    main = fused["main"]
    env: dict = {p: ("var", q) for p, q in zip(main.params, unfused["main"].params)}
    functions = {gv.name_hint: f for gv, f in fused.functions.items() if isinstance(f, relax.Function)}
    groups: list[list[str]] = []
    names: list[str] = []
    for b in _bindings(main):
        callee = getattr(getattr(b.value, "op", None), "name_hint", None)
        if callee in functions:  # a fused group: replay its body to find the bindings it replaced
            target = functions[callee]
            local = {p: _atom(a, env) for p, a in zip(target.params, b.value.args)}
            members: list[str] = []
            last = None
            for _, key, found in _replay(_bindings(target), local, by_key, callee):
                last = found
                node = owner.get(found)
                if node is not None and node not in members and key[0] == "call":
                    members.append(node)
            out = _atom(target.body.body, local) if hasattr(target.body, "body") else None
            env[b.var] = out if out is not None else ("var", last)
            if members:
                groups.append(members)
                names.append(callee)
            continue
        for _, key, found in _replay([b], env, by_key, "main"):
            if key[0] == "call" and key[1] == "relax.call_tir" and found in owner:
                groups.append([owner[found]])
                names.append(str(b.value.args[0].name_hint))
    return groups, names


def relax_groups(model, pipeline: tuple[str, ...] = PIPELINE) -> TvmGrouping:
    """TVM Relax's FuseOps groups of an ONNX model (ModelProto, Graph or path), as ONNX node names."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    proto = model.to_proto() if isinstance(model, Graph) else load(model).to_proto()
    records: list = []
    with _recording_import(records):
        mod = from_onnx(proto, keep_params_in_input=False)
    unfused, tags = _tag_bindings(mod, records)
    for name in (p for p in pipeline if p not in ("FuseOps", "FuseTIR")):
        unfused, tags = _retag(getattr(relax.transform, name)()(unfused), tags)
    fused = relax.transform.FuseOps()(unfused)
    lowered = relax.transform.FuseTIR()(fused) if "FuseTIR" in pipeline else fused
    by_key, owner = _unfused_index(unfused["main"], tags)

    groups, names = _fused_groups(fused, unfused, by_key, owner)
    covered = {n for g in groups for n in g}
    folded = [n.name for n in proto.graph.node if n.name not in covered]
    count = lambda m: sum(1 for _ in m.functions.items())  # noqa: E731
    return TvmGrouping(groups=groups, folded=folded, functions_before=count(unfused), functions_after=count(lowered),
                       group_names=names, tvm_version=tvm.__version__)
