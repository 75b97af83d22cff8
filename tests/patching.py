"""Planting a fake where every caller finds it."""

from __future__ import annotations

import sys


def patch_everywhere(monkeypatch, module, name: str, new) -> None:
    """Replace `module.name` and every fusionlab module's own binding of the same object (`from x import name` at a
    module's top binds it there): a planted fake is then what every caller gets."""
    real = getattr(module, name)
    monkeypatch.setattr(module, name, new)
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("fusionlab") and mod.__dict__.get(name) is real:
            monkeypatch.setattr(mod, name, new)
