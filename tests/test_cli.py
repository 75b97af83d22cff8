"""The `verify`, `bench` and `show` commands, and the command line as a whole."""


import numpy as np
import pytest

from fusionlab import zoo
from fusionlab.cli import main


@pytest.fixture
def models(tmp_path):
    original = zoo.conv_bn_relu(3, 8, 3, image_size=16)
    from fusionlab.passes import fuse

    fused = fuse(original, passes=("vertical",)).graph
    a = tmp_path / "a.onnx"
    b = tmp_path / "b.onnx"
    a.write_bytes(original.SerializeToString())
    fused.save(b)
    # a wrong model: same graph, one weight changed
    wrong = zoo.conv_bn_relu(3, 8, 3, image_size=16)
    init = next(i for i in wrong.graph.initializer if i.name.endswith("weight"))
    arr = np.frombuffer(init.raw_data, dtype=np.float32).copy()
    arr[0] += 0.5
    init.raw_data = arr.tobytes()
    c = tmp_path / "wrong.onnx"
    c.write_bytes(wrong.SerializeToString())
    return a, b, c


def test_verify_exit_codes(models, capsys):
    a, b, wrong = models
    assert main(["verify", str(a), str(b)]) == 0
    assert "equivalent" in capsys.readouterr().out
    assert main(["verify", str(a), str(wrong)]) == 1
    assert "NOT equivalent" in capsys.readouterr().out
    assert main(["verify", str(a), str(a.parent / "missing.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err
    assert main(["verify", str(a), str(b), "--dim", "batch=0"]) == 2
    assert "--dim" in capsys.readouterr().err


def test_verify_dims_and_tolerances(models, capsys):
    a, b, _ = models
    assert main(["verify", str(a), str(b), "--dim", "batch=3", "--seed", "7"]) == 0
    assert "3x8x16x16" in capsys.readouterr().out
    assert main(["verify", str(a), str(b), "--rtol", "0", "--atol", "0"]) in (0, 1)  # exact or not: no crash
    capsys.readouterr()
    assert main(["verify", str(a), str(b), "--draws", "5"]) == 0
    assert "equivalent on 5 input draws" in capsys.readouterr().out
    assert main(["verify", str(a), str(b), "--draws", "0"]) == 2
    assert "--draws" in capsys.readouterr().err


def test_bench_one_and_two_models(models, capsys):
    a, b, _ = models
    assert main(["bench", str(a), "--min-time", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "median" in out and "95% CI" in out and "intra_op=1" in out
    assert main(["bench", str(a), str(b), "--min-time", "0.05", "--level", "disable", "--level-b", "all"]) == 0
    out = capsys.readouterr().out
    assert "median of paired ratios" in out and "(disable)" in out and "(all)" in out
    assert main(["bench", str(a), "--threads", "0"]) == 2


@pytest.mark.parametrize("suffix", [".svg", ".png"])
def test_show_writes_a_picture(models, tmp_path, capsys, suffix):
    a, _, _ = models
    out = tmp_path / f"pic{suffix}"
    assert main(["show", str(a), "--plan", "-o", str(out)]) == 0
    assert out.exists() and out.stat().st_size > 1000
    assert "1 fusion groups highlighted" in capsys.readouterr().out
    head = out.read_bytes()[:200]
    assert (b"<svg" in head or b"<?xml" in head) if suffix == ".svg" else head.startswith(b"\x89PNG")


def test_show_refuses_bad_requests_and_writes_nothing(models, tmp_path, capsys):
    a, _, _ = models
    before = a.read_bytes()
    assert main(["show", str(a), "-o", str(a)]) == 2  # would overwrite the input
    assert main(["show", str(a), "-o", str(tmp_path / "pic.jpg")]) == 2
    assert main(["show", str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "x.svg")]) == 2
    big = tmp_path / "big.onnx"
    big.write_bytes(zoo.resnet_small().SerializeToString())
    assert main(["show", str(big), "-o", str(tmp_path / "big.svg"), "--max-nodes", "10"]) == 2
    err = capsys.readouterr().err
    assert all(line.startswith("fusionlab show: error:") for line in err.strip().splitlines())
    assert a.read_bytes() == before
    assert not any(p.suffix in (".svg", ".jpg") for p in tmp_path.iterdir())


def test_not_onnx_and_truncated_inputs(tmp_path, capsys):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"definitely not a model")
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(zoo.conv_bn_relu(3, 8, 3).SerializeToString()[:300])
    for path in (junk, cut):
        for argv in (["verify", str(path), str(path)], ["bench", str(path)], ["show", str(path), "-o", str(tmp_path / "p.svg")]):
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.onnx", "junk.onnx"]


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


@pytest.mark.parametrize("max_ops", [2, 4])
def test_fuse_with_all_passes_respects_max_group_ops(tmp_path, capsys, max_ops):
    import json

    src = tmp_path / "y.onnx"
    src.write_bytes(zoo.yolov5s(image_size=64, width_mult=0.25).SerializeToString())
    out, report = tmp_path / "f.onnx", tmp_path / "r.json"
    argv = ["fuse", str(src), "-o", str(out), "--passes", "vertical,horizontal,mixed",
            "--max-group-ops", str(max_ops), "--buffer-kb", "192", "--report", str(report)]
    assert main(argv) == 0
    assert "verified" in capsys.readouterr().out
    plan = json.loads(report.read_text())["plan"]
    mixed = [g for g in plan["groups"] if g["kind"] == "mixed"]
    assert mixed and max(len(g["nodes"]) for g in mixed) <= max_ops
    assert {g["kind"] for g in plan["groups"]} >= {"vertical", "mixed"}
    assert main(argv[:2] + ["-o", str(tmp_path / "g.onnx"), "--buffer-kb", "0"]) == 2
