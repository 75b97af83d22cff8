"""viz: DOT text, layered layout, matplotlib pictures, atomic saves, netron served from a private folder."""

import os
import re
import socket
import urllib.request

import matplotlib
import numpy as np
import pytest
from onnx import helper

matplotlib.use("Agg")

from fusionlab import load, viz  # noqa: E402
from fusionlab.build import make_model, tensor, value_info  # noqa: E402
from fusionlab.plan import FusionGroup, FusionPlan  # noqa: E402


# -- models built in code -----------------------------------------------------------------------------

def conv_bn_relu(C=8):
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"], name="bn1"),
        helper.make_node("Relu", ["bn"], ["y"], name="relu1"),
    ]
    inits = [tensor("W", rng.standard_normal((C, 3, 3, 3)).astype(np.float32)), tensor("B", np.zeros(C, np.float32)),
             tensor("s", np.ones(C, np.float32)), tensor("b", np.zeros(C, np.float32)),
             tensor("m", np.zeros(C, np.float32)), tensor("v", np.ones(C, np.float32))]
    return make_model(nodes, [value_info("x", np.float32, [1, 3, 16, 16])],
                      [value_info("y", np.float32, [1, C, 16, 16])], inits, name="cbr")


def residual(blocks=2, C=4):
    """Residual blocks (Conv-BN-Relu-Conv-BN-Add-Relu), then three sibling 1x1 convs and a Concat."""
    rng = np.random.default_rng(1)
    nodes, inits, cur = [], [], "x"
    for i in range(blocks):
        for t in "ab":
            inits.append(tensor(f"w{i}{t}", rng.standard_normal((C, C, 3, 3)).astype(np.float32)))
            inits += [tensor(f"{p}{i}{t}", np.full(C, val, np.float32)) for p, val in (("s", 1), ("b", 0), ("m", 0), ("v", 1))]
        bn = lambda t: [f"c{i}{t}", f"s{i}{t}", f"b{i}{t}", f"m{i}{t}", f"v{i}{t}"]
        nodes += [
            helper.make_node("Conv", [cur, f"w{i}a"], [f"c{i}a"], name=f"/l{i}/conv1/Conv", pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", bn("a"), [f"n{i}a"], name=f"/l{i}/bn1/BatchNormalization"),
            helper.make_node("Relu", [f"n{i}a"], [f"r{i}a"], name=f"/l{i}/relu1/Relu"),
            helper.make_node("Conv", [f"r{i}a", f"w{i}b"], [f"c{i}b"], name=f"/l{i}/conv2/Conv", pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", bn("b"), [f"n{i}b"], name=f"/l{i}/bn2/BatchNormalization"),
            helper.make_node("Add", [f"n{i}b", cur], [f"a{i}"], name=f"/l{i}/add/Add"),
            helper.make_node("Relu", [f"a{i}"], [f"o{i}"], name=f"/l{i}/relu2/Relu"),
        ]
        cur = f"o{i}"
    for k in range(3):
        inits.append(tensor(f"h{k}", rng.standard_normal((2, C, 1, 1)).astype(np.float32)))
        nodes.append(helper.make_node("Conv", [cur, f"h{k}"], [f"hc{k}"], name=f"head{k}"))
    nodes.append(helper.make_node("Concat", ["hc0", "hc1", "hc2"], ["y"], name="concat", axis=1))
    return make_model(nodes, [value_info("x", np.float32, [1, C, 8, 8])], [value_info("y", np.float32, [1, 6, 8, 8])],
                      inits, name="residual")


def residual_plan(blocks=2):
    p = FusionPlan(model="residual")
    for i in range(blocks):
        p.add(FusionGroup(f"cbr{i}", "vertical", "conv_bn_relu",
                          [f"/l{i}/conv1/Conv", f"/l{i}/bn1/BatchNormalization", f"/l{i}/relu1/Relu"],
                          ["Conv", "BatchNormalization", "Relu"]))
        p.add(FusionGroup(f"cba{i}", "mixed", "conv_bn_add_relu",
                          [f"/l{i}/conv2/Conv", f"/l{i}/bn2/BatchNormalization", f"/l{i}/add/Add", f"/l{i}/relu2/Relu"],
                          ["Conv", "BatchNormalization", "Add", "Relu"]))
    p.add(FusionGroup("heads", "horizontal", "sibling_conv", ["head0", "head1", "head2"], ["Conv"] * 3))
    return p


def op_lines(dot):
    return re.findall(r"^\s*n\d+ \[label=", dot, flags=re.M)


# -- DOT ----------------------------------------------------------------------------------------------

def test_dot_of_a_chain():
    dot = viz.to_dot(conv_bn_relu())
    assert dot.startswith('digraph "cbr" {') and dot.rstrip().endswith("}")
    assert len(op_lines(dot)) == 3
    assert 'n0 [label="Conv\\nconv1\\nW 8×3×3×3\\nB 8"];' in dot  # weights noted in the label...
    assert not re.search(r'^\s*\w+ \[label="(W|B|s|b|m|v)\b', dot, flags=re.M)  # ...never drawn as nodes
    assert "scale, B, input_mean, input_var 8" in dot
    assert "in0 -> n0;" in dot and "n2 -> out0;" in dot and "subgraph" not in dot


def test_dot_clusters_and_determinism(tmp_path):
    model, plan = residual(), residual_plan()
    dot = viz.to_dot(model, plan, title="res")
    assert dot == viz.to_dot(model, plan, title="res")
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    assert viz.to_dot(str(path), plan, title="res") == dot == viz.to_dot(load(path), plan, title="res")
    clusters = re.findall(r"subgraph (cluster_\w+) \{", dot)
    assert clusters == ["cluster_cbr0", "cluster_cba0", "cluster_cbr1", "cluster_cba1", "cluster_heads"]
    assert len(op_lines(dot)) == 2 * 7 + 4
    assert 'label="heads: horizontal · sibling_conv";' in dot
    assert 'label="res"' in dot


def test_dot_nodes_are_topologically_numbered():
    dot = viz.to_dot(residual(), residual_plan())
    for a, b in re.findall(r"^\s*n(\d+) -> n(\d+)", dot, flags=re.M):
        assert int(a) < int(b)


def test_dot_restricted_subgraph():
    model = residual()
    dot = viz.to_dot(model, residual_plan(), nodes=["/l0/add/Add", "/l0/relu2/Relu"])
    assert len(op_lines(dot)) == 2
    assert "Add" in dot and "Conv" not in dot
    assert re.findall(r"subgraph (cluster_\w+)", dot) == ["cluster_cba0"]  # only the visible part of the group
    # the graph input enters as an input, a value an undrawn node makes through a dashed "from" stub, and one
    # read by nodes not drawn leaves through a stub
    assert 'label="from BatchNormalization"' in dot and 'label="input x' in dot and 'label="→ 2 more consumers"' in dot
    assert 'label="input n0b' not in dot and "from0 -> n0 [style=dashed" in dot
    wider = viz.to_dot(model, nodes=["/l0/add/Add"], hops=1)
    assert len(op_lines(wider)) == 3  # the Add, the BN before it and the Relu after it
    assert viz.neighbourhood(model, "head1", hops=1) == ["/l1/relu2/Relu", "head1", "concat"]
    with pytest.raises(ValueError, match="no node named 'nope'"):
        viz.to_dot(model, nodes=["nope"])


def test_dot_accepts_a_group_as_selection():
    plan = residual_plan()
    dot = viz.to_dot(residual(), plan, nodes=plan["heads"])
    assert len(op_lines(dot)) == 3


# -- layout -------------------------------------------------------------------------------------------

def _overlap(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@pytest.mark.parametrize("direction", ["TB", "LR"])
def test_layout_no_overlaps_and_edges_flow_one_way(direction):
    lay = viz.layered_layout(residual(3), residual_plan(3), direction=direction)
    keys = list(lay.positions)
    assert len(keys) == 3 * 7 + 4 + 2  # ops + input x + output y
    for layer in lay.layers:
        boxes = [lay.box(k) for k in layer]
        for i in range(len(boxes)):
            for j in range(i + 1, len(boxes)):
                assert not _overlap(boxes[i], boxes[j])
    # no two boxes anywhere overlap
    for i in range(len(keys)):
        for j in range(i + 1, len(keys)):
            assert not _overlap(lay.box(keys[i]), lay.box(keys[j])), (keys[i], keys[j])
    layer_of = {k: r for r, l in enumerate(lay.layers) for k in l}
    for a, b, pts in lay.edges:
        assert layer_of[a] < layer_of[b]
        assert len(pts) == layer_of[b] - layer_of[a] + 1  # one dummy point per skipped layer
        along = [p[1] for p in pts] if direction == "TB" else [-p[0] for p in pts]
        assert along == sorted(along, reverse=True)


def test_layout_is_deterministic_and_keeps_groups_adjacent():
    a = viz.layered_layout(residual(), residual_plan())
    b = viz.layered_layout(residual(), residual_plan())
    assert a.positions == b.positions and a.layers == b.layers and a.edges == b.edges
    heads = [l for l in a.layers if "head0" in l][0]
    idx = sorted(heads.index(h) for h in ("head0", "head1", "head2"))
    assert idx == list(range(idx[0], idx[0] + 3))
    assert a.crossings == 0


# -- drawing ------------------------------------------------------------------------------------------

def _gids(fig, prefix):
    return [p.get_gid() for ax in fig.axes for p in ax.patches if (p.get_gid() or "").startswith(prefix)]


def test_draw_returns_figure_with_group_patches_and_legend():
    from matplotlib.figure import Figure

    plan = residual_plan()
    fig = viz.draw(residual(), plan, title="residual")
    assert isinstance(fig, Figure)
    assert sorted(_gids(fig, "group:")) == sorted(f"group:{g.id}" for g in plan)
    assert len(_gids(fig, "node:")) == 2 * 7 + 4 + 2
    legend = fig.axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [
        "vertical · conv_bn_relu (2 groups)", "mixed · conv_bn_add_relu (2 groups)",
        "horizontal · sibling_conv (1 group)"]
    assert fig.axes[0].get_title() == "residual"


def test_draw_without_plan_and_into_given_axes():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 6))
    out = viz.draw(conv_bn_relu(), ax=ax)
    assert out is fig and _gids(fig, "group:") == [] and ax.get_legend() is None
    plt.close(fig)


def test_draw_refuses_big_graphs_with_a_hint():
    with pytest.raises(ValueError, match=r"nodes=\[\.\.\.\]"):
        viz.draw(residual(3), max_nodes=10)
    fig = viz.draw(residual(3), nodes=["/l2/add/Add"], hops=2, max_nodes=10)
    assert len(_gids(fig, "node:")) > 0


@pytest.mark.slow
def test_draw_sixty_nodes():
    fig = viz.draw(residual(8), residual_plan(8), direction="LR")
    assert len(_gids(fig, "group:")) == 17


def test_before_after_side_by_side():
    fig = viz.before_after(residual(1), conv_bn_relu(), residual_plan(1), titles=("before", "after"))
    assert [ax.get_title() for ax in fig.axes] == ["before", "after"]
    assert len(_gids(fig, "group:")) == 3


# -- saving -------------------------------------------------------------------------------------------

def test_save_svg_is_byte_identical(tmp_path):
    a = viz.save_picture(residual(), tmp_path / "a.svg", residual_plan(), title="r")
    b = viz.save_picture(residual(), tmp_path / "b.svg", residual_plan(), title="r")
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes().startswith(b"<?xml")
    assert b"<dc:date>" not in a.read_bytes()


def test_save_png_creates_parents_and_leaves_no_temp_files(tmp_path):
    out = viz.save_picture(conv_bn_relu(), tmp_path / "deep" / "er" / "cbr.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert os.listdir(out.parent) == ["cbr.png"]


def test_save_refuses_unknown_suffix(tmp_path):
    with pytest.raises(ValueError, match=".png or .svg"):
        viz.save_picture(conv_bn_relu(), tmp_path / "x.jpg")


def test_save_is_atomic_on_failure(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    target = tmp_path / "pic.png"
    target.write_bytes(b"old")

    def boom(self, *a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(Figure, "savefig", boom)
    with pytest.raises(RuntimeError):
        viz.save_picture(conv_bn_relu(), target)
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["pic.png"]


def test_save_an_existing_figure(tmp_path):
    fig = viz.draw(conv_bn_relu())
    out = viz.save_picture(fig, tmp_path / "f.svg")
    assert out.stat().st_size > 1000


# -- netron -------------------------------------------------------------------------------------------

def _get(url):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    with opener.open(url, timeout=10) as r:
        return r.status, r.read()


def _port_open(port):
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_netron_view_serves_only_the_model_and_cleans_up():
    model = conv_bn_relu()
    view = viz.netron_view(model, height=400)
    other = viz.netron_view(residual(1))
    try:
        assert view.url.startswith("http://127.0.0.1:") and view.host == "127.0.0.1"
        status, body = _get(view.url)
        assert status == 200 and b"<html" in body.lower()
        assert os.listdir(view.dir) == ["model.onnx"]
        assert (os.stat(view.dir).st_mode & 0o777) == 0o700
        # each view serves its own model (netron keeps content on a shared class; we give each its own)
        assert _get(view.url + "data/model.onnx")[1] == model.SerializeToString()
        assert _get(other.url + "data/model.onnx")[1] == residual(1).SerializeToString()
        assert view.iframe().src == view.url
        # no Jupyter server to go through (a notebook built, or viewed, without the lab): no frame that cannot
        # load, but a picture of the model and one sentence on how to open the live view
        shown = view._repr_html_()
        assert "<iframe" not in shown and 'src="data:image/png;base64,' in shown and "max-height: 400px" in shown
        assert shown.count("<p>") == 1 and "make lab" in shown and view.url in shown
    finally:
        view.stop()
        other.stop()
    assert not view.alive and not _port_open(view.port) and not os.path.exists(view.dir)
    assert not os.path.exists(other.dir)
    assert view not in viz.netron._LIVE


def test_values_read_inside_subgraphs_are_edges_into_the_owner():
    then = helper.make_graph([helper.make_node("Identity", ["a"], ["t"])], "then", [], [value_info("t", np.float32, [2])])
    other = helper.make_graph([helper.make_node("Neg", ["a"], ["e"])], "else", [], [value_info("e", np.float32, [2])])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if"),
             helper.make_node("Relu", ["y"], ["z"])]  # unnamed: gets a stable generated key
    model = make_model(nodes, [value_info("x", np.float32, [2]), value_info("c", np.bool_, [])],
                       [value_info("z", np.float32, [2])])
    dot = viz.to_dot(model)
    assert "n0 -> n1;" in dot  # relu -> If, through the branch bodies
    assert 'label="output a"' not in dot and len(op_lines(dot)) == 3
    assert "Relu_2" in viz.layered_layout(model).positions


def test_netron_binds_loopback_only_and_goes_through_the_jupyter_server_when_there_is_one(monkeypatch):
    import jupyter_server.serverapp as serverapp

    monkeypatch.setenv("JPY_PARENT_PID", "4242")
    monkeypatch.setattr(serverapp, "list_running_servers",
                        lambda *a, **k: iter([{"pid": 1, "base_url": "/other/"}, {"pid": 4242, "base_url": "/hub/u/"}]))
    view = viz.netron_view(conv_bn_relu())
    try:
        assert all(t.server.server_address[0] == "127.0.0.1" for t in view._threads)
        assert view.proxy_url == f"/hub/u/proxy/127.0.0.1:{view.port}/" and view.src == view.proxy_url
        assert f'src="{view.proxy_url}"' in view._repr_html_() and "Accept" in view._repr_html_()
        assert view.iframe().src == view.proxy_url
    finally:
        view.stop()
    assert not _port_open(view.port) and view._repr_html_() == "<p>netron view stopped</p>"
    monkeypatch.delenv("JPY_PARENT_PID")
    assert viz.jupyter_base_url() is None  # not under a Jupyter server: the direct address is used


def test_a_value_from_an_undrawn_node_is_a_stub_not_an_input():
    """The mirror of a cut edge: a drawn node reading a value that a node left out of the picture makes gets a
    dashed "from Op" stub, never an "input …" pill (only graph inputs are inputs)."""
    model = residual()
    sc = viz.scene.scene_of(model, residual_plan(), ["/l0/relu2/Relu"])
    terminals = [it for it in sc.items if it.kind != "op"]
    froms = [it for it in terminals if it.kind == "from"]
    assert [it.title for it in froms] == ["from Add"] and not [it for it in terminals if it.kind == "input"]
    whole = viz.scene.scene_of(model, residual_plan(), None)
    assert [it for it in whole.items if it.kind == "from"] == [] and [it for it in whole.items if it.kind == "input"]
    fig = viz.draw(model, residual_plan(), nodes=["/l0/relu2/Relu"])
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "from Add" in texts and not any(t.startswith("input ") for t in texts)
    stubs = [p for ax in fig.axes for p in ax.patches if (p.get_gid() or "").startswith("edge:from:")]
    assert stubs and all(p.get_linestyle() == "--" for p in stubs)
    assert "style=dashed" in viz.to_dot(model, residual_plan(), nodes=["/l0/relu2/Relu"])


def test_a_cut_edge_is_a_stub_not_an_output():
    """A value read by nodes left out of the picture is no graph output: it leaves through a dashed stub labelled
    "→ N more consumers", never through an "output …" pill (notebook 03's plan picture drew such pills)."""
    model = residual()
    sc = viz.scene.scene_of(model, residual_plan(), ["/l0/add/Add", "/l0/relu2/Relu"])
    kinds = {it.key: it for it in sc.items if it.kind != "op"}
    assert not [k for k, it in kinds.items() if it.kind == "output"]  # nothing drawn is a graph output
    cuts = [it for it in kinds.values() if it.kind == "cut"]
    assert [it.key for it in cuts] == ["cut:o0"] and cuts[0].title == "→ 2 more consumers"
    whole = viz.scene.scene_of(model, residual_plan(), None)
    assert [it.key for it in whole.items if it.kind == "cut"] == []  # the whole graph: real outputs only
    assert [it.kind for it in whole.items if it.key.startswith("output:")] == ["output"]
    fig = viz.draw(model, residual_plan(), nodes=["/l0/add/Add", "/l0/relu2/Relu"])
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "2 more consumers" in texts and not any(t.startswith("output ") for t in texts)  # the stub is the arrow
    stub = [p for ax in fig.axes for p in ax.patches if (p.get_gid() or "").endswith("->cut:o0")]
    assert len(stub) == 1 and stub[0].get_linestyle() == "--"
    dot = viz.to_dot(model, residual_plan(), nodes=["/l0/add/Add", "/l0/relu2/Relu"])
    assert 'label="→ 2 more consumers", shape=plaintext' in dot and "-> cut0 [style=dashed" in dot
