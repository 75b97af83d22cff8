"""The explorer's plain functions (the widget is a thin layer over them)."""

import warnings

import matplotlib

matplotlib.use("Agg")

import pytest

from fusionlab import widgets, zoo
from fusionlab.graph import load


@pytest.fixture(scope="module")
def resnet():
    return load(zoo.get("resnet_small"))


def test_explore_state_plans_and_costs_on_every_device(resnet):
    res = widgets.explore_state(resnet, max_group_ops=5, kinds=("vertical", "mixed"), device="Atlas 300I Pro")
    assert len(res.plan) > 0
    assert {g.kind for g in res.plan} <= {"vertical", "mixed"}
    assert res.cost.kernels < res.baseline.kernels
    assert res.cost.latency_s < res.baseline.latency_s
    assert len(res.devices.rows) == 2 * 4
    assert "Atlas 300I Pro" in res.summary() and "kernels" in res.summary()
    nodes = [n for g in res.plan for n in g.nodes]
    assert len(nodes) == len(set(nodes))  # no node in two groups


def test_sweep_group_size_rows(resnet):
    rows = widgets.sweep_group_size(resnet, (1, 2, 4), "Atlas 800I A2")
    assert [r["max_group_ops"] for r in rows] == [1, 2, 4]
    assert rows[0]["groups"] == 0 and rows[0]["speedup"] == 1.0
    assert all(r["largest"] <= r["max_group_ops"] or r["groups"] == 0 for r in rows)
    assert rows[-1]["kernels"] <= rows[1]["kernels"] <= rows[0]["kernels"]
    fig = widgets.plot_sweep(rows)
    assert fig.axes and "\n" in widgets.sweep_table(rows)


def test_a_smaller_ub_slows_transfers_and_spills_nothing(resnet):
    big = widgets.sweep_group_size(resnet, (4,), "Atlas 300I Pro", dims={"batch": 8})
    tiny = widgets.sweep_group_size(resnet, (4,), "Atlas 300I Pro", dims={"batch": 8}, ub_kb=16)
    assert tiny[0]["DMA_x"] > big[0]["DMA_x"] >= 1.0  # small tensors move in small transfers anyway
    assert tiny[0]["MiB_moved"] == big[0]["MiB_moved"]  # the same bytes, in smaller transfers
    assert tiny[0]["latency_us"] > big[0]["latency_us"]
    assert big[0]["ub_KiB"] <= 256


def test_bad_kind_is_rejected(resnet):
    with pytest.raises(ValueError, match="unknown fusion kind"):
        widgets.make_plan(resnet, ("diagonal",))


def test_measure_and_widget_build():
    model = load(zoo.get("conv_bn_relu"))
    cmp = widgets.measure(model, ("vertical",), min_time=0.05)
    assert cmp.rounds >= 1 and cmp.a.median > 0 and cmp.b.median > 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        box = widgets.explore(model)
    assert box.children
