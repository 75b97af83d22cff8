"""fusionlab: operator fusion for neural networks, done for real on ONNX models.

model → analysis → fusion plan → rewrite → verify → measure → explain.
"""

from .graph import Graph, ModelError, load, save_model
from .plan import FusionGroup, FusionPlan
from .verification.runtime import make_feeds, run, session, verify

__version__ = "0.1.0"

__all__ = [
    "Graph", "ModelError", "load", "save_model", "FusionGroup", "FusionPlan", "make_feeds", "run", "session",
    "verify", "__version__",
]
