#!/usr/bin/env python3
"""GroupQueryAttention (rule `gqa`) against MultiHeadAttention after LLaMA's explicit repeat_kv (rule `attention`).

For the corpus LLaMA exports (tests/corpus/llama.*.onnx, 4 Q / 2 K/V heads of 16, batch 1, sequence 32 and 128)
and hand-built LLaMA attention blocks (tests/test_rules_attention.py's `gqa_model`: 8 Q / 2 K/V heads of 64, hidden 512,
rotary written out, causal + padding mask; sequence 128 and 512): both fused models are verified against the
original (fusionlab.verify: rtol 1e-4, atol 1e-5, also with a padded attention_mask for the corpus exports), then
timed against each other, interleaved (fusionlab.timing.compare), one intra-op thread, at ORT_DISABLE_ALL and at
ORT_ENABLE_ALL. ratio = time(MHA after the repeat) / time(GQA): > 1 means GroupQueryAttention is faster.
Writes benchmarks/results/gqa.md and gqa.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from common import RESULTS, ROOT, machine_line, markdown_table, parser

import fusionlab
from fusionlab import timing
from fusionlab.passes import fuse, vertical
from fusionlab.verification.runtime import make_feeds, session, verify

sys.path.insert(0, str(ROOT / "tests"))


def fused(model, gqa: bool):
    rules = vertical.DEFAULT_RULES + (("gqa",) if gqa else ())
    res = fuse(fusionlab.load(model), passes=("vertical",), rules=tuple(r for r in rules if gqa or r != "gqa"))
    return res.graph.to_proto(), res.plan.rule_counts()


def cases(quick: bool):
    from test_rules_attention import gqa_model

    for name in ("llama.ts-fold", "llama.ts-nofold", "llama.dynamo"):
        path = ROOT / "tests" / "corpus" / f"{name}.onnx"
        for seq in ((32,) if quick else (32, 128)):
            yield f"{name} (corpus)", path, {"batch": 1, "sequence": seq}, seq
    m = gqa_model(q_heads=8, kv_heads=2, hid=512, d=64)
    for seq in ((128,) if quick else (128, 512)):
        yield "LLaMA block 8 Q / 2 K/V heads of 64", m, {"batch": 1, "seq": seq}, seq


def padded(feeds: dict) -> dict:
    out = dict(feeds)
    for k, v in feeds.items():
        if "mask" in k and v.ndim == 2:
            m = np.ones_like(v)
            m[:, : max(1, v.shape[1] // 4)] = 0  # left padding: the first quarter of the keys
            out[k] = m
        if k == "keep":
            s = v.shape[-1]
            keep = np.tril(np.ones((s, s), bool))[None, None].repeat(v.shape[0], 0)
            keep[:, :, :, : s // 4] = False
            out[k] = keep
    return out


def main() -> int:
    ap = parser(__doc__)
    args = ap.parse_args()
    min_time = args.min_time or (0.2 if args.quick else 1.0)
    rounds = 3 if args.quick else 15
    rows, raw = [], []
    for label, model, dims, seq in cases(args.quick):
        mha, mha_counts = fused(model, gqa=False)
        gqa, gqa_counts = fused(model, gqa=True)
        assert gqa_counts.get("gqa", 0) >= 1 and mha_counts.get("attention", 0) >= 1, (gqa_counts, mha_counts)
        orig = fusionlab.load(model)
        feeds = make_feeds(orig, dims=dims)
        if "keep" in feeds:
            feeds["keep"] = np.tril(np.ones((seq, seq), bool))[None, None].repeat(dims["batch"], 0)
        ok = all(verify(orig, m, feeds=f).ok for m in (mha, gqa) for f in (feeds, padded(feeds)))
        res = {}
        for level in ("disable", "all"):
            a, b = session(mha, level), session(gqa, level)
            na, nb = [o.name for o in a.get_outputs()], [o.name for o in b.get_outputs()]
            c = timing.compare(lambda: a.run(na, feeds), lambda: b.run(nb, feeds), label_a="MHA after repeat",
                               label_b="GQA", min_time=min_time, min_rounds=rounds)
            res[level] = c
        nodes = (len(mha.graph.node), len(gqa.graph.node))
        rows.append([label, f"1x{seq}", f"{nodes[0]} / {nodes[1]}", "yes" if ok else "**NO**",
                     *(f"{res[k].speedup:.2f} ({res[k].ci_low:.2f}-{res[k].ci_high:.2f}) "
                       f"(GQA {timing.ratio_verdict(res[k].ci_low, res[k].ci_high)})" for k in ("disable", "all"))])
        raw.append({"case": label, "seq": seq, "nodes": nodes, "verified": ok,
                    **{k: res[k].ratios for k in res}})
        print(rows[-1], flush=True)
    head = ["model", "batch x seq", "nodes MHA / GQA", "both verified (incl. padded mask)",
            "MHA / GQA @DISABLE_ALL", "MHA / GQA @ALL"]
    text = "\n\n".join([
        "# GroupQueryAttention vs MultiHeadAttention after the repeat (rule gqa vs attention)",
        machine_line() + f"; 1 intra-op thread; ratio = time(MHA after repeat_kv) / time(GroupQueryAttention), "
        f"median of paired interleaved rounds (>= {rounds} rounds, >= {min_time} s per side), 95% CI; > 1: GQA faster.",
        "Made by `benchmarks/bench_gqa.py`. The machine is shared (2 cores, other jobs running).",
        markdown_table(head, rows)])
    (RESULTS / "gqa.md").write_text(text + "\n")
    (RESULTS / "gqa.json").write_text(json.dumps(raw, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
