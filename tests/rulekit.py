"""What the rule tests share: build a small model, fuse it with one rule, check it, read the refusals.

Also where the export corpus is: ``tests/corpus/*.onnx`` (or the folder named by ``FUSIONLAB_CORPUS``);
corpus tests skip when it is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest

from fusionlab import load, verify
from fusionlab.build import make_model
from fusionlab.passes import fuse

RNG = np.random.default_rng(11)
CORPUS = Path(os.environ.get("FUSIONLAB_CORPUS", Path(__file__).parent / "corpus"))


def r(*shape, scale=1.0, dtype=np.float32):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def mk(nodes, inputs, outputs, inits=(), **kw) -> onnx.ModelProto:
    """make_model, with graph outputs declared without a shape given their inferred type."""
    m = make_model(nodes, inputs, outputs, inits, **kw)
    try:
        inferred = onnx.shape_inference.infer_shapes(m)
    except Exception:
        return m
    known = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for out in m.graph.output:
        if not out.type.tensor_type.HasField("shape") and out.name in known:
            out.type.CopyFrom(known[out.name].type)
    return m


def check(model, rules, expect: dict | None = None, **opts):
    """Fuse with `rules`, check the result passes the full checker as it is (when the original does), loads and
    computes the same (fp32 rtol 1e-4, atol 1e-5)."""
    res = fuse(model, ("vertical",), rules=rules, **opts)
    proto = res.graph.to_proto()
    if _checker_accepts(model):
        onnx.checker.check_model(proto, full_check=True)  # no op onnx does not know, whatever onnxruntime runs
    load(proto)
    report = verify(model, proto)
    assert report.ok, report.table()
    if expect is not None:
        assert res.after == dict(sorted(expect.items())), res.after
    return res


def _checker_accepts(model) -> bool:
    try:
        onnx.checker.check_model(model if isinstance(model, onnx.ModelProto) else load(model).to_proto(),
                                 full_check=True)
    except Exception:
        return False
    return True


def refused(model, rules, node: str, **opts) -> list[str]:
    """Fuse with `rules`, assert nothing changed, and return the refusal reasons anchored on `node`."""
    res = fuse(model, ("vertical",), rules=rules, **opts)
    assert res.after == res.before, (res.before, res.after)
    assert verify(model, res.graph.to_proto()).ok
    return [x.reason for x in res.plan.why_not(node)]


def corpus_files(*names: str) -> list:
    """pytest params for corpus files (skipped when the corpus is not here)."""
    return [pytest.param(n, marks=pytest.mark.skipif(not (CORPUS / f"{n}.onnx").exists(), reason="no corpus"))
            for n in names]
