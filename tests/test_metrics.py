"""The seed's evaluation figures: measured from a profile, modelled from the cost model, and the roofline."""

import math

import numpy as np
import pytest
from onnx import helper

from fusionlab import cost
from fusionlab import profile as P
from fusionlab.build import make_model, tensor, value_info
from fusionlab.cost import devices
from fusionlab.cost import metrics as M
from fusionlab.graph import load


def _model():
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "c"], ["y"], name="add")]
    return make_model(nodes, [value_info("x", shape=[1, 8, 16, 16])], [value_info("y", shape=[1, 8, 16, 16])],
                      [tensor("w", rng.standard_normal((8, 8, 3, 3)).astype(np.float32))])


def _cpu(gflops=50.0, gbs=10.0):
    return devices.Device(name="test cpu", chip="cpu", peak_fp16_tflops=gflops / 1e3, peak_int8_tops=None,
                          peak_fp32_tflops=gflops / 1e3, mem_bandwidth_gbs=gbs, ub_kb=1024, l1_kb=32, ai_cores=1,
                          power_w=None, launch_overhead_us=1.0, source="test", precision="fp32")


@pytest.fixture(scope="module")
def measured():
    graph = load(_model())
    prof = P.profile_model(graph, runs=3, warmup=1)
    return graph, prof, cost.node_costs(graph)


def test_cost_table_accepts_the_cost_model_and_plain_data(measured):
    _, _, costs = measured
    table = M.cost_table(costs)
    assert set(table) == {"conv", "relu", "add"}
    conv = next(c for c in costs if c.name == "conv")
    assert table["conv"] == (conv.flops, conv.bytes)
    assert M.cost_table({"a": (2, 4)}) == {"a": (2.0, 4.0)}
    assert M.cost_table({"a": {"flops": 2, "bytes": 4}}) == {"a": (2.0, 4.0)}


def test_measured_utilisation_is_work_over_time_over_peak(measured):
    _, prof, costs = measured
    dev = _cpu()
    u = M.utilisation(prof, costs, dev)
    flops = sum(c.flops for c in costs)
    nbytes = sum(c.bytes for c in costs)
    assert u.measured and u.flops == flops and u.bytes == nbytes
    assert u.compute_util == pytest.approx(flops / (prof.run_us * 1e-6) / 50e9)
    assert u.bandwidth_util == pytest.approx(nbytes / (prof.run_us * 1e-6) / 10e9)
    assert u.tops_per_watt is None  # power unknown: no figure invented
    assert M.meets_targets(u)["tops_per_watt"] is None
    k = M.utilisation(prof, costs, dev, time="kernel")
    assert k.compute_util >= u.compute_util  # kernels-only time is never longer than the run
    assert {p.node for p in u.points} == {"conv", "relu", "add"}
    conv = next(p for p in u.points if p.node == "conv")
    assert conv.intensity == pytest.approx(conv.flops / conv.bytes)


def test_with_cores_scales_only_compute():
    dev = M.with_cores(_cpu(), 2)
    assert dev.peak_flops("float32") == pytest.approx(100e9) and dev.bandwidth == pytest.approx(10e9)
    with pytest.raises(ValueError):
        M.with_cores(_cpu(), 0)


@pytest.mark.parametrize("name", sorted(devices.load_devices()))
def test_modelled_figures_match_the_cost_model_and_stay_under_the_roof(name):
    dev = devices.get(name)
    graph = load(_model())
    u = M.modelled(graph, dev)
    pc = cost.plan_cost(graph, None, dev)
    assert not u.measured
    assert u.time_s == pytest.approx(pc.latency_s)
    assert 0 < u.compute_util <= 1 and 0 < u.bandwidth_util <= 1
    assert u.tops_per_watt == pytest.approx(u.flops_per_s / 1e12 / dev.power_w)


def test_seed_efficiency_target_is_above_what_the_300i_duo_can_reach():
    duo = devices.get("Atlas 300I Duo")
    best = M.peak_efficiency(duo, "int8")
    assert best == pytest.approx(duo.peak_int8_tops / duo.power_w)
    # even at peak INT8 throughput and rated power the card stays below the seed's "> 4 TOPS/W"
    assert best < M.TARGETS["tops_per_watt"]
    assert M.peak_efficiency(_cpu()) is None


def test_meets_targets():
    u = M.Utilisation("d", False, flops=70.0, bytes=10.0, time_s=1.0, peak_flops=100.0, peak_bandwidth=100.0,
                      power_w=10.0)
    assert M.meets_targets(u) == {"compute_util": True, "bandwidth_util": True, "tops_per_watt": False}
    u.bytes = 90.0
    assert M.meets_targets(u)["bandwidth_util"] is False
    assert "seed's targets" in M.table([u])


def test_roofline_draws_the_targets(measured):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, prof, costs = measured
    dev = devices.get("Atlas 300I Duo")
    fig = M.draw_roofline(dev, [M.modelled(load(_model()), dev)])
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("65%" in l for l in labels) and any("80%" in l for l in labels) and any("TOPS/W" in l for l in labels)
    plt.close(fig)
    fig = M.draw_roofline(_cpu(), [M.utilisation(prof, costs, _cpu())])
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert not any("TOPS/W" in l for l in labels)  # no power figure, no efficiency line
    plt.close(fig)


def test_utilisation_from_a_time_per_run(measured):
    _, _, costs = measured
    u = M.utilisation(0.002, costs, _cpu())
    assert u.time_s == 0.002 and u.points == []
    assert u.compute_util == pytest.approx(sum(c.flops for c in costs) / 0.002 / 50e9)
    with pytest.raises(ValueError):
        M.utilisation(0.0, costs, _cpu())


def test_with_peak_and_the_onnxruntime_roof():
    roof = M.ort_matmul_gflops(64, threads=1, min_time=0.01)
    assert roof > 0 and math.isfinite(roof)
    dev = M.with_peak(_cpu(), roof, "roof")
    assert dev.name == "roof" and dev.peak_flops("float32") == pytest.approx(roof * 1e9)
    with pytest.raises(ValueError):
        M.with_peak(_cpu(), 0)
