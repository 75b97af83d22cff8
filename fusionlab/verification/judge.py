"""The judge's excuses: when a fused output that is not close to the original's is still what the original computes.

`Case` holds a model with its input draws, the original's outputs, its sensitivity to 2-ulp input changes and
to one-ulp parameter changes, and (on demand) a float64 reference. `excuse(case, k, fused, name, o, f)` says why
a difference on draw k is rounding and not a changed function, or returns '': within twice the original's own
sensitivity (ill-conditioned), or every part of the fused graph, fed the original's values, computes what the
original does (`_amplified_downstream`). The fuzzer's oracle (`fusionlab.fuzz.oracle`) and fuse()'s safety net
(`fusionlab.passes.runcheck`) judge with the same excuses; the rules are in docs/fuzz.md, "How outcomes are
decided".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import onnx
import onnx.inliner
import onnx.numpy_helper
from onnxruntime.capi import onnxruntime_pybind11_state as _ort_state

from .compare import accepted as _close, deviation as _deviation, judge_output, spread as _spread, within_rounding
from .feeds import Draw, draws, feeds_for, session as _session
from .precision import Reference, ReferenceUnavailable, convert
from .rounding import rounded_runs

__all__ = ["Case", "excuse", "input_runs", "parameter_runs", "CANNOT_RUN"]


def _nudged(v: np.ndarray, rng, ulps: float = 1.0, dtype=None) -> np.ndarray:
    """A float array moved by up to `ulps` ulps of `dtype` (its own by default); others unchanged."""
    if v.dtype.kind != "f":
        return v
    eps = np.finfo(dtype or v.dtype).eps
    return np.asarray(v * (1 + ulps * eps * rng.uniform(-1, 1, v.shape))).astype(v.dtype)


def input_runs(sess, feeds: dict, ulps: float, seed: int, n: int = 4) -> list[dict]:
    """`n` runs of a session with every float input moved by up to `ulps` ulps ({output: array} each)."""
    rng = np.random.default_rng(seed)
    names = [o.name for o in sess.get_outputs()]
    runs = []
    for _ in range(n):
        moved = {k: _nudged(v, rng, ulps) for k, v in feeds.items()}  # overridden initializers too
        runs.append(dict(zip(names, sess.run(None, moved))))
    return runs


def parameter_runs(model: onnx.ModelProto, feeds: dict, seed: int, n: int = 4) -> list[dict]:
    """`n` runs of `model` with every stored float parameter (initializers, Constant tensors) moved by up to one ulp
    of its own dtype: the rounding that storing the parameters in that dtype implies, and all a weight fold changes
    (the folded weights are rounded once more). Empty when a perturbed copy cannot be run."""
    rng = np.random.default_rng(seed)
    runs = []
    for _ in range(n):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        tensors = list(m.graph.initializer) + [a.t for node in m.graph.node if node.op_type == "Constant"
                                               for a in node.attribute if a.name == "value"]
        for t in tensors:
            a = onnx.numpy_helper.to_array(t)
            if a.dtype.kind == "f" and a.size:
                t.CopyFrom(onnx.numpy_helper.from_array(_nudged(a, rng), t.name))
        try:
            sess = _session(m)
            names = [o.name for o in sess.get_outputs()]
            wanted = {i.name for i in m.graph.input}  # overridable initializers included
            runs.append(dict(zip(names, sess.run(None, {k: v for k, v in feeds.items() if k in wanted}))))
        except Exception:  # noqa: BLE001 - cannot perturb: no sensitivity from parameters
            return []
    return runs


class Case:
    """An original model with its draws, its outputs on them and (on demand) its float64 reference outputs."""

    def __init__(self, model: onnx.ModelProto, n_draws: int = 3, options: dict | None = None, *,
                 feeds: list[dict] | None = None, session=None, outputs: list[dict] | None = None):
        """The fuzzer's `n_draws` draws of `model`, or (`feeds`) the given inputs: the ones `fuse()`'s safety net
        ran, so that it and the judge excuse rounding on the same runs (`excuse`). `session` and `outputs` (the
        original's session and its outputs on `feeds`) save a second load and run."""
        self.model = model
        self.options = dict(options or {})
        if feeds is None:
            self.draws = draws(model, n_draws)
            self.feeds = [feeds_for(model, d) for d in self.draws]
        else:
            self.draws = [Draw(0, seed=k) for k in range(len(feeds))]
            self.feeds = [dict(f) for f in feeds]
        sess = session if session is not None else _session(model)
        self._sess = sess
        self.names = [o.name for o in sess.get_outputs()]
        self.outputs = outputs if outputs is not None else [dict(zip(self.names, sess.run(None, f))) for f in self.feeds]
        self._ref: list | None = None
        self.reference_engine = ""
        self.reference_problem = ""  # why there is no float64 reference, when there is none
        self._unstable: dict = {}

    def _perturbed(self, k: int, ulps: float) -> list[dict]:
        """The original's outputs of draw `k` with every float input moved by up to `ulps` ulps (4 runs)."""
        key = ("perturbed", k, ulps)
        if key not in self._unstable:
            self._unstable[key] = input_runs(self._sess, self.feeds[k], ulps, 77 + k)
        return self._unstable[key]

    def sensitivity(self, k: int, name: str) -> np.ndarray:
        """Per element, how far float output `name` of draw `k` moves when the float inputs move by two ulps.

        Infinite where a perturbed run turns a finite value non-finite or the other way round (or changes
        the kind of NaN/Inf); 0 where it stays the same NaN/Inf.
        """
        return _spread(self.outputs[k][name], [run[name] for run in self._perturbed(k, 2.0)])

    def parameter_sensitivity(self, k: int, name: str) -> np.ndarray:
        """Per element, how far float output `name` of draw `k` moves when the stored float parameters move.

        Every float initializer and Constant tensor is moved by up to one ulp of its own dtype (4 runs):
        the rounding that storing these parameters in that dtype implies, and all a weight fold changes
        (the folded weights are rounded once more). Infinite where a run changes finiteness.
        """
        return _spread(self.outputs[k][name], [run[name] for run in self._parameter_runs(k)])

    def _parameter_runs(self, k: int) -> list[dict]:
        key = ("params", k)
        if key not in self._unstable:
            self._unstable[key] = parameter_runs(self.model, self.feeds[k], 91 + k)
        return self._unstable[key]

    def sensitivity_runs(self, k: int) -> list[dict]:
        """The original's outputs of draw `k` with its float inputs moved by two ulps, then with its stored float
        parameters moved by one (`sensitivity`, `parameter_sensitivity`): what `compare.within_rounding` judges by."""
        return list(self._perturbed(k, 2.0)) + list(self._parameter_runs(k))

    def unstable(self, k: int, name: str) -> np.ndarray:
        """Elements of integer output `name` (draw `k`) that change when the float inputs move by a few ulps.

        An integer output computed from floats (MaxPool indices: an argmax) flips where two candidates
        tie to rounding; there any rewrite that changes rounding may flip it too, and it is not judged.
        """
        if (k, name) not in self._unstable:
            base = np.asarray(self.outputs[k][name])
            mask = np.zeros(base.shape, dtype=bool)
            for run in self._perturbed(k, 4.0):
                again = np.asarray(run[name])
                if again.shape == base.shape:
                    mask |= again != base
            self._unstable[(k, name)] = mask
        return self._unstable[(k, name)]

    def reference(self, k: int) -> dict | None:
        """Float64 outputs of draw `k` (None if neither onnxruntime nor onnx.reference can run the model)."""
        if self._ref is None:
            try:
                ref = Reference(self.model)
                self.reference_engine = ref.engine
                with np.errstate(all="ignore"):
                    self._ref = [ref.run(f) for f in self.feeds]
            except CANNOT_RUN as exc:  # no reference: judged against the original alone, and the outcome says so
                self._ref = [None] * len(self.feeds)
                self.reference_engine = "none"
                self.reference_problem = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return self._ref[k]


def excuse(case: Case, k: int, fused: onnx.ModelProto, name: str, o, f) -> str:
    """Why output `name` of `fused` on draw `k`, outside the tolerance, is still only the original's rounding moved
    ('' when it is not): within what two-ulp input or one-ulp parameter changes do to the original
    (`_ill_conditioned`), or every rewritten part, fed the original's own values, computes what the original's part
    does (`_amplified_downstream`). The one excuse of both the judge and `fuse()`'s safety net
    (`passes.runcheck`), which builds its `Case` from the inputs it ran: the two see the same runs."""
    return _ill_conditioned(case, k, name, o, f) or _amplified_downstream(case, k, fused)


def _ill_conditioned(case: Case, k: int, name: str, o, f) -> str:
    """A note when the fused output is what the original computes with its float inputs moved by two ulps or its
    stored parameters by one (`compare.within_rounding`, shared with `fuse()`'s safety net)."""
    o, f = np.asarray(o), np.asarray(f)
    if o.shape != f.shape or o.dtype.kind != "f":
        return ""
    runs = [run[name] for run in case.sensitivity_runs(k) if name in run]
    ok = within_rounding(o, f, runs)
    if not ok.all():
        return ""
    dev = _deviation(o, f)
    if not (dev > 0).any():
        return ""
    sens = _spread(o, runs)
    k_bad = int(np.argmax(np.where(np.isfinite(dev), dev, np.inf)))
    return (f"ill-conditioned: two-ulp input or one-ulp parameter changes move the original by up to "
            f"{sens.flat[k_bad]:.3g} there")


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    typed = onnx.shape_inference.infer_shapes(model)
    return {vi.name: vi.type.tensor_type.elem_type for vi in
            list(typed.graph.value_info) + list(typed.graph.output) + list(typed.graph.input)}


def _with_outputs(model: onnx.ModelProto, names: list[str], known: dict[str, int] | None = None) -> onnx.ModelProto:
    """A copy of `model` that also returns the values `names` (element type from shape inference, else from
    `known`: a contrib op onnx cannot infer leaves the values after it untyped)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    elem = {**(known or {}), **{n: t for n, t in _elem_types(m).items() if t}}
    have = {o.name for o in m.graph.output}
    for n in names:
        if n not in have and elem.get(n):
            m.graph.output.append(onnx.helper.make_tensor_value_info(n, elem[n], None))
    return m


def _fed(model: onnx.ModelProto, values: dict, produced: set) -> tuple[onnx.ModelProto, dict[str, str]]:
    """A copy of `model` whose nodes read each value of `values` that `produced` holds from a new graph input.

    Returns the copy and {value: input name}; the inputs are typed from `values` (the original's run).
    """
    local = onnx.ModelProto()
    local.CopyFrom(model)
    fed: dict[str, str] = {}
    for n in local.graph.node:
        for i, name in enumerate(n.input):
            if name in values and name in produced:
                fed.setdefault(name, f"{name}__from_original")
                n.input[i] = fed[name]
    for name, alias in fed.items():
        a = np.asarray(values[name])
        local.graph.input.append(onnx.helper.make_tensor_value_info(
            alias, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)))
    return local, fed


def _original_names(model: onnx.ModelProto, made: dict) -> onnx.ModelProto:
    """Inlined function bodies with their values' names back: onnx's inliner writes `mul24__1` for the body's
    `mul24`, and a mixed-pass function keeps the names of the original values it computes. A name goes back
    only where the original made it and nothing in the graph has it already; every value cut there is still
    compared with the original's, so a body value under another's name is a difference, not an excuse."""
    taken = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}
    back: dict[str, str] = {}
    for n in model.graph.node:
        for o in n.output:
            base = re.sub(r"__\d+$", "", o)
            if base != o and base in made and base not in taken and base not in back.values():
                back[o] = base
    for n in model.graph.node:
        n.input[:] = [back.get(i, i) for i in n.input]
        n.output[:] = [back.get(o, o) for o in n.output]
    return model


def _run(sess, feeds: dict) -> dict:
    """{output name: value} of one onnxruntime run."""
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


#: what onnx, onnxruntime or the float64 reference raise when a part of a graph cannot be typed,
#: inlined, loaded or run: the judge then cannot look inside and gives no note. Anything else raised while it
#: looks is a bug of the judge and propagates.
CANNOT_RUN = (*(e for e in vars(_ort_state).values() if isinstance(e, type) and issubclass(e, Exception)),
              onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ReferenceUnavailable)


@dataclass
class _Cut:
    """Both graphs cut at the values they share, run on draw k: the original's values there (`raw` at working
    precision, float32 for a float16 model) and the fused graph's parts fed those values (`got`)."""

    original: onnx.ModelProto  # with the shared values as outputs (float32 for a float16 model)
    feeds: dict
    produced: set
    shared: list
    raw: dict
    got: dict
    half: bool

    def judged(self, v: np.ndarray) -> np.ndarray:
        """A value as the judge compares it: rounded back to float16 for a float16 model."""
        return v.astype(np.float16) if self.half and v.dtype == np.float32 else v


def _cut(case: Case, k: int, fused: onnx.ModelProto) -> _Cut | None:
    """The two graphs run at their shared values on draw k; None when they share none or a shared value cannot
    be typed. Raises what `CANNOT_RUN` lists when a part cannot be inlined, loaded or run."""
    made = {o: n for n in case.model.graph.node for o in n.output if o}
    if fused.functions:  # a function's body is parts too: inline it, its values under their own names
        fused = _original_names(onnx.inliner.inline_local_functions(fused), made)
    produced = {o for n in fused.graph.node for o in n.output if o}
    shared = [o for n in fused.graph.node for o in n.output if o in made]
    if not shared:
        return None
    original, feeds = case.model, case.feeds[k]
    half = any(v.dtype == np.float16 for v in feeds.values()) or any(
        t.data_type == onnx.TensorProto.FLOAT16 for t in original.graph.initializer)
    if half:
        # onnxruntime computes a float16 chain in float32 between its own casts, so the original's values read out
        # as float16 are not what its next op used; both graphs run in float32 here, and their values are rounded
        # to float16 only to be judged
        original, fused = convert(original, onnx.TensorProto.FLOAT), convert(fused, onnx.TensorProto.FLOAT)
        feeds = {n: (v.astype(np.float32) if v.dtype == np.float16 else v) for n, v in feeds.items()}
    original = _with_outputs(original, shared)
    raw = _run(_session(original), feeds)
    local, fed = _fed(_with_outputs(fused, shared, _elem_types(original)), raw, produced)
    wanted = {i.name for i in local.graph.input}
    local_feeds = {**{n: v for n, v in feeds.items() if n in wanted}, **{a: raw[n] for n, a in fed.items()}}
    got = _run(_session(local), local_feeds)
    if any(o not in raw or o not in got for o in shared):
        return None
    return _Cut(original, feeds, produced, shared, raw, got, half)


def _original_parts(cut: _Cut, k: int, computed_in: dict) -> tuple[dict, dict, list[dict]]:
    """The original's parts fed its own values at the cuts: (float64 values, working-precision values, runs with
    the inputs moved by one ulp and, where it can be replayed, every op's own rounding replayed at random)."""
    parts, pfed = _fed(cut.original, cut.raw, cut.produced)
    wanted = {i.name for i in parts.graph.input}
    pfeeds = {**{n: v for n, v in cut.feeds.items() if n in wanted}, **{a: cut.raw[n] for n, a in pfed.items()}}
    ref_out = Reference(parts).run(pfeeds)
    psess = _session(parts)
    base = _run(psess, pfeeds)
    rng = np.random.default_rng(53 + k)
    nudged = [{n: _nudged(v, rng, dtype=np.float16 if cut.half else None) for n, v in pfeeds.items()}
              for _ in range(4)]
    runs = [_run(psess, f) for f in nudged]
    try:  # where the original was lucky: its ops' rounding replayed
        runs += rounded_runs(parts, nudged, rng, computed_in)
    except CANNOT_RUN:  # an op the replay cannot run: the one-ulp input spread alone
        pass
    return ref_out, base, runs


def _amplified_downstream(case: Case, k: int, fused: onnx.ModelProto) -> str:
    """A note when every part of the fused graph, fed the original's own values, computes what the original does.

    The values the two graphs share (same name) cut the fused graph into parts: each rewritten group (a fused
    node, a function call) and each node the fusion left alone. Every shared value a fused node reads is fed
    from the original's run on draw `k`, so each part is judged on exactly the inputs the original gave it;
    every shared value it makes is then compared with the original's (rule 1, the project's tolerance). When
    all are close, each rewrite computed the same within tolerance, and the difference at the outputs is
    rounding that the ops both graphs run amplify (an fp16 division by a mean that nearly cancels, a square
    root near 0). A shared float value that is not close is still accepted element by element when it is as
    near the original's own part computed in float64 from the same values (`compare.accepted` with that part
    as reference: a LayerNormalization of a row constant to rounding, where the decomposed graph's mean misses
    by one ulp and epsilon 1e-12 amplifies it a million times), or when the original's part moves at least
    half as far with what it is fed moved by one ulp and each of its ops' results moved within that op's
    rounding (`rounding.rounded_runs`): a value the original's own evaluation could have produced; a shared
    integer value must be equal. '' otherwise, also when a shared value cannot be typed or a part cannot be run
    (`CANNOT_RUN`).
    """
    try:
        cut = _cut(case, k, fused)
    except CANNOT_RUN:
        return ""
    if cut is None:
        return ""
    with np.errstate(over="ignore"):
        orig = {n: cut.judged(v) for n, v in cut.raw.items()}
        got = {n: cut.judged(v) for n, v in cut.got.items()}
    off = [o for o in cut.shared if judge_output(orig[o], got[o]) is not None]
    if not off:
        return (f"amplified downstream: fed the original's values, every part of the fused graph computes the "
                f"{len(cut.shared)} values it shares with the original within tolerance")
    computed_in = {n: onnx.helper.tensor_dtype_to_np_dtype(t) for n, t in _elem_types(case.model).items() if t}
    try:
        ref_out, base, runs = _original_parts(cut, k, computed_in)
    except CANNOT_RUN:
        return ""
    for o in off:  # per element: accepted against the part's float64 value, or within its rounding spread
        a, f = np.asarray(orig[o]), np.asarray(got[o])
        if a.shape != f.shape or a.dtype != f.dtype or a.dtype.kind != "f" or o not in base:
            return ""
        dev = _deviation(a, f)
        near = np.isfinite(dev) & (dev <= 2 * _spread(cut.judged(base[o]), [cut.judged(r[o]) for r in runs]))
        if not np.all(near | _close(a, f, ref_out.get(o))):
            return ""
    return (f"ill-conditioned part: fed the original's values, the fused graph's {', '.join(off[:3])} differ, "
            f"where not within tolerance, no more than the original's part computed in float64 allows or twice "
            f"what one-ulp changes of their inputs and their ops' own rounding move them")
