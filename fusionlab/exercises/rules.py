"""Exercise: write a vertical fusion rule with the engine's `Rule` API (notebook 03).

The rule: a clamp written as two ops, ``Max(x, lo) -> Min(., hi)`` with constant scalar bounds (what exporters
emit for ``torch.clamp`` and TensorFlow's ``relu6``), becomes one ``Clip(x, lo, hi)``: two kernels and one
intermediate fewer. The learner writes a `Rule` subclass (`names = ("max_min_clip",)`, `anchors = ("Max",)`,
`match`, `rewrite`); `check(MyRule)` runs it the way the vertical pass does (`engine.find` over the graph, then
`rewrite` and `engine.replace` on each match) on hidden graphs built with the fuzzer's `Builder`:

- POSITIVE graphs, where it must fuse exactly the Max and the Min named (operands in either order, bounds stored
  as initializers or Constant nodes, shapes () and (1,), two clamps in one graph, after one of the fuzzer's random
  elementwise chains), where the rewritten model must pass onnx's full checker (and the generator's `validate`
  holds for the original) and compute what the original does (onnxruntime, graph optimisations off);
- NEAR-MISS graphs, where it must fuse nothing: a lower or an upper bound that is per-channel, an upper bound
  that is a graph input (no constant), a bound that would broadcast x up a rank, a Max of three inputs, a Max output another node reads too, a Max output that is a graph output (the
  engine refuses the last two by itself, `engine.escapes`; the rule must refuse the others).

The hint names the first failing case and what went wrong there.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx

from ..fuzz import chains
from ..fuzz.builder import Builder
from ..fuzz.generator import validate
from ..graph import load
from ..passes import cleanup, engine
from ..passes.engine import Refused, Rule
from ..verification.runtime import verify
from .core import AnswerRaised, Case, Verdict, attempt, grade

__all__ = ["EXERCISE", "TASK", "RULE", "CASES", "check", "run_rule"]

EXERCISE = "a rule: Max(x, lo) -> Min(., hi) becomes Clip(x, lo, hi)"
TASK = "your rule's match and rewrite"
RULE = "max_min_clip"
OPSET = 17


@dataclass(frozen=True)
class RuleCase:
    """A graph (`build(b)` writes it into a Builder and returns (outputs, clamps)) and whether it must fuse.

    `clamps`: for a positive, (Max output, Min output) of each clamp the rule must fuse; for a near miss, the one
    it must leave alone, with `why` saying why."""

    build: Callable
    positive: bool
    why: str = ""
    seed: int = 0


def _builder(seed: int) -> Builder:
    return Builder(random.Random(f"fusionlab.exercises.rules/{seed}"), np.float32, OPSET)


def _scalar(b: Builder, value: float, shape=(), form: str = "init") -> str:
    return b.const(np.full(shape, value, np.float32), "bound", form=form)


def _clamp(b: Builder, x: str, lo: str, hi: str, *, swap: bool = False) -> tuple[str, str]:
    mx = b.node("Max", [lo, x] if swap else [x, lo], b.shape(x))
    mn = b.node("Min", [hi, mx] if swap else [mx, hi], b.shape(x))
    return mx, mn


def _relu6(b):
    x = b.input((2, 8), "x")
    mx, mn = _clamp(b, x, _scalar(b, 0.0), _scalar(b, 6.0))
    return [mn], [(mx, mn)]


def _swapped(b):
    x = b.input((3, 5), "x")
    t = b.unary("Tanh", x)
    mx, mn = _clamp(b, t, _scalar(b, -0.5), _scalar(b, 0.25), swap=True)
    return [mn], [(mx, mn)]


def _after_conv(b):
    x = b.input((1, 3, 6, 6), "x")
    w = b.const(b.rand((4, 3, 3, 3), 0.5), "W")
    c = b.node("Conv", [x, w], (1, 4, 4, 4), kernel_shape=[3, 3])
    mx, mn = _clamp(b, c, _scalar(b, -1.0, (1,), "constant"), _scalar(b, 1.5, (1,), "constant"))
    return [b.unary("Relu", mn)], [(mx, mn)]


def _two_clamps(b):
    x = b.input((2, 4, 5), "x")
    mx1, mn1 = _clamp(b, x, _scalar(b, -2.0, (1, 1)), _scalar(b, 2.0))
    s = b.unary("Sigmoid", mn1)
    mx2, mn2 = _clamp(b, s, _scalar(b, 0.2), _scalar(b, 0.7, (1,)), swap=True)
    return [mn2], [(mx1, mn1), (mx2, mn2)]


def _after_chain(b):
    """A clamp after one of the fuzzer's random elementwise chains (`fuzz.chains.chain`), drawn until it holds no
    Max or Min of its own (so the only clamp is the one placed here)."""
    x = b.input((2, 3, 4), "x")
    start = len(b.nodes)
    y = chains.chain(b, x, [x])
    if any(n.op_type in ("Max", "Min") for n in b.nodes[start:]):
        raise ValueError("the chain drew a Max or Min")
    mx, mn = _clamp(b, y, _scalar(b, -0.75), _scalar(b, 0.75), swap=True)
    return [mn], [(mx, mn)]


def _per_channel(b):
    x = b.input((1, 4, 3, 3), "x")
    lo = b.const(np.array([-1.0, 0.0, -0.5, 0.5], np.float32).reshape(4, 1, 1), "lo")
    mx, mn = _clamp(b, x, lo, _scalar(b, 1.0))
    return [mn], [(mx, mn)]


def _per_channel_hi(b):
    x = b.input((1, 4, 3, 3), "x")
    hi = b.const(np.array([1.0, 2.0, 0.5, 1.5], np.float32).reshape(4, 1, 1), "hi")
    mx, mn = _clamp(b, x, _scalar(b, -1.0), hi)
    return [mn], [(mx, mn)]


def _hi_input(b):
    x = b.input((2, 6), "x")
    y = b.input((2, 6), "y")
    mx = b.node("Max", [x, _scalar(b, 0.0)], (2, 6))
    mn = b.node("Min", [mx, y], (2, 6))
    return [mn], [(mx, mn)]


def _rank_up(b):
    x = b.input((3, 4), "x")
    lo = b.const(np.full((1, 1, 1), -0.5, np.float32), "lo")
    mx = b.node("Max", [x, lo], (1, 3, 4))
    mn = b.node("Min", [mx, _scalar(b, 0.5)], (1, 3, 4))
    return [mn], [(mx, mn)]


def _three_inputs(b):
    x = b.input((2, 6), "x")
    y = b.input((2, 6), "y")
    mx = b.node("Max", [x, _scalar(b, -1.0), y], (2, 6))
    mn = b.node("Min", [mx, _scalar(b, 1.0)], (2, 6))
    return [mn], [(mx, mn)]


def _second_consumer(b):
    x = b.input((2, 6), "x")
    mx, mn = _clamp(b, x, _scalar(b, 0.0), _scalar(b, 6.0))
    return [mn, b.unary("Neg", mx)], [(mx, mn)]


def _graph_output(b):
    x = b.input((2, 6), "x")
    mx, mn = _clamp(b, x, _scalar(b, 0.0), _scalar(b, 6.0))
    return [mn, mx], [(mx, mn)]


#: the hidden cases, in the order they are graded: positives first, then the near misses
CASES = (
    Case("ReLU6 written out: Max(x, 0) -> Min(., 6), scalar bounds of shape ()", RuleCase(_relu6, True, seed=1)),
    Case("operands swapped: Max(lo, x) -> Min(hi, .) after a Tanh", RuleCase(_swapped, True, seed=2)),
    Case("after a Conv, bounds of shape (1,) in Constant nodes", RuleCase(_after_conv, True, seed=3)),
    Case("two clamps in one graph, a bound of shape (1, 1) on a rank-3 tensor", RuleCase(_two_clamps, True, seed=4)),
    Case("after a random elementwise chain drawn by the fuzzer", RuleCase(_after_chain, True, seed=10)),
    Case("near miss: a per-channel lower bound of shape (4, 1, 1)",
         RuleCase(_per_channel, False, "Clip's bounds are one scalar each; a bound of shape (4, 1, 1) clamps each "
                                       "channel differently", seed=5)),
    Case("near miss: a per-channel upper bound of shape (4, 1, 1)",
         RuleCase(_per_channel_hi, False, "Clip's bounds are one scalar each; an upper bound of shape (4, 1, 1) "
                                          "clamps each channel differently", seed=11)),
    Case("near miss: Min(., y) with y a graph input, not a constant",
         RuleCase(_hi_input, False, "y changes from run to run and has x's shape: it is no constant scalar bound",
                  seed=12)),
    Case("near miss: a lower bound of shape (1, 1, 1) on a rank-2 x",
         RuleCase(_rank_up, False, "the bound broadcasts x up to rank 3, and Clip's output keeps x's rank",
                  seed=6)),
    Case("near miss: Max of three inputs, Max(x, lo, y)",
         RuleCase(_three_inputs, False, "Max is variadic: with a third input it is no clamp of x", seed=7)),
    Case("near miss the engine refuses itself: the Max's output is also read by a Neg",
         RuleCase(_second_consumer, False, "fusing would remove a value the Neg reads", seed=8)),
    Case("near miss the engine refuses itself: the Max's output is a graph output",
         RuleCase(_graph_output, False, "fusing would remove a graph output", seed=9)),
)


def build_case(c: RuleCase) -> tuple[onnx.ModelProto, list[tuple[str, str]]]:
    """The case's model and its clamps (Max, Min output names); a draw the case cannot use is drawn again."""
    for attempt_no in range(50):
        b = _builder(c.seed * 100 + attempt_no)
        try:
            outputs, clamps = c.build(b)
        except ValueError:
            continue
        model = b.model(outputs, ir_version=10, graph_name="clamp")
        if validate(model) is None:
            return model, clamps
    raise RuntimeError(f"no valid model for {c.build.__name__}")  # pragma: no cover - the seeds are fixed


def _rule(answer) -> Rule:
    rule = attempt(answer) if isinstance(answer, type) else answer
    if not isinstance(rule, Rule):
        what = answer.__name__ if isinstance(answer, type) else type(answer).__name__
        raise AnswerRaised(f"expected a Rule subclass (class MyRule(Rule): ...), got {what}")
    if RULE not in tuple(rule.names) or "Max" not in tuple(rule.anchors):
        raise AnswerRaised(f"the rule needs names = ({RULE!r},) and anchors = ('Max',); it has names = "
                           f"{tuple(rule.names)} and anchors = {tuple(rule.anchors)}")
    return rule


class _Learner(Rule):
    """The learner's rule with every call to its code going through `attempt` (a Refused passes through)."""

    def __init__(self, rule: Rule):
        self.inner, self.names, self.anchors, self.fixed = rule, tuple(rule.names), tuple(rule.anchors), rule.fixed
        self.domains = rule.domains

    def match(self, cx, anchor):
        def call():
            try:
                return self.inner.match(cx, anchor), None
            except Refused as exc:
                return None, exc
        m, refused = attempt(call)
        if refused is not None:
            raise refused
        if m is not None and not isinstance(m, engine.Match):
            raise AnswerRaised(f"match must return a Match, None, or raise Refused; it returned {type(m).__name__}")
        return m

    def rewrite(self, cx, m):
        new = attempt(self.inner.rewrite, cx, m)
        if not isinstance(new, list) or not new or not all(isinstance(n, engine.ir.Node) for n in new):
            raise AnswerRaised("rewrite must return a non-empty list of new nodes (cx.node(...))")
        return new

    def outputs(self, m, new_nodes):
        return attempt(self.inner.outputs, m, new_nodes)


def run_rule(rule: Rule, model: onnx.ModelProto):
    """The vertical pass with this one rule: (matches as lists of node names, the rewritten model, refusals)."""
    graph = load(model)
    cx = engine.Context(graph, rules=rule.names)
    matches = engine.find(cx, [rule])
    found = [[n.name for n in m.nodes] for m in matches]
    for m in matches:
        new_nodes = rule.rewrite(cx, m)
        engine.replace(cx, m, new_nodes, rule.outputs(m, new_nodes), same_shape=rule.same_shape)
    cleanup.remove_dead(graph)
    engine.import_domains(graph)
    return found, graph.to_proto(), cx.refusals


def _names(model: onnx.ModelProto, outputs: tuple[str, str]) -> set[str]:
    made = {o: n.name for n in model.graph.node for o in n.output}
    return {made[o] for o in outputs}


def _ort_message(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = text.split("Status Message: ")[-1]
    return text.rsplit(" const ", 1)[-1].split("] ", 1)[-1][:200] if " const " in text else text[:200]


def _judge(answer, case: Case) -> str | None:
    c: RuleCase = case.data
    rule = _Learner(_rule(answer))
    model, clamps = build_case(c)
    original = load(model).to_proto()  # names as loading gives them
    found, fused, _ = run_rule(rule, original)
    got = [set(f) for f in found]
    if not c.positive:
        if got:
            return f"your rule fused {sorted(got[0])}; it must not: {c.why}"
        return None
    want = [_names(original, cl) for cl in clamps]
    for w in want:
        if w not in got:
            near = next((g for g in got if g & w), None)
            return (f"your rule did not fuse {sorted(w)}" if near is None else
                    f"your rule fused {sorted(near)} where it should fuse exactly {sorted(w)}")
    extra = [g for g in got if g not in want]
    if extra:
        return f"your rule also fused {sorted(extra[0])}, which is no Max -> Min clamp of this graph"
    if len(fused.graph.node) >= len(original.graph.node):
        return (f"your rewrite left {len(fused.graph.node)} nodes of {len(original.graph.node)}: two ops must become "
                "one")
    try:
        onnx.checker.check_model(fused, full_check=True)
    except Exception as exc:  # noqa: BLE001 - any complaint of the checker fails the rewrite
        return f"your rewritten model fails onnx's full checker: {str(exc).strip().splitlines()[0][:160]}"
    try:
        report = verify(original, fused)
    except Exception as exc:  # noqa: BLE001 - onnxruntime refusing the rewrite is the learner's failure
        return f"onnxruntime cannot run your rewritten model: {_ort_message(exc)}"
    if not report.ok:
        bad = next(o for o in report.outputs if not o.ok)
        return (f"your rewritten model computes {bad.name} differently (max abs error {bad.max_abs:.3g}, "
                "onnxruntime with graph optimisations off)")
    return None


def check(answer) -> Verdict:
    """Grade a `Rule` subclass (or instance) for max_min_clip on the hidden positive and near-miss graphs."""
    return grade(EXERCISE, answer, CASES, _judge, task=TASK,
                 checked="Positives: exactly the clamp's Max and Min fused, the rewrite passes onnx's full checker and "
                         "matches onnxruntime (graph optimisations off) on the original; near misses: nothing fused.")

