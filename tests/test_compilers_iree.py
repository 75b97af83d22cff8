"""fusionlab.compilers.iree: dispatch counting, the compiled module and the per-op baseline (skip without IREE)."""

import numpy as np
import pytest
from onnx import helper

from fusionlab.build import make_model, tensor, value_info
from fusionlab.verification import runtime

iree = pytest.importorskip("fusionlab.compilers.iree")
if not iree.available():  # pragma: no cover - the default environment has IREE
    pytest.skip("iree-base-compiler / iree-base-runtime not installed", allow_module_level=True)


def chain():
    """x -> Mul(2) -> Add(1) -> Relu -> MatMul(W) -> Tanh: an elementwise chain, a matmul and its epilogue."""
    h = helper.make_node
    nodes = [h("Mul", ["x", "two"], ["a"], name="mul"), h("Add", ["a", "one"], ["b"], name="add"),
             h("Relu", ["b"], ["c"], name="relu"), h("MatMul", ["c", "w"], ["d"], name="matmul"),
             h("Tanh", ["d"], ["y"], name="tanh")]
    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    inits = [tensor("two", np.array(2.0, np.float32)), tensor("one", np.array(1.0, np.float32)), tensor("w", w)]
    return make_model(nodes, [value_info("x", np.float32, [16, 64])], [value_info("y", np.float32, [16, 32])], inits)


def test_elementwise_chain_becomes_one_dispatch_and_per_node_counts_add_up():
    model = chain()
    fused = iree.count_dispatches(model)
    per_node = iree.dispatches_per_node(model)
    assert [op for _, op, _ in per_node] == ["Mul", "Add", "Relu", "MatMul", "Tanh"]
    assert all(n >= 1 for *_, n in per_node)
    assert fused < sum(n for *_, n in per_node)  # IREE fused across nodes
    assert fused <= 2


def test_compiled_module_and_per_op_baseline_match_onnxruntime():
    model = chain()
    x = np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)
    ref = runtime.run(model, {"x": x})["y"]
    out = iree.Module(iree.compile_model(model)).run(x)[0]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    per_op = iree.PerOp(model)
    assert len(per_op) == 5
    np.testing.assert_allclose(per_op.run(x)[0], ref, rtol=1e-4, atol=1e-5)


def test_node_models_keep_constants_with_their_node():
    models = iree.node_models(chain())
    mul, ins, outs = models[0]
    assert ins == ["x"] and outs == ["a"]
    assert [t.name for t in mul.graph.initializer] == ["two"]
