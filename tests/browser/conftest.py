"""One JupyterLab server and one headless Chromium for the whole browser test session."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from harness import CHROMEDRIVER, CHROMIUM, Lab, Page, chrome

SHOTS = Path(os.environ.get("FUSIONLAB_SCREENSHOTS", tempfile.gettempdir())) / "fusionlab-browser"
# The whole browser session normally takes a few minutes. A stuck lab or browser would otherwise make every
# remaining test wait out its own timeouts (minutes each) and CI would hit its wall clock before reporting.
BUDGET_S = float(os.environ.get("FUSIONLAB_BROWSER_BUDGET_S", 2400))
_STARTED: list[float] = []


def _missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} not found: run `make browser-deps` (Debian's chromium and chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium not installed: run `make env`"
    return None


@pytest.fixture(scope="session")
def lab():
    problem = _missing()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem)  # CI must run the browser test, never skip it
        pytest.skip(problem)
    work = Path(tempfile.mkdtemp(prefix="fusionlab-browser-"))
    server = Lab(work)  # tools/lab.py in a fresh clone of ROOT, as a learner's `make lab` starts it
    yield server
    server.stop()
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(autouse=True)
def _within_budget():
    """Fail at once, not after more timeouts, once the browser tests have used their whole budget."""
    if not _STARTED:
        _STARTED.append(time.monotonic())
    spent = time.monotonic() - _STARTED[0]
    if spent > BUDGET_S:
        pytest.fail(f"the browser tests have run {spent:.0f} s, over their {BUDGET_S:.0f} s budget "
                    "(FUSIONLAB_BROWSER_BUDGET_S): the lab or the browser is stuck, see the first failure")


@pytest.fixture(scope="session")
def page(lab):
    driver = chrome(lab.workdir / "profile")
    SHOTS.mkdir(parents=True, exist_ok=True)
    p = Page(driver, lab, SHOTS)
    yield p
    driver.quit()


def pytest_configure(config):
    config.addinivalue_line("markers", "after_run(notebook): run right after that notebook's Run All test, "
                            "in its live kernel (the test still runs it itself when run alone)")


def pytest_collection_modifyitems(session, config, items):
    """Move tests marked after_run(nb) right behind test_run_all_in_the_browser[nb]: no second Run All."""
    followers = {}
    for item in list(items):
        mark = item.get_closest_marker("after_run")
        if mark:
            followers.setdefault(mark.args[0], []).append(item)
            items.remove(item)
    for nb, tests in followers.items():
        anchor = next((i for i, it in enumerate(items) if it.name == f"test_run_all_in_the_browser[{nb}]"), None)
        if anchor is None:
            items.extend(tests)
        else:
            items[anchor + 1:anchor + 1] = tests
