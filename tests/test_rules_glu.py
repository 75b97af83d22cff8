"""Gated MLPs (opt-in rules swiglu, geglu): LLaMA's silu(x W_gate) * (x W_up) and T5's gated-gelu as one group.

onnxruntime 1.31 has no CPU kernel for either, so the group is written as its ops (the activation as one op)
or, with lower="functions", as one model-local function call; measured no faster than the default rules
(vertical.DEFAULT_RULES), hence opt-in.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper as h

from fusionlab.build import tensor, value_info
from fusionlab.passes import fuse
from fusionlab.passes.vertical import DEFAULT_RULES

from rulekit import CORPUS, check, mk, r

H, I = 16, 24


def glu_model(act="silu", *, mul_first=False, silu_first=False, up_input="x", dtype=np.float32, opset=20,
              silu_other=False):
    """x -> gate/up projections -> act(gate) * up -> down projection."""
    nodes = [h.make_node("MatMul", ["x", "Wg"], ["g"], name="gate"),
             h.make_node("MatMul", [up_input, "Wu"], ["u"], name="up")]
    inits = [tensor("Wg", r(H, I, scale=0.3, dtype=dtype)), tensor("Wu", r(H, I, scale=0.3, dtype=dtype)),
             tensor("Wd", r(I, H, scale=0.3, dtype=dtype))]
    if act == "silu":
        nodes += [h.make_node("Sigmoid", ["g"], ["sg"], name="sigmoid"),
                  h.make_node("Mul", ["sg", "u" if silu_other else "g"] if silu_first else
                              ["u" if silu_other else "g", "sg"], ["a"], name="silu")]
    elif act == "erf":
        nodes += [h.make_node("Div", ["g", "sqrt2"], ["d"], name="div"), h.make_node("Erf", ["d"], ["e"], name="erf"),
                  h.make_node("Add", ["e", "one"], ["e1"], name="add1"), h.make_node("Mul", ["g", "e1"], ["ge"], name="mulx"),
                  h.make_node("Mul", ["ge", "half"], ["a"], name="half_")]
        inits += [tensor("sqrt2", np.array(math.sqrt(2), dtype)), tensor("one", np.array(1, dtype)),
                  tensor("half", np.array(0.5, dtype))]
    elif act == "tanh":  # T5's gelu_new, as TorchScript writes it
        nodes += [h.make_node("Mul", ["g", "half"], ["gh"], name="mul_half"),
                  h.make_node("Pow", ["g", "three"], ["g3"], name="cube"),
                  h.make_node("Mul", ["g3", "k"], ["g3k"], name="mul_k"),
                  h.make_node("Add", ["g", "g3k"], ["inner"], name="add_inner"),
                  h.make_node("Mul", ["inner", "c"], ["ic"], name="mul_c"),
                  h.make_node("Tanh", ["ic"], ["t"], name="tanh"),
                  h.make_node("Add", ["t", "one"], ["t1"], name="add_one"),
                  h.make_node("Mul", ["gh", "t1"], ["a"], name="mul_out")]
        inits += [tensor("half", np.array(0.5, dtype)), tensor("three", np.array(3.0, dtype)),
                  tensor("k", np.array(0.044715, dtype)), tensor("c", np.array(math.sqrt(2 / math.pi), dtype)),
                  tensor("one", np.array(1.0, dtype))]
    else:  # the opset-20 Gelu op
        nodes.append(h.make_node("Gelu", ["g"], ["a"], name="gelu", **({"approximate": "tanh"} if act == "gelu_tanh"
                                                                       else {})))
    nodes += [h.make_node("Mul", ["u", "a"] if mul_first else ["a", "u"], ["m"], name="gating"),
              h.make_node("MatMul", ["m", "Wd"], ["y"], name="down")]
    ins = [value_info("x", dtype, ["batch", 7, H])] + ([value_info(up_input, dtype, ["batch", 7, H])]
                                                       if up_input != "x" else [])
    return mk(nodes, ins, [value_info("y", dtype, ["batch", 7, H])], inits, opset=opset)


ACT_OP = {"silu": "com.microsoft:QuickGelu", "erf": "Gelu", "tanh": "com.microsoft:FastGelu",
          "gelu_op": "Gelu", "gelu_tanh": "com.microsoft:FastGelu"}


@pytest.mark.parametrize("act", sorted(ACT_OP))
@pytest.mark.parametrize("mul_first", [False, True])
def test_gated_mlp_is_one_group(act, mul_first):
    rule = "swiglu" if act == "silu" else "geglu"
    res = check(glu_model(act, mul_first=mul_first), (rule,), {"MatMul": 3, ACT_OP[act]: 1, "Mul": 1})
    assert res.plan.rule_counts() == {rule: 1}
    group = next(iter(res.plan))
    assert set(group.nodes) >= {"gate", "up", "gating"} and "down" not in group.nodes
    assert group.extra["kernel"] is False


@pytest.mark.parametrize("act", ["silu", "erf", "tanh"])
def test_lowered_to_functions_it_is_one_call(act):
    rule = "swiglu" if act == "silu" else "geglu"
    res = check(glu_model(act, silu_first=True), (rule,), lower="functions")
    calls = [n for n in res.graph if n.domain == "fusionlab.fused"]
    assert len(calls) == 1 and res.after["MatMul"] == 1  # only the down projection stays outside
    assert next(iter(res.plan)).lowered_to.startswith("fusionlab.fused:")


def test_swiglu_in_half_precision_keeps_sigmoid_and_mul():
    """QuickGelu's CPU kernel is float32 only: in float16 the activation stays Sigmoid + Mul."""
    res = check(glu_model("silu", dtype=np.float16), ("swiglu",), {"MatMul": 3, "Sigmoid": 1, "Mul": 2})
    assert res.plan.rule_counts() == {"swiglu": 1}


@pytest.mark.parametrize("case", ["up reads another input", "silu of another tensor", "activation read elsewhere"])
def test_gated_mlp_near_misses_stay(case):
    if case == "up reads another input":
        m = glu_model("silu", up_input="x2")
    elif case == "silu of another tensor":
        m = glu_model("silu", silu_other=True)
    else:
        m = glu_model("erf")
        m.graph.output.append(value_info("a", np.float32, ["batch", 7, I]))
    res = fuse(m, ("vertical",), rules=("swiglu", "geglu"))
    assert "swiglu" not in res.plan.rule_counts() and "geglu" not in res.plan.rule_counts()
    if case == "activation read elsewhere":
        assert any("read outside the gated MLP" in x.reason for x in res.plan.refusals), res.plan.refusals


def test_gated_mlps_are_opt_in():
    assert "swiglu" not in DEFAULT_RULES and "geglu" not in DEFAULT_RULES
    res = fuse(glu_model("silu"))
    assert res.plan.rule_counts() == {"silu": 1}  # the activation alone, as before
    why = [x.reason for x in res.plan.why_not("gating")]
    assert any("swiglu is opt-in" in x and "measured no faster" in x for x in why), why
    res = fuse(glu_model("erf"), ("vertical",), rules=("gelu", "swiglu"))  # geglu not named: the GELU alone
    assert res.plan.rule_counts() == {"gelu": 1} and any("geglu is opt-in" in x.reason for x in res.plan.refusals)


@pytest.mark.parametrize("name, rule", [("llama.dynamo", "swiglu"), ("llama.ts-fold", "swiglu"),
                                        ("t5_encoder.dynamo", "geglu"), ("t5_encoder.ts-nofold", "geglu")])
def test_corpus_gated_mlps(name, rule):
    """Every layer's MLP (2 layers) of the corpus LLaMA and T5 encoder, by both exporters."""
    if not (CORPUS / f"{name}.onnx").exists():
        pytest.skip("no corpus")
    res = check(str(CORPUS / f"{name}.onnx"), DEFAULT_RULES + (rule,), lower="functions")
    assert res.plan.rule_counts()[rule] == 2
