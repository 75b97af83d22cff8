"""Generated fused elementwise kernels equal the numpy chain and onnxruntime on the same chain."""

import numpy as np
import onnx
import pytest
from onnx import helper

from fusionlab import elementwise as ew
from fusionlab import runtime
from fusionlab.build import make_model, tensor, value_info
from fusionlab.graph import load

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
    assert "math.erf" in src and "def tanh" in src
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
