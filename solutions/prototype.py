"""The first exercise of notebook 16: MatMul + Add + ReLU declared REG_OP style."""

from fusionlab.export import reg_op

F = ["DT_FLOAT16", "DT_FLOAT"]


def declare_matmul_add_relu():
    """Reference: CANN MatMul's inputs and attributes, the bias for the Add, y of the inputs' types."""
    return (reg_op("MatMulAddRelu")
            .INPUT("x1", F)
            .INPUT("x2", F)
            .INPUT("bias", F)
            .OUTPUT("y", F)
            .ATTR("transpose_x1", "Bool", False)
            .ATTR("transpose_x2", "Bool", False)
            .fuses("MatMul", "Add", "Relu")
            .OP_END_FACTORY_REG("MatMulAddRelu"))


def declare_output_float_only():
    """WRONG: y declared DT_FLOAT only, while the inputs take DT_FLOAT16 too (y's dtype is the inputs')."""
    return (reg_op("MatMulAddRelu").INPUT("x1", F).INPUT("x2", F).INPUT("bias", F).OUTPUT("y", ["DT_FLOAT"])
            .ATTR("transpose_x1", "Bool", False).ATTR("transpose_x2", "Bool", False)
            .fuses("MatMul", "Add", "Relu").OP_END_FACTORY_REG("MatMulAddRelu"))


def declare_output_extra_int32():
    """WRONG: y declared with DT_INT32 besides the inputs' types, a dtype the fused body never produces."""
    return (reg_op("MatMulAddRelu").INPUT("x1", F).INPUT("x2", F).INPUT("bias", F)
            .OUTPUT("y", F + ["DT_INT32"]).ATTR("transpose_x1", "Bool", False).ATTR("transpose_x2", "Bool", False)
            .fuses("MatMul", "Add", "Relu").OP_END_FACTORY_REG("MatMulAddRelu"))


def declare_required_transposes():
    """WRONG: the transpose flags declared REQUIRED_ATTR; an ONNX MatMul node has none to give."""
    return (reg_op("MatMulAddRelu").INPUT("x1", F).INPUT("x2", F).INPUT("bias", F).OUTPUT("y", F)
            .REQUIRED_ATTR("transpose_x1", "Bool").REQUIRED_ATTR("transpose_x2", "Bool")
            .fuses("MatMul", "Add", "Relu").OP_END_FACTORY_REG("MatMulAddRelu"))


def declare_bias_first():
    """WRONG: bias declared before x2, so the chain's MatMul would multiply x1 by the bias."""
    return (reg_op("MatMulAddRelu").INPUT("x1", F).INPUT("bias", F).INPUT("x2", F).OUTPUT("y", F)
            .ATTR("transpose_x1", "Bool", False).ATTR("transpose_x2", "Bool", False)
            .fuses("MatMul", "Add", "Relu").OP_END_FACTORY_REG("MatMulAddRelu"))


def declare_matmul_add_relu_stub():
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "prototype"
REFERENCE = declare_matmul_add_relu
WRONG = [(declare_output_float_only, 0, "the output's types must be the inputs'"),
         (declare_output_extra_int32, 0, "the output's types must be the inputs'"),
         (declare_required_transposes, 1, "REQUIRED_ATTR"), (declare_bias_first, 0, "declare x1, x2, bias")]
STUB = declare_matmul_add_relu_stub
