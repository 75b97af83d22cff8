"""Notebook 10's exercises (issue 21, the split of 09 | 10): the truth is the lesson's model, the hints name the
mistakes they claim to, and the notebook's cells hold the stubs the solutions declare."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fusionlab.cost import devices
from fusionlab.exercises import attnbytes, flashtile
from fusionlab.lessons import reductions as R

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # solutions/ sits at the repository root
from solutions import attnbytes as s_attnbytes  # noqa: E402
from solutions import flashtile as s_flashtile  # noqa: E402


# --- attnbytes -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", attnbytes.CASES, ids=lambda c: c.name[:30])
def test_attnbytes_truth_is_the_lessons_model(case):
    c = case.data
    model = R.attention_bytes(c.seq, c.head_dim, item=c.item, on_chip_bytes=c.on_chip)
    assert attnbytes.expected(c) == (model.unfused, model.flash)
    assert c.block == model.block_q and f"query tiles of {model.block_q}" in case.name


def test_attnbytes_cases_cover_a_partial_tile_a_single_tile_and_fp16():
    data = [c.data for c in attnbytes.CASES]
    assert any(c.seq % c.block for c in data)
    assert any(c.block >= c.seq for c in data)
    assert {c.item for c in data} == {2, 4}
    assert len({c.block for c in data}) >= 3  # the block is an input, not a constant the learner may type


def test_attnbytes_one_byte_off_fails_and_floats_of_the_right_value_pass():
    def off_by_one(seq, head_dim, item, block):
        u, t = s_attnbytes.attention_traffic(seq, head_dim, item, block)
        return u, t + 1

    v = attnbytes.check(off_by_one)
    assert not v.ok and v.passed == 0 and "tiled bytes" in v.hint and "too high" in v.hint
    assert attnbytes.check(lambda *a: tuple(float(x) for x in s_attnbytes.attention_traffic(*a))).ok


def test_attnbytes_hints_name_elements_and_the_missing_ends():
    def elements(seq, head_dim, item, block):
        u, t = s_attnbytes.attention_traffic(seq, head_dim, item, block)
        return u // item, t

    v = attnbytes.check(elements)
    assert not v.ok and "elements, not bytes" in v.hint

    def scores_only(seq, head_dim, item, block):
        return 6 * seq * seq * item, s_attnbytes.attention_traffic(seq, head_dim, item, block)[1]

    v = attnbytes.check(scores_only)
    assert not v.ok and "Q, K and V read and O written count too" in v.hint


def test_attnbytes_names_o_left_out_alone_and_with_the_scores_miscounted():
    def no_o_scores_twice(seq, head_dim, item, block):
        return (3 * seq * head_dim + 2 * seq * seq) * item, s_attnbytes.attention_traffic(seq, head_dim, item, block)[1]

    v = attnbytes.check(s_attnbytes.attention_traffic_no_output)
    assert not v.ok and v.passed == 0 and "O written left out" in v.hint and "counted" not in v.hint
    v = attnbytes.check(no_o_scores_twice)
    assert not v.ok and "O written left out" in v.hint and "counted 2 times" in v.hint


def test_attnbytes_wrong_shapes_of_answer_fail_without_a_traceback():
    v = attnbytes.check(lambda *a: 5)
    assert not v.ok and "must return (unfused, tiled)" in v.hint
    v = attnbytes.check(lambda *a: ("a", "b"))
    assert not v.ok and "two numbers of bytes" in v.hint


# --- flashtile -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", flashtile.CASES, ids=lambda c: c.name[:30])
def test_flashtile_truth_is_the_search_ascend_flash_tile_makes(case):
    c = case.data
    want = flashtile.expected(c)
    assert want > 0 and want % 16 == 0
    l1, ub = R.flash_buffers(want, c.head_dim)
    assert l1 <= c.l1_kb * 1024 and ub <= c.ub_kb * 1024
    l1, ub = R.flash_buffers(want + 16, c.head_dim)
    assert l1 > c.l1_kb * 1024 or ub > c.ub_kb * 1024
    for name in devices.load_devices():  # on a preset, the tile of notebook 10 §4's table
        dev = devices.get(name)
        if (dev.ub_kb, dev.l1_kb) == (c.ub_kb, c.l1_kb):
            assert R.ascend_flash_tile(name, 4096, c.head_dim).block_q == want


def test_flashtile_presets_follow_devices_json_and_one_case_is_bound_by_l1():
    names = " ".join(c.name for c in flashtile.CASES)
    for name in ("Atlas 300I Pro", "Atlas 800I A2 (Ascend 910B)"):
        dev = devices.get(name)
        assert f"{dev.name}'s core (UB {dev.ub_kb:g} KiB, L1 {dev.l1_kb:g} KiB)" in names
    bound_by_l1 = [c for c in flashtile.CASES
                   if R.flash_block(c.data.ub_kb * 1024, 1 << 40, c.data.head_dim) > flashtile.expected(c.data)]
    assert len(bound_by_l1) == 1 and "L1 is the tighter" in bound_by_l1[0].name


def test_flashtile_one_case_is_decided_by_the_running_max_and_sum():
    """Without the fp32 max and sum a tile one step larger fits the UB on exactly one case (the last), and on
    none of the presets."""
    without = [c for c in flashtile.CASES if s_flashtile.flash_block_no_row_stats(*vars(c.data).values())
               != flashtile.expected(c.data)]
    assert [c.name for c in without] == [flashtile.CASES[-1].name] and "running max and sum" in without[0].name
    c = flashtile.CASES[-1].data
    nxt = flashtile.expected(c) + 16
    l1, ub = R.flash_buffers(nxt, c.head_dim)
    assert l1 <= c.l1_kb * 1024 and ub - 2 * nxt * 4 <= c.ub_kb * 1024 < ub  # only the max and sum overflow


def test_flashtile_one_step_either_side_fails_with_the_buffers_that_decide():
    v = flashtile.check(lambda ub, l1, d: s_flashtile.flash_block(ub, l1, d) + 16)
    assert not v.ok and v.passed == 0 and "does not fit" in v.hint and "of UB" in v.hint
    v = flashtile.check(lambda ub, l1, d: s_flashtile.flash_block(ub, l1, d) - 16)
    assert not v.ok and v.passed == 0 and "still fits" in v.hint


def test_flashtile_names_kib_read_as_1000_bytes():
    def kb(ub_kb, l1_kb, head_dim):
        return s_flashtile.flash_block(ub_kb * 1000 / 1024, l1_kb * 1000 / 1024, head_dim)

    v = flashtile.check(kb)
    assert not v.ok and "KiB read as 1000 bytes" in v.hint


def test_flashtile_rejects_a_fraction():
    v = flashtile.check(lambda *a: 160.5)
    assert not v.ok and "whole number" in v.hint


# --- the notebook's cells --------------------------------------------------------------------------------------


@pytest.mark.parametrize("signature, check_call, stub", [
    ("def attention_traffic(seq, head_dim, item, block):", "exercises.attnbytes.check(attention_traffic)",
     s_attnbytes.STUB),
    ("def flash_block(ub_kb, l1_kb, head_dim):", "exercises.flashtile.check(flash_block)", s_flashtile.STUB),
])
def test_notebook_10_holds_the_stub_and_its_check(signature, check_call, stub):
    src = (ROOT / "notebooks_src" / "10_attention.py").read_text()
    assert signature in src and check_call in src
    body = src.split(signature)[1].split("\n\n")[0]
    assert body.strip().endswith("...  # your code here")
    assert stub(*([None] * (signature.count(",") + 1))) is None
