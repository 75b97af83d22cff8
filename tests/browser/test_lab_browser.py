"""The workbook as a learner meets it: JupyterLab (as `make lab` starts it) in headless Chromium.

One lab server and one browser serve every test here (conftest.py). Input goes through real keyboard and
mouse events (selenium -> chromedriver); JupyterLab's exposed app is only read, to know when it is done.
Run alone with `make test-browser`; screenshots land in $TMPDIR/fusionlab-browser/ (never compared).
"""

from __future__ import annotations

import json
import socket
import time

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

from harness import ROOT

NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
EXPLORER = "08_fusion_thresholds.ipynb"
NETRON = "03_vertical_cnn.ipynb"
CELL_TIMEOUT = 300  # seconds one cell may run in the browser (the slowest cell takes ~60 s alone)


def _stored(name: str) -> dict:
    return json.loads((ROOT / "notebooks" / name).read_text())


def _ignored(cell: dict) -> bool:
    src = "".join(cell["source"])
    tags = set(cell.get("metadata", {}).get("tags", []))
    return "NBVAL_IGNORE_OUTPUT" in src or "NBVAL_SKIP" in src or bool(tags & {"nbval-ignore-output", "nbval-skip"})


WIDGET_NOTEBOOKS = sorted(n for n in NOTEBOOKS if "widgets" in _stored(n)["metadata"])
#: the notebooks run here (Run All): those with outputs only a live kernel and the front end make, the widgets and
#: netron's frame. nbval executes every notebook and compares its outputs; the others are opened and saved here.
RUN_ALL = sorted({*WIDGET_NOTEBOOKS, EXPLORER, NETRON})


# -- landing ------------------------------------------------------------------------------------------

def test_lab_lands_on_start_here_with_only_notebooks_and_no_news(page, lab):
    page.start()
    assert page.js("return flPanel().context.path") == "00_start_here.ipynb"
    listed = page.wait(lambda: page.js("""return [...document.querySelectorAll(
        '.jp-DirListing-content .jp-DirListing-itemText')].map(e => e.textContent.trim());""") or None,
        60, "file browser empty")
    assert sorted(listed) == NOTEBOOKS  # no src/, no sanitize.cfg: only what a learner opens
    problems = []
    # the lab serves the learner's working copy, not the tracked notebooks/ (Run All rewrites measured outputs)
    if lab.root == lab.repo / "notebooks" or lab.git_status():
        problems.append(f"the lab serves {lab.root.relative_to(lab.repo)}/ (git status: {lab.git_status()!r})")
    clipped = page.js("""return [...document.querySelectorAll('.jp-DirListing-content .jp-DirListing-itemText')]
        .filter(e => e.scrollWidth > e.clientWidth + 1 || e.getBoundingClientRect().right >
                     e.closest('.jp-DirListing').getBoundingClientRect().right + 1)
        .map(e => `${e.textContent.trim()} (${e.scrollWidth} px of text in ${e.clientWidth} px)`);""")
    if clipped:
        problems.append(f"the file browser clips these names: {clipped}")
    assert problems == []
    schema = lab.api("/lab/api/settings/@jupyterlab/apputils-extension:notification")["schema"]["properties"]
    assert schema["fetchNews"]["default"] == "false" and schema["checkForUpdates"]["default"] is False
    assert "news" not in page.js("return document.body.innerText").lower()
    page.screenshot("00_landing")


def test_start_here_links_open_the_notebooks(page):
    page.open("00_start_here.ipynb")
    # the lab rewrites a relative link to its /files/ address and opens it in the lab when clicked
    links = page.js("""return [...flPanel().node.querySelectorAll('.jp-RenderedMarkdown a')]
        .map(a => new URL(a.href).pathname).filter(p => p.endsWith('.ipynb')).map(p => p.split('/').pop());""")
    assert sorted(set(links)) == NOTEBOOKS
    link = page.js("""const a = [...flPanel().node.querySelectorAll('.jp-RenderedMarkdown a')]
        .find(a => new URL(a.href).pathname.endsWith('/' + arguments[0]));
        a.scrollIntoView({block: 'center'}); return a;""", "05_horizontal_fusion.ipynb")
    link.click()  # a real click on the rendered link
    page.wait(lambda: "05_horizontal_fusion.ipynb" in page.js(
        "return Array.from(window.jupyterapp.shell.widgets('main')).map(w => w.context && w.context.path)"),
        60, "the link did not open 03")


# -- the stored explorer, before anything runs ---------------------------------------------------------

def test_stored_explorer_renders_its_widgets_not_their_repr(page):
    page.open(EXPLORER)
    i = page.cell_index("widgets.explore(")
    page.wait(lambda: page.cell(i).find_elements(By.CSS_SELECTOR, ".fl-explorer .widget-slider"), 60,
              "stored explorer shows no slider (untrusted notebook, or no saved widget state)")
    cell = page.cell(i)
    text = cell.text
    assert "VBox(children" not in text and "Explorer(children" not in text
    assert "groups:" in text and "kinds=" in text  # the saved result, shown without a kernel doing anything
    page.screenshot("05_stored_explorer", cell)
    assert "Error displaying widget" not in text
    icons = page.js(_JS_ICONS, cell)
    assert icons == 0, f"{icons} red 'disconnected' icons on the stored explorer"
    note = cell.find_element(By.CSS_SELECTOR, ".fl-explorer-stored")
    assert note.is_displayed() and "run the notebook" in note.text.lower()
    assert _layout_problems(page, cell) == []


# what a learner sees as ipywidgets' red chain icon: a ::before glyph on a view whose model has no kernel
_JS_ICONS = """return [...arguments[0].querySelectorAll('.jupyter-widgets-disconnected')].filter(e => {
    const st = getComputedStyle(e, '::before');
    return st.display !== 'none' && st.content && st.content !== 'none' && st.content !== 'normal'
           && e.getClientRects().length; }).length;"""

# every place a line of the explorer's text wraps on screen: the characters either side of the break
_JS_WRAPS = r"""const el = arguments[0]; const out = [];
const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT); let prev = null, prevTop = null, prevCh = '';
for (let n = walker.nextNode(); n; n = walker.nextNode()) {
  for (let i = 0; i < n.data.length; i++) {
    const ch = n.data[i];
    if (ch === '\n') { prevTop = null; prevCh = ch; continue; }
    const r = document.createRange(); r.setStart(n, i); r.setEnd(n, i + 1);
    const rect = r.getClientRects()[0]; if (!rect) continue;
    if (prevTop !== null && rect.top > prevTop + 2) out.push(prevCh + '|' + ch + ' in "' +
        n.data.slice(Math.max(0, i - 20), i + 20).replace(/\n/g, ' ') + '"');
    prevTop = rect.top; prevCh = ch;
  }
}
return out;"""

# the same probe cell by cell (a table's next row is no line break): every break inside one cell of the chart
_JS_CELL_WRAPS = ("const probe = (el) => { const f = new Function(" + json.dumps(_JS_WRAPS) + "); "
                  "return f.call(null, el); };\n"
                  "return [...arguments[0].querySelectorAll('td, th')].flatMap(c => probe(c));")


def _layout_problems(page, cell) -> list[str]:
    """Layout bounds of the explorer as shown: no line broken mid-word, nothing cut at the right edge, the
    result starting right below the controls and the picture not a scroll box of its own."""
    found = []
    text = cell.find_element(By.CSS_SELECTOR, ".fl-explorer-text")
    for w in page.js(_JS_WRAPS, text):
        left, right = w.split(" in ")[0].split("|")
        if left.strip() and right.strip():
            found.append(f"line broken mid-word: {w}")
    if not page.js("return arguments[0].scrollWidth <= arguments[0].clientWidth + 1", text):
        found.append("result text wider than its box (cut off at the right)")
    controls = cell.find_elements(By.CSS_SELECTOR, ".fl-explorer > .widget-hbox")[-1]
    gap = page.js("return arguments[1].getBoundingClientRect().top - arguments[0].getBoundingClientRect().bottom",
                  controls, text)
    if not 0 <= gap <= 200:
        found.append(f"the result starts {gap:.0f} px below the controls")
    tall = page.js("return arguments[0].getBoundingClientRect().height", text)
    if tall > 0.8 * page.js("return window.innerHeight"):
        found.append(f"the result is {tall:.0f} px tall: it does not fit in view beside the controls")
    picture = cell.find_element(By.CSS_SELECTOR, ".fl-explorer-picture")
    if page.js("return arguments[0].scrollHeight > arguments[0].clientHeight + 2", picture):
        found.append("the picture sits in a scroll box of its own")
    charts = cell.find_elements(By.CSS_SELECTOR, ".fl-explorer-devices")
    if not charts:
        return found + ["no device chart (a table with bars): the devices are text lines"]
    chart = charts[0]
    for w in page.js(_JS_CELL_WRAPS, chart):
        found.append(f"device chart: a cell's line broken: {w}")  # every cell holds one line
    out = page.js("""const r = arguments[0].getBoundingClientRect(), o = arguments[1].getBoundingClientRect();
        return r.right > o.right + 1 ? r.right - o.right : 0;""", chart, cell)
    if out:
        found.append(f"device chart {out:.0f} px wider than the cell")
    bottom = page.js("return arguments[1].getBoundingClientRect().bottom - arguments[0].getBoundingClientRect().top",
                     controls, chart)
    if bottom > page.js("return window.innerHeight"):
        found.append(f"the device chart ends {bottom:.0f} px below the controls: not in view with them")
    bars = page.js("""return [...arguments[0].querySelectorAll('.fl-bar')].map(b => [b.getBoundingClientRect().width,
        b.parentElement.getBoundingClientRect().width]);""", chart)
    if not bars or any(w > pw + 1 for w, pw in bars) or not any(w > 0 for w, _ in bars):
        found.append(f"device chart bars missing or out of their box: {bars}")
    return found


def _chart(cell) -> list[str]:
    """The device chart's rows as shown (the chosen device's marked '> ')."""
    return [r.text for r in cell().find_elements(By.CSS_SELECTOR, ".fl-explorer-devices tbody tr")]


def test_stored_netron_view_is_a_picture_and_one_sentence(page):
    page.open("03_vertical_cnn.ipynb")
    cell = page.cell(page.cell_index("viz.netron_view("))
    page.wait(lambda: cell.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output img"), 60, "no stored picture")
    assert not cell.find_elements(By.CSS_SELECTOR, "iframe"), "a frame that cannot load without the kernel"
    shown = cell.find_element(By.CSS_SELECTOR, ".jp-OutputArea-output").text
    assert "make lab" in shown and "forward" not in shown.lower() and "jupyter-server-proxy" not in shown
    page.screenshot("02_stored_netron", cell)


def test_untrusted_copy_still_shows_the_explorer_summary(page, lab):
    """Opened in a Jupyter that never trusted it, the explorer shows its result as HTML, not a widget repr."""
    nb = _stored(EXPLORER)
    nb["metadata"]["edited_elsewhere"] = True  # any change voids the signature: untrusted
    copy = lab.root / "untrusted_copy.ipynb"
    copy.write_text(json.dumps(nb))
    try:
        page.open(copy.name)
        i = page.cell_index("widgets.explore(")
        page.wait(lambda: "groups:" in page.cell(i).text, 60, "no summary in the untrusted view")
        text = page.cell(i).text
        assert "VBox(children" not in text and "run the notebook to use its controls" in text
        assert not page.cell(i).find_elements(By.CSS_SELECTOR, ".widget-slider")
        page.screenshot("05_untrusted_summary", page.cell(i))
    finally:
        page.open(EXPLORER)  # close the copy (and its kernel) before removing it
        copy.unlink()


# -- every notebook: opens with no error shown, saving the stored notebook changes no byte --------------

@pytest.mark.parametrize("name", NOTEBOOKS)
def test_opens_and_saves_unchanged_in_the_browser(page, lab, name):
    page.open(name)
    page.save()  # Ctrl+S on the stored notebook: not one byte may change
    assert (lab.root / name).read_bytes() == (ROOT / "notebooks" / name).read_bytes(), "saving rewrote it"
    assert page.problems() == []
    assert lab.git_status() == "", f"opening and a save changed the checkout:\n{lab.git_status()}"


# -- the live notebooks: stored == saved, Run All without errors or warnings, saved == stored -----------

@pytest.mark.parametrize("name", RUN_ALL)
def test_run_all_in_the_browser(page, lab, name):
    page.open(name)
    page.save()  # Ctrl+S on the stored notebook: not one byte may change
    assert (lab.root / name).read_bytes() == (ROOT / "notebooks" / name).read_bytes(), "saving rewrote it"
    seconds = page.run_all(cell_timeout=CELL_TIMEOUT)
    page.ran[name] = seconds
    print(f"{name}: Run All in the browser {seconds:.1f} s")
    assert page.problems() == []
    page.save()
    assert lab.git_status() == "", f"Run All and a save changed the checkout:\n{lab.git_status()}"
    saved, stored = json.loads((lab.root / name).read_text()), _stored(name)
    assert saved["metadata"].keys() == stored["metadata"].keys() and saved["nbformat_minor"] == stored["nbformat_minor"]
    for i, (a, b) in enumerate(zip(saved["cells"], stored["cells"])):
        if a["cell_type"] == "code" and not _ignored(b):
            streams = [[o for o in c["outputs"] if o["output_type"] == "stream"] for c in (a, b)]
            assert streams[0] == streams[1], f"cell {i}: the lab saves its printed output differently"


# -- the explorer, live ---------------------------------------------------------------------------------

def _explorer(page):
    page.open(EXPLORER)
    if EXPLORER not in page.live:
        page.ran[EXPLORER] = page.run_all(cell_timeout=CELL_TIMEOUT)
    i = page.cell_index("widgets.explore(")

    page.cell(i)  # scroll to it once

    def cell():  # found afresh each time: JupyterLab may re-render the cell's DOM
        return page.cell(i, scroll=False)

    page.wait(lambda: cell().find_elements(By.CSS_SELECTOR, ".fl-explorer-result .fl-explorer-text"), 60,
              "no live result")
    return cell


def _result(cell) -> str:
    return cell().find_element(By.CSS_SELECTOR, ".fl-explorer-result").text


def _changed(page, cell, before: str, needle: str, timeout: float = 60) -> tuple[str, float]:
    t0 = time.monotonic()
    page.wait(lambda: _result(cell) != before and needle in _result(cell), timeout, f"result never showed {needle!r}")
    return _result(cell), time.monotonic() - t0


def _line(text: str, start: str) -> str:
    """The line starting with `start`, with the lines that continue it (indented by `text.wrap`) joined on."""
    lines = text.splitlines()
    i = next(i for i, l in enumerate(lines) if l.startswith(start))
    j = i + 1
    while j < len(lines) and lines[j].startswith("    "):
        j += 1
    return " ".join(l.strip() for l in lines[i:j])


@pytest.mark.after_run(EXPLORER)
def test_device_dropdown_changes_the_prediction(page):
    cell = _explorer(page)
    before = _result(cell)
    assert "Atlas 300I Pro: predicted" in before
    chart_before = _chart(cell)
    select = cell().find_element(By.CSS_SELECTOR, ".fl-explorer-device select")
    select.location_once_scrolled_into_view
    Select(select).select_by_visible_text("Atlas 800I A2 (Ascend 910B)")  # clicks the option
    after, took = _changed(page, cell, before, "Atlas 800I A2 (Ascend 910B): predicted")
    print(f"device dropdown -> new result in {took:.2f} s")
    assert _line(after, "Atlas 800I A2 (Ascend 910B): predicted") != _line(before, "Atlas 300I Pro: predicted")
    page.screenshot("05_explorer_device", cell())
    assert _layout_problems(page, cell()) == []
    assert _line(after, "> Atlas 800I A2 (Ascend 910B)") and "> Atlas 300I Pro" not in after  # the table follows
    rows = _chart(cell)  # the chart's rows follow the choice: one marked, the presets each a row
    assert [r for r in rows if r.startswith("> ")] == [r for r in rows if r.startswith("> Atlas 800I A2")]
    assert len([r for r in rows if r.startswith("> ")]) == 1 and len(rows) == len(chart_before)
    Select(cell().find_element(By.CSS_SELECTOR, ".fl-explorer-device select")).select_by_visible_text("this machine")
    mine, _ = _changed(page, cell, after, "this machine: predicted", timeout=180)
    rows = _chart(cell)  # this machine: a row of the chart like the presets, the one marked
    row = next(r for r in rows if r.startswith("> "))
    assert row.startswith("> this machine") and row.split()[-1] == "float32" and "Atlas 800I A2 (Ascend 910B)" in mine
    assert "float32" in _line(mine, "device Atlas 800I A2 (Ascend 910B) -> this machine:")
    assert len(rows) == len(chart_before) + 1 and [r for r in rows if r.startswith("> ")] == [row]
    page.screenshot("05_explorer_this_machine", cell())
    assert _layout_problems(page, cell()) == []
    Select(cell().find_element(By.CSS_SELECTOR, ".fl-explorer-device select")).select_by_visible_text("Atlas 300I Pro")
    _changed(page, cell, mine, "Atlas 300I Pro: predicted")


@pytest.mark.after_run(EXPLORER)
def test_kinds_change_the_plan_and_the_picture(page):
    cell = _explorer(page)
    before = _result(cell)
    # the picture may still be re-rendering after the previous control change: look again until it holds still
    picture = page.wait(lambda: cell().find_element(By.CSS_SELECTOR, ".fl-explorer-picture img").get_attribute("src"),
                        30, "no picture")
    kinds = Select(cell().find_element(By.CSS_SELECTOR, ".fl-explorer-kinds select"))
    kinds._el.location_once_scrolled_into_view
    for text in ("vertical", "horizontal"):  # chromedriver clicks each option: a click toggles it here
        kinds.deselect_by_visible_text(text)
    after, took = _changed(page, cell, before, "kinds=mixed,")
    print(f"kinds -> new result in {took:.2f} s")
    assert _line(after, "groups:") != _line(before, "groups:")
    page.wait(lambda: cell().find_element(By.CSS_SELECTOR, ".fl-explorer-picture img").get_attribute("src") != picture,
              30, "the picture did not change")
    page.screenshot("05_explorer_kinds", cell())
    assert _layout_problems(page, cell()) == []


def _move_slider(page, cell, name: str, presses: int, key=Keys.ARROW_LEFT) -> None:
    handle = cell().find_element(By.CSS_SELECTOR, f".fl-explorer-{name} .noUi-handle")
    handle.location_once_scrolled_into_view
    handle.click()  # focus the slider's handle with the mouse, then step it with the keyboard
    for _ in range(presses):
        page.press(key)


@pytest.fixture(scope="module")
def slider_moved(page):
    """Back to all kinds, then max ops 5 -> 3 with the keyboard on the slider: (before, after, readout)."""
    cell = _explorer(page)
    kinds = Select(cell().find_element(By.CSS_SELECTOR, ".fl-explorer-kinds select"))
    kinds._el.location_once_scrolled_into_view
    chosen = {o.text for o in kinds.all_selected_options}
    for text in ("vertical", "horizontal", "mixed"):
        if text not in chosen:
            kinds.select_by_visible_text(text)
    page.wait(lambda: "kinds=vertical+horizontal+mixed," in _result(cell), 60, "kinds not reset")
    before = _result(cell)
    _move_slider(page, cell, "ops", 2)
    after, took = _changed(page, cell, before, "max_group_ops=3,")
    print(f"max ops slider -> new result in {took:.2f} s")
    readout = cell().find_element(By.CSS_SELECTOR, ".fl-explorer-ops .widget-readout").text
    page.screenshot("05_explorer_slider", cell())
    assert _layout_problems(page, cell()) == []
    return before, after, readout


@pytest.mark.after_run(EXPLORER)
def test_max_ops_slider_reaches_the_kernel(slider_moved):
    before, after, readout = slider_moved
    assert readout == "3"
    assert "max_group_ops=5," in _line(before, "kinds=") and "max_group_ops=3," in _line(after, "kinds=")


@pytest.mark.after_run(EXPLORER)
def test_max_ops_slider_changes_the_plan(slider_moved):
    before, after, _ = slider_moved
    assert _line(after, "groups:") != _line(before, "groups:")
    # two key presses, two steps: the line says what the last step did, and what the steps add up to
    assert "launches" in _line(after, "max_group_ops 4 -> 3:")
    total = _line(after, "since the initial setting,")
    assert "max_group_ops 5 -> 3" in total and "launches" in total
    # one accounting: the groups the first line counts are the groups the plan's line counts
    groups = int(_line(after, "groups:").split()[1])
    assert any(l.startswith(f"{groups} groups: ") for l in after.splitlines())


@pytest.mark.after_run(EXPLORER)
def test_explorer_layout_keeps_everything_in_view(page):
    cell = _explorer(page)
    button = cell().find_element(By.CSS_SELECTOR, ".fl-explorer-measure")
    assert page.js("return arguments[0].scrollWidth <= arguments[0].clientWidth", button), "button label cut off"
    picture = cell().find_element(By.CSS_SELECTOR, ".fl-explorer-picture")
    assert picture.size["height"] <= 500, f"picture box {picture.size['height']} px tall"
    button.location_once_scrolled_into_view
    button.click()
    measured = cell().find_element(By.CSS_SELECTOR, ".fl-explorer-measured")
    page.wait(lambda: "speedup" in measured.text.lower() or "median" in measured.text.lower(), 180,
              "no measurement shown")
    gap = page.js("return arguments[1].getBoundingClientRect().top - arguments[0].getBoundingClientRect().bottom",
                  button, measured)
    assert 0 <= gap <= 150, f"the measurement appears {gap} px below the button"
    page.screenshot("05_explorer_measured", cell())
    print(f"explorer: picture box {picture.size['width']}x{picture.size['height']} px, measurement {gap} px "
          f"below the button, cell {cell().size['height']} px tall")


def _widget_views(nb: dict) -> list[str]:
    return [o["data"]["application/vnd.jupyter.widget-view+json"]["model_id"] for c in nb["cells"]
            for o in c.get("outputs", []) if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]


def _reopen(page, name: str) -> None:
    """Shut the kernel down, close the notebook, open it again from disk (no kernel has run anything)."""
    page.d.execute_async_script("""const done = arguments[arguments.length - 1]; const app = window.jupyterapp;
        (async () => {
          for (const w of Array.from(app.shell.widgets('main'))) {
            if (w.context) { await w.sessionContext.shutdown(); w.dispose(); }
          }
          await app.commands.execute('docmanager:open', {path: arguments[0]});
        })().then(() => done(null), e => done(String(e)));""", name)
    page.live.clear()
    page.wait(lambda: page.js(_JS_PATH) == name, 60, f"{name} not reopened")
    # a long notebook with saved widget state takes a while to load under load: wait until all its cells exist
    cells = len(json.loads((page.lab.root / name).read_text())["cells"])
    page.wait(lambda: page.js(_JS_LOADED) == cells, 180, f"{name}: its {cells} cells never all loaded")


_JS_LOADED = """const app = window.jupyterapp;
for (const w of app.shell.widgets('main')) {
  if (w.isVisible && w.context && w.content) return w.context.isReady ? w.content.widgets.length : -1;
}
return null;"""

_JS_PATH = """const app = window.jupyterapp;
for (const w of app.shell.widgets('main')) { if (w.isVisible && w.context) return w.context.path; } return null;"""


@pytest.mark.after_run(EXPLORER)
@pytest.mark.parametrize("name", WIDGET_NOTEBOOKS)
def test_run_all_save_and_reopen_renders_the_widgets_and_changes_nothing_stored(page, lab, name):
    """Run All, save (as autosave does), shut the kernel down, reopen: the widgets render from the saved state,
    and the file differs from the stored one only in the cells that print this machine's measurements."""
    page.open(name)
    if name not in page.live:
        page.ran[name] = page.run_all(cell_timeout=CELL_TIMEOUT)
    page.save()
    saved, stored = json.loads((lab.root / name).read_text()), _stored(name)
    state = saved["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    missing = [m for m in _widget_views(saved) if m not in state]
    assert not missing, f"the saved outputs name widget models the saved state does not hold: {missing}"
    assert saved["metadata"] == stored["metadata"]
    changed = [i for i, (a, b) in enumerate(zip(saved["cells"], stored["cells"])) if a != b]
    measured = [i for i in changed if _ignored(stored["cells"][i])
                and not any("application/vnd.jupyter.widget-view+json" in o.get("data", {})
                            for o in stored["cells"][i]["outputs"])]
    assert changed == measured, f"cells {sorted(set(changed) - set(measured))} changed by Run All and a save"
    print(f"{name}: Run All + save changed only the measuring cells {measured}")
    _reopen(page, name)
    for i in (i for i, c in enumerate(saved["cells"]) if _widget_views({"cells": [c]})):
        cell = page.cell(i, timeout=120)
        page.wait(lambda: cell.find_elements(By.CSS_SELECTOR, ".widget-slider, .widget-box"), 60,
                  f"cell {i}: no widget rendered after reopening")
        assert "Error displaying widget" not in cell.text, cell.text[:200]
        assert page.js(_JS_ICONS, cell) == 0
        page.screenshot(f"{name[:2]}_reopened_{i}", cell)
    assert lab.git_status() == "", f"Run All, a save and reopening changed the checkout:\n{lab.git_status()}"


# -- netron in notebook 03 ------------------------------------------------------------------------------

def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.after_run(NETRON)
def test_netron_frame_loads_after_run_all_and_stops_with_the_kernel(page):
    name = NETRON
    page.open(name)
    if name not in page.live:
        page.ran[name] = page.run_all(cell_timeout=CELL_TIMEOUT)
    i = page.cell_index("viz.netron_view(")
    cell = page.cell(i)  # the frame Run All left there: nothing re-run
    frame = page.wait(lambda: cell.find_elements(By.CSS_SELECTOR, "iframe"), 60, "no netron frame")[0]
    src = frame.get_attribute("src")
    assert "/proxy/127.0.0.1:" in src, src  # through the Jupyter server: works via tunnels and hubs
    port = int(src.rstrip("/").rsplit(":", 1)[1])
    frame.location_once_scrolled_into_view
    page.d.switch_to.frame(frame)
    try:
        body = page.wait(lambda: page.d.find_element(By.TAG_NAME, "body").text or
                         page.d.find_elements(By.CSS_SELECTOR, "button"), 60, "netron's frame stayed empty")
        assert "Internal Server Error" not in page.d.find_element(By.TAG_NAME, "body").text, body
        accept = page.wait(lambda: [b for b in page.d.find_elements(By.CSS_SELECTOR, "button")
                                    if b.is_displayed() and b.text == "Accept"], 60, "no netron notice")[0]
        accept.click()
        page.wait(lambda: page.js("return document.body.classList.contains('default')")
                  and page.d.find_elements(By.CSS_SELECTOR, "#canvas .node"), 60, "netron drew no graph")
        nodes = len(page.d.find_elements(By.CSS_SELECTOR, "#canvas .node"))
    finally:
        page.d.switch_to.default_content()
    print(f"netron drew {nodes} nodes through {src}")
    page.screenshot("02_netron", cell)
    assert _port_open(port)
    page.open("00_start_here.ipynb")  # closes 02 and shuts its kernel down
    page.wait(lambda: not _port_open(port), 30, "netron still listening after the kernel shut down")


# -- an exercise, answered as a learner answers it ----------------------------------------------------------

EXERCISE_NB = "11_decoding.ipynb"
#: one line each, as typed into the stub cell (no newline: the editor would indent what follows a colon)
WRONG_ANSWER = ("kv_cache_bytes = lambda layers, heads, kv_heads, head_dim, context, dtype_bytes: "
                "context * layers * kv_heads * head_dim * dtype_bytes")
RIGHT_ANSWER = ("kv_cache_bytes = lambda layers, heads, kv_heads, head_dim, context, dtype_bytes: "
                "context * layers * 2 * kv_heads * head_dim * dtype_bytes")


def _type_into(page, i: int, text: str) -> None:
    """Click into cell i's editor, select all of it, type `text` over it (real key events)."""
    editor = page.cell(i).find_element(By.CSS_SELECTOR, ".cm-content")
    page.d.execute_script("arguments[0].scrollIntoView({block: 'center'})", editor)
    editor.click()
    page.press(Keys.CONTROL, "a")
    page.press(text)
    page.wait(lambda: page.js(_JS_PANEL_SRC, i) == text, 10, f"cell {i} does not hold what was typed")


_JS_PANEL_SRC = """const app = window.jupyterapp;
for (const w of app.shell.widgets('main')) {
  if (w.isVisible && w.content && w.context) return w.content.widgets[arguments[0]].model.sharedModel.getSource();
}
return null;"""


def _shown(page, i: int) -> str:
    """The text of cell i's rendered outputs (without the [n]: prompt)."""
    return "\n".join(e.text for e in page.cell(i).find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output"))


def test_a_learner_answers_an_exercise_and_the_check_grades_it(page, lab):
    """Edit the stub, run it and the check cell: a planted mistake gets FAIL with its hint, the right answer PASS.
    Nothing else of the notebook is run (the exercise needs only the imports cell)."""
    name = EXERCISE_NB
    page.open(name)
    try:
        page.run_cell(page.cell_index("from fusionlab import exercises"))
        stub, check = page.cell_index("def kv_cache_bytes("), page.cell_index("exercises.kvcache.check(")
        assert _shown(page, check).startswith("NOT ANSWERED YET"), _shown(page, check)
        _type_into(page, stub, WRONG_ANSWER)
        page.run_cell(stub)
        page.run_cell(check)
        wrong = page.wait(lambda: _shown(page, check) if _shown(page, check).startswith("FAIL") else None, 30,
                          "no FAIL verdict")
        assert "case 1 of" in wrong and "K only" in wrong, wrong
        page.screenshot("09_exercise_fail", page.cell(check))
        _type_into(page, stub, RIGHT_ANSWER)
        page.run_cell(stub)
        page.run_cell(check)
        right = page.wait(lambda: _shown(page, check) if _shown(page, check).startswith("PASS") else None, 30,
                          "no PASS verdict")
        assert "all 5 cases right" in right, right
        page.screenshot("09_exercise_pass", page.cell(check))
        assert page.problems() == []
    finally:  # the learner's copy back as stored, and the editor reloaded from it
        (lab.root / name).write_bytes((ROOT / "notebooks" / name).read_bytes())
        page.js("""const app = window.jupyterapp;
            for (const w of app.shell.widgets('main')) { if (w.isVisible && w.context) return w.context.revert(); }""")
    assert lab.git_status() == ""


def test_the_lab_wrote_nothing_into_home(lab):
    """The server and its kernels ran with HOME set to an empty folder: Jupyter's files went to the project."""
    written = sorted(str(p.relative_to(lab.home)) for p in lab.home.rglob("*"))
    assert written == [], written
