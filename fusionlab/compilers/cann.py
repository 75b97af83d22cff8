"""fusionlab's plan in CANN ATC's own files: ``fusion_result.json`` and a ``--fusion_switch_file``.

ATC decides fusion in two stages (cann_facts.md section 6): **graph fusion** passes rewrite the graph
(fold BatchNorm into a Conv's weights, MatMul + BiasAdd into one op...), then **UB fusion** passes merge
ops whose intermediate would otherwise travel Unified Buffer → global memory → Unified Buffer into one
kernel (typically a Conv or MatMul with its elementwise epilogue). Every built-in pass is on by
default; a ``--fusion_switch_file`` can only turn passes off. After a conversion ATC writes
``fusion_result.json``, which counts, per pass, how often its pattern matched and how often it took
effect::

    {"graph_fusion": {"ConvBatchnormFusionPass": {"effect_times": "2", "match_times": "2"}},
     "session_and_graph_id": "0_0",
     "ub_fusion": {"TbeCommonRules0FusionPass": {"effect_times": "2", "match_times": "2"}}}

`fusion_result` writes a FusionPlan in exactly that format. Each fusionlab rule is filed under the
real ATC pass that does the same fusion where one is documented (`ATC_PASSES`); rules with no
documented ATC counterpart are filed under a name that starts with ``Fusionlab`` so nobody mistakes
them for ATC passes. Counts are strings, as ATC writes them. A plan holds only the groups that were
formed, so ``match_times`` equals ``effect_times``: fusionlab does not record the candidates its
legality checks refused in a form that maps onto ATC's patterns.
"""

from __future__ import annotations

import json
import re
from typing import Iterable

__all__ = ["ATC_PASSES", "fusion_result", "fusion_result_json", "read_fusion_result", "fusion_switch", "pass_for"]

GRAPH, UB = "graph_fusion", "ub_fusion"

#: fusionlab rule -> [(stage, ATC pass)]; pass names are the registered ones listed in cann_facts.md s6
#: (ConvBatchnormFusionPass, ConvScaleFusionPass and MatMulBiasAddFusionPass are graph fusion passes;
#: TbeCommonRules0FusionPass is the UB fusion pass that merges a Conv with its elementwise consumers).
ATC_PASSES: dict[str, list[tuple[str, str]]] = {
    "conv_bn": [(GRAPH, "ConvBatchnormFusionPass")],
    "convtranspose_bn": [(GRAPH, "ConvBatchnormFusionPass")],
    "conv_scale_bias": [(GRAPH, "ConvScaleFusionPass")],
    "conv_act": [(UB, "TbeCommonRules0FusionPass")],
    "conv_bn_act": [(GRAPH, "ConvBatchnormFusionPass"), (UB, "TbeCommonRules0FusionPass")],
    "conv_add_act": [(UB, "TbeCommonRules0FusionPass")],
    "matmul_add_gemm": [(GRAPH, "MatMulBiasAddFusionPass")],
}


def _camel(rule: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^0-9a-zA-Z]+", rule) if part)


def pass_for(group) -> list[tuple[str, str]]:
    """[(stage, pass name)] a group is counted under: the ATC pass for its rule, or a Fusionlab<Rule> pass."""
    if group.rule in ATC_PASSES:
        passes = list(ATC_PASSES[group.rule])
        folds_bn = "BatchNormalization" in group.op_types and group.rule.startswith("conv")
        if folds_bn and (GRAPH, "ConvBatchnormFusionPass") not in passes:  # e.g. conv_add_act over Conv+BN+Add+Relu
            passes.insert(0, (GRAPH, "ConvBatchnormFusionPass"))
        return passes
    # graph-level rewrites (folds, horizontal concatenation, op substitution) vs kernel-level merging
    stage = UB if group.kind == "mixed" or group.rule.endswith("_act") else GRAPH
    return [(stage, f"Fusionlab{_camel(group.rule)}FusionPass")]


def fusion_result(plan, session_and_graph_id: str = "0_0") -> dict:
    """A FusionPlan as ATC's fusion_result.json (a dict; `fusion_result_json` gives the text)."""
    counts: dict[tuple[str, str], int] = {}
    for group in plan:
        for stage, name in pass_for(group):
            counts[(stage, name)] = counts.get((stage, name), 0) + 1
    result: dict = {GRAPH: {}, "session_and_graph_id": session_and_graph_id, UB: {}}
    for (stage, name), n in sorted(counts.items()):
        result[stage][name] = {"effect_times": str(n), "match_times": str(n)}
    return result


def fusion_result_json(plan, session_and_graph_id: str = "0_0") -> str:
    """The text of fusion_result.json for a plan (keys sorted, as in ATC's output)."""
    return json.dumps(fusion_result(plan, session_and_graph_id), indent=4, sort_keys=True)


def read_fusion_result(text: str) -> dict[str, dict[str, tuple[int, int]]]:
    """Parse a fusion_result.json (ATC's or ours): {stage: {pass: (match_times, effect_times)}}."""
    data = json.loads(text)
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for stage in (GRAPH, UB):
        out[stage] = {name: (int(v["match_times"]), int(v["effect_times"])) for name, v in data.get(stage, {}).items()}
    return out


def fusion_switch(off: Iterable[str] = (), *, all_off: bool = False) -> str:
    """A ``--fusion_switch_file`` (JSON form) turning the named passes off; all_off=True: every switchable one."""
    graph: dict[str, str] = {}
    ub: dict[str, str] = {}
    if all_off:
        graph["ALL"] = ub["ALL"] = "off"
    for name in off:
        stages = {stage for passes in ATC_PASSES.values() for stage, n in passes if n == name}
        for stage in stages or {GRAPH}:
            (graph if stage == GRAPH else ub)[name] = "off"
    return json.dumps({"Switch": {"GraphFusion": graph, "UBFusion": ub}}, indent=4)
