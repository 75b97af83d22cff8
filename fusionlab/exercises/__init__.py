"""Exercises that check themselves: a learner writes a small answer in a notebook cell and `check(answer)` grades it.

`core` holds the verdict (`Verdict`: PASS with what was checked, FAIL with a hint naming the first failing case,
NOT ANSWERED YET for the stub) and the grading loop, once; each topic is a module with its hidden cases and a
`check`: `traffic` (notebook 01: bytes), `folding` (02), `rules` (03), `thresholds` (06), `softmax` (08),
`kvcache` (09), `qparams` (10), `idle` and `utilisation` (13), `buffers` (14), `gears` and `lru` (15).
Reference answers and planted wrong ones live outside the package, in the repository's `solutions/`.
"""

from . import buffers, folding, gears, idle, kvcache, lru, qparams, rules, softmax, thresholds, traffic, utilisation
from .core import Case, Verdict

__all__ = ["Case", "Verdict", "folding", "rules", "traffic", "thresholds", "softmax", "kvcache", "qparams",
           "buffers", "idle", "utilisation", "gears", "lru"]
