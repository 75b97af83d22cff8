"""Loading models safely, and the graph queries every pass needs.

`load` is the one door untrusted models come through: it checks the file, the protobuf, the opset and
every external-data location before anything else touches the model, and raises `ModelError` (a
`ValueError`) with a one-line message naming the file and the problem.  The input file is only read.

The returned `Graph` wraps an `onnx_ir.Model` (use-def chains, no protobuf index juggling) and adds
the handful of queries fusion passes ask again and again: who produces a value, who consumes it, what
constant it holds (seen through `Identity`), the topological order, and the graph outputs.
"""

from .loading import MAX_OPSET, MIN_OPSET, as_graph, has_external_tensors, load
from .names import Names, name_nodes
from .wrapper import (DEFAULT_DOMAIN, Graph, ModelError, PROTOBUF_LIMIT, attr, consumers, is_op, onnx_opset,
                      save_model, sole_consumer)

__all__ = ["MAX_OPSET", "MIN_OPSET", "as_graph", "has_external_tensors", "load", "Names", "name_nodes", "DEFAULT_DOMAIN", "Graph", "ModelError", "PROTOBUF_LIMIT", "attr", "consumers", "is_op", "onnx_opset", "save_model", "sole_consumer"]
