"""`fusionlab verify A.onnx B.onnx`: exit 0 when equivalent, 1 when not."""

from __future__ import annotations

import sys

from ..verification.runtime import verify
from . import add_dim_option, load_input, parse_dims


def register(sub) -> None:
    p = sub.add_parser("verify", help="check that two models compute the same outputs",
                       description="Run both models on the same random inputs (several draws) and compare every "
                                   "output; float16 outputs are also compared with a float32 run of A.")
    p.add_argument("a", help="reference model (run with onnxruntime optimisations off)")
    p.add_argument("b", help="model to check (e.g. the fused one)")
    p.add_argument("--rtol", type=float, default=None, help="relative tolerance (default per dtype; fp32 1e-4)")
    p.add_argument("--atol", type=float, default=None, help="absolute tolerance (default per dtype; fp32 1e-5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first input draw (default 0)")
    p.add_argument("--draws", type=int, default=3, help="how many input draws to compare on (default 3)")
    p.add_argument("--reference", choices=("auto", "always", "never"), default="auto",
                   help="also judge outputs against a float32 run of A: auto = float16 outputs only")
    add_dim_option(p)
    p.set_defaults(func=run)


def run(args) -> int:
    a, b = load_input(args.a), load_input(args.b)
    if args.draws < 1:
        print("fusionlab verify: --draws must be at least 1", file=sys.stderr)
        return 2
    report = verify(a, b, rtol=args.rtol, atol=args.atol, seed=args.seed, draws=args.draws,
                    dims=parse_dims(args.dim), reference=args.reference)
    print(report.table())
    return 0 if report.ok else 1
