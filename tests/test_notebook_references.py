"""Every reference to a notebook or to one of its sections points at something that exists.

The path was renumbered twice (issue 21) and a sentence such as "notebook 13 §10 walks `blame` through it" survives a
renumbering as long as nobody reads it again. This test reads every place the project refers to a notebook (the
notebooks' own sources, README, docs, the ledger, the package's and the solutions' docstrings, the benchmarks, the
Makefile, the browser tests) and checks that

* a stem (`07_cost_model`, `notebooks/07_cost_model.ipynb`) is a notebook of the path;
* "notebook NN", "notebooks NN and MM" name a notebook of the path;
* "notebook NN §K", "NN §K", "`NN_stem` §K" and, inside a notebook, a bare "§K" name a section that notebook has
  (a heading `## K.` or `### K.J`).

It cannot tell a reference that points at the wrong existing section; the prose check (tools/prose_check.py) binds
the numbers such a sentence quotes to the cited notebook's outputs, which catches most of those.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "notebooks_src"

#: where the project refers to notebooks (tests that plant fictional notebooks are not among them)
SCANNED = ("README.md", "Makefile", "docs/*.md", "data/seed_claims.json", "fusionlab/**/*.py", "solutions/*.py",
           "benchmarks/*.py", "benchmarks/results/*.md", "tools/*.py", "tests/browser/*.py", "notebooks_src/*.py")
#: generated files whose references come from a scanned source
GENERATED = {"docs/seed_claims.md"}

_STEM = re.compile(r"(?<![\w/.-])(?:notebooks(?:_src)?/)?(?P<stem>\d\d_[a-z][a-z0-9_]*?)(?P<ext>\.ipynb|\.py)?(?![\w])")
_CITE = re.compile(r"\bnotebooks?\s+(?P<list>[`*]{0,2}\d{2}[`*]{0,2}(?:\s*(?:,|and|or|&|/)\s*[`*]{0,2}\d{2}[`*]{0,2}"
                   r"(?![\d.]))*)(?![\d.])(?P<sec>\s*(?:'s\s+)?§\s*(?P<s>\d+(?:\.\d+)?)"
                   r"(?P<more>(?:\s*(?:,|and|or|&)\s*§\s*\d+(?:\.\d+)?)*))?", re.I)
_NUM_SEC = re.compile(r"(?<![\w.,:/\-#§`*])[`*]{0,2}(?P<n>\d{2})[`*]{0,2}(?:'s)?\s+§\s*(?P<s>\d+(?:\.\d+)?)")
_STEM_SEC = re.compile(r"`(?P<stem>\d\d_[a-z][a-z0-9_]*)`\s+§\s*(?P<s>\d+(?:\.\d+)?)")
_BARE = re.compile(r"(?<![§\w])§\s*(?P<s>\d+(?:\.\d+)?)(?P<range>\s*[–-]\s*§?\s*(?P<e>\d+))?")
#: text just before a bare "§K" that makes it a section of something else (the seed, CANN's notes, an issue)
_ELSEWHERE = re.compile(r"(seed|write-up|cann_facts|facts\.md|SUMMARY|reference|DESIGN|anchors|issue|spec|ONNX|"
                        r"onnxruntime|TVM|IREE|paper|\d{2}[`*]*(?:'s)?|notebooks?\s*[`*]*\d{2}[`*]*(?:\s*and)?|"
                        r"`\d\d_[a-z0-9_]+`)(?:[^.;\n]|\.\d){0,60}$", re.I)
#: a bare "§K" in these is the seed's or CANN's numbering throughout
_NOT_OURS_BARE = re.compile(r"^(?:tools|fusionlab|benchmarks|solutions|data|docs|README|Makefile|tests)")


def stems() -> dict[str, str]:
    return {p.stem[:2]: p.stem for p in sorted(SOURCES.glob("[0-9][0-9]_*.py"))}


def sections(stem: str) -> set[str]:
    """The section numbers a notebook's headings carry: '3' for '## 3. ...', '7.1' (and '7') for '### 7.1 ...'."""
    out = set()
    for m in re.finditer(r"^# #{2,4} (\d+)(?:\.(\d+))?\.?\s", (SOURCES / f"{stem}.py").read_text(), re.M):
        out.add(m.group(1))
        if m.group(2):
            out.add(f"{m.group(1)}.{m.group(2)}")
    return out


def _files():
    seen = set()
    for pattern in SCANNED:
        for p in sorted(ROOT.glob(pattern)):
            rel = p.relative_to(ROOT).as_posix()
            if p.is_file() and rel not in seen and rel not in GENERATED:
                seen.add(rel)
                yield rel, p.read_text(encoding="utf-8")


def _prose(rel: str, text: str) -> str:
    """The part of a file a reference can live in: a notebook source's markdown and comments, any other file whole."""
    if not rel.startswith("notebooks_src/"):
        return text
    return "\n".join(line if line.lstrip().startswith("#") else "" for line in text.splitlines())


def problems(files, known: dict[str, str], sections_of) -> list[str]:
    """Every dangling reference in `files` [(relative path, text)], given the notebooks `known` {number: stem}."""
    out = []
    stem_set = set(known.values())
    for rel, raw in files:
        text = _prose(rel, raw)
        own = Path(rel).stem if rel.startswith("notebooks_src/") else None

        def line_of(pos):
            return text.count("\n", 0, pos) + 1

        def sec_ok(number, section, where):
            stem = known.get(number)
            if stem is None:
                out.append(f"{rel}:{line_of(where)}: notebook {number} does not exist")
            elif section is not None and section not in sections_of(stem):
                out.append(f"{rel}:{line_of(where)}: notebook {number} ({stem}) has no §{section}")
        for m in _STEM.finditer(text):
            stem = m.group("stem")
            looks_like_notebook = m.group("ext") == ".ipynb" or "notebooks" in text[max(0, m.start() - 14):m.start()] \
                or (m.start() > 0 and text[m.start() - 1] == "`") or rel.endswith(".json")
            if looks_like_notebook and stem[:2] in known and stem not in stem_set:
                out.append(f"{rel}:{line_of(m.start())}: {stem} is not a notebook (notebook {stem[:2]} is "
                           f"{known[stem[:2]]})")
        for m in _CITE.finditer(text):
            nums = re.findall(r"\d{2}", m.group("list"))
            for i, n in enumerate(nums):
                sec_ok(n, m.group("s") if i == len(nums) - 1 else None, m.start())
            for more in re.findall(r"§\s*(\d+(?:\.\d+)?)", m.group("more") or ""):  # "notebook 17 §3 and §8"
                sec_ok(nums[-1], more, m.start())
        for m in _NUM_SEC.finditer(text):
            before = text[max(0, m.start() - 12):m.start()]
            if re.search(r"(seed|issue|issues|opset|python|version|cann_facts\.md`?)\s*$", before, re.I):
                continue
            sec_ok(m.group("n"), m.group("s"), m.start())
        for m in _STEM_SEC.finditer(text):
            if m.group("stem") in stem_set:
                sec_ok(m.group("stem")[:2], m.group("s"), m.start())
        if own is None or _NOT_OURS_BARE.match(rel):
            continue
        for m in _BARE.finditer(text):
            if _ELSEWHERE.search(text[max(0, m.start() - 80):m.start()]):
                continue
            for s in filter(None, (m.group("s"), m.group("e"))):
                if s not in sections_of(own):
                    out.append(f"{rel}:{line_of(m.start())}: §{s} is not a section of {own}")
    return out


def test_every_notebook_reference_resolves():
    found = problems(_files(), stems(), sections)
    assert not found, "dangling notebook references:\n" + "\n".join(found)


def test_the_check_sees_each_kind_of_dangling_reference():
    known = {"01": "01_a", "02": "02_b"}
    secs = {"01_a": {"1", "2"}, "02_b": {"1", "2", "3", "3.1"}}.__getitem__
    files = [
        ("docs/x.md", "See notebook 02 §3.1 and notebooks 01 and 02; `02_b` §3; notebooks/01_a.ipynb."),  # all fine
        ("docs/y.md", "As notebook 03 shows."),                   # no notebook 03
        ("docs/z.md", "Notebook 01 §4 measures it; 02 §9 too."),  # no §4 in 01, no §9 in 02
        ("docs/w.md", "notebook 02 §3 and §6 read the same function"),  # no §6 in 02
        ("README.md", "Open [`01_old`](notebooks/01_old.ipynb)."),  # a stem that was renamed
        ("notebooks_src/02_b.py", "# As §2 and §5 showed (the seed's §7 is another matter).\nx = '§8'\n"),
    ]
    found = problems(files, known, secs)
    assert not any(f.startswith("docs/x.md") for f in found), found
    assert any("docs/y.md" in f and "notebook 03 does not exist" in f for f in found)
    assert any("docs/z.md" in f and "has no §4" in f for f in found)
    assert any("docs/z.md" in f and "has no §9" in f for f in found)
    assert any("docs/w.md" in f and "has no §6" in f for f in found) and not any("w.md" in f and "§3" in f for f in found)
    assert any("README.md" in f and "01_old is not a notebook" in f for f in found)
    assert any("§5 is not a section of 02_b" in f for f in found)
    assert not any("§7" in f or "§8" in f for f in found), found  # the seed's section; code is not prose


@pytest.mark.parametrize("stem", sorted(stems().values()))
def test_sections_run_one_to_n(stem):
    """Each notebook's numbered sections are 1, 2, ..., n in order (a split or a cut leaves no gap)."""
    majors = [int(m.group(1)) for m in re.finditer(r"^# ## (\d+)\.\s", (SOURCES / f"{stem}.py").read_text(), re.M)]
    assert majors == list(range(1, len(majors) + 1)), f"{stem}: sections {majors}"
