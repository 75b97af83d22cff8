#!/usr/bin/env python3
"""Vertical fusion against onnxruntime's own fusions, on ResNet-50, YOLOv5s-style and BERT-style models.

For each model, one intra-op thread, interleaved runs, median of paired ratios with a 95% CI:
1. ours vs theirs: our fused model under ORT_DISABLE_ALL vs the original under ORT_ENABLE_EXTENDED
   (ratio > 1: our fusions alone are faster than onnxruntime's; target >= 1.0);
2. never slower: fused vs original, both under ORT_ENABLE_ALL (target >= 1.0).
Then the time to fuse ResNet-50: our pass time in-process, and whole-process times of
`fusionlab fuse`, onnxoptimizer's fuse passes and onnxsim on the same file.
Every fused model is verified against its original before it is timed.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import machine_line, markdown_table, parser, write_result

from fusionlab import zoo
from fusionlab.graph import load
from fusionlab.passes import fuse
from fusionlab.timing import _median, compare_models
from fusionlab.verification.runtime import verify

PY = sys.executable


def models(quick: bool):
    if quick:
        return [
            ("ResNet-50 (width 16, 96 px)", zoo.resnet50(image_size=96, width=16), {}),
            ("YOLOv5s-style (160 px)", zoo.yolov5s(image_size=160), {}),
            ("BERT-style (2 layers, 128 hidden, seq 32)", zoo.bert(layers=2, hidden=128, heads=2, intermediate=512), {"sequence": 32}),
        ]
    return [
        ("ResNet-50 (224 px)", zoo.resnet50(), {}),
        ("YOLOv5s-style (640 px)", zoo.yolov5s(), {}),
        ("BERT-base-style (12 layers, seq 128)", zoo.bert(), {"sequence": 128}),
    ]


def fmt(c) -> str:
    return f"{c.speedup:.3f} ({c.ci_low:.3f}–{c.ci_high:.3f})"


def timed_process(cmd: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return _median(times)


def fuse_times(repeats: int, quick: bool) -> list[list[str]]:
    model = zoo.resnet50(image_size=96, width=16) if quick else zoo.resnet50()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "resnet50.onnx"
        src.write_bytes(model.SerializeToString())
        graph = load(src)
        pass_times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fuse(graph, passes=("vertical",))
            pass_times.append(time.perf_counter() - t0)
        rows.append(["fusionlab vertical passes (in-process, model already loaded)", f"{_median(pass_times):.3f}"])
        fuse_cmd = [PY, '-m', 'fusionlab', 'fuse', str(src), '-o', str(Path(tmp) / 'out.onnx')]
        rows.append(["`fusionlab fuse --no-verify` whole process (start-up, load + checks, fuse, save)",
                     f"{timed_process(fuse_cmd + ['--no-verify'], repeats):.3f}"])
        rows.append(["`fusionlab fuse` whole process, default (also verifies: runs both models once)",
                     f"{timed_process(fuse_cmd, repeats):.3f}"])
        try:
            import onnxoptimizer  # noqa: F401

            code = ("import onnx, onnxoptimizer, sys; m = onnx.load(sys.argv[1]); "
                    "m = onnxoptimizer.optimize(m, ['fuse_bn_into_conv', 'eliminate_identity', 'fuse_add_bias_into_conv',"
                    " 'fuse_matmul_add_bias_into_gemm', 'fuse_pad_into_conv']); onnx.save(m, sys.argv[2])")
            rows.append(["onnxoptimizer 0.4.2 fuse passes, whole process",
                         f"{timed_process([PY, '-c', code, str(src), str(Path(tmp) / 'o1.onnx')], repeats):.3f}"])
        except ImportError:
            rows.append(["onnxoptimizer", "not installed (`make bench` installs it)"])
        try:
            import onnxsim  # noqa: F401

            code = ("import onnx, onnxsim, sys; m = onnx.load(sys.argv[1]); "
                    "m, ok = onnxsim.simplify(m); onnx.save(m, sys.argv[2])")
            rows.append(["onnxsim 0.8.1 simplify, whole process",
                         f"{timed_process([PY, '-c', code, str(src), str(Path(tmp) / 'o2.onnx')], repeats):.3f}"])
        except ImportError:
            rows.append(["onnxsim", "not installed (`make bench` installs it)"])
    return rows


def main() -> int:
    args = parser(__doc__.splitlines()[0]).parse_args()
    min_time = args.min_time or (0.5 if args.quick else 6.0)
    rows = []
    for name, model, dims in models(args.quick):
        res = fuse(model, passes=("vertical",))
        report = verify(model, res.graph, dims=dims)
        if not report.ok:
            print(report.table())
            raise SystemExit(f"{name}: fused model does not verify; not timing it")
        before, after = sum(res.before.values()), sum(res.after.values())
        ours = compare_models(model, res.graph, level_a="extended", level_b="disable", dims=dims, min_time=min_time)
        both_all = compare_models(model, res.graph, level_a="all", level_b="all", dims=dims, min_time=min_time)
        rows.append([name, f"{before} → {after}", f"{report.max_abs:.1e}", fmt(ours), fmt(both_all), str(ours.rounds),
                     str(both_all.rounds)])
        print(name, "done", flush=True)
    table = markdown_table(
        ["model", "nodes before → after", "max abs err", "ours (DISABLE_ALL) vs ORT EXTENDED: speedup (95% CI)",
         "fused vs original, both ENABLE_ALL: speedup (95% CI)", "rounds 1", "rounds 2"], rows)
    times = markdown_table(["fusing ResNet-50", "median seconds"], fuse_times(3 if args.quick else 5, args.quick))
    text = (f"# Vertical fusion benchmark{' (quick smoke run: not a result)' if args.quick else ''}\n\n"
            f"{machine_line()}; 1 intra-op thread; speedup = time(original) / time(fused), median of paired "
            f"interleaved ratios, >1 means the fused model is faster.\n\n{table}\n\n{times}\n")
    write_result("vertical_quick.md" if args.quick else "vertical.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
