"""Exercises that check themselves: a learner writes a small answer in a notebook cell and `check(answer)` grades it.

`core` holds the verdict (`Verdict`: PASS with what was checked, FAIL with a hint naming the first failing case,
NOT ANSWERED YET for the stub) and the grading loop, once; each topic is a module with its hidden cases and a
`check`: `traffic` (notebook 01: bytes), `folding` (02), `rules` (03), `thresholds` (06), `softmax` (08),
`kvcache` and `rotary` (09), `qparams` and `requant` (10), `buffers` and `pipeline` (14).
Reference answers and planted wrong ones live outside the package, in the repository's `solutions/`.
"""

from . import buffers, folding, kvcache, pipeline, qparams, requant, rotary, rules, softmax, thresholds, traffic
from .core import Case, Verdict

__all__ = ["Case", "Verdict", "folding", "rules", "traffic", "thresholds", "softmax", "kvcache", "rotary", "qparams",
           "requant", "buffers", "pipeline"]
