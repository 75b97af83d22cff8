"""The roofline cost model on hand-made graphs whose costs can be worked out on paper."""

import numpy as np
import pytest
from onnx import helper

from fusionlab import cost
from fusionlab.build import make_model, tensor, value_info
from fusionlab.cost.devices import Device
from fusionlab.graph import load
from fusionlab.plan import FusionGroup, FusionPlan

# a device with round numbers: 1 TFLOP/s, 100 GB/s, 1 us per launch, a 256 KiB Unified Buffer
DEV = Device(name="toy", chip="toy", peak_fp16_tflops=1.0, peak_int8_tops=None, peak_fp32_tflops=1.0,
             mem_bandwidth_gbs=100.0, ub_kb=256, l1_kb=0, ai_cores=1, power_w=None, launch_overhead_us=1.0,
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
    g = chain(5000)  # 20 000-byte tensors: larger than the efficient 16 KiB transfer
    base = cost.plan_cost(g, None, DEV)
    fused = cost.plan_cost(g, group(["n0", "n1", "n2"], ["Relu", "Neg", "Exp"]), DEV)
    assert base.bytes_moved == 6 * 20000 and fused.bytes_moved == 2 * 20000
    assert (base.kernels, fused.kernels) == (3, 1)
    assert fused.latency_s < base.latency_s
    (k,) = fused.kernels_detail
    # UB at 16 KiB tiles: x and y double-buffered, t0 and t1 both live while n1 runs
    assert k.unfused_bytes == 6 * 20000 and k.spill_bytes == 0 and k.working_set == 6 * 16384
    assert k.transfer_factor == 1.0 and k.memory_s == pytest.approx(2 * 20000 / 100e9)


def test_a_fused_elementwise_group_moves_exactly_its_reads_and_writes():
    """The issue-12 check: no spill, no working-set charge; traffic = external reads + writes, exactly."""
    n = 1 << 16
    h = helper.make_node
    nodes = [h("Add", ["x", "bias"], ["a"], name="add"), h("Sigmoid", ["a"], ["s"], name="sig"),
             h("Mul", ["a", "s"], ["m"], name="mul"), h("Mul", ["m", "x"], ["y"], name="gate")]
    g = load(make_model(nodes, [value_info("x", np.float32, [4, n])], [value_info("y", np.float32, [4, n])],
                        [tensor("bias", np.ones(n, np.float32))]))
    fused = cost.plan_cost(g, group(["add", "sig", "mul", "gate"], ["Add", "Sigmoid", "Mul", "Mul"]), DEV)
    (k,) = fused.kernels_detail
    x, bias, y = 4 * n * 4, n * 4, 4 * n * 4  # x is read by two members, once from memory
    assert k.bytes == x + bias + y and k.spill_bytes == 0
    for dev in ("Atlas 300I Pro", "Atlas 800I A2"):  # at fp16, on the presets: the same count in 2-byte values
        (k16,) = cost.plan_cost(g, group(["add", "sig", "mul", "gate"], ["Add", "Sigmoid", "Mul", "Mul"]), dev).kernels_detail
        assert k16.bytes == (x + bias + y) // 2 and k16.spill_bytes == 0


def test_a_tensor_the_cube_and_the_vector_unit_both_read_travels_twice():
    n = 256
    h = helper.make_node
    nodes = [h("MatMul", ["a", "b"], ["c"], name="mm"), h("Add", ["c", "a"], ["d"], name="add"),
             h("Relu", ["d"], ["y"], name="relu")]
    g = load(make_model(nodes, [value_info("a", np.float32, [n, n]), value_info("b", np.float32, [n, n])],
                        [value_info("y", np.float32, [n, n])]))
    fused = cost.plan_cost(g, group(["mm", "add", "relu"], ["MatMul", "Add", "Relu"]), DEV)
    t = n * n * 4
    assert fused.bytes_moved == t + t + t + t  # a and b to the cube through L1, a again to the UB, y out
    assert cost.plan_cost(g, None, DEV).bytes_moved == 3 * t + 3 * t + 2 * t


def test_a_group_that_holds_many_tensors_gets_smaller_tiles_and_slower_transfers():
    n = 1 << 15  # 128 KiB fp32 tensors
    h = helper.make_node
    names = [f"x{i}" for i in range(6)]
    nodes = [h("Add", [names[0], names[1]], ["s1"], name="a1")]
    for i in range(2, 6):
        nodes.append(h("Add", [f"s{i - 1}", names[i]], [f"s{i}" if i < 5 else "y"], name=f"a{i}"))
    g = load(make_model(nodes, [value_info(x, np.float32, [n]) for x in names], [value_info("y", np.float32, [n])]))
    plan = group([f"a{i}" for i in range(1, 6)], ["Add"] * 5)
    roomy = cost.plan_cost(g, plan, DEV).kernels_detail[0]
    tight = cost.plan_cost(g, plan, DEV, buffer_kb=64).kernels_detail[0]
    # 6 inputs and 1 output double-buffered, and while a member runs its input and output intermediates: 16 tiles
    assert roomy.working_set == 16 * 16384 and roomy.tile == 16 * 1024  # 256 KiB / 16: just the efficient size
    assert roomy.transfer_factor == 1.0
    assert tight.tile == 4096 and tight.transfer_factor > 1.0  # 64 KiB / 16
    assert tight.bytes == roomy.bytes == 7 * n * 4  # the same traffic, moved in smaller, less efficient transfers
    assert tight.memory_s == pytest.approx(tight.bytes * tight.transfer_factor / 100e9)
    assert tight.spill_bytes == 0
    # only when not even one 32-byte block per buffer fits does anything spill to device memory
    (spilled,) = cost.plan_cost(g, plan, DEV, buffer_kb=0.25).kernels_detail
    assert spilled.spill_bytes == 2 * 4 * n * 4 and spilled.bytes == 7 * n * 4 + 2 * 4 * n * 4  # s1..s4 out and back


def test_the_emitted_lowering_counts_its_kernels_and_what_it_still_writes():
    g = chain(5000, ("Relu", "Neg", "Exp"))
    two = FusionPlan([FusionGroup("g0", "vertical", "test", ["n0", "n1", "n2"], ["Relu", "Neg", "Exp"], kernels=2)])
    pc = cost.plan_cost(g, two, DEV)
    (k,) = pc.kernels_detail
    assert pc.kernels == 2 and k.launches == 2 and k.launch_s == pytest.approx(2e-6)
    assert k.bytes == 2 * 20000 + 2 * 20000  # x in, y out, and one output-sized intermediate written and read back


def test_a_recomputed_node_runs_in_every_group_that_recomputes_it():
    n = 5000
    h = helper.make_node
    nodes = [h("Neg", ["x"], ["t"], name="neg"), h("Exp", ["t"], ["e"], name="exp"), h("Abs", ["t"], ["b"], name="abs"),
             h("Sigmoid", ["e"], ["y1"], name="s1"), h("Relu", ["b"], ["y2"], name="s2")]
    g = load(make_model(nodes, [value_info("x", np.float32, [n])],
                        [value_info("y1", np.float32, [n]), value_info("y2", np.float32, [n])]))
    plan = FusionPlan([FusionGroup("g0", "mixed", "t", ["neg", "exp", "s1"], ["Neg", "Exp", "Sigmoid"], recompute=["neg"]),
                       FusionGroup("g1", "mixed", "t", ["neg", "abs", "s2"], ["Neg", "Abs", "Relu"], recompute=["neg"])])
    pc = cost.plan_cost(g, plan, DEV)
    assert [k.id for k in pc.kernels_detail] == ["g0", "g1"] and pc.kernels == 2
    assert [k.recomputed for k in pc.kernels_detail] == [1, 1]
    t = n * 4
    assert [k.bytes for k in pc.kernels_detail] == [2 * t, 2 * t]  # each reads x, writes its output; t never written
    neg = {c.name: c for c in cost.node_costs(g)}["neg"].flops
    assert pc.flops == sum(c.flops for c in cost.node_costs(g)) + neg  # Neg computed twice
    # x stays live until the second group has read it
    assert pc.peak_memory_bytes == 3 * t
    # a consumer outside the recomputing groups still needs the node's own kernel
    part = FusionPlan([plan[0]])
    ids = [k.id for k in cost.plan_cost(g, part, DEV).kernels_detail]
    assert "neg" in ids and "g0" in ids


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


def test_as_launched_drops_function_groups_and_one_kernel_per_group_merges_lowerings():
    g = chain(5000)
    plan = FusionPlan([FusionGroup("v0", "vertical", "t", ["n0", "n1"], ["Relu", "Neg"], kernels=2, saved_launches=0),
                       FusionGroup("m0", "mixed", "fuse_ops", ["n2"], ["Exp"], lowered_to="function")])
    launched = cost.as_launched(plan)
    assert [grp.id for grp in launched] == ["v0"]  # onnxruntime inlines the function: m0 runs unfused
    assert cost.plan_cost(g, launched, DEV).kernels == 3
    one = cost.one_kernel_per_group(plan)
    assert [grp.kernels for grp in one] == [1, 1] and plan[0].kernels == 2  # a copy; the plan is unchanged
    assert cost.plan_cost(g, one, DEV).kernels == 2
    # a plan from `fuse` carries what its lowering left (`runs`): one kernel per group means one, whatever that was
    plan[0].runs = 2
    assert cost.plan_cost(g, cost.one_kernel_per_group(plan), DEV).kernels == 2


def test_as_launched_gives_back_the_kernels_a_dropped_function_took():
    """A mixed group over a vertically fused node took that group's kernels (`runs` 0). onnxruntime inlines the
    function, so the fused node runs after all: as_launched must count it (it once kept runs 0, and a YOLO plan of
    vertical + mixed launched 28 kernels where vertical alone launches 142)."""
    g = chain(5000)
    v = FusionGroup("v0", "vertical", "t", ["n0", "n1"], ["Relu", "Neg"], kernels=1, saved_launches=1,
                    covers=["n0", "n1"])
    v.runs = 0
    m = FusionGroup("m0", "mixed", "fuse_ops", ["n0_fused", "n2"], ["Fused", "Exp"], lowered_to="function",
                    covers=["n0", "n1", "n2"])
    launched = cost.as_launched(FusionPlan([v, m]))
    assert [grp.id for grp in launched] == ["v0"] and launched[0].runs is None
    assert cost.plan_cost(g, launched, DEV).kernels == cost.plan_cost(g, FusionPlan([v.__class__.from_dict(
        {**v.to_dict(), "runs": None})]), DEV).kernels == 2  # n0+n1 as one kernel, and n2


def _group_read_through_a_shape_chain():
    """x -> Transpose -> Relu -> Reshape -> Sigmoid, the Reshape's target made from Shape(Transpose) by
    Gather/Unsqueeze/Concat: the exporters' pattern for a head split (every BERT/GPT-2/ViT attention)."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], name="tr", perm=[1, 0]),
             helper.make_node("Shape", ["t"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "zero"], ["s0"], name="gather", axis=0),
             helper.make_node("Unsqueeze", ["s0", "ax"], ["s0u"], name="unsqueeze"),
             helper.make_node("Concat", ["s0u", "minus1"], ["target"], name="concat", axis=0),
             helper.make_node("Relu", ["t"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "target"], ["y0"], name="reshape"),
             helper.make_node("Sigmoid", ["y0"], ["y"], name="sigmoid")]
    inits = [tensor("zero", np.array(0, np.int64)), tensor("ax", np.array([0], np.int64)),
             tensor("minus1", np.array([-1], np.int64))]
    return load(make_model(nodes, [value_info("x", np.float32, [4, 64])], [value_info("y", np.float32, None)], inits))


def test_a_prepared_plan_is_costed_on_the_graph_it_names():
    # Regression (issue 23): `fusionlab explain` exited 3 on 12 of the 27 corpus exports with "plan groups
    # [...] form a cycle". The planner works on the prepared copy, where constant folding turned the Shape
    # chain into a constant, so the group {tr, relu, reshape, sigmoid} is contiguous there; laid over the
    # loaded model, the chain leaves the group at `tr` and comes back at `reshape`: a cycle. The cost model
    # now lays a plan over the graph it names (passes.prepare.graph_of).
    from fusionlab.cost import schedule
    from fusionlab.passes import plan as make_plan
    from fusionlab.passes.prepare import graph_of

    g = _group_read_through_a_shape_chain()
    fplan = make_plan(g, ("mixed",))
    assert [grp.covers for grp in fplan] == [["tr", "relu", "reshape", "sigmoid"]]
    with pytest.raises(ValueError, match="cycle"):  # the cause: the loaded model is not the graph the plan names
        schedule.kernels_of(g.topological_order(), fplan)
    prepared = graph_of(g, fplan)
    assert prepared is not g and "shape" not in {n.name for n in prepared} and len(g) == 8  # g itself untouched
    table = cost.compare(g, {"unfused": None, "fused": fplan}, [DEV])
    unfused, fused = table.rows
    assert fused["kernels"] == 1 and unfused["kernels"] > 1
    a = cost.Analysis(g, None, "fp32")
    assert a.for_plan(fplan) is a.for_plan(fplan) and a.for_plan(fplan).graph is not g and a.for_plan(None) is a
    # a plan made without preparation names the loaded model's nodes: costed on the model itself
    assert graph_of(g, make_plan(g, ("mixed",), prepare=False)) is g
