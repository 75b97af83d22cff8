"""The third exercise of notebook 04: keep a fused rule only where it measures faster."""

import math
import statistics

from fusionlab import timing


def keep(unfused, fused):
    """Reference: the paired ratios unfused / fused (A / B: above 1, the fused copy is faster), and fusionlab's
    verdict on their 95 % interval; keep only 'faster'."""
    c = timing.Comparison.from_samples(unfused, fused)
    return timing.ratio_verdict(c.ci_low, c.ci_high) == "faster"


def keep_median(unfused, fused):
    """WRONG: the median of the paired ratios alone, the interval ignored (select's own test): keeps the noise."""
    return timing.Comparison.from_samples(unfused, fused).speedup > 1


def keep_unpaired(unfused, fused):
    """WRONG: the two medians compared, the pairing thrown away."""
    return statistics.median(unfused) > statistics.median(fused)


def keep_normal(unfused, fused):
    """WRONG: a normal approximation to the interval of the mean ratio: too narrow on five rounds."""
    ratios = [u / f for u, f in zip(unfused, fused)]
    return statistics.fmean(ratios) - 1.96 * statistics.stdev(ratios) / math.sqrt(len(ratios)) > 1


def keep_margin(unfused, fused):
    """WRONG: demands a 5 % gain (the interval above 1.05): a small gain measured tightly is faster too."""
    return timing.Comparison.from_samples(unfused, fused).ci_low > 1.05


def keep_stub(unfused, fused):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "selection"
REFERENCE = keep
WRONG = [(keep_median, 2, "the median ratio alone"), (keep_unpaired, 2, "the two medians compared unpaired"),
         (keep_normal, 3, "a normal approximation"), (keep_margin, 6, "a margin")]
STUB = keep_stub
