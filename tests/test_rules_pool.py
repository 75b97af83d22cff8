"""A constant Pad folded into AveragePool / MaxPool (rules/pool.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper as h

from fusionlab.build import tensor, value_info

from chainkit import check, r, unchanged
from rulekit import mk


def pool_model(pool_op, pad_pads=(0, 0, 1, 1, 0, 0, 1, 1), value=0.0, *, extra_consumer=False, **pool_attrs):
    """Pad (constant `value`) -> pool; `pool_attrs` are the pool's own attributes (pads, count_include_pad...)."""
    pool_attrs.setdefault("kernel_shape", [3, 3])
    nodes = [h.make_node("Pad", ["x", "pads", "v"], ["p"], name="pad", mode="constant"),
             h.make_node(pool_op, ["p"], ["y"], name="pool", **pool_attrs)]
    outputs = [value_info("y", shape=None)]
    if extra_consumer:
        nodes.append(h.make_node("Relu", ["p"], ["z"], name="relu"))
        outputs.append(value_info("z", shape=None))
    return mk(nodes, [value_info("x", shape=[1, 3, 7, 7])], outputs,
              [tensor("pads", np.array(pad_pads, np.int64)), tensor("v", np.float32(value))], opset=19)


@pytest.mark.parametrize("own_pads", [None, [1, 0, 0, 1]])
def test_pad_folds_into_average_pool_counting_the_zeros(own_pads):
    """The Pad's zeros counted in the average; the fused pool must count its own pads (count_include_pad=1)."""
    attrs = {"strides": [2, 2]}
    if own_pads is not None:
        attrs.update(pads=own_pads, count_include_pad=1)
    res = check(pool_model("AveragePool", **attrs), {"AveragePool": 1})
    pool = next(iter(res.graph))
    assert pool.attributes["count_include_pad"].value == 1
    assert list(pool.attributes["pads"].value) == ([2, 1, 1, 2] if own_pads else [1, 1, 1, 1])
    assert res.plan.rule_counts() == {"pad_pool": 1}


def test_pad_folds_into_max_pool_only_when_it_pads_as_max_pool_does():
    """MaxPool's own padding is the lowest finite float in onnxruntime: a Pad with that value folds exactly.

    A -inf Pad folded once too (until the fuzzer's class N1): max(-inf data, -inf pad) is -inf, but
    max(-inf data, MaxPool's own padding) is -3.4e38, so it is refused now, and so are zeros.
    """
    res = check(pool_model("MaxPool", value=float(np.finfo(np.float32).min)), {"MaxPool": 1})
    assert list(next(iter(res.graph)).attributes["pads"].value) == [1, 1, 1, 1]
    unchanged(pool_model("MaxPool", value=0.0))  # zeros would beat negative inputs; MaxPool's own pads never do
    res = unchanged(pool_model("MaxPool", value=-np.inf))
    assert any("lowest finite value" in r.reason for r in res.plan.refusals)


@pytest.mark.parametrize("case", ["own_pads_not_counted", "ceil_mode", "pad_not_smaller_than_kernel", "value",
                                  "second_consumer", "channel_axis"])
def test_pad_not_folded_into_pool(case):
    op, kw, pads, value = "AveragePool", {}, (0, 0, 1, 1, 0, 0, 1, 1), 0.0
    if case == "own_pads_not_counted":  # onnxruntime PR #23190: the fused pool would count the pool's own pads
        kw = {"pads": [1, 1, 1, 1], "count_include_pad": 0}
    if case == "ceil_mode":
        kw = {"ceil_mode": 1, "strides": [2, 2]}
    if case == "pad_not_smaller_than_kernel":
        pads = (0, 0, 3, 0, 0, 0, 0, 0)
    if case == "value":
        value = 1.0
    if case == "channel_axis":
        pads = (0, 1, 0, 0, 0, 0, 0, 0)
    res = unchanged(pool_model(op, pads, value, extra_consumer=case == "second_consumer", **kw))
    if case not in ("second_consumer",):
        assert any("pad_pool" in n for n in res.plan.notes), res.plan.notes
