"""The model zoo: every builder writes a valid, runnable, exporter-shaped, deterministic model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import fusionlab
from fusionlab import zoo
from fusionlab.verification import runtime

# Small configurations: same topology as the defaults, sizes cut so the whole file runs in seconds.
SMALL = {
    "conv_bn_relu": dict(image_size=16),
    "resnet_small": dict(image_size=32, width=8),
    "resnet18": dict(image_size=32, width=8, num_classes=10),
    "resnet50": dict(image_size=32, width=8, num_classes=10),
    "yolov5s": dict(image_size=64, width_mult=0.125),
    "yolov5n": dict(image_size=64),
    "bert": dict(layers=2, hidden=32, heads=4, intermediate=64, vocab=50, max_position=16),
    "bert_tiny": dict(vocab=50, max_position=16),
    "inception": dict(image_size=75, width=0.125, num_classes=10),
    "mobilenet_v2": dict(image_size=32, width_mult=0.25, num_classes=10),
}

EXPECTED_OUTPUTS = {
    "conv_bn_relu": {"output": (1, 16, 16, 16)},
    "resnet_small": {"logits": (1, 10)},
    "resnet18": {"logits": (1, 10)},
    "resnet50": {"logits": (1, 10)},
    "yolov5s": {"p3": (1, 255, 8, 8), "p4": (1, 255, 4, 4), "p5": (1, 255, 2, 2)},
    "yolov5n": {"p3": (1, 255, 8, 8), "p4": (1, 255, 4, 4), "p5": (1, 255, 2, 2)},
    "bert": {"last_hidden_state": (1, 8, 32)},
    "bert_tiny": {"last_hidden_state": (1, 8, 128)},
    "inception": {"logits": (1, 10)},
    "mobilenet_v2": {"logits": (1, 10)},
}


@pytest.fixture(scope="module")
def small():
    return {name: zoo.build(name, **params) for name, params in SMALL.items()}


def consumers(model: onnx.ModelProto, value: str) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if value in n.input]


def producer(model: onnx.ModelProto, value: str) -> onnx.NodeProto | None:
    return next((n for n in model.graph.node if value in n.output), None)


def ops(model: onnx.ModelProto) -> dict[str, int]:
    return zoo.summary(model)["ops"]


def test_registry_covers_every_model():
    assert set(SMALL) == set(zoo.MODELS)
    assert all(isinstance(d, str) and d for d in zoo.MODELS.values())


@pytest.mark.parametrize("name", sorted(SMALL))
def test_valid_runnable_and_loadable(small, name):
    model = small[name]
    onnx.checker.check_model(model, full_check=True)
    graph = fusionlab.load(model)
    assert len(graph) == len(model.graph.node)
    out = runtime.run(model, level="disable")
    assert {k: v.shape for k, v in out.items()} == EXPECTED_OUTPUTS[name]
    for v in out.values():
        assert np.isfinite(v).all()
        assert 1e-3 < float(np.abs(v).max()) < 1e3


@pytest.mark.parametrize("name", sorted(SMALL))
def test_exporter_conventions(small, name):
    model = small[name]
    assert model.ir_version == fusionlab.build.IR_VERSION
    assert [o.version for o in model.opset_import if o.domain == ""] == [17]
    names = [n.name for n in model.graph.node]
    assert len(set(names)) == len(names) and all(n.startswith("/") for n in names)
    inits = {t.name for t in model.graph.initializer}
    assert not inits & {i.name for i in model.graph.input}  # weights are constants, not overridable inputs
    for node in model.graph.node:
        if node.op_type == "BatchNormalization":
            assert len(node.input) == 5 and len(node.output) == 1
            attrs = {a.name: a for a in node.attribute}
            assert "training_mode" not in attrs and attrs["epsilon"].f in (np.float32(1e-5), np.float32(1e-3))
            conv = producer(model, node.input[0])
            assert conv.op_type == "Conv" and len(conv.input) == 2  # bias-free conv before BN
            assert node.input[1].endswith(".weight") and node.input[4].endswith(".running_var")
    dims = [d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim[:1]]
    assert dims and all(d == "batch" for d in dims)


@pytest.mark.slow
def test_resnet50_full_size():
    model = zoo.build("resnet50")
    counts = ops(model)
    assert counts["Conv"] == 53 and counts["BatchNormalization"] == 53
    assert counts["Add"] == 16 and counts["Relu"] == 49 and counts["Gemm"] == 1
    s = zoo.summary(model)
    assert 25.5e6 < s["params"] < 25.7e6
    names = {n.name for n in model.graph.node}
    assert {"/conv1/Conv", "/layer1/layer1.0/conv1/Conv", "/layer1/layer1.0/downsample/downsample.0/Conv",
            "/layer4/layer4.2/relu_2/Relu", "/fc/Gemm"} <= names
    inits = {t.name for t in model.graph.initializer}
    assert {"layer1.0.conv1.weight", "layer1.0.bn1.running_mean", "fc.weight"} <= inits
    # v1.5: the stride-2 sits in conv2 (3x3) of the first block of a stage
    strides = {n.name: list(a.ints) for n in model.graph.node for a in n.attribute if a.name == "strides"}
    assert strides["/layer2/layer2.0/conv2/Conv"] == [2, 2] and strides["/layer2/layer2.0/conv1/Conv"] == [1, 1]
    out = runtime.run(model)["logits"]  # ~0.1 s single thread: activations must stay O(1) through 50 layers
    assert np.isfinite(out).all() and out.std() < 50


def test_yolo_silu_pairs_and_structure(small):
    model = small["yolov5s"]
    sigmoids = [n for n in model.graph.node if n.op_type == "Sigmoid"]
    assert len(sigmoids) == 57
    for sig in sigmoids:
        (mul,) = consumers(model, sig.output[0])
        assert mul.op_type == "Mul" and set(mul.input) == {sig.input[0], sig.output[0]}
    counts = ops(model)
    assert counts["Resize"] == 2 and counts["MaxPool"] == 3 and counts["Conv"] == 60
    sppf = [n for n in model.graph.node if n.name == "/model.9/Concat"]
    assert len(sppf) == 1 and len(sppf[0].input) == 4
    resize = next(n for n in model.graph.node if n.op_type == "Resize")
    assert {a.name: a.s for a in resize.attribute}["mode"] == b"nearest"
    detect = [n for n in model.graph.node if n.name.startswith("/model.24/")]
    assert [len(n.input) for n in detect] == [3, 3, 3]  # detect convs keep their bias
    # shortcut bottlenecks in the backbone only (C3 blocks of the neck have shortcut=False)
    adds = [n.name for n in model.graph.node if n.op_type == "Add"]
    assert adds and all(a.split("/")[1] in ("model.2", "model.4", "model.6", "model.8") for a in adds)


@pytest.mark.parametrize("decomposed", [True, False])
def test_bert_structure(decomposed):
    params = dict(SMALL["bert"], decomposed_layernorm=decomposed)
    model = zoo.build("bert", **params)
    layers = params["layers"]
    counts = ops(model)
    assert counts["Erf"] == layers and counts["Softmax"] == layers
    if decomposed:
        assert "LayerNormalization" not in counts
        assert counts["ReduceMean"] == 2 * (2 * layers + 1) and counts["Pow"] == 2 * layers + 1
    else:
        assert counts["LayerNormalization"] == 2 * layers + 1 and "Pow" not in counts
    g = fusionlab.load(model)
    siblings = 0
    for value in {i for n in model.graph.node if n.op_type == "MatMul" for i in n.input[:1]}:
        mms = [n for n in consumers(model, value) if n.op_type == "MatMul" and n.input[0] == value]
        if len(mms) == 3:
            siblings += 1
            assert all(g.constant(g.value(n.input[1])) is not None for n in mms)
            assert [n.name.split("/")[-2] for n in mms] == ["query", "key", "value"]
    assert siblings == layers
    out = runtime.run(model)["last_hidden_state"]
    assert np.isfinite(out).all() and abs(out.std() - 1) < 0.5  # a LayerNorm output


def test_bert_mask_hides_positions():
    model = zoo.build("bert", **SMALL["bert"])
    sess = runtime.session(model)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 50, (2, 6)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[:, 4:] = 0
    other = ids.copy()
    other[:, 4:] = (ids[:, 4:] + 7) % 50
    a = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    b = sess.run(None, {"input_ids": other, "attention_mask": mask})[0]
    np.testing.assert_allclose(a[:, :4], b[:, :4], rtol=1e-4, atol=1e-5)
    assert not np.allclose(a[:, 4:], b[:, 4:])


@pytest.mark.parametrize("opset", [13, 18, 21])
def test_opsets(opset):
    model = zoo.build("bert", **SMALL["bert"], opset=opset)
    onnx.checker.check_model(model)
    rm = [n for n in model.graph.node if n.op_type == "ReduceMean"]
    assert all(len(n.input) == (2 if opset >= 18 else 1) for n in rm)
    assert all(any(a.name == "axes" for a in n.attribute) == (opset < 18) for n in rm)
    ref = runtime.run(zoo.build("bert", **SMALL["bert"]))["last_hidden_state"]
    np.testing.assert_allclose(runtime.run(model)["last_hidden_state"], ref, rtol=1e-4, atol=1e-4)
    conv = zoo.build("yolov5s", **SMALL["yolov5s"], opset=opset)
    onnx.checker.check_model(conv)
    assert all(np.isfinite(v).all() for v in runtime.run(conv).values())


def test_bad_parameters():
    with pytest.raises(ValueError, match="opset"):
        zoo.resnet_small(opset=12)
    with pytest.raises(ValueError, match="multiple of 32"):
        zoo.yolov5s(image_size=100)
    with pytest.raises(ValueError, match="opset >= 17"):
        zoo.bert(layers=1, hidden=32, heads=4, intermediate=64, vocab=50, decomposed_layernorm=False, opset=16)
    with pytest.raises(KeyError, match="unknown zoo model"):
        zoo.get("alexnet")
    with pytest.raises(TypeError):
        zoo.path("resnet_small", no_such_param=1)


def test_mobilenet_depthwise_and_relu6(small):
    model = small["mobilenet_v2"]
    inits = {t.name: t for t in model.graph.initializer}
    depthwise = 0
    for n in model.graph.node:
        if n.op_type != "Conv":
            continue
        group = next((a.i for a in n.attribute if a.name == "group"), 1)
        if group > 1:
            depthwise += 1
            w = inits[n.input[1]]
            assert w.dims[0] == group and w.dims[1] == 1 and list(w.dims[2:]) == [3, 3]
    assert depthwise == 17
    clips = [n for n in model.graph.node if n.op_type == "Clip"]
    g = fusionlab.load(model)
    assert len(clips) == 35
    for clip in clips:
        assert len(clip.input) == 3
        assert float(g.constant(g.value(clip.input[1]))) == 0 and float(g.constant(g.value(clip.input[2]))) == 6
    assert "/features/features.2/conv/conv.1/conv.1.0/Conv" in {n.name for n in model.graph.node}
    full = ops(zoo.build("mobilenet_v2", image_size=32))  # at width 0.25 rounding adds one more residual
    assert full["Conv"] == 52 and full["BatchNormalization"] == 52 and full["Add"] == 10


def test_inception_sibling_1x1_branches(small):
    model = small["inception"]

    def attrs(n):
        return {a.name: list(a.ints) for a in n.attribute if a.ints}

    groups = []
    for value in {i for n in model.graph.node if n.op_type == "Conv" for i in n.input[:1]}:
        convs = [n for n in consumers(model, value) if n.op_type == "Conv" and attrs(n)["kernel_shape"] == [1, 1]]
        if len(convs) >= 2:
            assert len({str(attrs(n)) for n in convs}) == 1  # identical kernel/stride/pad: one wide conv
            groups.append(len(convs))
    # Mixed_5b/5c/5d (A) and Mixed_6b (C) read their input with three 1x1 branches; Mixed_6a (B) with one
    assert sorted(groups) == [3, 3, 3, 3]
    counts = ops(model)
    assert counts["Concat"] == 5 and counts["AveragePool"] == 4
    for n in model.graph.node:
        if n.op_type == "Conv":
            bn = consumers(model, n.output[0])
            assert [c.op_type for c in bn] == ["BatchNormalization"]
            assert [c.op_type for c in consumers(model, bn[0].output[0])] == ["Relu"]


@pytest.mark.parametrize("name", ["resnet_small", "yolov5s", "mobilenet_v2", "inception"])
def test_identity_weights(name):
    plain = zoo.build(name, **SMALL[name])
    model = zoo.build(name, **SMALL[name], identity_weights=True)
    onnx.checker.check_model(model)
    g = fusionlab.load(model)
    convs = [n for n in g if n.op_type == "Conv"]
    for conv in convs:
        assert conv.inputs[1].producer().op_type == "Identity"
        assert g.constant(conv.inputs[1]) is not None
    assert ops(model)["Identity"] == sum(len(n.inputs) - 1 for n in convs)
    a, b = runtime.run(plain), runtime.run(model)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.parametrize("name", sorted(SMALL))
def test_deterministic(name):
    one = zoo.build(name, **SMALL[name]).SerializeToString()
    two = zoo.build(name, **SMALL[name]).SerializeToString()
    assert one == two
    assert zoo.build(name, **SMALL[name], seed=1).SerializeToString() != one


def test_cache_path_reuse(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSIONLAB_CACHE", str(tmp_path))
    assert zoo.cache_dir() == tmp_path
    p = zoo.path("resnet_small", image_size=32)
    assert p.parent == tmp_path and p.name.startswith("resnet_small-") and p.suffix == ".onnx"
    stamp = p.stat().st_mtime_ns
    assert zoo.path("resnet_small", image_size=32) == p and p.stat().st_mtime_ns == stamp
    # defaults spelled out or not: same file; any other value: another file
    assert zoo.path("resnet_small", image_size=32, width=16, seed=0) == p
    assert zoo.path("resnet_small", image_size=32, seed=1) != p
    assert p.read_bytes() == zoo.build("resnet_small", image_size=32).SerializeToString()
    assert zoo.get("resnet_small", image_size=32).SerializeToString() == p.read_bytes()
    assert not list(tmp_path.glob(".*.tmp"))
    fusionlab.load(p)
    m = zoo.get("conv_bn_relu", cache=False)
    assert not list(tmp_path.glob("conv_bn_relu-*")) and len(m.graph.node) == 3


def test_extract_stem(small):
    model = small["resnet_small"]
    stem = zoo.extract(model, ["/conv1/Conv", "/bn1/BatchNormalization", "/relu"])
    onnx.checker.check_model(stem)
    assert [n.op_type for n in stem.graph.node] == ["Conv", "BatchNormalization", "Relu"]
    assert [i.name for i in stem.graph.input] == ["input"] and len(stem.graph.initializer) == 5
    (out_name,) = [o.name for o in stem.graph.output]
    full = onnx.ModelProto()
    full.CopyFrom(model)
    full.graph.output.append(onnx.helper.make_tensor_value_info(out_name, onnx.TensorProto.FLOAT, None))
    feeds = runtime.make_feeds(model)
    np.testing.assert_array_equal(runtime.run(stem, feeds)[out_name], runtime.run(full, feeds)[out_name])
    # a whole block by scope prefix, with weights seen through Identity
    block = zoo.extract(zoo.build("resnet_small", **SMALL["resnet_small"], identity_weights=True),
                        "/layer2/layer2.0")
    onnx.checker.check_model(block)
    assert len(block.graph.input) == 1 and ops(block)["Conv"] == 3 and ops(block)["Identity"] == 3
    assert [d.dim_value for d in block.graph.input[0].type.tensor_type.shape.dim[1:]] == [8, 8, 8]
    assert runtime.run(block)[block.graph.output[0].name].shape == (1, 16, 4, 4)
    with pytest.raises(ValueError, match="no node matches"):
        zoo.extract(model, "/nope")


def test_summary(small):
    s = zoo.summary(small["conv_bn_relu"])
    assert s["nodes"] == 3 and s["ops"] == {"BatchNormalization": 1, "Conv": 1, "Relu": 1}
    assert s["params"] == 16 * 3 * 9 + 4 * 16 and s["initializers"] == 5
    assert s["inputs"] == {"input": ["batch", 3, 16, 16]} and s["outputs"] == {"output": ["batch", 16, 16, 16]}
    assert s["mb"] >= 0 and s["opset"] == 17
    assert zoo.summary(fusionlab.load(small["bert"]))["inputs"] == {
        "input_ids": ["batch", "sequence"], "attention_mask": ["batch", "sequence"]}
