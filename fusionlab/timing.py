"""Honest timing: medians with confidence intervals, and interleaved A/B comparisons.

A single number from one run says little on a shared machine. `bench` repeats a call and reports the
median with a 95% confidence interval (order statistics: no distribution assumed). `compare` runs two
candidates interleaved, ABAB... with the first one swapped every round so slow drift (turbo, other
processes, thermal) hits both alike, and reports the median of the per-round ratios time_A / time_B.

Sessions are pinned to one intra-op thread by default: fusion's effect is then not mixed with how well
a kernel parallelises, and two cores shared with other work give stable numbers.
"""

from __future__ import annotations

import gc
import html
import math
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from fractions import Fraction
from importlib.metadata import version
from typing import Callable, Mapping, Sequence

import numpy
import onnx
import onnxruntime

from .text import text_table
from .verification import runtime

__all__ = [
    "Timing", "Comparison", "bench", "bench_session", "compare", "compare_models", "comparisons_table", "interleaved",
    "session_at_each_level",
    "machine_info", "median_ci", "format_seconds", "VERDICT_WORDS", "ratio_verdict", "verdict_markdown",
]

Timer = Callable[[], float]


# --------------------------------------------------------------------------------------------------
# statistics
# --------------------------------------------------------------------------------------------------

def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if n == 0:
        raise ValueError("no samples")
    mid = n // 2
    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2


def _order_stat_rank(n: int, confidence: float = 0.95) -> int:
    """Largest k (1-based) with P(Binomial(n, 1/2) < k) <= alpha/2; the CI is [x_(k), x_(n+1-k)]."""
    if n > 2000:  # the normal approximation is exact enough here and avoids huge integers
        z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
        return max(1, int(math.floor(n / 2 - z * math.sqrt(n) / 2)))
    limit = (1 - Fraction(str(confidence))) / 2 * 2**n  # exact: alpha/2 * 2^n
    cum = 0  # P(X <= k-1) * 2^n
    c = 1  # C(n, 0)
    k = 0
    while True:
        # check whether rank k+1 still keeps P(X <= k) <= alpha/2
        if cum + c > limit:
            break
        cum += c
        k += 1
        c = c * (n - k + 1) // k
    return max(1, k)


def median_ci(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(median, low, high): the median and a distribution-free CI from order statistics."""
    s = sorted(float(x) for x in samples)
    if not s:
        raise ValueError("no samples")
    n = len(s)
    k = _order_stat_rank(n, confidence)
    # For n < 6 no pair of order statistics reaches 95%: the range [min, max] is the best there is.
    return _median(s), s[k - 1], s[n - k]


_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))


def _unit_for(seconds: float) -> tuple[float, str]:
    a = abs(seconds)
    for scale, unit in _UNITS:
        if a >= scale:
            return scale, unit
    return _UNITS[-1]


def _num(x: float) -> str:
    """Three significant digits, no exponent."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    digits = max(0, 2 - int(math.floor(math.log10(abs(x)))))
    return f"{x:.{digits}f}"


def format_seconds(seconds: float, unit: str | None = None) -> str:
    """A duration with a readable unit, e.g. '1.23 ms'."""
    scale = dict((u, s) for s, u in _UNITS)[unit] if unit else _unit_for(seconds)[0]
    name = unit or _unit_for(seconds)[1]
    return f"{_num(seconds / scale)} {name}"


# --------------------------------------------------------------------------------------------------
# verdicts: the one place a ratio's interval becomes words
# --------------------------------------------------------------------------------------------------

#: The only words a verdict on a measured ratio may use. tools/prose_check.py flags them when typed in a
#: notebook's markdown against a ratio whose printed interval says otherwise.
VERDICT_WORDS = ("faster", "slower", "no clear difference")


#: the decimals every interval is printed with (`verdict_markdown`, `Comparison`, the notebooks' tables)
VERDICT_DECIMALS = 2


def ratio_verdict(ci_low: float, ci_high: float) -> str:
    """'faster' when the 95% CI of time_A / time_B lies above 1 (B faster), 'slower' when below 1 (B slower),
    'no clear difference' when it contains 1: the interval decides, never the point estimate.

    The interval is judged as it is printed (to `VERDICT_DECIMALS` decimals): a CI of 0.9961-0.9998 prints as
    "0.96-1.00" and must not read "slower" beside another printed "0.96-1.00" that reads "no clear difference"
    (an expert reader found exactly that pair in notebook 21)."""
    lo, hi = round(ci_low, VERDICT_DECIMALS), round(ci_high, VERDICT_DECIMALS)
    if lo > 1:
        return "faster"
    if hi < 1:
        return "slower"
    return "no clear difference"


def verdict_markdown(what: str, speedup: float, ci_low: float, ci_high: float, than: str = "") -> str:
    """A sentence for a notebook's Markdown display: '**X** is 1.04× faster (95% CI 1.03–1.04×) than Y.'

    `speedup` is time(than) / time(what) (>1: `what` faster). Built from the values, so a rebuild keeps it true.
    A slowdown is stated with its own interval (the speedup's, inverted): "1.17× slower (95% CI 1.16–1.18×)"."""
    word = ratio_verdict(ci_low, ci_high)
    ci = f"(95% CI {ci_low:.2f}–{ci_high:.2f}×)"
    tail = f" than {than}" if than else ""
    if word == "faster":
        return f"{what} is {speedup:.2f}× faster {ci}{tail}."
    if word == "slower":
        return f"{what} is {1 / speedup:.2f}× slower (95% CI {1 / ci_high:.2f}–{1 / ci_low:.2f}×){tail}."
    return f"{what}{' against ' + than if than else ''}: {speedup:.2f}× {ci}, no clear difference (the interval includes 1)."


# --------------------------------------------------------------------------------------------------
# one candidate
# --------------------------------------------------------------------------------------------------

@dataclass
class Timing:
    """Repeated measurements of one callable: median and its 95% confidence interval (seconds)."""

    samples: list[float]
    median: float
    ci_low: float
    ci_high: float
    n: int
    label: str = ""

    @classmethod
    def from_samples(cls, samples: Sequence[float], label: str = "") -> "Timing":
        """Summarise a list of per-call times in seconds."""
        samples = [float(x) for x in samples]
        med, lo, hi = median_ci(samples)
        return cls(samples=samples, median=med, ci_low=lo, ci_high=hi, n=len(samples), label=label)

    def __repr__(self) -> str:
        return f"Timing({self.label!r}, median={format_seconds(self.median)}, n={self.n})"

    def _parts(self) -> tuple[str, str, str]:
        scale, unit = _unit_for(self.median)
        return (f"{_num(self.median / scale)} {unit}", f"{_num(self.ci_low / scale)}–{_num(self.ci_high / scale)} {unit}",
                str(self.n))

    def __str__(self) -> str:
        med, ci, n = self._parts()
        prefix = f"{self.label}: " if self.label else ""
        return f"{prefix}median {med} (95% CI {ci}, n={n})"

    def _repr_html_(self) -> str:
        med, ci, n = self._parts()
        head = "".join(f"<th>{h}</th>" for h in ("", "median", "95% CI", "n"))
        row = "".join(f"<td>{html.escape(v)}</td>" for v in (self.label, med, ci, n))
        return f"<table><thead><tr>{head}</tr></thead><tbody><tr>{row}</tr></tbody></table>"


def bench(fn: Callable[[], object], *, label: str = "", warmup: int = 3, min_time: float = 0.2, min_repeats: int = 5,
          max_repeats: int = 10_000, timer: Timer = time.perf_counter) -> Timing:
    """Time `fn()` after `warmup` calls, repeating until `min_time` seconds and `min_repeats` calls."""
    if min_repeats < 1 or max_repeats < min_repeats:
        raise ValueError("need 1 <= min_repeats <= max_repeats")
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    gc_was_enabled = gc.isenabled()
    gc.disable()  # as timeit does: a collection in the middle of one call is noise, not the call's cost
    try:
        spent = 0.0
        while len(samples) < max_repeats and (len(samples) < min_repeats or spent < min_time):
            t0 = timer()
            fn()
            dt = timer() - t0
            samples.append(dt)
            spent += dt
    finally:
        if gc_was_enabled:
            gc.enable()
    return Timing.from_samples(samples, label)


def bench_session(sess, feeds: dict, **kw) -> Timing:
    """`bench` of one onnxruntime `InferenceSession.run` on `feeds`; keywords go to `bench`."""
    needed = {i.name for i in sess.get_inputs()}
    feeds = {k: v for k, v in feeds.items() if k in needed}
    names = [o.name for o in sess.get_outputs()]
    kw.setdefault("label", "session")
    return bench(lambda: sess.run(names, feeds), **kw)


# --------------------------------------------------------------------------------------------------
# two candidates
# --------------------------------------------------------------------------------------------------

@dataclass
class Comparison:
    """An interleaved A/B measurement; `speedup` = median of per-round time_A / time_B (>1: B faster)."""

    a: Timing
    b: Timing
    speedup: float
    ci_low: float
    ci_high: float
    rounds: int
    threads: dict = field(default_factory=dict)
    label_a: str = "A"
    label_b: str = "B"

    def __repr__(self) -> str:
        return (f"Comparison({self.label_a!r} vs {self.label_b!r}, speedup={self.speedup:.2f}, "
                f"ci=({self.ci_low:.2f}, {self.ci_high:.2f}), rounds={self.rounds})")

    @property
    def ratios(self) -> list[float]:
        """Per-round time_A / time_B."""
        return [_ratio(x, y) for x, y in zip(self.a.samples, self.b.samples)]

    def verdict(self, brief: bool = False) -> str:
        """One sentence: which is faster, or that the interval cannot tell.

        `brief` drops what a row that prints the ratio and its CI beside it already shows ('B faster')."""
        word = ratio_verdict(self.ci_low, self.ci_high)
        if word == "faster":
            return f"{self.label_b} faster" if brief else f"{self.label_b} is faster ({self.speedup:.2f}×)"
        if word == "slower":
            return f"{self.label_a} faster" if brief else f"{self.label_a} is faster ({1 / self.speedup:.2f}×)"
        return word + ("" if brief else " (the 95% CI of the ratio includes 1)")

    def said(self) -> str:
        """The ratio in words, for a sentence: '1.05× (95% CI 1.01–1.09), faster'."""
        return (f"{self.speedup:.2f}× (95% CI {self.ci_low:.2f}–{self.ci_high:.2f}), "
                f"{ratio_verdict(self.ci_low, self.ci_high)}")

    def markdown(self, what: str | None = None, than: str | None = None) -> str:
        """`verdict_markdown` of this comparison: B against A, the words from the interval."""
        return verdict_markdown(what or self.label_b, self.speedup, self.ci_low, self.ci_high,
                                than=self.label_a if than is None else than)

    def _rows(self) -> list[list[str]]:
        scale, unit = _unit_for(min(self.a.median, self.b.median) or self.a.median)
        rows = []
        for tag, name, t in (("A", self.label_a, self.a), ("B", self.label_b, self.b)):
            rows.append([tag, name, f"{_num(t.median / scale)} {unit}",
                         f"{_num(t.ci_low / scale)}–{_num(t.ci_high / scale)} {unit}"])
        return rows

    def _speedup_line(self) -> str:
        return (f"speedup A/B (median of paired ratios): {self.speedup:.2f}× "
                f"(95% CI {self.ci_low:.2f}–{self.ci_high:.2f}×)")

    def _footer(self) -> str:
        threads = ", ".join(f"{k}={v}" for k, v in self.threads.items())
        return f"{self.rounds} interleaved rounds" + (f"; threads: {threads}" if threads else "")

    def table(self) -> str:
        """Plain-text table: medians, CIs, the paired speedup and the verdict."""
        header = ["", "", "median", "95% CI"]
        rows = self._rows()
        out = text_table(header, rows, rule=False)
        out += [self._speedup_line(), "→ " + self.verdict(), self._footer()]
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in ("", "", "median", "95% CI"))
        body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>" for r in self._rows())
        return (f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
                f"<p>{html.escape(self._speedup_line())}<br><b>→ {html.escape(self.verdict())}</b><br>"
                f"<small>{html.escape(self._footer())}</small></p>")

    @classmethod
    def from_samples(cls, samples_a: Sequence[float], samples_b: Sequence[float], *, label_a: str = "A",
                     label_b: str = "B", threads: dict | None = None) -> "Comparison":
        """Build a comparison from paired per-round samples (same length)."""
        if len(samples_a) != len(samples_b):
            raise ValueError("paired samples must have the same length")
        ratios = [_ratio(x, y) for x, y in zip(samples_a, samples_b)]
        speedup, lo, hi = median_ci(ratios)
        return cls(a=Timing.from_samples(samples_a, label_a), b=Timing.from_samples(samples_b, label_b),
                   speedup=speedup, ci_low=lo, ci_high=hi, rounds=len(ratios), threads=dict(threads or {}),
                   label_a=label_a, label_b=label_b)


def _ratio(a: float, b: float) -> float:
    if b > 0:
        return a / b
    return math.inf if a > 0 else 1.0


def compare(fn_a: Callable[[], object], fn_b: Callable[[], object], *, label_a: str = "A", label_b: str = "B",
            warmup: int = 3, min_time: float = 0.5, min_rounds: int = 10, max_rounds: int = 2000,
            threads: dict | None = None, timer: Timer = time.perf_counter) -> Comparison:
    """Interleaved A/B timing (AB, BA, AB, ...); the speedup is the median of per-round ratios A/B."""
    if min_rounds < 1 or max_rounds < min_rounds:
        raise ValueError("need 1 <= min_rounds <= max_rounds")
    for _ in range(warmup):
        fn_a()
        fn_b()
    ta: list[float] = []
    tb: list[float] = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        spent = 0.0
        r = 0
        while r < max_rounds and (r < min_rounds or spent < min_time):
            order = ((fn_a, ta), (fn_b, tb)) if r % 2 == 0 else ((fn_b, tb), (fn_a, ta))
            for fn, out in order:
                t0 = timer()
                fn()
                dt = timer() - t0
                out.append(dt)
                spent += dt
            r += 1
    finally:
        if gc_was_enabled:
            gc.enable()
    return Comparison.from_samples(ta, tb, label_a=label_a, label_b=label_b, threads=threads)


def interleaved(fns: Mapping[str, Callable[[], object]], *, warmup: int = 3, min_time: float = 0.5,
                min_rounds: int = 10, max_rounds: int = 2000, timer: Timer = time.perf_counter) -> dict[str, list[float]]:
    """Per-round times of several candidates run interleaved, the order rotated every round (ABC, BCA, CAB,
    ...) so drift hits all alike; rounds go on until `min_rounds` and `min_time` seconds in all are reached.
    Any two of them make a paired `Comparison.from_samples`."""
    if min_rounds < 1 or max_rounds < min_rounds:
        raise ValueError("need 1 <= min_rounds <= max_rounds")
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    out: dict[str, list[float]] = {n: [] for n in names}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        spent, r = 0.0, 0
        while r < max_rounds and (r < min_rounds or spent < min_time):
            k = r % len(names)
            for n in names[k:] + names[:k]:
                t0 = timer()
                fns[n]()
                dt = timer() - t0
                out[n].append(dt)
                spent += dt
            r += 1
    finally:
        if gc_was_enabled:
            gc.enable()
    return out


def comparisons_table(comparisons: Mapping[str, Comparison],
                      header: Sequence[str] = ("", "A", "B", "A/B", "95% CI", "verdict")) -> str:
    """Several comparisons as one table, a row each: A's and B's medians, the paired ratio A/B, its CI, the verdict.

    The verdict is brief ('B faster', 'no clear difference'): the ratio and its interval are beside it."""
    rows = [[name, format_seconds(c.a.median), format_seconds(c.b.median), f"{c.speedup:.2f}x",
             f"{c.ci_low:.2f}-{c.ci_high:.2f}", c.verdict(brief=True)] for name, c in comparisons.items()]
    return "\n".join(text_table(list(header), rows))


def _threads_of(sess) -> dict:
    so = sess.get_session_options()
    return {"intra_op": so.intra_op_num_threads, "inter_op": so.inter_op_num_threads}


def compare_models(model_a, model_b, *, level_a: str = "disable", level_b: str = "disable", threads: int = 1,
                   feeds: dict | None = None, seed: int = 0, dims: dict[str, int] | None = None,
                   custom_ops_library: str | None = None, **kw) -> Comparison:
    """Interleaved comparison of two models' onnxruntime runs on the same inputs (1 intra-op thread by default)."""

    runtime.quiet_onnxruntime()
    sa = runtime.session(model_a, level_a, threads, inter_threads=1, custom_ops_library=custom_ops_library)
    sb = runtime.session(model_b, level_b, threads, inter_threads=1, custom_ops_library=custom_ops_library)
    if feeds is None:
        feeds = runtime.make_feeds(model_a, seed=seed, dims=dims, sess=sa)
    fa = {k: v for k, v in feeds.items() if k in {i.name for i in sa.get_inputs()}}
    fb = {k: v for k, v in feeds.items() if k in {i.name for i in sb.get_inputs()}}
    na = [o.name for o in sa.get_outputs()]
    nb = [o.name for o in sb.get_outputs()]
    suffix = level_a != level_b
    kw.setdefault("label_a", f"A ({level_a})" if suffix else "A")
    kw.setdefault("label_b", f"B ({level_b})" if suffix else "B")
    ta, tb = _threads_of(sa), _threads_of(sb)
    reported = ta if ta == tb else {f"{k}_a": v for k, v in ta.items()} | {f"{k}_b": v for k, v in tb.items()}
    kw.setdefault("threads", reported)
    return compare(lambda: sa.run(na, fa), lambda: sb.run(nb, fb), **kw)


def session_at_each_level(model, threads: int = 1) -> dict:
    """{level: InferenceSession} for every onnxruntime optimisation level, log noise silenced."""

    runtime.quiet_onnxruntime()
    return {level: runtime.session(model, level, threads, inter_threads=1) for level in runtime.LEVELS}


# --------------------------------------------------------------------------------------------------
# the machine
# --------------------------------------------------------------------------------------------------

def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_info() -> dict:
    """CPU model, logical/usable cores, and the versions that matter (python, numpy, onnx, onnxruntime...)."""

    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    info = {
        "cpu": _cpu_model(),
        "machine": platform.machine(),
        "logical_cores": os.cpu_count() or 1,
        "usable_cores": usable,
        "os": platform.system(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "onnxruntime_providers": ", ".join(onnxruntime.get_available_providers()),
    }
    for dist, key in (("onnx-ir", "onnx_ir"), ("matplotlib", "matplotlib"), ("netron", "netron")):
        try:
            info[key] = version(dist)
        except Exception:  # not installed
            info[key] = "not installed"
    return info
