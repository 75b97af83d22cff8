"""fusionlab.lessons.reductions: the one-pass loops, the generated kernels and the traffic models."""

import numpy as np
import pytest

from fusionlab.lessons import reductions as R
from fusionlab.verification import runtime

RNG = np.random.default_rng(0)


def rows(m=33, n=257, scale=3.0, offset=0.0):
    return (RNG.standard_normal((m, n)) * scale + offset).astype(np.float32)


@pytest.mark.parametrize("block", [1, 7, 64, 1000])
def test_online_softmax_matches_the_three_pass_softmax(block):
    x = rows()
    np.testing.assert_allclose(R.online_softmax(x, block), R.softmax_reference(x), rtol=1e-5, atol=1e-7)


def test_online_softmax_survives_large_logits():
    x = rows(scale=1.0, offset=80.0)  # exp(80) overflows float32: the running max keeps it finite
    y = R.online_softmax(x, 16)
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("block", [1, 16, 100])
def test_welford_and_two_moment_give_mean_and_variance(block):
    x = rows()
    for moments in (R.welford, R.two_moment):
        mean, var = moments(x, block)
        np.testing.assert_allclose(mean, x.astype(np.float64).mean(axis=1), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(var, x.astype(np.float64).var(axis=1), rtol=1e-4)


def test_two_moment_cancels_where_welford_does_not():
    x = rows(scale=1.0, offset=1000.0)  # |mean| >> std: E[x^2] - E[x]^2 loses the variance's digits
    exact = x.astype(np.float64).var(axis=1)
    err_w = np.abs(R.welford(x)[1] - exact).max()
    err_t = np.abs(R.two_moment(x)[1] - exact).max()
    assert err_w < 1e-3 < err_t


def test_layernorm_loop_matches_reference():
    x = rows()
    g, b = RNG.standard_normal(x.shape[1]).astype(np.float32), RNG.standard_normal(x.shape[1]).astype(np.float32)
    np.testing.assert_allclose(R.layernorm_loop(x, g, b), R.layernorm_reference(x, g, b), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n,bq,bk", [(1, 64, 64), (100, 32, 16), (257, 64, 128), (64, 64, 64)])
def test_flash_attention_matches_unfused_attention(n, bq, bk):
    q, k, v = (RNG.standard_normal((n, 32)).astype(np.float32) for _ in range(3))
    np.testing.assert_allclose(R.flash_attention(q, k, v, bq, bk), R.attention_reference(q, k, v), rtol=1e-4, atol=1e-5)


def test_exp_helper_error_bound_and_special_values():
    x = np.linspace(-87.0, 0.0, 2_000_001, dtype=np.float32)
    exact = np.exp(x.astype(np.float64))
    assert np.max(np.abs(R.exp_neg(x) - exact) / exact) < 5e-7
    out = R.exp_neg(np.float32([-np.inf, -200.0, 0.0, np.nan]))
    assert out[0] == 0 and out[1] == 0 and out[2] == 1 and np.isnan(out[3])


@pytest.mark.parametrize("shape", [(5, 3), (17, 1000), (4, 8)])
def test_softmax_kernel_matches_onnxruntime(shape):
    x = rows(*shape)
    ref = runtime.run(R.softmax_model(*shape, decomposed=False), {"x": x})["y"]
    np.testing.assert_allclose(R.softmax_kernel()(x), ref, rtol=1e-4, atol=1e-6)
    assert "m7" in R.softmax_kernel().source  # the row max is unrolled over LANES accumulators


def test_layernorm_kernel_matches_onnxruntime():
    m, n = 19, 333
    model = R.layernorm_model(m, n, decomposed=False)
    x = rows(m, n, offset=5.0)
    from onnx import numpy_helper

    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    ref = runtime.run(model, {"x": x})["y"]
    np.testing.assert_allclose(R.layernorm_kernel()(x, inits["gamma"], inits["beta"]), ref, rtol=1e-4, atol=1e-5)


def test_decomposed_graphs_compute_the_single_ops():
    x = rows(8, 64)
    for build in (R.softmax_model, R.layernorm_model):
        a = runtime.run(build(8, 64, decomposed=True), {"x": x})["y"]
        b = runtime.run(build(8, 64, decomposed=False), {"x": x})["y"]
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_traffic_is_the_triton_count_for_softmax():
    m, n = 64, 128
    t = R.traffic(R.softmax_model(m, n))
    reads = sum(r for *_, r, _ in t.rows)
    writes = sum(w for *_, w in t.rows)
    axes = 8  # the int64 axes input, read by both reductions
    assert reads == 4 * (5 * m * n + 2 * m) + 2 * axes
    assert writes == 4 * (3 * m * n + 2 * m)
    assert t.fused == 4 * 2 * m * n


def test_attention_model_and_mha_agree():
    feeds = {n: RNG.standard_normal((2, 16, 32)).astype(np.float32) for n in "qkv"}
    a = runtime.run(R.attention_model(2, 16, 4, 8), feeds)["y"]
    b = runtime.session(R.mha_model(2, 16, 4, 8), "all", 1).run(None, feeds)[0]
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    ref = R.attention_reference(*(f.reshape(2, 16, 4, 8).transpose(0, 2, 1, 3) for f in feeds.values()))
    np.testing.assert_allclose(a, ref.transpose(0, 2, 1, 3).reshape(2, 16, 32), rtol=1e-4, atol=1e-5)


def test_attention_bytes_unfused_grows_with_the_square_and_flash_reads_qkv_at_least_once():
    small, big = R.attention_bytes(256, 64), R.attention_bytes(4096, 64)
    assert big.unfused / small.unfused > 200  # 16x the sequence: ~256x the score traffic
    for b in (small, big):
        assert b.flash >= 4 * 4 * b.seq * b.head_dim  # q, k, v read and o written at least once
        assert b.flash < b.unfused


def test_ascend_tile_fits_the_buffers_of_each_device():
    from fusionlab.cost import devices

    for name, dev in devices.load_devices().items():
        t = R.ascend_flash_tile(name, 4096, 128)
        assert t.l1_bytes <= dev.l1_kb * 1024 and t.ub_bytes <= dev.ub_kb * 1024
        assert t.block_q % 16 == 0 and t.hbm_bytes < t.unfused_bytes
        l1, ub = R.flash_buffers(t.block_q + 16, 128)  # one step larger no longer fits
        assert l1 > dev.l1_kb * 1024 or ub > dev.ub_kb * 1024


def test_one_head_on_a_two_chip_card_runs_on_one_chip():
    """The 300I Duo is two 310P3: one head sees one chip's bandwidth and peak, so it is no faster than a 300I Pro."""
    from fusionlab.cost import devices

    duo, pro = devices.get("Atlas 300I Duo"), devices.get("Atlas 300I Pro")
    assert duo.chips == 2 and pro.chips == 1
    assert duo.chip_bandwidth == duo.bandwidth / 2
    t_duo, t_pro = R.ascend_flash_tile(duo, 4096, 128), R.ascend_flash_tile(pro, 4096, 128)
    card_bw = max(t_duo.hbm_bytes / duo.bandwidth, 4 * 4096 * 4096 * 128 / duo.peak_flops("float16")) * 1e6
    assert t_duo.time_us > 1.5 * card_bw  # not the whole card's bandwidth
    assert abs(t_duo.time_us - t_pro.time_us) / t_pro.time_us < 0.05  # 408/2 GB/s is within 1% of 204.8


def test_generated_row_kernels_fit_the_notebook_column():
    from fusionlab.text import MAX_WIDTH

    for source in (R.softmax_kernel().source, R.layernorm_kernel().source):
        wide = [line for line in source.splitlines() if len(line) > MAX_WIDTH]
        assert not wide, wide
