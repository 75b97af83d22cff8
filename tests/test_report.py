"""`fusionlab report MODEL -o report.html`: one self-contained page (no network) with every part in it."""

from __future__ import annotations

import base64
import re
import stat

import numpy as np
from onnx import helper

from fusionlab import zoo
from fusionlab.build import make_model, value_info
from fusionlab.cli import main


def test_the_report_is_one_self_contained_page_with_every_part(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    src.write_bytes(zoo.conv_bn_relu(3, 8, 3, image_size=16).SerializeToString())
    out = tmp_path / "report.html"
    assert main(["report", str(src), "-o", str(out), "--min-time", "0", "--rounds", "2"]) == 0
    assert "self-contained" in capsys.readouterr().out
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for part in ("The plan", "The picture", "Near misses", "What fires", "Predicted", "Measured on this machine",
                 "Blame"):
        assert f">{part}" in page, part
    assert "conv_bn_act" in page and "FusedConv" in page
    for lv in ("DISABLE", "EXTENDED", "ALL"):
        assert f"<td>{lv}</td>" in page
    assert page.count("no difference") == 2
    # nothing from the network: every src/href is a data: URL or in-page
    refs = re.findall(r"""(?:src|href)=['"]([^'"]*)['"]""", page)
    assert refs and all(r.startswith("data:") or r.startswith("#") for r in refs), refs
    assert "<script" not in page and "@import" not in page and "url(" not in page
    png = base64.b64decode(re.search(r"src='data:image/png;base64,([^']+)'", page).group(1))
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    assert stat.S_IMODE(out.stat().st_mode) != 0o600


def test_a_model_that_differs_gets_blames_verdict_in_the_report(tmp_path, capsys):
    # a LayerNorm over rows far from zero mean: onnxruntime's LayerNormFusionL1 and our layernorm rule both
    # change the outputs beyond fp32's tolerance (see tests/test_blame.py)
    from test_blame import far_layernorm

    src = tmp_path / "ln.onnx"
    src.write_bytes(far_layernorm().SerializeToString())
    out = tmp_path / "r.html"
    assert main(["report", str(src), "-o", str(out), "--no-timing", "--rounds", "1", "--min-time", "0"]) == 0
    page = out.read_text()
    assert "outputs DIFFER" in page and "LayerNormFusionL1" in page and "the fused model DIFFERS" in page
    assert "Measured on this machine" not in page
    capsys.readouterr()


def test_bad_requests_write_nothing(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    src.write_bytes(make_model([helper.make_node("Relu", ["x"], ["y"])], [value_info("x", np.float32, [2])],
                               [value_info("y", np.float32, [2])]).SerializeToString())
    for argv in (["-o", str(tmp_path / "r.txt")], ["-o", str(src)], ["-o", str(tmp_path / "r.html"), "--rounds", "0"]):
        assert main(["report", str(src), *argv]) == 2
        assert capsys.readouterr().err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]

