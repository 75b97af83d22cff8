"""The new exercises of notebooks 17 and 18 (hotspot, workspace): each is graded against the lesson's own function, the
learner's answer works on the objects the notebook shows, and an answer that is slightly off fails."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fusionlab import cost, profile, zoo
from fusionlab.exercises import core, hotspot, idle, workspace
from fusionlab.passes import plan as make_plan

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # solutions/ sits at the repository root
from solutions import hotspot as s_hotspot  # noqa: E402
from solutions import workspace as s_workspace  # noqa: E402


# -- hotspot (17) ---------------------------------------------------------------------------------------------------

def test_hotspot_truth_is_by_op_type_of_the_parsed_trace():
    for case in hotspot.CASES:
        prof = idle.profile_of(case.data)
        by_type = prof.by_op_type()
        top = max(by_type, key=lambda t: by_type[t]["time_us"])
        assert hotspot.expected(case.data) == (top, pytest.approx(by_type[top]["time_us"] / prof.kernel_us))
        times = sorted((r["time_us"] for r in by_type.values()), reverse=True)
        assert len(times) == 1 or times[0] > times[1]  # no tie: the answer is one type


def test_hotspot_answer_works_on_a_real_profile_as_section_2_shows_it():
    """The reference, fed a one-run onnxruntime profile's ops, gives that profile's by_op_type() first row."""
    prof = profile.profile_model(zoo.conv_bn_relu(image_size=16), runs=1, warmup=1)
    top, row = next(iter(prof.by_op_type().items()))
    assert s_hotspot.top_op_type(prof.ops()) == (top, pytest.approx(row["share"], rel=1e-12))


def test_hotspot_cases_hold_the_corners_they_name():
    def ops(i):
        return idle.profile_of(hotspot.CASES[i].data).ops()

    want = [hotspot.expected(c.data)[0] for c in hotspot.CASES]
    assert max(ops(1), key=lambda e: e.dur_us).op_type != want[1]  # one long kernel is not the top type
    kinds = [e.op_type for e in ops(2)]
    assert max(set(kinds), key=kinds.count) != want[2]  # the most frequent type is not the top type
    two_lanes = idle.profile_of(hotspot.CASES[4].data)
    assert two_lanes.n_lanes == 2 and two_lanes.busy_us < two_lanes.kernel_us  # overlaps: busy < summed durations


def test_hotspot_slightly_off_fails_and_names_no_mistake():
    v = hotspot.check(lambda ops: (s_hotspot.top_op_type(ops)[0], s_hotspot.top_op_type(ops)[1] * 1.001))
    assert v.status == core.FAIL and v.passed == 0 and "that is" not in v.hint


def test_hotspot_wants_a_type_and_a_share():
    v = hotspot.check(lambda ops: s_hotspot.top_op_type(ops)[0])
    assert v.status == core.FAIL and "(op type, share)" in v.hint


# -- workspace (18) -------------------------------------------------------------------------------------------------

def test_workspace_truth_is_the_cost_models_peak():
    """Every hidden model's truth is what plan_cost reports as peak_activation_bytes (fp32, no spill)."""
    models = {"residual": workspace._residual(), "early output": workspace._early_output(),
              "conv_bn_relu": zoo.conv_bn_relu(image_size=16)}
    for which, model in models.items():
        pc = cost.plan_cost(model, None, "Atlas 300I Pro", precision="fp32")
        assert pc.spill_bytes == 0
        assert workspace._hidden(which)[1] == workspace.expected(model) == pc.peak_activation_bytes
    fused = zoo.conv_bn_relu(image_size=16)
    p = make_plan(fused, ("vertical",))
    assert workspace._hidden("conv_bn_relu fused")[1] == cost.plan_cost(
        fused, p, "Atlas 300I Pro", precision="fp32").peak_activation_bytes


def test_workspace_answer_on_section_2s_run_gives_the_peak_it_prints():
    model = zoo.yolov5s(image_size=160, width_mult=0.25)
    run = cost.run_of(model)
    peak = cost.plan_cost(model, None, "this machine").peak_activation_bytes
    assert s_workspace.workspace_bytes(run.inputs, run.steps, run.outputs) == peak
    assert sum(b for s in run.steps for b in s.writes.values()) > 5 * peak  # one slot per tensor: far more


def test_workspace_cases_hold_the_corners_they_name():
    run, want = workspace._hidden("residual")
    assert s_workspace.workspace_bytes_first_reader(run.inputs, run.steps, run.outputs) < want  # the skip
    run, want = workspace._hidden("late input")
    assert len(run.inputs) == 2 and s_workspace.workspace_bytes_without_inputs(run.inputs, run.steps, run.outputs) < want
    run, _ = workspace._hidden("early output")
    assert len(run.outputs) == 2 and "aux" in run.steps[0].writes and "aux" in run.steps[1].reads
    assert len(workspace._hidden("conv_bn_relu fused")[0].steps) == 1


def test_workspace_one_byte_off_fails_and_names_no_mistake():
    v = workspace.check(lambda i, s, o: s_workspace.workspace_bytes(i, s, o) + 1)
    assert v.status == core.FAIL and v.passed == 0 and "that is" not in v.hint


def test_workspace_refuses_a_non_number():
    v = workspace.check(lambda i, s, o: str(s_workspace.workspace_bytes(i, s, o)))
    assert v.status == core.FAIL and "number of bytes" in v.hint


@pytest.mark.parametrize("module, wrong", [(hotspot, s_hotspot.top_op_type_most_frequent),
                                           (workspace, s_workspace.workspace_bytes_first_reader)])
def test_verdicts_print_the_same_twice_within_110_characters(module, wrong):
    first, again = str(module.check(wrong)), str(module.check(wrong))
    passed = str(module.check(getattr(sys.modules[f"solutions.{module.__name__.rsplit('.', 1)[1]}"], "REFERENCE")))
    assert first == again
    assert all(len(line) <= 110 for text in (first, passed) for line in text.splitlines())
    assert "0x" not in first
