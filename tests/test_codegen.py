"""Generated fused elementwise kernels equal the numpy chain and onnxruntime on the same chain."""

import numpy as np
import onnx
import pytest
from onnx import helper

from fusionlab.build import make_model, tensor, value_info
from fusionlab.graph import load
from fusionlab.lessons import codegen as ew
from fusionlab.verification import runtime

RTOL, ATOL = 1e-4, 1e-5  # fp32, as every fusion in fusionlab

# one spec covering every supported op, with scalar, per-channel and runtime operands
SHAPE = (2, 3, 5, 7)
BIAS = np.linspace(-0.5, 0.5, 3, dtype=np.float32).reshape(3, 1, 1)
SPEC = [("Mul", 1.5), ("Add", BIAS), ("Sub", "b"), ("Relu",), ("Add", 0.25), ("Sqrt",), ("Div", 1.7), ("Neg",),
        ("Exp",), ("Sigmoid",), ("Tanh",), ("Pow", 2.0), ("Erf",), ("Clip", 0.0, 0.6), ("Mul", "b"),
        ("Pow", 3.0), ("Abs",), ("Add", 1.0), ("Log",), ("Reciprocal",)]


@pytest.fixture(scope="module")
def kernel():
    return ew.fuse_elementwise(SPEC, shape=SHAPE)


def feeds(seed=0, shape=SHAPE):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal(shape).astype(np.float32), "b": rng.standard_normal(shape).astype(np.float32)}


def test_fused_equals_numpy_and_onnxruntime(kernel):
    f = feeds()
    fused = kernel(**f)
    ref = runtime.run(ew.chain_model(SPEC, SHAPE), f)["y"]  # onnxruntime, optimisations off
    np.testing.assert_allclose(fused, kernel.unfused(**f), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(fused, ref, rtol=RTOL, atol=ATOL)
    assert fused.dtype == np.float32 and fused.shape == SHAPE
    assert not np.allclose(fused, fused[0, 0, 0, 0])  # not a constant output


def test_positional_call_and_other_shapes_recompile(kernel):
    f = feeds(1, (2, 3, 4, 4))
    y = kernel(f["x"], f["b"])
    np.testing.assert_allclose(y, kernel.unfused(**f), rtol=RTOL, atol=ATOL)


def test_generated_source_merges_broadcast_dims(kernel):
    src = kernel.source
    # NCHW with a per-channel bias: (N, C, H*W) -> three loops, the bias indexed by channel only
    assert src.count("for i") == 3 and "c1_0[0, i1, 0]" in src
    # transcendentals are vectorisable helpers emitted once above the loop, not libm calls inside it
    assert src.count("def erf(x):") == 1 and src.count("def tanh(x):") == 1 and src.count("def exp(x):") == 1
    assert "math.erf" not in src and "math.exp" not in src
    assert src.index("def erf(x):") < src.index("def fused_kernel(")
    flat = ew.fuse_elementwise([("Mul", 2.0), ("Relu",)], shape=(4, 8))
    assert flat.source.count("for i") == 1  # same-shaped operands: one flat loop


def test_bytes_moved_before_and_after():
    k = ew.fuse_elementwise([("Mul", 2.0), ("Add", "b"), ("Relu",)], shape=(1000,))
    moved = k.bytes_moved()
    # unfused: Mul reads x writes t0; Add reads t0,b writes t1; Relu reads t1 writes y
    assert moved.before == (2 + 3 + 2) * 4000
    assert moved.after == 3 * 4000  # x and b once, y once
    assert moved.ratio == pytest.approx(7 / 3)


def test_compile_chain_from_graph_nodes_with_constant_nodes_and_clip_inputs():
    nodes = [helper.make_node("Constant", [], ["half"], value=helper.make_tensor("v", onnx.TensorProto.FLOAT, [], [0.5])),
             helper.make_node("Mul", ["x", "half"], ["h"], name="mul"),
             helper.make_node("Clip", ["h", "lo", "hi"], ["c"], name="clip"),
             helper.make_node("Add", ["c", "x"], ["y"], name="add"),
             helper.make_node("Sigmoid", ["c"], ["z"], name="sig")]
    model = make_model(nodes, [value_info("x", np.float32, [64])],
                       [value_info("y", np.float32, [64]), value_info("z", np.float32, [64])],
                       [tensor("lo", np.float32(-0.2)), tensor("hi", np.float32(0.3))])
    k = ew.compile_chain(load(model))
    assert k.inputs == ["x"] and sorted(k.outputs) == ["y", "z"]
    x = np.random.default_rng(2).standard_normal(64).astype(np.float32)
    got = k(x)
    ref = runtime.run(model, {"x": x})
    for name in ("y", "z"):
        np.testing.assert_allclose(got[name], ref[name], rtol=RTOL, atol=ATOL)
    sub = ew.compile_chain([n for n in load(model) if n.name in ("mul", "clip")])
    assert sub.outputs == ["c"]


def test_division_by_zero_gives_inf_not_an_exception():
    k = ew.fuse_elementwise([("Div", 0.0)], shape=(4,))
    x = np.array([1, -1, 0, 2], np.float32)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(k(x), x / np.float32(0))


def test_refuses_what_it_cannot_fuse():
    mm = make_model([helper.make_node("MatMul", ["x", "x"], ["y"], name="mm")],
                    [value_info("x", np.float32, [4, 4])], [value_info("y", np.float32, [4, 4])])
    with pytest.raises(ValueError, match="not an elementwise op"):
        ew.compile_chain(load(mm))
    pw = make_model([helper.make_node("Pow", ["x", "x"], ["y"], name="pow")],
                    [value_info("x", np.float32, [4])], [value_info("y", np.float32, [4])])
    with pytest.raises(ValueError, match="exponent of Pow"):
        ew.compile_chain(load(pw))
    with pytest.raises(ValueError, match="unsupported op"):
        ew.chain_model([("Softmax",)])
    k = ew.fuse_elementwise([("Relu",)], shape=(4,))
    with pytest.raises(TypeError, match="float64"):
        k(np.zeros(4))


# ---- the float32 approximations: accuracy on dense grids, special values, vectorisation ----------

def _grid(lo, hi, n=10_000_001):
    return np.linspace(lo, hi, n, dtype=np.float64).astype(np.float32)


def _run(op, x):
    return ew.fuse_elementwise([(op,)], shape=x.shape)(x).astype(np.float64)


def test_erf_approximation_error_on_a_dense_grid():
    x = _grid(-6.0, 6.0)
    err = np.abs(_run("Erf", x) - ew._np_erf(x.astype(np.float64)))  # vs libm's erf in float64
    assert err.max() <= 5e-7  # measured 3.8e-7 with FMA, 4.7e-7 without (module docstring)


def test_tanh_exp_sigmoid_approximation_errors_on_dense_grids():
    x = _grid(-10.0, 10.0)
    assert np.abs(_run("Tanh", x) - np.tanh(x.astype(np.float64))).max() <= 5e-7  # measured 3.3e-7
    x = _grid(-87.0, 88.7)
    ref = np.exp(x.astype(np.float64))
    assert (np.abs(_run("Exp", x) - ref) / ref).max() <= 2e-7  # measured 8.5e-8 relative
    x = _grid(-30.0, 30.0, 1_000_001)
    ref = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    assert np.abs(_run("Sigmoid", x) - ref).max() <= 2e-7  # measured 8.9e-8
    tiny = np.float32([1e-30, -1e-20, 1e-8, 3e-4])  # odd rationals keep relative accuracy near 0
    for op, f in (("Erf", ew._np_erf), ("Tanh", np.tanh)):
        ref = f(tiny.astype(np.float64))
        np.testing.assert_allclose(_run(op, tiny), ref, rtol=5e-7, atol=0)


def test_special_values_follow_libm():
    inf, nan = np.inf, np.nan
    x = np.float32([inf, -inf, nan, 0.0, 100.0, -100.0, -103.0, 88.0, 89.0])
    got = {op: _run(op, x) for op in ("Erf", "Tanh", "Exp", "Sigmoid")}
    np.testing.assert_array_equal(got["Erf"], [1, -1, nan, 0, 1, -1, -1, 1, 1])
    np.testing.assert_array_equal(got["Tanh"], [1, -1, nan, 0, 1, -1, -1, 1, 1])
    with np.errstate(over="ignore"):
        ref_exp = np.exp(x.astype(np.float64)).astype(np.float32)  # 0 / subnormal / huge / inf like libm
    np.testing.assert_array_equal(got["Exp"][[0, 1, 3, 4, 8]], [inf, 0, 1, inf, inf])
    assert np.isnan(got["Exp"][2])
    np.testing.assert_allclose(got["Exp"][[5, 6, 7]], ref_exp[[5, 6, 7]], rtol=1e-3)  # subnormals, near overflow
    assert got["Exp"][6] > 0
    np.testing.assert_array_equal(got["Sigmoid"][[0, 1, 3]], [1, 0, 0.5])
    assert np.isnan(got["Sigmoid"][2])
    # NaN in the middle of a chain reaches the output; infinities go through erf as +-1
    k = ew.fuse_elementwise([("Mul", 0.7071), ("Erf",), ("Add", 1.0), ("Mul", 0.5), ("Tanh",)], shape=(3,))
    y = k(np.float32([inf, -inf, nan]))
    np.testing.assert_allclose(y[:2], [np.tanh(1.0), 0.0], rtol=1e-6)
    assert np.isnan(y[2])


def test_transcendental_chain_vectorises_and_matches_onnxruntime():
    spec = [("Mul", 0.7071), ("Erf",), ("Add", 1.0), ("Mul", "x"), ("Mul", 0.5), ("Tanh",), ("Sigmoid",), ("Exp",)]
    x = np.random.default_rng(3).standard_normal(4096).astype(np.float32) * 4
    k = ew.fuse_elementwise(spec, shape=x.shape)
    np.testing.assert_allclose(k(x), runtime.run(ew.chain_model(spec, x.shape), {"x": x})["y"], rtol=RTOL, atol=ATOL)
    fn = k._compiled(k.source_for({"x": x.shape}))
    llvm_ir = "".join(fn.inspect_llvm().values())
    assert "vector.body" in llvm_ir  # LLVM's loop vectoriser widened the loop
    assert "@erf" not in llvm_ir and "@expf" not in llvm_ir and "@tanhf" not in llvm_ir  # no libm call left


def test_float64_kernels_keep_libm():
    k = ew.fuse_elementwise([("Erf",), ("Tanh",)], shape=(5,), dtype=np.float64)
    assert "math.erf" in k.source and "def erf" not in k.source
    x = np.linspace(-3, 3, 5)
    np.testing.assert_allclose(k(x), np.tanh(ew._np_erf(x)), rtol=1e-12)


def test_input_names_do_not_shadow_the_helpers():
    spec = [("Mul", "erf"), ("Erf",), ("Add", "ERF_A1")]
    k = ew.fuse_elementwise(spec, shape=(8,))
    rng = np.random.default_rng(4)
    f = {n: rng.standard_normal(8).astype(np.float32) for n in ("x", "erf", "ERF_A1")}
    np.testing.assert_allclose(k(**f), ew._np_erf(f["x"] * f["erf"]) + f["ERF_A1"], rtol=RTOL, atol=ATOL)


# -- the loop-vs-loop demonstration ----------------------------------------------------------------

def test_loop_vs_loop_counts_exactly_reads_plus_writes():
    spec = (("Mul", 2.0), ("Add", 1.0), ("Relu",))
    r = ew.loop_vs_loop(spec, n=10_000, measure=False)
    item = 4
    # fused: the input read once, the output written once; unfused: every op reads and writes a full tensor
    assert r.fused_bytes == 2 * r.n * item
    assert r.unfused_bytes == len(spec) * 2 * r.n * item
    assert r.ratio == pytest.approx(len(spec))
    assert r.max_abs_diff == 0.0  # same arithmetic, same rounding: bit-identical
    assert r.fused_source.count("for i0") == 1 and r.unfused_source.count("for i0") == len(spec)
    assert "3 ops on 10,000 float32 values" in r.bytes_table()
    with pytest.raises(ValueError, match="not measured"):
        r.gbs()


@pytest.mark.slow
def test_loop_vs_loop_constant_operands_count_once_and_default_size_leaves_the_cache():
    from fusionlab.cost import calibrate

    bias = np.linspace(-1, 1, 8, dtype=np.float32)
    r = ew.loop_vs_loop((("Add", bias), ("Relu",)), n=8, measure=False)
    assert r.fused_bytes == (8 + 8 + 8) * 4  # input, constant, output
    with pytest.raises(ValueError, match="scalar or constant operands only"):
        ew.loop_vs_loop((("Mul", "x"),), n=8, measure=False)
    assert ew.loop_vs_loop((("Relu",),), measure=False).n == calibrate.stream_elements()


def test_loop_vs_loop_measures_both_variants():
    r = ew.loop_vs_loop(n=4096, min_time=0.05)
    assert r.comparison is not None and r.comparison.a.median > 0 and r.comparison.b.median > 0
    rates, speedup = r.gbs(10.0).splitlines()
    assert rates.startswith("one loop per op ") and rates.endswith("; DRAM streaming bandwidth 10.0 GB/s")
    assert speedup == f"speed-up {r.comparison.speedup:.2f}x against a bytes ratio of {r.ratio:.2f}x"


def test_generated_source_fits_the_notebook_column(kernel):
    """Notebooks print generated kernels; a learner copies them, so the generator keeps lines short."""
    from fusionlab.text import MAX_WIDTH

    sources = [kernel.source, *ew._HELPERS.values()]
    assert all("erf" in s or "tanh" in s or "exp" in s for s in sources[1:])
    wide = [line for s in sources for line in s.splitlines() if len(line) > MAX_WIDTH]
    assert not wide, wide
