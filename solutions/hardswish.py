"""The exercise of notebook 01: HardSwish written as a chain of steps `codegen` can fuse."""

#: Reference: x * clip(x + 3, 0, 6) / 6 (YOLOv5's and Keras' form; x * clip(x / 6 + 0.5, 0, 1) passes too)
HARD_SWISH = [("Add", 3.0), ("Clip", 0.0, 6.0), ("Mul", "x"), ("Div", 6.0)]

#: WRONG: no Clip, x * (x + 3) / 6: right between the bends, a parabola beyond them
NO_CLIP = [("Add", 3.0), ("Mul", "x"), ("Div", 6.0)]

#: WRONG: forgets the multiply by x: that is HardSigmoid, clip(x + 3, 0, 6) / 6
NO_MUL_X = [("Add", 3.0), ("Clip", 0.0, 6.0), ("Div", 6.0)]

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "hardswish"
REFERENCE = HARD_SWISH
WRONG = [(NO_CLIP, 1, "no Clip"), (NO_MUL_X, 0, "HardSigmoid")]
STUB = ...  # the notebook's stub: hard_swish = ...
