"""The second exercise of notebook 20: the gears that pad a stream least."""

from itertools import combinations

import numpy as np


def best_gears(lengths, k):
    """Reference: the top gear at the longest request, the others tried at every combination of shorter lengths."""
    distinct = sorted(set(lengths))
    top, below = distinct[-1], distinct[:-1]

    def computed(gear_set):
        return sum(next(g for g in gear_set if g >= n) for n in lengths)

    candidates = (tuple(c) + (top,) for c in combinations(below, min(k, len(distinct)) - 1))
    return min(candidates, key=computed)


def best_gears_quantiles(lengths, k):
    """WRONG: gears at the quantiles of the lengths, which split the requests evenly, not the padded tokens."""
    return sorted({int(np.quantile(lengths, (i + 1) / k, method="higher")) for i in range(k)})


def best_gears_512(lengths, k):
    """WRONG: keeps BERT's maximum, 512, as the top gear and searches the others below it."""
    distinct = sorted(n for n in set(lengths) if n < 512)

    def computed(gear_set):
        return sum(next(g for g in gear_set if g >= n) for n in lengths)

    return min((tuple(c) + (512,) for c in combinations(distinct, k - 1)), key=computed)


def best_gears_distinct(lengths, k):
    """WRONG: searches as the reference does, but over the distinct lengths, each counted once (frequency ignored)."""
    return best_gears(sorted(set(lengths)), k)


def best_gears_stub(lengths, k):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "bestgears"
REFERENCE = best_gears
WRONG = [(best_gears_quantiles, 0, "quantiles"), (best_gears_512, 0, "lower it to 120"),
         (best_gears_distinct, 5, "each distinct length came once")]
STUB = best_gears_stub
