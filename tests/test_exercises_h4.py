"""The exercises of notebooks 07 (roofline, tiles) and 09 (moments): their truths are fusionlab's own functions,
their hidden cases hold the corners they name, and answers that are slightly off fail."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from fusionlab.analysis import working_set as ws_model
from fusionlab.cost import devices
from fusionlab.exercises import core, moments, roofline, tiles
from fusionlab.lessons import reductions
from fusionlab.passes import mixed

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # solutions/ sits at the repository root
from solutions import moments as s_moments  # noqa: E402
from solutions import roofline as s_roofline  # noqa: E402
from solutions import tiles as s_tiles  # noqa: E402


# -- roofline (07 §2) ------------------------------------------------------------------------------------------

def test_roofline_cases_are_the_bounds_they_name_and_move_their_bytes_at_full_bandwidth():
    bounds = []
    for case in roofline.CASES:
        flops, nbytes, device, k = roofline.truth(case.data)
        assert k.flops == flops and k.bytes == nbytes and k.launches == 1
        assert k.transfer_factor == 1.0  # so the roofline formula is the whole model for these nodes
        assert f"({k.bound}-bound" in case.name or (k.bound == "memory" and "ridge" in case.name), case.name
        bounds.append(k.bound)
    assert set(bounds) == {"memory", "compute", "launch"}
    assert len({roofline.truth(c.data)[2].name for c in roofline.CASES}) == 4


def test_roofline_ridge_case_has_compute_and_memory_time_within_a_percent():
    (ridge,) = [c for c in roofline.CASES if "ridge" in c.name]
    k = roofline.truth(ridge.data)[3]
    assert 0.99 < k.compute_s / k.memory_s < 1.0


def test_roofline_a_slightly_off_answer_fails_and_the_fp32_peak_differs_only_on_the_910b():
    v = roofline.check(lambda f, b, d: s_roofline.kernel_time(f, b, d) * (1 + 1e-5))
    assert v.status == core.FAIL and v.passed == 0
    a2 = devices.get("Atlas 800I A2")
    assert a2.peak_flops() != a2.peak_flops("float16")
    assert devices.get("Atlas 300I Pro").peak_flops() == devices.get("Atlas 300I Pro").peak_flops("float16")


def test_roofline_hint_names_units_left_unconverted():
    v = roofline.check(lambda f, b, d: max(f / d.peak_flops("float16"), b / d.bandwidth) + d.launch_overhead_us)
    assert v.status == core.FAIL and "µs added to seconds" in v.hint


# -- tiles (07 §3) ---------------------------------------------------------------------------------------------

def test_tiles_truth_is_the_mixed_pass_working_set_and_the_count_agrees():
    for case in tiles.CASES:
        g = case.data
        ms = tiles.members(g)
        assert tiles.truth(g) == tiles.count(ms, g.tile)
        if g.tile == 16 * 1024 and g.graph == "yolo":
            graph = tiles._graph("yolo")
            nodes = next(grp for grp in mixed.plan(graph, max_group_ops=5) if grp.size == 5).nodes
            assert tiles.truth(g) == round(mixed.working_set(graph, nodes) * 1024)


def test_tiles_cases_hold_the_corners_they_name():
    by_name = {c.name: tiles.members(c.data) for c in tiles.CASES}
    yolo = by_name[tiles.CASES[0].name]
    assert [m.op for m in yolo] == ["Conv", "BatchNormalization", "Sigmoid", "Mul", "Add"] and yolo[0].cube
    toy = next(ms for name, ms in by_name.items() if "MatMul" in name)
    assert toy[0].cube and "a" in {k for k, _ in toy[0].reads} and "a" in {k for k, _ in toy[1].reads}
    silu = next(ms for name, ms in by_name.items() if "SiLU" in name)
    assert [k for m in silu for k, _ in m.reads] == ["x", "x"]
    small = next(c for c in tiles.CASES if "smaller than a tile" in c.name)
    assert all(b < small.data.tile for m in tiles.members(small.data) for _, b in m.reads + m.writes)


def test_tiles_every_named_mistake_fails_somewhere():
    for kw in ({"peak": False}, {"cube_in_ub": True}, {"dedupe": False}, {"clip": False}, {"copies": 1}):
        v = tiles.check(lambda ms, t, kw=kw: tiles.count(ms, t, **kw))
        assert v.status == core.FAIL, kw
    v = tiles.check(lambda ms, t: s_tiles.ub_bytes(ms, t) + 32)
    assert v.status == core.FAIL and v.passed == 0


def test_tiles_reference_matches_the_model_on_every_group_of_yolo():
    graph = tiles._graph("yolo")
    for grp in mixed.plan(graph, max_group_ops=5):
        ms = mixed.working_set_members(graph, grp.nodes)
        assert s_tiles.ub_bytes(ms, 16 * 1024) == ws_model.working_set(ms).bytes_at(16 * 1024)


# -- moments (09 §5) -------------------------------------------------------------------------------------------

def test_moments_truth_agrees_with_the_lesson_welford_and_naive_float32_fails_at_1e4():
    (big,) = [c for c in moments.CASES if "two blocks of 256" in c.name]
    x = moments.rows(big.data)
    x64 = x.astype(np.float64)
    mean, var = reductions.welford(x, 64)
    assert np.allclose(var, x64.var(axis=1), rtol=moments.RTOL)
    _, naive = reductions.two_moment(x, 64)
    assert not np.allclose(naive, x64.var(axis=1), rtol=0.1)


def test_moments_a_float64_merge_passes_and_a_slightly_off_one_fails():
    def merge64(a, b):
        n, m, q = s_moments.merge(*[(c, np.float64(0) + mu, np.float64(0) + m2) for c, mu, m2 in (a, b)])
        return n, m, q

    assert moments.check(merge64).ok

    def off(a, b):
        n, m, q = s_moments.merge(a, b)
        return n, m, q * np.float32(1.001)

    v = moments.check(off)
    assert v.status == core.FAIL and v.passed == 0


def test_moments_unweighted_mean_fails_and_wrong_count_is_named():
    def unweighted(a, b):
        n, _, q = s_moments.merge(a, b)
        return n, (a[1] + b[1]) / 2, q

    v = moments.check(unweighted)
    assert v.status == core.FAIL and "weight each block's mean by its count" in v.hint
    v = moments.check(lambda a, b: (1,) + s_moments.merge(a, b)[1:])
    assert v.status == core.FAIL and "count_a + count_b" in v.hint


@pytest.mark.parametrize("module", [roofline, tiles, moments])
def test_verdicts_are_stable_and_lines_short(module):
    wrong = {roofline: s_roofline.kernel_time_added, tiles: s_tiles.ub_bytes_all_live,
             moments: s_moments.merge_sums_of_squares}[module]
    first, again = str(module.check(wrong)), str(module.check(wrong))
    assert first == again
    assert all(len(line) <= 110 for line in first.splitlines())
