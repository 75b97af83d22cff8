#!/usr/bin/env python3
"""Start JupyterLab on the workbook the way `make lab` does, with every Jupyter file kept in the project.

`python tools/lab.py [--port N]` (what `make lab` runs):

- keeps Jupyter's config, data (notebook signatures), runtime files, lab settings and workspaces, IPython's
  and matplotlib's caches under `.venv/jupyter/` (`jupyter_env`), so nothing is written into your home;
- reads the project's committed Jupyter settings from `jupyter/` (news and update checks off);
- serves your working copy `my-notebooks/` (git-ignored), not the stored `notebooks/`: the first run copies
  the notebooks there, later runs keep your copy (your outputs and edits) and only add notebooks it lacks;
  `python tools/lab.py --reset` (`make lab-reset`) copies the stored ones over it again. Running a notebook
  rewrites its measured outputs, so the tracked notebooks stay as shipped and `git status` stays clean;
- trusts the working copy (`jupyter trust`), so the stored widgets render from their saved state;
- serves it on 127.0.0.1 and opens `00_start_here.ipynb`.

The browser test (`tests/browser/`) starts its lab with the same `jupyter_env`, `trust` and `command`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SETTINGS = ROOT / "jupyter"  # committed: labconfig/default_setting_overrides.json
START = "00_start_here.ipynb"
#: the learner's working copy `make lab` serves (in .gitignore). A sibling of notebooks/, so the paths the
#: notebooks read relative to themselves (`../data`, `../tests/corpus`) name the same files from it.
WORKBOOK = ROOT / "my-notebooks"


def working_copy(dest: Path = WORKBOOK, source: Path = NOTEBOOKS, *, reset: bool = False) -> list[Path]:
    """Copy the stored notebooks into `dest`, never over a notebook already there (a learner's copy, with
    their outputs and edits) unless `reset`. Returns the notebooks copied."""
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for nb in sorted(source.glob("*.ipynb")):
        target = dest / nb.name
        if reset or not target.exists():
            shutil.copy2(nb, target)
            copied.append(target)
    return copied


def jupyter_env(state: Path, base: dict | None = None) -> dict:
    """Environment that keeps every file Jupyter, IPython, matplotlib and onnxruntime write under `state`."""
    env = dict(os.environ if base is None else base)
    dirs = {
        "JUPYTER_CONFIG_DIR": "config",
        "JUPYTER_DATA_DIR": "data",
        "JUPYTER_RUNTIME_DIR": "runtime",
        "JUPYTERLAB_SETTINGS_DIR": "lab/user-settings",
        "JUPYTERLAB_WORKSPACES_DIR": "lab/workspaces",
        "IPYTHONDIR": "ipython",
        "MPLCONFIGDIR": "matplotlib",
        "NPM_CONFIG_CACHE": "npm",  # jupyter-lsp asks npm where global packages are; npm logs to its cache
        # onnxruntime writes a telemetry device id (Microsoft/DeveloperTools/.onnxruntime/) into the user's cache
        "XDG_CACHE_HOME": "cache",
    }
    for var, sub in dirs.items():
        env[var] = str(state / sub)
        Path(env[var]).mkdir(parents=True, exist_ok=True)
    env["JUPYTER_CONFIG_PATH"] = str(SETTINGS)
    env["JUPYTER_PLATFORM_DIRS"] = "1"  # the new layout, and no deprecation warning about it
    return env


def trust(notebooks: list[Path], env: dict) -> None:
    """Sign the notebooks in this environment's notary database (so stored widgets and HTML render)."""
    if notebooks:
        done = subprocess.run([sys.executable, "-m", "jupyter", "trust", *map(str, notebooks)], env=env,
                              capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"jupyter trust failed:\n{done.stdout}{done.stderr}")


def command(root_dir: Path, port: int, *, token: str | None = None, open_browser: bool = False) -> list[str]:
    """The `jupyter lab` command line: 127.0.0.1 only, `root_dir` served, landing on 00_start_here."""
    cmd = [sys.executable, "-m", "jupyter", "lab", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
           "--ServerApp.port_retries=0", f"--ServerApp.root_dir={root_dir}",
           f"--LabApp.default_url=/lab/tree/{START}"]
    if token is not None:
        cmd.append(f"--IdentityProvider.token={token}")
    if not open_browser:
        cmd.append("--no-browser")
    if os.name == "posix" and os.geteuid() == 0:
        cmd.append("--allow-root")
    return cmd


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8888)
    ap.add_argument("--state", type=Path, default=ROOT / ".venv" / "jupyter", help="where Jupyter's files go")
    ap.add_argument("--workbook", type=Path, default=WORKBOOK, help="the working copy served (git-ignored)")
    ap.add_argument("--reset", action="store_true",
                    help="copy the stored notebooks over the working copy (your outputs and edits there go), then exit")
    args = ap.parse_args(argv)
    copied = working_copy(args.workbook, reset=args.reset)
    where = args.workbook.relative_to(ROOT) if args.workbook.is_relative_to(ROOT) else args.workbook
    if args.reset:
        print(f"{where}/: {len(copied)} notebooks copied from notebooks/ (as shipped)")
        return 0
    if copied:
        print(f"{where}/: your working copy, {len(copied)} notebooks copied from notebooks/ "
              f"(kept between runs; `make lab-reset` copies them again)")
    env = jupyter_env(args.state)
    trust(sorted(args.workbook.glob("*.ipynb")), env)
    cmd = command(args.workbook, args.port, open_browser=bool(os.environ.get("DISPLAY")))
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
