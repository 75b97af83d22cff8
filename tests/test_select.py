"""Selection by measurement: a group is kept only where its rewrite times faster than the ops it replaces."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper as h

from fusionlab import load, verify
from fusionlab.build import make_model, tensor, value_info
from fusionlab.passes import apply, fuse, plan
from fusionlab.passes.prepare import prepare
from fusionlab.passes.select import extract, select
from fusionlab.plan import FusionGroup, FusionPlan
from fusionlab.shapes import ShapeInfo

RNG = np.random.default_rng(2)


def _two_gelus():
    """Two identical MatMul + bias + Gelu blocks: one measurement serves both groups."""
    nodes, inits = [], []
    src = "x"
    for i in range(2):
        nodes += [h.make_node("MatMul", [src, f"W{i}"], [f"m{i}"], name=f"mm{i}"),
                  h.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
                  h.make_node("Gelu", [f"a{i}"], [f"g{i}"], name=f"gelu{i}")]
        inits += [tensor(f"W{i}", RNG.standard_normal((64, 64)).astype(np.float32) * 0.1),
                  tensor(f"b{i}", RNG.standard_normal(64).astype(np.float32))]
        src = f"g{i}"
    return make_model(nodes, [value_info("x", shape=["batch", 32, 64])], [value_info("g1", shape=["batch", 32, 64])],
                      inits, opset=20)


def test_extracted_group_is_a_model_of_its_own():
    g = load(_two_gelus())
    prepare(g)
    p = plan(g, ("vertical",), prepare=False)
    group = p[0]
    sub = extract(g, group, ShapeInfo(g, {"batch": 2}))
    assert [n.name for n in sub] == group.nodes
    assert [tuple(v.shape) for v in sub.graph.inputs] == [(2, 32, 64)]
    assert set(sub.graph.initializers) == {"b0"}


def test_select_measures_once_per_signature_and_records_the_ratio():
    g = load(_two_gelus())
    prepare(g)
    part = plan(g, ("vertical",), prepare=False)
    chosen, trials = select(g, part, min_time=0.05)
    assert len(trials) == 1 and trials[0].groups == [x.id for x in part]
    for grp in part:
        m = grp.extra["measured"]
        assert m["speedup"] == round(trials[0].speedup, 3) and m["level"] == "disable"
    kept = {x.id for x in chosen}
    assert kept == ({x.id for x in part} if trials[0].kept else set())
    if not trials[0].kept:
        assert all("measured slower" in r.reason or "no clear difference" in r.reason
                   for r in chosen.refusals if r.rule == "bias_gelu")


@pytest.mark.parametrize("ratio,lo,hi,words", [(0.98, 0.95, 1.02, "not measured faster here (no clear difference)"),
                                               (0.91, 0.88, 0.94, "measured slower here")])
def test_a_dropped_group_is_called_slower_only_when_its_interval_says_so(monkeypatch, ratio, lo, hi, words):
    """select keeps a group when the median of its paired ratios is above 1; a dropped group's reason follows the
    interval, as every verdict does (timing.ratio_verdict): a median of 0.98 inside the noise is not 'slower'."""
    from types import SimpleNamespace

    from fusionlab.passes import select as select_module
    monkeypatch.setattr(select_module, "_measure",
                        lambda *a, **k: SimpleNamespace(speedup=ratio, ci_low=lo, ci_high=hi))
    g = load(_two_gelus())
    prepare(g)
    chosen, trials = select(g, plan(g, ("vertical",), prepare=False), min_time=0.05)
    assert not len(chosen) and trials and not trials[0].kept
    assert chosen.refusals and all(r.reason.startswith(words + ":") for r in chosen.refusals if r.rule == "bias_gelu")


def test_fuse_select_measured_result_still_verifies():
    m = _two_gelus()
    res = fuse(m, ("vertical",), select="measured")
    assert res.plan.options["select"] == {"by": "measured", "level": "disable"}
    assert any(n.startswith("select: bias_gelu") for n in res.plan.notes)
    assert verify(m, res.graph, dims={"batch": 2}).ok


def _bert_export():
    from pathlib import Path

    return load(Path(__file__).resolve().parent / "corpus" / "bert.dynamo.onnx")


def test_an_attention_group_of_a_real_export_is_measured_apart():
    """torch's dynamo export computes K's Reshape targets from Shape outside the group: the cut binds them
    to constants and gives every inner value the inputs' concrete shapes, so the rule re-proves its layouts."""
    g = _bert_export().copy()
    prepare(g)
    p = plan(g, passes=("vertical",))
    att = next(grp for grp in p if grp.rule == "attention")
    sub = extract(g, att, ShapeInfo.of(g))
    assert sub is not None and all(v.dtype.name == "FLOAT" for v in sub.graph.inputs)  # the int targets are constants
    one = FusionPlan([FusionGroup.from_dict(att.to_dict())])  # as select times it: no prepare on the cut
    fused = apply(sub, one, validate=False).graph  # re-checked on the cut: raises StaleGroup if not re-proved
    assert fused.op_counts().get("com.microsoft:MultiHeadAttention") == 1


def test_a_group_that_cannot_be_measured_apart_keeps_its_default(monkeypatch):
    from fusionlab.passes import select as sel
    from fusionlab.passes.engine import StaleGroup

    def stale(*args, **kwargs):
        raise StaleGroup("group v0: its nodes no longer form the pattern")

    monkeypatch.setattr(sel, "_measure", stale)
    g = load(_two_gelus())
    p = plan(g, passes=("vertical",))
    chosen, trials = select(g, p)
    assert len(chosen) == len(p) and trials == []
    assert any("cannot be measured apart from the model; kept" in n for n in chosen.notes)
