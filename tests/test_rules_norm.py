"""Norm rules on the exporters' forms: rmsnorm, skip_rmsnorm, and skip_layernorm with its bias input.

RMSNorm forms: LLaMA/T5 (`weight * (x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).to(dtype)`:
Cast, Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Cast, Mul), TorchScript's rsqrt as Div(1, Sqrt), x / sqrt,
x * x for the square, Pow(-0.5). Residual forms: dynamo's Add(MatMul, b) and TorchScript's Add(b, MatMul)
before the residual Add (the BERT/ViT listings of docs/corpus.md), and pre-LN blocks whose sum is read again.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper as h

from fusionlab.build import tensor, value_info
from fusionlab.passes import fuse
from fusionlab.passes.vertical import RULE_NAMES

from chainkit import check as chain_check, unchanged as chain_unchanged
from rulekit import CORPUS, check, mk, r, refused

H = 16


def rms_nodes(x="x", y="y", form="llama", *, eps_shape=(), exponent=2.0, weight_last=False, inv_first=False,
              eps_first=False, eps_after_root=False):
    """Decomposed RMSNorm of x (nodes, initializers); the node names are the form's steps.

    Forms: llama (Cast to float32 .. Cast back, float32: both identities), fp16 (LLaMA in half precision),
    t5fp16 (T5 in half precision: x cast twice to float32, once for the variance, once for the product),
    plain, mul (x * x), div1 (Div(1, Sqrt)), divx (x / Sqrt), pow (Pow(., -0.5)); the operand orders of the
    scale, the product and the epsilon Add; `eps_after_root`: sqrt(mean) + eps (a near miss)."""
    xf = xm = x
    nodes = []
    if form in ("llama", "fp16", "t5fp16"):
        nodes.append(h.make_node("Cast", [x], ["xf"], to=1, name="to_f32"))
        xf = xm = "xf"
    if form == "t5fp16":
        nodes.append(h.make_node("Cast", [x], ["xm"], to=1, name="to_f32_again"))
        xm = "xm"
    sq = h.make_node("Mul", [xf, xf], ["sq"], name="square") if form == "mul" else \
        h.make_node("Pow", [xf, "two"], ["sq"], name="square")
    nodes += [sq, h.make_node("ReduceMean", ["sq", "axes"], ["var"], keepdims=1, name="mean")]
    if eps_after_root:
        nodes += [h.make_node("Sqrt", ["var"], ["root"], name="sqrt_first"),
                  h.make_node("Add", ["root", "eps"], ["std"], name="add_eps"),
                  h.make_node("Reciprocal", ["std"], ["inv"], name="rsqrt"),
                  h.make_node("Mul", [xm, "inv"], ["n"], name="norm"),
                  h.make_node("Mul", ["gamma", "n"], [y], name="scale")]
        return nodes, _rms_inits(form, exponent, eps_shape)
    nodes.append(h.make_node("Add", ["eps", "var"] if eps_first else ["var", "eps"], ["ve"], name="add_eps"))
    if form == "pow":
        nodes.append(h.make_node("Pow", ["ve", "mhalf"], ["inv"], name="rsqrt"))
    else:
        nodes.append(h.make_node("Sqrt", ["ve"], ["std"], name="sqrt"))
        if form == "div1":
            nodes.append(h.make_node("Div", ["one", "std"], ["inv"], name="rsqrt"))
        elif form != "divx":
            nodes.append(h.make_node("Reciprocal", ["std"], ["inv"], name="rsqrt"))
    nodes.append(h.make_node("Div", [xm, "std"], ["n"], name="norm") if form == "divx" else
                 h.make_node("Mul", ["inv", xm] if inv_first else [xm, "inv"], ["n"], name="norm"))
    last = "n"
    if form in ("llama", "fp16", "t5fp16"):
        nodes.append(h.make_node("Cast", ["n"], ["nb"], to=1 if form == "llama" else 10, name="to_input_dtype"))
        last = "nb"
    nodes.append(h.make_node("Mul", [last, "gamma"] if weight_last else ["gamma", last], [y], name="scale"))
    return nodes, _rms_inits(form, exponent, eps_shape)


def _rms_inits(form, exponent, eps_shape):
    return [tensor("two", np.float32(exponent)), tensor("axes", np.array([-1], np.int64)),
            tensor("eps", np.full(eps_shape, 1e-6, np.float32)), tensor("mhalf", np.float32(-0.5)),
            tensor("one", np.float32(1.0)), tensor("gamma", (1 + 0.1 * r(H)).astype(_dt(form)))]


def _dt(form):
    return np.float16 if form in ("fp16", "t5fp16") else np.float32


def rms_model(form="llama", opset=23, **kw):
    nodes, inits = rms_nodes(form=form, **kw)
    dt = _dt(form)
    return mk(nodes, [value_info("x", dt, ["batch", 7, H])], [value_info("y", dt, ["batch", 7, H])], inits, opset=opset)


@pytest.mark.parametrize("form", ["llama", "plain", "mul", "div1", "divx", "pow", "fp16", "t5fp16"])
@pytest.mark.parametrize("order", ["as written", "weight last", "inv first", "eps first"])
def test_rmsnorm_forms_become_rmsnormalization(form, order):
    kw = {"weight last": {"weight_last": True}, "inv first": {"inv_first": True},
          "eps first": {"eps_first": True}}.get(order, {})
    res = check(rms_model(form, **kw), ("rmsnorm",), {"RMSNormalization": 1})
    node = next(iter(res.graph))
    assert node.attributes["epsilon"].value == pytest.approx(1e-6) and node.attributes["stash_type"].value == 1
    assert node.inputs[0].name == "x"  # the Casts (identities, or to float32 and back) are members


def test_t5_fp16_twin_cast_read_elsewhere_stays_unfused():
    """The second Cast of T5's half-precision form is a member only when the product alone reads it."""
    m = rms_model("t5fp16")
    m.graph.output.append(value_info("xm", np.float32, ["batch", 7, H]))
    refused(m, ("rmsnorm",), "mean")  # nothing fuses, and the model still computes the same


def test_a_norm_weight_read_elsewhere_still_fuses():
    """A scale shared with another node (tied norm weights) is only an input of the fused op."""
    nodes, inits = rms_nodes(form="plain")
    nodes.append(h.make_node("Add", ["y", "gamma"], ["z"], name="reads_gamma"))
    m = mk(nodes, [value_info("x", shape=["batch", 7, H])], [value_info("z", shape=["batch", 7, H])], inits, opset=23)
    check(m, ("rmsnorm",), {"RMSNormalization": 1, "Add": 1})


def test_rmsnorm_opset23_is_the_standard_op_even_with_standard_ops_only():
    for lower in ("runtime", "onnx"):
        check(rms_model("plain", opset=23), ("rmsnorm",), {"RMSNormalization": 1}, lower=lower)


@pytest.mark.parametrize("opset", range(18, 23))  # ReduceMean takes axes as an input from 18
@pytest.mark.parametrize("lower", ["runtime", "onnx", "functions"])
def test_rmsnorm_below_opset_23_is_refused_at_every_lowering(opset, lower):
    """Issue 19: at opset 20 the rule wrote SimplifiedLayerNormalization, which onnx.checker rejects (onnx has no
    such op at any opset; onnxruntime registers it in the ONNX domain only). No valid op exists below 23."""
    reasons = refused(rms_model("fp16", opset=opset), ("rmsnorm",), "mean", lower=lower)
    assert any("needs opset 23" in x and "onnx.checker rejects it" in x for x in reasons), reasons


def test_rmsnorm_fp16_input_with_fp32_scale_keeps_the_cast():
    nodes, inits = rms_nodes(form="llama")
    inits[-1] = tensor("gamma", (1 + 0.1 * r(H)).astype(np.float32))
    m = mk(nodes, [value_info("x", np.float16, [2, 7, H])], [value_info("y", np.float32, [2, 7, H])], inits, opset=23)
    check(m, ("rmsnorm",), {"Cast": 1, "RMSNormalization": 1})


RMS_REFUSALS = {
    "not a square": (lambda: rms_model("plain", exponent=2.0015), "mean", "not exactly a square"),
    "epsilon broadcasts up": (lambda: rms_model("plain", eps_shape=(1, 1, 1, 1)), "mean", "broadcast the result up"),
    "scale not [H]": (lambda: _with_scale(np.full([7, H], 1.5, np.float32)), "mean", "is not [H]"),
    "intermediate read elsewhere": (lambda: _extra_output("std"), "mean", "read outside the RMSNorm pattern"),
    "input read elsewhere, below opset 23": (lambda: _extra_output("sq", first=True), "mean", "needs opset 23"),
    "standard ops below opset 23": (lambda: rms_model("plain", opset=20), "mean", "needs opset 23"),
    "epsilon after the root": (lambda: rms_model("plain", eps_after_root=True), "mean",
                               "not by + epsilon (epsilon is added after Sqrt sqrt_first)"),
}


def test_rmsnorm_whose_input_is_read_elsewhere_fuses():
    """LLaMA's first norm reads the embedding, which the first residual Add reads too: the op reads x as the
    decomposed nodes did, and the other reader keeps it (this was once refused as "read outside the pattern")."""
    m = _extra_output("sq", first=True, opset=23)
    check(m, ("rmsnorm",), {"RMSNormalization": 1, "Neg": 1})


def _with_scale(gamma):
    nodes, inits = rms_nodes(form="plain")
    inits[-1] = tensor("gamma", gamma)
    return mk(nodes, [value_info("x", shape=[2, 7, H])], [value_info("y", shape=[2, 7, H])], inits, opset=20)


def _extra_output(name, first=False, opset=20):
    nodes, inits = rms_nodes(form="plain")
    if first:  # x also feeds a second consumer
        nodes.append(h.make_node("Neg", ["x"], ["other"], name="other_reader"))
        outs = [value_info("y", shape=[2, 7, H]), value_info("other", shape=[2, 7, H])]
    else:
        outs = [value_info("y", shape=[2, 7, H]), value_info(name, shape=[2, 7, 1])]
    return mk(nodes, [value_info("x", shape=[2, 7, H])], outs, inits, opset=opset)


@pytest.mark.parametrize("case", sorted(RMS_REFUSALS))
def test_rmsnorm_refuses(case):
    build, node, reason = RMS_REFUSALS[case]
    opts = {"lower": "onnx"} if "standard" in case else {}
    reasons = refused(build(), ("rmsnorm",), node, **opts)
    assert any(reason in x for x in reasons), reasons


# ---------------------------------------------------------------------------------------------------
# residual + norm: SkipLayerNormalization / SkipSimplifiedLayerNormalization, with the projection's bias
# ---------------------------------------------------------------------------------------------------

def residual_model(norm="ln", *, bias_first=False, bias=True, sum_read=False, skip_shape=(2, 7, H)):
    """MatMul (+ bias) + residual, then LayerNormalization or the decomposed RMSNorm (the corpus' BERT block)."""
    mm = h.make_node("MatMul", ["h", "W"], ["p"], name="proj")
    nodes = [mm]
    z = "p"
    if bias:
        nodes.append(h.make_node("Add", ["b", "p"] if bias_first else ["p", "b"], ["pb"], name="bias"))
        z = "pb"
    nodes.append(h.make_node("Add", [z, "res"], ["s"], name="residual"))
    inits = [tensor("W", r(32, H, scale=0.2)), tensor("b", r(H))]
    if norm == "ln":
        nodes.append(h.make_node("LayerNormalization", ["s", "g", "beta"], ["y"], axis=-1, epsilon=1e-12, name="norm"))
        inits += [tensor("g", 1 + 0.1 * r(H)), tensor("beta", r(H))]
    else:
        rn, ri = rms_nodes("s", "y", "plain")
        nodes += rn
        inits += ri
    outs = [value_info("y", shape=[2, 7, H])]
    if sum_read:
        nodes.append(h.make_node("Add", ["s", "y"], ["z"], name="next_residual"))
        outs = [value_info("z", shape=[2, 7, H])]
    return mk(nodes, [value_info("h", shape=[2, 7, 32]), value_info("res", shape=list(skip_shape))], outs, inits, opset=20)


@pytest.mark.parametrize("bias_first", [False, True])
def test_skip_layernorm_takes_the_projection_bias(bias_first):
    res = check(residual_model(bias_first=bias_first), ("skip_layernorm",),
                {"MatMul": 1, "com.microsoft:SkipLayerNormalization": 1})
    sln = next(n for n in res.graph if n.op_type == "SkipLayerNormalization")
    assert len(sln.inputs) == 5 and sln.inputs[4].name == "b"


def test_skip_layernorm_hands_the_sum_on_in_pre_ln_blocks():
    res = check(residual_model(sum_read=True), ("skip_layernorm",),
                {"MatMul": 1, "com.microsoft:SkipLayerNormalization": 1, "Add": 1})
    sln = next(n for n in res.graph if n.op_type == "SkipLayerNormalization")
    assert [o.name for o in sln.outputs][1:3] == ["", ""] and sln.outputs[3].uses()


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("sum_read", [False, True])
def test_skip_rmsnorm(bias, sum_read):
    expect = {"MatMul": 1, "com.microsoft:SkipSimplifiedLayerNormalization": 1} | ({"Add": 1} if sum_read else {})
    res = check(residual_model("rms", bias=bias, sum_read=sum_read), ("skip_rmsnorm",), expect)
    assert res.plan.rule_counts() == {"skip_rmsnorm": 1}


def test_skip_rmsnorm_after_the_op():
    nodes = [h.make_node("Add", ["a", "b"], ["s"], name="residual"),
             h.make_node("SimplifiedLayerNormalization", ["s", "g"], ["y"], axis=-1, epsilon=1e-6, name="norm")]
    m = mk(nodes, [value_info("a", shape=[2, 7, H]), value_info("b", shape=[2, 7, H])], [value_info("y", shape=[2, 7, H])],
           [tensor("g", r(H))], opset=20)
    check(m, ("skip_rmsnorm",), {"com.microsoft:SkipSimplifiedLayerNormalization": 1})


def test_skip_norms_need_same_shape_operands_and_keep_the_bias_add_otherwise():
    """A residual that broadcasts ([7, H] onto [2, 7, H]) is no Skip*LayerNormalization: nothing fuses."""
    for rule, norm in (("skip_layernorm", "ln"), ("skip_rmsnorm", "rms")):
        res = fuse(residual_model(norm, skip_shape=(7, H)), ("vertical",), rules=(rule,))
        assert res.after == res.before


def test_a_bias_add_read_elsewhere_stays_outside():
    m = residual_model()
    m.graph.output.append(value_info("pb", shape=[2, 7, H]))
    res = check(m, ("skip_layernorm",), {"MatMul": 1, "Add": 1, "com.microsoft:SkipLayerNormalization": 1})
    assert len(next(n for n in res.graph if n.op_type == "SkipLayerNormalization").inputs) == 4


@pytest.mark.parametrize("name, count", [("bert.dynamo", 4), ("bert_eager.dynamo", 4), ("vit.dynamo", 4),
                                         ("gpt2.dynamo", 4), ("bert.ts-fold", 4)])
def test_corpus_skip_layernorms(name, count):
    """At least onnxruntime EXTENDED's SkipLayerNormalizations (bert 4, gpt2 1, vit 1); the pre-LN sums are handed on."""
    if not (CORPUS / f"{name}.onnx").exists():
        pytest.skip("no corpus")
    res = check(str(CORPUS / f"{name}.onnx"), ("skip_layernorm",))
    assert res.plan.rule_counts().get("skip_layernorm") == count


@pytest.mark.parametrize("norm, rule", [("ln", "skip_layernorm"), ("rms", "skip_rmsnorm")])
def test_a_plan_handing_the_sum_on_round_trips_through_json(norm, rule):
    from fusionlab.passes import apply
    from fusionlab.plan import FusionPlan

    m = residual_model(norm, sum_read=True)
    res = fuse(m, ("vertical",), rules=(rule,))
    again = apply(m, FusionPlan.from_json(res.plan.to_json()))
    assert again.graph.to_proto().SerializeToString() == res.graph.to_proto().SerializeToString()


# ---------------------------------------------------------------------------------------------------
# (from tests/test_vertical.py)
# ---------------------------------------------------------------------------------------------------

def ln_nodes(x, y, *, with_affine=True):
    nodes = [h.make_node("ReduceMean", [x], ["mu"], name="mean", axes=[-1]),
             h.make_node("Sub", [x, "mu"], ["d"], name="sub"),
             h.make_node("Pow", ["d", "two"], ["d2"], name="pow"),
             h.make_node("ReduceMean", ["d2"], ["var"], name="mean2", axes=[-1]),
             h.make_node("Add", ["var", "eps"], ["ve"], name="addeps"),
             h.make_node("Sqrt", ["ve"], ["std"], name="sqrt"),
             h.make_node("Div", ["d", "std"], ["nrm"], name="div"),
             h.make_node("Mul", ["nrm", "gamma"], ["sc"], name="mulg"),
             h.make_node("Add", ["sc", "beta"], [y], name="addb")]
    inits = [tensor("two", np.float32(2.0)), tensor("eps", np.float32(1e-5)), tensor("gamma", r(16)), tensor("beta", r(16))]
    return nodes, inits


def test_decomposed_layernorm_opset17():
    nodes, inits = ln_nodes("x", "y")
    m = mk(nodes, [value_info("x", shape=["batch", 8, 16])], [value_info("y", shape=None)], inits)
    res = chain_check(m, {"LayerNormalization": 1})
    assert res.plan.rule_counts() == {"layernorm": 1}


def test_layernorm_opset13_has_no_standard_op_left_alone():
    nodes, inits = ln_nodes("x", "y")
    m = mk(nodes, [value_info("x", shape=["batch", 8, 16])], [value_info("y", shape=None)], inits, opset=13)
    res = chain_unchanged(m)
    assert any("opset 17" in n for n in res.plan.notes)


def test_skip_layernorm_and_onnx_lowering():
    nodes, inits = ln_nodes("s", "y")
    m = mk([h.make_node("Add", ["x", "skip"], ["s"], name="resid")] + nodes,
                   [value_info("x", shape=["batch", 8, 16]), value_info("skip", shape=["batch", 8, 16])],
                   [value_info("y", shape=None)], inits)
    res = chain_check(m, {"com.microsoft:SkipLayerNormalization": 1}, rules=RULE_NAMES)  # opt-in rule
    assert res.plan.rule_counts() == {"skip_layernorm": 1}
    chain_check(m, {"Add": 1, "LayerNormalization": 1}, lower="onnx", rules=RULE_NAMES)
    default = chain_check(m, {"Add": 1, "LayerNormalization": 1})  # by default: measured slower, not fused
    assert default.plan.rule_counts() == {"layernorm": 1}


def test_skip_layernorm_needs_same_shapes():
    nodes, inits = ln_nodes("s", "y")
    m = mk([h.make_node("Add", ["x", "skip"], ["s"], name="resid")] + nodes,
                   [value_info("x", shape=["batch", 8, 16]), value_info("skip", shape=[8, 16])],
                   [value_info("y", shape=None)], inits)
    chain_check(m, {"Add": 1, "LayerNormalization": 1}, rules=RULE_NAMES)
