"""calibrate: each machine quantity defined once, measured the same way in quick and full mode."""

import pytest

from fusionlab.cost import calibrate, devices
from fusionlab.text import MAX_WIDTH


def test_stream_arrays_are_at_least_four_times_the_last_level_cache():
    caches = calibrate.cache_sizes_kb()
    n = calibrate.stream_elements()
    assert n >= 16 * 2**20
    assert n * 4 >= 4 * max(caches["l3"], caches["l2"]) * 1024
    assert calibrate.stream_elements(min_elements=10**9) == 10**9


@pytest.mark.slow
def test_quick_and_full_calibration_measure_the_same_quantities():
    quick = calibrate.calibrate(quick=True)
    assert quick.stream_elements == calibrate.stream_elements()  # same arrays: DRAM, never cache
    assert quick.launch_overhead_us > 0 and quick.profiled_launch_us > 0
    assert quick.profiler_cost_us == pytest.approx(max(quick.profiled_launch_us - quick.launch_overhead_us, 0.0))
    d = quick.to_dict()
    assert d["stream_gbs"] == quick.stream_gbs and d["profiler_cost_us"] == quick.profiler_cost_us
    lines = quick.summary().splitlines()
    assert [line.split()[0] for line in lines] == ["streaming", "launch", "profiled", "matmul"]
    assert max(map(len, lines)) <= MAX_WIDTH  # the notebook column
    assert f"it adds {quick.profiler_cost_us:.2f} us per node" in lines[2]


@pytest.mark.slow
def test_this_machine_takes_bandwidth_and_launch_from_the_calibration():
    c = calibrate.calibrate(quick=True)
    me = devices.this_machine()
    assert me.mem_bandwidth_gbs == c.stream_gbs and me.launch_overhead_us == c.launch_overhead_us
    assert "arrays >= 4 x L3" in me.source and "profiler off" in me.source


def test_profiled_launch_uses_a_temporary_trace(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert calibrate.launch_overhead_us(8, 3, profiled=True) > 0
    assert list(tmp_path.iterdir()) == []  # onnxruntime's profile went to a temporary folder, now deleted
