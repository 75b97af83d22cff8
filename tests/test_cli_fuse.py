"""`fusionlab fuse`: writes a verified fused model atomically, refuses bad input with one line and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper as h

from fusionlab import load, verify
from fusionlab.build import make_model, tensor, value_info
from fusionlab.cli import main

RNG = np.random.default_rng(11)
VENV_FUSIONLAB = Path(sys.executable).parent / "fusionlab"


def conv_bn_relu():
    c = 4
    inits = [tensor("W", RNG.standard_normal((c, 2, 3, 3)).astype(np.float32)),
             tensor("g", RNG.standard_normal(c).astype(np.float32)), tensor("b", RNG.standard_normal(c).astype(np.float32)),
             tensor("m", RNG.standard_normal(c).astype(np.float32)), tensor("v", np.full(c, 0.7, np.float32))]
    nodes = [h.make_node("Conv", ["x", "W"], ["c"], name="conv", kernel_shape=[3, 3]),
             h.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"], name="bn"),
             h.make_node("Relu", ["n"], ["y"], name="relu")]
    return make_model(nodes, [value_info("x", shape=["batch", 2, 6, 6])], [value_info("y", shape=["batch", c, 4, 4])], inits)


@pytest.fixture
def model_file(tmp_path):
    p = tmp_path / "in.onnx"
    p.write_bytes(conv_bn_relu().SerializeToString())
    return p


def test_fuse_writes_verified_model_and_report(model_file, tmp_path, capsys):
    out, rep = tmp_path / "out.onnx", tmp_path / "report.json"
    before = model_file.read_bytes()
    assert main(["fuse", str(model_file), "-o", str(out), "--report", str(rep)]) == 0
    text = capsys.readouterr().out
    assert "nodes: 3 -> 1" in text and "conv_bn_act" in text and "verified" in text
    assert model_file.read_bytes() == before  # input untouched
    fused = load(out)
    assert fused.op_counts() == {"com.microsoft:FusedConv": 1}
    assert verify(model_file, out, dims={"batch": 2}).ok
    data = json.loads(rep.read_text())
    assert data["after"] == {"com.microsoft:FusedConv": 1} and data["plan"]["groups"][0]["rule"] == "conv_bn_act"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("lower,expect", [("onnx", {"Conv": 1, "Relu": 1}), ("functions", {"com.microsoft:FusedConv": 1})])
def test_lower_and_rules_options(model_file, tmp_path, lower, expect):
    out = tmp_path / "out.onnx"
    assert main(["fuse", str(model_file), "-o", str(out), "--lower", lower]) == 0
    assert load(out).op_counts() == expect
    assert main(["fuse", str(model_file), "-o", str(out), "--rules", "conv_bn", "--passes", "cleanup,vertical"]) == 0
    assert load(out).op_counts() == {"Conv": 1, "Relu": 1}


def _bad(argv, capsys, tmp_path):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("fusionlab fuse: error:")
    assert not (tmp_path / "out.onnx").exists()
    return err


def test_bad_inputs_one_line_exit_2_nothing_written(model_file, tmp_path, capsys):
    out = str(tmp_path / "out.onnx")
    assert "no such file" in _bad(["fuse", str(tmp_path / "missing.onnx"), "-o", out], capsys, tmp_path)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not a model at all")
    _bad(["fuse", str(junk), "-o", out], capsys, tmp_path)
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(model_file.read_bytes()[:120])
    _bad(["fuse", str(truncated), "-o", out], capsys, tmp_path)
    assert "unknown pass" in _bad(["fuse", str(model_file), "-o", out, "--passes", "vertical,nope"], capsys, tmp_path)
    assert "unknown vertical rule" in _bad(["fuse", str(model_file), "-o", out, "--rules", "nope"], capsys, tmp_path)


def test_refuses_to_overwrite_input(model_file, capsys):
    before = model_file.read_bytes()
    assert main(["fuse", str(model_file), "-o", str(model_file)]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert model_file.read_bytes() == before


@pytest.mark.slow
@pytest.mark.skipif(not VENV_FUSIONLAB.exists(), reason="fusionlab console script not installed")
def test_console_script(model_file, tmp_path):
    out = tmp_path / "out.onnx"
    proc = subprocess.run([str(VENV_FUSIONLAB), "fuse", "in.onnx", "-o", "out.onnx"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr
    assert "conv_bn_act" in proc.stdout and out.exists()
    proc = subprocess.run([str(VENV_FUSIONLAB), "fuse", "nothing.onnx", "-o", "o.onnx"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def _two_chains():
    c = 4
    inits = [tensor("W", RNG.standard_normal((c, 2, 3, 3)).astype(np.float32)),
             tensor("W2", RNG.standard_normal((c, c, 1, 1)).astype(np.float32))]
    for k in ("", "2"):
        inits += [tensor(f"g{k}", RNG.standard_normal(c).astype(np.float32)), tensor(f"b{k}", RNG.standard_normal(c).astype(np.float32)),
                  tensor(f"m{k}", RNG.standard_normal(c).astype(np.float32)), tensor(f"v{k}", np.full(c, 0.7, np.float32))]
    nodes = [h.make_node("Conv", ["x", "W"], ["c"], name="conv", kernel_shape=[3, 3]),
             h.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"], name="bn"),
             h.make_node("Relu", ["n"], ["r"], name="relu"),
             h.make_node("Conv", ["r", "W2"], ["c2"], name="conv2", kernel_shape=[1, 1]),
             h.make_node("BatchNormalization", ["c2", "g2", "b2", "m2", "v2"], ["y"], name="bn2")]
    return make_model(nodes, [value_info("x", shape=[1, 2, 6, 6])], [value_info("y", shape=[1, c, 4, 4])], inits)


def test_plan_from_report_applies_and_an_edited_plan_is_honoured(tmp_path, capsys):
    src = tmp_path / "two.onnx"
    src.write_bytes(_two_chains().SerializeToString())
    out1, rep = tmp_path / "a.onnx", tmp_path / "report.json"
    assert main(["fuse", str(src), "-o", str(out1), "--report", str(rep)]) == 0
    out2 = tmp_path / "b.onnx"
    assert main(["fuse", str(src), "-o", str(out2), "--plan", str(rep)]) == 0
    assert out1.read_bytes() == out2.read_bytes()
    data = json.loads(rep.read_text())
    assert [g["rule"] for g in data["plan"]["groups"]] == ["conv_bn_act", "conv_bn"]
    data["plan"]["groups"] = [g for g in data["plan"]["groups"] if g["rule"] != "conv_bn"]  # delete one group
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    out3 = tmp_path / "c.onnx"
    assert main(["fuse", str(src), "-o", str(out3), "--plan", str(edited)]) == 0
    assert load(out3).op_counts() == {"BatchNormalization": 1, "Conv": 1, "com.microsoft:FusedConv": 1}
    capsys.readouterr()


def test_stale_plan_exits_2_naming_the_group_and_writes_nothing(tmp_path, model_file, capsys):
    rep = tmp_path / "report.json"
    assert main(["fuse", str(model_file), "-o", str(tmp_path / "x.onnx"), "--report", str(rep)]) == 0
    other = tmp_path / "two.onnx"
    other.write_bytes(_two_chains().SerializeToString())
    data = json.loads(rep.read_text())
    data["plan"]["groups"][0]["nodes"] = ["conv", "bn"]  # the chain in two.onnx ends in relu: no longer matches
    data["plan"]["groups"][0]["op_types"] = ["Conv", "BatchNormalization"]
    rep.write_text(json.dumps(data))
    capsys.readouterr()
    err = _bad_cmd(["fuse", str(other), "-o", str(tmp_path / "out.onnx"), "--plan", str(rep)], capsys, 2)
    assert "group v0" in err and "does not fit" in err
    assert not (tmp_path / "out.onnx").exists()
    rep.write_text("{not json")
    assert "not a JSON plan" in _bad_cmd(["fuse", str(other), "-o", str(tmp_path / "out.onnx"), "--plan", str(rep)],
                                         capsys, 2)


def _bad_cmd(argv, capsys, code):
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_an_internal_failure_exits_3_names_the_rule_and_writes_nothing(tmp_path, model_file, capsys, monkeypatch):
    from fusionlab.passes.rules import conv

    def broken(self, cx, m):  # a rewrite that writes a node reading a tensor that does not exist
        import onnx_ir as ir
        ghost = ir.Value(name="ghost")
        return [cx.node("Relu", [ghost], base="broken")]

    monkeypatch.setattr(conv.ConvChain, "rewrite", broken)
    out = tmp_path / "out.onnx"
    err = _bad_cmd(["fuse", str(model_file), "-o", str(out)], capsys, 3)
    assert "internal error" in err and "pass vertical" in err and "rule conv_bn_act" in err and "group v0" in err
    assert "bug" in err and not out.exists()


# --------------------------------------------------------------------------------------------------
# issue 19: the net runs the model; every error names the model that fails
# --------------------------------------------------------------------------------------------------

def _far_gather(monkeypatch):
    """conv_bn_act's rewrite, followed by a Gather whose indices onnxruntime refuses at run time (not the checker)."""
    import numpy as np

    from fusionlab.passes.rules import conv

    real = conv.ConvChain.rewrite

    def broken(self, cx, m):
        nodes = real(self, cx, m)
        out = nodes[-1].outputs[0]
        idx = cx.initializer("far", np.full(4, 99, np.int64))
        g = cx.node("Gather", [out, idx], {"axis": -1}, base="far_gather")
        add = cx.node("Add", [out, g.outputs[0]], {}, base="far_add")
        return nodes + [g, add]

    monkeypatch.setattr(conv.ConvChain, "rewrite", broken)


@pytest.mark.parametrize("flags", [[], ["--no-verify"]])
def test_a_fused_model_that_does_not_run_exits_3_naming_it_even_with_no_verify(tmp_path, model_file, capsys,
                                                                              monkeypatch, flags):
    _far_gather(monkeypatch)
    out = tmp_path / "out.onnx"
    err = _bad_cmd(["fuse", str(model_file), "-o", str(out)] + flags, capsys, 3)
    assert "fails to run the fused model" in err and "rule conv_bn_act" in err and str(model_file) not in err
    assert not out.exists()


def test_no_verify_still_runs_the_fused_model_and_says_so(tmp_path, model_file, capsys):
    assert main(["fuse", str(model_file), "-o", str(tmp_path / "out.onnx"), "--no-verify"]) == 0
    assert "not compared with the original (--no-verify); the fused model ran on random inputs (dims batch=2)" in \
        capsys.readouterr().out


def _bf16_add(tmp_path):
    from onnx import TensorProto

    m = make_model([h.make_node("Add", ["a", "b"], ["c"], name="add")],
                   [h.make_tensor_value_info(n, TensorProto.BFLOAT16, [2, 3]) for n in "ab"],
                   [h.make_tensor_value_info("c", TensorProto.BFLOAT16, [2, 3])])
    p = tmp_path / "bf16.onnx"
    p.write_bytes(m.SerializeToString())
    return p


def _gather_out_of_range(tmp_path):
    nodes = [h.make_node("Add", ["idx", "five"], ["i5"], name="shift"),
             h.make_node("Gather", ["table", "i5"], ["g"], axis=0, name="gather"), h.make_node("Relu", ["g"], ["y"])]
    m = make_model(nodes, [value_info("idx", np.int64, [3])], [value_info("y", shape=[3, 4])],
                   [tensor("table", np.ones((2, 4), np.float32)), tensor("five", np.array(5, np.int64))])
    p = tmp_path / "gather.onnx"
    p.write_bytes(m.SerializeToString())
    return p


def _no_outputs(tmp_path):
    m = make_model([h.make_node("Relu", ["x"], ["y"])], [value_info("x", shape=[2])], [])
    p = tmp_path / "silent.onnx"
    p.write_bytes(m.SerializeToString())
    return p


@pytest.mark.parametrize("make, says", [(_bf16_add, "onnxruntime cannot load it"),
                                        (_gather_out_of_range, "onnxruntime failed to run it"),
                                        (_no_outputs, "has no outputs")])
@pytest.mark.parametrize("flags", [[], ["--no-verify"]])
def test_a_model_onnxruntime_cannot_load_or_run_is_refused_naming_it(tmp_path, capsys, make, says, flags):
    """The user's model, not a fusionlab bug: exit 2, one line naming the input (not "<model>")."""
    src = make(tmp_path)
    out = tmp_path / "out.onnx"
    code = 0 if (make is _gather_out_of_range and flags) else 2  # --no-verify: nothing compared, the run not judged
    if code == 0:
        assert main(["fuse", str(src), "-o", str(out)] + flags) == 0
        assert "not run: the original does not run on random inputs" in capsys.readouterr().out
        return
    err = _bad_cmd(["fuse", str(src), "-o", str(out)] + flags, capsys, 2)
    assert err.startswith(f"fusionlab fuse: error: {src}: ") and says in err and "<model>" not in err
    assert not out.exists()
