"""Every command on every corpus export, as a user runs it: exit 0, output within 110 columns, no crash.

The exports come from tests/corpus/manifest.json, so new ones (LLaMA, T5, Whisper, Swin...) are picked up as
they are added. `explain --expect` checks each export against its committed expectation in
tests/corpus/expect/<name>.counts.json (fusionlab's groups per rule, onnxruntime EXTENDED's fused ops): a rule
or an onnxruntime fusion that stops or starts firing on a real export fails here, by name. A new export needs
its file: `fusionlab explain tests/corpus/X.onnx --save-counts tests/corpus/expect/X.counts.json`.

bench runs with a tiny round budget and nothing is asserted about time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fusionlab.cli import main
from fusionlab.text import MAX_WIDTH

pytestmark = pytest.mark.slow  # every command on every export: `make check` leaves it to `make test`

CORPUS = Path(__file__).resolve().parent / "corpus"
FILES = sorted(e["file"] for e in json.loads((CORPUS / "manifest.json").read_text())["models"])
EXPECT = CORPUS / "expect"


def _run(argv, capsys) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, f"exit {code}: {captured.err.strip() or captured.out[-500:]}"
    lines = captured.out.splitlines()
    wide = [line for line in lines if len(line) > MAX_WIDTH]
    assert not wide, f"{len(wide)} line(s) wider than {MAX_WIDTH}: {wide[0]!r}"
    return captured.out


@pytest.mark.parametrize("file", FILES)
def test_explain(file, capsys):
    out = _run(["explain", str(CORPUS / file), "--device", "Atlas 300I Pro"], capsys)
    assert "Plan of passes vertical" in out and "fused: vertical" in out and "…" not in out


@pytest.mark.parametrize("file", FILES)
def test_explain_why_not(file, capsys):
    out = _run(["explain", "--why-not", str(CORPUS / file)], capsys)
    assert "refused by" in out or "no rule refused anything" in out


@pytest.mark.parametrize("file", FILES)
def test_explain_expect_no_drift(file, capsys):
    counts = EXPECT / file.replace(".onnx", ".counts.json")
    assert counts.exists(), (f"no expectation for {file}: fusionlab explain tests/corpus/{file} --save-counts "
                             f"tests/corpus/expect/{counts.name}")
    assert "no drift" in _run(["explain", str(CORPUS / file), "--expect", str(counts)], capsys)


@pytest.mark.parametrize("file", FILES)
def test_show(file, tmp_path, capsys):
    out = tmp_path / "picture.png"
    _run(["show", str(CORPUS / file), "--plan", "-o", str(out)], capsys)
    assert out.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("file", FILES)
def test_bench_all_levels(file, capsys):
    out = _run(["bench", str(CORPUS / file), "--levels", "--min-time", "0", "--rounds", "1"], capsys)
    assert [line.split()[0] for line in out.splitlines()[3:6]] == ["disable", "extended", "all"]


@pytest.mark.parametrize("file", FILES)
def test_fuse(file, tmp_path, capsys):
    out = _run(["fuse", str(CORPUS / file), "-o", str(tmp_path / "fused.onnx")], capsys)
    assert "verified" in out and (tmp_path / "fused.onnx").exists()


def test_every_export_has_its_expectation_and_no_stale_one_is_left():
    have = sorted(p.name for p in EXPECT.glob("*.counts.json"))
    assert have == sorted(f.replace(".onnx", ".counts.json") for f in FILES)
