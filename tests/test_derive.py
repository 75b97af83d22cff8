"""The folding algebra, checked against readable numpy references (and those against onnxruntime)."""

import numpy as np
import pytest
from hypothesis import given, strategies as st
from onnx import helper

from fusionlab import build
from fusionlab.analysis import derive
from fusionlab.verification.runtime import run

FP32 = dict(rtol=1e-4, atol=1e-5)
FP64 = dict(rtol=1e-9, atol=1e-11)


# --------------------------------------------------------------------------------------------------
# strategies
# --------------------------------------------------------------------------------------------------

@st.composite
def conv_case(draw, transpose=False):
    """A random Conv/ConvTranspose layer: dims 1-3, groups (incl. depthwise), strides, pads, dilations."""
    nd = draw(st.integers(1, 3))
    group = draw(st.integers(1, 3))
    depthwise = draw(st.booleans())
    cg = 1 if depthwise else draw(st.integers(1, 3))
    og = 1 if depthwise else draw(st.integers(1, 3))
    max_k = {1: 4, 2: 3, 3: 2}[nd]
    k = [draw(st.integers(1, max_k)) for _ in range(nd)]
    dil = [draw(st.integers(1, 2)) for _ in range(nd)]
    strides = [draw(st.integers(1, 2)) for _ in range(nd)]
    pads = [draw(st.integers(0, 1)) for _ in range(2 * nd)]
    size = [draw(st.integers(dil[i] * (k[i] - 1) + 1, dil[i] * (k[i] - 1) + {1: 6, 2: 4, 3: 2}[nd]))
            for i in range(nd)]
    if transpose:  # pads must not crop away the whole output
        pads = [min(p, 0) for p in pads] if min(size) < 2 else pads
    bias = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    return dict(nd=nd, group=group, cg=cg, og=og, k=k, dil=dil, strides=strides, pads=pads, size=size,
                bias=bias, seed=seed, batch=draw(st.integers(1, 2)))


def bn_params(rng, c, dtype=np.float64):
    gamma = rng.uniform(0.5, 1.5, c) * rng.choice([-1, 1], c)
    beta = rng.standard_normal(c)
    mean = rng.standard_normal(c)
    var = rng.uniform(0.5, 2.0, c)
    return [a.astype(dtype) for a in (gamma, beta, mean, var)]


def conv_tensors(case, dtype, transpose=False):
    rng = np.random.default_rng(case["seed"])
    g = case["group"]
    c_in, c_out = g * case["cg"], g * case["og"]
    x = rng.standard_normal((case["batch"], c_in, *case["size"])).astype(dtype)
    wshape = (c_in, case["og"], *case["k"]) if transpose else (c_out, case["cg"], *case["k"])
    w = (rng.standard_normal(wshape) / np.sqrt(case["cg"] * np.prod(case["k"]))).astype(dtype)
    b = rng.standard_normal(c_out).astype(dtype) if case["bias"] else None
    return x, w, b, bn_params(rng, c_out, dtype)


def attrs(case):
    return dict(strides=case["strides"], pads=case["pads"], dilations=case["dil"], group=case["group"])


# --------------------------------------------------------------------------------------------------
# the references against onnxruntime
# --------------------------------------------------------------------------------------------------

def ort_conv(op, x, w, b, **kw):
    inputs = ["x", "w"] + (["b"] if b is not None else [])
    inits = [build.tensor("w", w)] + ([build.tensor("b", b)] if b is not None else [])
    node = helper.make_node(op, inputs, ["y"], **kw)
    model = build.make_model([node], [build.value_info("x", np.float32, x.shape)],
                             [build.value_info("y", np.float32, None)], inits)
    return run(model, {"x": x})["y"]


REF_CASES = [
    dict(size=(9, 8), w=(6, 2, 3, 3), group=3, strides=[2, 1], pads=[1, 0, 1, 2], dilations=[1, 2]),
    dict(size=(11,), w=(4, 4, 3), group=1, strides=[2], pads=[2, 1], dilations=[3]),
    dict(size=(4, 5, 3), w=(4, 1, 2, 3, 1), group=2, strides=[1, 2, 1], pads=[0, 1, 0, 1, 0, 1], dilations=[1, 1, 2]),
    dict(size=(7, 7), w=(8, 1, 3, 3), group=8, strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1]),  # depthwise
]


@pytest.mark.parametrize("case", REF_CASES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_conv_nd_matches_onnxruntime(case, with_bias):
    rng = np.random.default_rng(1)
    w = rng.standard_normal(case["w"]).astype(np.float32)
    x = rng.standard_normal((2, w.shape[1] * case["group"], *case["size"])).astype(np.float32)
    b = rng.standard_normal(w.shape[0]).astype(np.float32) if with_bias else None
    kw = {k: case[k] for k in ("group", "strides", "pads", "dilations")}
    expected = ort_conv("Conv", x, w, b, **kw)
    got = derive.conv_nd(x.astype(np.float64), w.astype(np.float64), b, **kw)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, **FP32)


TRANSPOSE_CASES = [
    dict(size=(4, 5), w=(4, 3, 3, 2), group=2, strides=[2, 1], pads=[1, 0, 0, 1], dilations=[1, 2], output_padding=[1, 0]),
    dict(size=(6,), w=(3, 2, 4), group=1, strides=[3], pads=[1, 2], dilations=[1], output_padding=[2]),
    dict(size=(3, 2, 3), w=(6, 1, 2, 2, 2), group=6, strides=[2, 1, 2], pads=[0, 0, 1, 0, 0, 0], dilations=[1, 1, 1], output_padding=[0, 0, 1]),
]


@pytest.mark.parametrize("case", TRANSPOSE_CASES)
def test_conv_transpose_nd_matches_onnxruntime(case):
    rng = np.random.default_rng(2)
    w = rng.standard_normal(case["w"]).astype(np.float32)
    x = rng.standard_normal((1, w.shape[0], *case["size"])).astype(np.float32)
    b = rng.standard_normal(w.shape[1] * case["group"]).astype(np.float32)
    kw = {k: case[k] for k in ("group", "strides", "pads", "dilations", "output_padding")}
    expected = ort_conv("ConvTranspose", x, w, b, **kw)
    got = derive.conv_transpose_nd(x.astype(np.float64), w.astype(np.float64), b, **kw)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, **FP32)


def test_batch_norm_matches_onnxruntime():
    rng = np.random.default_rng(3)
    y = rng.standard_normal((2, 5, 3, 4)).astype(np.float32)
    params = bn_params(rng, 5, np.float32)
    names = ["gamma", "beta", "mean", "var"]
    node = helper.make_node("BatchNormalization", ["y"] + names, ["z"], epsilon=1e-3)
    model = build.make_model([node], [build.value_info("y", np.float32, y.shape)],
                             [build.value_info("z", np.float32, None)],
                             [build.tensor(n, p) for n, p in zip(names, params)])
    np.testing.assert_allclose(derive.batch_norm(y, *params, eps=1e-3), run(model, {"y": y})["z"], **FP32)


def test_conv_nd_zero_padding_interior_and_corner():
    x = np.ones((1, 16, 32, 32), np.float32)
    w = np.ones((16, 16, 3, 3), np.float32)
    y = derive.conv_nd(x, w, pads=[1, 1, 1, 1])
    assert y[0, 0, 5, 5] == 16 * 9 and y[0, 0, 0, 0] == 16 * 4  # interior vs corner of zero padding


def test_conv_nd_rejects_channel_mismatch():
    with pytest.raises(ValueError, match="channels"):
        derive.conv_nd(np.ones((1, 4, 5, 5)), np.ones((2, 3, 3, 3)))


# --------------------------------------------------------------------------------------------------
# folding, against the unfused reference
# --------------------------------------------------------------------------------------------------

@given(conv_case())
def test_fold_conv_bn_fp64(case):
    x, w, b, (gamma, beta, mean, var) = conv_tensors(case, np.float64)
    eps = 1e-5
    unfused = derive.batch_norm(derive.conv_nd(x, w, b, **attrs(case)), gamma, beta, mean, var, eps)
    f = derive.fold_conv_bn(w, b, gamma, beta, mean, var, eps, group=case["group"])
    assert f.weight.dtype == np.float64 and f.bias.shape == (w.shape[0],) and not f.overflow
    np.testing.assert_allclose(derive.conv_nd(x, f.weight, f.bias, **attrs(case)), unfused, **FP64)


@given(conv_case())
def test_fold_conv_bn_fp32(case):
    x, w, b, (gamma, beta, mean, var) = conv_tensors(case, np.float32)
    unfused = derive.batch_norm(derive.conv_nd(x, w, b, **attrs(case)), gamma, beta, mean, var, np.float32(1e-5))
    assert unfused.dtype == np.float32
    f = derive.fold_conv_bn(w, b, gamma, beta, mean, var, 1e-5, group=case["group"])
    assert f.weight.dtype == np.float32 and f.bias.dtype == np.float32
    np.testing.assert_allclose(derive.conv_nd(x, f.weight, f.bias, **attrs(case)), unfused, **FP32)


@given(conv_case(transpose=True))
def test_fold_conv_transpose_bn_fp64(case):
    x, w, b, (gamma, beta, mean, var) = conv_tensors(case, np.float64, transpose=True)
    kw = attrs(case)
    unfused = derive.batch_norm(derive.conv_transpose_nd(x, w, b, **kw), gamma, beta, mean, var, 1e-5)
    f = derive.fold_conv_bn(w, b, gamma, beta, mean, var, 1e-5, group=case["group"], transpose=True)
    np.testing.assert_allclose(derive.conv_transpose_nd(x, f.weight, f.bias, **kw), unfused, **FP64)


def test_fold_conv_transpose_scales_axis_1_per_group():
    # group 2, C_in 4, C_out/group 3: output channel 3..5 live in rows 2..3, columns 0..2.
    w = np.ones((4, 3, 1))
    gamma = np.arange(1.0, 7.0)
    f = derive.fold_conv_bn(w, None, gamma, np.zeros(6), np.zeros(6), np.ones(6), 0.0, group=2, transpose=True)
    np.testing.assert_array_equal(f.weight[:2, :, 0], [[1, 2, 3]] * 2)
    np.testing.assert_array_equal(f.weight[2:, :, 0], [[4, 5, 6]] * 2)


def test_fold_conv_transpose_rejects_wrong_group():
    with pytest.raises(ValueError, match="ConvTranspose"):
        derive.fold_conv_bn(np.ones((4, 3, 1)), None, *[np.ones(5)] * 4, group=2, transpose=True)


@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 5), st.booleans(), st.booleans(), st.integers(0, 999))
def test_fold_matmul_and_gemm_bn(m, k, n, with_bias, trans_b, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k))
    w = rng.standard_normal((k, n))
    b = rng.standard_normal(n) if with_bias else None
    gamma, beta, mean, var = bn_params(rng, n)
    y = x @ w + (b if b is not None else 0)
    unfused = derive.batch_norm(y, gamma, beta, mean, var, 1e-5, axis=-1)
    if trans_b:
        f = derive.fold_gemm_bn(w.T.copy(), b, gamma, beta, mean, var, 1e-5, trans_b=True)
        assert f.weight.shape == (n, k)
        got = x @ f.weight.T + f.bias
    else:
        f = derive.fold_matmul_bn(w, b, gamma, beta, mean, var, 1e-5)
        got = x @ f.weight + f.bias
    np.testing.assert_allclose(got, unfused, **FP64)


def test_seed_formula_is_wrong_when_the_conv_has_a_bias():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 2, 5, 5))
    w = rng.standard_normal((3, 2, 3, 3))
    b = rng.standard_normal(3) + 2.0
    gamma, beta, mean, var = bn_params(rng, 3)
    unfused = derive.batch_norm(derive.conv_nd(x, w, b), gamma, beta, mean, var)
    s = gamma / np.sqrt(var + 1e-5)
    seed_bias = beta - gamma * mean / np.sqrt(var + 1e-5)                # the seed's b'
    seed_out = derive.conv_nd(x, w * s[:, None, None, None], seed_bias)  # drops s·b
    assert np.max(np.abs(seed_out - unfused)) > 0.1
    f = derive.fold_conv_bn(w, b, gamma, beta, mean, var)
    np.testing.assert_allclose(derive.conv_nd(x, f.weight, f.bias), unfused, **FP64)


def test_zero_variance_with_small_eps():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 2, 4, 4))
    w = rng.standard_normal((2, 2, 3, 3))
    gamma, beta, mean = np.array([1.0, -0.5]), np.array([0.1, 0.2]), np.array([0.3, -0.1])
    var = np.zeros(2)
    for eps in (1e-5, 1e-12):
        unfused = derive.batch_norm(derive.conv_nd(x, w), gamma, beta, mean, var, eps)
        f = derive.fold_conv_bn(w, None, gamma, beta, mean, var, eps)
        assert np.all(np.isfinite(f.weight)) and not f.overflow
        # outputs are O(1/sqrt(eps)): compare relative to their size
        np.testing.assert_allclose(derive.conv_nd(x, f.weight, f.bias), unfused, rtol=1e-9,
                                   atol=1e-12 * np.max(np.abs(unfused)))


# --------------------------------------------------------------------------------------------------
# fp16
# --------------------------------------------------------------------------------------------------

def test_fp16_overflow_is_detected():
    rng = np.random.default_rng(6)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float16)
    gamma = np.array([1.0, 1.0, 1000.0, 1.0], np.float16)
    var = np.array([1.0, 1.0, 0.0, 1.0], np.float16)         # σ² = 0: scale = 1000/√1e-5 ≈ 3.2e5
    zeros = np.zeros(4, np.float16)
    f = derive.fold_conv_bn(w, None, gamma, zeros, zeros, var)
    assert f.overflow and f.weight.dtype == np.float16 and np.isinf(f.weight[2]).any()
    r = derive.fold_fp16_report(w, None, gamma, zeros, zeros, var)
    assert r.overflow and r.overflow_fp16_arith
    assert 0 < r.n_overflow <= 27
    assert r.n_values == w.size + 4


def test_fp16_no_overflow_for_ordinary_params():
    rng = np.random.default_rng(7)
    w = rng.standard_normal((8, 4, 3, 3))
    b = rng.standard_normal(8)
    r = derive.fold_fp16_report(w, b, *bn_params(rng, 8))
    assert not r.overflow and not r.overflow_fp16_arith and r.n_overflow == 0
    # fp64-then-cast is correctly rounded: at most half an fp16 ulp (2^-11) of relative error ...
    assert 0 < r.max_rel_err_cast <= 2.0**-11
    # ... and no fp16 value can be closer to the truth, so fp16 arithmetic is never better
    assert r.max_rel_err_fp16 >= r.max_rel_err_cast
    assert r.n_differ > 0
    assert "max rel err" in r.summary()


@given(st.integers(0, 999), st.floats(1e-3, 1e2))
def test_fp16_arithmetic_never_beats_correct_rounding(seed, gamma_scale):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((3, 2, 2))
    gamma, beta, mean, var = bn_params(rng, 3)
    r = derive.fold_fp16_report(w, None, gamma * gamma_scale, beta, mean, var)
    assert r.max_rel_err_fp16 >= r.max_rel_err_cast
    if not r.overflow:
        assert r.max_rel_err_cast <= 2.0**-11


def test_fp16_subnormals_are_counted():
    w = np.full((2, 1, 1), 1e-3)
    gamma = np.array([1e-3, 1.0])     # channel 0 folds to 1e-6: below fp16's smallest normal
    r = derive.fold_fp16_report(w, None, gamma, np.zeros(2), np.zeros(2), np.ones(2), 0.0)
    assert r.n_subnormal == 1


# --------------------------------------------------------------------------------------------------
# counting work
# --------------------------------------------------------------------------------------------------

def test_conv_bn_work_by_hand():
    # 1 channel 3x3 input, 3x3 kernel: one output element, 9 MACs = 18 FLOPs.
    seed, one, folded = derive.conv_bn_work(1, 1, 1, (3, 3), (3, 3), dtype_bytes=4)
    assert (seed.launches, one.launches, folded.launches) == (5, 2, 1)
    assert folded.flops == 18 + 1                          # + the bias add
    assert seed.flops == 18 + 4 + 2                        # 4 elementwise steps + sqrt(var + eps)
    assert folded.bytes_moved == 4 * (9 + 9 + 1 + 1)       # x, W, b in; y out
    assert folded.intermediate_bytes == 0 and seed.intermediate_bytes == 4 * 8


def test_conv_bn_work_what_folding_saves():
    seed, one, folded = derive.conv_bn_work(1, 64, 64, (56, 56), (3, 3), pads=[1, 1, 1, 1])
    assert folded.flops / seed.flops > 0.99                # arithmetic: almost nothing saved
    assert folded.bytes_moved / seed.bytes_moved < 0.5     # memory traffic: most of it saved
    assert folded.bytes_moved < one.bytes_moved < seed.bytes_moved
    table = derive.work_table([seed, one, folded])
    assert table.count("\n") == 3 and "launches" in table


# --------------------------------------------------------------------------------------------------
# horizontal fusion: concatenated weights
# --------------------------------------------------------------------------------------------------

@given(st.lists(st.integers(1, 4), min_size=2, max_size=4), st.lists(st.booleans(), min_size=4, max_size=4),
       st.integers(1, 3), st.integers(0, 999))
def test_concat_conv_weights(sizes, has_bias, k, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 3, 6, 6))
    ws = [rng.standard_normal((n, 3, k, k)) for n in sizes]
    bs = [rng.standard_normal(n) if hb else None for n, hb in zip(sizes, has_bias)]
    kw = dict(strides=[2, 1], pads=[1, 0, 0, 1])
    w_cat, b_cat, split = derive.concat_conv_weights(ws, bs)
    assert split == sizes and w_cat.shape[0] == sum(sizes)
    assert (b_cat is None) == all(b is None for b in bs)
    fused = derive.conv_nd(x, w_cat, b_cat, **kw)
    parts = np.split(fused, np.cumsum(split)[:-1], axis=1)
    for part, w, b in zip(parts, ws, bs):
        np.testing.assert_allclose(part, derive.conv_nd(x, w, b, **kw), **FP64)


def test_concat_conv_weights_rejects_different_kernels():
    with pytest.raises(ValueError, match="differ"):
        derive.concat_conv_weights([np.ones((2, 3, 3, 3)), np.ones((2, 3, 1, 1))])


@given(st.lists(st.integers(1, 5), min_size=2, max_size=4), st.booleans(), st.booleans(), st.integers(0, 999))
def test_concat_matmul_weights(sizes, trans_b, with_bias, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, 4))
    ws = [rng.standard_normal((4, n)) for n in sizes]
    bs = [rng.standard_normal(n) if with_bias else None for n in sizes]
    stored = [w.T.copy() for w in ws] if trans_b else ws
    w_cat, b_cat, split = derive.concat_matmul_weights(stored, bs, trans_b=trans_b)
    assert split == sizes
    fused = x @ (w_cat.T if trans_b else w_cat) + (b_cat if b_cat is not None else 0)
    for part, w, b in zip(np.split(fused, np.cumsum(split)[:-1], axis=1), ws, bs):
        np.testing.assert_allclose(part, x @ w + (b if b is not None else 0), **FP64)


def test_concat_matmul_weights_scalar_bias_and_mismatch():
    w_cat, b_cat, _ = derive.concat_matmul_weights([np.ones((2, 3)), np.ones((2, 1))], [np.array(2.0), None])
    np.testing.assert_array_equal(b_cat, [2, 2, 2, 0])
    with pytest.raises(ValueError, match="K"):
        derive.concat_matmul_weights([np.ones((2, 3)), np.ones((3, 3))])


@pytest.mark.parametrize("trans_b", [False, True])
def test_fold_linear_affine_is_the_affine_map_after_the_product(trans_b):
    """W' = W·diag(s), b' = s·b + t: x @ W' + b' equals s·(x @ W + b) + t, with W stored as (K, N) or (N, K)."""
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((5, 4)), rng.standard_normal((4, 3))
    b, s, t = rng.standard_normal(3), rng.uniform(0.5, 2.0, 3), rng.standard_normal(3)
    stored = w.T.copy() if trans_b else w
    f = derive.fold_linear_affine(stored, b, s, t, trans_b=trans_b)
    w_new = f.weight.T if trans_b else f.weight
    np.testing.assert_allclose(x @ w_new + f.bias, s * (x @ w + b) + t, rtol=1e-12, atol=1e-12)
    assert not f.overflow
    no_bias = derive.fold_linear_affine(stored, None, s, t, trans_b=trans_b)
    np.testing.assert_allclose(x @ (no_bias.weight.T if trans_b else no_bias.weight) + no_bias.bias,
                               s * (x @ w) + t, rtol=1e-12, atol=1e-12)
