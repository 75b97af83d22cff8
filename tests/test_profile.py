"""Profiling: parsing onnxruntime traces, the msprof-style table, the trace file and the CLI."""

import json
import os

import numpy as np
import onnx
import pytest
from onnx import helper

from fusionlab import profile as P
from fusionlab.build import make_model, tensor, value_info
from fusionlab.cli import main
from fusionlab.graph import ModelError
from fusionlab.text import MAX_WIDTH


def _branchy(branches: int = 3, ch: int = 4, size: int = 8) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes, inits, outs = [], [], []
    for b in range(branches):
        nodes.append(helper.make_node("Conv", ["x", f"w{b}"], [f"c{b}"], name=f"conv{b}", pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{b}"], [f"r{b}"], name=f"relu{b}"))
        inits.append(tensor(f"w{b}", rng.standard_normal((ch, ch, 3, 3)).astype(np.float32)))
        outs.append(f"r{b}")
    nodes.append(helper.make_node("Concat", outs, ["y"], name="cat", axis=1))
    return make_model(nodes, [value_info("x", shape=[1, ch, size, size])],
                      [value_info("y", shape=[1, ch * branches, size, size])], inits)


def _ev(name, op, ts, dur, tid=1):
    return {"cat": "Node", "ph": "X", "name": f"{name}_kernel_time", "ts": ts, "dur": dur, "pid": 1, "tid": tid,
            "args": {"op_name": op, "provider": "CPUExecutionProvider"}}


def _run(ts, dur):
    return {"cat": "Session", "ph": "X", "name": "model_run", "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": {}}


SYNTH = [
    {"cat": "Session", "ph": "X", "name": "session_initialization", "ts": 0, "dur": 50, "pid": 1, "tid": 1, "args": {}},
    # warm-up run, to be dropped
    _ev("a", "Conv", 105, 10), _run(100, 30),
    # run 0: a [5,15) b [20,24) c [24,30) ; run lasts 35
    _ev("a", "Conv", 205, 10), _ev("b", "Relu", 220, 4), _ev("c", "Add", 224, 6), _run(200, 35),
    # run 1: two lanes overlapping: a [2,12) on tid 1, b [4,8) on tid 2, c [15,20); run lasts 21 (ts as strings)
    _ev("a", "Conv", "302", "10"), _ev("b", "Relu", 304, 4, tid=2), _ev("c", "Add", 315, 5), _run(300, 21),
]


def test_parse_waits_gaps_and_runs():
    prof = P.parse_events(SYNTH, warmup=1)
    assert prof.n_runs == 2
    r0 = prof.ops(0)
    assert [e.node for e in r0] == ["a", "b", "c"]
    assert [e.start_us for e in r0] == [5, 20, 24]
    # msprof's Task Wait Time: gap since the previous task ended (the first one: since the run started)
    assert [e.wait_us for e in r0] == [5, 5, 0]
    r1 = prof.ops(1)
    assert [e.wait_us for e in r1] == [2, 0, 3]  # b overlaps a on another thread: no wait
    assert {e.lane for e in r1} == {0, 1}
    # gap = run - time covered by some kernel: run 0: 35 - 20 = 15; run 1: 21 - 15 = 6
    assert prof.gap_us == pytest.approx((15 + 6) / 2)
    assert prof.kernel_us == pytest.approx((20 + 19) / 2)
    assert prof.ops_per_run == 3
    types = prof.by_op_type()
    assert list(types) == ["Conv", "Add", "Relu"]  # biggest time first
    assert types["Conv"]["count"] == 1 and types["Conv"]["time_us"] == 10


def test_parse_rejects_too_few_runs():
    with pytest.raises(ValueError, match="model_run"):
        P.parse_events(SYNTH[:3], warmup=1)


def test_median_run_is_representative():
    prof = P.parse_events(SYNTH + [_ev("a", "Conv", 402, 10), _run(400, 100)], warmup=1)
    assert prof.median_run() == 0  # durations 35, 21, 100 -> the 35 us run


def test_profile_real_model_accounts_for_every_node_and_all_time():
    model = _branchy()
    prof = P.profile_model(model, runs=3, warmup=1, label="branchy")
    assert prof.n_runs == 3
    names = sorted(n.name for n in model.graph.node)
    for r in range(3):
        ops = prof.ops(r)
        assert sorted(e.node for e in ops) == names
        span = prof.runs[r]
        assert all(e.dur_us >= 0 and 0 <= e.start_us and e.end_us <= span.dur_us + 1 for e in ops)
        busy = P._union_length((e.start_us, e.end_us) for e in ops)
        tail = span.dur_us - max(e.end_us for e in ops)
        assert sum(e.wait_us for e in ops) + tail == pytest.approx(span.dur_us - busy)
    assert {e.op_type for e in prof.events} == {"Conv", "Relu", "Concat"}
    table = prof.op_table()
    assert "Op Name" in table and "Wait(us)" in table and "conv0" in table
    assert abs(sum(r["Share(%)"] for r in prof.op_rows()) - 100) < 1e-6


def test_trace_file_is_valid_and_written_atomically(tmp_path):
    a = P.parse_events(SYNTH, warmup=1, label="before")
    b = P.parse_events(SYNTH, warmup=2, label="after")
    out = P.write_trace(tmp_path / "t.json", a, b)
    doc = json.loads(out.read_text())
    events = doc["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"before", "after"}
    nodes = [e for e in events if e["ph"] == "X" and e["cat"] == "Node"]
    assert len(nodes) == 6 + 3
    assert all(isinstance(e["ts"], (int, float)) and e["dur"] >= 0 for e in nodes)
    assert os.listdir(tmp_path) == ["t.json"]  # no temp file left behind


def test_failed_trace_write_leaves_nothing(tmp_path, monkeypatch):
    prof = P.parse_events(SYNTH, warmup=1)
    target = tmp_path / "t.json"
    target.write_text("old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(P.os, "replace", boom)
    with pytest.raises(OSError):
        P.write_trace(target, prof)
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["t.json"]


def test_load_trace_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ModelError) as exc:
        P.load_trace(bad)
    assert "\n" not in str(exc.value)
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    with pytest.raises(ModelError, match="model_run"):
        P.load_trace(empty)


def test_csv_op_summary(tmp_path):
    prof = P.parse_events(SYNTH, warmup=1)
    text = prof.write_csv(tmp_path / "ops.csv", run=0).read_text().splitlines()
    assert text[0].startswith("Op Name,OP Type,Thread,Task Start Time(us),Task Duration(us),Task Wait Time(us)")
    assert len(text) == 4


def test_side_by_side_counts_ops():
    a = P.parse_events(SYNTH, warmup=1, label="before")
    text = P.side_by_side(a, a)
    assert "ops per run" in text and "no kernel running" in text and "Conv" in text


def test_io_binding_runner_gives_the_same_outputs():
    model = _branchy()
    plain = P.runner(model)()
    bound = P.runner(model, io_binding=True)
    out = bound()
    np.testing.assert_array_equal(out["y"], plain[0])
    np.testing.assert_array_equal(bound()["y"], plain[0])  # buffers reused run after run
    no_arena = P.runner(model, mem_arena=False, mem_pattern=False)()
    np.testing.assert_array_equal(no_arena[0], plain[0])


def test_drawings_return_figures():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = P.parse_events(SYNTH, warmup=1, label="before")
    fig = P.draw_timeline(a, run=1)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["thread 0", "thread 1"]
    fig2 = P.draw_op_types(a, a)
    plt.close(fig)
    plt.close(fig2)


# -- command line ----------------------------------------------------------------------------------

def test_cli_profile_prints_table_and_writes_trace(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(_branchy(), src)
    out = tmp_path / "trace.json"
    assert main(["profile", str(src), "-o", str(out), "--runs", "2", "--warmup", "1"]) == 0
    text = capsys.readouterr().out
    assert "OP Type" in text and "conv0" in text
    doc = json.loads(out.read_text())
    assert any(e.get("cat") == "Node" for e in doc["traceEvents"])


def test_cli_refuses_to_overwrite_input(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(_branchy(), src)
    before = src.read_bytes()
    assert main(["profile", str(src), "-o", str(src)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "overwrite" in err
    assert src.read_bytes() == before


def test_cli_bad_model_is_one_line_and_writes_nothing(tmp_path, capsys):
    src = tmp_path / "junk.onnx"
    src.write_bytes(b"\x00not a model")
    out = tmp_path / "trace.json"
    assert main(["profile", str(src), "-o", str(out)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert not out.exists()


def test_cli_fuse_side_by_side(tmp_path, capsys):
    pytest.importorskip("fusionlab.passes.vertical")
    from fusionlab import zoo

    src = tmp_path / "m.onnx"
    onnx.save(zoo.conv_bn_relu(3, 8, 3), src)
    out = tmp_path / "trace.json"
    assert main(["profile", str(src), "--fuse", "-o", str(out), "--runs", "2", "--warmup", "1"]) == 0
    text = capsys.readouterr().out
    assert "ops per run" in text and "fused" in text
    labels = [e["args"]["name"] for e in json.loads(out.read_text())["traceEvents"] if e["name"] == "process_name"]
    assert labels == ["original", "fused"]


def test_the_op_table_fits_the_notebook_width_with_long_names_and_long_op_types():
    # a profile on a loaded machine once put a 40-character BatchNormalization node at the top: 113 characters
    long = [_ev("/model.20/m/m.0/cv1/bn/BatchNormalization_with_a_long_tail", "BatchNormalization", 205, 10),
            _ev("/model.4/m/m.1/cv2/act/Sigmoid", "Sigmoid", 220, 4), _run(200, 35)]
    prof = P.parse_events([SYNTH[0], _ev("w", "Conv", 105, 10), _run(100, 30)] + long, warmup=1)
    for sort in ("start", "duration"):
        lines = prof.op_table(sort=sort).splitlines()
        assert max(len(line) for line in lines) <= MAX_WIDTH, lines
        assert any(line.startswith("/model.20/m/m.0/cv1/bn/Batch") for line in lines)
