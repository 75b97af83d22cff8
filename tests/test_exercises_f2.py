"""Fixes after expert reading of notebooks 06-10 (issue 21): the cases and hints they added."""

from __future__ import annotations

import numpy as np
from onnxruntime.quantization import quant_utils

import sys
from pathlib import Path

from fusionlab.exercises import qparams, thresholds, tiles
from fusionlab.lessons.quantization import qparams as lesson_qparams

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # solutions/ sits at the repository root
from solutions import softmax as s_softmax  # noqa: E402
from solutions import tiles as s_tiles  # noqa: E402


def test_the_zero_point_tie_is_onnxruntimes_and_float32_would_round_it_the_other_way():
    """The zero-point tie case: onnxruntime's quantizer gives the lesson's zero point, which the float32 scale misses."""
    case = next(c for c in qparams.CASES if "zero point that is a tie" in c.name).data
    z, s = quant_utils.compute_scale_zp(np.float32(case.lo), np.float32(case.hi), np.uint8(0), np.uint8(255))
    assert lesson_qparams(case.lo, case.hi, "uint8") == (float(s), int(z))
    scale64 = (case.hi - case.lo) / 255
    assert -case.lo / scale64 == 127.5 and int(z) == 128
    assert int(np.round(-case.lo / np.float32(scale64))) != int(z)


def test_only_the_zero_point_tie_case_has_a_tie_in_its_zero_point():
    """The other cases' zero points come out the same from a float32 scale, so they test what their names say."""
    for case in qparams.CASES:
        c = case.data
        lo, hi = min(c.lo, 0.0), max(c.hi, 0.0)
        same = np.round(-lo / ((hi - lo) / 255)) == np.round(-lo / np.float32((hi - lo) / 255))
        assert same != ("zero point that is a tie" in case.name), case.name


def test_thresholds_hint_shows_the_next_cap_and_does_not_name_the_best():
    best = thresholds.best()
    assert best > 3
    v = thresholds.check(best - 3)
    assert not v.ok and f"at {best - 2} the largest group" in v.hint and f" {best} " not in v.hint
    assert "so does a larger cap" in v.hint


def test_tiles_hint_names_both_mistakes_when_they_give_the_same_bytes():
    """§2's toy group: one tile per transfer and `a` left out both give 4 tiles; the hint cannot tell, so names both."""
    case = next(c for c in tiles.CASES if c.data.graph == "toy")
    ms, tile = tiles.members(case.data), case.data.tile
    one_tile = tiles.count(ms, tile, copies=1)
    assert one_tile == tiles.count(ms, tile, cube_serves=True) != tiles.truth(case.data)
    v = tiles.check(lambda members, t: one_tile if t == tile and members == list(ms) else s_tiles.ub_bytes(members, t))
    assert not v.ok and "one tile per transfer" in v.hint and "a tensor the cube reads left out" in v.hint


def test_softmax_stub_is_the_notebooks():
    """solutions/softmax.py's STUB is what notebook 09's cell holds: a body of `...`, which returns None."""
    src = (Path(__file__).resolve().parents[1] / "notebooks_src" / "09_reductions.py").read_text()
    assert "def update(m, l, acc, scores, v):" in src
    assert src.split("def update(m, l, acc, scores, v):")[1].split("\n\n")[0].strip().endswith("...  # your code here")
    assert s_softmax.STUB(None, None, None, None, None) is None


# -- expert reading of 13, 14, 17, 18 (issue 21) --------------------------------------------------------------------

from itertools import combinations  # noqa: E402

from fusionlab import cost  # noqa: E402
from fusionlab.exercises import hotspot, idle, workspace  # noqa: E402
from solutions import hotspot as s_hotspot  # noqa: E402
from solutions import workspace as s_workspace  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def test_no_lesson_calls_an_exercise_module():
    """Before its Exercises section a notebook uses only the library: the lessons do not depend on an exercise."""
    for src in sorted((ROOT / "notebooks_src").glob("*.py")):
        lesson = src.read_text().split("# ## Exercises")[0]
        assert "exercises." not in lesson, src.name


def test_workspace_run_of_is_the_cost_models():
    assert workspace.run_of is cost.run_of and workspace.Step is cost.schedule.Step and workspace.Run is cost.schedule.Run


def test_the_probes_tell_every_mistake_apart():
    """On the probe runs each mistake the hints can name gives its own answer, none of them the right one."""
    ops = idle.profile_of(hotspot.PROBE).ops()
    want = hotspot.expected(hotspot.PROBE)
    values = [v for v, words in hotspot._mistakes(ops, want)]
    assert not any(hotspot._same(v, want) for v in values)
    assert not any(hotspot._same(a, b) for a, b in combinations(values, 2))
    p = workspace.PROBE
    values = [v for v, _ in workspace._mistakes(p)]
    assert len(set(values)) == len(values) and s_workspace.workspace_bytes(p.inputs, p.steps, p.outputs) not in values


def test_a_hint_names_a_mistake_only_if_the_answer_follows_it_on_the_probe():
    """Case 2 of hotspot: the longest kernel and the longest on average are the same MatMul; each answer gets its own
    mistake named. An answer that matches a mistake only by chance gets none."""
    assert "single longest kernel" in hotspot.check(s_hotspot.top_op_type_longest_kernel).hint
    v = hotspot.check(s_hotspot.top_op_type_largest_mean)
    assert "on average" in v.hint and "single longest" not in v.hint
    run, _ = workspace._hidden("residual")
    first_reader = s_workspace.workspace_bytes_first_reader(run.inputs, run.steps, run.outputs)
    assert s_workspace.workspace_bytes_largest_kernel(run.inputs, run.steps, run.outputs) == first_reader
    v = workspace.check(lambda i, s, o: first_reader if len(s) == len(run.steps)
                        else s_workspace.workspace_bytes(i, s, o))
    assert not v.ok and v.passed == 1 and "that is" not in v.hint


def test_qadd_uint8_wrap_is_named_where_zero_points_are_subtracted():
    from fusionlab.exercises import qadd
    from solutions import qadd as s_qadd

    v = qadd.check(s_qadd.qlinear_add_uint8_difference)
    assert not v.ok and "cast to int first" in v.hint
