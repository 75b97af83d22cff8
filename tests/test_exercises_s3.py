"""The exercises of notebook 12 (decoderops, tokenrate): where their truth comes from, and that answers a little off,
or right only away from the hard corners, fail. (Notebook 11's kvcache and rotary are tested in test_exercises.py.)"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import fusionlab
from fusionlab.cost.devices import get as get_device
from fusionlab.exercises import core, decoderops, tokenrate
from fusionlab.lessons import decoding as dec
from fusionlab.passes import fuse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # solutions/ sits at the repository root
from solutions import decoderops as s_decoderops  # noqa: E402
from solutions import tokenrate as s_tokenrate  # noqa: E402


def test_decoderops_small_widths_count_what_notebook_12s_decoder_fuses_into():
    """The checker builds narrow decoders; at the notebook's widths the pass writes the same six ops, as many."""
    res = fuse(fusionlab.load(dec.llama_decoder(dec.LlamaConfig(), batch=1)), passes=("vertical",))
    ops = Counter(n.op_type for n in res.graph.to_proto().graph.node)
    want, why = decoderops.truth(decoderops.CASES[0].data)
    assert want == {op: ops.get(op, 0) for op in decoderops.OPS} and why == ""
    assert want["GroupQueryAttention"] == res.plan.rule_counts()["gqa"] == 2


def test_decoderops_cases_cover_every_attention_outcome():
    """GroupQueryAttention, MultiHeadAttention (no K/V head shared; batch not provably 1) and none (prefill only)."""
    outcomes = [decoderops.truth(c.data) for c in decoderops.CASES]
    assert {(w["GroupQueryAttention"] > 0, w["MultiHeadAttention"] > 0) for w, _ in outcomes} == \
        {(True, False), (False, True), (False, False)}
    assert "batch" in outcomes[5][1] and "present_value_0" in outcomes[6][1]


def test_decoderops_refuses_unknown_ops_and_non_dicts_in_one_line():
    def with_alias(*args):
        return s_decoderops.fused_ops(*args) | {"GQA": 2}

    v = decoderops.check(with_alias)
    assert v.status == core.FAIL and v.passed == 0 and "GQA is not one of the six" in v.hint
    v = decoderops.check(lambda *args: [("GroupQueryAttention", 2)])
    assert v.status == core.FAIL and "must return a dict" in v.hint and "\n" not in v.hint


def test_decoderops_gqa_with_equal_heads_fails_on_the_no_gqa_case():
    def gqa_whenever_cached(layers, heads, kv_heads, batch, past):
        return s_decoderops.fused_ops(layers, heads + 1, kv_heads, batch, past)

    v = decoderops.check(gqa_whenever_cached)
    assert v.status == core.FAIL and v.passed == 3 and "no K/V head is shared" in v.hint


def test_tokenrate_truth_is_the_lessons_model_and_batch_shares_the_weights():
    big, pro = tokenrate.BIG, get_device("Atlas 300I Pro")
    one = dec.modelled_decode(big, 4096, pro)
    assert one["bytes"] == dec.token_bytes(big, 4096, 1, 2)["total"] and one["batch"] == 1
    assert one["tokens_per_s_bound"] == 1 / max(one["t_memory_s"], one["t_compute_s"])
    two = dec.modelled_decode(big, 4096, pro, batch=2)
    assert two["bytes"] - one["bytes"] == one["bytes"] - dec.token_bytes(big, 4096, 1, 2)["weights"]
    assert two["flops"] == 2 * one["flops"]


def test_tokenrate_cases_hold_both_bounds_and_a_slightly_off_answer_fails():
    bounds = {m["t_memory_s"] > m["t_compute_s"] for m in (tokenrate.expected(c.data) for c in tokenrate.CASES)}
    assert bounds == {True, False}

    def slightly_off(cfg, context, batch, device):
        return s_tokenrate.tokens_per_second(cfg, context, batch, device) * 1.0001

    v = tokenrate.check(slightly_off)
    assert v.status == core.FAIL and v.passed == 0 and "that is" not in v.hint


def test_tokenrate_names_fp32_and_one_token_per_step():
    def fp32(cfg, context, batch, device):
        chip, b = device.one_chip(), dec.token_bytes(cfg, context, 1, dtype_bytes=4)
        nbytes = b["weights"] + batch * (b["total"] - b["weights"])
        flops = batch * dec.step_flops(cfg, context, 1)
        return batch / max(nbytes / chip.bandwidth, flops / chip.peak_flops("float16"))

    def per_step(cfg, context, batch, device):
        return s_tokenrate.tokens_per_second(cfg, context, batch, device) / batch

    v = tokenrate.check(fp32)
    assert v.status == core.FAIL and v.passed == 0 and "fp32 bytes" in v.hint
    v = tokenrate.check(per_step)
    assert v.status == core.FAIL and v.passed == 3 and "one token per step" in v.hint


def test_tokenrate_names_each_per_request_count_left_out_and_prints_digits_that_differ():
    def leaving_out(*keys):
        def answer(cfg, context, batch, device):
            chip, b = device.one_chip(), dec.token_bytes(cfg, context, 1, dtype_bytes=2)
            nbytes = b["weights"] + batch * (b["total"] - b["weights"] - sum(b[k] for k in keys))
            flops = batch * dec.step_flops(cfg, context, 1)
            return batch / max(nbytes / chip.bandwidth, flops / chip.peak_flops("float16"))
        return answer

    for keys, words in ((("embedding rows", "KV cache written"), "only the cache read"),
                        (("embedding rows",), "embedding row left out"),
                        (("KV cache written",), "new K/V left out")):
        v = tokenrate.check(leaving_out(*keys))
        assert v.status == core.FAIL and words in v.hint, (keys, v.hint)
        said, model = v.hint.split("you say ")[1].split(" tokens/s")[0], v.hint.split("the model says ")[1].split()[0]
        assert said != model and "% too many" in v.hint
        assert " 0 GFLOP" not in v.hint and " 0.0" not in v.hint.split("(")[1]


def test_tokenrate_small_steps_print_their_flops_in_mflop():
    def double(cfg, context, batch, device):
        return 2 * s_tokenrate.tokens_per_second(cfg, context, batch, device)

    hint = tokenrate._judge(double, tokenrate.CASES[2])
    assert "MFLOP a step" in hint and "MiB" in hint and "100% too many" in hint
