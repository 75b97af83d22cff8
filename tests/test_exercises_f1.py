"""Fixes of issue 21's first expert reading: notebook 00's levels exercise (its truth is onnxruntime's own optimised
graph), and the hints the readers found missing elsewhere (02's ConvTranspose axis 0, 05's dilations)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from fusionlab.compilers import ort
from fusionlab.exercises import core, levels, siblings, transposed

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # solutions/ sits at the repository root
from solutions import levels as s_levels  # noqa: E402
from solutions import transposed as s_transposed  # noqa: E402


def test_levels_truth_is_onnxruntime_at_every_level_of_every_chain():
    """The hand rule of the reference agrees with onnxruntime's optimised graph for each hidden chain at all three
    levels, not only the graded one; notebook 00's block gives three different graphs at the three levels."""
    for case in levels.CASES:
        for level in levels.LEVELS:
            got = ort.optimized_ops(levels.model(case.data.ops), level)
            want = Counter({op.split(":")[-1]: n for op, n in got.items()})
            assert Counter(s_levels.ort_ops(list(case.data.ops), level)) == want, (case.name, level)
    block = levels.CASES[0].data.ops
    graphs = {tuple(sorted(ort.optimized_ops(levels.model(block), lv).items())) for lv in levels.LEVELS}
    assert len(graphs) == 3


def test_levels_accepts_counts_and_domains_and_rejects_a_non_list():
    assert levels.check(lambda ops, level: Counter(s_levels.ort_ops(ops, level))).ok
    assert levels.check(lambda ops, level: ["com.microsoft:" + op if op == "FusedConv" else op
                                            for op in s_levels.ort_ops(ops, level)]).ok
    v = levels.check(lambda ops, level: "Conv")
    assert v.status == core.FAIL and "list of op types" in v.hint


def test_transposed_axis0_broadcast_error_is_named():
    v = transposed.check(s_transposed.fold_bn_axis0)
    assert v.status == core.FAIL and v.passed == 0 and "could not be broadcast" in v.hint and "axis 1" in v.hint


def test_siblings_dilation_case_differs_only_in_dilations():
    case = next(c.data for c in siblings.CASES if "dilat" in c.name)
    a, b = case.siblings
    diff = {k for k in a.attrs.keys() | b.attrs.keys() if a.attrs.get(k) != b.attrs.get(k)}
    assert diff == {"dilations"}


def test_levels_verdicts_print_the_same_every_time_and_within_110_characters():
    answers = (s_levels.ort_ops, s_levels.ort_ops_fused_at_basic, s_levels.ort_ops_fold_any_bn)
    first = [str(levels.check(a)) for a in answers]
    assert first == [str(levels.check(a)) for a in answers]
    assert all(len(line) <= 110 for text in first for line in text.splitlines())
