"""fusionlab: operator fusion for neural networks, done for real on ONNX models.

model → analysis → fusion plan → rewrite → verify → measure → explain.
"""

from .graph import Graph, ModelError, load, save_model
from .plan import FusionGroup, FusionPlan
from .runtime import make_feeds, run, session, verify

__version__ = "0.1.0"

#: old module names of the lesson modules, moved to fusionlab.lessons (``from fusionlab import pipeline`` still works)
_MOVED = {"pipeline": "double_buffer", "dynamic": "dynamic_shapes", "elementwise": "codegen"}
#: the cost model's parts, which live in fusionlab.cost (``from fusionlab import devices`` keeps working)
_COST = {"devices", "calibrate", "metrics"}


def __getattr__(name: str):
    """`from fusionlab import pipeline` (and the other moved names) returns the module's new home."""
    if name in _COST:
        import importlib

        return importlib.import_module(f"fusionlab.cost.{name}")
    if name in _MOVED:
        import importlib
        import warnings

        new = f"fusionlab.lessons.{_MOVED[name]}"
        warnings.warn(f"fusionlab.{name} moved to {new}", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)
    raise AttributeError(f"module 'fusionlab' has no attribute {name!r}")

__all__ = [
    "Graph", "ModelError", "load", "save_model", "FusionGroup", "FusionPlan", "make_feeds", "run", "session",
    "verify", "__version__",
]
