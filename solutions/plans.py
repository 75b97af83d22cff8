"""The exercise of notebook 03: the kernels each small graph launches after the vertical pass."""

#: Reference: A FusedConv; B Conv + QuickGelu; C the BN output escapes, so only Conv + BN fold (Conv, Relu);
#: D the Conv output escapes, nothing fuses; E the residual Add and Relu go into FusedConv's Z; F the sum escapes,
#: only the BN folds (Conv, Add, Relu, Sigmoid); G no fused kernel for Exp (Conv, Exp).
KERNELS = {"A": 1, "B": 2, "C": 2, "D": 4, "E": 1, "F": 4, "G": 2}

#: WRONG: SiLU counted as one FusedConv, like Relu (onnxruntime's FusedConv has no SiLU).
SILU_ONE_KERNEL = dict(KERNELS, B=1)

#: WRONG: every chain fused, as if no intermediate were read elsewhere or were a graph output.
NO_LEGALITY = dict(KERNELS, C=1, D=1, F=1)

#: WRONG: the Exp taken into the FusedConv too.
EXP_FUSED = dict(KERNELS, G=1)

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "plans"
REFERENCE = KERNELS
WRONG = [(SILU_ONE_KERNEL, 1, "QuickGelu"), (NO_LEGALITY, 2, "b is a graph output"), (EXP_FUSED, 6, "left alone: Exp")]
STUB = {k: ... for k in KERNELS}
