"""`fusionlab customop`: writes the model and package, refuses what it should, never touches the input."""

import hashlib

import onnx
import pytest

from fusionlab import zoo
from fusionlab.cli import main
from fusionlab.export import library_path
from fusionlab.graph import load
from fusionlab.verification.runtime import verify


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "cbr.onnx"
    onnx.save(zoo.conv_bn_relu(3, 8, 3, image_size=8), path)
    return path


def digest(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_list_shows_which_groups_can_become_custom_ops(model, capsys):
    assert main(["customop", str(model), "--list"]) == 0
    out = capsys.readouterr().out
    assert "v0" in out and "Conv+BatchNormalization+Relu" in out and "-> ConvRelu" in out


def test_writes_a_verified_model_and_the_package(model, tmp_path, capsys):
    before = digest(model)
    out = tmp_path / "pkg"
    assert main(["customop", str(model), "--group", "v0", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "equivalent" in text and "v0: Conv+BatchNormalization+Relu -> ConvRelu" in text
    assert digest(model) == before
    written = out / "cbr_customop.onnx"
    assert load(written).op_counts() == {"ai.onnx.contrib:ConvRelu": 1}
    assert verify(load(model), load(written), custom_ops_library=library_path(), dims={"batch": 2}).ok
    assert (out / "op_proto/conv_relu.h").exists() and (out / "msopgen/conv_relu.json").exists()


@pytest.mark.parametrize("args, message", [
    (["--group", "v9"], "no group 'v9'"),
    ([], "choose at least one --group"),
    (["--group", "v0", "--passes", "bogus"], "unknown pass"),
])
def test_bad_requests_exit_2_with_one_line(model, tmp_path, capsys, args, message):
    out = tmp_path / "pkg"
    argv = ["customop", str(model), "--out", str(out)] + args
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


def test_refuses_a_non_empty_folder_unless_forced(model, tmp_path, capsys):
    out = tmp_path / "pkg"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["customop", str(model), "--group", "v0", "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert main(["customop", str(model), "--group", "v0", "--out", str(out), "--force", "--no-verify"]) == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / "cbr_customop.onnx").exists()


def test_bad_model_file(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert main(["customop", str(bad), "--group", "v0", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith("fusionlab customop: error:")


def test_a_group_the_planner_found_through_an_identity_becomes_a_custom_op(tmp_path, capsys):
    """Regression (issue 23, the class of explain's cycle): the plan names the prepared graph, where the
    Identity between Conv and BN is gone; laid over the loaded model the group was refused ("BatchNormalization
    'bn' does not follow a Conv of the group")."""
    import numpy as np
    from onnx import helper

    from fusionlab.build import make_model, tensor, value_info

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Identity", ["c"], ["ci"], name="id"),
             helper.make_node("BatchNormalization", ["ci", "g", "b", "m", "v"], ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["y"], name="relu")]
    inits = [tensor("w", rng.standard_normal((8, 3, 3, 3)).astype(np.float32)),
             tensor("g", (1 + 0.1 * rng.standard_normal(8)).astype(np.float32)),
             tensor("b", rng.standard_normal(8).astype(np.float32)),
             tensor("m", rng.standard_normal(8).astype(np.float32)), tensor("v", np.full(8, 0.7, np.float32))]
    src = tmp_path / "id.onnx"
    src.write_bytes(make_model(nodes, [value_info("x", np.float32, [1, 3, 16, 16])],
                               [value_info("y", np.float32, [1, 8, 16, 16])], inits).SerializeToString())
    assert main(["customop", str(src), "--list"]) == 0
    assert "-> ConvRelu" in capsys.readouterr().out
    out = tmp_path / "pkg"
    assert main(["customop", str(src), "--group", "v0", "--out", str(out)]) == 0
    assert "equivalent" in capsys.readouterr().out
    assert verify(load(src), load(out / "id_customop.onnx"), custom_ops_library=library_path()).ok
