#!/usr/bin/env python3
"""Build the workbook's notebooks from their reviewable sources, and execute them.

Each notebook has a source `notebooks_src/NN_name.py` in the "percent" format:

    # %% [markdown]
    # # A title
    # Some prose.

    # %%
    import fusionlab

A code cell whose source begins with an nbval marker comment (`# NBVAL_IGNORE_OUTPUT`, `# NBVAL_SKIP`, ...)
gets nbval's cell tag instead (`nbval-ignore-output`, `nbval-skip`; nbval honours both): the marker stays in
the reviewable source but is not the first line a learner reads in the notebook.

`python tools/nbbuild.py notebooks_src/02_conv_bn_folding.py [...]` writes
`notebooks/02_conv_bn_folding.ipynb`, executed top to bottom in the notebooks/ folder (as nbval
runs it), atomically. `--check` only verifies that every stored notebook's cells equal its source
(tests call this, so a source edit without a rebuild fails CI).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

from fusionlab.files import atomic_write

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
_MARK = re.compile(r"^# %%(?P<title>[^\[]*)(\[(?P<kind>\w+)\])?\s*$")


def parse(source: str) -> list[tuple[str, str]]:
    """[(cell_type, text)] from a percent-format script."""
    cells: list[tuple[str, list[str]]] = []
    for line in source.splitlines():
        m = _MARK.match(line)
        if m:
            cells.append(("markdown" if m.group("kind") == "markdown" else "code", []))
            continue
        if not cells:
            if line.strip():
                cells.append(("code", [line]))
            continue
        cells[-1][1].append(line)
    out = []
    for kind, lines in cells:
        while lines and not lines[-1].strip():
            lines.pop()
        while lines and not lines[0].strip():
            lines.pop(0)
        if kind == "markdown":
            lines = [l[2:] if l.startswith("# ") else l[1:] if l.startswith("#") else l for l in lines]
        if lines:
            out.append((kind, "\n".join(lines)))
    return out


_MARKER = re.compile(r"^# (NBVAL_(?:IGNORE_OUTPUT|CHECK_OUTPUT|SKIP|RAISES_EXCEPTION))\s*$")


def tagged(kind: str, text: str) -> tuple[str, list[str]]:
    """(source, tags): leading nbval marker comments of a code cell become nbval's cell tags."""
    tags: list[str] = []
    lines = text.split("\n")
    while kind == "code" and lines and _MARKER.match(lines[0]):
        tags.append(_MARKER.match(lines.pop(0)).group(1).lower().replace("_", "-"))
    return "\n".join(lines), tags


def to_notebook(cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, (kind, text) in enumerate(cells):
        text, tags = tagged(kind, text)
        cell = nbformat.v4.new_markdown_cell(text) if kind == "markdown" else nbformat.v4.new_code_cell(text)
        if tags:
            cell.metadata["tags"] = tags
        cell["id"] = f"cell-{i:03d}"  # stable ids: clean diffs
        nb.cells.append(cell)
    return nb


_BACKSPACE = re.compile(r"[^\n]\x08")
_CR_NEWLINE = re.compile(r"\r+\n")
_CR_LINE = re.compile(r"^.*\r+", re.MULTILINE)


def _overwrite(text: str) -> str:
    """What a terminal would show: backspaces and carriage returns applied (JupyterLab does the same)."""
    while _BACKSPACE.search(text):
        text = _BACKSPACE.sub("", text)
    return _CR_LINE.sub("", _CR_NEWLINE.sub("\n", text))


def as_lab_saves(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Outputs as JupyterLab keeps them: consecutive stream outputs of one name merged, overwrites applied.

    JupyterLab merges a stream message into the previous output when both are stdout (or both stderr); a
    notebook stored unmerged would change when a learner runs and saves it, leaving a dirty tree.
    """
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        merged: list = []
        for out in cell.outputs:
            if out.output_type == "stream":
                if merged and merged[-1].output_type == "stream" and merged[-1].name == out.name:
                    merged[-1].text = _overwrite(merged[-1].text + out.text)
                    continue
                out.text = _overwrite(out.text)
            merged.append(out)
        cell.outputs = merged
        cell.metadata.pop("execution", None)
    return nb


def serialise(nb: nbformat.NotebookNode) -> bytes:
    """The bytes Jupyter's server writes for this notebook (nbformat.write: sorted keys, one trailing newline)."""
    text = nbformat.writes(nb, version=nbformat.NO_CONVERT)
    return (text if text.endswith("\n") else text + "\n").encode()


def target_for(src: Path) -> Path:
    return NOTEBOOKS / (src.stem + ".ipynb")


def build(src: Path, timeout: int = 1200) -> Path:
    from nbclient import NotebookClient

    nb = to_notebook(parse(src.read_text()))
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()
    return atomic_write(target_for(src), serialise(as_lab_saves(nb)))


def out_of_sync(src: Path) -> str | None:
    """None when the stored notebook's cells equal the source; else what differs."""
    out = target_for(src)
    if not out.exists():
        return f"{out.name} missing (run: make notebooks)"
    stored = nbformat.read(out, as_version=4)
    want = [(kind, *tagged(kind, text)) for kind, text in parse(src.read_text())]
    have = [(c.cell_type, c.source, list(c.metadata.get("tags", []))) for c in stored.cells]
    if want != have:
        for i, (a, b) in enumerate(zip(want, have)):
            if a != b:
                return f"{out.name}: cell {i} differs from {src.name} (run: make notebooks)"
        return f"{out.name}: {len(have)} cells, source has {len(want)} (run: make notebooks)"
    return None


def retag(src: Path) -> Path:
    """Move the stored notebook's nbval marker comments into cell tags, outputs kept as they are (no re-run: a
    comment line changes nothing a cell prints)."""
    out = target_for(src)
    nb = nbformat.read(out, as_version=4)
    for cell in nb.cells:
        text, tags = tagged(cell.cell_type, cell.source)
        if tags:
            cell.source = text
            cell.metadata["tags"] = list(dict.fromkeys(list(cell.metadata.get("tags", [])) + tags))
    return atomic_write(out, serialise(nb))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sources", nargs="+", type=Path)
    ap.add_argument("--check", action="store_true", help="only check stored notebooks match their sources")
    ap.add_argument("--retag", action="store_true", help="only move stored notebooks' nbval markers into tags")
    args = ap.parse_args(argv)
    bad = 0
    for src in args.sources:
        if args.retag:
            retag(src)
        elif args.check:
            problem = out_of_sync(src)
            if problem:
                print(problem)
                bad += 1
        else:
            print(f"building {target_for(src).relative_to(ROOT)} ...", flush=True)
            build(src)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
