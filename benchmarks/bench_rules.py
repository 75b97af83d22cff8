#!/usr/bin/env python3
"""Per-rule micro-benchmarks: is each vertical rule's rewrite faster than what it replaces?

A rule is on by default only if its rewrite measures faster (README, "Working on fusionlab"). Each case is
a small model holding one instance of the pattern at a realistic size; the fused model is verified against
the original, then both run interleaved at the same onnxruntime level: `disable` (the rewrite alone) and
`extended` (does onnxruntime already do it itself?). One thread, medians of paired ratios with 95% CIs.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from common import markdown_table, parser, write_result

from fusionlab import timing, verify
from fusionlab.build import make_model, tensor, value_info
from fusionlab.passes import fuse
from fusionlab.passes.vertical import DEFAULT_RULES
from fusionlab.zoo import tanh_gelu


def pad_pool(op: str, size: int):
    value = 0.0 if op == "AveragePool" else -np.inf
    return make_model([helper.make_node("Pad", ["x", "pads", "v"], ["p"], mode="constant"),
                       helper.make_node(op, ["p"], ["y"], kernel_shape=[3, 3])],
                      [value_info("x", shape=[1, 64, size, size])], [value_info("y", shape=[1, 64, size, size])],
                      [tensor("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)), tensor("v", np.float32(value))],
                      opset=19)


def gelu_tanh(form: str, tokens: int, hidden: int, bias: bool):
    nodes, inits = tanh_gelu(form, "xb" if bias else "x")
    if bias:
        nodes = [helper.make_node("Add", ["x", "bias"], ["xb"])] + nodes
        inits = inits + [tensor("bias", np.linspace(-0.1, 0.1, hidden, dtype=np.float32))]
    return make_model(nodes, [value_info("x", shape=[1, tokens, hidden])],
                      [value_info("y", shape=[1, tokens, hidden])], inits, opset=17)


def skip_layernorm(tokens: int, hidden: int):
    rng = np.random.default_rng(0)
    return make_model([helper.make_node("Add", ["x", "r"], ["s"]),
                       helper.make_node("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1, epsilon=1e-12)],
                      [value_info("x", shape=[1, tokens, hidden]), value_info("r", shape=[1, tokens, hidden])],
                      [value_info("y", shape=[1, tokens, hidden])],
                      [tensor("g", rng.standard_normal(hidden).astype(np.float32)),
                       tensor("b", rng.standard_normal(hidden).astype(np.float32))], opset=17)


def main() -> int:
    args = parser(__doc__).parse_args()
    min_time = args.min_time or (0.2 if args.quick else 2.0)
    size, tokens, hidden = (28, 32, 256) if args.quick else (56, 128, 768)
    cases = [
        ("pad_pool", f"Pad + AveragePool, 1x64x{size}x{size}", pad_pool("AveragePool", size)),
        ("pad_pool", f"Pad(-inf) + MaxPool, 1x64x{size}x{size}", pad_pool("MaxPool", size)),
        ("fast_gelu", f"tanh-GELU (Pow form), 1x{tokens}x{hidden}", gelu_tanh("pow", tokens, hidden, False)),
        ("fast_gelu", f"bias + tanh-GELU (onnxruntime's form), 1x{tokens}x{hidden}", gelu_tanh("ort", tokens, hidden, True)),
        ("skip_layernorm", f"Add + LayerNormalization, 1x{tokens}x{hidden}", skip_layernorm(tokens, hidden)),
    ]
    rows = []
    for rule, what, model in cases:
        fused = fuse(model, passes=("vertical",), rules=(rule,))
        assert fused.plan.rule_counts() == {rule: 1}, fused.plan.rule_counts()
        report = verify(model, fused.graph)
        assert report.ok, report.table()
        cells = []
        for level in ("disable", "extended"):
            c = timing.compare_models(model, fused.graph, level_a=level, level_b=level, min_time=min_time,
                                      label_a="original", label_b="fused")
            cells.append(f"{c.speedup:.2f}x ({c.ci_low:.2f}-{c.ci_high:.2f})")
        ops = ", ".join(f"{k}x{v}" if v > 1 else k for k, v in fused.after.items())
        rows.append([rule, "yes" if rule in DEFAULT_RULES else "no (opt-in)", what, ops, *cells])
    text = "# Vertical rules one by one: rewrite vs the ops it replaces\n\n" + markdown_table(
        ["rule", "on by default", "pattern", "fused to", "speedup, optimisations off (95% CI)",
         "speedup, both at onnxruntime EXTENDED (95% CI)"], rows) + (
        "\n\nSpeedup = original time / fused time, median of paired interleaved runs, one thread; every fused "
        "model verified first. Under EXTENDED a ratio near 1 means onnxruntime already makes the same fusion "
        "itself; above 1, fusionlab's rewrite finds what onnxruntime's pattern does not." +
        (" (--quick: a smoke test, not a result)" if args.quick else ""))
    write_result("rules.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
