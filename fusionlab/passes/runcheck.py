"""The safety net runs the model: a fused model must load, run, and (unless told not to) agree with the original.

`run_check(original, fused, compare=True)` is what `fuse(validate=True)` and `apply(validate=True)` do after the
static checks (`validate.problems`): onnxruntime (optimisations off) loads the fused model and runs it once on
small random inputs, symbolic dimensions bound to distinct sizes (2, 3, 4, ... by name, so a rewrite that swaps
two dimensions or bakes one in fails), and, with `compare`, the original runs on the same inputs and every
output is compared with `fusionlab.verification.runtime`'s tolerances (fp32 rtol 1e-4 / atol 1e-5 scaled by the output's
magnitude; half-precision outputs also against a float32 run of the original). The failures:

- the fused model does not load, does not run, or disagrees: `RunFailure` (the caller turns it into a
  `FusionError` naming the pass, rule and group after which it first fails);
- onnxruntime cannot load the *original* either (a bfloat16 Add, training-only contrib ops): `ModelError`
  naming the user's model — nothing fusionlab writes could be checked by running it;
- the original itself does not run on random inputs (a shape-inconsistent test graph, an index input the
  binding puts out of range; tried with the distinct sizes, then with `runtime.make_feeds`' default binding):
  nothing can be judged; the check says so (`RunCheck.ran` False, `note`) instead of blaming either model.

Outputs that depend on a random op (training-mode Dropout) are compared by shape and dtype only. Without
`compare` (the CLI's `--no-verify`) the fused model still runs; the original is loaded and run only when the
fused model fails, to tell whose failure it is. One run each: the sessions and the draw are kept on the
`RunCheck` so `fuse --verify` reuses them.

Limits, so the check stays cheap: when the distinct sizes would make the inputs larger than `SMALL_FEED_BYTES`
(big static dims), the symbolic dims take `make_feeds`' default binding instead; a model whose inputs would
still take more than `MAX_FEED_BYTES` is loaded but not run (the note says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..graph import Graph, ModelError
from ..shapes import dim_value
from ..verification.compare import accepted, judge_output
from ..verification.judge import CANNOT_RUN, Case, excuse
from ..verification.precision import Reference
from ..verification.runtime import _ORT_TYPES, make_feeds, random_sources, run, session, verify

__all__ = ["RunCheck", "RunFailure", "run_check", "net_dims", "MAX_FEED_BYTES", "SMALL_FEED_BYTES", "SIZES"]

#: sizes symbolic dimensions take in the check's run, in order of their sorted names (cycled)
SIZES = (2, 3, 4, 5, 6, 7)
#: the largest total input size the check runs a model on
MAX_FEED_BYTES = 256 * 2**20
#: above this, the distinct sizes give way to the default binding (batch 1, sequence 8, others 1)
SMALL_FEED_BYTES = 32 * 2**20


class RunFailure(Exception):
    """The fused model failed to load or run, or disagrees with the original: fusionlab's fault."""

    def __init__(self, problem: str, feeds: dict | None = None):
        self.problem = problem
        self.feeds = feeds  # the inputs it disagreed on (the fuzzer's judge re-judges on them)
        super().__init__(problem)


@dataclass
class RunCheck:
    """What the run found, and the sessions and inputs it used (reused by the CLI's verification)."""

    ran: bool = False
    compared: bool = False
    note: str = ""
    dims: dict = field(default_factory=dict)
    feeds: dict | None = None
    original_session: object = None
    fused_session: object = None
    max_abs: float | None = None

    def summary(self) -> str:
        if not self.ran:
            return f"not run: {self.note}"
        what = "ran and agreed with the original" if self.compared else "ran (not compared)"
        dims = ", ".join(f"{k}={v}" for k, v in sorted(self.dims.items()))
        return what + (f" (dims {dims})" if dims else "") + (f"; {self.note}" if self.note else "")


def _symbolic_names(sess) -> list[str]:
    names = set()
    for i in sess.get_inputs():
        for d in i.shape:
            if isinstance(d, str) and d:
                names.add(d)
    return sorted(names)


def net_dims(sess, dims: dict | None = None) -> dict[str, int]:
    """Distinct sizes for the symbolic dims of a session's inputs (2, 3, 4, ... by sorted name); `dims` wins."""
    out = {name: SIZES[k % len(SIZES)] for k, name in enumerate(_symbolic_names(sess))}
    out.update(dims or {})
    return out


def _feed_bytes(sess, dims: dict) -> int:
    total = 0
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) and d >= 0 else dim_value(str(d), dims) for d in i.shape]
        item = np.dtype(_ORT_TYPES.get(i.type, np.float32)).itemsize
        total += int(np.prod(shape, dtype=np.int64)) * item
    return total


def _load(model: Graph):
    return session(model, "disable")


def _run(sess, feeds: dict, source: str) -> dict:
    return run(sess, {n: v for n, v in feeds.items() if n in {i.name for i in sess.get_inputs()}}, source=source)


def _original_session(original: Graph, holder: dict):
    """The original's session (made once); ModelError naming the user's model when onnxruntime cannot load it."""
    if "sess" not in holder:
        try:
            holder["sess"] = _load(original)
        except ModelError as exc:
            raise ModelError(original.name, f"{exc.problem} (fusionlab checks every rewrite by running the model "
                                            "with onnxruntime, so it cannot fuse this one)") from None
    return holder["sess"]


def _draws(original: Graph, sess, dims: dict | None):
    """The bindings to try, in order: distinct sizes, then `make_feeds`' default binding (batch 1, sequence 8)."""

    given = dict(dims or {})
    default = {**{n: dim_value(n, given) for n in _symbolic_names(sess)}, **given}
    first = net_dims(sess, given)
    if _feed_bytes(sess, first) > SMALL_FEED_BYTES:
        first = default
    tried = []
    for binding in (first, default):
        key = tuple(sorted(binding.items()))
        if key in tried:
            continue
        tried.append(key)
        yield binding, (lambda b=binding: make_feeds(original, seed=0, dims=b, sess=sess))


def run_check(original: Graph, fused: Graph, *, compare: bool = True, dims: dict | None = None,
              sessions: dict | None = None) -> RunCheck:
    """Load and run `fused` once (and compare it with `original`); see the module docstring. `sessions` (a dict
    the caller keeps) holds the original's session across calls (the search for the group to blame)."""
    holder = sessions if sessions is not None else {}
    check = RunCheck(compared=False)
    if not len(fused.graph.outputs):
        check.note = "the model has no outputs"
        return check
    try:
        fused_sess = _load(fused)
    except ModelError as exc:
        _original_session(original, holder)  # the user's model first: onnxruntime may not load it either
        raise RunFailure(f"onnxruntime cannot load the fused model: {exc.problem.removeprefix('onnxruntime cannot load it: ')}") from None
    check.fused_session = fused_sess
    if compare:
        check.original_session = _original_session(original, holder)
    for binding, make in _draws(original, fused_sess, dims):
        if _feed_bytes(fused_sess, binding) > MAX_FEED_BYTES:
            check.note = f"the inputs would take over {MAX_FEED_BYTES >> 20} MiB; loaded, not run"
            return check
        try:
            feeds = make()
        except ModelError as exc:  # an input type random inputs cannot be made for (strings)
            check.note = exc.problem
            return check
        expected = None
        if compare:
            try:
                expected = _run(check.original_session, feeds, original.name)
            except ModelError as exc:
                check.note = f"the original does not run on random inputs ({exc.problem})"
                continue
        try:
            got = _run(fused_sess, feeds, "the fused model")
        except ModelError as exc:
            if expected is None:  # not compared: is it the original's failure too?
                try:
                    _run(_original_session(original, holder), feeds, original.name)
                except ModelError as orig_exc:
                    check.note = f"the original does not run on random inputs ({orig_exc.problem})"
                    continue
            raise RunFailure(f"onnxruntime fails to run the fused model (dims {_dims_text(binding)}): "
                             f"{exc.problem.removeprefix('onnxruntime failed to run it: ')}") from None
        check.ran, check.dims, check.feeds, check.note = True, binding, feeds, ""
        if compare:
            _compare(original, fused, check, expected, got)
            check.compared = True
        return check
    return check


def _dims_text(dims: dict) -> str:
    return "{" + ", ".join(f"{k}={v}" for k, v in sorted(dims.items())) + "}" if dims else "static"


def _compare(original: Graph, fused: Graph, check: RunCheck, expected: dict, got: dict) -> None:
    """RunFailure unless every output agrees (runtime.verify's element rules, one draw)."""

    random = random_sources(original)
    for name, a in expected.items():
        if name not in got:
            raise RunFailure(f"the fused model does not compute output {name!r}")
        b = got[name]
        if np.shape(a) != np.shape(b) or np.asarray(a).dtype != np.asarray(b).dtype:
            raise RunFailure(f"output {name!r} is {np.shape(b)}/{np.asarray(b).dtype} where the original's is "
                             f"{np.shape(a)}/{np.asarray(a).dtype} (dims {_dims_text(check.dims)})")
    report = verify(original, None, feeds=check.feeds, original_session=check.original_session,
                    fused_session=check.fused_session, reference="auto", expected=expected, got=got)
    check.max_abs = report.max_abs
    bad = [o for o in report.outputs if not o.ok and not random.get(o.name) and "nondeterministic" not in o.problem]
    skipped = sorted({o.name for o in report.outputs if not o.ok} - {o.name for o in bad})
    if skipped:
        check.note = f"output(s) {', '.join(skipped[:3])} not compared: the original is nondeterministic"
    if bad:
        excused = _rounding(original, fused, check, expected, got, [o.name for o in bad])
        if excused:
            check.note = "; ".join(filter(None, [check.note, excused]))
            return
        o = bad[0]
        raise RunFailure(f"the fused model disagrees with the original on random inputs (dims "
                         f"{_dims_text(check.dims)}): output {o.name!r} max abs error {o.max_abs:.3g} "
                         f"(tolerance atol {o.atol:.1e}, rtol {o.rtol:.0e}; {o.problem})", feeds=check.feeds)


def _rounding(original: Graph, fused: Graph, check: RunCheck, expected: dict, got: dict, names: list[str]) -> str:
    """Why outputs outside the tolerance are still a rewrite that only rounds differently (empty: they are not).

    The fuzzer's judge's excuses, on the very inputs this check ran: every element is no further from a float64
    run of the original than the original is (`compare.accepted`: up to a factor 2 and the tolerance; 10 where the
    original itself misses float64); else `fuzz.judge.excuse`, the judge's own function: the output deviates from the
    original by at most twice what moving the original's float inputs by two ulps, or its stored float parameters
    by one ulp of their dtype, does to it (an ill-conditioned output; a weight fold rounds the folded weights once
    more), a NaN/Inf counting only where one of those runs holds it; or every rewritten part, fed the original's
    own values, computes what the original's part does (rounding that the ops after it amplify). An integer output
    computed from floats (MaxPool's indices, an argmax) is judged as the judge does: exactly, except elements
    that moving the original's float inputs by a few ulps flips too (`Case.unstable`; campaign 24, model 3414).
    The net and the judge once excused on different runs and disagreed on a borderline fp16 case (campaign 21,
    model 3976).
    """

    proto = original.to_proto()
    try:
        reference = Reference(proto).run(check.feeds)
    except CANNOT_RUN:  # no float64 run possible: the sensitivities alone
        reference = {}
    left = []
    for name in names:
        o, f = np.asarray(expected[name]), np.asarray(got[name])
        if o.dtype.kind != "f" or not accepted(o, f, reference.get(name)).all():
            left.append(name)
    if not left:
        return "outside the tolerance, as near a float64 run of the original as the original is"
    case = Case(proto, feeds=[check.feeds], session=check.original_session, outputs=[expected])
    fused_proto = fused.to_proto()
    why = ""
    for name in left:
        o, f = np.asarray(expected[name]), np.asarray(got[name])
        if o.dtype.kind not in "fc" and judge_output(o, f, ignore=case.unstable(0, name)) is None:
            # the judge's rule for integer outputs computed from floats (campaign 24, model 3414)
            why = why or (f"integer output {name!r} differs only where moving the original's float inputs by a "
                          f"few ulps changes it too (an argmax of values that tie to rounding)")
            continue
        why = excuse(case, 0, fused_proto, name, o, f)
        if not why:
            return ""
    return f"outside the tolerance, {why}"
