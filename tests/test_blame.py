"""`fusionlab blame`: the optimisation that changed the outputs, on planted cases, and "no difference" on a clean one.

Planted in code, each with a known cause:

- onnxruntime, fp32: a LayerNorm written out over rows far from zero mean (x * 0.01 + 1000): LayerNormFusionL1
  makes one LayerNormalization whose result differs from the unfused graph by ~1e-2, far beyond fp32's
  tolerance (both are off the float64 result: the rows carry only a few significant bits of spread);
- onnxruntime, a deployment option: GeluApproximation (session config optimization.enable_gelu_approximation=1)
  turns an exact GELU into the tanh approximation, off by ~1e-3 and 1000x further from float64;
- fusionlab: a conv_bn_act rewrite made wrong by a planted bug (the folded bias shifted by 0.5).

A float16 pattern was tried first (LayerNorm, SkipLayerNorm, RMSNorm, Gelu, MatMul+Add in fp16): on
onnxruntime's CPU provider DISABLE_ALL already computes them in float32 between Casts (CastFloat16Transformer,
RemoveDuplicateCastTransformer run at every level), so fused and unfused agree within fp16's tolerance.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from fusionlab import load, zoo
from fusionlab.blame import ORT_TRANSFORMERS, blame_ort, blame_passes, transformer, transformers_run
from fusionlab.build import make_model, tensor, value_info
from fusionlab.cli import main
from fusionlab.text import MAX_WIDTH


def far_layernorm(n=64, offset=1000.0, spread=0.01):
    """x * spread + offset, then LayerNorm written out (ReduceMean, Sub, Pow, ..., Add), then Relu."""
    rng = np.random.default_rng(0)
    inits = [tensor("spread", np.array(spread, np.float32)), tensor("offset", np.array(offset, np.float32)),
             tensor("axes", np.array([-1], np.int64)), tensor("two", np.array(2.0, np.float32)),
             tensor("eps", np.array(1e-5, np.float32)),
             tensor("gamma", (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)),
             tensor("beta", (0.1 * rng.standard_normal(n)).astype(np.float32))]
    nodes = [helper.make_node("Mul", ["x", "spread"], ["xs"], name="spread"),
             helper.make_node("Add", ["xs", "offset"], ["xo"], name="offset"),
             helper.make_node("ReduceMean", ["xo", "axes"], ["m"], name="mean"),
             helper.make_node("Sub", ["xo", "m"], ["d"], name="sub"),
             helper.make_node("Pow", ["d", "two"], ["sq"], name="pow"),
             helper.make_node("ReduceMean", ["sq", "axes"], ["var"], name="var"),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="add_eps"),
             helper.make_node("Sqrt", ["ve"], ["std"], name="sqrt"),
             helper.make_node("Div", ["d", "std"], ["nrm"], name="div"),
             helper.make_node("Mul", ["nrm", "gamma"], ["sc"], name="scale"),
             helper.make_node("Add", ["sc", "beta"], ["y"], name="shift"),
             helper.make_node("Relu", ["y"], ["z"], name="relu")]
    return make_model(nodes, [value_info("x", np.float32, [4, n])], [value_info("z", np.float32, [4, n])], inits,
                      opset=18)


def erf_gelu(n=256):
    """3 * gelu(x) with the GELU written out through Erf (as exporters write it)."""
    nodes = [helper.make_node("Div", ["x", "sqrt2"], ["a"], name="div"),
             helper.make_node("Erf", ["a"], ["e"], name="erf"),
             helper.make_node("Add", ["e", "one"], ["p"], name="add"),
             helper.make_node("Mul", ["x", "p"], ["q"], name="mul"),
             helper.make_node("Mul", ["q", "half"], ["g"], name="half"),
             helper.make_node("Mul", ["g", "k"], ["y"], name="scale")]
    inits = [tensor("sqrt2", np.array(np.sqrt(2), np.float32)), tensor("one", np.array(1, np.float32)),
             tensor("half", np.array(0.5, np.float32)), tensor("k", np.array(3.0, np.float32))]
    return make_model(nodes, [value_info("x", np.float32, [8, n])], [value_info("y", np.float32, [8, n])], inits)


APPROX = {"optimization.enable_gelu_approximation": "1"}


# -- the transformer table ----------------------------------------------------------------------------

def test_the_table_names_every_transformer_the_installed_onnxruntime_runs_and_no_other():
    logged: dict[str, bool] = {}
    for model in (load(zoo.get("bert_tiny")), load(zoo.conv_bn_relu(3, 8, 3, image_size=16))):
        logged.update(transformers_run(model, "all"))
    logged.update(transformers_run(load(erf_gelu()), "all", config=APPROX))
    table = {t.name for t in ORT_TRANSFORMERS if t.kind == "transformer"}
    assert set(logged) <= table, f"the build runs transformers the table lacks: {sorted(set(logged) - table)}"
    assert table <= set(logged), f"the table names transformers the build never runs: {sorted(table - set(logged))}"
    assert len({t.name for t in ORT_TRANSFORMERS}) == len(ORT_TRANSFORMERS)
    for t in ORT_TRANSFORMERS:
        assert t.kind in ("rule", "transformer") and 0 <= t.level <= 3 and t.source.endswith(".h") and t.does


@pytest.mark.parametrize(("name", "model", "op"), [
    ("ConvBNFusion", "conv_bn", "BatchNormalization"),
    ("EliminateIdentity", "identity", "Identity"),
    ("Pad_Fusion", "pad_conv", "Pad"),  # class PadFusion: its Name() is not its class name
])
def test_rewrite_rule_names_from_the_source_are_the_ones_disabled_optimizers_takes(name, model, op, tmp_path):
    """Rules run inside Level1_RuleBasedTransformer and are not logged by name: check by their effect."""
    from fusionlab.blame import _optimised

    rng = np.random.default_rng(0)
    w = tensor("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    nodes = {"conv_bn": [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
                         helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["y"], name="bn")],
             "identity": [helper.make_node("Identity", ["x"], ["i"], name="id"),
                          helper.make_node("Conv", ["i", "w"], ["y"], name="conv")],
             "pad_conv": [helper.make_node("Pad", ["x", "pads"], ["p"], name="pad", mode="constant"),
                          helper.make_node("Conv", ["p", "w"], ["y"], name="conv")]}[model]
    inits = [w, tensor("g", np.ones(4, np.float32)), tensor("b", np.zeros(4, np.float32)),
             tensor("m", np.zeros(4, np.float32)), tensor("v", np.ones(4, np.float32)),
             tensor("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))]
    used = {i for n in nodes for i in n.input}
    g = load(make_model(nodes, [value_info("x", np.float32, [1, 3, 8, 8])], [value_info("y", np.float32, None)],
                        [t for t in inits if t.name in used]))
    ops = lambda m: {n.op_type for n in m.graph.node}  # noqa: E731
    assert op not in ops(_optimised(g, "basic", {}))
    assert op in ops(_optimised(g, "basic", {}, (name,)))
    assert transformer(name).kind == "rule" and transformer(name).level == 1


# -- onnxruntime, planted -----------------------------------------------------------------------------

def test_blames_layer_norm_fusion_for_rows_far_from_zero_mean_and_writes_a_repro_that_still_differs(tmp_path):
    g = load(far_layernorm())
    res = blame_ort(g, "all", shrink_budget=20, repro=tmp_path / "repro.onnx", time_budget=0.05, rounds=3)
    assert res.differs and res.verdict.max_abs > 10 * res.verdict.tolerance
    assert res.culprits == ["LayerNormFusionL1"]
    assert res.fixed.ok and res.fixed.max_abs < res.verdict.tolerance
    assert "com.microsoft:SimplifiedLayerNormalization" in res.gone_ops or "ReduceMean" in res.gone_ops
    assert res.made_ops == {"LayerNormalization": 1}
    assert set(res.reference) == {"disable", "all", "without"} and all(v > 0 for v in res.reference.values())
    assert res.cost is not None and res.cost.rounds >= 3
    # the repro: smaller, valid, and it still differs and is still fixed by disabling the same transformer
    small = onnx.load(str(res.repro))
    onnx.checker.check_model(small, full_check=True)
    assert res.repro_nodes[1] == len(small.graph.node) < len(far_layernorm().graph.node)
    again = blame_ort(load(res.repro), "all", shrink_budget=None, time_budget=0.0, rounds=1)
    assert again.culprits == ["LayerNormFusionL1"]


def test_blames_gelu_approximation_when_the_deployment_enables_it_and_the_reference_says_it_lost_accuracy():
    g = load(erf_gelu())
    plain = blame_ort(g, "all", shrink_budget=None, time_budget=0.0, rounds=1)
    assert not plain.differs and not plain.culprits  # the exact GELU fusions change nothing beyond tolerance
    res = blame_ort(g, "all", config=APPROX, shrink_budget=None, time_budget=0.05, rounds=3)
    assert res.culprits == ["GeluApproximation"] and res.fixed.ok
    assert res.made_ops.get("com.microsoft:FastGelu") == 1
    assert res.reference["all"] > 100 * res.reference["disable"]  # further from float64: less accurate


def test_the_command_prints_one_screen_naming_the_transformer_and_exits_1(tmp_path, capsys, monkeypatch):
    src = tmp_path / "gelu.onnx"
    src.write_bytes(erf_gelu().SerializeToString())
    monkeypatch.chdir(tmp_path)
    code = main(["blame", str(src), "--config", "optimization.enable_gelu_approximation=1", "--min-time", "0",
                 "--rounds", "2", "--shrink-budget", "15"])
    out = capsys.readouterr().out
    assert code == 1
    lines = out.splitlines()
    assert len(lines) <= 24 and max(map(len, lines)) <= MAX_WIDTH
    assert "outputs DIFFER" in out and "responsible: GeluApproximation" in out
    assert "without it" in out and "disabling it" in out and "further from it" in out
    assert 'disabled_optimizers=["GeluApproximation"]' in out
    assert (tmp_path / "gelu.ort-repro.onnx").exists() and "repro: gelu.ort-repro.onnx" in out
    assert "fusionlab passes vertical" in out  # the same command looked at fusionlab's passes too


def test_a_clean_model_has_no_difference_and_nothing_is_written(tmp_path, capsys, monkeypatch):
    src = tmp_path / "clean.onnx"
    src.write_bytes(zoo.conv_bn_relu(3, 8, 3, image_size=16).SerializeToString())
    monkeypatch.chdir(tmp_path)
    assert main(["blame", str(src), "--min-time", "0", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("no difference") == 2 and "DIFFER" not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clean.onnx"]


# -- fusionlab's own passes, with a planted bug -------------------------------------------------------

@pytest.fixture
def wrong_conv_fold(monkeypatch):
    """conv_bn_act made wrong: the folded bias is off by 0.5 (a planted bug in the rewrite)."""
    from fusionlab.passes.rules import conv

    real = conv._fold

    def planted(head, steps):
        folded = real(head, steps)
        folded.bias = folded.bias + np.asarray(0.5, folded.bias.dtype)
        return folded

    monkeypatch.setattr(conv, "_fold", planted)


def two_chains():
    rng = np.random.default_rng(3)
    c = 4
    inits = [tensor("W", rng.standard_normal((c, 2, 3, 3)).astype(np.float32)),
             tensor("W2", rng.standard_normal((c, c, 1, 1)).astype(np.float32))]
    for k in ("", "2"):
        inits += [tensor(f"g{k}", rng.standard_normal(c).astype(np.float32)),
                  tensor(f"b{k}", rng.standard_normal(c).astype(np.float32)),
                  tensor(f"m{k}", rng.standard_normal(c).astype(np.float32)), tensor(f"v{k}", np.full(c, 0.7, np.float32))]
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv", kernel_shape=[3, 3]),
             helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["r"], name="relu"),
             helper.make_node("Tanh", ["r"], ["t"], name="tanh"),
             helper.make_node("Conv", ["t", "W2"], ["c2"], name="conv2", kernel_shape=[1, 1]),
             helper.make_node("BatchNormalization", ["c2", "g2", "b2", "m2", "v2"], ["y"], name="bn2")]
    return make_model(nodes, [value_info("x", shape=[1, 2, 6, 6])], [value_info("y", shape=[1, c, 4, 4])], inits)


def test_blames_the_rule_and_group_of_a_planted_bug_and_the_repro_keeps_it(wrong_conv_fold, tmp_path):
    g = load(two_chains())
    res = blame_passes(g, ["vertical"], shrink_budget=20, repro=tmp_path / "ours.onnx", time_budget=0.0, rounds=1)
    assert res.differs and res.group is not None
    assert (res.group.rule, res.group.id) == ("conv_bn_act", "v0")  # the first wrong group, found by bisection
    assert res.others == ["v1"] and not res.fixed.ok  # the later conv_bn group carries the same bug
    small = load(res.repro)
    assert len(small) <= len(g) and blame_passes(small, ["vertical"], shrink_budget=None, time_budget=0.0,
                                                 rounds=1).differs


def test_without_the_planted_bug_the_passes_are_not_blamed(tmp_path):
    res = blame_passes(load(two_chains()), ["vertical"], shrink_budget=None, time_budget=0.0, rounds=1)
    assert not res.differs and res.group is None and res.groups == 2


def test_the_command_blames_our_rule_by_name(wrong_conv_fold, tmp_path, capsys, monkeypatch):
    src = tmp_path / "two.onnx"
    src.write_bytes(two_chains().SerializeToString())
    monkeypatch.chdir(tmp_path)
    assert main(["blame", str(src), "--only", "fusionlab", "--min-time", "0", "--rounds", "1",
                 "--shrink-budget", "10"]) == 1
    out = capsys.readouterr().out
    assert "responsible: rule conv_bn_act, group v0" in out and "onnxruntime" not in out.splitlines()[0]
    assert (tmp_path / "two.fusionlab-repro.onnx").exists()
    assert main(["blame", str(src), "--config", "novalue"]) == 2


def test_the_float16_offset_layernorm_of_notebook_10_is_blamed_on_layernorm_fusion():
    # the model notebook 17 walks blame through: onnxruntime's fused LayerNormalization (float16 on the CPU)
    # moves the outputs beyond float16's tolerance, and the float64 reference says the fused one is the worse
    from fusionlab.blame import blame_ort
    from fusionlab.zoo import offset_layernorm

    res = blame_ort(offset_layernorm(), shrink_budget=None, rounds=2, time_budget=0.05)
    assert res.differs and res.culprits == ["LayerNormFusionL1"]
    assert res.fixed.ok
    assert res.reference["all"] > 10 * res.reference["disable"]
    clean = blame_ort(offset_layernorm(offset=0.0, spread=1.0), shrink_budget=None, rounds=2, time_budget=0.05)
    assert not clean.differs
