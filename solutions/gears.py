"""The first exercise of notebook 20: the compute that padding to shape gears wastes."""


def padded_waste(lengths, gears):
    """Reference: each request padded up to the smallest gear >= its length; computed over useful tokens."""
    ordered = sorted(gears)
    return sum(next(g for g in ordered if g >= n) for n in lengths) / sum(lengths)


def padded_waste_nearest(lengths, gears):
    """WRONG: rounds each request to the nearest gear, which can be below its length (65 -> 64)."""
    return sum(min(gears, key=lambda g: abs(g - n)) for n in lengths) / sum(lengths)


def padded_waste_unsorted(lengths, gears):
    """WRONG: takes the first gear that fits in the order the gears are given."""
    return sum(next(g for g in gears if g >= n) for n in lengths) / sum(lengths)


def padded_waste_stub(lengths, gears):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "gears"
REFERENCE = padded_waste
WRONG = [(padded_waste_nearest, 0, "the nearest gear"), (padded_waste_unsorted, 2, "sort the gears")]
STUB = padded_waste_stub
