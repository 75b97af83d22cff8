"""The roofline cost model on hand-made graphs whose costs can be worked out on paper."""

import numpy as np
import pytest
from onnx import helper

from fusionlab import cost
from fusionlab.build import make_model, tensor, value_info
from fusionlab.cost.devices import Device
from fusionlab.graph import load
from fusionlab.plan import FusionGroup, FusionPlan

# a device with round numbers: 1 TFLOP/s, 100 GB/s, 1 us per launch, a 4 KiB on-chip buffer
DEV = Device(name="toy", chip="toy", peak_fp16_tflops=1.0, peak_int8_tops=None, peak_fp32_tflops=1.0,
             mem_bandwidth_gbs=100.0, ub_kb=4, l1_kb=0, ai_cores=1, power_w=None, launch_overhead_us=1.0,
             source="test", uncertain=[], precision="fp32")


def chain(n=1000, ops=("Relu", "Neg", "Exp")):
    """x -> op0 -> t0 -> op1 -> t1 ... -> y, all float32[n]."""
    nodes = []
    for i, op in enumerate(ops):
        nodes.append(helper.make_node(op, ["x" if i == 0 else f"t{i - 1}"], ["y" if i == len(ops) - 1 else f"t{i}"],
                                      name=f"n{i}"))
    return load(make_model(nodes, [value_info("x", np.float32, [n])], [value_info("y", np.float32, [n])]))


def group(names, ops, gid="g0"):
    return FusionPlan([FusionGroup(gid, "vertical", "test", list(names), list(ops))])


def test_big_matmul_is_compute_bound_and_add_is_memory_bound():
    n = 2048
    nodes = [helper.make_node("MatMul", ["a", "b"], ["c"], name="mm"), helper.make_node("Add", ["c", "a"], ["y"], name="add")]
    g = load(make_model(nodes, [value_info("a", np.float32, [n, n]), value_info("b", np.float32, [n, n])],
                        [value_info("y", np.float32, [n, n])]))
    costs = {c.name: c for c in cost.node_costs(g)}
    assert costs["mm"].flops == 2 * n**3
    assert costs["add"].flops == n * n
    assert costs["mm"].bytes_in == 2 * n * n * 4 and costs["mm"].bytes_out == n * n * 4
    pc = cost.plan_cost(g, None, DEV)
    mm, add = pc.kernels_detail
    assert mm.bound == "compute" and add.bound == "memory"
    assert mm.time_s == pytest.approx(2 * n**3 / 1e12 + 1e-6)
    assert add.time_s == pytest.approx(3 * n * n * 4 / 100e9 + 1e-6)


def test_conv_flops_and_weights():
    w = np.ones((4, 3, 3, 3), np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])
    g = load(make_model([node], [value_info("x", np.float32, [1, 3, 8, 8])], [value_info("y", np.float32, [1, 4, 8, 8])],
                        [tensor("w", w)]))
    (c,) = cost.node_costs(g)
    assert c.flops == 2 * (4 * 8 * 8) * 27
    assert (c.bytes_in, c.weight_bytes, c.bytes_out) == (3 * 64 * 4, w.nbytes, 4 * 64 * 4)
    (c16,) = cost.node_costs(g, precision="fp16")
    assert c16.bytes_in == 3 * 64 * 2


def test_empty_plan_is_the_sum_of_nodes_on_their_own():
    g = chain(5000, ("Relu", "Sigmoid", "Neg", "Exp"))
    pc = cost.plan_cost(g, FusionPlan(), DEV)
    expected = sum(max(c.flops / 1e12, c.bytes / 100e9) + 1e-6 for c in cost.node_costs(g))
    assert pc.kernels == 4
    assert pc.latency_s == pytest.approx(expected)
    assert pc.bytes_moved == 4 * 2 * 5000 * 4


def test_fused_group_removes_intermediate_traffic_and_launches():
    g = chain(1000)
    base = cost.plan_cost(g, None, DEV, buffer_kb=1024)
    fused = cost.plan_cost(g, group(["n0", "n1", "n2"], ["Relu", "Neg", "Exp"]), DEV, buffer_kb=1024)
    assert base.bytes_moved == 6 * 4000 and fused.bytes_moved == 2 * 4000
    assert (base.kernels, fused.kernels) == (3, 1)
    assert fused.latency_s < base.latency_s
    (k,) = fused.kernels_detail
    assert k.unfused_bytes == 6 * 4000 and k.spill_bytes == 0 and k.working_set == 8000


def test_peak_memory_from_liveness_exact_bytes():
    g = chain(1000)  # every tensor is 4000 bytes
    # unfused: at each step one input and one output are live (x dies after n0, t0 after n1, ...)
    assert cost.plan_cost(g, None, DEV).peak_memory_bytes == 8000
    # fused, intermediates on chip: only x and y exist in memory
    fused = group(["n0", "n1", "n2"], ["Relu", "Neg", "Exp"])
    assert cost.plan_cost(g, fused, DEV, buffer_kb=1024).peak_memory_bytes == 8000
    # a graph output produced early stays live to the end: t0 also an output raises the peak
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r"), helper.make_node("Neg", ["a"], ["b"], name="n"),
             helper.make_node("Exp", ["b"], ["y"], name="e")]
    g2 = load(make_model(nodes, [value_info("x", np.float32, [1000])],
                         [value_info("y", np.float32, [1000]), value_info("a", np.float32, [1000])]))
    # step r: x,a = 8000; step n: a,b = 8000; step e: a,b,y = 12000
    assert cost.plan_cost(g2, None, DEV).peak_memory_bytes == 12000


def test_spill_when_the_working_set_exceeds_the_buffer():
    g = chain(1000)
    fused = group(["n0", "n1", "n2"], ["Relu", "Neg", "Exp"])
    # while n1 runs, t0 and t1 are both live inside the group: working set 8000 bytes
    small = cost.plan_cost(g, fused, DEV, buffer_kb=5)  # 5120 bytes of buffer: 2880 spill
    (k,) = small.kernels_detail
    assert k.working_set == 8000
    assert k.spill_bytes == 2 * (8000 - 5120)
    assert small.bytes_moved == 8000 + 2 * 2880
    # the spilled part needs a workspace in device memory while the kernel runs
    assert small.peak_memory_bytes == 8000 + 2880
    none = cost.plan_cost(g, fused, DEV, buffer_kb=0)
    assert none.bytes_moved == 8000 + 16000 and none.peak_memory_bytes == 16000
    # spilling everything costs as much traffic as not fusing, but still saves two launches
    assert none.bytes_moved > cost.plan_cost(g, None, DEV).bytes_moved - 1


def test_weights_count_once_and_plans_must_match_the_model():
    g = chain(100)
    with pytest.raises(ValueError, match="not in the model"):
        cost.plan_cost(g, group(["n0", "nope"], ["Relu", "Neg"]), DEV)
    # a group of n0 and n2 without n1 would need n1 both before and after it
    with pytest.raises(ValueError, match="cycle"):
        cost.plan_cost(g, group(["n0", "n2"], ["Relu", "Exp"]), DEV)


def test_compare_rows_and_speedup_baseline():
    g = chain(100_000)
    table = cost.compare(g, {"none": None, "all": group(["n0", "n1", "n2"], ["Relu", "Neg", "Exp"])}, [DEV])
    assert [r["plan"] for r in table.rows] == ["none", "all"]
    assert table.rows[0]["speedup"] == 1.0 and table.rows[1]["speedup"] > 1
    text = table.table()
    assert "toy" in text and "speedup" in text


def test_shapes_onnx_cannot_infer_are_taken_from_a_run():
    # Slice with ends computed from Shape: onnx inference leaves the output shape unknown
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Slice", ["w", "zero", "s"], ["ws"], name="slice"),
             helper.make_node("Add", ["x", "ws"], ["y"], name="add")]
    g = load(make_model(nodes, [value_info("x", np.float32, ["n"])], [value_info("y", np.float32, ["n"])],
                        [tensor("w", np.ones(64, np.float32)), tensor("zero", np.array([0], np.int64))]))
    costs = {c.name: c for c in cost.node_costs(g, dims={"n": 16})}
    assert costs["add"].known and costs["add"].bytes_out == 16 * 4
