"""The README's Python example runs as written, and its commands exist."""

import re
from pathlib import Path

from fusionlab.cli import build_parser

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_python_examples_run(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "equivalent" in out and "groups" in out


def test_every_documented_command_exists():
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", README, re.S))
    documented = set(re.findall(r"^fusionlab (\w+) ", blocks, re.M))
    parser = build_parser()
    available = set(parser._subparsers._group_actions[0].choices)
    assert documented and documented <= available, documented - available


def test_every_vertical_rule_is_listed():
    from fusionlab.passes.vertical import RULE_NAMES

    listed = set(re.findall(r"`(\w+)`", README.split("### The vertical rules", 1)[1].split("\n## ", 1)[0]))
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
    table = README.split("| stage | module | holds |", 1)[1].split("\n\n", 1)[0]
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
