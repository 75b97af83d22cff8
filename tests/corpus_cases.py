"""The inputs the corpus tests feed the exports, and the variants they derive from them (no pytest here:
benchmarks/new_exports_reference.py uses the same cases)."""

from __future__ import annotations

import re

import numpy as np
from onnx import numpy_helper

import fusionlab
from fusionlab.verification.runtime import make_feeds

#: sizes for the dynamic axes in the checks: not the exported ones (batch 2, sequence 32)
DIMS = {"batch": 2, "sequence": 16}
#: the second sequence of a text batch ends in this many padding positions (attention_mask 0)
PADDING = 5
#: initializer names of the norm weights transformers gives its own norm modules (LlamaRMSNorm, T5LayerNorm:
#: input_layernorm, post_attention_layernorm, norm, layer_norm, final_layer_norm)
NORM_WEIGHT = re.compile(r"(^|\.)(\w*_)?(layer_?)?norm\.weight$")


def corpus_feeds(graph: fusionlab.Graph) -> dict:
    """Random inputs at DIMS; a text batch's second sequence is padded, so the mask path computes."""
    feeds = make_feeds(graph, dims=DIMS)
    if "attention_mask" in feeds and feeds["attention_mask"].shape[0] > 1:
        feeds["attention_mask"][1, -PADDING:] = 0
    return feeds


def norm_weights_into_mul(graph: fusionlab.Graph) -> list[str]:
    """Names of the 1-D norm-weight initializers that feed a `Mul` (a norm written out, as transformers writes
    RMSNorm: `weight * hidden`), not the scale of a LayerNormalization op."""
    proto = graph.to_proto()
    into_mul = {name for n in proto.graph.node if n.op_type == "Mul" and n.domain in ("", "ai.onnx")
                for name in n.input}
    return [t.name for t in proto.graph.initializer
            if len(t.dims) == 1 and NORM_WEIGHT.search(t.name) and t.name in into_mul]


def norms_at_one(graph: fusionlab.Graph) -> fusionlab.Graph | None:
    """A copy of `graph` with every norm weight that feeds a Mul set to exactly one (as Hugging Face initialises
    RMSNorm: a freshly initialised model has `Mul(ones, x)` in every norm), or None when it has none."""
    names = set(norm_weights_into_mul(graph))
    if not names:
        return None
    proto = graph.to_proto()
    for k, t in enumerate(proto.graph.initializer):
        if t.name in names:
            ones = np.ones_like(numpy_helper.to_array(t))
            proto.graph.initializer[k].CopyFrom(numpy_helper.from_array(ones, t.name))
    return fusionlab.load(proto)
