"""The differential oracle: fuse a model, classify the outcome, and find which pass and rule is to blame.

`judge(case, passes)` runs ``fusionlab.passes.fuse(model, passes=passes, **options)`` and returns an
`Outcome` whose kind is one of

- ``unchanged``: no group was formed and the graph is byte-identical (nothing to check);
- ``ok``: the fused model is valid and computes what the original does (judged as below);
- ``refused``: `fuse` raised `ModelError` (a refusal with a reason is fine) — except "graph has a
  cycle", which the validated, acyclic input cannot deserve: that is a crash;
- ``crash``: any other exception (from the passes or from serialising their graph), and a *false alarm* of
  the safety net: `fuse` raised "the fused model disagrees with the original" where this judge, fusing again
  with `compare=False`, accepts the result (a user would have been told of a bug that is none). Where the judge
  agrees the result is wrong, the outcome is ``wrong`` as before;
- ``invalid``: the fused model fails ``onnx.checker.check_model(full_check=True)`` (also with its contrib ops
  standing as their typed outputs: one op onnx does not know silences all of its shape inference), onnxruntime refuses
  to load it or to run it where the original runs, has duplicate node names, or its interface changed:
  graph outputs (names, order, dtypes, ranks, static dims; a symbolic dim made static) or graph inputs
  (names and dtypes, overridable initializers included);
- ``wrong``: an output differs in shape, dtype or values (`compare.judge_output`: close to the
  original, or no further from the float64 reference than the original is; NaN/Inf in the same places).

Values are compared on every draw of `feeds.draws` (3 by default: different input values, both
bindings of the symbolic dims, the last with overridable initializers overridden). The float64
reference (`reference.Reference`) is computed only when an output is not close to the original.
Integer outputs are judged only where they are stable under 4-ulp changes of the float inputs
(`Case.unstable`). A float output whose deviations all lie within twice the original's own sensitivity
to 2-ulp input changes (`Case.sensitivity`) is accepted (kind ``ok``, symptom "ill-conditioned", counted
apart in the summary): the fused result is what the original computes for inputs moved by a couple of ulps,
so the difference is rounding the problem itself amplifies (backward stability), not a changed function.
So is one where every part of the fused graph, fed the original's own values, computes what the original
does (every value the two graphs share is compared; `_amplified_downstream`): each rewrite computed the
same within tolerance, and ops both graphs run (a float16 square root of a value that nearly cancelled)
amplify the difference; a part's value that is not within tolerance is still accepted where it is as near
the original's part run in float64 on the same values as the original is (a LayerNormalization of a row
constant to rounding with epsilon 1e-12: the decomposed mean misses by one ulp, amplified a million times),
or where it lies within twice the original part's rounding envelope: its inputs moved by one ulp and every
op's own rounding replayed at random (`rounding.rounded_runs`; a LayerNorm of rows whose mean sits 1e3
standard deviations from 0, where fused and decomposed miss float64 alike and the original was luckier on
one element).

`blame(case, passes, outcome)` narrows a failure down to the fewest passes, then to the single vertical
rule, that still fail the same way (same kind and symptom); its `label` ("vertical:gelu",
"horizontal:concat_conv", "vertical+mixed") names the class.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper

from .compare import accepted as _close, deviation as _deviation, judge_output, spread as _spread, within_rounding
from .feeds import Draw, draws, feeds_for, overridable, session as _session
from .rounding import rounded_runs
from ..precision import Reference

__all__ = ["PASS_SETS", "FAILURES", "Outcome", "Case", "judge", "excuse", "check_fused", "blame", "Blame", "normalize", "interface_problems"]

PASS_SETS = {"vertical": ("vertical",), "all": ("vertical", "horizontal", "mixed")}
FAILURES = ("crash", "invalid", "wrong", "timeout")
_PKG = str(Path(__file__).resolve().parent.parent)


@dataclass
class Outcome:
    """What fusing one model with one pass set did."""

    kind: str
    detail: str = ""
    symptom: str = ""
    rules: dict = field(default_factory=dict)
    where: str = ""

    @property
    def failed(self) -> bool:
        return self.kind in FAILURES

    def same_failure(self, other: "Outcome") -> bool:
        return self.kind == other.kind and self.symptom == other.symptom

    def to_dict(self) -> dict:
        return asdict(self)


def normalize(text: str) -> str:
    """A message with names, numbers and lists taken out, so failures of one class compare equal."""
    t = str(text).strip().splitlines()[0] if str(text).strip() else ""
    t = re.sub(r"node name: [^)]*\)", "node name: <n>)", t)
    t = re.sub(r"Value\(name=.*?\)\)?", "<value>", t)
    t = re.sub(r"Node\(name=.*", "<node>", t)
    t = re.sub(r"'[^']*'|\"[^\"]*\"", "<s>", t)
    t = re.sub(r"\([^()]*\bnode name\b[^()]*\)", "(<node>)", t)
    t = re.sub(r"\bName:\s*\S+", "Name: <n>", t)
    t = re.sub(r"[-+]?\d+(\.\d+)?(e[-+]?\d+)?", "N", t)
    for _ in range(2):  # lists of names or shapes (not tags such as [ShapeInferenceError])
        t = re.sub(r"\[[^\[\]A-Za-z]*\]|\[[^\[\]]*[<,(][^\[\]]*\]", "[..]", t)
    t = re.sub(r"\s+", " ", t)
    return t[:120]



def _nudged(v: np.ndarray, rng, ulps: float = 1.0, dtype=None) -> np.ndarray:
    """A float array moved by up to `ulps` ulps of `dtype` (its own by default); others unchanged."""
    if v.dtype.kind != "f":
        return v
    eps = np.finfo(dtype or v.dtype).eps
    return np.asarray(v * (1 + ulps * eps * rng.uniform(-1, 1, v.shape))).astype(v.dtype)


def input_runs(sess, feeds: dict, ulps: float, seed: int, n: int = 4) -> list[dict]:
    """`n` runs of a session with every float input moved by up to `ulps` ulps ({output: array} each)."""
    rng = np.random.default_rng(seed)
    names = [o.name for o in sess.get_outputs()]
    runs = []
    for _ in range(n):
        moved = {k: _nudged(v, rng, ulps) for k, v in feeds.items()}  # overridden initializers too
        runs.append(dict(zip(names, sess.run(None, moved))))
    return runs


def parameter_runs(model: onnx.ModelProto, feeds: dict, seed: int, n: int = 4) -> list[dict]:
    """`n` runs of `model` with every stored float parameter (initializers, Constant tensors) moved by up to one ulp
    of its own dtype: the rounding that storing the parameters in that dtype implies, and all a weight fold changes
    (the folded weights are rounded once more). Empty when a perturbed copy cannot be run."""
    rng = np.random.default_rng(seed)
    runs = []
    for _ in range(n):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        tensors = list(m.graph.initializer) + [a.t for node in m.graph.node if node.op_type == "Constant"
                                               for a in node.attribute if a.name == "value"]
        for t in tensors:
            a = onnx.numpy_helper.to_array(t)
            if a.dtype.kind == "f" and a.size:
                t.CopyFrom(onnx.numpy_helper.from_array(_nudged(a, rng), t.name))
        try:
            sess = _session(m)
            names = [o.name for o in sess.get_outputs()]
            wanted = {i.name for i in m.graph.input}  # overridable initializers included
            runs.append(dict(zip(names, sess.run(None, {k: v for k, v in feeds.items() if k in wanted}))))
        except Exception:  # noqa: BLE001 - cannot perturb: no sensitivity from parameters
            return []
    return runs


class Case:
    """An original model with its draws, its outputs on them and (on demand) its float64 reference outputs."""

    def __init__(self, model: onnx.ModelProto, n_draws: int = 3, options: dict | None = None, *,
                 feeds: list[dict] | None = None, session=None, outputs: list[dict] | None = None):
        """The fuzzer's `n_draws` draws of `model`, or (`feeds`) the given inputs: the ones `fuse()`'s safety net
        ran, so that it and the judge excuse rounding on the same runs (`excuse`). `session` and `outputs` (the
        original's session and its outputs on `feeds`) save a second load and run."""
        self.model = model
        self.options = dict(options or {})
        if feeds is None:
            self.draws = draws(model, n_draws)
            self.feeds = [feeds_for(model, d) for d in self.draws]
        else:
            self.draws = [Draw(0, seed=k) for k in range(len(feeds))]
            self.feeds = [dict(f) for f in feeds]
        sess = session if session is not None else _session(model)
        self._sess = sess
        self.names = [o.name for o in sess.get_outputs()]
        self.outputs = outputs if outputs is not None else [dict(zip(self.names, sess.run(None, f))) for f in self.feeds]
        self._ref: list | None = None
        self.reference_engine = ""
        self._unstable: dict = {}

    def _perturbed(self, k: int, ulps: float) -> list[dict]:
        """The original's outputs of draw `k` with every float input moved by up to `ulps` ulps (4 runs)."""
        key = ("perturbed", k, ulps)
        if key not in self._unstable:
            self._unstable[key] = input_runs(self._sess, self.feeds[k], ulps, 77 + k)
        return self._unstable[key]

    def sensitivity(self, k: int, name: str) -> np.ndarray:
        """Per element, how far float output `name` of draw `k` moves when the float inputs move by two ulps.

        Infinite where a perturbed run turns a finite value non-finite or the other way round (or changes
        the kind of NaN/Inf); 0 where it stays the same NaN/Inf.
        """
        return _spread(self.outputs[k][name], [run[name] for run in self._perturbed(k, 2.0)])

    def parameter_sensitivity(self, k: int, name: str) -> np.ndarray:
        """Per element, how far float output `name` of draw `k` moves when the stored float parameters move.

        Every float initializer and Constant tensor is moved by up to one ulp of its own dtype (4 runs):
        the rounding that storing these parameters in that dtype implies, and all a weight fold changes
        (the folded weights are rounded once more). Infinite where a run changes finiteness.
        """
        return _spread(self.outputs[k][name], [run[name] for run in self._parameter_runs(k)])

    def _parameter_runs(self, k: int) -> list[dict]:
        key = ("params", k)
        if key not in self._unstable:
            self._unstable[key] = parameter_runs(self.model, self.feeds[k], 91 + k)
        return self._unstable[key]

    def sensitivity_runs(self, k: int) -> list[dict]:
        """The original's outputs of draw `k` with its float inputs moved by two ulps, then with its stored float
        parameters moved by one (`sensitivity`, `parameter_sensitivity`): what `compare.within_rounding` judges by."""
        return list(self._perturbed(k, 2.0)) + list(self._parameter_runs(k))

    def unstable(self, k: int, name: str) -> np.ndarray:
        """Elements of integer output `name` (draw `k`) that change when the float inputs move by a few ulps.

        An integer output computed from floats (MaxPool indices: an argmax) flips where two candidates
        tie to rounding; there any rewrite that changes rounding may flip it too, and it is not judged.
        """
        if (k, name) not in self._unstable:
            base = np.asarray(self.outputs[k][name])
            mask = np.zeros(base.shape, dtype=bool)
            for run in self._perturbed(k, 4.0):
                again = np.asarray(run[name])
                if again.shape == base.shape:
                    mask |= again != base
            self._unstable[(k, name)] = mask
        return self._unstable[(k, name)]

    def reference(self, k: int) -> dict | None:
        """Float64 outputs of draw `k` (None if neither onnxruntime nor onnx.reference can run the model)."""
        if self._ref is None:
            try:
                ref = Reference(self.model)
                self.reference_engine = ref.engine
                with np.errstate(all="ignore"):
                    self._ref = [ref.run(f) for f in self.feeds]
            except Exception:  # noqa: BLE001 - no reference: judge against the original alone
                self._ref = [None] * len(self.feeds)
                self.reference_engine = "none"
        return self._ref[k]


def _dims(vi: onnx.ValueInfoProto):
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]


def interface_problems(orig: onnx.ModelProto, fused: onnx.ModelProto) -> str | None:
    """What changed in the graph's interface or naming that must not (None if nothing)."""
    oo, fo = list(orig.graph.output), list(fused.graph.output)
    if [o.name for o in oo] != [o.name for o in fo]:
        return f"graph outputs {[o.name for o in fo]} instead of {[o.name for o in oo]}"
    for a, b in zip(oo, fo):
        if a.type.tensor_type.elem_type != b.type.tensor_type.elem_type:
            return f"graph output {a.name!r} changed dtype"
        da, db = _dims(a), _dims(b)
        if da is not None and db is not None:
            if len(da) != len(db):
                return f"graph output {a.name!r} declared rank {len(db)} instead of {len(da)}"
            for x, y in zip(da, db):
                if isinstance(x, int) and isinstance(y, int) and x != y:
                    return f"graph output {a.name!r} declared shape {db} instead of {da}"
                if isinstance(x, str) and isinstance(y, int) and x != "?":
                    return f"graph output {a.name!r} declared a static dim where the original is symbolic"
    ins_o = {i.name: i.type.tensor_type.elem_type for i in orig.graph.input}
    ins_f = {i.name: i.type.tensor_type.elem_type for i in fused.graph.input}
    if ins_o != ins_f:
        gone = sorted(set(ins_o) - set(ins_f))
        new = sorted(set(ins_f) - set(ins_o))
        what = [f"lost {gone}"] if gone else []
        what += [f"gained {new}"] if new else []
        return "graph inputs changed: " + (", ".join(what) or "dtypes differ")
    over_o, over_f = set(overridable(orig)), set(overridable(fused))
    if over_o - over_f:
        return f"overridable initializers no longer overridable: {sorted(over_o - over_f)}"
    for where, nodes in [("graph", fused.graph.node)] + [(f"function {f.name}", f.node) for f in fused.functions]:
        names = [n.name for n in nodes if n.name]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            return f"duplicate node names in the {where.split()[0]}: {dup[:3]}"
    return None


def _where(exc: BaseException) -> str:
    """The innermost fusionlab frame (outside fuzz/) of an exception's traceback: 'module.function'."""
    frames = []
    for f in traceback.extract_tb(exc.__traceback__):
        if f.filename.startswith(_PKG + "/"):
            rel = Path(f.filename).relative_to(_PKG).with_suffix("").as_posix()
            if not rel.startswith("fuzz/"):
                frames.append(f"{rel.replace('/', '.')}.{f.name}")
    return frames[-1] if frames else ""


def _fuse(case: Case, passes, extra: dict | None = None):
    from fusionlab import ModelError
    from fusionlab.passes import FusionError, fuse, options_for

    # the campaign draws one set of options per model; each pass set gets the ones its passes take
    options = options_for(passes, **{**case.options, **(extra or {})})
    alarm, alarm_problem, alarm_feeds = "", "", None
    try:
        try:
            result = fuse(case.model, passes=tuple(passes), **options)
        except FusionError as exc:
            if not exc.problem.startswith("the fused model disagrees with the original"):
                raise
            # the safety net's comparison said no: the judge decides, on its draws and on the net's inputs (below)
            alarm, alarm_problem, alarm_feeds = str(exc), exc.problem, exc.feeds
            result = fuse(case.model, passes=tuple(passes), compare=False, **options)
    except ModelError as exc:
        if "cycle" in str(exc):
            return None, Outcome("crash", f"ModelError: {exc}", "ModelError: graph has a cycle (the input has none)",
                                 where=_where(exc))
        return None, Outcome("refused", str(exc), normalize(exc))
    except Exception as exc:  # noqa: BLE001 - everything else is a crash
        w = _where(exc)
        # a FusionError's symptom is its problem, not where it was blamed: blame compares failures across pass sets
        what = exc.problem if isinstance(exc, FusionError) else exc
        return None, Outcome("crash", f"{type(exc).__name__}: {str(exc)[:300]}",
                             f"{type(exc).__name__} in {w}: {normalize(what)}", where=w)
    rules = result.plan.rule_counts()
    try:
        fused = result.graph.to_proto()
    except Exception as exc:  # noqa: BLE001
        w = _where(exc)
        return None, Outcome("crash", f"serialising the fused graph: {type(exc).__name__}: {exc}",
                             f"serialise: {type(exc).__name__}: {normalize(exc)}", rules, where=w)
    return (result, fused, alarm_feeds), Outcome("ok", rules=rules, detail=alarm,
                                                 symptom=normalize(alarm_problem) if alarm else "")


def _validity(case: Case, fused: onnx.ModelProto, rules: dict) -> tuple[object, Outcome | None]:
    problem = interface_problems(case.model, fused)
    if problem:
        return None, Outcome("invalid", problem, "interface: " + normalize(problem), rules)
    try:
        onnx.checker.check_model(fused, full_check=True)
    except Exception as exc:  # noqa: BLE001
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, Outcome("invalid", f"checker: {msg[:300]}", "checker: " + normalize(msg), rules)
    msg = _shape_checked(case.model, fused)
    if msg:
        return None, Outcome("invalid", f"checker (contrib ops standing as their outputs): {msg[:300]}",
                             "checker, stand-ins: " + normalize(msg), rules)
    try:
        sess = _session(fused)
    except Exception as exc:  # noqa: BLE001
        msg = str(exc).strip().splitlines()[0]
        return None, Outcome("invalid", f"onnxruntime refuses it: {msg[:300]}", "onnxruntime load: " + normalize(msg), rules)
    return sess, None


def _values(case: Case, fused: onnx.ModelProto, sess, rules: dict) -> Outcome:
    names = [o.name for o in sess.get_outputs()]
    accepted: list[str] = []
    wanted = {i.name for i in fused.graph.input}  # get_inputs() leaves overridable initializers out
    for k, (draw, feeds) in enumerate(zip(case.draws, case.feeds)):
        try:
            got = dict(zip(names, sess.run(None, {n: v for n, v in feeds.items() if n in wanted})))
        except Exception as exc:  # noqa: BLE001
            msg = str(exc).strip().splitlines()[0]
            return Outcome("invalid", f"onnxruntime cannot run it (draw {k}, dims {draw.dims}): {msg[:300]}",
                           "onnxruntime run: " + normalize(msg), rules)
        for name, o in case.outputs[k].items():
            if name not in got:
                return Outcome("wrong", f"output {name!r} missing", "missing output", rules)
            problem = judge_output(o, got[name])
            if problem == "integer values differ":
                problem = judge_output(o, got[name], ignore=case.unstable(k, name))
            elif problem and not problem.startswith(("rank", "shape", "dtype")):
                problem = judge_output(o, got[name], (case.reference(k) or {}).get(name))
            if problem:
                where = f"draw {k} (dims {draw.dims}{', initializers overridden' if draw.override else ''})"
                symptom = "wrong " + problem.split(" ")[0].rstrip(":")
                # a wrong shape, rank or dtype has no excuse; values (an argmax flipped by upstream rounding) may
                values = not problem.startswith(("rank", "shape", "dtype"))
                ill = values and excuse(case, k, fused, name, o, got[name])
                if ill:
                    accepted.append(f"output {name!r}, {where}: {problem} [{ill}]")
                    continue
                return Outcome("wrong", f"output {name!r}, {where}: {problem}", symptom, rules)
    if accepted:
        return Outcome("ok", "accepted within the original's own sensitivity: " + accepted[0], "ill-conditioned", rules)
    return Outcome("ok", rules=rules)


def _shape_checked(original: onnx.ModelProto, fused: onnx.ModelProto) -> str:
    """The full checker's complaint about `fused` with every node onnx does not know (a com.microsoft op) standing as
    its typed outputs (`validate.checker_problem`): one such node makes onnx's shape inference drop every error of
    the model, so the plain checker never shape-checks a fused model holding a FusedConv. Empty when it passes."""
    if all(n.domain in ("", "ai.onnx", "ai.onnx.ml") for n in fused.graph.node):
        return ""  # the plain checker saw it all
    from fusionlab import load
    from fusionlab.passes.validate import checker_problem, unknown_ops

    excused = unknown_ops(original)
    return checker_problem(load(fused, check=False), excused) or ""


def check_fused(case: Case, fused: onnx.ModelProto, rules: dict | None = None) -> Outcome:
    """Classify a fused model against the case's original: invalid, wrong or ok."""
    rules = dict(rules or {})
    sess, bad = _validity(case, fused, rules)
    if bad is not None:
        return bad
    return _values(case, fused, sess, rules)


def excuse(case: Case, k: int, fused: onnx.ModelProto, name: str, o, f) -> str:
    """Why output `name` of `fused` on draw `k`, outside the tolerance, is still only the original's rounding moved
    ('' when it is not): within what two-ulp input or one-ulp parameter changes do to the original
    (`_ill_conditioned`), or every rewritten part, fed the original's own values, computes what the original's part
    does (`_amplified_downstream`). The one excuse of both the judge and `fuse()`'s safety net
    (`passes.runcheck`), which builds its `Case` from the inputs it ran: the two see the same runs."""
    return _ill_conditioned(case, k, name, o, f) or _amplified_downstream(case, k, fused)


def _ill_conditioned(case: Case, k: int, name: str, o, f) -> str:
    """A note when the fused output is what the original computes with its float inputs moved by two ulps or its
    stored parameters by one (`compare.within_rounding`, shared with `fuse()`'s safety net)."""
    o, f = np.asarray(o), np.asarray(f)
    if o.shape != f.shape or o.dtype.kind != "f":
        return ""
    runs = [run[name] for run in case.sensitivity_runs(k) if name in run]
    ok = within_rounding(o, f, runs)
    if not ok.all():
        return ""
    dev = _deviation(o, f)
    if not (dev > 0).any():
        return ""
    sens = _spread(o, runs)
    k_bad = int(np.argmax(np.where(np.isfinite(dev), dev, np.inf)))
    return (f"ill-conditioned: two-ulp input or one-ulp parameter changes move the original by up to "
            f"{sens.flat[k_bad]:.3g} there")


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    typed = onnx.shape_inference.infer_shapes(model)
    return {vi.name: vi.type.tensor_type.elem_type for vi in
            list(typed.graph.value_info) + list(typed.graph.output) + list(typed.graph.input)}


def _with_outputs(model: onnx.ModelProto, names: list[str], known: dict[str, int] | None = None) -> onnx.ModelProto:
    """A copy of `model` that also returns the values `names` (element type from shape inference, else from
    `known`: a contrib op onnx cannot infer leaves the values after it untyped)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    elem = {**(known or {}), **{n: t for n, t in _elem_types(m).items() if t}}
    have = {o.name for o in m.graph.output}
    for n in names:
        if n not in have and elem.get(n):
            m.graph.output.append(onnx.helper.make_tensor_value_info(n, elem[n], None))
    return m


def _fed(model: onnx.ModelProto, values: dict, produced: set) -> tuple[onnx.ModelProto, dict[str, str]]:
    """A copy of `model` whose nodes read each value of `values` that `produced` holds from a new graph input.

    Returns the copy and {value: input name}; the inputs are typed from `values` (the original's run).
    """
    local = onnx.ModelProto()
    local.CopyFrom(model)
    fed: dict[str, str] = {}
    for n in local.graph.node:
        for i, name in enumerate(n.input):
            if name in values and name in produced:
                fed.setdefault(name, f"{name}__from_original")
                n.input[i] = fed[name]
    for name, alias in fed.items():
        a = np.asarray(values[name])
        local.graph.input.append(onnx.helper.make_tensor_value_info(
            alias, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)))
    return local, fed


def _original_names(model: onnx.ModelProto, made: dict) -> onnx.ModelProto:
    """Inlined function bodies with their values' names back: onnx's inliner writes `mul24__1` for the body's
    `mul24`, and a mixed-pass function keeps the names of the original values it computes. A name goes back
    only where the original made it and nothing in the graph has it already; every value cut there is still
    compared with the original's, so a body value under another's name is a difference, not an excuse."""
    taken = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}
    back: dict[str, str] = {}
    for n in model.graph.node:
        for o in n.output:
            base = re.sub(r"__\d+$", "", o)
            if base != o and base in made and base not in taken and base not in back.values():
                back[o] = base
    for n in model.graph.node:
        n.input[:] = [back.get(i, i) for i in n.input]
        n.output[:] = [back.get(o, o) for o in n.output]
    return model


def _run(sess, feeds: dict) -> dict:
    """{output name: value} of one onnxruntime run."""
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _amplified_downstream(case: Case, k: int, fused: onnx.ModelProto) -> str:
    """A note when every part of the fused graph, fed the original's own values, computes what the original does.

    The values the two graphs share (same name) cut the fused graph into parts: each rewritten group (a fused
    node, a function call) and each node the fusion left alone. Every shared value a fused node reads is fed
    from the original's run on draw `k`, so each part is judged on exactly the inputs the original gave it;
    every shared value it makes is then compared with the original's (rule 1, the project's tolerance). When
    all are close, each rewrite computed the same within tolerance, and the difference at the outputs is
    rounding that the ops both graphs run amplify (an fp16 division by a mean that nearly cancels, a square
    root near 0). A shared float value that is not close is still accepted element by element when it is as
    near the original's own part computed in float64 from the same values (`compare.accepted` with that part
    as reference: a LayerNormalization of a row constant to rounding, where the decomposed graph's mean misses
    by one ulp and epsilon 1e-12 amplifies it a million times), or when the original's part moves at least
    half as far with what it is fed moved by one ulp and each of its ops' results moved within that op's
    rounding (`rounding.rounded_runs`): a value the original's own evaluation could have produced; a shared
    integer value must be equal. '' otherwise, also when a shared value cannot be typed or run.
    """
    try:
        import onnx.inliner

        made = {o: n for n in case.model.graph.node for o in n.output if o}
        if fused.functions:  # a function's body is parts too: inline it, its values under their own names
            fused = _original_names(onnx.inliner.inline_local_functions(fused), made)
        produced = {o for n in fused.graph.node for o in n.output if o}
        shared = [o for n in fused.graph.node for o in n.output if o in made]
        if not shared:
            return ""
        original, feeds0 = case.model, case.feeds[k]
        half = any(v.dtype == np.float16 for v in feeds0.values()) or any(
            t.data_type == onnx.TensorProto.FLOAT16 for t in original.graph.initializer)
        if half:
            # onnxruntime computes a float16 chain in float32 between its own casts, so the original's values
            # read out as float16 are not what its next op used; both graphs run in float32 here, and their
            # values are rounded to float16 only to be judged
            from ..precision import convert

            original, fused = convert(original, onnx.TensorProto.FLOAT), convert(fused, onnx.TensorProto.FLOAT)
            feeds0 = {n: (v.astype(np.float32) if v.dtype == np.float16 else v) for n, v in feeds0.items()}
        original = _with_outputs(original, shared)
        orig_sess = _session(original)
        orig = _run(orig_sess, feeds0)
        local, fed = _fed(_with_outputs(fused, shared, _elem_types(original)), orig, produced)
        sess = _session(local)
        wanted = {i.name for i in local.graph.input}
        feeds = {n: v for n, v in feeds0.items() if n in wanted}
        feeds.update({alias: orig[name] for name, alias in fed.items()})
        got = _run(sess, feeds)
    except Exception:  # noqa: BLE001 - cannot look inside: no note
        return ""
    raw = orig
    judged = (lambda v: v.astype(np.float16) if v.dtype == np.float32 else v) if half else (lambda v: v)
    with np.errstate(over="ignore"):
        orig = {n: judged(v) for n, v in orig.items()}
        got = {n: judged(v) for n, v in got.items()}
    compared = [o for o in shared if o in orig and o in got]
    if len(compared) != len(shared):
        return ""
    off = [o for o in compared if judge_output(orig[o], got[o]) is not None]
    if not off:
        return (f"amplified downstream: fed the original's values, every part of the fused graph computes the "
                f"{len(compared)} values it shares with the original within tolerance")
    try:
        # the original's parts in float64, fed the same (original's) values at the same cuts
        from ..precision import Reference

        parts, pfed = _fed(original, raw, produced)
        wanted = {i.name for i in parts.graph.input}
        pfeeds = {**{n: v for n, v in feeds0.items() if n in wanted}, **{a: raw[n] for n, a in pfed.items()}}
        ref_out = Reference(parts).run(pfeeds)
        # the original's parts at working precision, their inputs moved by one ulp: how far rounding alone moves them
        psess = _session(parts)
        base = _run(psess, pfeeds)
        rng = np.random.default_rng(53 + k)
        nudged = [{n: _nudged(v, rng, dtype=np.float16 if half else None) for n, v in pfeeds.items()}
                  for _ in range(4)]
        runs = [_run(psess, f) for f in nudged]
    except Exception:  # noqa: BLE001
        return ""
    try:  # and the same parts with every op's own rounding replayed at random: where the original was lucky
        computed_in = {n: onnx.helper.tensor_dtype_to_np_dtype(t) for n, t in _elem_types(case.model).items() if t}
        runs += rounded_runs(parts, nudged, rng, computed_in)
    except Exception:  # noqa: BLE001 - no envelope: the one-ulp input spread alone
        pass
    for o in off:  # per element: accepted against the part's float64 value, or within its rounding spread
        a, f = np.asarray(orig[o]), np.asarray(got[o])
        if a.shape != f.shape or a.dtype != f.dtype or a.dtype.kind != "f" or o not in base:
            return ""
        dev = _deviation(a, f)
        near = np.isfinite(dev) & (dev <= 2 * _spread(judged(base[o]), [judged(r[o]) for r in runs]))
        if not np.all(near | _close(a, f, ref_out.get(o))):
            return ""
    return (f"ill-conditioned part: fed the original's values, the fused graph's {', '.join(off[:3])} differ, "
            f"where not within tolerance, no more than the original's part computed in float64 allows or twice "
            f"what one-ulp changes of their inputs and their ops' own rounding move them")


def judge(case: Case | onnx.ModelProto, passes=("vertical",), **options) -> Outcome:
    """Fuse `case` with `passes` (and options) and classify what happened."""
    if not isinstance(case, Case):
        case = Case(case, options=options)
        options = {}
    fused_pair, outcome = _fuse(case, passes, options)
    if fused_pair is None:
        return outcome
    result, fused, feeds = fused_pair
    if not len(result.plan) and fused.graph.SerializeToString() == case.model.graph.SerializeToString():
        return Outcome("unchanged", rules=outcome.rules)
    judged = check_fused(case, fused, outcome.rules)
    if outcome.detail and not judged.failed and feeds:
        # the net disagreed on inputs of its own: judged on those too, the judge either sees the same fault (the
        # fused model is wrong there, and the draws missed it) or the net raised on what the judge accepts
        on_net = check_fused(Case(case.model, feeds=[feeds], options=case.options), fused, outcome.rules)
        if on_net.failed:
            on_net.detail = f"on the safety net's inputs: {on_net.detail}"
            return on_net
    if outcome.detail and not judged.failed:
        # fuse() raised on a rewrite the judge accepts: the safety net's false alarm is a failure of its own
        return Outcome("crash", f"safety net false alarm: {outcome.detail} (the judge: {judged.kind} {judged.detail})",
                       "safety net false alarm: " + outcome.symptom, outcome.rules, where="passes.runcheck")
    return judged


@dataclass
class Blame:
    """The fewest passes (and the one vertical rule, if one) that still fail the same way."""

    passes: tuple
    rules: tuple = ()

    @property
    def label(self) -> str:
        if not self.passes:
            return "prepare"
        label = "+".join(self.passes)
        if self.rules:
            label += ":" + ",".join(self.rules)
        elif self.passes in (("horizontal",), ("mixed",)):
            label += ":" + ("concat" if self.passes == ("horizontal",) else "fuse_ops")
        return label

    def options(self) -> dict:
        return {"rules": list(self.rules)} if self.rules else {}


def blame(case: Case, passes, outcome: Outcome) -> Blame:
    """Narrow a failing (passes, outcome) down to the fewest passes, then to one vertical rule; no pass at all
    (label "prepare") when preparation alone (clean-up and constant folding) already fails: then no pass is to
    blame, whatever the symptom (a rule rewriting the broken region can move where the failure shows)."""
    passes = tuple(passes)
    if judge(case, ()).failed:
        return Blame(())
    chosen = passes
    if len(passes) > 1:
        subsets = [(p,) for p in passes] + [tuple(q for q in passes if q != p) for p in passes]
        for sub in subsets:
            if judge(case, sub).same_failure(outcome):
                chosen = sub
                break
    if "vertical" in chosen:
        from fusionlab.passes.vertical import RULE_NAMES

        fired = [r for r in (outcome.rules or {}) if r in RULE_NAMES]
        if not fired:
            fired = list(RULE_NAMES)
        for rule in fired:
            if judge(case, chosen, rules=[rule]).same_failure(outcome):
                return Blame(chosen, (rule,))
    return Blame(chosen)
