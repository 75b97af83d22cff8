"""The exercise of notebook 01: the bytes the silu block moves, counted by hand as the cost model counts them."""

X = 1 * 16 * 32 * 32 * 4  # one float32 [1, 16, 32, 32] map: 65,536 B
P = 16 * 4  # one (16, 1, 1) float32 constant

#: Reference. Unfused, each node reads its inputs and writes its output: scale x, s -> a0; shift a0, b -> a;
#: sigmoid a -> g; silu a, g -> h; residual h, x -> y. Fused, one kernel reads x, s, b once and writes y.
ANSWER = {"unfused": (2 * X + P) + (2 * X + P) + 2 * X + 3 * X + 3 * X, "fused": X + P + P + X}

#: WRONG: counts each tensor once however many nodes read it (a is read by sigmoid and silu, x by scale and residual)
WRONG_READ_ONCE = {"unfused": ANSWER["unfused"] - 2 * X, "fused": ANSWER["fused"]}

#: WRONG: the fused kernel still writes and reads back its intermediates a0, a, g, h
WRONG_FUSED_MIDS = {"unfused": ANSWER["unfused"], "fused": ANSWER["fused"] + 4 * 2 * X}

#: WRONG: leaves out the per-channel constants s and b (64 B each), in both counts
WRONG_NO_PARAMS = {"unfused": ANSWER["unfused"] - 2 * P, "fused": ANSWER["fused"] - 2 * P}

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "traffic"
REFERENCE = ANSWER
WRONG = [(WRONG_READ_ONCE, 0, "second reads of x and a"), (WRONG_FUSED_MIDS, 1, "keeps them on chip"),
         (WRONG_NO_PARAMS, 0, "constants s and b")]
STUB = {"unfused": ..., "fused": ...}
