"""The vertical pass (passes/vertical.py): its options, plans and stale groups, and whole zoo models fused and
verified. Each rule family's own tests are in tests/test_rules_<family>.py."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper as h

from fusionlab import load, verify
from fusionlab.passes import fuse
from fusionlab.passes import vertical
from fusionlab.passes.vertical import RULE_NAMES
from fusionlab.plan import FusionPlan

from chainkit import bn_node, bn_params, check, conv_model


# ---------------------------------------------------------------------------------------------------
# the pass protocol and options
# ---------------------------------------------------------------------------------------------------

def test_rules_subset_and_bad_options():
    m = conv_model([bn_node("c", "n"), h.make_node("Relu", ["n"], ["y"], name="relu")], bn_params(8))
    check(m, {"Conv": 1, "Relu": 1}, rules=["conv_bn"])
    check(m, {"Conv": 1, "Relu": 1}, rules="conv_bn,gelu")
    with pytest.raises(ValueError, match="unknown vertical rule"):
        fuse(m, rules=["conv_bnn"])
    with pytest.raises(ValueError, match="unknown lowering"):
        fuse(m, lower="gpu")


def test_plan_is_pure_and_json_round_trips():
    m = conv_model([h.make_node("Identity", ["c"], ["i"], name="id"), bn_node("i", "y")], bn_params(8))
    g = load(m)
    before = g.op_counts()
    p = vertical.plan(g)
    assert g.op_counts() == before and len(p) == 1
    assert FusionPlan.from_json(p.to_json()) == p


def test_stale_plan_group_is_refused_by_name():
    """A plan group whose nodes no longer match is refused, naming the group (it was silently dropped before)."""
    from fusionlab.passes import StaleGroup

    m = conv_model([bn_node("c", "y")], bn_params(8))
    g = load(m)
    p = vertical.plan(g)
    p.groups[0].nodes = ["conv", "nonexistent"]
    with pytest.raises(StaleGroup, match="group v0 .*'nonexistent' is not in the model"):
        vertical.apply(g, p)
    assert g.op_counts() == {"BatchNormalization": 1, "Conv": 1}


def test_fuse_never_touches_the_input_model():
    m = conv_model([bn_node("c", "y")], bn_params(8))
    g = load(m)
    fuse(g)
    assert g.op_counts() == {"BatchNormalization": 1, "Conv": 1}


# ---------------------------------------------------------------------------------------------------
# real (zoo) models: fuse, verify, and the expected group counts derived from the original graph
# ---------------------------------------------------------------------------------------------------

zoo = pytest.importorskip("fusionlab.zoo")

ZOO_CASES = {
    "resnet_small": {},
    "yolov5s": {"image_size": 64, "width_mult": 0.125, "depth_mult": 0.33},
    "mobilenet_v2": {"image_size": 32, "width_mult": 0.25},
    "bert": {"layers": 2, "hidden": 64, "heads": 2, "intermediate": 128, "vocab": 100},
}


def _after_bn(graph, op):
    """How many BatchNormalization outputs feed straight (and only) into `op`."""
    count = 0
    for n in graph:
        if n.op_type == "BatchNormalization":
            users = graph.consumers(n.outputs[0])
            if op in ("Relu", "Clip") and len(users) == 1 and users[0].op_type == op:
                count += 1
            elif op == "SiLU" and sorted(u.op_type for u in users) == ["Mul", "Sigmoid"]:
                count += 1
    return count


@pytest.mark.parametrize("name", sorted(ZOO_CASES))
def test_zoo_models_fuse_and_verify(name):
    model = zoo.get(name, **ZOO_CASES[name])
    graph = load(model)
    res = fuse(graph)
    ref = __import__("fusionlab").run(model)
    scale = max(1.0, max(float(np.abs(v).max()) for v in ref.values() if v.dtype.kind == "f"))
    # Folding BN reassociates fp32 arithmetic in every conv; across a deep net the error grows with the
    # activation scale, not per element (onnxruntime's own BASIC-level folding shows the same ~1e-6 x scale),
    # so the absolute tolerance is taken relative to the largest output.
    report = verify(model, res.graph.to_proto(), atol=1e-5 * scale)
    assert report.ok, report.table()
    rules = res.plan.rule_counts()
    bn = graph.op_counts().get("BatchNormalization", 0)
    if name != "bert":
        assert res.after.get("BatchNormalization", 0) == 0
        assert rules.get("conv_bn", 0) + rules.get("conv_bn_act", 0) + rules.get("conv_add_act", 0) == bn
    if name == "resnet_small":
        # BN->Relu chains, plus BN->Add(residual)->Relu chains (FusedConv with its Z input)
        residual = graph.op_counts()["Add"]
        assert res.after.get("com.microsoft:FusedConv", 0) == _after_bn(graph, "Relu") + residual > residual
    if name == "mobilenet_v2":
        assert res.after.get("com.microsoft:FusedConv", 0) == _after_bn(graph, "Clip") > 0
    if name == "yolov5s":
        assert res.after.get("com.microsoft:QuickGelu", 0) == _after_bn(graph, "SiLU") == bn
        assert "Sigmoid" not in res.after
    if name == "bert":
        layers = ZOO_CASES["bert"]["layers"]
        assert rules["bias_gelu"] == layers and "Erf" not in res.after
        assert "skip_layernorm" not in rules  # opt-in (measured slower on CPU)
        assert rules["layernorm"] == graph.op_counts()["Sqrt"]  # every decomposed LayerNorm
        opted = fuse(graph, passes=("vertical",), rules=RULE_NAMES).plan.rule_counts()
        assert opted["skip_layernorm"] >= layers  # the FFN residual of every layer
        assert opted["skip_layernorm"] + opted.get("layernorm", 0) == graph.op_counts()["Sqrt"]


# ---------------------------------------------------------------------------------------------------
# tanh-GELU -> FastGelu: any arrangement of the polynomial, proved by multiplying it out
# ---------------------------------------------------------------------------------------------------


