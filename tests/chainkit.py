"""What the chain-rule tests share (conv, linear, GELU, pool, ... in tests/test_rules_<family>.py, and the pass's
own tests in tests/test_vertical.py): small models of a Conv or MatMul chain, and fusing them with the checks
every such test wants (a valid model that computes the same; the op counts expected)."""

from __future__ import annotations

import numpy as np
from onnx import helper as h

from fusionlab import load, verify
from fusionlab.build import tensor, value_info
from fusionlab.passes import fuse

from rulekit import mk

RNG = np.random.default_rng(7)

def r(*shape, dtype=np.float32, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)

def bn_params(c, prefix="bn", dtype=np.float32, var=None):
    v = np.abs(r(c)) + 0.5 if var is None else var
    return [tensor(f"{prefix}_g", r(c).astype(dtype)), tensor(f"{prefix}_b", r(c).astype(dtype)),
            tensor(f"{prefix}_m", r(c).astype(dtype)), tensor(f"{prefix}_v", np.asarray(v).astype(dtype))]

def bn_node(x, y, prefix="bn", **attrs):
    return h.make_node("BatchNormalization", [x, f"{prefix}_g", f"{prefix}_b", f"{prefix}_m", f"{prefix}_v"], [y],
                       name=prefix, **attrs)

def conv_model(tail_nodes, tail_inits=(), *, cin=3, cout=8, k=3, spatial=(8, 8), opset=17, bias=True, group=1,
               dtype=np.float32, out="y", out_shape=None, extra_outputs=(), weight_scale=1.0):
    nd = len(spatial)
    w = r(cout, cin // group, *([k] * nd), dtype=dtype, scale=weight_scale)
    inits = [tensor("W", w)] + ([tensor("B", r(cout, dtype=dtype))] if bias else []) + list(tail_inits)
    conv = h.make_node("Conv", ["x", "W"] + (["B"] if bias else []), ["c"], name="conv", kernel_shape=[k] * nd,
                       pads=[k // 2] * (2 * nd), group=group)
    outputs = [value_info(out, dtype, out_shape)] + [value_info(n, dtype, None) for n in extra_outputs]
    return mk([conv] + list(tail_nodes), [value_info("x", dtype, ["batch", cin, *spatial])], outputs, inits,
                      opset=opset)

def check(model, expect=None, *, rtol=None, atol=None, dims=None, **opts):
    """Fuse, check the result is a valid model that computes the same, and that op counts are as expected."""
    res = fuse(model, **opts)
    proto = res.graph.to_proto()
    load(proto)  # the fused model passes the ONNX checker
    report = verify(model, proto, rtol=rtol, atol=atol, dims=dims)
    assert report.ok, report.table()
    if expect is not None:
        assert res.after == dict(sorted(expect.items())), res.after
    return res

def unchanged(model, **opts):
    res = fuse(model, **opts)
    assert res.after == res.before, (res.before, res.after, res.plan.notes)
    assert len(res.plan) == 0
    report = verify(model, res.graph.to_proto())
    assert report.ok, report.table()
    return res
