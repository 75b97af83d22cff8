"""The REG_OP-style declaration: the three rules, the C++ macro checks, shape/type inference."""

import numpy as np
import onnx
import pytest
from hypothesis import given, strategies as st
from onnx import helper

from fusionlab.build import make_model, tensor, value_info
from fusionlab.export import DeclarationError, compute, name_for, reg_op
from fusionlab.export.declare import canonical_dtype

F = ["DT_FLOAT16", "DT_FLOAT"]


def conv_relu(name="ConvRelu", end=None, *, stride_name="strides", x_types=F, fuses=("Conv", "Relu"),
              strides_type="ListInt", group_name="groups"):
    return (reg_op(name)
            .INPUT("x", x_types).INPUT("filter", F).OPTIONAL_INPUT("bias", F)
            .OUTPUT("y", F)
            .REQUIRED_ATTR(stride_name, strides_type).REQUIRED_ATTR("pads", "ListInt")
            .ATTR("dilations", "ListInt", [1, 1, 1, 1]).ATTR(group_name, "Int", 1)
            .ATTR("data_format", "String", "NCHW")
            .fuses(*fuses)
            .OP_END_FACTORY_REG(end or name))


def test_valid_declaration_builds_and_prints_the_reg_op_chain():
    d = conv_relu()
    text = str(d)
    assert text.splitlines()[0] == "REG_OP(ConvRelu)"
    assert "    .OPTIONAL_INPUT(bias, TensorType({DT_FLOAT16, DT_FLOAT}))" in text
    assert "    .ATTR(dilations, ListInt, {1, 1, 1, 1})" in text
    assert '    .ATTR(data_format, String, "NCHW")' in text
    assert text.splitlines()[-1] == "    .OP_END_FACTORY_REG(ConvRelu)"
    assert [s.op for s in d.body] == ["Conv", "Relu"]


def test_rule1_input_without_types():
    with pytest.raises(DeclarationError) as e:
        conv_relu(x_types=[])
    assert any(p.startswith("rule 1") and "INPUT(x)" in p for p in e.value.problems)


def test_rule1_unknown_type_name():
    with pytest.raises(DeclarationError, match="rule 1.*unknown type 'DT_FLAOT'"):
        conv_relu(x_types=["DT_FLAOT"])


@pytest.mark.parametrize("wrong, right", [("stride", "strides"), ("group", "groups")])
def test_rule2_suggests_the_builtin_attribute_name(wrong, right):
    kw = {"stride_name": wrong} if right == "strides" else {"group_name": wrong}
    with pytest.raises(DeclarationError) as e:
        conv_relu(**kw)
    assert f"did you mean `{right}`?" in str(e.value)
    assert "Conv2D" in str(e.value)


def test_rule2_padding_gets_pads():
    with pytest.raises(DeclarationError, match="did you mean `pads`"):
        (reg_op("ConvRelu").INPUT("x", F).INPUT("filter", F).OUTPUT("y", F)
         .REQUIRED_ATTR("padding", "ListInt").fuses("Conv", "Relu").OP_END_FACTORY_REG("ConvRelu"))


def test_rule2_attribute_type_must_match_the_builtin():
    with pytest.raises(DeclarationError, match="rule 2: attribute 'strides' is ListInt in the built-in Conv2D"):
        conv_relu(strides_type="Int")


@pytest.mark.parametrize("bad", ["MyOp", "CustomOp", "Op1", "FusedOp"])
def test_rule3_generic_names_are_rejected_with_a_suggestion(bad):
    with pytest.raises(DeclarationError) as e:
        conv_relu(name=bad)
    assert "rule 3" in str(e.value) and "'ConvRelu'" in str(e.value)


def test_rule3_name_must_mention_every_fused_op():
    with pytest.raises(DeclarationError, match="rule 3: 'ConvOnly' does not mention Relu"):
        conv_relu(name="ConvOnly")


def test_rule3_accepts_compound_names_and_folded_bn():
    assert conv_relu(name="ConvSilu", fuses=("Conv", "Sigmoid", "Mul")).name == "ConvSilu"
    assert conv_relu(name="ConvBnRelu").name == "ConvBnRelu"


def test_op_end_factory_reg_must_repeat_the_name():
    with pytest.raises(DeclarationError, match="OP_END_FACTORY_REG\\(ConvReLU\\) does not match REG_OP\\(ConvRelu\\)"):
        conv_relu(end="ConvReLU")


def test_bad_default_and_unknown_attr_type():
    with pytest.raises(DeclarationError) as e:
        (reg_op("ConvRelu").INPUT("x", F).INPUT("filter", F).OUTPUT("y", F)
         .ATTR("groups", "Int", "one").ATTR("pads", "ListInts", [0]).fuses("Conv", "Relu")
         .OP_END_FACTORY_REG("ConvRelu"))
    text = str(e.value)
    assert "default 'one' is not a Int" in text and "did you mean `ListInt`?" in text


def test_all_problems_reported_at_once():
    with pytest.raises(DeclarationError) as e:
        conv_relu(name="MyOp", x_types=[], stride_name="stride")
    rules = {p.split(":")[0] for p in e.value.problems}
    assert {"rule 1", "rule 2", "rule 3"} <= rules


def test_name_for_member_ops():
    assert name_for(["Conv", "Relu"]) == "ConvRelu"
    assert name_for(["Conv", "BatchNormalization", "Relu"]) == "ConvBnRelu"
    assert name_for(["MatMul", "Add", "Add"]) == "MatMulAdd"


def test_canonical_dtypes():
    assert canonical_dtype("float32") == "DT_FLOAT"
    assert canonical_dtype(np.float16) == "DT_FLOAT16"
    with pytest.raises(ValueError):
        canonical_dtype("complex256")


def _onnx_conv_shape(x_shape, w_shape, strides, pads, dilations, group):
    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=strides, pads=pads, dilations=dilations, group=group)
    m = make_model([node], [value_info("x", np.float32, list(x_shape))], [value_info("y", np.float32, None)],
                   [tensor("w", np.zeros(w_shape, np.float32))])
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    return tuple(d.dim_value for d in inferred.graph.output[0].type.tensor_type.shape.dim)


@pytest.mark.slow
@given(h=st.integers(5, 12), w=st.integers(5, 12), k=st.sampled_from([1, 3]), s=st.integers(1, 3),
       pt=st.integers(0, 2), pb=st.integers(0, 2), pl=st.integers(0, 2), pr=st.integers(0, 2),
       d=st.integers(1, 2), g=st.sampled_from([1, 2]))
def test_infer_matches_onnx_shape_inference_and_the_kernel(h, w, k, s, pt, pb, pl, pr, d, g):
    decl = conv_relu()
    attrs = {"strides": [1, 1, s, s], "pads": [pt, pb, pl, pr], "dilations": [1, 1, d, d], "groups": g}
    x_shape, w_shape = (1, 4, h, w), (6, 4 // g, k, k)
    out = decl.infer({"x": x_shape, "filter": w_shape, "bias": (6,)}, {"x": "float32"}, attrs)
    expected = _onnx_conv_shape(x_shape, w_shape, [s, s], [pt, pl, pb, pr], [d, d], g)
    assert out["y"] == (expected, "DT_FLOAT")
    y = compute(decl, np.ones(x_shape, np.float32), np.ones(w_shape, np.float32), np.zeros(6, np.float32), **attrs)
    assert y.shape == expected and y.dtype == np.float32


def test_infer_rejects_wrong_types_and_channel_mismatch():
    decl = conv_relu()
    with pytest.raises(ValueError, match="has type DT_INT32"):
        decl.infer({"x": (1, 4, 8, 8), "filter": (6, 4, 3, 3)}, {"x": "int32"}, {"strides": [1, 1, 1, 1], "pads": [0] * 4})
    with pytest.raises(ValueError, match="channels"):
        decl.infer({"x": (1, 3, 8, 8), "filter": (6, 4, 3, 3)}, None, {"strides": [1, 1, 1, 1], "pads": [0] * 4})
    with pytest.raises(ValueError, match="required attribute 'pads'"):
        decl.infer({"x": (1, 4, 8, 8), "filter": (6, 4, 3, 3)}, None, {"strides": [1, 1, 1, 1]})


def _matmul_add_relu():
    return (reg_op("MatMulAddRelu").INPUT("x1", F).INPUT("x2", F).INPUT("bias", F).OUTPUT("y", F)
            .ATTR("transpose_x1", "Bool", False).ATTR("transpose_x2", "Bool", False)
            .fuses("MatMul", "Add", "Relu").OP_END_FACTORY_REG("MatMulAddRelu"))


@pytest.mark.parametrize("t1,t2", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul_transpose_flags_are_honoured_by_infer_and_the_kernel(t1, t2):
    """CANN MatMul's transpose_x1/x2 swap an operand's last two axes; both the shape inference and the numpy kernel
    the custom op runs read them (they once ignored them: a transposed x2 of [N, K] inferred [M, K] or failed)."""
    rng = np.random.default_rng(0)
    m, k, n = 3, 5, 4
    x1 = rng.standard_normal((k, m) if t1 else (m, k)).astype(np.float32)
    x2 = rng.standard_normal((n, k) if t2 else (k, n)).astype(np.float32)
    bias = rng.standard_normal((n,)).astype(np.float32)
    decl = _matmul_add_relu()
    attrs = {"transpose_x1": t1, "transpose_x2": t2}
    shapes = decl.infer({"x1": x1.shape, "x2": x2.shape, "bias": bias.shape}, attrs=attrs)
    assert shapes["y"][0] == (m, n)
    want = np.maximum((x1.T if t1 else x1) @ (x2.T if t2 else x2) + bias, 0)
    np.testing.assert_allclose(compute(decl, x1, x2, bias, **attrs), want, rtol=1e-5, atol=1e-6)


def test_matmul_with_mismatched_inner_dimensions_names_the_op():
    with pytest.raises(ValueError, match="MatMulAddRelu: MatMul of .* does not multiply"):
        _matmul_add_relu().infer({"x1": (3, 5), "x2": (5, 4), "bias": (4,)}, attrs={"transpose_x2": True})
