"""timing: statistics with injected samples and fake clocks; never asserts on wall time."""

import gc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

from fusionlab import timing
from fusionlab.build import make_model, value_info
from fusionlab.verification import runtime


class FakeClock:
    """A clock that only moves when a fake workload says so."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def work(self, seconds):
        def fn():
            self.t += seconds
        return fn


def tiny_model(name="relu"):
    node = helper.make_node("Relu", ["x"], ["y"], name=name)
    return make_model([node], [value_info("x", np.float32, [1, 16])], [value_info("y", np.float32, [1, 16])])


# -- statistics ---------------------------------------------------------------------------------------

def test_median_ci_order_statistics_n10():
    med, lo, hi = timing.median_ci(list(range(10, 0, -1)))
    assert (med, lo, hi) == (5.5, 2.0, 9.0)  # ranks 2 and 9: P(Bin(10,.5) <= 1) = 11/1024 <= 2.5%


def test_median_ci_small_n_is_the_range():
    assert timing.median_ci([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)
    assert timing.median_ci([4.0]) == (4.0, 4.0, 4.0)


def test_median_ci_rank_matches_binomial_tables():
    # classic table values for the 95% CI of a median (lower rank k)
    for n, k in [(6, 1), (10, 2), (20, 6), (50, 18), (100, 40)]:
        assert timing._order_stat_rank(n) == k


def test_normal_approximation_joins_the_exact_rank():
    assert abs(timing._order_stat_rank(2000) - timing._order_stat_rank(2001)) <= 1


def test_median_ci_empty():
    with pytest.raises(ValueError):
        timing.median_ci([])


@given(st.lists(st.floats(min_value=1e-9, max_value=10.0, allow_nan=False), min_size=1, max_size=300))
def test_ci_contains_the_median(xs):
    med, lo, hi = timing.median_ci(xs)
    assert min(xs) <= lo <= med <= hi <= max(xs)


def test_timing_from_samples_and_str():
    t = timing.Timing.from_samples([0.00123] * 57, label="conv")
    assert t.n == 57 and t.median == pytest.approx(0.00123)
    assert str(t) == "conv: median 1.23 ms (95% CI 1.23–1.23 ms, n=57)"
    assert "<table>" in t._repr_html_() and "conv" in t._repr_html_()
    assert repr(t) == "Timing('conv', median=1.23 ms, n=57)"


def test_format_seconds_units():
    assert timing.format_seconds(2.5) == "2.50 s"
    assert timing.format_seconds(0.000123) == "123 µs"
    assert timing.format_seconds(4.5e-8) == "45.0 ns"
    assert timing.format_seconds(0.0015, "µs") == "1500 µs"


# -- bench --------------------------------------------------------------------------------------------

def test_bench_records_the_injected_durations():
    clock = FakeClock()
    durations = iter([0.5, 0.5, 0.5] + [0.01, 0.03, 0.02, 0.05, 0.04] + [1.0] * 100)
    fn = lambda: setattr(clock, "t", clock.t + next(durations))
    t = timing.bench(fn, warmup=3, min_time=0.1, min_repeats=5, timer=clock)
    assert t.samples == pytest.approx([0.01, 0.03, 0.02, 0.05, 0.04])  # warm-up not counted
    assert t.median == pytest.approx(0.03) and t.n == 5


def test_bench_runs_until_min_time():
    clock = FakeClock()
    t = timing.bench(clock.work(0.125), warmup=0, min_time=1.0, min_repeats=2, timer=clock)
    assert t.n == 8  # 8 x 125 ms reach 1 s (binary-exact durations: no rounding in the sum)


def test_bench_stops_at_max_repeats_and_restores_gc():
    clock = FakeClock()
    assert gc.isenabled()
    t = timing.bench(clock.work(0.0), warmup=0, min_time=1.0, min_repeats=1, max_repeats=17, timer=clock)
    assert t.n == 17 and gc.isenabled()


def test_bench_rejects_bad_repeats():
    with pytest.raises(ValueError):
        timing.bench(lambda: None, min_repeats=5, max_repeats=2)


def test_bench_session_and_levels():
    sessions = timing.session_at_each_level(tiny_model())
    assert list(sessions) == list(runtime.LEVELS)
    feeds = runtime.make_feeds(tiny_model(), sess=sessions["all"])
    t = timing.bench_session(sessions["all"], dict(feeds, unused=np.zeros(1)), min_time=0.0, min_repeats=4)
    assert t.n >= 4 and t.label == "session" and t.ci_low <= t.median <= t.ci_high


# -- compare ------------------------------------------------------------------------------------------

def test_compare_interleaves_and_alternates_who_goes_first():
    calls = []
    c = timing.compare(lambda: calls.append("A"), lambda: calls.append("B"), warmup=2, min_time=0.0,
                       min_rounds=4, max_rounds=4)
    assert "".join(calls) == "ABAB" + "AB" + "BA" + "AB" + "BA"
    assert c.rounds == 4 and c.a.n == 4 and c.b.n == 4


def test_compare_with_fake_clock_gives_exact_ratio():
    clock = FakeClock()
    c = timing.compare(clock.work(0.25), clock.work(0.125), label_a="slow", label_b="fast", warmup=0,
                       min_time=3.0, min_rounds=3, timer=clock)
    assert c.speedup == pytest.approx(2.0) and c.ci_low == pytest.approx(2.0) and c.ci_high == pytest.approx(2.0)
    assert c.rounds == 8  # 8 rounds x 375 ms reach 3 s
    assert c.verdict() == "fast is faster (2.00×)"
    text = c.table()
    assert text.splitlines()[1].split()[:3] == ["A", "slow", "250"]
    assert "speedup A/B (median of paired ratios): 2.00× (95% CI 2.00–2.00×)" in text and str(c) == text
    assert repr(c) == "Comparison('slow' vs 'fast', speedup=2.00, ci=(2.00, 2.00), rounds=8)"
    assert "<table>" in c._repr_html_()


def test_comparison_verdicts():
    same = timing.Comparison.from_samples([1.0, 1.1, 0.9, 1.0, 1.05, 0.95], [1.0, 0.9, 1.1, 1.0, 0.95, 1.05])
    assert same.verdict().startswith("no clear difference")
    slower_b = timing.Comparison.from_samples([1.0] * 10, [2.0] * 10, label_a="A", label_b="B")
    assert slower_b.verdict() == "A is faster (2.00×)"
    assert slower_b.verdict(brief=True) == "A faster" and same.verdict(brief=True) == "no clear difference"
    with pytest.raises(ValueError):
        timing.Comparison.from_samples([1.0], [1.0, 2.0])


def test_said_puts_the_ratio_its_interval_and_the_verdict_in_words():
    faster_b = timing.Comparison.from_samples([2.0] * 10, [1.0] * 10)
    assert faster_b.said() == "2.00× (95% CI 2.00–2.00), faster"
    same = timing.Comparison.from_samples([1.0, 1.1, 0.9, 1.0, 1.05, 0.95], [1.0, 0.9, 1.1, 1.0, 0.95, 1.05])
    assert same.said().endswith(", no clear difference")


def test_paired_ratios_cancel_shared_drift():
    # both candidates slow down 10x halfway through; unpaired medians blur that, paired ratios do not
    a = [0.002] * 10 + [0.02] * 10
    b = [0.001] * 10 + [0.01] * 10
    c = timing.Comparison.from_samples(a, b)
    assert c.speedup == pytest.approx(2.0) and c.ci_low == pytest.approx(2.0) and c.ci_high == pytest.approx(2.0)
    assert c.ratios == pytest.approx([2.0] * 20)


def test_compare_sees_b_doing_a_thousandth_of_the_work():
    big, small = np.ones(1_000_000), np.ones(1_000)
    c = timing.compare(big.sum, small.sum, warmup=2, min_time=0.05, min_rounds=15)
    assert c.speedup > 1 and c.ci_low > 1


def test_compare_models_pins_threads_and_shares_feeds():
    c = timing.compare_models(tiny_model(), tiny_model("other"), level_b="all", min_time=0.0, min_rounds=5,
                              warmup=1)
    assert c.threads == {"intra_op": 1, "inter_op": 1}
    assert c.rounds >= 5 and c.label_a == "A (disable)" and c.label_b == "B (all)"
    c2 = timing.compare_models(tiny_model(), tiny_model(), min_time=0.0, min_rounds=3, max_rounds=3, warmup=0,
                               label_a="x", label_b="y")
    assert (c2.label_a, c2.label_b, c2.rounds) == ("x", "y", 3)


def test_machine_info_keys():
    info = timing.machine_info()
    for key in ("cpu", "logical_cores", "usable_cores", "python", "numpy", "onnx", "onnxruntime"):
        assert key in info
    assert isinstance(info["logical_cores"], int) and info["logical_cores"] >= 1
    import onnxruntime

    assert info["onnxruntime"] == onnxruntime.__version__


def test_comparisons_table_puts_one_comparison_on_each_row():
    faster_b = timing.Comparison.from_samples([0.002] * 10, [0.001] * 10, label_a="A", label_b="B (all)")
    same = timing.Comparison.from_samples([1.0, 1.1, 0.9, 1.0, 1.05, 0.95], [1.0, 0.9, 1.1, 1.0, 0.95, 1.05])
    lines = timing.comparisons_table({"ours vs theirs": faster_b, "both at ALL": same},
                                     header=("comparison", "A", "B", "A/B", "95% CI", "verdict")).splitlines()
    assert lines[0].split() == ["comparison", "A", "B", "A/B", "95%", "CI", "verdict"] and set(lines[1]) <= {"-", " "}
    assert lines[2].split() == ["ours", "vs", "theirs", "2.00", "ms", "1.00", "ms", "2.00x", "2.00-2.00", "B", "(all)",
                                "faster"]
    assert lines[3].endswith("no clear difference") and "1.00x" in lines[3]
