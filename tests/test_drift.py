"""The drift guard: `explain --save-counts FILE` then `explain --expect FILE` (exit 1 naming what drifted)."""

from __future__ import annotations

import json

import numpy as np
from onnx import helper

from fusionlab import drift, load
from fusionlab.build import make_model, tensor, value_info
from fusionlab.cli import main


def model(path, *, bn_output_read_elsewhere=False):
    """Conv -> BN -> Relu; the "re-export" variant also returns the BN output, so conv_bn_act cannot fire."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["y"], name="relu")]
    outs = [value_info("y", np.float32, [1, 8, 8, 8])] + \
        ([value_info("c", np.float32, [1, 8, 8, 8])] if bn_output_read_elsewhere else [])
    inits = [tensor("w", rng.standard_normal((8, 3, 3, 3)).astype(np.float32)),
             tensor("g", (1 + 0.1 * rng.standard_normal(8)).astype(np.float32)),
             tensor("b", rng.standard_normal(8).astype(np.float32)),
             tensor("m", rng.standard_normal(8).astype(np.float32)), tensor("v", np.full(8, 0.7, np.float32))]
    path.write_bytes(make_model(nodes, [value_info("x", np.float32, [1, 3, 8, 8])], outs, inits).SerializeToString())
    return path


def test_save_then_expect_passes_and_a_planted_drift_fails_naming_each_fusion(tmp_path, capsys):
    before, after = model(tmp_path / "v1.onnx"), model(tmp_path / "v2.onnx", bn_output_read_elsewhere=True)
    counts = tmp_path / "counts.json"
    assert main(["explain", str(before), "--save-counts", str(counts)]) == 0
    data = json.loads(counts.read_text())
    assert data["rules"] == {"conv_bn_act": 1} and data["passes"] == ["vertical"]
    assert data["onnxruntime"]["level"] == "extended" and data["onnxruntime"]["fused_ops"]
    capsys.readouterr()
    assert main(["explain", str(before), "--expect", str(counts)]) == 0
    assert "no drift" in capsys.readouterr().out
    assert main(["explain", str(after), "--expect", str(counts)]) == 1  # the exporter changed: fusions stopped
    out = capsys.readouterr().out
    assert "rule conv_bn_act: stopped firing (expected 1, now 0)" in out
    assert "onnxruntime com.microsoft:FusedConv: stopped firing" in out
    later = tmp_path / "counts2.json"
    assert main(["explain", str(after), "--save-counts", str(later), "--ort-level", "basic"]) == 0
    capsys.readouterr()
    assert main(["explain", str(before), "--expect", str(later)]) == 1  # and the other way: started firing
    assert "rule conv_bn_act: started firing (expected 0, now 1)" in capsys.readouterr().out


def test_a_count_that_changes_is_drift_too_and_bad_files_are_refused(tmp_path, capsys):
    src = model(tmp_path / "m.onnx")
    data = drift.counts(load(src), level=None)
    assert "onnxruntime" not in data
    data["rules"]["conv_bn_act"] = 3
    bad = tmp_path / "three.json"
    drift.save(bad, data)
    assert main(["explain", str(src), "--expect", str(bad)]) == 1
    assert "rule conv_bn_act: fires a different number of times (expected 3, now 1)" in capsys.readouterr().out
    junk = tmp_path / "junk.json"
    junk.write_text("{}")
    for path in (junk, tmp_path / "missing.json"):
        assert main(["explain", str(src), "--expect", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("fusionlab explain: error:")
    assert main(["explain", str(src), "--expect", str(bad), "--save-counts", str(tmp_path / "x.json")]) == 2
    assert main(["explain", str(src), "--save-counts", str(src)]) == 2  # never onto the model
    capsys.readouterr()
