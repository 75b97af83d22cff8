"""README.md and docs/: the Python example runs, the commands exist, every link resolves, the README is short."""

import importlib.util
import re
from pathlib import Path

from fusionlab.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))
MODULES_DOC = (ROOT / "docs" / "modules.md").read_text()
RULES_DOC = (ROOT / "docs" / "rules.md").read_text()
WORKBOOK_DOC = (ROOT / "docs" / "workbook.md").read_text()
MAX_README_LINES = 150


def test_python_examples_run(capsys):
    blocks = re.findall(r"```python\n(.*?)```", MODULES_DOC, re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, "docs/modules.md", "exec"), {})
    out = capsys.readouterr().out
    assert "equivalent" in out and "groups" in out


def test_every_documented_command_exists():
    texts = [README] + [doc.read_text() for doc in DOCS]
    blocks = "\n".join(b for text in texts for b in re.findall(r"```bash\n(.*?)```", text, re.S))
    documented = set(re.findall(r"^fusionlab (\w+) ", blocks, re.M))
    parser = build_parser()
    available = set(parser._subparsers._group_actions[0].choices)
    assert documented and documented <= available, documented - available


def test_every_vertical_rule_is_listed():
    from fusionlab.passes.vertical import RULE_NAMES

    listed = set(re.findall(r"`(\w+)`", RULES_DOC.split("# The vertical rules", 1)[1].split("\n## ", 1)[0]))
    assert set(RULE_NAMES) <= listed, set(RULE_NAMES) - listed


def _modules() -> set[str]:
    root = Path(__file__).resolve().parent.parent / "fusionlab"
    names = set()
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_module_is_in_the_module_table():
    """Each module appears by its dotted name, or by its short name in the row of its package."""
    table = MODULES_DOC.split("| stage | module | holds |", 1)[1].split("\n\n", 1)[0]
    rows = table.splitlines()
    missing = []
    for name in sorted(_modules()):
        if f"`{name}`" in table or name == "fusionlab":
            continue
        parent, short = name.rsplit(".", 1)
        if not any(f"`{parent}`" in row and f"`{short}`" in row for row in rows):
            missing.append(name)
    assert not missing, missing
    listed = set(re.findall(r"`(fusionlab(?:\.\w+)*)`", table))
    assert listed <= _modules(), listed - _modules()  # nothing listed that does not exist


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def broken_links(path: Path) -> list[str]:
    """The relative link targets of a Markdown file (code blocks and spans aside) that do not exist."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    missing = []
    for target in LINK.findall(text):
        file = target.split("#", 1)[0]
        if not file or re.match(r"[a-z][a-z0-9+.-]*:", file):  # an anchor in the page, or a URL
            continue
        if not (path.parent / file).exists():
            missing.append(target)
    return missing


def test_every_relative_link_resolves():
    broken = {p.relative_to(ROOT).as_posix(): b for p in [ROOT / "README.md", *DOCS] if (b := broken_links(p))}
    assert not broken, broken


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "there.md").write_text("")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [ok](there.md#a) [in page](#x) [web](https://x.org/y) `[code](gone.md)`\n"
                    "```\n[fenced](gone.md)\n```\n[gone](gone.md) and [gone too](../nowhere/gone.md#s)\n")
    assert broken_links(page) == ["gone.md", "../nowhere/gone.md#s"]


def test_the_readme_is_short():
    lines = len(README.splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; more than {MAX_README_LINES} goes to docs/"


def test_every_notebook_is_listed():
    """Each notebook a learner opens is in the README's table and in docs/workbook.md's."""
    stems = {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert stems
    for name, text in (("README.md", README), ("docs/workbook.md", WORKBOOK_DOC)):
        missing = {s for s in stems if f"[`{s}`]" not in text}
        assert not missing, (name, sorted(missing))


def test_every_map_lists_the_path_in_order():
    """README's table, docs/workbook.md's and 00's map name every notebook once, in the order of the path (the
    browser test checks 00's links in JupyterLab; this sees a missing or misplaced row without a browser)."""
    path = sorted(p.stem for p in (ROOT / "notebooks_src").glob("[0-9][0-9]_*.py"))
    start = (ROOT / "notebooks_src" / "00_start_here.py").read_text()
    for name, text, pattern in (("README.md", README, r"^\| \[`(\d\d_\w+)`\]"),
                                ("docs/workbook.md", WORKBOOK_DOC, r"^\| \[`(\d\d_\w+)`\]"),
                                ("00_start_here", start, r"^# \| \[(\d\d_\w+)\]\(\1\.ipynb\)")):
        assert re.findall(pattern, text, re.M) == path, name


def _reading_time():
    spec = importlib.util.spec_from_file_location("reading_time", ROOT / "tools" / "reading_time.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_reading_times_are_the_estimates_of_the_current_notebooks():
    rt = _reading_time()
    assert rt.main(["--check"]) == 0
    times = rt.estimates()
    assert set(times) == set(re.findall(r"\[`(\d\d_[a-z0-9_]+)`\]\(notebooks/", README))
    grown = rt.rewrite(README, {**times, "00_start_here": times["00_start_here"] + 5})
    assert grown != README  # a notebook that grows past its figure is caught


def test_reading_time_counts_prose_words_and_code_lines(tmp_path):
    src = tmp_path / "01_x.py"
    src.write_text("# %% [markdown]\n# # Title\n# one two three\n\n# %%\n# NBVAL_IGNORE_OUTPUT\nx = 1\n\nprint(x)\n")
    rt = _reading_time()
    assert rt.counts(src) == (5, 2)
    src.write_text("# %% [markdown]\n" + "# " + " ".join(["w"] * 6000) + "\n")
    assert rt.minutes(src) == 30
