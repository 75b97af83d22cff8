"""Exercise: the workspace a preallocated memory plan needs, the peak of live tensors (notebook 18).

The seed's second fix replaces an allocation per tensor by a workspace allocated once (onnxruntime's memory
patterns: every intermediate gets an offset in one block, planned on the first run). The block must hold every
tensor while it is live: from the kernel that writes it to the last kernel that reads it, a graph input from the
start, a graph output to the end of the run. The learner writes ``workspace_bytes(inputs, steps, outputs) -> int``:
the peak of the live bytes over the run, given the graph inputs' sizes, the kernels in run order (`Step`: what each
reads, what it writes and how many bytes) and the graph outputs' names. `fusionlab.cost.run_of(model, plan)`
describes any model that way, the notebook's YOLOv5 included (the lesson's function; `Step`, `Run` and
`run_of` are re-exported here). `check(workspace_bytes)` grades it on hidden models, built here and described by
`run_of`, against `fusionlab.cost.schedule.peak_live` over the same kernels: the cost model's
``peak_activation_bytes`` (notebook 08 §1), exactly (a byte count is right or wrong). The hint names the likely
mistake: one slot per tensor (no reuse), a kernel's inputs freed before its outputs are written, the graph inputs
left out, graph outputs freed after their last reader, a tensor freed after its first reader rather than its last
(a skip connection), or the largest kernel's reads and writes alone. Several mistakes can give the same bytes on
one model, so a mistake is named only if the answer also agrees with it on `PROBE`, a run where each gives its own.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from onnx import helper

from .. import zoo
from ..build import make_model, tensor, value_info
from ..cost import schedule
from ..cost.model import run_of, schedule_of
from ..cost.schedule import Run, Step
from ..passes import plan as make_plan
from ..plan import FusionPlan
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "Step", "Run", "run_of", "expected", "check"]

EXERCISE = "the workspace a memory plan preallocates"
TASK = "workspace_bytes(inputs, steps, outputs)"


def expected(model, plan: FusionPlan | None = None) -> int:
    """fusionlab's figure: `schedule.peak_live` over the plan's kernels, with no spill workspace."""
    a, ks = schedule_of(model, plan)
    return schedule.peak_live(ks, a.graph.inputs(), a.nbytes, [0] * len(ks.order))[0]


# -- the hidden models (float32, batch 1) ---------------------------------------------------------------------------

def _conv(rng, name: str, x: str, y: str, cin: int, cout: int) -> tuple:
    w = tensor(f"{name}.w", (rng.standard_normal((cout, cin, 3, 3)) * 0.1).astype(np.float32))
    return helper.make_node("Conv", [x, w.name], [y], name=name, pads=[1, 1, 1, 1]), w


def _model(name: str, layers: list[tuple], inputs: dict[str, int], outputs: dict[str, int], hw: int = 16):
    """A model from (op, inputs, output, cin, cout) layers; Conv layers get seeded 3x3 weights."""
    rng = np.random.default_rng(len(name))
    nodes, inits = [], []
    for i, (op, ins, out, cin, cout) in enumerate(layers):
        if op == "Conv":
            node, w = _conv(rng, f"conv{i}", ins[0], out, cin, cout)
            nodes.append(node)
            inits.append(w)
        else:
            nodes.append(helper.make_node(op, list(ins), [out], name=f"{op.lower()}{i}",
                                          **({"axis": 1} if op == "Concat" else {})))
    return make_model(nodes, [value_info(k, np.float32, [1, c, hw, hw]) for k, c in inputs.items()],
                      [value_info(k, np.float32, [1, c, hw, hw]) for k, c in outputs.items()], inits, name=name)


def _chain():
    return _model("chain", [("Relu", ["x"], "a", 8, 8), ("Sigmoid", ["a"], "b", 8, 8), ("Neg", ["b"], "c", 8, 8),
                            ("Abs", ["c"], "y", 8, 8)], {"x": 8}, {"y": 8})


def _residual():
    return _model("residual", [("Relu", ["x"], "r", 8, 8), ("Conv", ["r"], "a", 8, 16), ("Relu", ["a"], "b", 16, 16),
                               ("Conv", ["b"], "c", 16, 8), ("Add", ["c", "r"], "y", 8, 8)], {"x": 8}, {"y": 8})


def _branches():
    return _model("branches", [("Conv", ["x"], "a", 8, 4), ("Conv", ["x"], "b", 8, 4), ("Conv", ["x"], "c", 8, 8),
                               ("Concat", ["a", "b", "c"], "y", 16, 16)], {"x": 8}, {"y": 16})


def _early_output():
    return _model("early_output", [("Relu", ["x"], "aux", 8, 8), ("Conv", ["aux"], "t", 8, 32),
                                   ("Sigmoid", ["t"], "u", 32, 32), ("Conv", ["u"], "y", 32, 8)],
                  {"x": 8}, {"aux": 8, "y": 8})


def _late_input():
    return _model("late_input", [("Conv", ["x"], "t", 8, 32), ("Relu", ["t"], "u", 32, 32),
                                 ("Conv", ["u"], "v", 32, 8), ("Mul", ["v", "g"], "y", 8, 8)],
                  {"x": 8, "g": 8}, {"y": 8})


@lru_cache(maxsize=None)
def _hidden(which: str) -> tuple[Run, int]:
    """(the run the learner is given, the truth) of one hidden model, built once."""
    if which == "conv_bn_relu fused":
        model = zoo.conv_bn_relu(image_size=16)
        p = make_plan(model, ("vertical",))
    elif which == "yolov5 fused":
        model = zoo.yolov5s(image_size=160, width_mult=0.25)
        p = make_plan(model, ("vertical",))
    else:
        model = {"chain": _chain, "residual": _residual, "branches": _branches, "early output": _early_output,
                 "late input": _late_input, "conv_bn_relu": lambda: zoo.conv_bn_relu(image_size=16)}[which]()
        p = None
    return run_of(model, p), expected(model, p)


CASES = (
    Case("a chain of four element-wise ops on an 8-channel 16x16 map", "chain"),
    Case("a residual block: the first Relu's output is read again by the Add three kernels later", "residual"),
    Case("three branches joined by a Concat: every branch's output waits for it", "branches"),
    Case("a graph output written first (aux) and read by the next kernel, then kept to the end", "early output"),
    Case("a second graph input read only by the last kernel", "late input"),
    Case("Conv, BatchNormalization, Relu unfused", "conv_bn_relu"),
    Case("the same layer fused by the vertical pass: one kernel, its intermediates never written", "conv_bn_relu fused"),
    Case("§1's YOLOv5-style detector at 160 px, fused by the vertical pass", "yolov5 fused"),
)


# -- the mistakes the hint can name ---------------------------------------------------------------------------------

def _peak(r: Run, *, inputs: bool = True, outputs_to_end: bool = True, hold_inputs: bool = True,
          first_reader: bool = False) -> int:
    """The peak of live bytes, with one rule of liveness changed (a learner's plausible mistake)."""
    n = len(r.steps)
    start: dict[str, int] = {name: 0 for name in r.inputs} if inputs else {}
    size = dict(r.inputs) if inputs else {}
    for i, s in enumerate(r.steps):
        for name, b in s.writes.items():
            start[name], size[name] = i, b
    end, seen = dict(start), set()
    for i, s in enumerate(r.steps):
        for name in s.reads:
            if name in start and not (first_reader and name in seen):
                end[name] = max(end[name], i)
            seen.add(name)
    if outputs_to_end:
        for name in r.outputs:
            if name in end:
                end[name] = n - 1
    peak = 0
    for i in range(n):
        live = sum(size[t] for t in start if start[t] <= i <= end[t]
                   and (hold_inputs or i < end[t] or start[t] == i or (t in r.outputs and outputs_to_end)))
        peak = max(peak, live)
    return peak


#: Not graded: a run on which every mistake of `_mistakes` gives its own byte count (two inputs, one read last; a
#: graph output written first; a skip connection).
PROBE = Run({"x": 100, "g": 7}, (Step("k0", ("x",), {"aux": 30}), Step("k1", ("aux",), {"a": 200}),
                                 Step("k2", ("a",), {"b": 50}), Step("k3", ("b",), {"c": 400}),
                                 Step("k4", ("c", "a"), {"d": 20}), Step("k5", ("d", "g"), {"y": 10})), ("aux", "y"))


def _largest_kernel(r: Run) -> int:
    size = dict(r.inputs) | {name: b for s in r.steps for name, b in s.writes.items()}
    return max(sum(size.get(t, 0) for t in s.reads) + sum(s.writes.values()) for s in r.steps)


def _mistakes(r: Run) -> list[tuple[int, str]]:
    everything = sum(r.inputs.values()) + sum(b for s in r.steps for b in s.writes.values())
    return [
        (everything, "one slot per tensor, none reused: a tensor's bytes are free once its last reader has run"),
        (_peak(r, inputs=False), "the graph inputs left out: they are live from the start until their last reader"),
        (_peak(r, outputs_to_end=False), "graph outputs freed after their last reader: they are live to the end"),
        (_peak(r, first_reader=True),
         "each tensor freed after its first reader: it lives until its LAST one (a skip connection)"),
        (_peak(r, hold_inputs=False),
         "a kernel's inputs freed before it writes its outputs: while it runs it holds both"),
        (_largest_kernel(r), "the largest kernel's reads and writes alone: tensors written before it and read after "
                             "it are live too"),
    ]


def _judge(workspace_bytes, case: Case) -> str | None:
    run, want = _hidden(case.data)
    got = attempt(workspace_bytes, dict(run.inputs), list(run.steps), tuple(run.outputs))
    if is_stub(got):
        raise NotAnswered
    if isinstance(got, bool) or not isinstance(got, (int, float, np.integer, np.floating)):
        raise AnswerRaised(f"workspace_bytes must return a number of bytes, got {type(got).__name__}")
    if got == want:
        return None
    said = [i for i, (value, _) in enumerate(_mistakes(run)) if value != want and value == got]
    if said:  # the same bytes as a mistake here: name it only if the answer follows that mistake on the probe too
        probe = _mistakes(PROBE)
        try:
            on_probe = attempt(workspace_bytes, dict(PROBE.inputs), list(PROBE.steps), tuple(PROBE.outputs))
        except Exception:  # noqa: BLE001 - whatever the answer does on the probe, it only decides the wording
            on_probe = None
        said = [probe[i][1] for i in said if on_probe is not None and not isinstance(on_probe, bool)
                and on_probe == probe[i][0]]
    word = "too high" if got > want else "too low"
    return (f"you say {float(got):,.0f} bytes, {word}; the peak of live tensors is {want:,} bytes"
            + (f": that is {said[0]}" if said else ""))


def check(workspace_bytes) -> Verdict:
    """Grade `workspace_bytes(inputs, steps, outputs)` on the hidden models."""
    return grade(EXERCISE, workspace_bytes, CASES, _judge, task=TASK,
                 checked="Each model: your byte count against fusionlab.cost.schedule.peak_live over the same "
                         "kernels (the cost model's peak_activation_bytes), exactly.")
