#!/usr/bin/env python3
"""TVM Relax FuseOps as the oracle for fusionlab's mixed pass: groups, and agreement as a number.

For each model of `fusionlab.compilers.MODELS` this runs TVM's own pipeline (DecomposeOpsForInference,
CanonicalizeBindings, LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR; see
`fusionlab.compilers.tvm`), traces every fused function back to ONNX node names, and writes them to
`data/tvm_groups.json` (committed: notebook 15 reads it, so the default environment needs no TVM).
It then compares them with fusionlab's mixed pass (`plan(model, passes=("mixed",))`): edge
agreement and pair Jaccard (`fusionlab.compilers.grouping`), and every disagreeing edge by pattern,
into `benchmarks/results/tvm_agreement.md`. Needs the oracle extra: pip install -e '.[oracle]'.
"""

from __future__ import annotations

import json
import sys
import time

from common import ROOT, markdown_table, parser, write_result

from fusionlab import zoo
from fusionlab.compilers import MODELS, grouping
from fusionlab.compilers import tvm as tvm_groups
from fusionlab.graph import load
from fusionlab.passes import plan

DATA = ROOT / "data" / "tvm_groups.json"


def main() -> int:
    args = parser(__doc__.splitlines()[0]).parse_args()
    if not tvm_groups.available():
        print("apache-tvm is not installed: pip install -e '.[oracle]'", file=sys.stderr)
        return 1
    models = dict(list(MODELS.items())[:2]) if args.quick else MODELS
    data = {"about": "TVM Relax FuseOps groups of fusionlab's zoo models, as ONNX node names; written by "
                     "benchmarks/bench_tvm_agreement.py (fusionlab.compilers.tvm)",
            "pipeline": list(tvm_groups.PIPELINE), "models": {}}
    rows, sections = [], []
    for name, params in models.items():
        graph = load(zoo.get(name, **params))
        t0 = time.perf_counter()
        result = tvm_groups.relax_groups(graph)
        seconds = time.perf_counter() - t0
        data["tvm_version"] = result.tvm_version
        data["models"][name] = {"params": params, "nodes": len(graph), **result.to_dict()}
        covered = [n for g in result.groups for n in g]
        compute = len([n for n in graph if n.op_type != "Constant"])
        for label, opts in (("default (max 5 ops)", {}), ("unlimited, as TVM (max_depth 256)", {"max_group_ops": None})):
            fplan = plan(graph, passes=("mixed",), **opts)
            agree = grouping.compare_groupings(graph, result.groups, grouping.plan_groups(fplan), name_a="TVM",
                                               name_b="fusionlab", covered_a=covered)
            fl_kernels = compute - sum(g.size - 1 for g in fplan)
            rows.append([name, label, str(len(graph)), f"{result.functions_before} → {result.functions_after}",
                         str(len(result.groups)), str(fl_kernels), f"{agree.edge_agreement:.1%}",
                         f"{agree.pair_jaccard:.2f}", str(len(agree.disagreements)), f"{seconds:.0f} s"])
            detail = [[f"only {who}", pattern, str(n)] for who, pattern, n in agree.by_pattern()]
            if detail:
                sections.append(f"**{name}**, fusionlab {label}: disagreeing edges\n\n"
                                + markdown_table(["fused by", "edge", "edges"], detail))
    DATA.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    header = ["model", "fusionlab threshold", "ONNX nodes", "TVM functions before → after FuseTIR", "TVM kernels", "fusionlab mixed kernels",
              "edge agreement", "pair Jaccard", "disagreeing edges", "TVM time"]
    text = "\n\n".join([
        "# TVM Relax FuseOps against fusionlab's mixed pass",
        f"apache-tvm {data.get('tvm_version', '?')}; pipeline {' → '.join(tvm_groups.PIPELINE)}. Edge agreement: the share "
        "of producer→consumer edges between compute nodes that both fuse or both leave unfused; pair Jaccard: node "
        "pairs grouped together by both / by either. TVM kernels = its fused functions plus unfused calls; fusionlab "
        "kernels = compute nodes minus nodes merged. Notebook 15 explains every disagreement pattern.",
        markdown_table(header, rows), *sections])
    write_result("tvm_agreement.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
