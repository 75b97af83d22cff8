"""The double-buffering simulator against analytic expectations, and the CPU tile pipeline."""

import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fusionlab.lessons import double_buffer as P

times = st.tuples(*[st.floats(0.01, 5.0, allow_nan=False)] * 3).map(lambda t: P.StageTimes(*t))


both = st.booleans()


def test_inplace_single_buffer_is_fully_serial():
    t = P.StageTimes(2.0, 3.0, 1.0)
    for shared in (True, False):
        s = P.simulate(10, t, 1, inplace=True, shared_bandwidth=shared)
        assert s.total == pytest.approx(P.serial_time(10, t)) == pytest.approx(10 * 6.0)
    # each unit busy only its share: with equal stages that is the CANN docs' "1/3"
    eq = P.simulate(30, (1.0, 1.0, 1.0), 1, inplace=True)
    assert eq.busy()["Vector"] == pytest.approx(1 / 3)


def test_single_buffer_queues_overlap_copy_in_with_copy_out_only_with_a_path_each():
    a, b, c = 2.0, 3.0, 1.5
    separate = P.simulate(10, (a, b, c), 1, shared_bandwidth=False)
    assert separate.total == pytest.approx(a + b + c + 9 * (b + max(a, c)))
    assert separate.total < P.serial_time(10, (a, b, c))
    # over one shared path, copying in while copying out halves both: nothing gained over serial
    shared = P.simulate(10, (a, b, c), 1)
    assert shared.total == pytest.approx(P.serial_time(10, (a, b, c)))


def test_balanced_double_buffering_approaches_n_times_one_stage():
    t, n = 1.0, 50
    s = P.simulate(n, (t, t, t), 2, shared_bandwidth=False)
    assert s.total == pytest.approx(n * t + 2 * t)  # n x max(stage) + fill and drain
    assert s.busy()["Vector"] == pytest.approx(n / (n + 2))
    # a shared path moves copy-in + copy-out per tile: 2 t per tile, the Vector unit waits half the time
    shared = P.simulate(n, (t, t, t), 2)
    assert shared.total == pytest.approx(P.lower_bound(n, (t, t, t)) + t, rel=0.02)
    assert shared.path_busy == pytest.approx(2 * n / shared.total)


def test_the_issue_12_case_moves_its_bytes_no_faster_than_the_bandwidth():
    """Sinh-like fp16 kernel on the 300I Pro: 4 Mi elements in and out per core at 25.6 GB/s is >= 655 us."""
    from fusionlab.cost import devices

    core = P.core_from_device(devices.load_devices()["Atlas 300I Pro"])
    elems, moved = 4 * 2**20, 4 * 2**20 * (2 + 2)
    for buffers in (1, 2):
        tile = P.max_tile_elems(core.ub_bytes, buffers)
        t = P.stage_times(core, tile, ops_per_elem=20)
        total = P.simulate(-(-elems // tile), t, buffers).total
        assert total >= moved / (core.copy_gbs * 1e3) * (1 - 1e-9) >= 655


def test_dominant_stage_leaves_nothing_to_gain():
    for shared in (True, False):
        gains = [P.double_buffer_gain((1.0, k, 1.0), 64, shared_bandwidth=shared) for k in (2, 4, 16, 64, 256)]
        assert gains == sorted(gains, reverse=True)
        assert gains[-1] < 0.01
        assert P.double_buffer_gain((200.0, 1.0, 1.0), 64, shared_bandwidth=shared) < 0.01  # copy-bound


@pytest.mark.parametrize("buffers", [1, 2, 3, 4])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("ratio", [0.05, 0.3, 1.0, 2.0, 8.0, 50.0])
@pytest.mark.parametrize("split", [0.0, 0.3, 0.5, 1.0])
def test_no_schedule_beats_the_bandwidth_and_compute_bound(buffers, inplace, shared, ratio, split):
    t = P.StageTimes(ratio * split, 1.0, ratio * (1 - split))
    for n in (1, 7, 64):
        s = P.simulate(n, t, buffers, inplace=inplace, shared_bandwidth=shared)
        copies = n * (t.copy_in + t.copy_out) if shared else n * max(t.copy_in, t.copy_out)
        assert s.total >= max(copies, n * t.compute) * (1 - 1e-9)
        assert s.total <= P.serial_time(n, t) * (1 + 1e-9)
        if shared:
            assert s.path_busy <= 1 + 1e-9


@pytest.mark.parametrize("device", ["Atlas 300I Pro", "Atlas 300I Duo", "Atlas 800T (Ascend 910)",
                                    "Atlas 800I A2 (Ascend 910B)"])
@pytest.mark.parametrize("ops, inputs", [(1, 2), (20, 1), (100, 1)])
@pytest.mark.parametrize("buffers", [1, 2])
def test_device_kernels_respect_bytes_over_bandwidth(device, ops, inputs, buffers):
    from fusionlab.cost import devices

    core = P.core_from_device(devices.load_devices()[device])
    elems = 2**20
    tile = P.max_tile_elems(core.ub_bytes, buffers, inputs=inputs)
    t = P.stage_times(core, tile, inputs=inputs, ops_per_elem=ops)
    n = -(-elems // tile)
    total = P.simulate(n, t, buffers).total
    bytes_moved = n * tile * (inputs * 2 + 2)  # fp16 in and out
    compute = n * tile * ops / (core.vector_gflops * 1e3)
    assert total >= max(bytes_moved / (core.copy_gbs * 1e3), compute) * (1 - 1e-9)


@given(times, st.integers(1, 4), st.booleans(), both)
def test_simulated_period_matches_the_analytic_one(t, buffers, inplace, shared):
    s = P.simulate(200, t, buffers, inplace=inplace, shared_bandwidth=shared)
    period = (s.ends[150, 2] - s.ends[50, 2]) / 100
    analytic = P.steady_state_period(t, buffers, inplace=inplace, shared_bandwidth=shared)
    if not shared or buffers == 1 or t.compute >= t.copy_in + t.copy_out:
        assert period == pytest.approx(analytic, rel=1e-9)
    else:  # copies dominate a shared path: the bound, or a little slower (an equal split is not optimal)
        assert analytic * (1 - 1e-9) <= period <= analytic * 1.05


@given(times, st.integers(1, 30), st.integers(1, 4), st.booleans(), both)
def test_schedule_respects_every_dependency(t, n, buffers, inplace, shared):
    s = P.simulate(n, t, buffers, inplace=inplace, shared_bandwidth=shared)
    S, E = s.starts, s.ends
    if shared:  # a copy takes its time alone, or up to twice that while the other copy runs too
        d, alone = E - S, np.array(t.as_tuple())[None, :]
        assert np.allclose(d[:, 1], alone[:, 1]) and (d >= alone - 1e-9).all() and (d <= 2 * alone + 1e-9).all()
    else:
        assert np.allclose(E - S, np.array(t.as_tuple())[None, :])
    for i in range(n):
        assert S[i, 1] >= E[i, 0] - 1e-12 and S[i, 2] >= E[i, 1] - 1e-12  # data flow
        if i:
            assert (S[i] >= E[i - 1] - 1e-12).all()  # one engine per stage, tiles in order
        if i >= buffers:  # buffer reuse
            release_in = E[i - buffers, 2] if inplace else E[i - buffers, 1]
            assert S[i, 0] >= release_in - 1e-12
            if not inplace:
                assert S[i, 1] >= E[i - buffers, 2] - 1e-12
    assert s.total >= P.lower_bound(n, t, shared_bandwidth=shared) * (1 - 1e-9)
    assert s.total <= P.serial_time(n, t) + 1e-9


@given(times, st.integers(1, 40), st.booleans())
def test_more_buffers_never_slower_with_a_path_each(t, n, inplace):
    one = P.simulate(n, t, 1, inplace=inplace, shared_bandwidth=False).total
    two = P.simulate(n, t, 2, inplace=inplace, shared_bandwidth=False).total
    three = P.simulate(n, t, 3, inplace=inplace, shared_bandwidth=False).total
    assert two <= one + 1e-9 and three <= two + 1e-9


@given(times, st.integers(1, 40), st.booleans())
def test_a_second_buffer_never_slower_on_a_shared_path(t, n, inplace):
    assert P.simulate(n, t, 2, inplace=inplace).total <= P.simulate(n, t, 1, inplace=inplace).total * (1 + 1e-9)


def test_seed_plus_18_percent_needs_copy_small_next_to_compute_or_far_larger():
    # shared path: BUFFER_NUM=1 is serial, so on the compute-bound side gain = copy/compute -> 18%
    r = P.ratio_for_gain(0.18)
    assert r == pytest.approx(0.18, abs=1e-6)
    g = P.double_buffer_gain((r / 2, 1.0, r / 2), n_tiles=2000)
    assert g == pytest.approx(0.18, abs=0.002)
    # ... and on the copy-bound side gain = compute/copy -> copy = 1 / 0.18 = 5.6 x compute
    r_copy = P.ratio_for_gain(0.18, side="copy")
    assert r_copy == pytest.approx(1 / 0.18, rel=1e-6)
    assert P.double_buffer_gain((r_copy / 2, 1.0, r_copy / 2), n_tiles=2000) == pytest.approx(0.18, abs=0.005)
    # a path each, against separate in/out queues: gain = copy/(2 x compute) -> copy = 36% of compute
    assert P.ratio_for_gain(0.18, shared_bandwidth=False) == pytest.approx(0.36, abs=1e-6)
    assert P.ratio_for_gain(0.18, inplace=True, shared_bandwidth=False) == pytest.approx(0.18, abs=1e-6)
    assert P.ratio_for_gain(0.0) == 0.0
    with pytest.raises(ValueError):
        P.ratio_for_gain(0.1, side="both")


def test_ub_capacity_limits_the_tile():
    ub = 192 * 1024
    for buffers in (1, 2):
        tile = P.max_tile_elems(ub, buffers, in_bytes=2, out_bytes=2, inputs=2, outputs=1)
        assert buffers * (2 * 2 + 2) * tile <= ub
        assert buffers * (2 * 2 + 2) * (tile + 16) > ub  # one more 32-byte block would not fit
        assert tile % 16 == 0
    assert P.max_tile_elems(ub, 2) * 2 == P.max_tile_elems(ub, 1)
    with pytest.raises(ValueError):
        P.max_tile_elems(0, 2)


def test_vector_kernels_on_the_910b_share_the_bandwidth_over_its_40_vector_cores():
    """The 910B4 runs a vector kernel on its 40 AIV cores, not its 20 AI (cube) cores: 800 GB/s / 40 each."""
    from fusionlab.cost import devices

    dev = devices.load_devices()["Atlas 800I A2 (Ascend 910B)"]
    assert dev.ai_cores == 20 and dev.vector_cores == 40
    assert P.core_from_device(dev).copy_gbs == pytest.approx(dev.mem_bandwidth_gbs / 40)
    pro = devices.load_devices()["Atlas 300I Pro"]  # one core type: vector kernels run on the AI cores
    assert pro.vector_cores is None and P.core_from_device(pro).copy_gbs == pytest.approx(pro.mem_bandwidth_gbs / 8)


def test_stage_times_from_a_device_preset():
    from fusionlab.cost import devices

    dev = devices.load_devices()["Atlas 300I Pro"]
    core = P.core_from_device(dev)
    assert core.ub_bytes == int(dev.ub_kb * 1024)
    assert core.copy_gbs == pytest.approx(dev.mem_bandwidth_gbs / dev.ai_cores)
    tile = P.max_tile_elems(core.ub_bytes, 2)
    t = P.stage_times(core, tile)
    assert t.copy_in == pytest.approx(2 * tile / (core.copy_gbs * 1e3))
    assert t.compute == pytest.approx(tile / (core.vector_gflops * 1e3))
    # a single elementwise op per element is memory-bound on this device by a wide margin
    assert t.copy_in > 5 * t.compute


def test_bad_arguments():
    with pytest.raises(ValueError):
        P.simulate(3, (1.0, -1.0, 1.0))
    with pytest.raises(ValueError):
        P.simulate(3, (1.0, 1.0, 1.0), 0)
    assert P.simulate(0, (1.0, 1.0, 1.0)).total == 0.0


def test_draw_pipeline():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = P.draw_pipeline(P.simulate(12, (1, 2, 1), 2), max_tiles=5)
    assert "first 5 of 12" in fig.axes[0].get_title()
    plt.close(fig)


# -- CPU analogue ----------------------------------------------------------------------------------

def _tiles(n=6, size=1000):
    data = np.arange(n * size, dtype=np.float64).reshape(n, size)
    return data, [np.empty(size) for _ in range(2)]


@pytest.mark.parametrize("overlap", [False, True])
def test_run_tiles_computes_every_tile_in_order(overlap):
    data, bufs = _tiles()

    def load(i, buf):
        buf[:] = data[i]

    out = P.run_tiles(load, lambda b: float(b.sum()), len(data), bufs, overlap=overlap)
    assert out == [float(r.sum()) for r in data]


def test_overlap_really_loads_ahead_but_never_more_than_the_buffers():
    data, bufs = _tiles(8)
    loaded = [threading.Event() for _ in range(len(data))]
    computed = [threading.Event() for _ in range(len(data))]
    ahead = []

    def load(i, buf):
        if i >= len(bufs):
            assert computed[i - len(bufs)].is_set(), "a buffer was overwritten before its tile was computed"
        buf[:] = data[i]
        loaded[i].set()

    def compute(buf):
        i = int(buf[0] // buf.size)
        if i + 1 < len(data):
            ahead.append(loaded[i + 1].wait(timeout=5))  # the next tile loads while this one computes
        s = float(buf.sum())
        computed[i].set()
        return s

    out = P.run_tiles(load, compute, len(data), bufs, overlap=True)
    assert all(ahead) and len(out) == len(data)


def test_run_tiles_propagates_loader_errors():
    data, bufs = _tiles()

    def load(i, buf):
        if i == 3:
            raise RuntimeError("read failed")
        buf[:] = data[i]

    with pytest.raises(RuntimeError, match="read failed"):
        P.run_tiles(load, lambda b: 0, len(data), bufs, overlap=True)


def test_tile_file_round_trip_and_compute(tmp_path):
    path = P.write_tile_file(tmp_path / "t.bin", 3, 64, seed=1)
    expected = np.random.default_rng(1).standard_normal(3 * 64, dtype=np.float32).reshape(3, 64)
    buf = np.empty(64, dtype=np.float32)
    with P.TileFile(path, 64) as tf:
        assert tf.n_tiles == 3
        tf.load(2, buf)
        np.testing.assert_array_equal(buf, expected[2])
        with pytest.raises(IndexError):
            tf.load(3, buf)
    compute = P.elementwise_compute(2, 64)
    assert compute(buf) == pytest.approx(float(np.tanh(np.tanh(expected[2])).sum(dtype=np.float64)), rel=1e-5)
    with pytest.raises(ValueError):
        P.TileFile(path, 10**6)
    with pytest.raises(ValueError):
        P.elementwise_compute(0, 64)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.bin"]  # written atomically, no temp left


def test_emulated_device_makes_loads_at_least_bytes_over_bandwidth(tmp_path):
    import time

    path = P.write_tile_file(tmp_path / "t.bin", 2, 1024)
    buf = np.empty(1024, dtype=np.float32)
    with P.TileFile(path, 1024, device_gbs=0.001) as tf:  # 4 KiB at 1 MB/s: >= 4.096 ms
        t0 = time.perf_counter()
        tf.load(0, buf)
        assert time.perf_counter() - t0 >= 4096 / 1e6
