"""What every exercise shares: the verdict a learner reads, and the loop that grades an answer case by case.

An exercise is a list of hidden `Case`s and a `judge(answer, case)` that returns None when the answer is right on
that case, or one sentence saying what is wrong. `grade` runs the cases in order and stops at the first that
fails, so the hint names it ("case 3 of 8: Conv with group=2 -> ..."). An answer that is still the notebook's stub
(`...`, None, or code that raises NotImplementedError or returns `...`) gets NOT ANSWERED YET, never a traceback;
an answer that raises anything else fails on the case it raised on, with the exception in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..text import wrap

__all__ = ["Case", "Verdict", "NotAnswered", "AnswerRaised", "attempt", "grade", "unanswered", "is_stub",
           "first_difference", "where", "weight_pair", "output_difference", "PASS", "FAIL",
           "UNANSWERED"]

PASS, FAIL, UNANSWERED = "PASS", "FAIL", "NOT ANSWERED YET"


class NotAnswered(Exception):
    """Raised by a judge when the answer is still the stub (it returned `...` or None where a value is due)."""


class AnswerRaised(Exception):
    """The learner's code raised: the message says what, in one line (`attempt` makes it)."""


def attempt(fn: Callable, *args, **kwargs):
    """Call the learner's `fn`: NotImplementedError and a `...` result mean not answered yet (`NotAnswered`), any
    other exception becomes `AnswerRaised` (a FAIL on the case at hand). The grader's own errors are not caught."""
    try:
        out = fn(*args, **kwargs)
    except NotImplementedError:
        raise NotAnswered from None
    except Exception as exc:  # noqa: BLE001 - the learner's code may raise anything; say what and where
        raise AnswerRaised(_one_line(exc)) from None
    if out is Ellipsis:
        raise NotAnswered
    return out


@dataclass(frozen=True)
class Case:
    """One hidden case: a short name the hint can quote, and whatever the judge needs."""

    name: str
    data: Any = None


@dataclass(frozen=True)
class Verdict:
    """The result of `check(answer)`: PASS with what was checked, FAIL with a hint naming the first failing case,
    or NOT ANSWERED YET. Prints the same on every run (it holds no timings and no object addresses)."""

    exercise: str
    status: str
    cases: tuple[str, ...] = ()
    passed: int = 0
    failed_case: str = ""
    hint: str = ""
    checked: str = ""  # what PASS means, in one sentence
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.status == PASS

    def __bool__(self) -> bool:
        return self.ok

    def lines(self) -> list[str]:
        total = len(self.cases)
        if self.status == PASS:
            head = f"PASS {self.exercise}: all {total} case{'s' if total != 1 else ''} right"
            body = [self.checked] if self.checked else []
            body += [f"  {i + 1}. {c}" for i, c in enumerate(self.cases)]
        elif self.status == UNANSWERED:
            head = f"{UNANSWERED} {self.exercise}"
            body = [self.hint or "the answer is still the stub: replace the `...` / NotImplementedError and run check "
                                 "again"]
        else:
            head = f"FAIL {self.exercise}: case {self.passed + 1} of {total}: {self.failed_case}"
            body = [f"-> {self.hint}"]
            if self.passed:
                body.append(f"({self.passed} earlier case{'s' if self.passed != 1 else ''} right)")
        return [head] + body + list(self.notes)

    def __str__(self) -> str:
        return wrap("\n".join(self.lines()), indent="   ")

    def __repr__(self) -> str:
        return str(self)

    def _repr_markdown_(self) -> str:
        lines = self.lines()
        word = self.status
        head = lines[0][len(word):]
        out = [f"**{word}**{_md(head)}", ""]
        for line in lines[1:]:
            stripped = line.strip()
            if stripped[:1].isdigit() and ". " in stripped:
                out.append(f"{stripped.split('. ', 1)[0]}. {_md(stripped.split('. ', 1)[1])}")
            else:
                out.append(_md(stripped))
                out.append("")
        return "\n".join(out).rstrip() + "\n"


def _md(text: str) -> str:
    """Text with the characters markdown would read as formatting escaped."""
    for ch in ("\\", "*", "_", "`", "[", "]", "<", ">", "|"):
        text = text.replace(ch, "\\" + ch)
    return text


def is_stub(value) -> bool:
    """Whether `value` is what a notebook ships before the learner answers: `...` or None."""
    return value is Ellipsis or value is None


def unanswered(exercise: str, hint: str = "") -> Verdict:
    return Verdict(exercise, UNANSWERED, hint=hint)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:200] if text else type(exc).__name__


def grade(exercise: str, answer, cases: Sequence[Case], judge: Callable[[Any, Case], str | None], *,
          checked: str = "", notes: Sequence[str] = (), task: str = "") -> Verdict:
    """Run `judge(answer, case)` on each case in order; the first that fails (or raises) ends the grading.

    `task` says what to write, for the NOT ANSWERED YET verdict."""
    todo = f"write {task} in the cell above, then run this cell again" if task else ""
    if is_stub(answer):
        return unanswered(exercise, todo)
    names = tuple(c.name for c in cases)
    for i, case in enumerate(cases):
        try:
            problem = judge(answer, case)
        except NotAnswered:
            return unanswered(exercise, todo)
        except AnswerRaised as exc:
            problem = f"your answer raised {exc}"
        if problem:
            return Verdict(exercise, FAIL, names, passed=i, failed_case=case.name, hint=problem, notes=tuple(notes))
    return Verdict(exercise, PASS, names, passed=len(cases), checked=checked, notes=tuple(notes))


def first_difference(got, want, rtol: float, atol: float) -> tuple[float, tuple[int, ...]] | None:
    """(largest |got - want| where the tolerance is broken, its index), or None when every element is within
    rtol * |want| + atol (NaN never is)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    err = np.abs(got - want)
    bad = ~(err <= atol + rtol * np.abs(want))
    if not bad.any():
        return None
    scored = np.where(bad, np.nan_to_num(err, nan=np.inf), -1.0)
    idx = np.unravel_index(int(np.argmax(scored)), want.shape)
    return float(err[idx]), tuple(int(i) for i in idx)


def where(err_at: tuple[float, tuple[int, ...]]) -> str:
    """`first_difference`'s answer as a hint reads it: "0.0123 at [1,0,2]"."""
    err, idx = err_at
    return f"{err:.3g} at [{','.join(map(str, idx))}]"


def weight_pair(got, fn: str, op: str, w_shape: tuple[int, ...], c_out: int, *,
                bias_none: str | None = None) -> tuple[np.ndarray, np.ndarray] | str:
    """A fold's answer `(W2, b2)` checked for what any layer needs: a pair, W2 of the weight's shape, one finite bias
    value per output channel. Returns the arrays, or the sentence saying what is wrong. `bias_none`: the sentence
    for b2 = None (None: take it as a bias of zeros). Raises NotAnswered for the stub."""
    if got is None:
        raise NotAnswered
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return f"{fn} must return a pair (W2, b2); it returned {type(got).__name__}"
    w2, b2 = got
    if is_stub(w2):
        raise NotAnswered
    if b2 is None and bias_none is not None:
        return bias_none
    w2 = np.asarray(w2)
    b2 = np.zeros(c_out) if b2 is None else np.asarray(b2)
    if w2.shape != tuple(w_shape):
        return f"W2 has shape {list(w2.shape)}; the {op} needs W's shape {list(w_shape)}"
    if b2.shape != (c_out,):
        return f"b2 has shape {list(b2.shape)}; a {op} bias has one value per output channel: [{c_out}]"
    if not (np.all(np.isfinite(w2)) and np.all(np.isfinite(b2))):
        return "W2 or b2 holds NaN or infinity"
    return w2, b2


def output_difference(have, want, rtol: float, atol: float) -> tuple[float, tuple[int, ...]] | None:
    """`first_difference` of a layer's output, the absolute tolerance scaled by the output's magnitude (at least 1)."""
    return first_difference(have, want, rtol, atol * max(1.0, float(np.max(np.abs(want)))))

