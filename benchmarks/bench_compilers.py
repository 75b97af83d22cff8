#!/usr/bin/env python3
"""IREE beside fusionlab and onnxruntime: dispatch counts, and fusion measured (IREE fused vs per-op).

1. Issue 13's check: LayerNormalization + erf-GELU on 2048 x 768 fp32. IREE's dispatches, its
   outputs against onnxruntime, and its time against onnxruntime unfused (optimisations off, 6
   kernels) and at level ALL (LayerNormalization + Gelu), and against IREE per-op: every ONNX node
   compiled as its own module (`fusionlab.compilers.iree.PerOp`), run in sequence on the same inputs.
2. Kernels per run for the zoo models of `fusionlab.compilers.MODELS`: ONNX compute nodes,
   fusionlab's plan (vertical + horizontal + mixed), onnxruntime's optimised graph (EXTENDED, ALL),
   IREE's dispatches, and, for the small models, IREE's dispatches summed over one-node modules.
3. IREE fused vs per-op on resnet_small.
All timings one thread (onnxruntime intra-op 1; IREE local-sync driver), interleaved.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from common import machine_line, markdown_table, parser, write_result

from fusionlab import timing, zoo
from fusionlab.compilers import MODELS, iree, ort
from fusionlab.graph import load
from fusionlab.lessons import reductions as R
from fusionlab.passes import plan
from fusionlab.verification import runtime


def fusionlab_kernels(graph) -> int:
    fplan = plan(graph, passes=("vertical", "horizontal", "mixed"))
    return len([n for n in graph if n.op_type != "Constant"]) - sum(g.size - 1 for g in fplan)


def layernorm_gelu(min_time: float) -> tuple[list, list]:
    model = R.layernorm_gelu_model(2048, 768)
    x = np.random.default_rng(0).standard_normal((2048, 768)).astype(np.float32)
    names = iree.dispatch_names(model)
    fused = iree.Module(iree.compile_model(model))
    per_op = iree.PerOp(model)
    s_off, s_all = runtime.session(model, "disable", 1), runtime.session(model, "all", 1)
    ref = s_off.run(["y"], {"x": x})[0]
    err = float(np.abs(fused.run(x)[0] - ref).max())
    err_per = float(np.abs(per_op.run(x)[0] - ref).max())
    rows = []
    for label, fn in (("onnxruntime, optimisations off (6 kernels)", lambda: s_off.run(["y"], {"x": x})),
                      ("onnxruntime ALL (LayerNormalization + Gelu)", lambda: s_all.run(["y"], {"x": x})),
                      (f"IREE per-op ({len(per_op)} modules)", lambda: per_op(x))):
        c = timing.compare(fn, lambda: fused(x), label_a=label, label_b="IREE fused", min_time=min_time)
        rows.append([label, timing.format_seconds(c.a.median), timing.format_seconds(c.b.median),
                     f"{c.speedup:.2f}x ({c.ci_low:.2f}-{c.ci_high:.2f})", c.verdict()])
    notes = [f"IREE {iree.version()}: {len(names)} dispatches ({', '.join(n.split('_', 2)[-1] for n in names)}); "
             f"max |IREE - onnxruntime| = {err:.1e} fused, {err_per:.1e} per-op"]
    return rows, notes


def zoo_counts(models: dict, per_node: set[str]) -> list:
    rows = []
    for name, params in models.items():
        model = zoo.get(name, **params)
        graph = load(model)
        t0 = time.perf_counter()
        dispatches = iree.count_dispatches(model)
        seconds = time.perf_counter() - t0
        unfused = "-"
        if name in per_node:
            try:
                unfused = str(sum(n for *_, n in iree.dispatches_per_node(model)))
            except Exception as exc:  # a one-node module IREE cannot compile: say so
                unfused = f"n/a ({type(exc).__name__})"
        rows.append([name, str(len([n for n in graph if n.op_type != "Constant"])), str(fusionlab_kernels(graph)),
                     str(ort.kernel_count(model, "extended")), str(ort.kernel_count(model, "all")), str(dispatches),
                     unfused, f"{seconds:.0f} s"])
    return rows


def per_op_model(name: str, min_time: float) -> list:
    params = MODELS[name]
    model = zoo.get(name, **params)
    feeds = runtime.make_feeds(model)
    inputs = [feeds[i.name] for i in model.graph.input if i.name in feeds]
    fused = iree.Module(iree.compile_model(model))
    per_op = iree.PerOp(model)
    ref = runtime.run(model, feeds)
    out_f, out_p = fused.run(*inputs), per_op.run(*inputs)
    ok = all(np.allclose(a, b, rtol=1e-4, atol=1e-4) for a, b in zip(out_f, ref.values())) and \
        all(np.allclose(a, b, rtol=1e-4, atol=1e-4) for a, b in zip(out_p, ref.values()))
    c = timing.compare(lambda: per_op(*inputs), lambda: fused(*inputs), label_a="per-op", label_b="fused", min_time=min_time)
    return [name, str(iree.count_dispatches(model)), str(len(per_op)), timing.format_seconds(c.a.median),
            timing.format_seconds(c.b.median), f"{c.speedup:.2f}x ({c.ci_low:.2f}-{c.ci_high:.2f})",
            "yes" if ok else "NO"]


def main() -> int:
    args = parser(__doc__.splitlines()[0]).parse_args()
    min_time = args.min_time or (0.3 if args.quick else 3.0)
    ln_rows, notes = layernorm_gelu(min_time)
    models = dict(list(MODELS.items())[:2]) if args.quick else MODELS
    counts = zoo_counts(models, per_node={"resnet_small", "bert_tiny"})
    per_op = [per_op_model("resnet_small", min_time)]
    text = "\n\n".join([
        "# IREE: real fusion beside fusionlab's plan",
        f"{machine_line()}; IREE {iree.version()} (llvm-cpu, target-cpu=host, local-sync driver = one thread). "
        "Interleaved runs, medians, speedup = median of paired ratios (95% CI); the machine is shared.",
        "**LayerNormalization + erf-GELU, 2048 x 768 fp32** (IREE fused, against):",
        markdown_table(["against", "its time", "IREE fused", "IREE fused speedup", "verdict"], ln_rows),
        "\n".join(f"- {n}" for n in notes),
        "**Kernels per run** (batch 1): fusionlab = compute nodes minus nodes merged by vertical + horizontal + mixed "
        "(the mixed groups run as ONNX functions that onnxruntime inlines, so this is fusionlab's *plan*); onnxruntime = "
        "nodes of its optimised graph; IREE = `flow.dispatch` ops of the compiled program; IREE per node = dispatches "
        "of every node compiled alone, summed (IREE's count with no cross-node fusion).",
        markdown_table(["model", "ONNX compute nodes", "fusionlab plan", "onnxruntime EXTENDED", "onnxruntime ALL",
                        "IREE dispatches", "IREE per node", "IREE flow compile"], counts),
        "**IREE fused against IREE per-op** (each ONNX node its own module, results passed on the device):",
        markdown_table(["model", "dispatches fused", "modules per-op", "per-op", "fused", "fused speedup",
                        "both match onnxruntime"], per_op),
    ])
    write_result("compilers.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
