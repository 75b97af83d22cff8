"""Drive JupyterLab in headless Chromium (Debian's chromium + chromedriver) with selenium: start a lab, open,
run and save notebooks, read what a learner sees. Used by tests/browser/; `tools/lab.py` builds the lab."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

#: the tree under test: this repository, or FUSIONLAB_BROWSER_REPO (e.g. another checkout, to run these checks
#: against its code and notebooks)
ROOT = Path(os.environ.get("FUSIONLAB_BROWSER_REPO") or Path(__file__).resolve().parents[2]).resolve()

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
# as the machine notes say: no background connections (the network is closed), a fresh profile
CHROME_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1400,1000", "--force-device-scale-factor=1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fresh_clone(src: Path, dest: Path) -> Path:
    """A git repository at `dest` holding `src`'s tracked files as they are in its working tree, committed:
    what a learner's fresh clone holds (uncommitted edits included, ignored files such as .venv/ left out)."""
    files = subprocess.run(["git", "-C", str(src), "ls-files", "-z"], capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        if (src / rel).is_file():  # a deleted, not yet committed file is no part of the tree
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, dest / rel)  # a copy, never a link: the lab must not write into `src`
    git = ["git", "-C", str(dest), "-c", "user.name=browser test", "-c", "user.email=test@localhost"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "fresh clone"]):
        subprocess.run(git + args, capture_output=True, check=True)
    return dest


class Lab:
    """JupyterLab as `make lab` starts it (`tools/lab.py` in a fresh clone), on a free 127.0.0.1 port, with a token.

    `root` is the folder the server serves, as the server itself reports it; `repo` the clone, whose
    `git status` says what running and saving the notebooks changed in a learner's checkout."""

    def __init__(self, workdir: Path, *, source: Path = ROOT, expose_app: bool = True):
        self.workdir = workdir
        self.repo = fresh_clone(source, workdir / "clone")
        self.home = workdir / "home"  # HOME for the server: the test checks nothing lands there
        self.home.mkdir()
        state = workdir / "state"
        config = state / "config"
        config.mkdir(parents=True)
        if expose_app:  # the lab's app object for the test to read (the config folder lab.py points Jupyter at)
            (config / "jupyter_lab_config.json").write_text(json.dumps({"LabApp": {"expose_app_in_browser": True}}))
        self.port = free_port()
        self.token = secrets.token_hex(16)
        env = {k: v for k, v in os.environ.items() if k != "DISPLAY"}  # lab.py opens no browser without one
        env.update(HOME=str(self.home), JUPYTER_TOKEN=self.token, PYTHONPATH=str(self.repo))
        self.env = env
        cmd = [sys.executable, str(self.repo / "tools" / "lab.py"), "--port", str(self.port), "--state", str(state)]
        self.log = open(workdir / "lab.log", "wb")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.repo,
                                     start_new_session=True)  # lab.py and the jupyter it starts: one group
        self.url = f"http://127.0.0.1:{self.port}"
        self._wait_ready()
        servers = [json.loads(p.read_text()) for p in (state / "runtime").glob("jpserver-*.json")]
        served = [Path(s["root_dir"]) for s in servers if s.get("port") == self.port]
        assert served, f"no server file for port {self.port} in {state / 'runtime'}:\n{self.log_text()}"
        self.root = served[0]

    def git_status(self) -> str:
        """`git status --porcelain` in the clone: what running and saving left changed (or new) in a checkout."""
        return subprocess.run(["git", "-C", str(self.repo), "status", "--porcelain"], capture_output=True,
                              text=True, check=True).stdout

    def _wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"jupyter lab not answering after {timeout} s:\n{self.log_text()}")

    def api(self, path: str, method: str = "GET"):
        req = urllib.request.Request(f"{self.url}{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read()
        return json.loads(body) if body else None

    def log_text(self) -> str:
        self.log.flush()
        return (self.workdir / "lab.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:  # shut kernels down cleanly, then the server
                self.api("/api/shutdown", "POST")
                self.proc.wait(timeout=30)
            except Exception:
                import signal

                os.killpg(self.proc.pid, signal.SIGTERM)  # lab.py's group: it and its jupyter server
                try:
                    self.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def chrome(profile: Path):
    """A selenium session on Debian's headless Chromium, through Debian's chromedriver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in CHROME_FLAGS + [f"--user-data-dir={profile}"]:
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=CHROMEDRIVER, log_output=str(profile.parent / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=opts)
    driver.set_script_timeout(900)
    return driver


# --------------------------------------------------------------------------------------------------
# the page: JupyterLab's exposed app (`--LabApp.expose_app_in_browser`) is used to *observe* it (which
# notebook is open, kernel status, cell outputs); input goes through real keyboard and mouse events.
# --------------------------------------------------------------------------------------------------

# the notebook panel shown in the main area (shell.currentWidget follows focus, which headless may not give)
_JS_PANEL = """
window.flPanel = () => {
  const app = window.jupyterapp; if (!app) return null;
  for (const w of app.shell.widgets('main')) { if (w.isVisible && w.content && w.context) return w; }
  return null;
};
"""
_JS_CURRENT = _JS_PANEL + "const w = flPanel(); return w ? w.context.path : null;"

_JS_IDLE = _JS_PANEL + """
const w = flPanel(); const s = w && w.sessionContext;
return !!(s && s.session && s.session.kernel && s.session.kernel.status === 'idle' && !s.isRestarting
          && w.context.isReady);
"""


class Page:
    """One browser tab on a lab: open notebooks, press keys, wait for JupyterLab's state."""

    def __init__(self, driver, lab: Lab, shots: Path | None = None):
        self.d, self.lab, self.shots = driver, lab, shots
        self.ran: dict[str, float] = {}  # notebook -> seconds its (last) Run All took
        self.live: set[str] = set()  # notebooks run in the kernel that is open now

    def screenshot(self, name: str, element=None) -> Path | None:
        """A PNG of the window (or of one element) under `shots`, to look at; never compared."""
        if self.shots is None:
            return None
        path = self.shots / f"{name}.png"
        (element.screenshot if element is not None else self.d.save_screenshot)(str(path))
        return path

    def wait(self, predicate, timeout: float, what: str):
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.support.ui import WebDriverWait

        # JupyterLab re-renders outputs: an element found a moment ago may be gone; look again
        return WebDriverWait(self.d, timeout, poll_frequency=0.2,
                             ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda d: predicate(), message=what)

    def js(self, script: str, *args):
        return self.d.execute_script(script, *args)

    def start(self, timeout: float = 180, name: str | None = None) -> None:
        """Load the lab at its root URL, as `make lab` prints it (it lands on the start notebook), or on `name`."""
        self.d.get(f"{self.lab.url}/{'lab/tree/' + name if name else ''}?token={self.lab.token}")
        self.live.clear()
        self.wait(lambda: self.js(_JS_CURRENT) is not None, timeout, "the lab opened no notebook")
        self.wait(lambda: self.js(_JS_IDLE), timeout, "kernel not idle")

    def open(self, name: str, timeout: float = 180) -> None:
        """Open a notebook (File > Open's command), closing the others and shutting their kernels down."""
        if self.js(_JS_CURRENT) is None:
            self.start(timeout, name)
        if self.js(_JS_CURRENT) == name:
            return
        self.d.execute_async_script(_JS_PANEL + """const done = arguments[arguments.length - 1];
            const app = window.jupyterapp;
            (async () => {
              for (const w of Array.from(app.shell.widgets('main'))) {
                if (w.context) { await w.sessionContext.shutdown(); w.dispose(); }
              }
              await app.commands.execute('docmanager:open', {path: arguments[0]});
            })().then(() => done(null), e => done(String(e)));""", name)
        self.live.clear()  # their kernels are gone
        self.wait(lambda: self.js(_JS_CURRENT) == name, timeout, f"{name} not opened")
        self.wait(lambda: self.js(_JS_IDLE), timeout, f"{name}: kernel not idle")

    def press(self, *keys) -> None:
        from selenium.webdriver.common.action_chains import ActionChains

        chain = ActionChains(self.d)
        mods = [k for k in keys[:-1]]
        for k in mods:
            chain.key_down(k)
        chain.send_keys(keys[-1])
        for k in reversed(mods):
            chain.key_up(k)
        chain.perform()

    def save(self, timeout: float = 60) -> None:
        """Ctrl+S in the notebook, as a learner saves; wait until the server has answered the save."""
        from selenium.webdriver.common.keys import Keys

        self.js(_JS_PANEL + """const c = flPanel().context; window.flSaved = false;
            const done = (_, state) => { if (state === 'completed') { window.flSaved = true;
                                                                     c.saveState.disconnect(done); } };
            c.saveState.connect(done);""")
        self.focus_notebook()
        self.press(Keys.CONTROL, "s")
        self.wait(lambda: self.js("return window.flSaved === true"), timeout, "save did not complete")

    def focus_notebook(self) -> None:
        """Click the notebook's first cell's prompt area: command mode, focus in the notebook."""
        self.js(_JS_PANEL + "flPanel().content.activeCellIndex = 0;")
        el = self.d.find_element("css selector", ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .jp-InputPrompt")
        el.click()

    def run_all(self, cell_timeout: float = 300, timeout: float = 900) -> float:
        """Run > Run All Cells; wait until every code cell has run. Returns seconds taken.

        Fails when one cell runs longer than `cell_timeout` or the whole run longer than `timeout`."""
        self.js(_JS_PANEL + """window.flRun = null;
            window.jupyterapp.commands.execute('notebook:run-all-cells').then(
                ok => { window.flRun = ok ? 'ok' : 'failed'; }, e => { window.flRun = 'error: ' + e; });""")
        t0 = last_change = time.monotonic()
        running = None
        while True:
            state = self.js(_JS_PANEL + """const cells = flPanel().content.widgets.map(w => w.model);
                const i = cells.findIndex(m => m.type === 'code' && m.executionState === 'running');
                return [window.flRun, i];""")
            now = time.monotonic()
            if state[0] is not None and state[1] == -1:
                break
            if state[1] != running:
                running, last_change = state[1], now
            if now - last_change > cell_timeout:
                raise TimeoutError(f"{self.js(_JS_CURRENT)}: cell {running} still running after {cell_timeout} s")
            if now - t0 > timeout:
                raise TimeoutError(f"{self.js(_JS_CURRENT)}: Run All not done after {timeout} s")
            time.sleep(0.25)
        self.wait(lambda: self.js(_JS_IDLE), 60, "kernel not idle after Run All")
        if state[0] != "ok":
            raise AssertionError(f"{self.js(_JS_CURRENT)}: Run All reported {state[0]}: {self.problems()}")
        self.live.add(self.js(_JS_CURRENT))
        return time.monotonic() - t0

    def outputs(self) -> list[list[dict]]:
        """Every cell's outputs as the notebook model holds them (what would be saved)."""
        return self.js(_JS_PANEL + "return flPanel().content.widgets.map(w => w.model.type === 'code' ? "
                       "w.model.outputs.toJSON() : []);")

    def problems(self) -> list[str]:
        """Error, stderr and warning outputs: in the model, and as displayed (stderr-styled output areas)."""
        found = []
        for i, outs in enumerate(self.outputs()):
            for o in outs:
                if o.get("output_type") == "error":
                    found.append(f"cell {i}: {o.get('ename')}: {o.get('evalue')}")
                elif o.get("output_type") == "stream" and o.get("name") == "stderr":
                    found.append(f"cell {i}: stderr: {''.join(o.get('text', ''))[:300]}")
        shown = self.js(_JS_PANEL + """return [...flPanel().node.querySelectorAll(
            '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')].map(e => e.textContent);""")
        found += [f"displayed stderr: {t[:300]}" for t in shown]
        return found

    def cell_index(self, needle: str) -> int:
        """Index of the first cell whose source contains `needle`."""
        i = self.js(_JS_PANEL + "return flPanel().content.widgets.findIndex("
                    "w => w.model.sharedModel.getSource().includes(arguments[0]));", needle)
        assert i >= 0, f"no cell contains {needle!r}"
        return i

    def cell(self, i: int, scroll: bool = True, timeout: float = 30):
        """The cell's DOM node (scrolled to the top of the view unless `scroll` is False).

        JupyterLab renders a long notebook lazily: a cell's node joins the page only once it is scrolled to."""
        if scroll:
            self.js(_JS_PANEL + "const p = flPanel(); if (p && p.content) p.content.scrollToItem(arguments[0], 'start');", i)
        # a notebook just (re)opened may not have laid its cells out yet: ask the list to scroll again each time
        # (under load its panel or its cell widgets may not exist yet either: keep asking until they do)
        return self.wait(lambda: self.js(_JS_PANEL + """const p = flPanel();
            if (!p || !p.content) return null;
            const nb = p.content, w = nb.widgets[arguments[0]];
            if (!w) return null;
            if (!w.node.isConnected) { nb.scrollToItem(arguments[0], 'start'); return null; }
            return w.node;""", i), timeout, f"cell {i} never on the page")

    def run_cell(self, i: int, timeout: float = 120) -> None:
        """Select cell `i` and press Shift+Enter, as a learner runs one cell; wait until it has run.

        "Has run" is the cell's execution state going to running and back to idle (its execution count alone may
        not change: the first cell run in a fresh kernel is [1], as stored)."""
        from selenium.webdriver.common.keys import Keys

        self.js(_JS_PANEL + """const m = flPanel().content.widgets[arguments[0]].model; window.flRan = 0;
            const seen = (_, a) => {
              if (a.name !== 'executionState') return;
              if (a.newValue === 'running') window.flRan = 1;
              else if (a.newValue === 'idle' && window.flRan === 1) { window.flRan = 2; m.stateChanged.disconnect(seen); }
            };
            m.stateChanged.connect(seen);""", i)
        prompt = self.cell(i).find_element("css selector", ".jp-InputArea-prompt")
        self.d.execute_script("arguments[0].scrollIntoView({block: 'center'})", prompt)
        prompt.click()  # selects the cell (command mode), focus back in the notebook
        self.wait(lambda: self.js(_JS_PANEL + "return flPanel().content.activeCellIndex") == i, 10, "not selected")
        self.press(Keys.SHIFT, Keys.ENTER)
        self.wait(lambda: self.js("return window.flRan === 2"), timeout, f"cell {i} did not run")
