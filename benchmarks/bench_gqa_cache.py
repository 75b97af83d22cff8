#!/usr/bin/env python3
"""GroupQueryAttention taking the KV cache (rule `gqa`) against MultiHeadAttention after repeat_kv (rule `gqa` off).

One layer's decode-step attention of a LLaMA-style decoder (fusionlab.lessons.decoding.decode_attention: 12 Q / 4
K/V heads of 64, this token's q/k/v and the past cache in, the context and the present cache out), as exported
(Concat of the past, repeat_kv, softmax attention), fused by the vertical pass with and without rule `gqa`, at
several context lengths; and the whole decoder (`llama_decoder`, 2 layers, batch 1) in a loop of decode steps
from a 32-token prompt. Each fused model is verified against the exported one (fusionlab.verify: rtol 1e-4,
atol 1e-5), then the two are timed interleaved (fusionlab.timing.compare), one intra-op thread, graph
optimisations off. ratio = time(MHA after the repeat) / time(GQA): > 1 means GroupQueryAttention is faster.
Writes benchmarks/results/gqa_cache.md.
"""

from __future__ import annotations

import numpy as np

from common import machine_line, markdown_table, parser, write_result

import fusionlab
from fusionlab import timing
from fusionlab.lessons import decoding as dec
from fusionlab.passes import fuse, vertical
from fusionlab.verification.runtime import session, verify


def both(model):
    """(GQA, MHA after the repeat): the vertical pass with and without rule gqa."""
    on = fuse(fusionlab.load(model), passes=("vertical",))
    off = fuse(fusionlab.load(model), passes=("vertical",), rules=tuple(r for r in vertical.DEFAULT_RULES if r != "gqa"))
    assert on.plan.rule_counts().get("gqa") and not off.plan.rule_counts().get("gqa")
    return on.graph.to_proto(), off.graph.to_proto()


def main() -> int:
    args = parser(__doc__).parse_args()
    min_time = args.min_time or (0.3 if args.quick else 2.0)
    rounds = 5 if args.quick else 30
    cfg = dec.LlamaConfig()
    rows = []
    attn = dec.decode_attention(cfg, gqa=False)
    gqa, mha = both(attn)
    for ctx in ((16, 4096) if args.quick else (16, 256, 1024, 4096)):
        feeds = dec.decode_attention_feeds(cfg, ctx)
        ok = verify(attn, gqa, feeds=feeds).ok and verify(attn, mha, feeds=feeds).ok
        a, b = session(mha, "disable"), session(gqa, "disable")
        c = timing.compare(lambda: a.run(None, feeds), lambda: b.run(None, feeds), min_time=min_time, min_rounds=rounds)
        rows.append([f"one layer's decode attention, {ctx} cached", "yes" if ok else "**NO**",
                     f"{c.speedup:.2f} ({c.ci_low:.2f}-{c.ci_high:.2f})", timing.ratio_verdict(c.ci_low, c.ci_high)])
        print(rows[-1], flush=True)
    model = dec.llama_decoder(cfg, batch=1)
    gqa, mha = both(model)
    sa, sb = session(mha, "disable"), session(gqa, "disable")
    prompt = np.arange(1, 33, dtype=np.int64)[None]
    tok, cache = dec.prefill(sa, cfg, prompt)
    ok = all(verify(model, m, feeds=f).ok for m in (gqa, mha)
             for f in (dec.feeds_for(cfg, prompt), dec.feeds_for(cfg, tok, cache)))
    same = np.array_equal(dec.decode(sa, cfg, tok, cache, 8)[0], dec.decode(sb, cfg, tok, cache, 8)[0])
    c = timing.compare(lambda: dec.decode(sa, cfg, tok, cache, 8), lambda: dec.decode(sb, cfg, tok, cache, 8),
                       min_time=min_time * 2, min_rounds=max(5, rounds // 2))
    rows.append(["decoder (2 layers, batch 1): 8 decode steps after 32 tokens",
                 "yes" if ok and same else "**NO**", f"{c.speedup:.2f} ({c.ci_low:.2f}-{c.ci_high:.2f})",
                 timing.ratio_verdict(c.ci_low, c.ci_high)])
    print(rows[-1], flush=True)
    text = "\n\n".join([
        "# GroupQueryAttention on the KV cache vs MultiHeadAttention after repeat_kv (rule gqa on / off)",
        machine_line() + "; 1 intra-op thread, graph optimisations off; ratio = time(MHA after the repeat) / "
        f"time(GroupQueryAttention), median of paired interleaved rounds (>= {rounds} rounds), 95% CI; > 1: GQA "
        "faster. Verified: both fused models against the exported one (rtol 1e-4, atol 1e-5).",
        "Made by `benchmarks/bench_gqa_cache.py`. The machine is shared (2 cores, other jobs running).",
        markdown_table(["case", "both verified", "MHA / GQA (95% CI)", "GQA is"], rows)])
    write_result("gqa_cache.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
