"""The exercise of notebook 04: erf-GELU written out as torch's TorchScript exporter writes it."""

import math

from onnx import helper


def _const(name, value):
    return helper.make_node("Constant", [], [name], value_float=value)


def gelu_nodes(x, y):
    """Reference: Div(x, sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5, the TorchScript exporter's order."""
    return [_const(f"{y}_sqrt2", math.sqrt(2.0)), _const(f"{y}_one", 1.0), _const(f"{y}_half", 0.5),
            helper.make_node("Div", [x, f"{y}_sqrt2"], [f"{y}_div"]),
            helper.make_node("Erf", [f"{y}_div"], [f"{y}_erf"]),
            helper.make_node("Add", [f"{y}_erf", f"{y}_one"], [f"{y}_add"]),
            helper.make_node("Mul", [x, f"{y}_add"], [f"{y}_mul"]),
            helper.make_node("Mul", [f"{y}_mul", f"{y}_half"], [y])]


def gelu_nodes_tanh(x, y):
    """WRONG: the tanh approximation's constants, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))."""
    c = [_const(f"{y}_three", 3.0), _const(f"{y}_k", 0.044715), _const(f"{y}_s", math.sqrt(2 / math.pi)),
         _const(f"{y}_one", 1.0), _const(f"{y}_half", 0.5)]
    return c + [helper.make_node("Pow", [x, f"{y}_three"], [f"{y}_cube"]),
                helper.make_node("Mul", [f"{y}_cube", f"{y}_k"], [f"{y}_kc"]),
                helper.make_node("Add", [x, f"{y}_kc"], [f"{y}_in"]),
                helper.make_node("Mul", [f"{y}_in", f"{y}_s"], [f"{y}_arg"]),
                helper.make_node("Tanh", [f"{y}_arg"], [f"{y}_tanh"]),
                helper.make_node("Add", [f"{y}_tanh", f"{y}_one"], [f"{y}_add"]),
                helper.make_node("Mul", [x, f"{y}_add"], [f"{y}_mul"]),
                helper.make_node("Mul", [f"{y}_mul", f"{y}_half"], [y])]


def gelu_nodes_no_half(x, y):
    """WRONG: forgets the final Mul by 0.5."""
    return [_const(f"{y}_sqrt2", math.sqrt(2.0)), _const(f"{y}_one", 1.0),
            helper.make_node("Div", [x, f"{y}_sqrt2"], [f"{y}_div"]),
            helper.make_node("Erf", [f"{y}_div"], [f"{y}_erf"]),
            helper.make_node("Add", [f"{y}_erf", f"{y}_one"], [f"{y}_add"]),
            helper.make_node("Mul", [x, f"{y}_add"], [y])]


def gelu_nodes_rounded(x, y):
    """WRONG, though onnxruntime agrees within fp32 tolerances: Mul by 0.7071 for 1 / sqrt 2. The rule takes exact
    constants only, so nothing fuses."""
    nodes = gelu_nodes(x, y)
    nodes[0] = _const(f"{y}_rsqrt2", 0.7071)
    nodes[3] = helper.make_node("Mul", [x, f"{y}_rsqrt2"], [f"{y}_div"])
    return nodes


def gelu_nodes_stub(x, y):
    raise NotImplementedError  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "gelu"
REFERENCE = gelu_nodes
WRONG = [(gelu_nodes_tanh, 0, "tanh approximation"), (gelu_nodes_no_half, 0, "the 0.5 is missing"),
         (gelu_nodes_rounded, 0, "not 0.7071")]
STUB = gelu_nodes_stub
