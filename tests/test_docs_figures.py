"""docs/benchmarks.md says only what the benchmark result files measured.

Its tables are copied from `benchmarks/results/*.md` by `benchmarks/update_docs.py`; its prose summarises them.
Both were free to drift: a results file re-run without `update_docs.py`, or a sentence typed from an older run
(the stop-34 note found the prose "not bound to its result files"). The block must equal what `update_docs.py`
writes now, and every figure the prose types must be one a results file shows (the sentence's named file when it
names one), by the notebooks' rule in `tools/prose_check.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import prose_check  # noqa: E402
import update_docs  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"


def _sources() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((ROOT / "benchmarks" / "results").glob("*.md"))}


def _prose(text: str) -> str:
    b, e = update_docs.BEGIN, update_docs.END
    return text[:text.index(b)] + text[text.index(e) + len(e):]


def test_the_results_block_is_what_update_docs_writes():
    text = DOC.read_text()
    b, e = update_docs.BEGIN, update_docs.END
    assert text[text.index(b):text.index(e) + len(e)] == update_docs.block(), \
        "docs/benchmarks.md's tables differ from benchmarks/results: run python benchmarks/update_docs.py"


def test_every_results_file_is_reported_somewhere():
    """Each results file is in docs/benchmarks.md's block or cited by another page of docs/."""
    assert all(name in _sources() for name in update_docs.ORDER)
    docs = "\n".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    unreported = [n for n in _sources() if n not in update_docs.ORDER and f"results/{n}" not in docs]
    assert not unreported, f"results files no page reports: {unreported}"


def test_the_prose_types_only_figures_the_results_show():
    flags = prose_check.check_document("docs/benchmarks.md", _prose(DOC.read_text()), _sources())
    assert not flags, "\n".join(str(f) for f in flags)


def test_the_document_check_sees_a_typed_figure():
    sources = {"a.md": "| model | ratio |\n|---|---|\n| x | 1.23 (1.20-1.26) |\n| y | 0.97 (0.95-0.99) |\n",
               "b.md": "median 4.56 s over 31 rounds"}
    good = "On `a.md` x runs 1.23 (1.20 to 1.26) over 2 models; `b.md` took 4.6 s."
    assert prose_check.check_document("d", good, sources) == []
    bad = prose_check.check_document("d", "In `a.md` x runs 1.32 and y 0.97. It took 4.56 s over 31 rounds.",
                                     sources)
    assert [f.number for f in bad] == ["1.32"]
    named = prose_check.check_document("d", "`a.md` took 4.56 s.", sources)  # that figure is b.md's, not a.md's
    assert [f.number for f in named] == ["4.56 s"] and "a.md" in named[0].why
