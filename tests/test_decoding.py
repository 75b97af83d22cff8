"""fusionlab.lessons.decoding: the decoder graph and its cache, bytes per token, rotary, FlashDecoding's combine."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

import fusionlab
from fusionlab.cost import devices
from fusionlab.lessons import decoding as dec
from fusionlab.passes import fuse
from fusionlab.passes.vertical import DEFAULT_RULES
from fusionlab.verification import runtime

CFG = dec.LlamaConfig(vocab=128, hidden=64, heads=4, kv_heads=2, intermediate=96)


@pytest.fixture(scope="module")
def model():
    return dec.llama_decoder(CFG)


def _run(m, feeds):
    return runtime.run(m, feeds)


def test_the_decoder_is_valid_and_its_cache_grows(model):
    onnx.checker.check_model(model)
    ids = np.array([[3, 1, 4, 1, 5]], np.int64)
    out = _run(model, dec.feeds_for(CFG, ids))
    assert out["logits"].shape == (1, 5, CFG.vocab)
    assert out["present_key_0"].shape == (1, CFG.kv_heads, 5, CFG.head_dim)
    cache = {k.replace("present", "past"): v for k, v in out.items() if k.startswith("present")}
    step = _run(model, dec.feeds_for(CFG, np.array([[9]]), cache))
    assert step["present_value_1"].shape == (1, CFG.kv_heads, 6, CFG.head_dim)
    np.testing.assert_array_equal(step["present_value_1"][:, :, :5], out["present_value_1"])


def test_a_decode_step_with_the_cache_equals_the_whole_sequence_at_once(model):
    """The cache is exact: prefill of 5 then one step gives the last logits of a prefill of all 6 (causal mask
    and rotary positions from the cache's length)."""
    ids = np.array([[3, 1, 4, 1, 5, 9]], np.int64)
    whole = _run(model, dec.feeds_for(CFG, ids))
    part = _run(model, dec.feeds_for(CFG, ids[:, :5]))
    cache = {k.replace("present", "past"): v for k, v in part.items() if k.startswith("present")}
    step = _run(model, dec.feeds_for(CFG, ids[:, 5:], cache))
    np.testing.assert_allclose(step["logits"][:, 0], whole["logits"][:, 5], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(part["logits"], whole["logits"][:, :5], rtol=1e-4, atol=1e-5)


def test_a_wrong_position_would_be_seen(model):
    """The same check fails if the step's rotary position were wrong: feeding the token with an empty cache
    (position 0) gives other logits than at position 5."""
    ids = np.array([[3, 1, 4, 1, 5, 9]], np.int64)
    whole = _run(model, dec.feeds_for(CFG, ids))
    alone = _run(model, dec.feeds_for(CFG, ids[:, 5:]))
    assert not np.allclose(alone["logits"][:, 0], whole["logits"][:, 5], rtol=1e-4, atol=1e-5)


def test_fused_decoder_has_the_contrib_ops_and_the_same_outputs(model):
    res = fuse(fusionlab.load(model), passes=("vertical",))
    counts = res.plan.rule_counts()
    assert counts.get("rotary") == 2 * CFG.layers and counts.get("skip_rmsnorm") == 2 * CFG.layers
    assert counts.get("attention") == CFG.layers and counts.get("rmsnorm") == 1
    fused = res.graph.to_proto()
    ops = {n.op_type for n in fused.graph.node}
    assert {"RotaryEmbedding", "SkipSimplifiedLayerNormalization", "MultiHeadAttention", "RMSNormalization"} <= ops
    ids = np.array([[3, 1, 4, 1, 5]], np.int64)
    assert runtime.verify(model, fused, feeds=dec.feeds_for(CFG, ids)).ok
    cache = {k.replace("present", "past"): v for k, v in _run(model, dec.feeds_for(CFG, ids)).items()
             if k.startswith("present")}
    assert runtime.verify(model, fused, feeds=dec.feeds_for(CFG, np.array([[7]]), cache)).ok
    sa, sb = runtime.session(model, "disable"), runtime.session(fused, "disable")
    np.testing.assert_array_equal(dec.generate(sa, CFG, ids, 6), dec.generate(sb, CFG, ids, 6))


def test_generate_is_prefill_then_decode(model):
    sess = runtime.session(model, "disable")
    ids = np.array([[2, 7, 1]], np.int64)
    out = dec.generate(sess, CFG, ids, 4)
    assert out.shape == (1, 4)
    # token by token without the cache: each next token from the whole sequence so far
    seq = ids
    for t in range(4):
        nxt = _run(model, dec.feeds_for(CFG, seq))["logits"][:, -1].argmax(-1)
        assert nxt[0] == out[0, t]
        seq = np.concatenate([seq, nxt[:, None]], axis=1)


def test_prefill_only_graph_has_no_past_and_the_same_weights(model):
    m = dec.llama_decoder(CFG, past=False)
    assert [i.name for i in m.graph.input] == ["input_ids"]
    ids = np.array([[3, 1, 4]], np.int64)
    a, b = _run(m, {"input_ids": ids}), _run(model, dec.feeds_for(CFG, ids))
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_config_checks_and_counts():
    with pytest.raises(ValueError):
        dec.LlamaConfig(hidden=64, heads=4, kv_heads=3)
    c = dec.LlamaConfig(vocab=10, hidden=8, heads=2, kv_heads=1, intermediate=16, layers=1)
    # q 8x8, k 8x4, v 8x4, o 8x8, gate/up 8x16, down 16x8, lm head 8x10
    assert c.matmul_params() == 64 + 32 + 32 + 64 + 3 * 128 + 80
    assert c.params() == c.matmul_params() + 2 * 8 + 10 * 8 + 8
    assert c.kv_bytes_per_token(2) == 1 * 2 * 1 * 4 * 2
    assert c.kv_bytes_per_token(2, kv_heads=2) == 2 * c.kv_bytes_per_token(2)


def test_decode_is_memory_bound_and_prefill_is_not():
    cfg = dec.LlamaConfig()
    b = dec.token_bytes(cfg, context=100)
    assert b["total"] == sum(v for k, v in b.items() if k != "total")
    assert b["KV cache read"] == 100 * cfg.kv_bytes_per_token()
    one, many = dec.intensity(cfg, 0, 1), dec.intensity(cfg, 0, 512)
    assert 0.4 < one < 0.6  # fp32: 2 FLOPs per 4-byte weight
    assert many > 100 * one
    assert dec.step_flops(cfg, 0, 2) == 2 * dec.step_flops(cfg, 0, 1) + cfg.layers * 4 * cfg.hidden


def test_modelled_decode_uses_one_chip_of_the_duo():
    cfg = dec.LlamaConfig()
    duo, pro = devices.get("Atlas 300I Duo"), devices.get("Atlas 300I Pro")
    a, b = dec.modelled_decode(cfg, 256, duo), dec.modelled_decode(cfg, 256, pro)
    assert math.isclose(a["t_memory_s"], a["bytes"] / (duo.bandwidth / 2))
    assert a["t_memory_s"] > a["t_compute_s"]
    assert math.isclose(a["tokens_per_s_bound"], 1 / a["t_memory_s"])
    assert abs(a["t_memory_s"] / b["t_memory_s"] - 204.8 / 204.0) < 0.01


def test_rope_rotates_pairs_and_keeps_norms():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 8))
    y = dec.rope(x, [0, 1, 5])
    np.testing.assert_allclose(y[0], x[0])  # position 0: no turn
    pair = lambda t, i: np.hypot(t[..., i], t[..., i + 4])  # noqa: E731
    for i in range(4):
        np.testing.assert_allclose(pair(y, i), pair(x, i))
    # relative: q at m and k at n score as q at m+3 and k at n+3
    q, k = rng.standard_normal(8), rng.standard_normal(8)
    s1 = dec.rope(q[None], [7])[0] @ dec.rope(k[None], [2])[0]
    s2 = dec.rope(q[None], [10])[0] @ dec.rope(k[None], [5])[0]
    assert math.isclose(s1, s2, rel_tol=1e-12)
    assert not math.isclose(s1, dec.rope(q[None], [7])[0] @ dec.rope(k[None], [3])[0], rel_tol=1e-6)


@pytest.mark.parametrize("splits", [1, 3, 7, 64])
def test_flash_decode_equals_softmax_attention(splits):
    rng = np.random.default_rng(splits)
    q = rng.standard_normal((2, 1, 16)) * 3
    k, v = rng.standard_normal((2, 64, 16)) * 3, rng.standard_normal((2, 64, 16))
    out, parts = dec.flash_decode(q, k, v, splits)
    assert len(parts) == splits and parts[-1]["keys"][1] == 64
    np.testing.assert_allclose(out, dec.attention_reference(q, k, v), rtol=1e-12, atol=1e-13)


def test_a_combine_without_the_rescale_is_wrong():
    """Adding the chunks' partial outputs without exp(m_j - M) is not attention: the check would see it."""
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((1, 16)) * 3, rng.standard_normal((40, 16)) * 3, rng.standard_normal((40, 16))
    _, parts = dec.flash_decode(q, k, v, 4)
    naive = sum(p["o"] for p in parts) / sum(p["l"] for p in parts)
    assert not np.allclose(naive, dec.attention_reference(q, k, v), rtol=1e-6)
    with pytest.raises(ValueError):
        dec.flash_decode(q, k, v, 41)


def test_roofline_figure_draws_every_device_and_point():
    fig = dec.roofline_figure([("a", 1e12, 1e10), ("b", 1e14, 1e12)], [("decode", 0.5), ("prefill", 200.0)])
    ax = fig.axes[0]
    assert len(ax.lines) == 4 and len(ax.texts) == 2


@pytest.mark.parametrize("context", [0, 1, 9])
def test_decode_attention_forms_equal_the_float64_reference(context):
    feeds = dec.decode_attention_feeds(CFG, context, batch=2, seed=context)
    ref = dec.decode_attention_reference(CFG, feeds)
    for gqa in (False, True):
        m = dec.decode_attention(CFG, gqa=gqa)
        onnx.checker.check_model(m)
        out = _run(m, feeds)
        assert out["present_key"].shape == (2, CFG.kv_heads, context + 1, CFG.head_dim)
        for k in ref:
            np.testing.assert_allclose(out[k], ref[k], rtol=1e-4, atol=1e-5, err_msg=f"gqa={gqa} {k}")


def test_decode_attention_reference_reads_kv_head_h_over_group():
    """A reference that paired query head h with K/V head h % Nkv (tile, not repeat) would differ."""
    feeds = dec.decode_attention_feeds(CFG, 6, seed=3)
    ref = dec.decode_attention_reference(CFG, feeds)["out"]
    out = _run(dec.decode_attention(CFG, gqa=True), feeds)["out"]
    b, n, nkv, d = 1, CFG.heads, CFG.kv_heads, CFG.head_dim
    new = lambda t: t.reshape(b, 1, nkv, d).transpose(0, 2, 1, 3)  # noqa: E731
    k = np.concatenate([feeds["past_key"], new(feeds["k"])], axis=2)
    v = np.concatenate([feeds["past_value"], new(feeds["v"])], axis=2)
    q = feeds["q"].reshape(b, 1, n, d).transpose(0, 2, 1, 3)
    tiled = dec.attention_reference(q, np.tile(k, (1, CFG.group, 1, 1)), np.tile(v, (1, CFG.group, 1, 1)))
    tiled = tiled.transpose(0, 2, 1, 3).reshape(b, 1, n * d)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    assert not np.allclose(out, tiled, rtol=1e-4, atol=1e-5)


def test_the_exported_decode_attention_fuses_to_groupquery_attention_on_the_cache():
    m = dec.decode_attention(CFG, gqa=False)
    res = fuse(fusionlab.load(m), passes=("vertical",))
    assert res.plan.rule_counts() == {"gqa": 1}
    ops = [n.op_type for n in res.graph.to_proto().graph.node]
    assert "GroupQueryAttention" in ops and "Softmax" not in ops and "Concat" not in ops
    for ctx in (0, 5):
        assert runtime.verify(m, res.graph.to_proto(), feeds=dec.decode_attention_feeds(CFG, ctx, batch=2)).ok
    # rule gqa off: MultiHeadAttention after the repeat, which stays
    off = fuse(fusionlab.load(m), passes=("vertical",), rules=tuple(r for r in DEFAULT_RULES if r != "gqa"))
    ops = [n.op_type for n in off.graph.to_proto().graph.node]
    assert off.plan.rule_counts() == {"attention": 1} and "MultiHeadAttention" in ops and "Expand" in ops
    assert runtime.verify(m, off.graph.to_proto(), feeds=dec.decode_attention_feeds(CFG, 5)).ok
    assert [n.op_type for n in dec.decode_attention(CFG, gqa=True).graph.node].count("GroupQueryAttention") == 1


def test_the_decoder_at_batch_1_gets_groupquery_attention_with_its_cache():
    """Batch 1: GroupQueryAttention takes past_key/past_value for any number of new tokens; the fused decoder is
    the same function on a prefill, a decode step and a second prompt chunk after a cache."""
    m = dec.llama_decoder(CFG, batch=1)
    res = fuse(fusionlab.load(m), passes=("vertical",))
    assert res.plan.rule_counts().get("gqa") == CFG.layers and "attention" not in res.plan.rule_counts()
    fused = res.graph.to_proto()
    ids = np.array([[3, 1, 4, 1, 5]], np.int64)
    cache = {k.replace("present", "past"): v for k, v in _run(m, dec.feeds_for(CFG, ids)).items()
             if k.startswith("present")}
    for feeds in (dec.feeds_for(CFG, ids), dec.feeds_for(CFG, np.array([[7]]), cache),
                  dec.feeds_for(CFG, np.array([[7, 2, 6]]), cache)):
        assert runtime.verify(m, fused, feeds=feeds).ok
    # a symbolic batch with a symbolic prompt length: onnxruntime's kernel takes neither, the refusal says so
    sym = fuse(fusionlab.load(dec.llama_decoder(CFG)), passes=("vertical",))
    assert sym.plan.rule_counts().get("attention") == CFG.layers
    assert any("only at batch 1" in r.reason for r in sym.plan.why_not() if r.rule == "gqa")


def test_decode_attention_bytes_count_the_repeat():
    p, c = 100, CFG.kv_bytes_per_token() // CFG.layers
    g = dec.decode_attention_bytes(CFG, p, gqa=True)
    r = dec.decode_attention_bytes(CFG, p, gqa=False)
    assert g == (p + 2 * (p + 1)) * c
    assert r == (p + (p + 1) + (p + 1) + 2 * CFG.group * (p + 1)) * c  # Expand reads the present, then the copy
    assert r > g
