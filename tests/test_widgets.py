"""The explorer's plain functions (the widget is a thin layer over them)."""

import warnings

import matplotlib

matplotlib.use("Agg")

import pytest

from fusionlab import widgets, zoo
from fusionlab.graph import load
from fusionlab.text import MAX_WIDTH


@pytest.fixture(scope="module")
def resnet():
    return load(zoo.get("resnet_small"))


def test_explore_state_plans_and_costs_on_every_device(resnet):
    res = widgets.explore_state(resnet, max_group_ops=5, kinds=("vertical", "mixed"), device="Atlas 300I Pro")
    assert len(res.plan) > 0
    assert {g.kind for g in res.plan} <= {"vertical", "mixed"}
    assert res.cost.kernels < res.baseline.kernels
    assert res.cost.latency_s < res.baseline.latency_s
    assert len(res.devices.rows) == 2 * 4
    assert "Atlas 300I Pro" in res.summary() and "kernels" in res.summary()
    nodes = [n for g in res.plan for n in g.nodes]
    assert len(nodes) == len(set(nodes))  # no node in two groups


def test_sweep_group_size_rows(resnet):
    rows = widgets.sweep_group_size(resnet, (1, 2, 4), "Atlas 800I A2")
    assert [r["max_group_ops"] for r in rows] == [1, 2, 4]
    assert rows[0]["groups"] == 0 and rows[0]["speedup"] == 1.0
    assert all(r["largest"] <= r["max_group_ops"] or r["groups"] == 0 for r in rows)
    assert rows[-1]["kernels"] <= rows[1]["kernels"] <= rows[0]["kernels"]
    fig = widgets.plot_sweep(rows)
    assert fig.axes
    lines = widgets.sweep_table(rows).splitlines()
    assert len(lines) == 2 + len(rows) and max(map(len, lines)) <= MAX_WIDTH  # headers over two lines, no clipping
    assert "…" not in "".join(lines) and lines[0].split()[-3:] == ["peak", "peak", "vs"]
    assert lines[1].split()[-2:] == ["MiB", "unfused"]
    assert lines[-1].split() == [str(rows[-1][k]) for k in rows[-1]]


def test_a_smaller_ub_slows_transfers_and_spills_nothing(resnet):
    big = widgets.sweep_group_size(resnet, (4,), "Atlas 300I Pro", dims={"batch": 8})
    tiny = widgets.sweep_group_size(resnet, (4,), "Atlas 300I Pro", dims={"batch": 8}, ub_kb=16)
    assert tiny[0]["DMA_x"] > big[0]["DMA_x"] >= 1.0  # small tensors move in small transfers anyway
    assert tiny[0]["MiB_moved"] == big[0]["MiB_moved"]  # the same bytes, in smaller transfers
    assert tiny[0]["latency_us"] > big[0]["latency_us"]
    assert big[0]["ub_KiB"] <= 256


def test_bad_kind_is_rejected(resnet):
    with pytest.raises(ValueError, match="unknown fusion kind"):
        widgets.make_plan(resnet, ("diagonal",))


def test_measure_and_widget_build():
    model = load(zoo.get("conv_bn_relu"))
    cmp = widgets.measure(model, ("vertical",), min_time=0.05)
    assert cmp.rounds >= 1 and cmp.a.median > 0 and cmp.b.median > 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        box = widgets.explore(model)
    assert box.children


@pytest.fixture(scope="module")
def yolo():
    return load(zoo.yolov5s(image_size=64, width_mult=0.25, depth_mult=0.33))


@pytest.mark.slow
def test_every_control_changes_the_plan_from_the_default_state(yolo):
    """Each threshold governs a pass where it makes sense: from the defaults with every kind selected (the
    thresholds govern the mixed pass), moving any control changes the plan."""
    every = widgets.KINDS
    default = widgets.explore_state(yolo, kinds=every)
    fewer_ops = widgets.explore_state(yolo, max_group_ops=3, kinds=every)
    small_ub = widgets.explore_state(yolo, buffer_kb=16, kinds=every)
    vertical_only = widgets.explore_state(yolo, kinds=("vertical",))
    other_device = widgets.explore_state(yolo, device="Atlas 800I A2 (Ascend 910B)", kinds=every)
    for moved in (fewer_ops, small_ub, vertical_only):
        assert moved.plan != default.plan
    assert max(g.size for g in fewer_ops.plan) <= 3 < max(g.size for g in default.plan)
    assert other_device.cost.latency_s != default.cost.latency_s
    line = widgets.change_line(default, fewer_ops)
    assert line.startswith("max_group_ops 5 -> 3: ") and "8 more group(s)" in line and "latency +" in line
    # the launches the line states are the fused models' own (each setting applied and counted): at 5 ops the
    # mixed groups take parts of earlier groups' lowerings and 8 of those kernels still run, so the fused
    # model launches as many kernels as at 3 ops, and the line says so instead of inventing a difference
    from fusionlab import cost
    from fusionlab.passes import apply

    launched = [cost.plan_cost(apply(yolo, s.plan, validate=False).graph, None, "Atlas 300I Pro").kernels
                for s in (default, fewer_ops)]
    assert launched == [default.cost.kernels, fewer_ops.cost.kernels]
    assert launched[0] == launched[1] and f"same launches (the fused model runs {launched[0]} kernels" in line
    assert default.plan.counts().left_over == 8


@pytest.mark.slow
def test_dropping_a_group_feeds_the_executable_plan(yolo):
    from fusionlab import verify
    from fusionlab.passes import apply

    full = widgets.explore_state(yolo, kinds=widgets.KINDS)
    kernel_of = full.plan.kernel_of()
    victim = next(g for g in full.plan if all(kernel_of[c] == g.id for c in g.covers))  # not absorbed later
    edited = widgets.explore_state(yolo, drop=(victim.id,), kinds=widgets.KINDS)
    assert victim.id not in {g.id for g in edited.plan} and len(edited.plan) == len(full.plan) - 1
    assert edited.cost.latency_s != full.cost.latency_s
    assert widgets.change_line(full, edited).startswith(f"dropped None -> {victim.id}: ")
    fused = apply(yolo, edited.plan)
    assert verify(yolo, fused.graph).ok
    # dropping a group a later one was built on drops that one too, so the edited plan still applies
    absorbed = next(g for g in full.plan if any(kernel_of[c] != g.id for c in g.covers))
    edited = full.plan.without(absorbed.id)
    assert any("dropped too" in n for n in edited.notes)
    assert verify(yolo, apply(yolo, edited).graph).ok


def test_the_legend_names_the_groups_max_ops_cannot_split():
    bert = load(zoo.bert(layers=1, hidden=32, heads=2, intermediate=64, vocab=50))
    res = widgets.explore_state(bert, max_group_ops=2)
    legend = widgets.what_each_control_governs(res.plan)
    assert "Not split by max ops" in legend
    fixed = [g for g in res.plan if g.size > 2 and g.kind == "vertical"]
    assert fixed and all(g.rule in legend for g in fixed)


def test_the_explorer_starts_from_the_passes_fuse_runs(yolo):
    """One meaning: with no kinds given, the explorer plans (and measures) what `fusionlab fuse` writes."""
    import inspect

    from fusionlab.passes import fuse, plan
    from fusionlab.plan import DEFAULT_PASSES

    assert inspect.signature(fuse).parameters["passes"].default == DEFAULT_PASSES
    assert inspect.signature(plan).parameters["passes"].default == DEFAULT_PASSES
    for fn in (widgets.make_plan, widgets.explore_state, widgets.measure, widgets.explore):
        assert inspect.signature(fn).parameters["kinds"].default == DEFAULT_PASSES, fn.__name__
    state = widgets.explore_state(yolo, max_group_ops=None)
    assert [g.covers for g in state.plan] == [g.covers for g in plan(yolo)]
    assert state.settings["kinds"] == "+".join(DEFAULT_PASSES)


# -- one source of counts (issue 24) ------------------------------------------------------------------------

def test_plan_counts_each_node_and_kernel_once_and_agree_with_the_cost_model(resnet):
    """A mixed group over a vertical FusedConv is one kernel: the plan's footer, the explorer's "groups:" line
    and the cost model's "kernels A -> B" are one accounting (the 69-node model once read "73 nodes run as 28
    kernels" beside "69 -> 24")."""
    res = widgets.explore_state(resnet, max_group_ops=3, kinds=widgets.KINDS)
    plan, counts = res.plan, res.counts()
    assert counts.absorbed > 0, "this setting should put vertical groups inside mixed ones"
    assert counts.nodes <= len(resnet) and counts.groups == len(plan) - counts.absorbed
    covered = {n for g in plan.running() for n in g.covers}
    assert counts.nodes == len(covered)
    assert (counts.unfused_kernels, counts.fused_kernels) == (res.baseline.kernels, res.cost.kernels)
    assert counts.kernels <= counts.fused_kernels
    footer = plan.footer()
    assert " ".join(plan.table().split()).endswith(" ".join(footer.split()))
    assert footer.startswith(f"{counts.groups} groups: {counts.nodes} nodes run as {counts.kernels} kernels")
    assert f"groups: {counts.groups} (" in res.summary() and f"kernels {res.baseline.kernels} -> {res.cost.kernels}" \
        in res.summary()
    text = widgets.result_text(res)
    assert f"the model launches {res.baseline.kernels} -> {res.cost.kernels}" in " ".join(text.split())


def test_a_regrouping_is_not_reported_as_more_groups(resnet):
    """max ops 5 -> 3 on resnet_small moves vertical groups inside mixed ones: as many kernels, not "8 more groups,
    same launches"."""
    a = widgets.explore_state(resnet, max_group_ops=5, kinds=widgets.KINDS)
    b = widgets.explore_state(resnet, max_group_ops=3, kinds=widgets.KINDS)
    line = widgets.change_line(a, b)
    assert a.counts().groups == b.counts().groups and a.cost.kernels == b.cost.kernels
    assert "more group" not in line and "same launches (" in line


def test_a_device_change_updates_the_table_and_says_why_the_plan_and_peak_moved(resnet):
    a = widgets.explore_state(resnet, kinds=widgets.KINDS)
    b = widgets.explore_state(resnet, kinds=widgets.KINDS, device="this machine")
    assert [r.lstrip("> ").split("  ")[0] for r in a.device_table().splitlines()[1:]] == list(
        widgets.load_devices())
    rows = b.device_table().splitlines()
    mine = [r for r in rows if r.startswith("> ")]
    assert len(mine) == 1 and mine[0].startswith("> this machine") and mine[0].endswith("float32")
    assert f"{b.cost.latency_s * 1e6:.1f}" in mine[0] and f"{b.cost.peak_memory_bytes / 2**20:.2f}" in mine[0]
    line = widgets.change_line(a, b)
    assert "same plan (a device prices the plan" in line
    assert b.cost.peak_memory_bytes > a.cost.peak_memory_bytes
    assert "this machine runs float32, Atlas 300I Pro float16" in line


def test_a_limit_no_group_reaches_says_so(resnet):
    a = widgets.explore_state(resnet, max_group_ops=16, kinds=("mixed",))
    b = widgets.explore_state(resnet, max_group_ops=15, kinds=("mixed",))
    assert max(g.size for g in a.plan) <= 15
    line = widgets.change_line(a, b)
    assert "same plan (no group needed more than 15 ops)" in line and "same launches" in line


def test_the_explorers_text_breaks_only_at_spaces_within_the_width(resnet):
    a = widgets.explore_state(resnet, max_group_ops=5, kinds=widgets.KINDS)
    b = widgets.explore_state(resnet, max_group_ops=3, kinds=widgets.KINDS, device="this machine")
    from fusionlab.text import wrap

    text = wrap("since the initial setting, " + widgets.change_line(a, b)) + "\n" + widgets.result_text(b)
    assert all(len(line) <= MAX_WIDTH for line in text.splitlines())
    assert len(text.splitlines()) <= 16


def test_the_explorer_makes_the_same_widget_ids_on_every_run(resnet, capsys):
    """A learner's Run All in a fresh kernel names the models the stored notebook's widget state holds (random
    ids made the reopened notebook say "Error displaying widget: model not found"); running the cell again in
    the same kernel closes the first explorer and reuses its ids."""
    pytest.importorskip("ipywidgets")

    def ids(box):
        out, todo = [], [box]
        while todo:
            w = todo.pop()
            out.append(w.model_id)
            todo += [v for k in w.keys for v in ([getattr(w, k)] if not isinstance(getattr(w, k), (list, tuple))
                                                 else getattr(w, k)) if hasattr(v, "model_id") and v.comm]
        return sorted(set(out))

    first = widgets.explore(resnet, kinds=widgets.KINDS)
    a, box_id = ids(first), first.model_id
    key = widgets._explorer_key(widgets.as_graph(resnet), widgets.KINDS, 5, 0, "Atlas 300I Pro")
    assert len(a) > 10 and all(i.startswith(key + "-") for i in a)  # the controls, their layouts and styles too
    again = widgets.explore(resnet, kinds=widgets.KINDS)
    assert first.comm is None  # the first explorer was closed
    assert ids(again) == a and again.model_id == box_id
    other = widgets.explore(resnet, kinds=("vertical",))
    assert not set(ids(other)) & set(a)
    capsys.readouterr()


def test_the_device_chart_is_a_row_per_device_with_bars_on_its_own_scale(resnet):
    """The explorer shows the devices as a table with bars, not text lines: a row per preset (and this machine
    when chosen, marked >), each bar of the plan the fraction of that device's unfused value, its label the values."""
    import re

    a = widgets.explore_state(resnet, kinds=widgets.KINDS)
    b = widgets.explore_state(resnet, kinds=widgets.KINDS, device="this machine")
    for res in (a, b):
        chart = widgets.device_chart_html(res)
        rows = re.findall(r"<tr class=\"[^\"]*\"><td class=\"fl-device\">(.*?)</td>", chart)
        names = [r.replace("&gt; ", "") for r in rows]
        assert names == [r["device"] for r in res.device_rows()]
        assert [r for r in rows if r.startswith("&gt; ")] == [f"&gt; {res.cost.device}"]
        widths = [float(w) for w in re.findall(r"fl-bar-plan\" style=\"width: ([\d.]+)%", chart)]
        expect = [widgets.bar_width(r[k][1], r[k][0]) for r in res.device_rows() for k in ("latency_us", "peak_MiB")]
        assert widths == expect and all(0 <= w <= 100 for w in widths)
        assert f"&rarr; {res.cost.latency_s * 1e6:.1f} us" in chart  # the chosen device's plan, as costed
    assert "this machine" not in widgets.device_chart_html(a) and "&gt; this machine" in widgets.device_chart_html(b)
    mine = next(r for r in b.device_rows() if r["chosen"])
    assert mine["runs"] == "float32" and f"{mine['latency_us'][1]:.1f} us" in widgets.device_chart_html(b)
    assert widgets.bar_width(3.0, 4.0) == 75.0 and widgets.bar_width(5.0, 4.0) == 100.0 and widgets.bar_width(1, 0) == 0
    html = widgets.result_html("initial setting", b)
    assert html.count("<table") == 1 and "<details" in html
    shown = html.split("<table")[0]  # the text above the chart: a few lines, not 40
    assert len(shown.splitlines()) <= 8
