"""The exercise of notebook 06: the largest max_group_ops whose mixed plan fits the 800I A2's 192 KB UB.

At 16 KiB tiles a group of the chain takes 2 tiles per input it reads from memory, 2 for its output and one per
intermediate live at once. Growing from the start of the chain: Mul(x, y1) reads 2 inputs, Add(y2), Mul(y3)
one more each. Six ops (Mul Sigmoid Add Tanh Mul Relu) read x, y1, y2, y3: 8 + 2 (output) + 2 (two live
intermediates at the first Mul/Sigmoid) = 12 tiles = 192 KB, which fits; the seventh op, Sub(y4), adds 2 tiles.
"""

ANSWER = 6

#: WRONG: the seed's rule of thumb for the 800I A2 (split above 5 ops): it fits, but so does 6
WRONG_SEED_RULE = 5

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "thresholds"
REFERENCE = ANSWER
WRONG = [(WRONG_SEED_RULE, 1, "so does a larger cap"), (7, 0, "needs 224.0 KB > 192 KB")]
STUB = ...
