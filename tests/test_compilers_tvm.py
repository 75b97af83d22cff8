"""fusionlab.compilers.tvm: TVM Relax FuseOps groups traced back to ONNX node names (skip without TVM)."""

import numpy as np
import pytest
from onnx import helper

from fusionlab.build import make_model, tensor, value_info
from fusionlab.compilers import tvm as tvm_groups

if not tvm_groups.available():
    pytest.skip("apache-tvm not installed (pip install -e '.[oracle]')", allow_module_level=True)


def conv_bn_relu_add():
    rng = np.random.default_rng(0)
    h = helper.make_node
    c = 8
    nodes = [h("Conv", ["x", "w"], ["c1"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             h("BatchNormalization", ["c1", "g", "b", "m", "v"], ["bn"], name="bn"),
             h("Relu", ["bn"], ["r"], name="relu"),
             h("ReduceMean", ["r", "axes"], ["mu"], name="mean", keepdims=1),
             h("Sub", ["r", "mu"], ["y"], name="sub")]
    inits = [tensor("w", rng.standard_normal((c, 3, 3, 3)).astype(np.float32)),
             tensor("g", np.ones(c, np.float32)), tensor("b", np.zeros(c, np.float32)),
             tensor("m", np.zeros(c, np.float32)), tensor("v", np.ones(c, np.float32)),
             tensor("axes", np.array([1], np.int64))]
    return make_model(nodes, [value_info("x", np.float32, [1, 3, 8, 8])], [value_info("y", np.float32, [1, c, 8, 8])],
                      inits, opset=18)


def test_groups_are_onnx_node_names_and_cover_every_compute_node():
    result = tvm_groups.relax_groups(conv_bn_relu_add())
    members = [n for g in result.groups for n in g]
    assert set(members) == {"conv", "bn", "relu", "mean", "sub"}
    assert not result.folded
    conv_group = next(g for g in result.groups if "conv" in g)
    assert {"bn", "relu"} <= set(conv_group)  # Conv takes its decomposed BN and the Relu (OutEWiseFusable)
    assert "mean" not in conv_group  # a reduction does not join a Conv's group
    assert result.functions_after < result.functions_before


def test_round_trips_through_a_dict():
    result = tvm_groups.relax_groups(conv_bn_relu_add())
    assert tvm_groups.TvmGrouping.from_dict(result.to_dict()) == result


def _chain(nodes, out_shape):
    return make_model(nodes, [value_info("x", np.float32, [4, 64])], [value_info("y", np.float32, out_shape)],
                      [tensor("axes", np.array([-1], np.int64))], opset=18)


def test_tvm_fuses_a_reduction_with_its_consumers_not_its_producers():
    """The rule notebook 15 explains the BERT disagreements with, checked on TVM itself."""
    h = helper.make_node
    epilogue = tvm_groups.relax_groups(_chain([h("Relu", ["x"], ["a"], name="relu"),
                                               h("ReduceMean", ["a", "axes"], ["b"], name="mean", keepdims=1),
                                               h("Exp", ["b"], ["y"], name="exp")], [4, 1]))
    assert sorted(map(sorted, epilogue.groups)) == [["exp", "mean"], ["relu"]]
    variance = tvm_groups.relax_groups(_chain([h("ReduceMean", ["x", "axes"], ["mu"], name="mean0", keepdims=1),
                                               h("Sub", ["x", "mu"], ["d"], name="sub"),
                                               h("Mul", ["d", "d"], ["d2"], name="square"),
                                               h("ReduceMean", ["d2", "axes"], ["y"], name="mean1", keepdims=1)], [4, 1]))
    assert sorted(map(sorted, variance.groups)) == [["mean0", "square", "sub"], ["mean1"]]
