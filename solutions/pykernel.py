"""The second exercise of notebook 16: the numpy kernel of MatMulAddRelu, run by onnxruntime as a custom op."""

import numpy as np


def matmul_add_relu(x1, x2, bias):
    """Reference: the MatMul (stacked matrices broadcast, as ONNX's), the bias, then the ReLU."""
    return np.maximum(np.matmul(x1, x2) + bias, 0)


def relu_before_bias(x1, x2, bias):
    """WRONG: the activation applied before the bias."""
    return np.maximum(np.matmul(x1, x2), 0) + bias


def with_np_dot(x1, x2, bias):
    """WRONG: np.dot, which for 3-D x2 takes a product over every pair of stacked matrices, not MatMul's."""
    return np.maximum(np.dot(x1, x2) + bias, 0)


def matmul_add_relu_stub(x1, x2, bias):
    raise NotImplementedError  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "pykernel"
REFERENCE = matmul_add_relu
WRONG = [(relu_before_bias, 0, "the ReLU applied before the bias"), (with_np_dot, 4, "np.dot is not MatMul")]
STUB = matmul_add_relu_stub
