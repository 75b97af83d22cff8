"""Reference answers to `fusionlab.exercises`, and planted wrong answers (plausible mistakes).

Kept outside the notebooks and outside the importable package. Each module here answers one exercise and ends with
what `tests/test_exercises.py` grades, so adding an exercise touches no shared list:

    CHECKER = "kvcache"            # the module fusionlab.exercises.kvcache
    REFERENCE = kv_cache_bytes     # must PASS, every case named in the verdict
    WRONG = [(answer, i, words)]   # each must FAIL on CASES[i], its hint holding `words`
    STUB = kv_cache_bytes_stub     # what the notebook's cell holds: NOT ANSWERED YET
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

__all__ = ["modules"]


def modules() -> list:
    """Every solutions module, in name order."""
    here = Path(__file__).resolve().parent
    return [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules([str(here)])]
