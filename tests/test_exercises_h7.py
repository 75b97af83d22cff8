"""The exercises of notebooks 17 and 18 (idle, utilisation) and 20 and 21 (gears, lru): each is graded against the lesson's own
function, the learner's answer works on the objects the notebook shows, and an answer that is slightly off fails."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fusionlab import profile, zoo
from fusionlab.cost import devices, metrics
from fusionlab.exercises import core, gears, idle, lru, utilisation
from fusionlab.lessons import dynamic_shapes

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # solutions/ sits at the repository root
from solutions import gears as s_gears  # noqa: E402
from solutions import idle as s_idle  # noqa: E402
from solutions import lru as s_lru  # noqa: E402
from solutions import utilisation as s_utilisation  # noqa: E402


# -- idle (17) ------------------------------------------------------------------------------------------------------

def test_idle_answer_works_on_a_real_profile_as_section_2_shows_it():
    """The reference, fed a real onnxruntime profile's ops, gives that profile's "no kernel running" figure."""
    prof = profile.profile_model(zoo.conv_bn_relu(image_size=16), runs=3, warmup=1)
    for span in prof.runs:
        got = s_idle.idle_us(span.dur_us, prof.ops(span.index))
        assert got == pytest.approx(max(0.0, span.dur_us - profile._union_length(
            (e.start_us, e.end_us) for e in prof.ops(span.index))), abs=1e-9)
    median = prof.runs[prof.median_run()]
    last_line = prof.op_table().splitlines()[-1]  # the op table of §2 ends with the median run's figures
    printed = float(last_line.rsplit("no kernel running ", 1)[1].removesuffix(" us"))
    assert s_idle.idle_us(median.dur_us, prof.ops()) == pytest.approx(printed, abs=0.051)


def test_idle_cases_parse_into_the_runs_they_name():
    for case in idle.CASES:
        prof = idle.profile_of(case.data)
        assert prof.ops_per_run == len(case.data.kernels) and prof.n_runs == 1
        assert idle.expected(case.data) == prof.gap_us > 0
    overlap = idle.profile_of(idle.CASES[2].data)
    assert overlap.busy_us < overlap.kernel_us and overlap.n_lanes == 2  # the overlap the wrong answer counts twice
    tail = idle.CASES[0].data
    assert tail.run_us > max(s + d for s, d, _, _ in tail.kernels)  # time after the last kernel: the Wait sum's miss


def test_idle_slightly_off_fails_and_names_no_mistake():
    v = idle.check(lambda run_us, ops: s_idle.idle_us(run_us, ops) + 0.5)
    assert v.status == core.FAIL and v.passed == 0 and "that is" not in v.hint


# -- utilisation (18) -----------------------------------------------------------------------------------------------

def test_utilisation_truth_is_the_figure_section_4_prints():
    """For a modelled run, the reference on (flops, bytes, time, card preset) gives metrics.modelled's figures on
    one chip: the numbers §4's table prints."""
    model = zoo.conv_bn_relu(image_size=32)
    for dev in devices.load_devices().values():
        u = metrics.modelled(model, dev.one_chip())
        got = s_utilisation.utilisation(u.flops, u.bytes, u.time_s, dev)
        assert got == pytest.approx((u.compute_util, u.bandwidth_util), rel=1e-12)
    assert any(d.chips > 1 for d in devices.load_devices().values())  # the whole-card mistake can show


def test_utilisation_one_percent_off_fails():
    v = utilisation.check(lambda f, b, s, d: tuple(x * 1.01 for x in s_utilisation.utilisation(f, b, s, d)))
    assert v.status == core.FAIL and v.passed == 0


def test_utilisation_wants_two_numbers():
    v = utilisation.check(lambda f, b, s, d: s_utilisation.utilisation(f, b, s, d)[0])
    assert v.status == core.FAIL and "(compute, bandwidth)" in v.hint


# -- gears (15) -----------------------------------------------------------------------------------------------------

def test_gears_truth_is_the_lessons_gear_for_and_replay():
    for case in gears.CASES:
        c = case.data
        by_hand = sum(dynamic_shapes.gear_for(n, c.gears) for n in c.lengths) / sum(c.lengths)
        assert gears.expected(c) == pytest.approx(by_hand, rel=1e-12)
    c = gears.CASES[0].data
    assert 65 in c.lengths and dynamic_shapes.gear_for(65, c.gears) == 128  # the nearest gear, 64, is too small
    assert gears.expected(gears.CASES[1].data) == 1.0


def test_gears_slightly_off_fails():
    v = gears.check(lambda lengths, gs: s_gears.padded_waste(lengths, gs) * 1.0001)
    assert v.status == core.FAIL and v.passed == 0


# -- lru (15) -------------------------------------------------------------------------------------------------------

def test_lru_truth_is_the_lessons_cache_and_replay():
    stream = lru.CASES[-1].data
    lengths = [s[1] for s in stream.shapes]  # already gears: replaying them pads nothing more
    r = dynamic_shapes.replay(lengths, "gears", gears=dynamic_shapes.gears(512, 4), capacity=stream.capacity)
    assert lru.expected(stream) == r.compiles
    assert lru.expected(lru.CASES[2].data) == len({dynamic_shapes.shape_key(s) for s in lru.CASES[2].data.shapes})


def test_lru_and_fifo_differ_where_the_case_says():
    c = lru.CASES[1].data
    assert s_lru.compilations_fifo(c.shapes, c.capacity) != lru.expected(c)
    cyc = lru.CASES[5].data
    assert lru.expected(cyc) == len(cyc.shapes)  # the thrashing cycle: every request compiles


def test_lru_refuses_a_non_count():
    v = lru.check(lambda shapes, capacity: 2.5)
    assert v.status == core.FAIL and "whole number" in v.hint


@pytest.mark.parametrize("module, wrong", [(idle, s_idle.idle_us_waits), (utilisation, s_utilisation.utilisation_gib),
                                           (gears, s_gears.padded_waste_nearest), (lru, s_lru.compilations_fifo)])
def test_verdicts_print_the_same_twice_within_110_characters(module, wrong):
    first, again = str(module.check(wrong)), str(module.check(wrong))
    passed = str(module.check(getattr(sys.modules[f"solutions.{module.__name__.rsplit('.', 1)[1]}"], "REFERENCE")))
    assert first == again
    assert all(len(line) <= 110 for text in (first, passed) for line in text.splitlines())
    assert "0x" not in first
