"""The passes over real third-party exports: tests/corpus/, made by tools/export_corpus.py (`make corpus`).

Fifteen architectures: BERT (also with eager attention), GPT-2, ViT, a LLaMA-style decoder (grouped-query
attention, rotary embeddings, RMSNorm, SwiGLU), the T5 encoder (relative position bias, gated-gelu), the
Whisper encoder and Swin from transformers; ConvNeXt, MobileNetV3, EfficientNet, GoogLeNet from torchvision;
YOLO11 from ultralytics; and float16 exports of a ResNet-18 (1/4 width) and of both BERTs. Each is exported by
torch's TorchScript exporter with constant folding on and off and by the dynamo exporter, with trained-looking
random weights (see the manifest); an export an exporter cannot make is listed in the manifest's
`not_exported` with its error. For every file: the manifest describes it truly, fusionlab loads it,
onnxruntime runs it; the vertical passes and all passes neither crash nor change what it computes (on padded
attention masks too; float16 outputs judged against a float32 run, as `fusionlab.verify` does), give a model
the ONNX checker accepts, and leave nothing that computes from constants alone. The same holds for each export
whose norms are written out (`weight * hidden`, as transformers writes RMSNorm) with those norm weights set to
exactly one, as Hugging Face initialises them (`corpus_cases.norms_at_one`): what a user exporting a fresh model
has.

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
from corpus_cases import corpus_feeds, norm_weights_into_mul, norms_at_one
from fusionlab.passes import fuse
from fusionlab.verification.runtime import run, session

pytestmark = pytest.mark.slow  # every export, every check: `make check` leaves it to `make test`

CORPUS = Path(__file__).resolve().parent / "corpus"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())
ENTRIES = {e["file"]: e for e in MANIFEST["models"]}
FILES = sorted(ENTRIES)
PASSES = {"vertical": ("vertical",), "all": ("vertical", "horizontal", "mixed")}
SETTINGS = ("ts-fold", "ts-nofold", "dynamo")
#: the exports with norms written out as `weight * hidden` (transformers' RMSNorm): LLaMA and T5, 3 each
ONES_FILES = [f for f in FILES if f.split(".")[0] in ("llama", "t5_encoder")]

#: file -> (stage, a phrase of the error): the exports the exporters cannot make (tools/export_corpus.py records
#: them in the manifest instead of writing a broken file). The TorchScript exporter's SDPA
#: (symbolic_opset14.scaled_dot_product_attention) turns the boolean mask into Where(mask, float32 0, float32
#: -inf) whatever the query's dtype, so a float16 model's scores become float32 and the residual
#: LayerNormalization gets a float32 input with float16 weights: not valid ONNX.
NOT_EXPORTED = {
    "bert_fp16.ts-fold.onnx": ("export check refused it", "Scale has inconsistent type tensor(float16)"),
    "bert_fp16.ts-nofold.onnx": ("export check refused it", "Scale has inconsistent type tensor(float16)"),
}

#: (check, file, passes) -> the failure measured on the current passes; each becomes a strict xfail.
#: The norms-at-one variants (issue 19's no-op fold of Mul(ones, x) and the RMSNorm rule's opset) pass since
#: the fixes landed (commit 0bf3df3); what is left is measured below.
KNOWN: dict[tuple[str, str, str], str] = {
    # not one of issue 19's bugs: found when Swin entered the corpus
    **{("folded", f"swin.{s}.onnx", "all"): (
        "constant-only nodes left after all passes (Cast 8, Shape 6, Gather 6, Div 4, Unsqueeze 4, Concat 2): in "
        "the shifted blocks the mixed pass packs Swin's window-mask arithmetic into functions (AddCast, "
        "EqualNotCastWhere) whose outputs it declares static ([1, 16, 16, 1], [16, 16, 16]), and the Shape -> "
        "Gather -> Div -> Cast -> Unsqueeze -> Concat chains reading them are not folded (vertical alone leaves "
        "none)") for s in ("ts-fold", "ts-nofold")},
}


def _known(check: str, file: str, passes: str):
    reason = KNOWN.get((check, file, passes))
    return pytest.param(file, passes, marks=pytest.mark.xfail(strict=True, reason=reason)) if reason \
        else pytest.param(file, passes)


def _cases(check: str, passes=tuple(PASSES), files=FILES) -> list:
    return [_known(check, f, p) for f in files for p in passes]


@functools.cache
def _graph(file: str) -> fusionlab.Graph:
    return fusionlab.load(CORPUS / file)


@functools.cache
def _fused(file: str, passes: str):
    return fuse(_graph(file), passes=PASSES[passes])


@functools.cache
def _feeds(file: str) -> dict:
    return corpus_feeds(_graph(file))  # a padded second sequence: the mask path must compute


@functools.cache
def _ones(file: str) -> fusionlab.Graph:
    graph = norms_at_one(_graph(file))
    assert graph is not None, f"{file} has no norm weight feeding a Mul"
    return graph


@functools.cache
def _fused_ones(file: str, passes: str):
    return fuse(_ones(file), passes=PASSES[passes])


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
    assert total < 50e6, f"the committed corpus is {total / 1e6:.1f} MB"
    archs = {e["model"] for e in ENTRIES.values()}
    assert len(archs) == 16
    for arch in archs:  # every exporter setting either made the file or is recorded as unable to
        made = {e["setting"] for e in ENTRIES.values() if e["model"] == arch}
        failed = {f["setting"] for f in MANIFEST["not_exported"] if f["model"] == arch}
        assert not made & failed and made | failed == set(SETTINGS), (arch, made, failed)


def test_manifest_records_exactly_the_exports_that_failed():
    failed = {f["file"]: f for f in MANIFEST["not_exported"]}
    assert sorted(failed) == sorted(NOT_EXPORTED)
    for file, (stage, phrase) in NOT_EXPORTED.items():
        assert failed[file]["stage"] == stage and phrase in failed[file]["error"], failed[file]
        assert not (CORPUS / file).exists()  # never a broken file in the corpus


def test_float16_exports_are_float16_and_judged_against_float32():
    half = [f for f in FILES if ENTRIES[f]["model"].endswith("_fp16")]
    assert sorted({ENTRIES[f]["model"] for f in half}) == ["bert_eager_fp16", "bert_fp16", "resnet_fp16"]
    assert len(half) == 7
    limit = MANIFEST["checks"]["export_atol_scaled_float16_vs_float32"]
    for f in half:
        e = ENTRIES[f]
        assert {o["dtype"] for o in e["outputs"]} == {"float16"}, f
        assert {i["dtype"] for i in e["inputs"]} <= {"float16", "int64"}, f
        check = e["check"]
        assert check["judged_against"].startswith("torch float32 twin"), f
        # onnxruntime's float16 run is about as far from the float32 one as torch's own float16 run
        assert check["max_scaled_error_vs_torch"] <= limit, f
        assert check["max_scaled_error_vs_torch"] <= 2 * check["torch_float16_scaled_error_vs_float32"], f
        proto = onnx.load(str(CORPUS / f), load_external_data=False)
        dtypes = Counter(t.data_type for t in proto.graph.initializer if t.data_type in (1, 10))
        assert dtypes[10] > 0 and dtypes[10] > 10 * dtypes[1], (f, dtypes)  # weights in float16, not float32


def test_manifest_weights_are_not_at_their_defaults():
    for file, e in ENTRIES.items():
        bn, ln = e["weights"].get("batchnorm"), e["weights"].get("layernorm")
        if bn:
            assert bn["share_var_within_5pct_of_1"] < 0.2 and bn["mean_abs_running_mean"] > 0.05, file
        if ln:
            assert 0.2 < ln["gamma_std"] < 0.4, file
        rms = e["weights"].get("rmsnorm")
        if rms:  # LlamaRMSNorm / T5LayerNorm: not at their initial ones
            assert 0.2 < rms["gamma_std"] < 0.4, file
        assert ("rmsnorm" in e["weights"]) == (e["model"] in ("llama", "t5_encoder")), file
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


@pytest.mark.parametrize(("file", "passes"), _cases("counts"))
def test_plan_counts_the_kernels_the_fused_model_launches(file, passes):
    """One accounting (issue 24): the plan's kernels are the fused model's. The cost model prices the plan
    over the loaded model with the kernels the plan says; priced again on the fused model itself, unfused,
    every node launches its own kernel. The two agree, the footer's `nodes - kernels` is the sum of the table's
    "launches saved" column, and a group no later group took from launches what its rule said it would."""
    from fusionlab import cost

    result = _fused(file, passes)
    plan = result.plan
    priced = cost.plan_cost(_graph(file), plan, "Atlas 300I Pro").kernels
    applied = cost.plan_cost(result.graph, None, "Atlas 300I Pro").kernels
    assert priced == applied, f"the plan prices {priced} kernels; the fused model launches {applied}"
    counts = plan.counts()
    assert counts.nodes - counts.kernels == plan.saved_launches
    taken = {n for g in plan.groups for n in g.covers}
    later: set[str] = set()
    for g in reversed(plan.groups):  # untouched by later groups: the rule's prediction is what ran
        if not (set(g.covers) & later):
            assert g.runs == g.kernels, f"{g.id} ({g.rule}): the rule said {g.kernels} kernels, {g.runs} ran"
        later |= set(g.covers)
    assert later == taken
    if passes == "all":  # a part of the plan (the vertical groups without the mixed ones that took from them)
        from fusionlab.passes import apply

        part = plan.by_kind("vertical")
        part_applied = cost.plan_cost(apply(_graph(file), part, validate=False).graph, None, "Atlas 300I Pro")
        assert cost.plan_cost(_graph(file), part, "Atlas 300I Pro").kernels == part_applied.kernels


@pytest.mark.parametrize(("file", "passes"), _cases("folded", ("all",)))
def test_nothing_left_that_computes_from_constants_alone(file, passes):
    left = constant_only_nodes(_fused(file, passes).graph.to_proto())
    assert not left, "constant-only nodes left: " + ", ".join(f"{op} {n}" for op, n in left.most_common())


def test_norms_at_one_sets_exactly_the_written_out_norm_weights():
    for file in ONES_FILES:  # 5 norms each: 2 per layer and the final one; none elsewhere in the corpus
        names = norm_weights_into_mul(_graph(file))
        assert len(names) == 5, (file, names)
        inits = {t.name: onnx.numpy_helper.to_array(t) for t in _ones(file).to_proto().graph.initializer}
        assert all(np.all(inits[n] == 1) for n in names)
        before = {t.name: onnx.numpy_helper.to_array(t) for t in _graph(file).to_proto().graph.initializer}
        assert all(not np.all(before[n] == 1) for n in names)  # the trained-looking export's are not ones
    assert not [f for f in FILES if f not in ONES_FILES and norm_weights_into_mul(_graph(f))]


@pytest.mark.parametrize(("file", "passes"), _cases("verify_ones", files=ONES_FILES))
def test_fused_model_verifies_with_norm_weights_at_one(file, passes):
    result = _fused_ones(file, passes)
    report = fusionlab.verify(_ones(file), result.graph, feeds=_feeds(file))
    assert report.ok, report.table()


@pytest.mark.parametrize(("file", "passes"), _cases("checker_ones", files=ONES_FILES))
def test_fused_model_passes_the_onnx_checker_with_norm_weights_at_one(file, passes):
    onnx.checker.check_model(_fused_ones(file, passes).graph.to_proto(), full_check=True)


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
