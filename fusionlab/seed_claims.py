"""The seed's claims in one ledger: `data/seed_claims.json`, read by the notebooks, rendered as `docs/seed_claims.md`.

Every quantitative or factual claim of the seed (`docs/seed/`) has one entry: what the seed says and
where, our verdict, the evidence, and the notebook sections that show it. The evidence is never a number
typed twice:

- ``notebook``: a figure a notebook prints. With a ``pattern`` (a regular expression with a group, matched
  once in the stored notebook's outputs, whitespace collapsed) the figure is *read* from the stored, executed
  notebook, so it is whatever the notebook printed at its last build, measured figures included; without one,
  ``text`` is a deterministic output quoted whole, and tests/test_seed_claims.py checks the notebook prints it
  (so a changed notebook output fails until the ledger agrees). A figure a notebook prints is never typed in
  the ledger as a benchmark's: the ledger would quote a number the notebook beside it contradicts;
- ``benchmark``: a cell of a table in ``benchmarks/results/*.md``, read from that file when the ledger is
  rendered or a notebook asks (so the ledger always quotes the last benchmark run);
- ``source``: a documentation or source reference for a factual claim (``../shared/reference/`` notes);
- ``pending``: evidence that work in progress will supply, with what it is.

A verdict's own text (``why``, and the text of source and pending evidence) types no measurement either: a
figure there that looks like one (a ratio with decimals, a percentage, a time, a bandwidth) must be printed by
a notebook the claim cites or be in a benchmark cell it reads, or be the seed's own figure (`unquoted_figures`,
part of `notebook_problems`).

Notebooks print `claim(id).summary()` next to their own measurement. `tools/seed_ledger.py` rewrites the
document; a test fails when the stored document is stale.
"""

from __future__ import annotations

import json
import json as _json
import re
from dataclasses import dataclass, field
from decimal import Decimal, ROUND_HALF_EVEN, ROUND_HALF_UP
from pathlib import Path

from .files import atomic_write
from .text import MAX_WIDTH, wrap

__all__ = ["LEDGER", "DOC", "VERDICTS", "Evidence", "Claim", "load", "claim", "benchmark_cell", "notebook_outputs",
           "notebook_figure", "notebook_problems", "notebook_sections",
           "render", "write_doc"]

ROOT = Path(__file__).resolve().parent.parent
LEDGER = ROOT / "data" / "seed_claims.json"
DOC = ROOT / "docs" / "seed_claims.md"

#: verdict -> what it means (the ledger uses exactly these)
VERDICTS = {
    "reproduced": "measured here, with the effect the seed describes (on this CPU, with onnxruntime)",
    "modelled": "predicted for the Ascend device from published specifications or a simulator; not measured",
    "confirmed": "a factual statement checked against CANN documentation or source",
    "not reproducible": "needs Ascend hardware or counters we do not have; the ledger says what we show instead",
    "partly wrong": "right in part; the ledger says which part is not",
    "wrong": "contradicted by documentation, code or measurement",
}
_KINDS = ("notebook", "benchmark", "source", "pending")


@dataclass(frozen=True)
class Evidence:
    """One piece of evidence: a figure or statement, and where it was measured, modelled or read."""

    kind: str
    text: str
    where: str = ""
    row: dict = field(default_factory=dict)  # benchmark: {column: value} picking the table row
    column: str = ""  # benchmark: the column holding the figure
    pattern: str = ""  # notebook: a regex with one group, read from the stored notebook's outputs

    def figure(self, root: Path = ROOT) -> str:
        """The figure: for a benchmark, the current content of its results-table cell; else the text."""
        if self.kind == "benchmark":
            return benchmark_cell(root / self.where, self.row, self.column)
        if self.kind == "notebook" and self.pattern:
            return notebook_figure(self.where, self.pattern, root)
        return self.text

    def describe(self, root: Path = ROOT) -> str:
        """One line: the figure and where it comes from."""
        if self.kind == "benchmark":
            row = ", ".join(f"{v}" for v in self.row.values())
            return f"{self.text} {self.figure(root)} (measured: `{self.where}`, {row}; {self.column})"
        if self.kind == "notebook" and self.pattern:
            return f"{self.text} {self.figure(root)} (printed by notebook `{self.where}`)"
        if self.kind == "notebook":
            return f"{self.text} (printed by notebook `{self.where}`)"
        if self.kind == "source":
            return f"{self.text} (source: {self.where})" if self.where else self.text
        return f"pending: {self.text}"


@dataclass(frozen=True)
class Claim:
    """One claim of the seed, judged."""

    id: str
    section: str
    seed: str
    says: str
    verdict: str
    why: str
    evidence: tuple[Evidence, ...]
    shown_in: tuple[tuple[str, str, str], ...]  # (notebook stem, section number, heading text after the number)

    @property
    def pending(self) -> list[Evidence]:
        return [e for e in self.evidence if e.kind == "pending"]

    def where_shown(self) -> str:
        """'notebook 19 §3, notebook 17 §5' style references."""
        return ", ".join(f"notebook {nb[:2]} §{sec}" for nb, sec, _ in self.shown_in) or "-"

    def summary(self) -> str:
        """What a notebook prints next to its own measurement: the seed's claim and the ledger's verdict.

        Lines are wrapped to `fusionlab.text.MAX_WIDTH` (the notebook column), continuations indented."""

        return wrap(f"The seed (§{self.section}): {self.says}\n"
                    f"Ledger verdict [{self.id}]: {self.verdict}. {self.why}\n"
                    f"(all the seed's claims: docs/seed_claims.md)", MAX_WIDTH, indent="    ")


def _evidence(raw: dict, where: str) -> Evidence:
    kind = raw.get("kind")
    if kind not in _KINDS:
        raise ValueError(f"{where}: evidence kind {kind!r} is not one of {_KINDS}")
    ev = Evidence(kind=kind, text=str(raw.get("text", "")), where=str(raw.get("where", "")),
                  row=dict(raw.get("row", {})), column=str(raw.get("column", "")), pattern=str(raw.get("pattern", "")))
    if ev.pattern and kind != "notebook":
        raise ValueError(f"{where}: only notebook evidence reads a pattern")
    if ev.pattern and re.compile(ev.pattern).groups < 1:
        raise ValueError(f"{where}: a notebook pattern needs a group (the figure)")
    if not ev.text:
        raise ValueError(f"{where}: evidence without text")
    if kind in ("notebook", "benchmark") and not ev.where:
        raise ValueError(f"{where}: {kind} evidence must say where (notebook stem or results file)")
    if kind == "benchmark" and not (ev.row and ev.column):
        raise ValueError(f"{where}: benchmark evidence needs a row and a column")
    return ev


def load(path: str | Path | None = None) -> dict[str, Claim]:
    """{id: Claim} from the ledger file, validated (unique ids, known verdicts, evidence and sections given)."""
    path = Path(path) if path is not None else LEDGER
    data = json.loads(path.read_text(encoding="utf-8"))
    out: dict[str, Claim] = {}
    for raw in data["claims"]:
        cid = raw["id"]
        if cid in out:
            raise ValueError(f"{path.name}: duplicate claim id {cid!r}")
        if raw["verdict"] not in VERDICTS:
            raise ValueError(f"{path.name}: {cid}: verdict {raw['verdict']!r} is not one of {list(VERDICTS)}")
        evidence = tuple(_evidence(e, f"{path.name}: {cid}") for e in raw["evidence"])
        if not evidence:
            raise ValueError(f"{path.name}: {cid}: no evidence")
        shown = tuple((s["notebook"], str(s["section"]), s["title"]) for s in raw.get("shown_in", []))
        out[cid] = Claim(cid, raw["section"], raw["seed"], raw["says"], raw["verdict"], raw["why"], evidence, shown)
    return out


def claim(cid: str) -> Claim:
    """One claim by id (a KeyError names the ids there are)."""
    claims = load()
    if cid not in claims:
        raise KeyError(f"no claim {cid!r} in {LEDGER.name}; ids: {', '.join(claims)}")
    return claims[cid]


def benchmark_cell(path: str | Path, row: dict, column: str) -> str:
    """The cell of `column` in the markdown-table row whose cells match `row` ({column: value})."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines[:-1]):
        if not (line.startswith("|") and re.match(r"^\|[-| ]+\|$", lines[i + 1].strip())):
            continue
        header = [c.strip() for c in line.strip().strip("|").split("|")]
        if column not in header or not set(row) <= set(header):
            continue
        for body in lines[i + 2:]:
            if not body.startswith("|"):
                break
            cells = dict(zip(header, (c.strip() for c in body.strip().strip("|").split("|"))))
            if all(cells.get(k) == v for k, v in row.items()):
                return cells[column]
    raise ValueError(f"{path.name}: no table row {row} with a column {column!r}")


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def notebook_outputs(stem: str, root: Path = ROOT) -> str:
    """All text the stored notebook's cells printed (whitespace collapsed), minus the ledger's own summaries
    (so a figure read from it is one the notebook computed, not one the ledger put there)."""

    nb = _json.loads((root / "notebooks" / f"{stem}.ipynb").read_text(encoding="utf-8"))
    parts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            parts.append("".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", "")))
    text = _flat("\n".join(parts))
    for c in load(root / "data" / "seed_claims.json").values():
        text = text.replace(_flat(c.summary()), "")
    return text


def notebook_figure(stem: str, pattern: str, root: Path = ROOT) -> str:
    """The figure `pattern` picks from the stored notebook's outputs (several groups: joined by ' → ', e.g. a
    before and an after); it must match exactly once, so the figure is unambiguous."""
    found = list(re.finditer(pattern, notebook_outputs(stem, root)))
    if len(found) != 1:
        raise ValueError(f"notebook {stem}: pattern {pattern!r} matches {len(found)} times in its outputs, not once")
    return " → ".join(found[0].groups())


#: a figure that reads as a measurement or a model's result: a ratio with decimals (1.06x), a percentage, a time,
#: a bandwidth or a rate. Integers without a unit (kernel counts, 5 ops) and sizes are not matched.
_MEASURED = re.compile(r"(?<![\w.§-])(?P<num>\d+(?:\.\d+)?)\s?(?P<unit>×|x(?![\w])|%|µs|us(?![\w])|ms(?![\w])"
                       r"|GB/s|TOPS/W|GFLOP/s)|(?<![\w.§-])(?P<dec>\d+\.\d+)(?![\d.])")
#: a version after a tool's name ("CMake 3.19", "onnxruntime 1.14", "since 1.14"): not a measurement
_VERSION_OF = r"(?i:\b(?:cmake|cmakeminimumrequired|onnxruntime|python|cann|toolkit|gcc|opset|tvm|torch|onnx|version|since|release)\s+\d+(?:\.\d+)+\+?)"
_PRINTED_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")


def _printed_at_precision(typed: str, text: str, percent: bool) -> bool:
    """Whether `text` prints the number `typed` at the precision it is typed (a printed 1.102 is a typed 1.10)."""

    want = Decimal(typed)
    q = Decimal(1).scaleb(-(len(typed.split(".")[1]) if "." in typed else 0))
    for m in _PRINTED_NUMBER.finditer(text):
        v = Decimal(m.group(0))
        for candidate in ((v, v * 100) if percent and v < 10 else (v,)):
            if any(candidate.quantize(q, rounding=r) == want for r in (ROUND_HALF_UP, ROUND_HALF_EVEN)):
                return True
    return False


def unquoted_figures(c: Claim, root: Path = ROOT) -> list[str]:
    """The figures of a claim's verdict text and source/pending evidence that look like measurements but are
    quoted from nowhere: not printed by a notebook the claim cites (its notebook evidence and the notebooks it is
    shown in), not in a benchmark cell it reads, and not the seed's own figure (its `seed` or `says` text)."""
    stems = {e.where for e in c.evidence if e.kind == "notebook"} | {nb for nb, _, _ in c.shown_in}
    quoted = [c.says, c.seed]
    for stem in sorted(stems):
        try:
            quoted.append(notebook_outputs(stem, root))
        except (OSError, ValueError):
            pass
    for e in c.evidence:
        if e.kind == "benchmark":
            try:
                quoted.append(e.figure(root))
            except (OSError, ValueError):
                pass
    text = " ".join(quoted)
    prose = [c.why] + [e.text for e in c.evidence if e.kind in ("source", "pending")]
    missing = []
    for piece in prose:
        piece = re.sub(r"`[^`]*`|\bnotebooks? \d+|§\s?\d+(?:\.\d+)*|\d+(?:\.\d+){2,}|" + _VERSION_OF, " ", piece)
        for m in _MEASURED.finditer(piece):
            typed = m.group("num") or m.group("dec")
            if not _printed_at_precision(typed, text, m.group("unit") == "%"):
                missing.append(m.group(0))
    return missing


def notebook_problems(claims: dict[str, Claim] | None = None, root: Path = ROOT) -> list[str]:
    """Every notebook figure of the ledger that its stored notebook does not print: a quoted text that is not
    among the outputs, or a pattern that does not match exactly once; and every figure of a verdict's text that
    looks like a measurement but is quoted from no notebook output or benchmark cell of the claim
    (`unquoted_figures`). Empty when the ledger quotes the notebooks."""
    claims = load() if claims is None else claims
    problems = []
    for c in claims.values():
        for figure in unquoted_figures(c, root):
            problems.append(f"{c.id}: {figure!r} looks like a measurement but no notebook output or benchmark "
                            "cell the claim cites prints it: quote it (a notebook pattern) or drop it")
    for c in claims.values():
        for e in c.evidence:
            if e.kind != "notebook":
                continue
            try:
                if e.pattern:
                    notebook_figure(e.where, e.pattern, root)
                elif _flat(e.text) not in notebook_outputs(e.where, root):
                    problems.append(f"{c.id}: notebook {e.where} does not print {e.text!r}")
            except (OSError, ValueError) as err:
                problems.append(f"{c.id}: {err}")
    return problems


def notebook_sections(stem: str, root: Path = ROOT) -> dict[str, str]:
    """{section number: heading text} of a notebook's '## N. Title' headings, read from its source."""
    src = (root / "notebooks_src" / f"{stem}.py").read_text(encoding="utf-8")
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^# ##+ (\d+(?:\.\d+)?)\.? (.+)$", src, re.M)}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(claims: dict[str, Claim] | None = None, root: Path = ROOT) -> str:
    """The ledger as markdown: a table of every claim, then each claim in full."""
    claims = load() if claims is None else claims
    counts = {v: sum(c.verdict == v for c in claims.values()) for v in VERDICTS}
    pending = [c for c in claims.values() if c.pending]
    out = [
        "# The seed's claims, checked one by one",
        "",
        "<!-- generated by tools/seed_ledger.py from data/seed_claims.json: edit the data, not this file -->",
        "",
        "The seed is a practitioner's write-up on operator fusion in Huawei's CANN/Ascend stack "
        "(`docs/seed/000_*.txt`, Chinese; English summary in `docs/seed/SUMMARY.md`). "
        "Each of its quantitative or factual claims is listed here with our verdict, the evidence, and the "
        "notebook sections that show it. The notebooks read the same file (`fusionlab.seed_claims`), so a "
        "figure cannot differ between them and this page.",
        "",
        f"{len(claims)} claims: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n) + ".",
        "",
        "| verdict | meaning |",
        "|---|---|",
        *[f"| {v} | {m} |" for v, m in VERDICTS.items()],
        "",
        "Evidence marked *measured* is read from `benchmarks/results/` (the last benchmark run, a shared 2-core "
        "CPU: read ratios, not absolute times); *printed by notebook* is a deterministic output of a stored, "
        "executed notebook, checked by `tests/test_seed_claims.py`; *pending* evidence is work in progress.",
        "",
        "| id | § | the seed says | verdict | shown in |",
        "|---|---|---|---|---|",
    ]
    for c in claims.values():
        out.append(f"| [{c.id}](#{c.id}) | {c.section} | {_cell(c.says)} | {c.verdict} | {c.where_shown()} |")
    for c in claims.values():
        out += ["", f"## {c.id}", "", f"**§{c.section}** · seed: 「{_cell(c.seed)}」", "",
                f"**The seed says:** {c.says}", "", f"**Verdict: {c.verdict}.** {c.why}", "", "**Evidence:**", ""]
        out += [f"- {e.describe(root)}" for e in c.evidence]
        if c.shown_in:
            out += ["", "**Shown in:** " + "; ".join(f"`{nb}` §{sec} ({title})" for nb, sec, title in c.shown_in)]
    if pending:
        out += ["", "## Pending evidence", ""]
        out += [f"- [{c.id}](#{c.id}): " + "; ".join(e.text for e in c.pending) for c in pending]
    return "\n".join(out) + "\n"


def write_doc(path: str | Path | None = None) -> Path:
    """Write the rendered ledger atomically; returns the path."""

    path = Path(path) if path is not None else DOC
    atomic_write(path, render().encode("utf-8"))
    return path
