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
from enum import StrEnum
from pathlib import Path

import onnx
import onnx.numpy_helper

from ..verification.compare import judge_output
from ..verification.feeds import overridable, session as _session
from ..verification.judge import Case, excuse
from fusionlab import ModelError, load
from fusionlab.passes import FusionError, fuse, options_for
from fusionlab.passes.validate import checker_problem, unknown_ops
from fusionlab.passes.vertical import RULE_NAMES

__all__ = ["PASS_SETS", "Kind", "FAILURES", "REPLAYABLE", "Outcome", "class_key", "judge", "check_fused", "blame", "Blame", "normalize", "interface_problems"]

PASS_SETS = {"vertical": ("vertical",), "all": ("vertical", "horizontal", "mixed")}


class Kind(StrEnum):
    """What fusing one model did (the module's docstring says when each applies); `error`: the campaign could
    not generate or run the graph at all."""

    OK = "ok"
    UNCHANGED = "unchanged"
    REFUSED = "refused"
    CRASH = "crash"
    INVALID = "invalid"
    WRONG = "wrong"
    TIMEOUT = "timeout"
    ERROR = "error"


#: the kinds that count as a failure of the passes
FAILURES = (Kind.CRASH, Kind.INVALID, Kind.WRONG, Kind.TIMEOUT)
#: the failures with a model to keep, replay and shrink (a timeout has none)
REPLAYABLE = (Kind.CRASH, Kind.INVALID, Kind.WRONG)
_PKG = str(Path(__file__).resolve().parent.parent)


@dataclass
class Outcome:
    """What fusing one model with one pass set did."""

    kind: Kind
    detail: str = ""
    symptom: str = ""
    rules: dict = field(default_factory=dict)
    where: str = ""

    @property
    def failed(self) -> bool:
        return self.kind in FAILURES

    def same_failure(self, other: "Outcome") -> bool:
        return self.kind == other.kind and self.symptom == other.symptom

    def __post_init__(self):
        self.kind = Kind(self.kind)

    def to_dict(self) -> dict:
        return asdict(self)


def class_key(outcome: dict) -> str:
    """The failure class of an outcome record (`Outcome.to_dict()` plus the blame label): kind | blame | symptom."""
    return f"{outcome['kind']} | {outcome.get('blame', '?')} | {outcome['symptom']}"


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
            return None, Outcome(Kind.CRASH, f"ModelError: {exc}", "ModelError: graph has a cycle (the input has none)",
                                 where=_where(exc))
        return None, Outcome(Kind.REFUSED, str(exc), normalize(exc))
    except Exception as exc:  # noqa: BLE001 - everything else is a crash
        w = _where(exc)
        # a FusionError's symptom is its problem, not where it was blamed: blame compares failures across pass sets
        what = exc.problem if isinstance(exc, FusionError) else exc
        return None, Outcome(Kind.CRASH, f"{type(exc).__name__}: {str(exc)[:300]}",
                             f"{type(exc).__name__} in {w}: {normalize(what)}", where=w)
    rules = result.plan.rule_counts()
    try:
        fused = result.graph.to_proto()
    except Exception as exc:  # noqa: BLE001
        w = _where(exc)
        return None, Outcome(Kind.CRASH, f"serialising the fused graph: {type(exc).__name__}: {exc}",
                             f"serialise: {type(exc).__name__}: {normalize(exc)}", rules, where=w)
    return (result, fused, alarm_feeds), Outcome(Kind.OK, rules=rules, detail=alarm,
                                                 symptom=normalize(alarm_problem) if alarm else "")


def _validity(case: Case, fused: onnx.ModelProto, rules: dict) -> tuple[object, Outcome | None]:
    problem = interface_problems(case.model, fused)
    if problem:
        return None, Outcome(Kind.INVALID, problem, "interface: " + normalize(problem), rules)
    try:
        onnx.checker.check_model(fused, full_check=True)
    except Exception as exc:  # noqa: BLE001
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, Outcome(Kind.INVALID, f"checker: {msg[:300]}", "checker: " + normalize(msg), rules)
    msg = _shape_checked(case.model, fused)
    if msg:
        return None, Outcome(Kind.INVALID, f"checker (contrib ops standing as their outputs): {msg[:300]}",
                             "checker, stand-ins: " + normalize(msg), rules)
    try:
        sess = _session(fused)
    except Exception as exc:  # noqa: BLE001
        msg = str(exc).strip().splitlines()[0]
        return None, Outcome(Kind.INVALID, f"onnxruntime refuses it: {msg[:300]}", "onnxruntime load: " + normalize(msg), rules)
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
            return Outcome(Kind.INVALID, f"onnxruntime cannot run it (draw {k}, dims {draw.dims}): {msg[:300]}",
                           "onnxruntime run: " + normalize(msg), rules)
        for name, o in case.outputs[k].items():
            if name not in got:
                return Outcome(Kind.WRONG, f"output {name!r} missing", "missing output", rules)
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
                if values and case.reference_problem:  # judged without the float64 reference: say so
                    problem += f" (no float64 reference: {case.reference_problem})"
                return Outcome(Kind.WRONG, f"output {name!r}, {where}: {problem}", symptom, rules)
    if accepted:
        return Outcome(Kind.OK, "accepted within the original's own sensitivity: " + accepted[0], "ill-conditioned", rules)
    return Outcome(Kind.OK, rules=rules)


def _shape_checked(original: onnx.ModelProto, fused: onnx.ModelProto) -> str:
    """The full checker's complaint about `fused` with every node onnx does not know (a com.microsoft op) standing as
    its typed outputs (`validate.checker_problem`): one such node makes onnx's shape inference drop every error of
    the model, so the plain checker never shape-checks a fused model holding a FusedConv. Empty when it passes."""
    if all(n.domain in ("", "ai.onnx", "ai.onnx.ml") for n in fused.graph.node):
        return ""  # the plain checker saw it all

    excused = unknown_ops(original)
    return checker_problem(load(fused, check=False), excused) or ""


def check_fused(case: Case, fused: onnx.ModelProto, rules: dict | None = None) -> Outcome:
    """Classify a fused model against the case's original: invalid, wrong or ok."""
    rules = dict(rules or {})
    sess, bad = _validity(case, fused, rules)
    if bad is not None:
        return bad
    return _values(case, fused, sess, rules)


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
        return Outcome(Kind.UNCHANGED, rules=outcome.rules)
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
        return Outcome(Kind.CRASH, f"safety net false alarm: {outcome.detail} (the judge: {judged.kind} {judged.detail})",
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
        fired = [r for r in (outcome.rules or {}) if r in RULE_NAMES]
        if not fired:
            fired = list(RULE_NAMES)
        for rule in fired:
            if judge(case, chosen, rules=[rule]).same_failure(outcome):
                return Blame(chosen, (rule,))
    return Blame(chosen)
