"""Exercise: the ATC fusion switch file for a conversion without the fusions a plan makes (notebook 15).

The learner writes ``switch_file(plan) -> str``: the ``--fusion_switch_file`` (JSON form) that turns off every CANN
ATC pass under which `fusionlab.export.cann` files the plan's groups, and nothing else, so that an ATC conversion
with it and one without it can be compared on a device. The `Fusionlab...` names of fusion_result.json are not ATC
passes (there is nothing to switch off), `ALL` switches off more than the plan's passes, and each pass belongs to
its stage (`GraphFusion` or `UBFusion`). `check(switch_file)` grades it on hidden plans against what
`cann.fusion_switch` writes for the documented passes in `cann.fusion_result(plan)`, and names the first pass that
is missing, extra, in the wrong stage or not "off".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np
from onnx import helper

from .. import zoo
from ..build import make_model, tensor, value_info
from ..compilers import MODELS
from ..export import cann
from ..graph import load
from ..passes import plan as fusion_plan
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "expected", "plan_for"]

EXERCISE = "an ATC switch file for the plan's passes"
TASK = "switch_file(plan) returning the switch file's JSON text"
PASSES = ("vertical", "horizontal", "mixed")
_STAGES = {"GraphFusion": cann.GRAPH, "UBFusion": cann.UB}


@dataclass(frozen=True)
class SwitchCase:
    model: str  # a zoo model of notebook 15's list, or a small graph built here


def _f(name, shape):
    return value_info(name, np.float32, shape)


def _linear():
    """x @ W + b on 2-D tensors: fusionlab's matmul_add_gemm makes it a Gemm."""
    w = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["t"], name="matmul"),
             helper.make_node("Add", ["t", "b"], ["y"], name="bias")]
    return make_model(nodes, [_f("x", [4, 8])], [_f("y", [4, 6])], [tensor("W", w), tensor("b", w[0, :6])])


def _lone():
    return make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [_f("x", [2, 3])], [_f("y", [2, 3])])


_SMALL: dict[str, Callable] = {"linear": _linear, "lone": _lone}


@lru_cache(maxsize=None)
def plan_for(model: str):
    """The plan of §6 (vertical, horizontal and mixed passes) for a case's model."""
    proto = _SMALL[model]() if model in _SMALL else zoo.get(model, **MODELS[model])
    return fusion_plan(load(proto), passes=PASSES)


CASES = (
    Case("ResNet (§6's plan): Conv + BN folded, Conv epilogues fused in UB", SwitchCase("resnet_small")),
    Case("a 2-D MatMul + bias Add that fusionlab makes a Gemm", SwitchCase("linear")),
    Case("BERT-tiny: every group filed under a Fusionlab... name", SwitchCase("bert_tiny")),
    Case("MobileNetV2: ATC's UB pass beside a Fusionlab one in the same stage", SwitchCase("mobilenet_v2")),
    Case("a lone Relu: a plan with no group at all", SwitchCase("lone")),
)


def expected(c: SwitchCase) -> dict:
    """{"GraphFusion": {pass: "off"}, "UBFusion": {...}}: cann.fusion_switch of the documented passes the plan uses."""
    result = cann.fusion_result(plan_for(c.model))
    atc = [name for stage in (cann.GRAPH, cann.UB) for name in result[stage] if not name.startswith("Fusionlab")]
    return json.loads(cann.fusion_switch(atc))["Switch"]


def _read(text) -> dict:
    """The learner's switch file as {"GraphFusion": {...}, "UBFusion": {...}} (AnswerRaised if it is not one)."""
    if not isinstance(text, str):
        raise AnswerRaised(f"switch_file must return the file's text (a str), got {type(text).__name__}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AnswerRaised(f"ATC could not read it as JSON: {exc.msg} (line {exc.lineno})") from None
    switch = data.get("Switch") if isinstance(data, dict) else None
    if not isinstance(switch, dict) or set(switch) - set(_STAGES) or not all(
            isinstance(v, dict) for v in switch.values()):
        raise AnswerRaised('the file must be {"Switch": {"GraphFusion": {...}, "UBFusion": {...}}}, as '
                           'cann.fusion_switch writes it')
    return {stage: dict(switch.get(stage, {})) for stage in _STAGES}


def _judge(switch_file, case: Case) -> str | None:
    c: SwitchCase = case.data
    plan = plan_for(c.model)
    got = attempt(switch_file, plan)
    if is_stub(got):
        raise NotAnswered
    have, want = _read(got), expected(c)
    result = cann.fusion_result(plan)
    counts = {name: int(v["effect_times"]) for stage in (cann.GRAPH, cann.UB) for name, v in result[stage].items()}
    for stage, passes in have.items():
        other = next(s for s in _STAGES if s != stage)
        for name, value in passes.items():
            if name == "ALL":
                return (f"ALL under {stage} switches off {stage} passes beyond those this plan is filed under (and, "
                        f"cann_facts.md says, not every pass): name the plan's passes")
            if name.startswith("Fusionlab"):
                return (f"{name} is fusionlab's name for a rule with no documented ATC pass: ATC has no such "
                        f"pass to turn off")
            if name in want[other] and name not in want[stage]:
                return f"{name} is a pass of {other}, not of {stage}"
            if name not in want[stage]:
                return f"{name} is not in this plan's fusion_result.json: it does no fusion of this plan"
            if value != "off":
                return f'{name} is set to {value!r}: a switch file can only turn passes off ("off")'
    for stage, passes in want.items():
        for name in passes:
            if name not in have[stage]:
                return (f"{name} ({stage}) is still on: fusion_result.json files {counts[name]} of this plan's "
                        f"groups under it")
    return None


def check(switch_file) -> Verdict:
    """Grade `switch_file(plan) -> str` on the hidden plans."""
    return grade(EXERCISE, switch_file, CASES, _judge, task=TASK,
                 checked="Each plan: your file against cann.fusion_switch of the ATC passes (not the Fusionlab... "
                         "ones) in cann.fusion_result(plan), each in its stage, set to \"off\".")
