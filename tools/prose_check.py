#!/usr/bin/env python3
"""Every number a notebook's prose states is one its outputs print; every typed verdict agrees with the interval.

`python tools/prose_check.py [notebooks/NN_x.ipynb ...]` reads each markdown cell of the stored, executed
notebooks (all of them by default) and prints one line per flag; exit status 1 when there is any.
tests/test_notebook_prose.py runs the same check. The rules:

**Numbers.** A number in the prose must be printed by an output of the same notebook (stream, text, Markdown,
HTML, the text of an SVG picture), at the precision the prose states: "1.1×" matches a printed 1.102, "28 MiB"
a printed 27.9, "46.5 %" a printed 46.5 or 0.465; "1,949" is 1949. The better way is not to type the number at
all: a Markdown display built from the values in code (`IPython.display.Markdown`) is an output, and stays true
on every rebuild. Not measurements, so not checked:

- anything in a code span or block (`opset=17`, `3×3` written as code), in a heading's numbering ("## 8.") or a
  list's ("1. ");
- shapes and tiles (``3×3``, ``2x256``, ``2×2×64``), version numbers (``1.31.1``), years (1990–2039);
- a number right after a word that makes it a name: opset, §, notebook(s), cell, issue, section, step, item,
  Python, version, chapter, table, figure, a tool's name before its version (TVM 0.27), a product line before its
  model number (Atlas 350, Ascend 910), or a cell reference ``[12]``; model numbers with letters (910B, 310P3, A2);
- anything in double quotes or 「」: a quotation, whose source the sentence names;
- a bare integer below 10 ("two passes", "3 outputs"); larger integers are checked, and any number with a
  decimal point, a percent sign, a ratio sign (×, x) or a unit always is;
- a literature figure: a sentence that cites its source, i.e. holds a Markdown link, names the seed ("the
  seed", "seed's", "seed §"), or carries ``[src: ...]``;
- a number written as a literal in the notebook's own code cells, when it is an integer or has a unit (a
  setting the reader can see: "a 16 KiB budget"); decimals, percentages and ratios must be printed.

**Cross-notebook figures.** A sentence that cites another notebook ("notebook 17 §3 measured ...", "(notebook
03)") attributes its figures to that notebook, so each checked number in it must be printed by a cited notebook's
outputs (a literal of the cited notebook's code, under the same rule as above): that this notebook prints the same
number (its own typed constant, say) does not make it the other notebook's measurement, so this notebook's own
figures go in a sentence of their own (or come from code). A verdict in such a
sentence is read against the cited notebooks' intervals too.

**Typed constants presented as measured.** A number assigned as a literal in a code cell (``launch_us = 0.3``, or a
keyword argument ``launch_us=0.3``) is a setting, not a measurement. It is flagged where prose presents it as one: a markdown sentence that says
measured/measures/measurement or cites another notebook, and names the variable (in a code span) or types its
decimal value; or a comment of the cell that types the value beside such words. Read the value from fusionlab (a
function that measures it, or a stored measurement) or call it an assumption.

**One thing measured twice.** Two timing calls of one notebook (``timing.compare_models``, ``timing.compare``,
``timing.bench``, ``timing.bench_session``, ``timing.interleaved``) with the same arguments, ignoring labels and
run-length settings, measure the same thing twice, and on this noisy machine they print two figures for it
(1.53× in one cell, 1.34× in the next). The later call is flagged: pass the first measurement on, or, where the
second run is the point, put its cell in `REMEASURED` with the reason and explain the difference in
code-generated text.

What is left and still not a measurement goes in `ALLOWED` below, one entry per (notebook, number as typed,
a phrase of its sentence) with its reason, kept short; a test fails on an entry that no longer matches.

**Verdicts.** The words for a measured ratio come from `fusionlab.timing.ratio_verdict` (faster, slower, no
clear difference), displayed by code. A verdict typed in markdown ("faster", "slower", "within the noise",
"no clear difference", "level", "no measurable") is checked against the ratio nearest it in its sentence: the
interval is the one typed after the ratio ("1.04× (1.03–1.04)") or, failing that, the one an output prints next
to that ratio. An interval that excludes 1 cannot be "within the noise"; one that includes 1 cannot be "faster"
or "slower". A question ("will it be 2× faster?") states no verdict, and a ratio without decimals ("2×") is an
order of magnitude, not a reading: neither is checked for its verdict (its number still is).
"""

from __future__ import annotations

import argparse
import ast
import html
import json
import re
import sys
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"

#: (notebook stem, number as typed, a phrase of its sentence) -> why it is not a printed measurement.
ALLOWED: dict[tuple[str, str, str], str] = {
}

#: (notebook stem, code cell index) -> why this cell measures again what an earlier cell measured.
REMEASURED: dict[tuple[str, int], str] = {
}

_UNITS = (r"%|×|x(?![\w])|KiB|MiB|GiB|TiB|KB|MB|GB|TB|kB|µs|us|ms|ns|s(?![\w])|GB/s|TB/s|GFLOP/s|TFLOP/s|TFLOPS"
          r"|GFLOPS|TOPS|GHz|MHz|W(?![\w])|B(?![\w])|bytes?|MACs?|FLOPs?|kernels?|nodes?|launches")
_NUMBER = re.compile(r"(?<![\w.,/\-])(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)(?![\d])"
                     r"(?P<space>[ \u00a0\u202f]?)(?P<unit>" + _UNITS + r")?")
_SHAPE = re.compile(r"\d+(?:\s*[×x]\s*\d+)+(?![\d.])")
_VERSION = re.compile(r"\b\d+\.\d+\.\d+(?:\.\d+)*\b|\bv\d+(?:\.\d+)*\b")
_PRODUCT = re.compile(r"\b\d{3}[A-Z]+\d*\b|\b[A-Z]+\d+[A-Za-z]*\b")  # 910B, 310P3, 300I; A2, H100, C04
_QUOTE = re.compile(r'"[^"\n]*"|“[^”]*”|「[^」]*」')
_CODE = re.compile(r"```.*?```|``.*?``|`[^`]*`|\$[^$\n]+\$", re.S)
_NAME_BEFORE = re.compile(r"(?:opset|§|§§|notebooks?|cells?|issues?|sections?|steps?|items?|python|version|chapters?"
                          r"|tables?|figures?|fig\.|level|#|\[|–§|-§|and §|to §|tvm|onnxruntime|cann|torch|onnx|numpy|iree|ir_version|atlas|ascend)\s*$", re.I)
_CITATION = re.compile(r"\]\(|\bthe seed\b|\bseed's\b|\bseed §|\bthe write-up\b|\[src:|shared/reference/|cann_facts\.md",
                       re.I)
_HEADING_OR_LIST = re.compile(r"^(\s*#+\s*|\s*)(\d+(?:\.\d+)*)[.)]\s", re.M)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*(\"'`])|\n\s*\n|\n(?=\s*(?:[*-]|\d+\.)\s)|\n(?=#)")
_OUT_NUMBER = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\w.])\d+(?:\.\d+)?(?:e[-+]?\d+)?", re.I)
_CI = re.compile(r"(?P<r>\d+\.\d+)\s*[×x]?\s*[(\[]?\s*(?:95\s*%\s*CI\s*)?(?P<lo>\d+\.\d+)\s*[–\-]\s*(?P<hi>\d+\.\d+)")
_VERDICT = re.compile(r"\bwithin the noise\b|\bno clear difference\b|\bno measurable\b|\bare level\b|\bis level\b"
                      r"|\bfaster\b|\bslower\b", re.I)
_NOISE = re.compile(r"noise|no clear|no measurable|level", re.I)
_CITES = re.compile(r"\bnotebooks?\s+(?P<list>[`*]{0,2}\d{2}[`*]{0,2}(?:\s*(?:,|and|or|&|/)\s*[`*]{0,2}\d{2}[`*]{0,2}"
                    r"(?![\d.]))*)(?![\d.])", re.I)  # "notebook 17", "notebook `17`", "notebooks **03** and 04"
_CITED_NUMBER = re.compile(r"\d{2}")
_MEASURED_WORD = re.compile(r"\bmeasur(?:ed|es|ing|ement|ements)\b", re.I)
_TIMING_CALLS = ("compare_models", "compare", "bench", "bench_session", "interleaved")
#: keyword arguments that set how long or how a measurement is labelled, not what it measures
_RUN_LENGTH_KW = {"label", "label_a", "label_b", "min_time", "min_repeats", "warmup", "rounds", "max_rounds",
                  "confidence", "repeats", "max_time"}


@dataclass(frozen=True)
class Flag:
    """One sentence that disagrees with its notebook's outputs."""

    notebook: str
    cell: int
    number: str
    sentence: str
    why: str

    def __str__(self) -> str:
        s = re.sub(r"\s+", " ", self.sentence).strip()
        return f"{self.notebook} [{self.cell}] {self.number!r}: {self.why} :: {s[:160]}"


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _svg_text(svg: str) -> str:
    return " ".join(html.unescape(t) for t in re.findall(r">([^<>]+)<", svg))


def output_text(nb: dict) -> str:
    """Everything the notebook's code cells printed or displayed, as text."""
    parts: list[str] = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            if "text" in out:
                parts.append("".join(out["text"]))
            data = out.get("data", {})
            for mime, value in data.items():
                text = "".join(value) if isinstance(value, list) else value
                if not isinstance(text, str):
                    continue
                if mime in ("text/plain", "text/markdown", "text/latex"):
                    parts.append(text)
                elif mime == "text/html":
                    parts.append(html.unescape(re.sub(r"<[^>]+>", " ", text)))
                elif mime == "image/svg+xml":
                    parts.append(_svg_text(text))
    return "\n".join(parts)


def code_text(nb: dict) -> str:
    return "\n".join(_source(c) for c in nb["cells"] if c["cell_type"] == "code")


def _dec(s: str) -> Decimal | None:
    try:
        return Decimal(s.replace(",", ""))
    except InvalidOperation:
        return None


def _numbers(text: str) -> set[Decimal]:
    out = set()
    for m in _OUT_NUMBER.finditer(text):
        d = _dec(m.group(0))
        if d is not None:
            out.add(d)
    return out


def _places(typed: str) -> int:
    return len(typed.split(".")[1]) if "." in typed else 0


def printed(typed: str, percent: bool, values: set[Decimal], rounded: dict) -> bool:
    """Whether a number as typed equals a printed value at the typed precision (percent: or a printed fraction)."""
    want = _dec(typed)
    if want is None:
        return False
    places = _places(typed)
    key = places
    if key not in rounded:
        q = Decimal(1).scaleb(-places)
        rounded[key] = {v.quantize(q, rounding=r) for v in values if v.adjusted() < 20
                        for r in (ROUND_HALF_UP, ROUND_HALF_EVEN)}  # "16.3" or "16.2" for a printed 16.25
    if want in rounded[key]:
        return True
    if percent:
        pkey = ("%", places)
        if pkey not in rounded:
            q = Decimal(1).scaleb(-places)
            rounded[pkey] = {(v * 100).quantize(q, rounding=ROUND_HALF_UP) for v in values if v < 10}
        return want in rounded[pkey]
    return False


def _sentences(text: str) -> list[tuple[int, str]]:
    """(offset, sentence) pieces of a markdown cell."""
    out, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        out.append((start, text[start:m.start()]))
        start = m.end()
    out.append((start, text[start:]))
    return out


def _blank(text: str, pattern: re.Pattern, group: int = 0) -> str:
    return pattern.sub(lambda m: m.group(0)[: m.start(group) - m.start(0)] + " " * len(m.group(group))
                       + m.group(0)[m.end(group) - m.start(0):], text)


def _output_intervals(text: str) -> dict[str, list[tuple[Decimal, Decimal]]]:
    """{ratio as printed: [(low, high), ...]} for every 'r× (lo–hi)' / 'r  lo-hi' an output prints."""
    out: dict[str, list] = {}
    for m in _CI.finditer(text):
        lo, hi = _dec(m.group("lo")), _dec(m.group("hi"))
        if lo is not None and hi is not None and lo <= hi:
            out.setdefault(m.group("r"), []).append((lo, hi))
    return out


def _interval_for(typed: str, sentence: str, at: int, intervals: dict) -> tuple[Decimal, Decimal] | None:
    m = _CI.match(sentence, at)
    if m:
        return _dec(m.group("lo")), _dec(m.group("hi"))
    places = _places(typed)
    want = _dec(typed)
    found = []
    for r, cis in intervals.items():
        d = _dec(r)
        if d is not None and _places(r) >= places and d.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP) == want:
            found += cis
    kinds = {("in" if lo <= 1 <= hi else "out") for lo, hi in found}
    return found[0] if len(kinds) == 1 else None


def _allowed(stem: str, typed: str, sentence: str) -> bool:
    flat = re.sub(r"\s+", " ", sentence)
    return any(s == stem and t == typed and phrase in flat for s, t, phrase in ALLOWED)


def cited_notebooks(sentence: str, stem: str) -> set[str]:
    """The two-digit numbers of the other notebooks a sentence cites ("notebook 17 §3", "notebooks 03 and 17")."""
    out = set()
    for m in _CITES.finditer(sentence):
        out |= set(_CITED_NUMBER.findall(m.group("list")))
    return {n for n in out if not stem.startswith(n + "_")}


class _Notebooks:
    """Stored notebooks by two-digit number, read once: their printed values, code literals and intervals."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._cache: dict[str, tuple[set, set, dict, dict] | None] = {}

    def get(self, number: str):
        if number not in self._cache:
            found = sorted(self.folder.glob(f"{number}_*.ipynb"))
            if not found:
                self._cache[number] = None
            else:
                nb = json.loads(found[0].read_text(encoding="utf-8"))
                outputs = output_text(nb)
                self._cache[number] = (_numbers(outputs), _numbers(code_text(nb)), _output_intervals(outputs), {})
        return self._cache[number]


def literal_assignments(nb: dict) -> list[tuple[int, str, str, int]]:
    """(code cell index, variable, the literal as written, line) for every `name = <number>` in the code cells, and
    every keyword argument given a decimal literal (`price(launch_us=0.3)`)."""
    out = []
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        try:
            tree = ast.parse(_strip_magics(_source(cell)))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):  # a keyword argument with a decimal literal: `price(launch_us=0.3)`
                for k in node.keywords:
                    v = k.value.operand if isinstance(k.value, ast.UnaryOp) and isinstance(k.value.op, ast.USub) else k.value
                    if k.arg and isinstance(v, ast.Constant) and type(v.value) is float:
                        literal = ast.get_source_segment(_strip_magics(_source(cell)), v) or repr(v.value)
                        out.append((index, k.arg, literal, node.lineno))
                continue
            if not isinstance(node, (ast.Assign, ast.AnnAssign)):
                continue
            value = node.value
            if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.USub):
                value = value.operand
            if not (isinstance(value, ast.Constant) and type(value.value) in (int, float)):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            literal = ast.get_source_segment(_strip_magics(_source(cell)), value) or repr(value.value)
            for t in targets:
                if isinstance(t, ast.Name):
                    out.append((index, t.id, literal, node.lineno))
    return out


def _strip_magics(src: str) -> str:
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in src.splitlines())


def _literal_flags(stem: str, nb: dict) -> list[Flag]:
    """Typed constants presented as measured: in a code cell's comments and in the markdown."""
    literals = literal_assignments(nb)
    flags: list[Flag] = []
    decimal = [(i, name, lit) for i, name, lit, _ in literals if "." in lit and _dec(lit) is not None]
    for index, name, literal in decimal:  # the cell's own comments
        src = _source(nb["cells"][index])
        for line in src.splitlines():
            if "#" not in line:
                continue
            comment = line[line.index("#"):]
            if (_MEASURED_WORD.search(comment) or cited_notebooks(comment, stem)) and re.search(
                    r"(?<![\d.])" + re.escape(literal) + r"(?![\d])", comment):
                flags.append(Flag(stem, index, literal, comment,
                                  f"`{name} = {literal}` is typed in code, and this comment presents it as measured: "
                                  "read it from fusionlab (a measurement) or call it an assumption"))
    by_name = {name: (i, lit) for i, name, lit, _ in literals}
    by_value: dict[Decimal, tuple[int, str, str]] = {}
    for i, name, lit in decimal:
        by_value.setdefault(_dec(lit), (i, name, lit))
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        raw = _source(cell)
        for offset, sentence in _sentences(raw):
            if not (_MEASURED_WORD.search(sentence) or cited_notebooks(sentence, stem)):
                continue
            hits = []
            for span in re.findall(r"`([A-Za-z_]\w*)`", sentence):
                if span in by_name:
                    hits.append((span, *by_name[span]))
            plain = _CODE.sub(lambda m: " " * len(m.group(0)), sentence)
            for m in re.finditer(r"(?<![\w.])\d+\.\d+(?![\d])", plain):
                d = _dec(m.group(0))
                if d in by_value:
                    i, name, lit = by_value[d]
                    hits.append((name, i, lit))
            for name, i, lit in dict.fromkeys(hits):
                flags.append(Flag(stem, index, f"{name} = {lit}", sentence,
                                  f"typed as a literal in code cell [{i}] (`{name} = {lit}`), presented here as "
                                  "measured: read it from fusionlab (a measurement) or call it an assumption"))
    return flags


def _call_name(func) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def measurement_calls(nb: dict) -> list[tuple[int, str]]:
    """(code cell index, normalised call) for every timing call of the notebook, in order."""
    out = []
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        try:
            tree = ast.parse(_strip_magics(_source(cell)))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _call_name(node.func) in _TIMING_CALLS:
                name = _call_name(node.func)
                if isinstance(node.func, ast.Attribute) and not (
                        isinstance(node.func.value, ast.Name) and node.func.value.id == "timing"):
                    continue
                args = [ast.unparse(a) for a in node.args]
                kws = sorted(f"{k.arg}={ast.unparse(k.value)}" for k in node.keywords if k.arg not in _RUN_LENGTH_KW)
                out.append((index, f"{name}({', '.join(args + kws)})"))
    return out


def _remeasure_flags(stem: str, nb: dict) -> list[Flag]:
    """A timing call that repeats an earlier one of the same notebook, argument for argument."""
    seen: dict[str, int] = {}
    flags = []
    for index, call in measurement_calls(nb):
        if call in seen and seen[call] != index and (stem, index) not in REMEASURED:
            flags.append(Flag(stem, index, call, _source(nb["cells"][index]),
                              f"measures again what cell [{seen[call]}] measured ({call}): two figures for one "
                              "thing; pass the first measurement on, or explain the difference and list the cell in "
                              "REMEASURED"))
        seen.setdefault(call, index)
    return flags


def check_notebook(path: Path) -> list[Flag]:
    """The flags of one stored notebook."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    stem = Path(path).stem
    outputs = output_text(nb)
    values = _numbers(outputs)
    code_values = _numbers(code_text(nb))
    intervals = _output_intervals(outputs)
    rounded: dict = {}
    flags: list[Flag] = []
    others = _Notebooks(Path(path).parent)
    previous_output = ""
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            previous_output = output_text({"cells": [cell]})
            continue
        raw = _source(cell)
        text = _CODE.sub(lambda m: " " * len(m.group(0)), raw)
        text = _blank(text, _HEADING_OR_LIST, 2)
        text = _blank(text, _VERSION)
        text = _blank(text, _SHAPE)
        text = _blank(text, _PRODUCT)
        text = _blank(text, _QUOTE)
        near = _output_intervals(previous_output)
        near_kinds = {("in" if lo <= 1 <= hi else "out") for cis in near.values() for lo, hi in cis}
        for offset, sentence in _sentences(text):
            cited = bool(_CITATION.search(raw[offset:offset + len(sentence)]))
            elsewhere = [others.get(n) for n in sorted(cited_notebooks(raw[offset:offset + len(sentence)], stem))]
            elsewhere = [e for e in elsewhere if e is not None]
            s_values, s_code, s_intervals, s_rounded = values, code_values, intervals, rounded
            if elsewhere:  # the figures are the cited notebooks': bind them to those outputs
                s_values = set().union(*(e[0] for e in elsewhere))
                s_code = set().union(*(e[1] for e in elsewhere))
                s_intervals = {}
                for e in elsewhere:
                    for r, cis in e[2].items():
                        s_intervals.setdefault(r, []).extend(cis)
                s_rounded = {} if len(elsewhere) > 1 else elsewhere[0][3]
            ratios: list[tuple[int, str, int]] = []  # (position, typed, end)
            for m in _NUMBER.finditer(sentence):
                typed, unit = m.group("num"), m.group("unit") or ""
                value = _dec(typed)
                if value is None:
                    continue
                before = sentence[max(0, m.start() - 12):m.start()]
                if _NAME_BEFORE.search(before):
                    continue
                if unit in ("×", "x") and "." in typed:  # "2×" is an order of magnitude, not a reading
                    ratios.append((m.start(), typed, m.end()))
                bare = not unit and "." not in typed
                if bare and value < 10:
                    continue
                if bare and "," not in typed and 1990 <= value <= 2039:
                    continue
                if cited or _allowed(stem, typed + m.group("space") + unit, raw) or _allowed(stem, typed, raw):
                    continue
                if printed(typed, unit == "%", s_values, s_rounded):
                    continue
                if (bare or (unit and unit not in ("%", "×", "x"))) and "." not in typed and value in s_code:
                    continue
                why = ("no output of the notebook prints it" if not elsewhere else
                       "the sentence cites notebook " + ", ".join(sorted(cited_notebooks(raw[offset:offset + len(sentence)], stem)))
                       + ", whose outputs do not print it")
                flags.append(Flag(stem, index, typed + (m.group("space") + unit if unit else ""), raw[offset:offset + len(sentence)],
                                  why))
            for v in _VERDICT.finditer(sentence if not sentence.rstrip().endswith("?") else ""):  # a question
                noise_typed = bool(_NOISE.search(v.group(0)))
                if ratios:
                    pos, typed, end = min(ratios, key=lambda r: abs(r[0] - v.start()))
                    ci = _interval_for(typed, sentence, end, s_intervals)
                    if ci is None:
                        continue
                    lo, hi = ci
                    includes_one = lo <= 1 <= hi
                elif noise_typed and near_kinds == {"out"}:
                    # no ratio in the sentence: a noise verdict typed under a measurement whose every interval
                    # excludes 1
                    (typed, ((lo, hi), *_)), *_ = near.items()
                    includes_one = False
                else:
                    continue
                if noise_typed != includes_one:
                    want = "no clear difference" if includes_one else "faster/slower"
                    flags.append(Flag(stem, index, f"{typed}× {v.group(0)!r}", raw[offset:offset + len(sentence)],
                                      f"typed verdict against the interval {lo}–{hi}: the helper says {want}"))
    return flags + _literal_flags(stem, nb) + _remeasure_flags(stem, nb)


_RESULT_FILE = re.compile(r"`?(?:benchmarks/results/)?(?P<name>[a-z0-9_]+\.md)`?")


def _table_counts(text: str) -> set[Decimal]:
    """What a reader counts in a results file's tables: each table's data rows, and its distinct first cells and
    first-two-cell pairs ("27 exports" of a table with a row per export and optimiser)."""
    out, rows = set(), []
    for line in text.splitlines() + [""]:
        if line.startswith("|") and not line.startswith("|-"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif not line.startswith("|-"):
            data = rows[1:]
            if data:
                out |= {Decimal(len(data)), Decimal(len({r[0] for r in data})),
                        Decimal(len({tuple(r[:2]) for r in data}))}
            rows = []
    return out


def check_document(name: str, text: str, sources: dict[str, str]) -> list[Flag]:
    """The flags of a markdown page's prose against the result files it reports (`sources`: {file name: text}).

    The rule is the notebooks' one with the results files as the outputs: each typed figure of a sentence must be
    in a source the sentence names (`exports_quiet.md`), or, when it names none, in any source. Code spans,
    headings' and lists' numbers, versions, shapes, product names and quotes are skipped, as in a notebook."""
    per_file = {k: _numbers(v) | _table_counts(v) for k, v in sources.items()}
    values_all = set().union(*per_file.values()) if per_file else set()
    flags = []
    clean = _CODE.sub(lambda m: " " * len(m.group(0)), text)
    for pattern, group in ((_HEADING_OR_LIST, 2), (_VERSION, 0), (_SHAPE, 0), (_PRODUCT, 0), (_QUOTE, 0)):
        clean = _blank(clean, pattern, group)
    for offset, sentence in _sentences(clean):
        raw = text[offset:offset + len(sentence)]
        named = {m.group("name") for m in _RESULT_FILE.finditer(raw)} & set(sources)
        values = set().union(*(per_file[n] for n in named)) if named else values_all
        rounded: dict = {}
        for m in _NUMBER.finditer(sentence):
            typed, unit = m.group("num"), m.group("unit") or ""
            value = _dec(typed)
            if value is None or _NAME_BEFORE.search(sentence[max(0, m.start() - 12):m.start()]):
                continue
            bare = not unit and "." not in typed
            if bare and (value < 10 or ("," not in typed and 1990 <= value <= 2039)):
                continue
            if printed(typed, unit == "%", values, rounded):
                continue
            where = ", ".join(sorted(named)) if named else "any results file"
            flags.append(Flag(name, 0, typed + (m.group("space") + unit if unit else ""), raw.strip(),
                              f"not in {where}"))
    return flags


def check(paths=None) -> list[Flag]:
    paths = sorted(NOTEBOOKS.glob("*.ipynb")) if paths is None else [Path(p) for p in paths]
    return [f for p in paths for f in check_notebook(p)]


def stale_allowances(paths=None) -> list[tuple[str, str, str]]:
    """ALLOWED entries whose notebook no longer has that number in a sentence with that phrase."""
    stale = []
    for stem, typed, phrase in ALLOWED:
        path = NOTEBOOKS / f"{stem}.ipynb"
        nb = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"cells": []}
        md = [re.sub(r"\s+", " ", _source(c)) for c in nb["cells"] if c["cell_type"] == "markdown"]
        if not any(typed in t and phrase in t for t in md):
            stale.append((stem, typed, phrase))
    return stale


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--count", action="store_true", help="only print the number of flags per notebook")
    args = ap.parse_args(argv)
    flags = check(args.notebooks or None)
    if args.count:
        per: dict[str, int] = {}
        for f in flags:
            per[f.notebook] = per.get(f.notebook, 0) + 1
        for nb in sorted(per):
            print(f"{per[nb]:4d} {nb}")
    else:
        for f in flags:
            print(f)
    print(f"{len(flags)} flag(s)", file=sys.stderr)
    return 1 if flags else 0


if __name__ == "__main__":
    sys.exit(main())
