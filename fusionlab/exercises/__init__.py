"""Exercises that check themselves: a learner writes a small answer in a notebook cell and `check(answer)` grades it.

`core` holds the verdict (`Verdict`: PASS with what was checked, FAIL with a hint naming the first failing case,
NOT ANSWERED YET for the stub) and the grading loop, once; each topic is a module with its hidden cases and a
`check`: `bnaffine` and `levels` (notebook 00), `traffic`, `hardswish` and `tanhhelper` (01), `folding` and
`transposed` (02), `rules` and `plans` (03), `gelu`, `skipln` and `selection` (04), `qkv` and `siblings` (05),
`thresholds` and `postdom` (06), `roofline` and `tiles` (07), `splits` and `launchfit` (08), `softmax` and `moments`
(09), `attnbytes` and `flashtile` (10), `kvcache` and `rotary` (11), `decoderops` and `tokenrate` (12), `qparams`
and `requant` (13), `qkernels` and `qadd` (14), `agreement` and `atcswitch` (15), `prototype` and `pykernel` (16),
`idle` and `hotspot` (17), `workspace` and `utilisation` (18), `buffers` and `pipeline` (19), `gears` and
`bestgears` (20), `lru` and `breakeven` (21).
Reference answers and planted wrong ones live outside the package, in the repository's `solutions/`.
"""

from . import (agreement, atcswitch, attnbytes, bestgears, bnaffine, breakeven, buffers, decoderops, flashtile,
    folding, gears, gelu, hardswish, hotspot, idle, kvcache, launchfit, levels, lru, moments, pipeline, plans,
    postdom, prototype, pykernel, qadd, qkernels, qkv, qparams, requant, roofline, rotary, rules, selection,
    siblings, skipln, softmax, splits, tanhhelper, thresholds, tiles, tokenrate, traffic, transposed, utilisation,
    workspace)
from .core import Case, Verdict

__all__ = ["Case", "Verdict", "bnaffine", "levels", "traffic", "hardswish", "tanhhelper", "folding", "transposed",
           "rules", "plans", "gelu", "skipln", "selection", "qkv", "siblings", "thresholds", "postdom", "roofline",
           "tiles", "splits", "launchfit", "softmax", "moments", "attnbytes", "flashtile", "kvcache", "rotary",
           "decoderops", "tokenrate", "qparams", "requant", "qkernels", "qadd", "agreement", "atcswitch",
           "prototype", "pykernel", "idle", "hotspot", "workspace", "utilisation", "buffers", "pipeline", "gears",
           "bestgears", "lru", "breakeven"]
