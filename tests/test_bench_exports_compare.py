"""benchmarks/bench_exports.py's comparison section: families counted from the fused ops each model holds, the reason
taken from fusionlab's own opt-in table or recorded near misses (nothing typed by hand)."""

from __future__ import annotations

import sys
from pathlib import Path

from onnx import helper as h

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_exports as B  # noqa: E402

from fusionlab.passes import vertical  # noqa: E402


def _model(*ops):
    nodes = [h.make_node(op.split(":")[-1], [], [f"o{i}"], domain="com.microsoft" if ":" in op else "")
             for i, op in enumerate(ops)]
    return h.make_model(h.make_graph(nodes, "g", [], []))


def test_fused_ops_counts_only_fused_op_types_beyond_the_original():
    original = B.op_counts(_model("LayerNormalization", "MatMul"))
    got = B.fused_ops(original, _model("LayerNormalization", "LayerNormalization", "MatMul",
                                       "com.microsoft:SkipLayerNormalization", "Add"))
    assert got == {"LayerNormalization": 1, "com.microsoft:SkipLayerNormalization": 1}


def test_comparison_names_where_the_other_tool_fuses_more_and_why():
    rows = [{"file": "m.onnx", "tool": "fusionlab vertical",
             "fused_ops": {"com.microsoft:GroupQueryAttention": 2, "LayerNormalization": 1},
             "why_not": {"rotary": "the cos is not one row per token"}},
            {"file": "m.onnx", "tool": "onnxscript optimize_for_ort",
             "fused_ops": {"com.microsoft:MultiHeadAttention": 2, "com.microsoft:SkipLayerNormalization": 4,
                           "com.microsoft:RotaryEmbedding": 4}}]
    text = B.comparison(rows)
    lines = [line for line in text.splitlines() if line.startswith("| m |")]
    assert len(lines) == 2  # attention is 2 against 2 (MHA and GQA are one family): not listed
    skip = next(line for line in lines if "skip_layernorm" in line)
    assert "| 0 | 4 (SkipLayerNormalization 4) |" in skip and vertical.OPT_IN_REASONS["skip_layernorm"] in skip
    rot = next(line for line in lines if "rotary" in line)
    assert "near miss rotary: the cos is not one row per token" in rot
    assert "1 export/family pairs" in text  # layernorm: fusionlab 1, the other 0


def test_every_opt_in_rule_has_a_reason_and_every_fused_op_a_family():
    assert set(vertical.OPT_IN_REASONS) == set(vertical.RULE_NAMES) - set(vertical.DEFAULT_RULES)
    assert set(B.FUSED_OP_FAMILY.values()) <= set(B.FAMILY_RULES)
    for rules in B.FAMILY_RULES.values():
        assert set(rules) <= set(vertical.RULE_NAMES)
