"""Exercises that check themselves: a learner writes a small answer in a notebook cell and `check(answer)` grades it.

`core` holds the verdict (`Verdict`: PASS with what was checked, FAIL with a hint naming the first failing case,
NOT ANSWERED YET for the stub) and the grading loop, once; each topic is a module with its hidden cases and a
`check`: `bnaffine` and `levels` (notebook 00), `traffic` and `hardswish` (01), `folding` and `transposed` (02),
`rules` and `plans` (03), `gelu` and `skipln` (04), `qkv` and `siblings` (05), `thresholds` and `postdom` (06),
`roofline` and `tiles` (07), `splits` and `launchfit` (08), `softmax` and `moments` (08), `kvcache` and `rotary` (09), `qparams` and `requant`
(10), `agreement` and `atcswitch` (11), `prototype` and `pykernel` (12), `idle` and `utilisation` (13), `buffers`
and `pipeline` (14), `gears` and `lru` (15).
Reference answers and planted wrong ones live outside the package, in the repository's `solutions/`.
"""

from . import (agreement, atcswitch, bnaffine, buffers, folding, gears, gelu, hardswish, idle, kvcache, launchfit, levels, lru,
    moments, pipeline, plans, postdom, prototype, pykernel, qkv, qparams, requant, roofline, rotary, rules,
    siblings, skipln, softmax, splits, thresholds, tiles, traffic, transposed, utilisation)
from .core import Case, Verdict

__all__ = ["Case", "Verdict", "bnaffine", "levels", "traffic", "hardswish", "folding", "transposed", "rules",
           "plans", "gelu", "skipln", "qkv", "siblings", "thresholds", "postdom", "roofline", "tiles", "splits", "launchfit", "softmax",
           "moments", "kvcache", "rotary", "qparams", "requant", "agreement", "atcswitch", "prototype", "pykernel",
           "idle", "utilisation", "buffers", "pipeline", "gears", "lru"]
