"""Shape gears, the bounded shape cache, padding (checked with real onnxruntime runs) and replay accounting."""

import itertools

import numpy as np
import onnx
import pytest

from fusionlab import zoo
from fusionlab.lessons import dynamic_shapes as D
from fusionlab.passes import fuse
from fusionlab.verification import runtime


# --------------------------------------------------------------------------------------------------
# gears
# --------------------------------------------------------------------------------------------------

def test_pow2_gears_halve_from_max_len():
    assert D.gears(512, 4) == (64, 128, 256, 512)
    assert D.gears(384, 3, "pow2") == (96, 192, 384)
    assert D.gears(512, 1) == (512,)


def test_linear_gears_are_equal_steps_and_end_at_max_len():
    assert D.gears(512, 4, "linear") == (128, 256, 384, 512)
    assert D.gears(10, 3, "linear") == (4, 7, 10)
    g = D.gears(500, 7, "linear")
    assert g[-1] == 500 and list(g) == sorted(set(g)) and len(g) == 7


@pytest.mark.parametrize("args", [(512, 0), (512, 101), (0, 2), (384, 9), (3, 4, "linear"), (512, 2, "log")])
def test_gear_arguments_are_checked(args):
    with pytest.raises(ValueError):
        D.gears(*args)


def test_gear_for_picks_the_smallest_gear_that_fits():
    g = (64, 128, 256, 512)
    assert [D.gear_for(n, g) for n in (1, 63, 64, 65, 128, 129, 511, 512)] == [64, 64, 64, 128, 128, 256, 512, 512]
    assert D.gear_for(100, (512, 128, 256)) == 128  # order of the gears given does not matter


def test_gear_for_refuses_what_no_gear_holds():
    with pytest.raises(ValueError, match="exceeds the largest gear 512"):
        D.gear_for(513, (64, 512))
    with pytest.raises(ValueError, match=">= 1"):
        D.gear_for(0, (64,))
    with pytest.raises(ValueError, match="no gears"):
        D.gear_for(5, ())


# --------------------------------------------------------------------------------------------------
# the cache
# --------------------------------------------------------------------------------------------------

def test_shape_key_is_the_shape_itself():
    assert D.shape_key([1, np.int64(128)]) == D.shape_key((1, 128)) == (1, 128)
    assert type(D.shape_key([np.int32(3)])[0]) is int
    feeds = {"b": np.zeros((1, 4)), "a": np.zeros((1, 4, 2))}
    assert D.shape_key(feeds) == (("a", (1, 4, 2)), ("b", (1, 4)))
    assert D.shape_key((1, -1)) != D.shape_key((1, -2))  # hash((1, -1)) == hash((1, -2)) in CPython
    with pytest.raises(TypeError):
        D.shape_key(1.5)


def test_lru_evicts_the_least_recently_used_and_counts():
    built = []
    cache = D.ShapeCache(lambda k: built.append(k) or f"op{k}", capacity=2)
    assert cache.get(1) == "op1" and cache.get(2) == "op2"
    assert cache.get(1) == "op1"            # hit: 1 becomes most recently used
    cache.get(3)                            # full: evicts 2, not 1
    assert cache.keys() == [1, 3] and cache.evicted == [2]
    assert 2 not in cache and 1 in cache
    cache.get(2)                            # rebuilt, evicts 1
    assert built == [1, 2, 3, 2]
    assert cache.stats() == {"hits": 1, "misses": 4, "evictions": 2, "entries": 2, "peak": 2,
                             "build_seconds": cache.build_seconds}
    assert len(cache) == 2


def test_equal_shapes_in_different_spellings_share_one_entry():
    cache = D.ShapeCache(lambda k: object(), capacity=None)
    a = cache.get((1, 128))
    assert cache.get([1, 128]) is a and cache.get((1, np.int64(128))) is a
    assert (cache.hits, cache.misses) == (2, 1)


def test_build_time_is_accumulated_on_misses_only():
    ticks = itertools.count(step=0.5)
    cache = D.ShapeCache(lambda k: k, capacity=4, timer=lambda: next(ticks))
    for k in (1, 2, 1, 1, 3):
        cache.get(k)
    assert cache.build_seconds == pytest.approx(3 * 0.5)


def test_unbounded_cache_grows_with_every_new_shape():
    cache = D.ShapeCache(lambda k: k, capacity=None)
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 513, size=2000)
    for n in lengths:
        cache.get((1, n))
    assert len(cache) == cache.misses == len(set(lengths.tolist())) > 400
    assert cache.evictions == 0 and cache.peak == len(cache)


@pytest.mark.parametrize("capacity", [0, -1, 1.5])
def test_capacity_is_checked(capacity):
    with pytest.raises(ValueError):
        D.ShapeCache(lambda k: k, capacity=capacity)


# --------------------------------------------------------------------------------------------------
# padding
# --------------------------------------------------------------------------------------------------

def _bert_feeds(n, seed=0):
    rng = np.random.default_rng(seed)
    return {"input_ids": rng.integers(1, 100, size=(2, n)).astype(np.int64),
            "attention_mask": np.ones((2, n), dtype=np.int64),
            "token_type_ids": np.ones((2, n), dtype=np.int64)}


def test_pad_feeds_pads_each_input_with_its_neutral_value():
    feeds = _bert_feeds(5)
    padded = D.pad_feeds(feeds, 8, pad_id=7)
    assert all(v.shape == (2, 8) for v in padded.values())
    assert (padded["input_ids"][:, 5:] == 7).all() and (padded["attention_mask"][:, 5:] == 0).all()
    assert (padded["token_type_ids"][:, 5:] == 0).all()
    for name in feeds:
        np.testing.assert_array_equal(padded[name][:, :5], feeds[name])
    assert D.pad_feeds(feeds, 8, pad_values={"token_type_ids": 1})["token_type_ids"][0, -1] == 1


def test_pad_feeds_refuses_what_it_cannot_pad():
    with pytest.raises(ValueError, match="down to"):
        D.pad_feeds(_bert_feeds(5), 4)
    with pytest.raises(ValueError, match="float"):
        D.pad_feeds({"x": np.zeros((1, 3), np.float32)}, 4)
    with pytest.raises(ValueError, match="disagree"):
        D.pad_feeds({"a": np.zeros((1, 3), np.int64), "b": np.zeros((1, 4), np.int64)}, 8)


def test_pad_then_unpad_round_trips():
    feeds = _bert_feeds(5)
    hidden = np.arange(2 * 8 * 3, dtype=np.float32).reshape(2, 8, 3)
    outs = D.unpad({"h": hidden, "pooled": np.ones((2, 3), np.float32)}, 5, padded=8)
    assert outs["h"].shape == (2, 5, 3) and outs["pooled"].shape == (2, 3)
    np.testing.assert_array_equal(outs["h"], hidden[:, :5])
    back = D.unpad(D.pad_feeds(feeds, 8), 5, padded=8)
    for name in feeds:
        np.testing.assert_array_equal(back[name], feeds[name])
    with pytest.raises(ValueError):
        D.unpad(outs, 9, padded=8)


@pytest.fixture(scope="module")
def tiny_bert():
    model = zoo.bert(layers=1, hidden=32, heads=2, intermediate=64, vocab=100, max_position=64)
    return fuse(model, passes=("vertical",)).graph


def test_padded_run_equals_unpadded_at_the_valid_positions(tiny_bert):
    sess = runtime.session(tiny_bert, "all")
    for n, gear in ((5, 16), (16, 16), (17, 64)):
        feeds = runtime.make_feeds(tiny_bert, dims={"batch": 2, "sequence": n}, seed=n)
        report = D.verify_padding(sess, feeds, gear)
        assert report.ok and [o.shape for o in report.outputs] == [(2, n, 32)]
        # and padding really changes what the model sees when the mask is not set to 0 at the pads
        names = [o.name for o in sess.get_outputs()]
        unmasked = D.pad_feeds(feeds, gear, pad_values={"attention_mask": 1})
        if gear > n:
            wrong = sess.run(names, unmasked)[0][:, :n]
            assert not np.allclose(wrong, sess.run(names, feeds)[0], rtol=1e-4, atol=1e-5)


def test_static_session_fixes_the_shape_and_matches_the_dynamic_one(tiny_bert):
    assert D.symbolic_dims(tiny_bert) == {"input_ids": ["batch", "sequence"], "attention_mask": ["batch", "sequence"]}
    static = D.static_session(tiny_bert, {"batch": 2, "sequence": 16})
    assert [i.shape for i in static.get_inputs()] == [[2, 16], [2, 16]]
    feeds = runtime.make_feeds(tiny_bert, dims={"batch": 2, "sequence": 11}, seed=3)
    report = D.verify_padding(runtime.session(tiny_bert, "all"), feeds, 16, padded_session=static)
    assert report.ok, report.table()
    with pytest.raises(Exception):  # a static session refuses other shapes
        static.run(None, D.pad_feeds(feeds, 12))


def test_static_session_checks_the_dimension_names(tiny_bert):
    with pytest.raises(ValueError, match="no input dimension named 'seq'"):
        D.static_session(tiny_bert, {"batch": 1, "seq": 8})
    with pytest.raises(ValueError, match="missing 'batch'"):
        D.static_session(tiny_bert, {"sequence": 8})


# --------------------------------------------------------------------------------------------------
# replay
# --------------------------------------------------------------------------------------------------

STREAM = [10, 100, 10, 300, 60, 100, 500]  # gears (64, 128, 256, 512): 64 128 64 512 64 128 512


def test_replay_exact_shapes_compiles_every_distinct_length():
    r = D.replay(STREAM, "exact", run_seconds=lambda n: n / 1000, build_seconds=2.0)
    assert (r.requests, r.compiles, r.hits, r.evictions, r.peak_cached) == (7, 5, 2, 0, 5)
    assert r.waste == 1.0 and r.useful_tokens == r.computed_tokens == 1080
    assert r.build_seconds == pytest.approx(10.0) and r.run_seconds == pytest.approx(1.080)
    assert r.total_seconds == pytest.approx(11.08)
    assert r.label == "exact shape, unbounded"


def test_replay_gears_with_lru_capacity():
    g = (64, 128, 256, 512)
    roomy = D.replay(STREAM, "gears", gears=g, capacity=4)
    assert (roomy.compiles, roomy.hits, roomy.evictions, roomy.peak_cached) == (3, 4, 0, 3)
    assert roomy.computed_tokens == 64 * 3 + 128 * 2 + 512 * 2 == 1472
    assert roomy.waste == pytest.approx(1472 / 1080)
    tight = D.replay(STREAM, "gears", gears=g, capacity=2)
    # LRU over 64 128 64 512 64 128 512: miss miss hit miss(evict 128) hit miss(evict 512) miss(evict 64)
    assert (tight.compiles, tight.hits, tight.evictions, tight.peak_cached) == (5, 2, 3, 2)
    timed = D.replay(STREAM, "gears", gears=g, capacity=2, run_seconds={64: 1.0, 512: 8.0}, build_seconds=5.0)
    assert timed.run_seconds == pytest.approx(3 * 1.0 + 2 * 2.0 + 2 * 8.0)  # 128 interpolated: 2.0
    assert timed.build_seconds == pytest.approx(5 * 5.0)


def test_replay_dynamic_compiles_once_and_never_pads():
    r = D.replay(STREAM, "dynamic", run_seconds=lambda n: 1.0, build_seconds=3.0)
    assert (r.compiles, r.hits, r.evictions, r.waste) == (1, 6, 0, 1.0)
    assert r.total_seconds == pytest.approx(3.0 + 7.0)


def test_replay_checks_its_arguments():
    with pytest.raises(ValueError, match="unknown policy"):
        D.replay(STREAM, "hash")
    with pytest.raises(ValueError, match="needs gears"):
        D.replay(STREAM, "gears")
    with pytest.raises(ValueError, match="exceeds"):
        D.replay([600], "gears", gears=(512,))
    with pytest.raises(ValueError, match="outside the measured range"):
        D.replay([600], "exact", run_seconds={64: 1.0, 512: 2.0})


def test_replay_table_lists_counts_and_optionally_times():
    rows = [D.replay(STREAM, "exact"), D.replay(STREAM, "gears", gears=(64, 128, 256, 512), capacity=2)]
    text = D.replay_table(rows)
    assert "gears 64/128/256/512, LRU 2" in text and "1.36x" in text and "total s" not in text
    assert "total s" in D.replay_table(rows, times=True)


def test_atc_arguments_list_one_value_per_dynamic_dimension():
    args = D.atc_dynamic_dims({"input_ids": (1, -1), "attention_mask": (1, -1)}, (512, 64, 128, 256))
    assert args == ('--input_shape="input_ids:1,-1;attention_mask:1,-1" --input_format=ND '
                    '--dynamic_dims="64,64;128,128;256,256;512,512"')
    assert D.atc_dynamic_dims({"data": (1, -1)}, (4, 8)).endswith('--dynamic_dims="4;8"')
    with pytest.raises(ValueError, match="from 2 to 100"):
        D.atc_dynamic_dims({"data": (1, -1)}, (512,))
    with pytest.raises(ValueError, match="no dynamic"):
        D.atc_dynamic_dims({"data": (1, 8)}, (4, 8))



def test_static_session_can_skip_an_onnxruntime_fusion(tiny_bert, tmp_path):
    dims = {"batch": 1, "sequence": 8}
    ops = {}
    for disable in ((), ("SkipLayerNormFusion",)):
        path = tmp_path / f"{len(disable)}.onnx"
        D.static_session(tiny_bert, dims, disable=disable, optimized_path=path)
        ops[disable] = {n.op_type for n in onnx.load(path).graph.node}
    assert "SkipLayerNormalization" in ops[()]  # onnxruntime fuses Add + LayerNorm once shapes are known
    assert "SkipLayerNormalization" not in ops[("SkipLayerNormFusion",)]


# --------------------------------------------------------------------------------------------------
# the best gears, the request stream, what onnxruntime runs
# --------------------------------------------------------------------------------------------------

def test_best_gears_is_the_brute_force_optimum():
    rng = np.random.default_rng(0)
    for _ in range(100):
        lengths = [int(n) for n in rng.integers(1, 60, int(rng.integers(1, 14)))]
        k = int(rng.integers(1, 5))
        got = D.best_gears(lengths, k)
        distinct = sorted(set(lengths))
        kk = min(k, len(distinct))
        best = min(sum(D.gear_for(n, s + (distinct[-1],)) for n in lengths)
                   for s in itertools.combinations(distinct[:-1], kk - 1))
        assert len(got) == kk and got[-1] == max(lengths) and set(got) <= set(lengths)
        assert sum(D.gear_for(n, got) for n in lengths) == best


def test_best_gears_beats_halvings_on_the_stream_and_checks_its_arguments():
    stream = D.request_lengths(2000)
    assert D.replay(stream, "gears", gears=D.best_gears(stream, 4)).waste <= D.replay(stream, "gears",
                                                                                       gears=D.gears(512, 4)).waste
    for bad in (([], 2), ([5, 0], 2), ([5], 0)):
        with pytest.raises(ValueError):
            D.best_gears(*bad)


def test_request_lengths_are_seeded_and_clipped():
    a, b = D.request_lengths(500), D.request_lengths(500)
    assert (a == b).all() and a.min() >= 8 and a.max() <= 512 and a.dtype.kind == "i"
    long = D.request_lengths(500, seed=1, median=384, sigma=0.25, min_len=257)
    assert long.min() >= 257 and not (long == D.request_lengths(500, seed=2, median=384, sigma=0.25,
                                                                min_len=257)).all()


def test_ort_ops_counts_what_onnxruntime_runs(tiny_bert):
    dynamic, static = D.ort_ops(tiny_bert), D.ort_ops(tiny_bert, {"batch": 1, "sequence": 16})
    assert dynamic != static and sum(dynamic.values()) > 0
    off = D.ort_ops(tiny_bert, disable=("SkipLayerNormFusion",))
    assert off["SkipLayerNormalization"] == 0 < dynamic["SkipLayerNormalization"]


def test_rss_is_a_positive_number_of_mib_on_linux():
    import sys
    if sys.platform.startswith("linux"):
        assert 1 < D.rss_mib() < 1e6
