"""`fusionlab report` opened as a user opens it: a file in headless Chromium, no server, no network.

The picture must load (a data: URL, decoded by the browser), every table must lie within the page (no
horizontal overflow at a laptop's width), and the page must make no request and log no error.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import _missing
from harness import ROOT, chrome


@pytest.fixture(scope="module")
def browser():
    problem = _missing()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    work = Path(tempfile.mkdtemp(prefix="fusionlab-report-browser-"))
    driver = chrome(work / "profile")
    yield driver
    driver.quit()
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def report_page(tmp_path_factory):
    from fusionlab.cli import main

    out = tmp_path_factory.mktemp("report") / "report.html"
    src = ROOT / "tests" / "corpus" / "convnext.ts-fold.onnx"
    assert main(["report", str(src), "-o", str(out), "--min-time", "0", "--rounds", "2"]) == 0
    return out


@pytest.mark.parametrize("width", [1400, 900])
def test_report_renders_with_its_picture_loaded_and_tables_within_the_page(browser, report_page, width):
    browser.set_window_size(width, 1000)
    browser.get(report_page.as_uri())
    state = browser.execute_script("""
        const imgs = [...document.images];
        const body = document.documentElement;
        const tables = [...document.querySelectorAll('table')].map(t => {
            const r = t.getBoundingClientRect(); return [r.left, r.right, t.scrollWidth, t.clientWidth]; });
        const res = performance.getEntriesByType('resource').map(e => e.name);
        return {imgs: imgs.map(i => [i.complete, i.naturalWidth, i.naturalHeight]),
                page: [body.scrollWidth, body.clientWidth], tables: tables, resources: res,
                h2: [...document.querySelectorAll('h2')].map(h => h.textContent)};
    """)
    assert state["imgs"] and all(done and w > 500 and h > 500 for done, w, h in state["imgs"]), state["imgs"]
    scroll, client = state["page"]
    assert scroll <= client, f"the page scrolls sideways at {width} px: {scroll} > {client}"
    for left, right, sw, cw in state["tables"]:
        assert left >= 0 and right <= client + 0.5 and sw <= cw + 1, (left, right, sw, cw)
    assert not [r for r in state["resources"] if not r.startswith("data:")], state["resources"]
    assert state["h2"][:3] == ["The plan", "The picture", "Near misses (why not)"]
    errors = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
    assert not errors, errors
