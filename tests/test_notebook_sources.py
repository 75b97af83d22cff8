"""Every notebook is stored executed and matches its reviewable source in notebooks_src/."""

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import nbbuild  # noqa: E402

SOURCES = sorted((ROOT / "notebooks_src").glob("*.py"))


def test_there_are_notebooks():
    assert SOURCES, "no notebook sources found"
    assert sorted(p.stem for p in SOURCES) == sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_notebook_matches_source_and_is_executed(src):
    assert nbbuild.out_of_sync(src) is None, nbbuild.out_of_sync(src)
    nb = json.loads(nbbuild.target_for(src).read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c["execution_count"] is not None for c in code), "cells stored unexecuted"
    assert not any(o.get("output_type") == "error" for c in code for o in c["outputs"]), "stored error output"
    tags = [c["metadata"].get("tags", []) for c in code]
    ignored = sum(bool({"nbval-ignore-output", "nbval-skip"} & set(t)) for t in tags)
    assert not any("".join(c["source"]).lstrip().startswith("# NBVAL") for c in code), (
        "an nbval marker is a cell's first line: the build should have made it a tag")
    assert ignored <= len(code) / 3, f"{ignored} of {len(code)} code cells unchecked by nbval"
    text = json.dumps(nb)
    for needle in ("/tmp/", "/work/", "/root/", "/home/"):
        assert needle not in text, f"machine path {needle} in notebook"


def test_nbval_markers_become_cell_tags():
    nb = nbbuild.to_notebook(nbbuild.parse("# %%\n# NBVAL_IGNORE_OUTPUT\nprint(1)\n\n# %%\n# NBVAL_SKIP\nx\n"
                                           "\n# %%\n# a comment\n# NBVAL_IGNORE_OUTPUT\ny\n"))
    assert [(c.source, c.metadata.get("tags")) for c in nb.cells] == [
        ("print(1)", ["nbval-ignore-output"]), ("x", ["nbval-skip"]),
        ("# a comment\n# NBVAL_IGNORE_OUTPUT\ny", None)]  # only a leading marker moves (nbval reads the rest)


def test_parse_percent_format():
    cells = nbbuild.parse("# %% [markdown]\n# # Title\n# text\n\n# %%\nx = 1\n\n\n# %%\nprint(x)\n")
    assert cells == [("markdown", "# Title\ntext"), ("code", "x = 1"), ("code", "print(x)")]


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_no_blanket_warning_filter(src):
    text = src.read_text()
    assert 'filterwarnings("ignore")' not in text and "simplefilter(\"ignore\")" not in text, (
        "silence only named, explained warnings")


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_the_learner_is_asked_to_predict_before_a_measurement(src):
    assert "**Predict" in src.read_text(), "ask for a prediction before at least one measurement, then show it"


# Program text printed verbatim: breaking its lines would change the program a reader copies.
WIDE_OUTPUT_ALLOWED = {
    ("16_custom_op", 'print(files["ascendc/op_kernel/conv_relu.cpp"])'): "generated Ascend C kernel",
    ("16_custom_op", 'print(files["atc.sh"])'): "generated shell script",
    ("20_dynamic_shapes", 'print("atc --model=bert.onnx'): "an atc command line, pasted into a shell as is",
}
MAX_LINE = 110  # JupyterLab's notebook column at its default width shows about this many characters


def _text_outputs(cell) -> list[str]:
    texts = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            texts.append("".join(o["text"]))
        elif o["output_type"] in ("execute_result", "display_data"):
            data = o.get("data", {})
            if "text/plain" in data and not ({"text/html", "image/png", "image/svg+xml"} & set(data)
                                             or "application/vnd.jupyter.widget-view+json" in data):
                texts.append("".join(data["text/plain"]))
    return texts


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_text_outputs_fit_the_notebook_width(src):
    nb = json.loads(nbbuild.target_for(src).read_text())
    wide = []
    for i, cell in enumerate(nb["cells"]):
        source = "".join(cell["source"])
        if any(stem == src.stem and needle in source for stem, needle in WIDE_OUTPUT_ALLOWED):
            continue
        for text in _text_outputs(cell):
            wide += [f"cell {i}: {len(line)} chars: {line[:60]}..." for line in text.splitlines() if len(line) > MAX_LINE]
    assert not wide, "\n".join(wide)


def test_the_allowed_wide_outputs_still_exist():
    for (stem, needle), why in WIDE_OUTPUT_ALLOWED.items():
        assert needle in (ROOT / "notebooks_src" / f"{stem}.py").read_text(), f"stale allowance: {stem} {why}"


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_stored_as_jupyterlab_saves_it(src):
    """Re-writing the notebook as Jupyter's server does on save (after the lab merged streams) changes no byte."""
    import nbformat

    path = nbbuild.target_for(src)
    stored = path.read_bytes()
    nb = nbformat.reads(stored.decode(), as_version=nbformat.NO_CONVERT)
    assert nbbuild.serialise(nbbuild.as_lab_saves(nb)) == stored, f"{path.name}: run `make notebooks`"
    for cell in nb.cells:
        outs = cell.get("outputs", [])
        for a, b in zip(outs, outs[1:]):
            assert not (a.output_type == b.output_type == "stream" and a.name == b.name), "unmerged streams"


#: the longest notebook file name JupyterLab's file browser showed unclipped (the browser test measures the pixels:
#: `14_quantized_transformer.ipynb`, 30 characters, was clipped at 210 px of text in 202 px)
LONGEST_SHOWN_WHOLE = len("04_vertical_transformer.ipynb")


def test_every_notebook_name_fits_the_file_browser():
    """A learner finds notebooks by name in the lab's left panel; a name longer than the panel shows is clipped.
    The browser test measures it in pixels, but only in `make test`: this catches a too-long name in `make check`."""
    long = [p.name for p in (ROOT / "notebooks").glob("*.ipynb") if len(p.name) > LONGEST_SHOWN_WHOLE]
    assert not long, f"notebook names the file browser would clip: {long}"


def test_learner_sees_only_notebooks():
    """The lab's file browser shows notebooks/: sources and test config live elsewhere."""
    visible = sorted(p.name for p in (ROOT / "notebooks").iterdir() if not p.name.startswith("."))
    assert visible and all(name.endswith(".ipynb") for name in visible), visible


_PROSE_AS_COMMENT = re.compile(r"^# (#+ |\*\*|- \S)", re.M)  # a heading, bold lead-in or list item, commented out


def prose_in_code(cells: list[tuple[str, str]]) -> list[int]:
    """Code cells holding markdown written as comments: a lost `# %% [markdown]` marker (issue 20, notebook 05)."""
    return [i for i, (kind, text) in enumerate(cells) if kind == "code" and _PROSE_AS_COMMENT.search(text)]


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_no_prose_hidden_in_a_code_cell(src):
    assert prose_in_code(nbbuild.parse(src.read_text())) == [], "a `# %% [markdown]` marker is missing"


def test_a_lost_markdown_marker_is_caught():
    lost = nbbuild.parse("# %%\nprint(1)\n\n# Some words.\n#\n# ## Summary\n#\n# - a point\n")
    assert prose_in_code(lost) == [0]
    assert prose_in_code(nbbuild.parse("# %%\n# a comment\nx = 1  # **not** prose\n")) == []
