"""environment.yml (conda) and pyproject.toml (pip) describe the same pinned environment."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    from pip._vendor import tomli as tomllib


def pyproject_pins() -> dict[str, str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(meta["dependencies"]) + list(meta["optional-dependencies"]["dev"])
    pins = {}
    for r in reqs:
        name, _, version = r.partition("==")
        assert version, f"{r} is not pinned with =="
        pins[name.strip().lower()] = version.strip()
    return pins


def environment_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "environment.yml").read_text().splitlines():
        m = re.match(r"^\s*-\s+([A-Za-z0-9_.\-]+)\s*(==|=)\s*([0-9][^\s#]*)\s*$", line)
        if m and m.group(1) != "python":
            pins[m.group(1).lower()] = m.group(3)
    return pins


def test_same_packages_same_versions():
    assert environment_pins() == pyproject_pins()


def test_environment_is_named_and_installs_the_package():
    text = (ROOT / "environment.yml").read_text()
    assert re.search(r"^name:\s*fusionlab\s*$", text, re.M)
    assert "- -e ." in text


def test_installed_versions_match_the_pins():
    from importlib.metadata import version

    for name, pinned in pyproject_pins().items():
        assert version(name) == pinned, f"{name} {version(name)} installed, {pinned} pinned: run `make env`"
