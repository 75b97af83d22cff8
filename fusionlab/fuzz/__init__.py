"""A differential fuzzer for the fusion passes: random valid models, an oracle, a shrinker, campaigns.

`generate(seed)` makes a model; `oracle.judge(model, passes)` fuses it and classifies the outcome;
`shrink.shrink(model, ...)` cuts a failing model down; `python -m fusionlab.fuzz` runs a campaign.
See docs/fuzz.md.
"""

from .generator import generate, generate_with_tags, validate

__all__ = ["generate", "generate_with_tags", "validate"]
