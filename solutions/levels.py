"""The exercise of notebook 00: the op types onnxruntime runs for a chain at each optimisation level."""


def ort_ops(ops, level):
    """Reference: 'basic' folds each BatchNormalization that reads a Conv into it; 'extended' also makes a Conv and
    the Relu right after it (once folded) one FusedConv. 'disable' runs the graph as written."""
    out = []
    for op in ops:
        if level != "disable" and op == "BatchNormalization" and out and out[-1] == "Conv":
            continue  # folded into the Conv's weights and bias
        if level == "extended" and op == "Relu" and out and out[-1] == "Conv":
            out[-1] = "FusedConv"
            continue
        out.append(op)
    return out


def ort_ops_fused_at_basic(ops, level):
    """WRONG: thinks 'basic' already fuses the Conv and its Relu (FusedConv is an 'extended' fusion)."""
    return ort_ops(ops, "extended" if level == "basic" else level)


def ort_ops_fold_any_bn(ops, level):
    """WRONG: folds every BatchNormalization into the Conv, even one that reads the Relu after it."""
    if level == "disable":
        return list(ops)
    return ort_ops([op for op in ops if op != "BatchNormalization"], level)


def ort_ops_stub(ops, level):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "levels"
REFERENCE = ort_ops
WRONG = [(ort_ops_fused_at_basic, 1, "'extended' fusion"), (ort_ops_fold_any_bn, 5, "reads the Relu's")]
STUB = ort_ops_stub
