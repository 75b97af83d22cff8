"""`fusionlab explain`: plan and costs per device; bad input is one line on stderr and exit 2."""

import numpy as np
from onnx import helper

from fusionlab.build import make_model, tensor, value_info
from fusionlab.cli import main


def conv_bn_relu_model(path):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["y"], name="relu")]
    inits = [tensor("w", rng.standard_normal((8, 3, 3, 3)).astype(np.float32)),
             tensor("g", np.ones(8, np.float32)), tensor("b", np.zeros(8, np.float32)),
             tensor("m", np.zeros(8, np.float32)), tensor("v", np.ones(8, np.float32))]
    model = make_model(nodes, [value_info("x", np.float32, ["batch", 3, 16, 16])],
                       [value_info("y", np.float32, ["batch", 8, 16, 16])], inits)
    path.write_bytes(model.SerializeToString())
    return path


def test_explain_prints_plan_and_costs(tmp_path, capsys):
    src = conv_bn_relu_model(tmp_path / "m.onnx")
    before = src.read_bytes()
    assert main(["explain", str(src), "--device", "atlas 300i pro", "--device", "Atlas 800I A2", "--dim", "batch=2"]) == 0
    out = capsys.readouterr().out
    assert "conv_bn_act" in out and "Conv+BN+Relu" in out  # the plan table writes BatchNormalization as BN
    assert "Atlas 300I Pro" in out and "Atlas 800I A2 (Ascend 910B)" in out
    lines = [l for l in out.splitlines() if l.startswith(("unfused", "fused"))]
    assert len(lines) == 4  # two plans x two devices
    assert src.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_explain_bad_inputs_exit_2_one_line(tmp_path, capsys):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    assert main(["explain", str(junk)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "junk.onnx" in err
    src = conv_bn_relu_model(tmp_path / "m.onnx")
    for argv in (["--device", "Atlas 9000"], ["--passes", "diagonal"], ["--max-group-ops", "0"]):
        assert main(["explain", str(src), *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("fusionlab explain: error:")
    assert main(["explain", str(tmp_path / "missing.onnx")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_explain_numbers_add_up_on_an_export_that_preparation_cleans(capsys):
    """Issue 24: a reader checks "91 -> 57" against "31 launches saved". On the BERT TorchScript export the
    preparation removes identity Casts before planning, and the footer says how many, so the printed numbers
    add up: unfused - saved - prepared away = fused, with fused the cost table's kernels column."""
    import re
    from pathlib import Path

    corpus = Path(__file__).resolve().parent / "corpus"
    assert main(["explain", str(corpus / "bert.ts-fold.onnx"), "--device", "Atlas 300I Pro"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    saved = int(re.search(r"nodes run as \d+ kernels, (\d+) launches", out).group(1))
    unfused, fused = map(int, re.search(r"the model launches (\d+) -> (\d+) kernels", out).groups())
    removed = re.search(r"preparation removed (\d+) kernel\(s\) before planning", out)
    assert removed is not None, "the footer does not say what preparation removed"
    assert unfused - saved - int(removed.group(1)) == fused
    table = re.search(r"fused: vertical Atlas 300I Pro (\d+) ", out)
    assert table is not None and int(table.group(1)) == fused
