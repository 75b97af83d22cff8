"""The command line reads at a glance and means one thing (issue 23).

explain predicts for the passes fuse runs and says which; tables fit 110 columns without clipping the
pattern; --why-not groups refusals by rule and condition with counts, nearest misses first, and sees a
graph output or a second reader; `explain --why-not MODEL` works; bench defaults to ALL and puts levels
side by side; show draws any size; written files get the user's umask.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from fusionlab import load, viz, zoo
from fusionlab.build import make_model, tensor, value_info
from fusionlab.cli import build_parser, main
from fusionlab.plan import DEFAULT_PASSES, _compact
from fusionlab.text import MAX_WIDTH

CORPUS = Path(__file__).resolve().parent / "corpus"


def conv_bn_relu(path: Path, *, conv_is_output=False, second_reader=False) -> Path:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["y"], name="relu")]
    outs = [value_info("y", np.float32, [1, 8, 16, 16])]
    if conv_is_output:
        outs.append(value_info("c", np.float32, [1, 8, 16, 16]))
    if second_reader:
        nodes.append(helper.make_node("Sigmoid", ["c"], ["s"], name="sig"))
        outs.append(value_info("s", np.float32, [1, 8, 16, 16]))
    inits = [tensor("w", rng.standard_normal((8, 3, 3, 3)).astype(np.float32)),
             tensor("g", (1 + 0.1 * rng.standard_normal(8)).astype(np.float32)),
             tensor("b", rng.standard_normal(8).astype(np.float32)),
             tensor("m", rng.standard_normal(8).astype(np.float32)), tensor("v", np.full(8, 0.7, np.float32))]
    path.write_bytes(make_model(nodes, [value_info("x", np.float32, [1, 3, 16, 16])], outs, inits).SerializeToString())
    return path


def _out(capsys) -> str:
    return capsys.readouterr().out


def _flat(text: str) -> str:
    """Lines joined as a reader reads them (wrapped lines continue the sentence)."""
    return " ".join(text.split())


# -- one meaning ----------------------------------------------------------------------------------------

def test_every_command_defaults_to_the_passes_fuse_runs():
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices
    for name in ("fuse", "explain", "show", "customop", "blame", "report"):
        default = next(a.default for a in sub[name]._actions if a.dest == "passes")
        assert default == ",".join(DEFAULT_PASSES), name
    explain = sub["explain"]
    assert next(a.default for a in explain._actions if a.dest == "max_group_ops") is None  # fuse's group sizes
    assert next(a.default for a in sub["bench"]._actions if a.dest == "level") == "all"


def test_the_prediction_names_its_passes_and_describes_the_model_fuse_writes(tmp_path, capsys):
    src = CORPUS / "bert.ts-fold.onnx"
    assert main(["explain", str(src), "--device", "Atlas 300I Pro"]) == 0
    out = _out(capsys)
    assert "Plan of passes vertical" in out and "fused: vertical " in out
    report = tmp_path / "r.json"
    assert main(["fuse", str(src), "-o", str(tmp_path / "f.onnx"), "--report", str(report)]) == 0
    capsys.readouterr()
    fused_groups = [g["id"] for g in json.loads(report.read_text())["plan"]["groups"]]
    explained = [line.split()[0] for line in out.splitlines() if line[:2] in ("v0", "v1", "v2", "v3", "v4")]
    assert explained == fused_groups
    assert main(["explain", str(src), "--passes", "vertical,mixed", "--device", "Atlas 300I Pro"]) == 0
    assert "fused: vertical+mixed" in _out(capsys)


# -- tables and refusals --------------------------------------------------------------------------------

def test_explain_fits_110_columns_and_shows_whole_patterns(capsys):
    from fusionlab.passes import plan

    src = CORPUS / "bert.ts-fold.onnx"
    assert main(["explain", str(src), "--passes", "vertical,horizontal,mixed"]) == 0
    lines = _out(capsys).splitlines()
    assert max(map(len, lines)) <= MAX_WIDTH
    assert not any("…" in line for line in lines)
    text = " ".join(line.strip() for line in lines)
    attention = next(g for g in plan(load(src), ("vertical",)) if g.rule == "attention")
    whole = _compact(attention.pattern)
    assert len(whole) > 60 and whole.replace("+", "+ ") in text.replace("+", "+ ").replace("  ", " ")


def test_why_not_as_people_type_it_the_option_first(tmp_path, capsys):
    src = conv_bn_relu(tmp_path / "m.onnx", conv_is_output=True)
    assert main(["explain", "--why-not", str(src)]) == 0
    assert "conv_bn: 1 refused" in _out(capsys)
    assert main(["explain", "--why-not", "conv", str(src)]) == 0  # a node, then the model
    assert "found c is a graph output" in _flat(_out(capsys))
    assert main(["explain", str(src), "--why-not", "relu"]) == 0
    assert "no rule refused relu" in _out(capsys)
    assert main(["explain", "--why-not"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model" in err


def test_a_graph_output_and_a_second_reader_are_refusals_with_the_value_that_failed(tmp_path, capsys):
    for kw, found in ((dict(conv_is_output=True), "c is a graph output"),
                      (dict(second_reader=True), "c is also read by Sigmoid sig")):
        src = conv_bn_relu(tmp_path / "m.onnx", **kw)
        assert main(["explain", "--why-not", str(src)]) == 0
        out = _flat(_out(capsys))
        assert "no rule refused anything" not in out
        assert "needs the Conv's output read by the BatchNormalization alone" in out and f"found {found}" in out
    clean = conv_bn_relu(tmp_path / "clean.onnx")  # must not: one reader, no refusal, one group
    assert main(["explain", "--why-not", str(clean)]) == 0
    assert "no rule refused anything" in _out(capsys)
    assert main(["explain", str(clean)]) == 0
    assert "conv_bn_act" in _out(capsys)


def test_why_not_groups_by_rule_with_counts_nearest_misses_first(capsys):
    src = CORPUS / "convnext.ts-fold.onnx"
    assert main(["explain", "--why-not", str(src)]) == 0
    lines = _out(capsys).splitlines()
    assert max(map(len, lines)) <= MAX_WIDTH
    heads = [line for line in lines if line.endswith(" refused")]
    assert heads == ["matmul_add_gemm: 4 refused", "transpose_cancel: 4 refused"]  # 2 pattern nodes matched first
    assert any(line.startswith("  4× needs both MatMul operands of known rank 2") and "found ranks 4 and 2" in line
               for line in lines)
    assert sum(1 for line in lines if line.lstrip().startswith("at ")) == 2  # one line of places per reason


# -- bench ------------------------------------------------------------------------------------------------

def test_bench_defaults_to_all_and_shows_the_levels_side_by_side(tmp_path, capsys):
    a = tmp_path / "a.onnx"
    a.write_bytes(zoo.conv_bn_relu(3, 8, 3, image_size=16).SerializeToString())
    b = tmp_path / "b.onnx"
    assert main(["fuse", str(a), "-o", str(b)]) == 0
    capsys.readouterr()
    assert main(["bench", str(a), "--min-time", "0", "--rounds", "2"]) == 0
    assert "a.onnx (all)" in _out(capsys)
    assert main(["bench", str(a), str(b), "--min-time", "0", "--rounds", "2"]) == 0
    out = _out(capsys)
    assert "a.onnx (all)" in out and "b.onnx (all)" in out and "A  A" not in out and "B  B" not in out
    assert main(["bench", str(a), str(b), "--levels", "--min-time", "0", "--rounds", "2"]) == 0
    rows = [line.split()[0] for line in _out(capsys).splitlines()]
    assert [r for r in rows if r in ("disable", "extended", "all")] == ["disable", "extended", "all"]
    assert main(["bench", str(a), "--levels", "all,nope"]) == 2


# -- show -----------------------------------------------------------------------------------------------------

def _png_size(path: Path) -> tuple[int, int]:
    import struct

    return struct.unpack(">II", path.read_bytes()[16:24])


def test_show_draws_a_big_model_as_a_page_not_a_strip_with_the_legend_on_top(tmp_path, capsys):
    src = CORPUS / "convnext.ts-fold.onnx"  # 77 nodes: one column was 354 x 4813 px with 6 px text
    out = tmp_path / "c.png"
    assert main(["show", str(src), "--plan", "-o", str(out)]) == 0
    w, h = _png_size(out)
    assert 0.5 < h / w < 2.5 and w > 1000
    graph = load(src)
    lay = viz.layered_layout(graph, None, wrap="auto")
    assert lay.bands > 1
    from fusionlab.passes import plan

    fig = viz.draw(graph, plan(graph))
    ax = fig.axes[0]
    fig.canvas.draw()
    legend, axes = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.y0 >= axes.y1 - 1  # above the drawing
    big = CORPUS / "bert_eager.ts-fold.onnx"
    assert len(load(big)) == 222  # refused before ("more than max_nodes=200")
    assert main(["show", str(big), "-o", str(tmp_path / "b.png")]) == 0
    w, h = _png_size(tmp_path / "b.png")
    assert 0.4 < h / w < 2.5
    capsys.readouterr()


def test_show_fused_draws_the_fused_ops_as_fused(tmp_path, capsys):
    src = conv_bn_relu(tmp_path / "m.onnx")
    assert main(["show", str(src), "--fused", "-o", str(tmp_path / "f.svg")]) == 0
    assert "1 fused ops marked" in _out(capsys)
    from fusionlab.passes import fuse

    g = load(src)
    lay = viz.layered_layout(fuse(g).graph, source=g)
    (key,) = lay.fused
    assert lay.labels[key] == ("FusedConv", "= Conv+BN+Relu")
    assert not viz.layered_layout(g).fused  # the original has no fused op


# -- files --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_written_files_get_the_users_umask(tmp_path, capsys, mask):
    src = conv_bn_relu(tmp_path / "m.onnx")
    old = os.umask(mask)
    try:
        outs = [tmp_path / "f.onnx", tmp_path / "r.json", tmp_path / "p.png", tmp_path / "c.json"]
        assert main(["fuse", str(src), "-o", str(outs[0]), "--report", str(outs[1])]) == 0
        assert main(["show", str(src), "-o", str(outs[2])]) == 0
        assert main(["explain", str(src), "--save-counts", str(outs[3])]) == 0
    finally:
        os.umask(old)
    capsys.readouterr()
    for p in outs:
        assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~mask, p.name
    outs[0].chmod(0o640)  # an existing file keeps its own mode
    assert main(["fuse", str(src), "-o", str(outs[0])]) == 0
    assert stat.S_IMODE(outs[0].stat().st_mode) == 0o640
    capsys.readouterr()
