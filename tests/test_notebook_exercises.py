"""Every notebook of the path ends with exercises that check themselves (issue 21), stored unanswered.

Seen as a class, not notebook by notebook: each notebook's last section is `## Exercises` with at least two
`exercises.NAME.check(...)` cells; each exercise module is graded in exactly one notebook, the one its docstring
names; the stored output of every check cell is the verdict on the stub (NOT ANSWERED YET), so the notebooks are
stored with the exercises open; and no notebook ends with "try next" suggestions nobody can check any more.
"""

from __future__ import annotations

import json
import pkgutil
import re
from pathlib import Path

import pytest

from fusionlab import exercises

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "notebooks_src").glob("*.py"))
_CHECK = re.compile(r"\bexercises\.([a-z_]+)\.check\(")
MIN_EXERCISES = 2


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _text(cell: dict) -> str:
    return "".join(cell["source"])


def _checks(nb: Path) -> list[tuple[str, dict]]:
    """(exercise module, cell) of every check cell of a stored notebook, in order."""
    out = []
    for cell in _cells(nb):
        if cell["cell_type"] == "code":
            out += [(m, cell) for m in _CHECK.findall(_text(cell))]
    return out


def _last_section(cells: list[dict]) -> tuple[int, str]:
    """(cell index, heading) of the notebook's last `## ` section, wherever the heading stands in a markdown cell."""
    headings = [(i, line) for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                for line in _text(c).splitlines() if line.startswith("## ")]
    assert headings, "no sections"
    return headings[-1]


def _notebook(src: Path) -> Path:
    return ROOT / "notebooks" / f"{src.stem}.ipynb"


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_every_notebook_ends_with_its_exercises(src):
    cells = _cells(_notebook(src))
    last, title = _last_section(cells)
    assert title.startswith("## Exercises"), f"{src.stem}: the last section is {title!r}, not '## Exercises'"
    checks = [m for m, _ in _checks(_notebook(src))]
    assert len(set(checks)) >= MIN_EXERCISES, f"{src.stem}: {len(set(checks))} exercise(s): {checks}"
    in_section = [m for c in cells[last:] if c["cell_type"] == "code" for m in _CHECK.findall(_text(c))]
    assert sorted(in_section) == sorted(checks), f"{src.stem}: a check cell outside the Exercises section"


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_exercises_are_stored_unanswered(src):
    for name, cell in _checks(_notebook(src)):
        shown = "".join("".join(o.get("data", {}).get("text/plain", o.get("text", ""))) for o in cell["outputs"])
        assert shown.startswith("NOT ANSWERED YET"), f"{src.stem}: exercises.{name}.check shows {shown[:80]!r}"


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_no_uncheckable_try_next_list(src):
    text = src.read_text()
    found = re.search(r"(?i)\btry next\b|\bunchecked\b", text)
    assert not found, f"{src.stem}: {found.group(0)!r} suggestions nobody can check (the exercises replace them)"


def test_each_exercise_is_graded_in_the_notebook_its_docstring_names():
    where: dict[str, list[str]] = {}
    for src in SOURCES:
        for name, _ in _checks(_notebook(src)):
            where.setdefault(name, []).append(src.stem)
    modules = {m.name for m in pkgutil.iter_modules(exercises.__path__)} - {"core"}
    assert set(where) == modules, f"graded in no notebook: {modules - set(where)}; unknown: {set(where) - modules}"
    for name, stems in where.items():
        assert len(stems) == 1, f"exercises.{name} is graded in {stems}"
        doc = (getattr(exercises, name).__doc__ or "").splitlines()[0]
        said = re.search(r"\(notebook (\d\d)\)", doc)
        assert said, f"exercises.{name}: the docstring's first line names no '(notebook NN)': {doc!r}"
        assert stems[0].startswith(said.group(1)), f"exercises.{name} says notebook {said.group(1)}, is in {stems}"


def test_the_check_finds_a_notebook_without_exercises(tmp_path):
    """The judge of this file is not blind: a notebook ending in a summary, or with one exercise, is caught."""
    def nb(cells):
        path = tmp_path / "99_x.ipynb"
        path.write_text(json.dumps({"cells": cells}))
        return path

    md = lambda s: {"cell_type": "markdown", "source": s}  # noqa: E731
    code = lambda s: {"cell_type": "code", "source": s, "outputs": []}  # noqa: E731
    assert _checks(nb([md("## Summary"), code("x = 1")])) == []
    one = _checks(nb([md("## Exercises"), code("exercises.kvcache.check(f)")]))
    assert [m for m, _ in one] == ["kvcache"] and len(one) < MIN_EXERCISES
    # a heading inside a cell counts: Summary and Exercises in one cell end in Exercises; a section after them does not
    assert _last_section([md("## Summary\n- a\n\n## Exercises\nWrite f.")])[1] == "## Exercises"
    assert _last_section([md("## Exercises"), md("More.\n\n## 7. Later")])[1] == "## 7. Later"
