"""The third exercise of notebook 01: tanh built from np.exp, whole-array and safe where e^(2x) overflows."""

import math

import numpy as np


def tanh(x):
    """Reference: clamp as MLAS does (+-9, where tanh is 1 in float32), then the exp form. NaN passes the clamp."""
    e = np.exp(2 * np.clip(x, -9.0, 9.0))
    return (e - 1) / (e + 1)


def tanh_textbook(x):
    """WRONG: the textbook form without a clamp: e^(2x) is inf above about 44.4, and inf / inf is NaN."""
    e = np.exp(2 * x)
    return (e - 1) / (e + 1)


def tanh_sinh_cosh(x):
    """WRONG: sinh / cosh: survives until e^|x| overflows (about 88.7), then inf / inf is NaN."""
    return np.sinh(x) / np.cosh(x)


def tanh_scalar_branch(x):
    """WRONG: a Python branch on the array (a scalar helper's habit): ValueError on any array."""
    if x > 9:
        return 1.0
    return (math.exp(2 * x) - 1) / (math.exp(2 * x) + 1)


def tanh_stub(x):
    raise NotImplementedError  # your code here


#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "tanhhelper"
REFERENCE = tanh
WRONG = [(tanh_textbook, 2, "e^(2x) overflows"), (tanh_sinh_cosh, 3, "e^|x| overflows"),
         (tanh_scalar_branch, 0, "np.where")]
STUB = tanh_stub
