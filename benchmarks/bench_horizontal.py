#!/usr/bin/env python3
"""Horizontal fusion on Inception-style and BERT-style models.

For each model and size: our horizontally fused model (B) vs the original (A), both under
ORT_DISABLE_ALL (the rewrite alone) and both under ORT_ENABLE_ALL (what is left after onnxruntime's own
fusions); one intra-op thread, interleaved runs, median of paired ratios time(A)/time(B) with a 95% CI
(> 1: the fused model is faster). Every fused model is verified against its original at that size first.
Writes benchmarks/results/horizontal.md.
"""

from __future__ import annotations

from common import machine_line, markdown_table, parser, write_result

from fusionlab import zoo
from fusionlab.graph import load
from fusionlab.passes import fuse
from fusionlab.timing import compare_models
from fusionlab.verification.runtime import verify


def models(quick: bool):
    if quick:
        return [
            ("Inception-style (75 px, width 0.25)", zoo.inception(image_size=75, width=0.25),
             [{"batch": 1}, {"batch": 4}]),
            ("BERT-style (2 layers, hidden 128)", zoo.bert(layers=2, hidden=128, heads=2, intermediate=512),
             [{"batch": 1, "sequence": 16}, {"batch": 4, "sequence": 64}]),
        ]
    return [
        ("Inception-v3-style (149 px, width 0.5)", zoo.inception(image_size=149, width=0.5),
         [{"batch": 1}, {"batch": 8}]),
        ("BERT-style (4 layers, hidden 256, 4 heads)", zoo.bert(layers=4, hidden=256, heads=4, intermediate=1024),
         [{"batch": 1, "sequence": 32}, {"batch": 8, "sequence": 128}]),
    ]


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    min_time = args.min_time or (0.3 if args.quick else 2.0)
    rows = []
    for label, proto, sizes in models(args.quick):
        original = load(proto)
        result = fuse(original, ("horizontal",))
        groups = len(result.plan)
        for dims in sizes:
            report = verify(original, result.graph, dims=dims)
            if not report.ok:
                raise SystemExit(f"{label} {dims}: fused model does not verify\n{report.table()}")
            for level in ("disable", "all"):
                c = compare_models(original, result.graph, level_a=level, level_b=level, dims=dims,
                                   min_time=min_time)
                verdict = "fused faster" if c.ci_low > 1 else "original faster" if c.ci_high < 1 else "no clear difference"
                rows.append([label, ", ".join(f"{k} {v}" for k, v in dims.items()), f"{groups}", level,
                             f"{c.speedup:.3f}", f"{c.ci_low:.3f}–{c.ci_high:.3f}", f"{c.rounds}", verdict])
                print(" | ".join(rows[-1]), flush=True)
    table = markdown_table(["model", "sizes", "groups", "ORT level (both)", "A/B median", "95% CI", "rounds",
                            "verdict"], rows)
    text = "\n\n".join([
        "# Horizontal fusion: fused (B) vs original (A)",
        "Ratio = time(original) / time(fused), median of interleaved paired rounds, one intra-op thread; "
        "> 1 means the horizontally fused model is faster. Every fused model verified against the original "
        "(fp32 rtol 1e-4, atol 1e-5) at each size before timing.",
        table,
        machine_line() + (" (--quick: smoke test, not a result)" if args.quick else ""),
    ])
    write_result("horizontal.md", text)


if __name__ == "__main__":
    main()
