"""`python -m fusionlab.fuzz --n N --seed S --out DIR`: run (or continue) a fuzzing campaign."""

from __future__ import annotations

import argparse
import sys

from .campaign import run_campaign
from .oracle import Kind


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run the campaign, print where the summary is; exit 1 if anything failed."""
    ap = argparse.ArgumentParser(prog="python -m fusionlab.fuzz", description=__doc__)
    ap.add_argument("--n", type=int, default=1000, help="number of generated graphs (ids SEED-0 .. SEED-(N-1))")
    ap.add_argument("--seed", type=int, default=0, help="campaign seed")
    ap.add_argument("--out", default="fuzz-out", help="output folder (results.jsonl makes it resumable)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (at most 2)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per graph before it counts as a timeout")
    ap.add_argument("--draws", type=int, default=3, help="input draws per graph")
    ap.add_argument("--no-shrink", action="store_true", help="do not shrink one example per failure class")
    ap.add_argument("--shrink-budget", type=float, default=90.0, help="seconds to shrink each class's example")
    args = ap.parse_args(argv)
    s = run_campaign(args.n, args.seed, args.out, workers=args.workers, timeout=args.timeout, n_draws=args.draws,
                     shrink=not args.no_shrink, shrink_budget=args.shrink_budget)
    o = s["outcomes"]
    for name in ("vertical", "all", "other"):
        counts = o.get(name, {})
        print(f"{name:9s} " + "  ".join(f"{k} {counts.get(k, 0)}" for k in Kind if k != Kind.ERROR))
    print(f"{len(s['classes'])} failure classes; summary: {args.out}/summary.md")
    return 1 if s["graphs_failing"] else 0


if __name__ == "__main__":
    sys.exit(main())
