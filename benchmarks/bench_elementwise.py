#!/usr/bin/env python3
"""Elementwise fusion: one generated numba loop against the unfused numpy chain and onnxruntime.

Two chains of 6 ops on 16M-element fp32 tensors (one thread everywhere):
- "cheap": Mul, Add(b), Relu, Sub, Mul(b), Clip: memory-bound, the case fusion is for;
- "gelu-ish": Mul, Erf, Add, Mul(x), Mul, Tanh: transcendentals, closer to compute-bound.

Each pair is timed interleaved (`fusionlab.timing.compare`). Reported: medians, speedups with 95% CIs,
bytes moved before/after fusion, and the fused kernel's GB/s against this machine's calibrated
streaming bandwidth. Targets: fused >= 70% of streaming bandwidth (memory-bound chain), and speedup
over numpy >= 0.75 x the ratio of bytes moved.
"""

from __future__ import annotations

import numpy as np

from common import machine_line, markdown_table, parser, write_result

from fusionlab import timing
from fusionlab.cost import calibrate
from fusionlab.lessons import codegen as elementwise
from fusionlab.verification import runtime

CHAINS = {
    "cheap": [("Mul", 0.5), ("Add", "b"), ("Relu",), ("Sub", 0.1), ("Mul", "b"), ("Clip", -1.0, 1.0)],
    "gelu-ish": [("Mul", 0.7071), ("Erf",), ("Add", 1.0), ("Mul", "x"), ("Mul", 0.5), ("Tanh",)],
}


def main() -> int:
    args = parser(__doc__.splitlines()[0]).parse_args()
    n = 2**20 if args.quick else 16 * 2**20
    min_time = args.min_time or (0.3 if args.quick else 3.0)
    cal = calibrate.calibrate(quick=args.quick)
    bw = cal.stream_gbs
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n, dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    rows, notes = [], []
    for name, spec in CHAINS.items():
        kernel = elementwise.fuse_elementwise(spec, shape=(n,), name=name.replace("-", "_"))
        feeds = {"x": x, "b": b} if "b" in kernel.inputs else {"x": x}
        out = np.empty(n, dtype=np.float32)
        fused = lambda: kernel(**feeds, out=out)
        fused()  # compile
        numpy_chain = lambda: kernel.unfused(**feeds)
        sess = runtime.session(elementwise.chain_model(spec, (n,)), "disable", 1)
        ort_run = lambda: sess.run(["y"], feeds)
        ref = ort_run()[0]
        err = float(np.max(np.abs(kernel(**feeds) - ref)))
        moved = kernel.bytes_moved({k: v.shape for k, v in feeds.items()})
        c_np = timing.compare(numpy_chain, fused, label_a="numpy unfused", label_b="fused", min_time=min_time)
        c_ort = timing.compare(ort_run, fused, label_a="onnxruntime", label_b="fused", min_time=min_time)
        t_f = c_np.b.median
        gbs = moved.after / t_f / 1e9
        for label, c in (("numpy unfused", c_np), ("onnxruntime (opt off)", c_ort)):
            eff = moved.before / c.a.median / 1e9
            rows.append([name, label, f"{c.a.median * 1e3:.1f} ms", f"{eff:.1f}",
                         f"{c.b.median * 1e3:.1f} ms", f"{moved.after / c.b.median / 1e9:.1f}",
                         f"{c.speedup:.2f}x ({c.ci_low:.2f}-{c.ci_high:.2f})"])
        target_bw = gbs >= 0.7 * bw
        target_speed = c_np.speedup >= 0.75 * moved.ratio
        notes.append(
            f"- **{name}**: {moved}; fused kernel {gbs:.1f} GB/s = {gbs / bw:.0%} of streaming bandwidth "
            f"({'meets' if target_bw else 'misses'} the 70% target); speedup over numpy {c_np.speedup:.2f}x vs "
            f"bytes ratio {moved.ratio:.2f}x -> {c_np.speedup / moved.ratio:.2f} of the ratio "
            f"({'meets' if target_speed else 'misses'} the 0.75 target); max |fused - onnxruntime| = {err:.1e}")
    header = ["chain", "baseline", "baseline median", "baseline GB/s (unfused bytes)", "fused median",
              "fused GB/s", "speedup baseline/fused (95% CI)"]
    text = "\n".join([
        "# Elementwise fusion: generated numba loop vs unfused chains",
        "",
        machine_line(),
        f"Tensors: {n} fp32 elements ({n * 4 / 2**20:.0f} MiB each); one thread everywhere; interleaved runs "
        f"({'quick smoke run, not a result' if args.quick else f'>= {min_time:g} s per comparison'}).",
        f"Calibrated streaming bandwidth (one thread): copy {cal.copy_gbs:.1f} GB/s, add {cal.add_gbs:.1f} GB/s; "
        f"the target uses the better, {bw:.1f} GB/s.",
        "",
        markdown_table(header, rows),
        "",
        "GB/s columns count the ideal bytes of each variant (unfused: every op reads its inputs and writes "
        "its output; fused: inputs once, output once) divided by its median time.",
        "",
        *notes,
    ])
    write_result("elementwise.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
