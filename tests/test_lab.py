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


def test_the_file_browser_gives_the_names_the_modified_column(tmp_path):
    """The left panel is narrow: with the "Last Modified" column it clipped `08_fusion_thresholds.ipynb`."""
    overrides = json.loads((ROOT / "jupyter" / "labconfig" / "default_setting_overrides.json").read_text())
    assert overrides["@jupyterlab/filebrowser-extension:browser"]["showLastModifiedColumn"] is False


def test_make_lab_serves_a_working_copy_it_never_overwrites(tmp_path):
    """`make lab` serves my-notebooks/ (git-ignored): Run All rewrites measured outputs, so the stored notebooks
    must not be the ones a learner runs; a learner's copy survives the next `make lab`, `--reset` refreshes it."""
    assert lab.WORKBOOK.parent == (ROOT / "notebooks").parent and lab.WORKBOOK.name in (ROOT / ".gitignore").read_text()
    assert "--workbook" in (ROOT / "tools" / "lab.py").read_text() and "lab-reset:" in (ROOT / "Makefile").read_text()
    src = tmp_path / "notebooks"
    src.mkdir()
    for name in ("00_a.ipynb", "01_b.ipynb"):
        (src / name).write_text(f'{{"shipped": "{name}"}}')
    dest = tmp_path / "my-notebooks"
    assert [p.name for p in lab.working_copy(dest, src)] == ["00_a.ipynb", "01_b.ipynb"]
    (dest / "00_a.ipynb").write_text('{"the learner": "ran it"}')
    (dest / "01_b.ipynb").unlink()
    assert [p.name for p in lab.working_copy(dest, src)] == ["01_b.ipynb"]  # only what is missing
    assert (dest / "00_a.ipynb").read_text() == '{"the learner": "ran it"}'
    assert len(lab.working_copy(dest, src, reset=True)) == 2
    assert (dest / "00_a.ipynb").read_text() == '{"shipped": "00_a.ipynb"}'


def test_the_notebooks_relative_paths_name_the_same_files_from_the_working_copy():
    """The notebooks read `../data/...` and `../tests/corpus/...` relative to themselves: from the working copy,
    a sibling of notebooks/, each names a file of the repository."""
    found = []
    for src in sorted((ROOT / "notebooks_src").glob("*.py")):
        for parts in re.findall(r'Path\("\.\."\)((?:\s*/\s*"[^"]+")+)', src.read_text()):
            rel = Path(*re.findall(r'"([^"]+)"', parts))
            found.append(rel)
            assert (lab.WORKBOOK / ".." / rel).resolve() == (ROOT / "notebooks" / ".." / rel).resolve()
            assert (ROOT / rel).exists(), rel
    assert found  # the check looked at something
