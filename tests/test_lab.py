"""tools/lab.py: the lab `make lab` starts keeps Jupyter's files in the project and lands on 00_start_here."""

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import lab  # noqa: E402


def test_every_jupyter_directory_is_under_the_state_folder(tmp_path):
    env = lab.jupyter_env(tmp_path / "state", {"HOME": "/nonexistent", "PATH": "/usr/bin"})
    dirs = {k: v for k, v in env.items() if k not in ("HOME", "PATH", "JUPYTER_CONFIG_PATH", "JUPYTER_PLATFORM_DIRS")}
    assert {"JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR", "MPLCONFIGDIR"} <= set(dirs)
    assert all(Path(v).is_relative_to(tmp_path / "state") and Path(v).is_dir() for v in dirs.values())
    assert env["JUPYTER_CONFIG_PATH"] == str(ROOT / "jupyter")


def test_makefile_exports_the_same_variables():
    exported = dict(re.findall(r"^export (\w+) := (.*)$", (ROOT / "Makefile").read_text(), re.M))
    env = lab.jupyter_env(ROOT / ".venv" / "jupyter", {})
    assert set(exported) == set(env)
    for name, value in exported.items():
        value = value.replace("$(JSTATE)", "$(CURDIR)/$(VENV)/jupyter").replace("$(CURDIR)", str(ROOT))
        value = value.replace("$(VENV)", ".venv")
        assert value == env[name], name


def test_command_binds_loopback_and_lands_on_start_here():
    cmd = lab.command(ROOT / "notebooks", 8899, token="t")
    assert "--ServerApp.ip=127.0.0.1" in cmd and "--ServerApp.port=8899" in cmd
    assert "--LabApp.default_url=/lab/tree/00_start_here.ipynb" in cmd and "--IdentityProvider.token=t" in cmd
    assert (ROOT / "notebooks" / lab.START).exists()


def test_news_and_update_checks_are_off():
    overrides = json.loads((ROOT / "jupyter" / "labconfig" / "default_setting_overrides.json").read_text())
    assert overrides["@jupyterlab/apputils-extension:notification"] == {"fetchNews": "false",
                                                                      "checkForUpdates": False}
