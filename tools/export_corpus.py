#!/usr/bin/env python3
"""Export the corpus of third-party models: real architectures, as people export them, into tests/corpus/.

    python3 tools/export_corpus.py                 # the small corpus -> tests/corpus/ + manifest.json (make corpus)
    python3 tools/export_corpus.py --only bert     # some architectures only (the manifest keeps the others)
    python3 tools/export_corpus.py --full DIR      # full-size versions for the benchmarks (not committed)

Every architecture (tools/corpus_models.py) is exported with each exporter setting: torch's TorchScript
exporter with constant folding on and off, and the dynamo exporter (torch's default since 2.9), each at
its default opset. Weights are random but trained-looking (tools/corpus_weights.py). An export is
written only if onnxruntime reproduces torch on it, it runs at other batch/sequence sizes where an axis
is dynamic, and its outputs depend on the input (no near-constant model whose every rewrite "verifies").
A float16 model is judged against its float32 twin in torch (the same fp16 weights, widened). Where an
exporter cannot export a model (it raises, onnxruntime refuses its file, or the check does), no file is
written and the manifest's `not_exported` keeps the error.

torch, torchvision, transformers and ultralytics never enter the workbook's .venv: run with any Python,
this script makes .corpus-venv/ from tools/corpus-requirements.txt (once; again when that file changes)
and re-runs itself there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".corpus-venv"
REQUIREMENTS = ROOT / "tools" / "corpus-requirements.txt"
STAMP = VENV / ".requirements.sha256"
CORPUS = ROOT / "tests" / "corpus"
SEED = 0

#: exporter setting -> (exporter, torch.onnx.export keywords)
SETTINGS = {
    "ts-fold": ("torchscript", {"dynamo": False, "do_constant_folding": True}),
    "ts-nofold": ("torchscript", {"dynamo": False, "do_constant_folding": False}),
    "dynamo": ("dynamo", {"dynamo": True, "external_data": False}),
}
#: an output "depends on the input" when std(y(x1) - y(x2)) >= this share of std(y(x1))
MIN_SENSITIVITY = 0.05
#: onnxruntime must reproduce torch within atol·max(1, max|y|) (fp32 kernels differ in summation order)
EXPORT_ATOL = 1e-4
#: a float16 export is judged against its float32 twin in torch: within this (fp16's unit roundoff is 4.9e-4,
#: and a dozen layers of fp16 rounding add up; torch's own float16 run is measured beside it in the manifest)
EXPORT_ATOL_HALF = 1e-2


# --------------------------------------------------------------------------------------------------
# the exporters' environment
# --------------------------------------------------------------------------------------------------

def _requirements_hash() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()


def ensure_environment(argv: list[str]) -> None:
    """Unless running in .corpus-venv/ already: make or update it, then re-run this script inside it."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    python = VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {VENV.name}/ (torch and friends stay out of .venv/)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    if not STAMP.exists() or STAMP.read_text().strip() != _requirements_hash():
        print(f"installing {REQUIREMENTS.relative_to(ROOT)} into {VENV.name}/ (a few minutes, ~6 GB)", flush=True)
        start = time.perf_counter()
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)], check=True)
        STAMP.write_text(_requirements_hash() + "\n")
        print(f"installed in {time.perf_counter() - start:.0f} s", flush=True)
    os.execv(str(python), [str(python), str(Path(__file__).resolve()), *argv])


# --------------------------------------------------------------------------------------------------
# exporting one model
# --------------------------------------------------------------------------------------------------

def _dynamic_shapes(built, names: list[str]) -> tuple:
    """torch.export dynamic_shapes, one entry per positional input; a dim name shared by inputs is one Dim."""
    import torch

    dims: dict[str, object] = {}
    return tuple({ax: dims.setdefault(d, torch.export.Dim(d)) for ax, d in built.dynamic.get(name, {}).items()}
                 or None for name in names)


def export(built, setting: str, path: Path) -> dict:
    """torch.onnx.export `built` with one exporter setting; returns what was asked and what it said."""
    import torch

    _, options = SETTINGS[setting]
    inputs = built.make_inputs(SEED, **built.export_dims)
    names = list(inputs)
    kw = dict(options, input_names=names, output_names=built.output_names)
    if options["dynamo"]:
        if built.dynamic:
            kw["dynamic_shapes"] = _dynamic_shapes(built, names)
    elif built.dynamic:
        kw["dynamic_axes"] = built.dynamic
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        torch.onnx.export(built.module, tuple(inputs.values()), str(path), **kw)
    seconds = time.perf_counter() - start
    stripped = strip_stack_traces(path) if options["dynamo"] else 0
    said = sorted({f"{w.category.__name__}: {str(w.message).splitlines()[0][:200]}" for w in caught})
    shown = {k: v for k, v in kw.items() if k not in ("input_names", "output_names")}
    if "dynamic_shapes" in shown:
        shown["dynamic_shapes"] = {n: {a: d for a, d in built.dynamic.get(n, {}).items()} for n in names}
    out = {"export_seconds": round(seconds, 2), "torch_onnx_export": shown, "warnings": said}
    if stripped:
        out["postprocessed"] = (f"removed the node metadata {STACK_TRACE!r} from {stripped} nodes: it holds the "
                                "exporting machine's source paths and line numbers; graph and other metadata untouched")
    return out


#: dynamo's per-node Python stack trace: paths and line numbers of the machine that exported
STACK_TRACE = "pkg.torch.onnx.stack_trace"


def strip_stack_traces(path: Path) -> int:
    """Drop STACK_TRACE from every node, so the file depends on the model, not on where its source lived."""
    import onnx

    model = onnx.load(str(path))
    count = 0
    for node in model.graph.node:
        keep = [p for p in node.metadata_props if p.key != STACK_TRACE]
        if len(keep) != len(node.metadata_props):
            count += 1
            del node.metadata_props[:]
            node.metadata_props.extend(keep)
    onnx.save(model, str(path))
    return count


class Refused(Exception):
    """An export that must not enter the corpus (wrong, or its outputs ignore the input)."""


def _ort_run(sess, inputs: dict) -> list:
    feeds = {k: v.numpy() for k, v in inputs.items()}
    return sess.run(None, feeds)


def check(built, path: Path) -> dict:
    """The ONNX checker; onnxruntime (optimisations off) against torch, at the export and check sizes; sensitivity."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:  # the exporter wrote a model that is not valid ONNX
        raise Refused(f"the ONNX checker (full_check) rejects {path.name}: {str(exc).strip()}") from None
    try:
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime refuses the file the exporter wrote
        raise Refused(f"onnxruntime cannot load {path.name}: {str(exc).strip()}") from None
    result = {"outputs": {}, "checked_sizes": [built.export_dims, *built.check_dims]}
    worst = worst_torch = 0.0
    atol = EXPORT_ATOL if built.reference is None else EXPORT_ATOL_HALF
    for i, dims in enumerate(result["checked_sizes"]):
        a = built.make_inputs(1 + 2 * i, **dims)
        want = _torch_run(built.reference or built.module, a, wide=built.reference is not None)
        got = _ort_run(sess, a)
        if built.reference is not None:  # torch's own float16 run, against the same float32 one: for scale
            own = _torch_run(built.module, a, wide=False)
            worst_torch = max(worst_torch, *(_scaled(w, o) for w, o in zip(want, own)))
        for name, w, g in zip(built.output_names, want, got):
            if w.shape != g.shape:
                raise Refused(f"{path.name}: {name} has shape {g.shape} in onnxruntime, {w.shape} in torch at {dims}")
            err = _scaled(w, g)
            worst = max(worst, err)
            if not np.all(np.isfinite(g)) or err > atol:
                raise Refused(f"{path.name}: {name} differs from torch{' float32' if built.reference else ''} by "
                              f"{err:.2e} (scaled) at {dims}")
    y1 = _ort_run(sess, built.make_inputs(1, **built.export_dims))
    y2 = _ort_run(sess, built.make_inputs(2, **built.export_dims))
    for name, a, b in zip(built.output_names, y1, y2):
        if a.dtype == np.float16:  # statistics of half-precision outputs in float64 (no fp16 accumulation)
            a, b = a.astype(np.float64), b.astype(np.float64)
        std = float(np.std(a))
        sens = float(np.std(a - b)) / max(std, 1e-30)
        result["outputs"][name] = {"std": round(std, 4), "std_other_input": round(float(np.std(b)), 4),
                                   "sensitivity": round(sens, 4)}
        if std < 1e-4 or sens < MIN_SENSITIVITY:
            raise Refused(f"{path.name}: output {name} hardly depends on the input (std {std:.2e}, "
                          f"std of the difference between two inputs / std = {sens:.3f} < {MIN_SENSITIVITY})")
    result["max_scaled_error_vs_torch"] = float(f"{worst:.3g}")
    if built.reference is not None:
        result["judged_against"] = ("torch float32 twin (the float16 weights widened, float32 inputs); tolerance "
                                    f"{EXPORT_ATOL_HALF} scaled")
        result["torch_float16_scaled_error_vs_float32"] = float(f"{worst_torch:.3g}")
    return result


def _torch_run(module, inputs: dict, wide: bool) -> list:
    """The module's outputs as float numpy arrays (with `wide`, float inputs widened to float32 first)."""
    import torch

    args = [v.float() if wide and v.is_floating_point() else v for v in inputs.values()]
    with torch.no_grad():
        out = module(*args)
    return [t.float().numpy() if wide else t.numpy() for t in ((out,) if isinstance(out, torch.Tensor) else out)]


def _scaled(want, got) -> float:
    """max |want - got| / max(1, max |want|), computed in float64."""
    import numpy as np

    w, g = np.asarray(want, np.float64), np.asarray(got, np.float64)
    return float(np.max(np.abs(w - g))) / max(1.0, float(np.max(np.abs(w))))


# --------------------------------------------------------------------------------------------------
# the manifest
# --------------------------------------------------------------------------------------------------

def _value_info(vi) -> dict:
    import onnx

    t = vi.type.tensor_type
    dims = [d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else "?")
            for d in t.shape.dim]
    return {"name": vi.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name, "shape": dims}


def describe(path: Path) -> dict:
    """What is in one exported file: opsets, inputs/outputs with symbolic dims, node and op counts, sha256."""
    import onnx

    data = path.read_bytes()
    model = onnx.load_model_from_string(data)
    g = model.graph
    inits = {i.name for i in g.initializer}
    ops = Counter((f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type) for n in g.node)
    return {
        "file": path.name, "size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
        "ir_version": model.ir_version, "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "opset": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        "inputs": [_value_info(v) for v in g.input if v.name not in inits],
        "outputs": [_value_info(v) for v in g.output],
        "nodes": len(g.node), "initializers": len(g.initializer), "functions": len(model.functions),
        "op_histogram": dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
    }


def environment() -> dict:
    """Versions of everything that shaped the exports."""
    from importlib.metadata import version

    pkgs = ("torch", "torchvision", "transformers", "ultralytics", "onnxscript", "onnx", "onnx-ir", "onnxruntime",
            "numpy")
    return {"python": sys.version.split()[0], **{p: version(p) for p in pkgs}}


def _library_version(library: str) -> str:
    from importlib.metadata import version

    return version(library)


def export_architecture(name: str, out: Path, full: bool) -> list[dict]:
    """Build one architecture once and export it with every setting; returns its manifest entries."""
    import torch

    from corpus_models import ARCHITECTURES, BUILDERS

    torch.manual_seed(SEED)
    built = BUILDERS[name](full, SEED)
    arch, library = ARCHITECTURES[name]
    entries, failures = [], []
    for setting, (exporter, _) in SETTINGS.items():
        path = out / f"{name}.{setting}.onnx"
        print(f"  {path.name} ...", end=" ", flush=True)
        try:
            how = export(built, setting, path)
        except Exception as exc:  # the exporter cannot export this model: recorded, not written
            failures.append(_failure(name, arch, exporter, setting, "torch.onnx.export raised",
                                     f"{type(exc).__name__}: {exc}", path))
            continue
        try:
            checked = check(built, path)
        except Refused as exc:
            failures.append(_failure(name, arch, exporter, setting, "export check refused it", str(exc), path))
            continue
        entry = {**describe(path), "architecture": arch, "model": name, "library": library,
                 "library_version": _library_version(library), "exporter": exporter, "setting": setting,
                 "constant_folding": SETTINGS[setting][1].get("do_constant_folding") if exporter == "torchscript"
                 else "onnxscript optimizer (torch.onnx.export optimize=True, the default)",
                 "opset_source": "the exporter's default (opset_version not given)", "seed": SEED,
                 "config": built.config, "dynamic_axes": built.dynamic, **how, "check": checked,
                 "weights": built.weights}
        entries.append(entry)
        print(f"{entry['nodes']} nodes, {entry['size_bytes'] / 1e6:.2f} MB, {how['export_seconds']} s", flush=True)
    return entries, failures


def _failure(name: str, arch: str, exporter: str, setting: str, stage: str, message: str, path: Path) -> dict:
    """A model this exporter setting cannot export: the file is removed, the reason goes into the manifest."""
    path.unlink(missing_ok=True)
    lines = [ln.strip() for ln in message.replace(str(path), path.name).splitlines() if ln.strip()]
    error = (lines[0] if lines else "(no message)")[:400]
    print(f"NOT EXPORTED ({stage}): {error}", flush=True)
    return {"file": path.name, "model": name, "architecture": arch, "exporter": exporter, "setting": setting,
            "stage": stage, "error": error}


def write_manifest(out: Path, entries: list[dict], failures: list[dict], full: bool) -> Path:
    """manifest.json: the environment, one entry per file (sorted by file name), then the exports that failed."""
    from corpus_weights import METHOD

    path = out / "manifest.json"
    before = json.loads(path.read_text()) if path.exists() else {}
    tried = {e["file"] for e in entries} | {f["file"] for f in failures}
    models = sorted([e for e in before.get("models", []) if e["file"] not in tried] + entries, key=lambda e: e["file"])
    failed = sorted([f for f in before.get("not_exported", []) if f["file"] not in tried] + failures,
                    key=lambda f: f["file"])
    doc = {"generated_by": "tools/export_corpus.py" + (" --full" if full else ""),
           "environment": environment(), "settings": {k: v[1] for k, v in SETTINGS.items()},
           "weights_method": METHOD,
           "checks": {"min_sensitivity": MIN_SENSITIVITY, "export_atol_scaled": EXPORT_ATOL,
                      "export_atol_scaled_float16_vs_float32": EXPORT_ATOL_HALF},
           "total_bytes": sum(e["size_bytes"] for e in models), "models": models,
           "not_exported": failed}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def main(argv: list[str]) -> int:
    from corpus_models import BUILDERS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=CORPUS, help="where the small corpus goes (default tests/corpus)")
    ap.add_argument("--full", type=Path, metavar="DIR", help="export full-size models into DIR instead")
    ap.add_argument("--only", nargs="+", choices=sorted(BUILDERS), help="these architectures only")
    args = ap.parse_args(argv)
    out = args.full or args.out
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("YOLO_CONFIG_DIR", str(ROOT / ".cache" / "ultralytics"))
    import torch

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    start = time.perf_counter()
    entries, failures = [], []
    for name in args.only or BUILDERS:
        print(f"{name}{' (full size)' if args.full else ''}", flush=True)
        made, failed = export_architecture(name, out, bool(args.full))
        entries += made
        failures += failed
    path = write_manifest(out, entries, failures, bool(args.full))
    total = sum(e["size_bytes"] for e in json.loads(path.read_text())["models"])
    print(f"{len(entries)} files in {time.perf_counter() - start:.0f} s; {path} lists {total / 1e6:.1f} MB")
    for f in failures:
        print(f"not exported: {f['file']} ({f['stage']}): {f['error']}")
    return 0


if __name__ == "__main__":
    ensure_environment(sys.argv[1:])
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main(sys.argv[1:]))
