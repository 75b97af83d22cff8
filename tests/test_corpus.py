"""The passes over real third-party exports: tests/corpus/, made by tools/export_corpus.py (`make corpus`).

Eight architectures (BERT, also with eager attention, GPT-2, ViT from transformers; ConvNeXt, MobileNetV3,
EfficientNet, GoogLeNet from torchvision; YOLO11 from ultralytics), each exported by torch's TorchScript exporter with constant folding
on and off and by the dynamo exporter, with trained-looking random weights (see the manifest). For every
file: the manifest describes it truly, fusionlab loads it, onnxruntime runs it; the vertical passes and
all passes neither crash nor change what it computes (on padded attention masks too), give a model the
ONNX checker accepts, and leave nothing that computes from constants alone.

Where the current passes fall short the case is a strict xfail whose reason is the measured failure:
it turns red when a fix lands, and the entry in `KNOWN` is then to be deleted.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

import fusionlab
from fusionlab.passes import fuse
from fusionlab.runtime import make_feeds, run, session

CORPUS = Path(__file__).resolve().parent / "corpus"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())
ENTRIES = {e["file"]: e for e in MANIFEST["models"]}
FILES = sorted(ENTRIES)
PASSES = {"vertical": ("vertical",), "all": ("vertical", "horizontal", "mixed")}
#: sizes for the dynamic axes in the checks: not the exported ones (batch 2, sequence 32)
DIMS = {"batch": 2, "sequence": 16}
#: the second sequence of a text batch ends in this many padding positions (attention_mask 0)
PADDING = 5

#: (check, file, passes) -> the failure measured on the current passes; each becomes a strict xfail.
#: Empty now: the mixed pass's functions type-check under full_check and constant folding (issue 10)
#: leaves no constant-only node in any export.
KNOWN: dict[tuple[str, str, str], str] = {}


def _known(check: str, file: str, passes: str):
    reason = KNOWN.get((check, file, passes))
    return pytest.param(file, passes, marks=pytest.mark.xfail(strict=True, reason=reason)) if reason \
        else pytest.param(file, passes)


def _cases(check: str, passes=tuple(PASSES)) -> list:
    return [_known(check, f, p) for f in FILES for p in passes]


@functools.cache
def _graph(file: str) -> fusionlab.Graph:
    return fusionlab.load(CORPUS / file)


@functools.cache
def _fused(file: str, passes: str):
    return fuse(_graph(file), passes=PASSES[passes])


@functools.cache
def _feeds(file: str) -> dict:
    feeds = make_feeds(_graph(file), dims=DIMS)
    if "attention_mask" in feeds and feeds["attention_mask"].shape[0] > 1:
        feeds["attention_mask"][1, -PADDING:] = 0  # a padded sequence: the mask path must compute
    return feeds


def constant_only_nodes(proto: onnx.ModelProto) -> Counter:
    """Op counts of nodes that compute from constants alone (Constant nodes included) or take the Shape of
    a tensor whose shape is fully static: what a constant-folding pass would remove."""
    const = {init.name for init in proto.graph.initializer}
    inferred = onnx.shape_inference.infer_shapes(proto)
    static = {vi.name for vi in [*inferred.graph.value_info, *inferred.graph.input]
              if vi.type.tensor_type.HasField("shape")
              and all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim)}
    found: Counter = Counter()
    for node in proto.graph.node:
        if all(not name or name in const for name in node.input):
            found[node.op_type] += 1
            const.update(node.output)
        elif node.op_type == "Shape" and node.input[0] in static:
            found[node.op_type] += 1
            const.update(node.output)
    return found


def test_manifest_lists_exactly_the_files_and_they_stay_small():
    on_disk = sorted(p.name for p in CORPUS.glob("*.onnx"))
    assert on_disk == FILES
    total = sum((CORPUS / f).stat().st_size for f in FILES)
    assert total == MANIFEST["total_bytes"]
    assert total < 40e6, f"the committed corpus is {total / 1e6:.1f} MB"
    archs = {e["model"] for e in ENTRIES.values()}
    settings = Counter(e["setting"] for e in ENTRIES.values())
    assert len(archs) == 9 and set(settings) == {"ts-fold", "ts-nofold", "dynamo"}
    assert set(settings.values()) == {len(archs)}, settings


def test_manifest_weights_are_not_at_their_defaults():
    for file, e in ENTRIES.items():
        bn, ln = e["weights"].get("batchnorm"), e["weights"].get("layernorm")
        if bn:
            assert bn["share_var_within_5pct_of_1"] < 0.2 and bn["mean_abs_running_mean"] > 0.05, file
        if ln:
            assert 0.2 < ln["gamma_std"] < 0.4, file
        for name, out in e["check"]["outputs"].items():
            assert out["sensitivity"] >= MANIFEST["checks"]["min_sensitivity"], (file, name)


@pytest.mark.parametrize("file", FILES)
def test_file_matches_manifest(file):
    e = ENTRIES[file]
    data = (CORPUS / file).read_bytes()
    assert hashlib.sha256(data).hexdigest() == e["sha256"]
    proto = onnx.load_model_from_string(data)
    assert len(proto.graph.node) == e["nodes"]
    ops = Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}" for n in proto.graph.node)
    assert dict(ops) == e["op_histogram"]
    assert {(o.domain or "ai.onnx"): o.version for o in proto.opset_import} == e["opset"]


@pytest.mark.parametrize("file", FILES)
def test_loads_and_runs_in_onnxruntime(file):
    graph = _graph(file)
    assert len(graph) == ENTRIES[file]["nodes"]
    out = run(session(graph), _feeds(file))
    assert [o["name"] for o in ENTRIES[file]["outputs"]] == list(out)
    for name, value in out.items():
        assert np.all(np.isfinite(value)), name
        assert float(np.std(value)) > 1e-4, f"{name} is (near) constant"


@pytest.mark.parametrize(("file", "passes"), _cases("verify"))
def test_fused_model_verifies(file, passes):
    result = _fused(file, passes)
    report = fusionlab.verify(_graph(file), result.graph, feeds=_feeds(file))
    print(f"{file}, {passes} passes: {sum(result.before.values())} -> {sum(result.after.values())} nodes")
    print(report.table())
    assert report.ok, report.table()


@pytest.mark.parametrize(("file", "passes"), _cases("checker"))
def test_fused_model_passes_the_onnx_checker(file, passes):
    proto = _fused(file, passes).graph.to_proto()
    try:
        onnx.checker.check_model(proto, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        inner = Counter(f"{n.domain}::{n.op_type}" for f in proto.functions for n in f.node
                        if n.domain not in ("", "ai.onnx"))
        pytest.fail(_UNTYPED.format(ops=", ".join(sorted(inner))) if inner else str(exc).splitlines()[0])


@pytest.mark.parametrize(("file", "passes"), _cases("folded", ("all",)))
def test_nothing_left_that_computes_from_constants_alone(file, passes):
    left = constant_only_nodes(_fused(file, passes).graph.to_proto())
    assert not left, "constant-only nodes left: " + ", ".join(f"{op} {n}" for op, n in left.most_common())


@pytest.mark.parametrize("setting", ["ts-fold", "ts-nofold", "dynamo"])
def test_googlenet_inception_blocks_fuse_horizontally(setting):
    # each of GoogLeNet's 9 Inception blocks reads its input with three 1x1 convolutions (branch 1 and the
    # reductions of branches 2 and 3): horizontal fusion concatenates them into one Conv and a Split
    file = f"googlenet.{setting}.onnx"
    res = fuse(_graph(file), passes=("vertical", "horizontal"))
    assert res.plan.rule_counts().get("concat_conv") == 9
    ops = res.graph.op_counts()
    assert ops.get("Split") == 9 and ops.get("com.microsoft:FusedConv") == 57 - 2 * 9  # 3 convolutions -> 1, 9 times
    feeds = _feeds(file)
    want, got = run(_graph(file), feeds, level="disable"), run(res.graph, feeds, level="disable")
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)
