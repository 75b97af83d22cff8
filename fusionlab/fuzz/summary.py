"""The campaign summary: graphs, fire rate per rule, outcomes per pass set, failure classes with examples.

`summarize(results, shrunk)` computes it from the result records; `write` stores it as summary.json and
summary.md (the Markdown is what docs/fuzz.md quotes).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from ..passes.vertical import RULE_NAMES
from .oracle import Kind, REPLAYABLE, class_key

__all__ = ["summarize", "write", "markdown"]

#: the rows of the outcome table: every kind, with the ill-conditioned oks apart
_KINDS = (Kind.OK, "ok (ill-conditioned)", *(k for k in Kind if k != Kind.OK))
#: the kinds whose records form failure classes (an oracle error too: it is a bug of the judge)
_CLASSED = (*REPLAYABLE, Kind.ERROR)


def _fire_rates(records: list[dict], names: list[str]) -> dict:
    out: dict = {}
    n = max(1, len(records))
    for name in names:
        fired: Counter = Counter()
        anyv = anyr = 0
        for rec in records:
            o = rec.get("outcomes", {}).get(name)
            if not o:
                continue
            rules = o.get("rules") or {}
            fired.update(rules.keys())
            anyr += bool(rules)
            anyv += any(r in RULE_NAMES for r in rules)
        out[name] = {"any rule": anyr / n, "any vertical rule": anyv / n,
                     "per rule": {r: c / n for r, c in sorted(fired.items())}}
    return out


def summarize(results: dict[str, dict], shrunk: dict | None = None, **meta) -> dict:
    """The summary dict of a campaign's result records (and its shrunk classes)."""
    records = [r for r in results.values() if "outcomes" in r]
    broken = [r for r in results.values() if "outcomes" not in r]
    names = ["vertical", "all", "other"]
    outcomes = {name: Counter() for name in names}
    classes: dict = defaultdict(lambda: {"graphs": 0, "pass_sets": Counter(), "examples": []})
    refusals: Counter = Counter()
    for rec in records:
        for name, o in rec["outcomes"].items():
            label = "ok (ill-conditioned)" if o["kind"] == Kind.OK and o.get("symptom") == "ill-conditioned" else o["kind"]
            outcomes.setdefault(name, Counter())[label] += 1
            if o["kind"] == Kind.REFUSED:
                refusals[o["symptom"]] += 1
            if o["kind"] in _CLASSED:
                c = classes[class_key(o)]
                c["pass_sets"][name] += 1
                if rec["id"] not in c["examples"]:
                    c["graphs"] += 1
                    if len(c["examples"]) < 5:
                        c["examples"].append(rec["id"])
                c.setdefault("detail", o["detail"])
    slugs = {v.get("key"): {**v, "slug": k} for k, v in (shrunk or {}).items() if v}
    class_list = []
    for key, c in sorted(classes.items(), key=lambda kv: -kv[1]["graphs"]):
        kind, blame_label, symptom = key.split(" | ", 2)
        s = slugs.get(key, {})
        class_list.append({"key": key, "kind": kind, "blame": blame_label, "symptom": symptom, "graphs": c["graphs"],
                           "pass_sets": dict(c["pass_sets"]), "examples": c["examples"], "detail": c["detail"],
                           "shrunk": s.get("path", ""), "shrunk_nodes": s.get("after_nodes"),
                           "shrunk_from": s.get("before_nodes"), "shrunk_detail": s.get("detail", s.get("note", "")),
                           "vanishes_with": s.get("diagnosis", [])})
    failing = sum(1 for r in records if any(o["kind"] in REPLAYABLE for o in r["outcomes"].values()))
    dtypes = Counter(t for r in records for t in r.get("tags", []) if t.startswith("float"))
    return {
        **meta,
        "graphs": len(records),
        "graphs_not_run": len(broken),
        "not_run_examples": [{"id": r["id"], **{k: v for k, v in r.items() if k != "id"}} for r in broken[:10]],
        "graphs_failing": failing,
        "dtypes": dict(dtypes),
        "seconds_per_graph": round(sum(r.get("seconds", 0) for r in records) / max(1, len(records)), 3),
        "fire_rate": _fire_rates(records, names),
        "outcomes": {k: {kind: v.get(kind, 0) for kind in _KINDS} for k, v in outcomes.items()},
        "other_orders": dict(Counter("+".join(r["outcomes"]["other"]["passes"]) for r in records if "other" in r["outcomes"])),
        "classes": class_list,
        "refusals": dict(refusals.most_common(20)),
    }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def markdown(s: dict) -> str:
    """The summary as Markdown tables."""
    lines = [f"# Fuzz campaign (seed {s.get('seed')}): {s['graphs']} graphs", ""]
    lines.append(f"{s['graphs_failing']} graphs failed in at least one pass set; {s['graphs_not_run']} could not be "
                 f"run (timeout or generator error); {s['seconds_per_graph']} s per graph (one worker). "
                 f"dtypes: {s['dtypes']}.")
    lines += ["", "## Fire rate (share of graphs where the rule formed at least one group)", "",
              "| rule | vertical | all passes | other |", "|---|---|---|---|"]
    fr = s["fire_rate"]
    for label in ("any rule", "any vertical rule"):
        lines.append(f"| **{label}** | " + " | ".join(_pct(fr.get(n, {}).get(label, 0)) for n in ("vertical", "all", "other")) + " |")
    rules = sorted({r for n in fr.values() for r in n["per rule"]})
    for r in rules:
        lines.append(f"| {r} | " + " | ".join(_pct(fr.get(n, {}).get("per rule", {}).get(r, 0)) for n in ("vertical", "all", "other")) + " |")
    lines += ["", "## Outcomes per pass set", "", "| outcome | vertical | all passes | other |", "|---|---|---|---|"]
    for kind in _KINDS:
        row = [s["outcomes"].get(n, {}).get(kind, 0) for n in ("vertical", "all", "other")]
        if any(row) or kind in REPLAYABLE:
            lines.append(f"| {kind} | " + " | ".join(f"{v:,}" for v in row) + " |")
    lines += ["", f"`other` is one of these pass orders per graph: {s.get('other_orders', {})}", "",
              "## Failure classes", "",
              "`vanishes with`: the probes (fusionlab.fuzz.diagnose) after which the shrunk model no longer fails.", "",
              "| # | kind | blamed pass:rule | symptom | graphs | shrunk model (nodes) | vanishes with |",
              "|---|---|---|---|---|---|---|"]
    for i, c in enumerate(s["classes"], 1):
        shrunk = f"`{Path(c['shrunk']).name}` ({c['shrunk_nodes']})" if c["shrunk"] else "-"
        lines.append(f"| {i} | {c['kind']} | {c['blame']} | {c['symptom'].replace('|', '/')} | {c['graphs']} | {shrunk} | "
                     f"{', '.join(c.get('vanishes_with') or []) or '-'} |")
    lines += ["", "### Examples", ""]
    for i, c in enumerate(s["classes"], 1):
        lines.append(f"{i}. **{c['kind']}, {c['blame']}** — e.g. `{c['examples'][0]}`: {c['detail'][:300]}")
        if c["shrunk_detail"]:
            lines.append(f"   Shrunk: {c['shrunk_detail'][:300]}")
    if s["refusals"]:
        lines += ["", "## Refusals (ModelError)", "", "| message | count |", "|---|---|"]
        lines += [f"| {k.replace('|', '/')} | {v} |" for k, v in s["refusals"].items()]
    return "\n".join(lines) + "\n"


def write(out_dir, results: dict, shrunk: dict | None = None, **meta) -> dict:
    s = summarize(results, shrunk, **meta)
    out = Path(out_dir)
    (out / "summary.json").write_text(json.dumps(s, indent=2, default=str))
    (out / "summary.md").write_text(markdown(s))
    return s
