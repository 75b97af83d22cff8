"""ConvNeXt's channels-last blocks: transpose_cancel and layer_scale; no-op arithmetic folded before fusion.

The block is the corpus listing (docs/corpus.md, CNBlock features.1.0): Conv(dw) -> Transpose[0, 2, 3, 1] ->
LayerNormalization -> MatMul -> Add(b) -> Gelu -> MatMul -> Add(b) -> Transpose[0, 3, 1, 2] -> Mul(W[C, 1, 1])
-> Add(residual); TorchScript writes Add(b, MatMul) and Mul(W, x), dynamo Add(MatMul, b).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper as h

from fusionlab import ModelError
from fusionlab.build import tensor, value_info
from fusionlab.passes import fuse

from rulekit import CORPUS, check, mk, r, refused

C, S = 8, 6


def cnblock(*, residual="transposed", bias_first=True, gamma_shape=(C, 1, 1), gamma=None):
    """One CNBlock; `residual`: "transposed" (the stem's Transpose(LN) output, so both Transposes cancel),
    "input" (the block input: only the layer-scale folds)."""
    nodes = [h.make_node("Transpose", ["x"], ["xl"], perm=[0, 2, 3, 1], name="to_last"),
             h.make_node("LayerNormalization", ["xl", "g0", "b0"], ["ln"], axis=-1, epsilon=1e-6, name="stem_ln"),
             h.make_node("Transpose", ["ln"], ["stem"], perm=[0, 3, 1, 2], name="to_first"),
             h.make_node("Conv", ["stem", "wdw", "bdw"], ["dw"], group=C, kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="dw"),
             h.make_node("Transpose", ["dw"], ["dwl"], perm=[0, 2, 3, 1], name="block_in"),
             h.make_node("LayerNormalization", ["dwl", "g1", "b1"], ["l1"], axis=-1, epsilon=1e-6, name="block_ln"),
             h.make_node("MatMul", ["l1", "w1"], ["m1"], name="pw1"),
             h.make_node("Add", ["c1", "m1"] if bias_first else ["m1", "c1"], ["a1"], name="pw1_bias"),
             h.make_node("Gelu", ["a1"], ["gl"], name="gelu"),
             h.make_node("MatMul", ["gl", "w2"], ["m2"], name="pw2"),
             h.make_node("Add", ["c2", "m2"] if bias_first else ["m2", "c2"], ["a2"], name="pw2_bias"),
             h.make_node("Transpose", ["a2"], ["back"], perm=[0, 3, 1, 2], name="block_out"),
             h.make_node("Mul", ["gamma", "back"], ["scaled"], name="layer_scale"),
              h.make_node("Add", ["scaled", "stem" if residual == "transposed" else "x"], ["s"], name="residual"),
              h.make_node("Transpose", ["s"], ["sl"], perm=[0, 2, 3, 1], name="next_in"),  # the downsample's LN
              h.make_node("LayerNormalization", ["sl", "g0", "b0"], ["y"], axis=-1, epsilon=1e-6, name="next_ln")]
    out_shape = [2, S, S, C]
    g = gamma if gamma is not None else (0.5 + r(*gamma_shape) ** 2).astype(np.float32)
    inits = [tensor("g0", 1 + 0.1 * r(C)), tensor("b0", r(C)), tensor("wdw", r(C, 1, 3, 3, scale=0.3)), tensor("bdw", r(C)),
             tensor("g1", 1 + 0.1 * r(C)), tensor("b1", r(C)), tensor("w1", r(C, 4 * C, scale=0.3)), tensor("c1", r(4 * C)),
             tensor("w2", r(4 * C, C, scale=0.3)), tensor("c2", r(C)), tensor("gamma", g)]
    return mk(nodes, [value_info("x", shape=[2, C, S, S])], [value_info("y", shape=out_shape)], inits, opset=20)


@pytest.mark.parametrize("bias_first", [True, False])
def test_first_cnblock_both_transposes_cancel(bias_first):
    res = check(cnblock(bias_first=bias_first), ("transpose_cancel",))
    assert res.plan.rule_counts() == {"transpose_cancel": 1}
    assert res.before["Transpose"] - res.after["Transpose"] == 2
    mul = next(n for n in res.graph if n.op_type == "Mul")
    assert list(mul.inputs[0].const_value.shape) == [1, 1, 1, C]  # gamma permuted to channels-last


@pytest.mark.parametrize("bias_first", [True, False])
def test_layer_scale_folds_into_the_projection(bias_first):
    res = check(cnblock(residual="input", bias_first=bias_first), ("layer_scale",))
    assert res.plan.rule_counts() == {"layer_scale": 1}
    assert res.before["Mul"] - res.after.get("Mul", 0) == 1 and res.after["Transpose"] == res.before["Transpose"]


def test_layer_scale_without_a_transpose_scales_the_last_axis():
    check(_channels_last_block(), ("layer_scale",), {"MatMul": 1, "Add": 1})


def _channels_last_block():
    """timm's LayerScale on a channels-last MLP: MatMul -> Add(b) -> Mul(gamma[C])."""
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"], name="pw"), h.make_node("Add", ["m", "c"], ["a"], name="bias"),
             h.make_node("Mul", ["a", "gamma"], ["y"], name="layer_scale")]
    return mk(nodes, [value_info("x", shape=[2, 5, 16])], [value_info("y", shape=[2, 5, C])],
              [tensor("w", r(16, C)), tensor("c", r(C)), tensor("gamma", r(C))], opset=20)


def test_both_rules_together_on_the_first_block():
    """With layer_scale on, the first block loses both Transposes and its Mul (folded into the projection), in one group."""
    res = check(cnblock(), ("transpose_cancel", "layer_scale"))
    assert res.plan.rule_counts() == {"transpose_cancel": 1}
    assert res.before["Transpose"] - res.after["Transpose"] == 2 and "Mul" not in res.after
    alone = check(cnblock(), ("transpose_cancel",))
    assert alone.after["Mul"] == 1


def _cancel_case(kind):
    nodes = [h.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2], name="t1"),
             h.make_node("Add", ["t", "o"], ["a"], name="mid"),
             h.make_node("Transpose", ["a"], ["y"], perm=[0, 2, 3, 1], name="t2")]
    inputs = [value_info("x", shape=[2, S, S, C])]
    inits = []
    if kind == "plain operand":
        inputs.append(value_info("o", shape=[2, C, S, S]))
    elif kind == "other perm":
        nodes.insert(0, h.make_node("Transpose", ["u"], ["o"], perm=[0, 3, 2, 1], name="tu"))
        inputs.append(value_info("u", shape=[2, S, S, C]))
    return mk(nodes, inputs, [value_info("y", shape=None)], inits, opset=20)


@pytest.mark.parametrize("kind, reason", [("plain operand", "would need a new Transpose"),
                                          ("other perm", "would need a new Transpose")])
def test_transpose_cancel_refuses(kind, reason):
    reasons = refused(_cancel_case(kind), ("transpose_cancel",), "t1")
    assert any(reason in x for x in reasons), reasons


def test_transpose_cancel_needs_the_inverse_perm_and_single_readers():
    m = _cancel_case("other perm")
    m.graph.node[-1].attribute[0].ints[:] = [0, 1, 2, 3]  # not the inverse
    assert fuse(m, ("vertical",), rules=("transpose_cancel",)).after == fuse(m, ("vertical",), rules=()).after
    m = cnblock()
    m.graph.output.append(value_info("scaled", shape=[2, C, S, S]))  # an intermediate is an output
    res = fuse(m, ("vertical",), rules=("transpose_cancel",))
    assert "transpose_cancel" not in res.plan.rule_counts()


def test_a_transpose_one_group_removes_is_not_read_through_by_another():
    # fuzz seed 8, graph 5129: group A cancels Transpose(y, to NCHW) -> Mul -> Transpose(back to NHWC) = tb;
    # group B cancels Transpose(x, to NHWC) -> Add(., tb) -> Sub -> Transpose(back) by reading tb's input
    # directly. Applying A first removed tb, and B's recheck raised StaleGroup. The later group is refused.
    c = 4
    nodes = [h.make_node("Transpose", ["y"], ["ta"], name="ta", perm=[0, 3, 1, 2]),
             h.make_node("Mul", ["ta", "g"], ["m"], name="scale"),
             h.make_node("Transpose", ["m"], ["tb"], name="tb", perm=[0, 2, 3, 1]),
             h.make_node("Transpose", ["x"], ["tx"], name="tx", perm=[0, 2, 3, 1]),
             h.make_node("Add", ["tx", "tb"], ["s"], name="add"),
             h.make_node("Sub", ["s", "k"], ["q"], name="sub"),
             h.make_node("Transpose", ["q"], ["out"], name="back", perm=[0, 3, 1, 2])]
    model = mk(nodes, [value_info("y", shape=[1, 3, 3, c]), value_info("x", shape=[1, c, 3, 3])],
               [value_info("out", shape=None)], [tensor("g", r(c, 1, 1)), tensor("k", r(c))])
    res = check(model, ("transpose_cancel",))
    assert res.plan.rule_counts() == {"transpose_cancel": 1}
    assert any("read through by another" in x.reason for x in res.plan.refusals), res.plan.refusals


LAYER_SCALE_REFUSALS = {
    "not per channel": (lambda: cnblock(residual="input", gamma_shape=(C, S, 1)), "is not per output channel"),
    "dtype": (lambda: cnblock(residual="input", gamma=np.ones((C, 1, 1), np.float64)), "does not fold"),
    "overflow": (lambda: cnblock(residual="input", gamma=np.full((C, 1, 1), 3e38, np.float32)), "overflow"),
    "not finite": (lambda: cnblock(residual="input", gamma=np.full((C, 1, 1), np.inf, np.float32)), "not finite"),
}


@pytest.mark.parametrize("case", sorted(LAYER_SCALE_REFUSALS))
def test_layer_scale_refuses(case):
    build, reason = LAYER_SCALE_REFUSALS[case]
    if case == "dtype":  # a float64 gamma on float32: onnxruntime cannot load the model, so fuse() refuses it
        with pytest.raises(ModelError, match="onnxruntime cannot load it"):
            fuse(build(), ("vertical",), rules=("layer_scale",))
    res = fuse(build(), ("vertical",), rules=("layer_scale",), validate=case != "dtype")
    assert res.after == res.before
    reasons = [x.reason for x in res.plan.why_not("layer_scale")]
    assert any(reason in x for x in reasons), reasons


def test_layer_scale_needs_a_constant_weight_and_single_readers():
    m = cnblock(residual="input")
    m.graph.output.append(value_info("a2", shape=[2, S, S, C]))
    assert "layer_scale" not in fuse(m, ("vertical",), rules=("layer_scale",)).plan.rule_counts()
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"], name="pw"), h.make_node("Mul", ["m", "gamma"], ["y"], name="ls")]
    m = mk(nodes, [value_info("x", shape=[2, 5, 16]), value_info("w", shape=[16, C])], [value_info("y", shape=[2, 5, C])],
           [tensor("gamma", r(C))], opset=20)
    assert any("not a constant 2-D" in x for x in refused(m, ("layer_scale",), "ls"))


# ---------------------------------------------------------------------------------------------------
# no-op arithmetic (prepare): the dynamo exporter's x + 0 on int64 index tensors
# ---------------------------------------------------------------------------------------------------

def test_integer_add_of_zero_and_float_mul_by_one_are_folded_before_fusion():
    nodes = [h.make_node("Add", ["i", "z"], ["i1"], name="add0"), h.make_node("Add", ["i1", "z"], ["i2"], name="add0b"),
             h.make_node("Gather", ["data", "i2"], ["g"], axis=0, name="gather"),
             h.make_node("Mul", ["g", "one"], ["y"], name="mul1")]
    m = mk(nodes, [value_info("data", shape=[8, 4]), value_info("i", np.int64, [3, 1])], [value_info("y", shape=[3, 1, 4])],
           [tensor("z", np.zeros([1, 1], np.int64)), tensor("one", np.ones([4], np.float32))], opset=20)
    res = check(m, ())
    assert res.after == {"Gather": 1}  # y (a graph output) is now Gather's, under its own name
    assert [o.name for o in res.graph.graph.outputs] == ["y"]
    assert any("no-op arithmetic 3" in n for n in res.plan.notes)


@pytest.mark.parametrize("case", ["float add of zero", "broadcasting zero", "sub from zero", "div of one"])
def test_arithmetic_that_is_not_a_no_op_stays(case):
    const = {"float add of zero": np.zeros([4], np.float32), "broadcasting zero": np.zeros([2, 3, 4], np.float32)}
    op = {"sub from zero": "Sub", "div of one": "Div"}.get(case, "Add" if "zero" in case else "Mul")
    c = const.get(case, np.ones([4], np.float32) if op == "Div" else np.zeros([4], np.float32))
    if case == "broadcasting zero":
        op, c = "Mul", np.ones([2, 3, 4], np.float32)
    ins = ["c", "x"] if case in ("sub from zero", "div of one") else ["x", "c"]
    m = mk([h.make_node(op, ins, ["y"], name="op")], [value_info("x", shape=[3, 4])], [value_info("y", shape=None)],
           [tensor("c", c)], opset=20)
    assert check(m, ()).after == {op: 1}


@pytest.mark.parametrize("name, transposes, muls", [("convnext.dynamo", 2, 5), ("convnext.ts-fold", 2, 5)])
def test_corpus_convnext_closes_the_transpose_gap(name, transposes, muls):
    if not (CORPUS / f"{name}.onnx").exists():
        pytest.skip("no corpus")
    res = check(str(CORPUS / f"{name}.onnx"), ("transpose_cancel", "layer_scale"))
    assert res.before["Transpose"] - res.after["Transpose"] == transposes
    assert res.before["Mul"] - res.after.get("Mul", 0) == muls  # every layer-scale Mul
