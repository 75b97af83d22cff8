"""Every printed example in docs/ that a command computes deterministically is that command's current output.

A block preceded by `<!-- output of: fusionlab ARGS -->` is checked here: the command runs in-process (from the
project's root) and every line of the block, except lines of `...` that mark an elision, must appear in its
output, in order (an elision may skip any number of lines). Examples that time something (bench, blame's
"disabling it" line) are not marked: their figures are one run's, and the docs say so. A fusion that changes
the plan's counts (issue 19's NaN-guard fill changed BERT's attention from 3 kernels to 5) turns this red
until the example is regenerated.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from fusionlab.cli import main

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))
MARK = re.compile(r"<!-- output of: fusionlab (.+?) -->\n+```[a-z]*\n(.*?)```", re.S)


def _examples():
    for doc in DOCS:
        for m in MARK.finditer(doc.read_text()):
            yield pytest.param(m.group(1).split(), m.group(2), id=f"{doc.name}:{m.group(1)}")


EXAMPLES = list(_examples())


def in_order(block: str, out: str) -> str | None:
    """None when every non-elision line of `block` is a line of `out`, in order; else the first line that is not."""
    lines, i = out.splitlines(), 0
    for want in block.rstrip("\n").splitlines():
        if want.strip() in ("...", "…"):
            continue
        while i < len(lines) and lines[i].rstrip() != want.rstrip():
            i += 1
        if i == len(lines):
            return want
        i += 1
    return None


def test_the_docs_mark_their_deterministic_examples():
    """docs/cli.md's explain, --why-not and drift examples are marked (a marker lost is a check lost)."""
    ids = [p.id for p in EXAMPLES]
    assert any(i.startswith("cli.md:explain ") for i in ids) and any("--why-not" in i for i in ids) and \
        any("--expect" in i for i in ids), ids


@pytest.mark.parametrize("argv, block", EXAMPLES)
def test_a_marked_example_is_the_commands_output(argv, block, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("COLUMNS", os.environ.get("COLUMNS", "120"))
    main(argv)
    out = capsys.readouterr()
    missing = in_order(block, out.out + out.err)
    assert missing is None, f"`fusionlab {' '.join(argv)}` no longer prints {missing!r}; it prints:\n{out.out}"


def test_a_stale_line_is_found():
    """The comparison itself: a line changed, a line out of order and an elision."""
    out = "a\nb\nc\nd\n"
    assert in_order("a\n...\nd\n", out) is None
    assert in_order("a\nc\n", out) is None
    assert in_order("a\nx\n", out) == "x"
    assert in_order("c\nb\n", out) == "b"
