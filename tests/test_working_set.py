"""fusionlab.analysis.working_set: the tile model the mixed pass and the cost model share."""

import numpy as np
import pytest
from onnx import helper

from fusionlab import cost, zoo
from fusionlab.analysis import working_set as ws
from fusionlab.build import make_model, tensor, value_info
from fusionlab.graph import load
from fusionlab.passes import mixed

K = 1024


def test_bytes_at_counts_double_buffered_transfers_and_live_intermediates():
    members = [ws.Member(reads=(("x", 64 * K),), keeps=(("t0", 64 * K, 1),)),
               ws.Member(keeps=(("t1", 8 * K, 2),)),
               ws.Member(reads=(("bias", 100),), writes=(("y", 64 * K),))]
    w = ws.working_set(members)
    # x and y: 2 tiles each; bias: 2 x its 100 bytes; t0 and t1 both live at step 1
    assert w.bytes_at(16 * K) == 2 * 16 * K + 2 * 16 * K + 2 * 100 + 16 * K + 8 * K
    assert w.bytes_at(4 * K) == 2 * 4 * K + 2 * 4 * K + 2 * 100 + 4 * K + 4 * K


def test_cube_inputs_travel_through_l1_and_take_no_ub_tile():
    w = ws.working_set([ws.Member(cube=True, reads=(("x", 1 << 20), ("w", 1 << 20)), keeps=(("c", 1 << 20, 1),)),
                        ws.Member(reads=(("x", 1 << 20),), writes=(("y", 1 << 20),))])
    assert [b.role for b in w.transfers()] == ["l1", "l1", "in", "out"]  # x twice: L1 for the cube, UB for the Add
    assert w.bytes_at(16 * K) == 2 * 16 * K + 2 * 16 * K + 16 * K


def test_fit_tile_is_the_largest_block_multiple_that_fits():
    w = ws.working_set([ws.Member(reads=((f"x{i}", 1 << 20) for i in range(3)), writes=(("y", 1 << 20),))])
    assert w.fit_tile(256 * K) == 32 * K  # 8 tiles
    t = w.fit_tile(100 * K)
    assert t % ws.BLOCK_BYTES == 0 and w.bytes_at(t) <= 100 * K < w.bytes_at(t + ws.BLOCK_BYTES)
    assert w.fit_tile(8 * 32 - 1) is None  # not even one block per buffer
    small = ws.working_set([ws.Member(reads=(("x", 100),), writes=(("y", 100),))])
    assert small.fit_tile(256 * K) == 100  # whole tensors fit


def test_transfer_efficiency_is_full_from_16_kib_and_falls_below():
    assert ws.transfer_efficiency(16 * K) == 1.0 and ws.transfer_efficiency(1 << 20) == 1.0
    raw = lambda s: s / (s + ws.TRANSFER_OVERHEAD_BYTES)  # noqa: E731
    assert raw(16 * K) == pytest.approx(0.9, abs=1e-3)  # the modelled overhead: 16 KiB reaches 90 % of streaming
    assert ws.transfer_efficiency(4 * K) == pytest.approx(raw(4 * K) / raw(16 * K))
    effs = [ws.transfer_efficiency(s) for s in (512, 2 * K, 8 * K, 16 * K)]
    assert effs == sorted(effs) and effs[0] < 0.5


def _diamond():
    h = helper.make_node
    n = 1 << 14
    nodes = [h("Relu", ["x"], ["r"], name="relu"), h("Sigmoid", ["r"], ["s"], name="sig"),
             h("Mul", ["r", "s"], ["m"], name="mul"), h("Add", ["m", "b"], ["y"], name="add")]
    return load(make_model(nodes, [value_info("x", np.float32, [4, n])], [value_info("y", np.float32, [4, n])],
                           [tensor("b", np.ones(n, np.float32))]))


@pytest.mark.parametrize("model", ["diamond", "yolo"])
def test_the_mixed_pass_and_the_cost_model_compute_the_same_working_set(model):
    g = _diamond() if model == "diamond" else load(zoo.get("yolov5s", image_size=160, width_mult=0.25, depth_mult=0.33))
    plan = mixed.plan(g, max_group_ops=5)
    assert len(plan)
    kernels = {k.id: k for k in cost.plan_cost(g, plan, "Atlas 300I Pro", precision="fp32").kernels_detail}
    for grp in plan:
        assert kernels[grp.id].working_set == round(mixed.working_set(g, grp.nodes) * 1024), grp.nodes
        assert grp.extra["working_set_kb"] == round(kernels[grp.id].working_set / 1024, 1)


def test_account_adds_up_to_bytes_at_and_names_the_live_intermediates():
    members = [ws.Member(reads=(("x", 64 * K),), keeps=(("t0", 8 * K, 1),), op="Relu"),
               ws.Member(keeps=(("t1", 64 * K, 3),), op="Sigmoid"),
               ws.Member(keeps=(("t2", 64 * K, 3),), op="Tanh"),
               ws.Member(reads=(("b", 100),), writes=(("y", 64 * K),), op="Add")]
    w = ws.working_set(members)
    for tile in (16 * K, 4 * K, 64 * K):
        assert sum(n for _, _, n in w.account(tile)) == w.bytes_at(tile)
    assert w.peak_step(16 * K) == 2  # t1 and t2 live together (t0, smaller, dies at step 1)
    live = [b.key for b, _, _ in w.account(16 * K) if b.role == "mid"]
    assert live == ["t1", "t2"]
    text = w.describe(16 * K)
    assert text.startswith("6 tiles of 16 KiB = 96 KiB")  # x, y: two each; t1, t2: one each and "Sigmoid and Tanh" in text and "while the Tanh runs" in text


def test_the_yolo_five_op_group_holds_seven_tiles_of_the_bn_sigmoid_and_mul_outputs():
    # the account notebooks 06 and 07 print: the Conv's output is dead once the BN has read it
    g = load(zoo.get("yolov5s", image_size=160, width_mult=0.25, depth_mult=0.33))
    plan = mixed.plan(g, max_group_ops=5)
    grp = next(p for p in plan if p.size == 5)
    w = mixed.working_set_detail(g, grp.nodes)
    assert w.bytes_at(16 * K) == round(mixed.working_set(g, grp.nodes) * 1024)
    rows = w.account(16 * K)
    assert sorted(b.op for b, _, _ in rows if b.role == "mid") == ["BatchNormalization", "Mul", "Sigmoid"]
    assert sum(c for b, c, _ in rows if b.bytes >= 16 * K) == 7
