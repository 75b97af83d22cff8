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
