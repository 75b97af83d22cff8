"""The exercise of notebook 05: which sibling ops the horizontal pass stacks into one wide op + Split."""


def can_stack(a, b):
    """Reference: one tensor read, one op type, constant weights, equal attributes with group 1, and equal weight
    shapes beyond the output axis (Conv: axis 0, the output channels; MatMul: axis 1, so the K rows must match)."""
    if a.reads != b.reads or a.op != b.op or a.weight is None or b.weight is None:
        return False
    if a.attrs != b.attrs or a.attrs.get("group", 1) != 1:
        return False
    if a.op == "Conv":
        return a.weight.shape[1:] == b.weight.shape[1:]
    return a.weight.shape[0] == b.weight.shape[0]


def can_stack_same_weight_shape(a, b):
    """WRONG: asks for equal weight shapes, as if the wide op needed equal widths (it stacks any widths)."""
    return can_stack(a, b) and a.weight.shape == b.weight.shape


def can_stack_any_attributes(a, b):
    """WRONG: checks the weights but not the attributes (a stride-2 Conv computes something else)."""
    return (a.reads == b.reads and a.op == b.op and a.weight is not None and b.weight is not None
            and a.weight.shape[1:] == b.weight.shape[1:] if a.op == "Conv" else can_stack(a, b))


def can_stack_grouped(a, b):
    """WRONG: forgets that a grouped Conv's output channels each read only their own group of inputs."""
    if a.reads != b.reads or a.op != b.op or a.weight is None or b.weight is None or a.attrs != b.attrs:
        return False
    return a.weight.shape[1:] == b.weight.shape[1:] if a.op == "Conv" else a.weight.shape[0] == b.weight.shape[0]


def can_stack_any_dilations(a, b):
    """WRONG: compares every attribute but the dilations (a dilated kernel reads other pixels)."""
    def rest(s):
        return {k: v for k, v in s.attrs.items() if k != "dilations"}
    if a.reads != b.reads or a.op != b.op or a.weight is None or b.weight is None:
        return False
    if rest(a) != rest(b) or a.attrs.get("group", 1) != 1:
        return False
    return a.weight.shape[1:] == b.weight.shape[1:] if a.op == "Conv" else a.weight.shape[0] == b.weight.shape[0]


def can_stack_stub(a, b):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "siblings"
REFERENCE = can_stack
WRONG = [(can_stack_same_weight_shape, 1, "the pass stacks them"), (can_stack_any_attributes, 3, "strides"),
         (can_stack_grouped, 6, "grouped convolution"), (can_stack_any_dilations, 5, "dilations")]
STUB = can_stack_stub
