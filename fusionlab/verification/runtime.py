"""onnxruntime sessions, random feeds and the verification oracle.

Every fusion is checked the same way: run the original and the fused model on the same random inputs
and compare every output with per-dtype tolerances. The reference run uses onnxruntime with graph
optimisations off (`level="disable"`), so onnxruntime's own fusions cannot hide a wrong rewrite.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from ..graph import Graph, ModelError, has_external_tensors, load, onnx_opset, save_model
from ..shapes import dim_value
from .precision import Reference

__all__ = [
    "LEVELS", "TOLERANCES", "session", "model_bytes", "make_feeds", "run", "verify", "VerifyReport",
    "OutputCheck", "quiet_onnxruntime", "random_sources",
]

LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}

#: (rtol, atol) per dtype, after onnxruntime's and onnxoptimizer's defaults.
TOLERANCES = {
    np.dtype(np.float64): (1e-7, 1e-7),
    np.dtype(np.float32): (1e-4, 1e-5),
    np.dtype(np.float16): (1e-3, 2.5e-3),
}


def quiet_onnxruntime() -> None:
    """Silence onnxruntime's C++ warnings (they would land in notebook stderr)."""
    ort.set_default_logger_severity(3)


quiet_onnxruntime()


def model_bytes(model) -> bytes:
    """Serialised bytes of a Graph, onnx_ir.Model, ModelProto, path or bytes."""
    if isinstance(model, (bytes, bytearray)):
        return bytes(model)
    if isinstance(model, (str, os.PathLike)):
        return Path(model).read_bytes()
    if isinstance(model, Graph):
        model = model.model
    if isinstance(model, ir.Model):
        model = ir.serde.serialize_model(model)
    if isinstance(model, onnx.ModelProto):
        return model.SerializeToString()
    raise TypeError(f"cannot make a model from {type(model).__name__}")


def session(model, level: str = "disable", threads: int = 1, *, optimized_path: str | os.PathLike | None = None,
            inter_threads: int = 1, parallel: bool = False, enable_profiling: bool = False,
            profile_prefix: str | None = None, mem_arena: bool = True, custom_ops_library: str | None = None,
            session_options: ort.SessionOptions | None = None, disabled_optimizers: Sequence[str] = (),
            config: dict[str, str] | None = None) -> ort.InferenceSession:
    """An onnxruntime CPU session at a graph-optimisation level ('disable', 'basic', 'extended', 'all').

    `disabled_optimizers`: graph transformers and rewrite rules to leave out, by their onnxruntime names
    (`fusionlab.blame.ORT_TRANSFORMERS`); `config`: session config entries (e.g.
    {"optimization.enable_gelu_approximation": "1"})."""
    if level not in LEVELS:
        raise ValueError(f"unknown optimisation level {level!r}; choose from {sorted(LEVELS)}")
    so = session_options or ort.SessionOptions()
    so.graph_optimization_level = LEVELS[level]
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = inter_threads
    so.execution_mode = ort.ExecutionMode.ORT_PARALLEL if parallel else ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    so.enable_cpu_mem_arena = mem_arena
    if threads == 1:
        # Without this a single-threaded session still spins a worker: keep measurements honest.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if optimized_path is not None:
        so.optimized_model_filepath = str(optimized_path)
    if enable_profiling:
        so.enable_profiling = True
        if profile_prefix:
            so.profile_file_prefix = profile_prefix
    if custom_ops_library:
        so.register_custom_ops_library(custom_ops_library)
    for key, value in (config or {}).items():
        so.add_session_config_entry(key, str(value))
    tmpdir = None
    if isinstance(model, (str, os.PathLike)):
        src = str(model)
    elif isinstance(model, (Graph, ir.Model)) and has_external_tensors(model.model if isinstance(model, Graph) else model):
        # Weights over protobuf's 2 GiB limit: onnxruntime must read them from files beside the model.
        tmpdir = tempfile.TemporaryDirectory(prefix="fusionlab-")
        src = str(save_model(model, Path(tmpdir.name) / "model.onnx", external_data_threshold=0))
    else:
        src = model_bytes(model)
    try:
        sess = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"],
                                    **({"disabled_optimizers": list(disabled_optimizers)} if disabled_optimizers else {}))
        if tmpdir is not None:
            sess._fusionlab_tmpdir = tmpdir  # weights stay on disk while the session lives
        return sess
    except Exception as exc:  # onnxruntime raises its own exception types
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(_source(model), f"onnxruntime cannot load it: {msg}") from None


# --------------------------------------------------------------------------------------------------
# feeds
# --------------------------------------------------------------------------------------------------

_ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_, "tensor(int16)": np.int16, "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32, "tensor(uint64)": np.uint64,
}


def _index_bound(graph: Graph | None, input_name: str) -> int | None:
    """For an integer input feeding Gather(data, indices), the size of the gathered axis."""
    if graph is None:
        return None
    try:
        value = graph.value(input_name)
    except KeyError:
        return None
    bounds = []
    for use in value.uses():
        node = use.node
        if node.op_type == "Gather" and use.idx == 1:
            data = node.inputs[0]
            axis = node.attributes.get("axis")
            axis = axis.value if axis is not None else 0
            if data is not None and data.shape is not None and len(data.shape) > axis:
                dim = data.shape[axis]
                if isinstance(dim, int):
                    bounds.append(dim)
    return min(bounds) if bounds else None


def make_feeds(model, *, seed: int = 0, dims: dict[str, int] | None = None,
               shapes: dict[str, tuple] | None = None, sess: ort.InferenceSession | None = None) -> dict:
    """Random inputs for every model input, respecting dtypes.

    Floats are standard normal; integer inputs that index a Gather stay in range (token ids); inputs
    named like masks are all ones; dynamic dimensions get `dims[name]` or a sensible default (batch 1,
    sequence 8); `shapes` overrides an input's whole shape.
    """
    rng = np.random.default_rng(seed)
    dims = dict(dims or {})
    shapes = dict(shapes or {})
    graph = model if isinstance(model, Graph) else None
    if graph is None and not isinstance(model, ort.InferenceSession):
        try:
            graph = load(model_bytes(model), check=False)
        except Exception:
            graph = None
    sess = sess or (model if isinstance(model, ort.InferenceSession) else session(model))
    feeds = {}
    for inp in sess.get_inputs():
        if inp.type not in _ORT_TYPES:
            raise ModelError(_source(model), f"input {inp.name!r} has unsupported type {inp.type} "
                             "(random inputs cannot be made for it)")
        dtype = np.dtype(_ORT_TYPES[inp.type])
        if inp.name in shapes:
            shape = tuple(shapes[inp.name])
        else:
            shape = tuple(d if isinstance(d, int) and d >= 0 else dim_value(str(d), dims) for d in inp.shape)
        low = inp.name.lower()
        if dtype.kind == "f":
            arr = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            arr = np.ones(shape, dtype=dtype)
        elif "mask" in low:
            arr = np.ones(shape, dtype=dtype)
        else:
            bound = _index_bound(graph, inp.name)
            hi = bound if bound else 8
            lo = 0 if dtype.kind == "u" or bound else -hi
            arr = rng.integers(lo, hi, size=shape).astype(dtype)
        feeds[inp.name] = arr
    return feeds


def run(model, feeds: dict | None = None, *, level: str = "disable", threads: int = 1, seed: int = 0,
        dims: dict[str, int] | None = None, source: str | None = None) -> dict[str, np.ndarray]:
    """Run a model once; returns {output name: array}. A failure is a ModelError naming `source` (default: the
    model's path or name, "<model>" for a bare session)."""
    sess = model if isinstance(model, ort.InferenceSession) else session(model, level, threads)
    if feeds is None:
        feeds = make_feeds(model, seed=seed, dims=dims, sess=sess)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, _run_session(sess, names, feeds, source or _source(model))))


def _source(model) -> str:
    """How an error names a model: its path, a Graph's name, else "<model>"."""
    if isinstance(model, (str, os.PathLike)):
        return str(model)
    if isinstance(model, Graph) and model.name:
        return model.name
    return "<model>"


def _run_session(sess: ort.InferenceSession, names: list[str], feeds: dict, source: str = "<model>") -> list:
    """sess.run with onnxruntime's failures turned into one-line ModelErrors naming `source` (no C++ log line)."""
    opts = ort.RunOptions()
    opts.log_severity_level = 4
    try:
        return sess.run(names, feeds, opts)
    except Exception as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(source, f"onnxruntime failed to run it: {msg}") from None


# --------------------------------------------------------------------------------------------------
# verification
# --------------------------------------------------------------------------------------------------

@dataclass
class OutputCheck:
    name: str
    shape: tuple
    dtype: str
    max_abs: float
    max_rel: float
    rtol: float
    atol: float
    ok: bool
    problem: str = ""
    #: the input draw this check comes from (the output's worst)
    draw: int = 0
    #: max |original - float32 run| and max |fused - float32 run| (half-precision outputs; None otherwise)
    original_vs_reference: float | None = None
    fused_vs_reference: float | None = None
    #: outside the tolerance, but no further from the float32 run than the original (rounding, not a change)
    accepted_by_reference: bool = False


@dataclass
class VerifyReport:
    """Per-output errors of a fused model against the original."""

    outputs: list[OutputCheck] = field(default_factory=list)
    seed: int = 0
    #: how many input draws were compared (seeds seed .. seed+draws-1)
    draws: int = 1
    #: what the half-precision outputs were also judged against ("" when there were none)
    reference: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.outputs) and all(o.ok for o in self.outputs)

    @property
    def max_abs(self) -> float:
        return max((o.max_abs for o in self.outputs), default=0.0)

    def __bool__(self) -> bool:
        return self.ok

    def table(self) -> str:
        lines = [f"{'output':<24} {'shape':<18} {'dtype':<8} {'max abs err':>11} {'max rel err':>11} {'atol used':>9}  within tol"]
        for o in self.outputs:
            shape = "x".join(map(str, o.shape)) or "scalar"
            verdict = "yes" if o.ok else f"NO {o.problem}".strip()
            lines.append(f"{o.name[:24]:<24} {shape[:18]:<18} {o.dtype:<8} {o.max_abs:>11.2e} {o.max_rel:>11.2e} "
                         f"{o.atol:>9.1e}  {verdict}")
        for o in self.outputs:
            if o.fused_vs_reference is not None:
                lines.append(f"  {o.name[:24]} against the {self.reference}: original off by "
                             f"{o.original_vs_reference:.2e}, fused by {o.fused_vs_reference:.2e}"
                             + (" (accepted: as accurate)" if o.accepted_by_reference else ""))
        lines.append(self._verdict())
        return "\n".join(lines)

    def _verdict(self) -> str:
        on = f"on {self.draws} input draws" if self.draws > 1 else "on 1 input draw"
        return f"equivalent {on}" if self.ok else f"NOT equivalent {on}"

    def summary(self) -> str:
        """Like `table()` without the error values: deterministic across machines (safe in checked notebook cells)."""
        lines = [f"{'output':<24} {'shape':<18} {'dtype':<8} {'rtol':>7} {'atol used':>9}  within tol"]
        for o in self.outputs:
            shape = "x".join(map(str, o.shape)) or "scalar"
            verdict = "yes" if o.ok else f"NO {o.problem}".strip()
            lines.append(f"{o.name[:24]:<24} {shape[:18]:<18} {o.dtype:<8} {o.rtol:>7.0e} {o.atol:>9.1e}  {verdict}")
        lines.append(self._verdict())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _compare(name, a: np.ndarray, b: np.ndarray, rtol, atol, scale_atol: bool = True) -> OutputCheck:
    a = np.asarray(a)
    b = np.asarray(b)
    tol = TOLERANCES.get(a.dtype, (0.0, 0.0))
    r = tol[0] if rtol is None else rtol
    t = tol[1] if atol is None else atol
    if a.shape != b.shape or a.dtype != b.dtype:
        return OutputCheck(name, a.shape, str(a.dtype), float("inf"), float("inf"), r, t, False,
                           f"shape/dtype {b.shape}/{b.dtype} != {a.shape}/{a.dtype}")
    if a.dtype.kind in "fc" and np.array_equal(a, b, equal_nan=True):  # the common case, without float64 copies
        return OutputCheck(name, a.shape, str(a.dtype), 0.0, 0.0, r, t, True)
    if a.dtype.kind not in "fc":
        equal = bool(np.array_equal(a, b))
        diff = 0.0 if equal else float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
        return OutputCheck(name, a.shape, str(a.dtype), diff, diff, 0.0, 0.0, equal, "" if equal else "values differ")
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    nan_a, nan_b = ~np.isfinite(a64), ~np.isfinite(b64)
    if not np.array_equal(nan_a, nan_b) or not np.array_equal(a64[nan_a], b64[nan_b], equal_nan=True):
        return OutputCheck(name, a.shape, str(a.dtype), float("nan"), float("nan"), r, t, False,
                           "NaN/Inf at different positions")
    fin = ~nan_a
    if scale_atol and fin.any():
        t = t * max(1.0, float(np.max(np.abs(a64[fin]))))
    diff = np.abs(a64[fin] - b64[fin])
    max_abs = float(diff.max()) if diff.size else 0.0
    # Relative to |expected|, floored at atol: near-zero outputs do not turn harmless errors into huge ratios.
    rel = diff / np.maximum(np.abs(a64[fin]), max(t, np.finfo(np.float64).tiny))
    max_rel = float(rel.max()) if rel.size else 0.0
    ok = bool(np.all(diff <= t + r * np.abs(a64[fin])))
    return OutputCheck(name, a.shape, str(a.dtype), max_abs, max_rel, r, t, ok, "" if ok else "outside tolerance")


#: input draws `verify` compares on by default (seeds seed, seed+1, ...)
DRAWS = 3
#: how far a fused half-precision output may be from the float32 reference, relative to the original's
#: own distance from it (the fuzzer's FACTOR): the same accuracy, rounded in another order
REFERENCE_FACTOR = 2.0


def verify(original, fused, *, rtol: float | None = None, atol: float | None = None, seed: int = 0,
           draws: int = DRAWS, dims: dict[str, int] | None = None, feeds: dict | None = None,
           fused_level: str = "disable", custom_ops_library: str | None = None,
           fused_session: ort.InferenceSession | None = None, scale_atol: bool = True,
           reference: str = "auto", original_session: ort.InferenceSession | None = None,
           expected: dict | None = None, got: dict | None = None) -> VerifyReport:
    """Compare every output of `fused` with `original` on `draws` random input draws (seeds `seed`, `seed`+1, ...).

    The original runs with onnxruntime's optimisations off. Tolerances default per dtype (fp32:
    rtol 1e-4, atol 1e-5); NaN/Inf must appear at the same positions in both. An element passes when
    |fused - original| <= atol' + rtol·|original|, where atol' = atol · max(1, max|original|) with
    `scale_atol` (the default). Why scale: floating-point rounding grows with the magnitude of the
    values summed, so a fixed 1e-5 is meaningful only for outputs of order 1; deep networks whose
    outputs reach tens (e.g. YOLO heads) differ by ~1e-5·max|y| even under onnxruntime's *own* BN
    folding. For outputs of magnitude <= 1 nothing changes; pass `scale_atol=False` for the raw norm.

    Several draws, because one can hide a wrong rewrite (an fp16 BatchNorm fold that is exact on one
    draw and off by 0.05 on the next). Half-precision outputs are also compared with a float32 run of
    the original (`reference="auto"`; "always" for every float output, "never" to skip): the fused
    model's distance from it is reported beside the original's, and an element outside the tolerance
    still passes when the fused value is no further from the float32 one than REFERENCE_FACTOR times the
    original's distance plus the tolerance (a rewrite that rounds in another order, not one that
    computes something else). Given `feeds`, those are the one draw. Each output reports its worst draw.
    Sessions already made (`original_session`, `fused_session`) are reused, and with `feeds`, outputs already
    computed on them (`expected` from the original, `got` from the fused model) are judged without running
    again. A failure to run names the model that failed: the original's is a ModelError naming it, the fused
    model's names "the fused model".
    """
    if reference not in ("auto", "always", "never"):
        raise ValueError(f"reference must be 'auto', 'always' or 'never', not {reference!r}")
    if (expected is not None or got is not None) and feeds is None:
        raise ValueError("expected/got outputs need the feeds they were computed on")
    ref_sess = original_session or session(original, "disable")
    sess = fused_session or session(fused, fused_level, custom_ops_library=custom_ops_library)
    original_name, fused_name = _source(original), _source(fused)
    if fused_name == original_name:
        fused_name = "the fused model"
    got_names = [o.name for o in sess.get_outputs()]
    needed = {i.name for i in sess.get_inputs()}
    draw_feeds = [feeds] if feeds is not None else \
        [make_feeds(original, seed=seed + k, dims=dims, sess=ref_sess) for k in range(max(1, draws))]
    report = VerifyReport(seed=seed, draws=len(draw_feeds))
    wide = _Wide(original, reference)
    worst: dict[str, OutputCheck] = {}
    refs, feeds_of = {}, {}
    for k, f in enumerate(draw_feeds):
        ref = expected if expected is not None else run(ref_sess, f, source=original_name)
        outs = got if got is not None else \
            dict(zip(got_names, _run_session(sess, got_names, {n: v for n, v in f.items() if n in needed}, fused_name)))
        for name, want in ref.items():
            if name not in outs:
                check = OutputCheck(name, np.shape(want), str(np.asarray(want).dtype),
                                    float("inf"), float("inf"), 0, 0, False, "output missing")
            else:
                check = _compare(name, want, outs[name], rtol, atol, scale_atol)
                wide.judge(check, k, f, want, outs[name], rtol, atol, scale_atol)
            check.draw = k
            before = worst.get(name)
            if before is None or (before.ok and (not check.ok or check.max_abs > before.max_abs)):
                worst[name], refs[name], feeds_of[name] = check, ref, f
    report.outputs = list(worst.values())
    report.reference = wide.engine
    if not report.ok:
        _explain_nondeterminism(original, ref_sess, report, refs, feeds_of, rtol, atol, scale_atol)
    return report


class _Wide:
    """The float32 run of the original that half-precision outputs are judged against (made on first use)."""

    def __init__(self, original, mode: str):
        self.original, self.mode, self.engine = original, mode, ""
        self._ref = None
        self._runs: dict[int, dict] = {}

    def wanted(self, dtype) -> bool:
        kind = np.dtype(dtype)
        return self.mode == "always" and kind.kind == "f" or \
            self.mode == "auto" and kind.kind == "f" and kind.itemsize < 4

    def outputs(self, k: int, feeds: dict) -> dict | None:
        if self._ref is None:
            try:
                proto = self.original.to_proto() if isinstance(self.original, Graph) else \
                    onnx.load_from_string(model_bytes(self.original))
                self._ref = Reference(proto, onnx.TensorProto.FLOAT)
                self.engine = f"float32 ({self._ref.engine})"
            except Exception:  # noqa: BLE001 - no reference can run: judged against the original alone
                self._ref, self.engine = False, "none (no float32 run possible)"
        if self._ref is False:
            return None
        if k not in self._runs:
            with np.errstate(all="ignore"):
                self._runs[k] = self._ref.run(feeds)
        return self._runs[k]

    def judge(self, check: OutputCheck, k: int, feeds: dict, expected, got, rtol, atol, scale_atol) -> None:
        """Record both models' distance from the float32 run in `check`; accept a failing one as accurate."""
        if not self.wanted(np.asarray(expected).dtype) or check.problem.startswith("shape/dtype"):
            return
        wide = self.outputs(k, feeds)
        if wide is None or check.name not in wide:
            return
        o, f = np.asarray(expected, np.float64), np.asarray(got, np.float64)
        r = np.asarray(wide[check.name], np.float64)
        fin = np.isfinite(o) & np.isfinite(f) & np.isfinite(r)
        err_o, err_f = np.abs(o - r)[fin], np.abs(f - r)[fin]
        check.original_vs_reference = float(err_o.max()) if err_o.size else 0.0
        check.fused_vs_reference = float(err_f.max()) if err_f.size else 0.0
        if check.ok or check.problem != "outside tolerance":
            return
        dt = np.asarray(expected).dtype
        r_tol, a_tol = TOLERANCES.get(dt, (0.0, 0.0))
        r_tol, a_tol = (r_tol if rtol is None else rtol), (a_tol if atol is None else atol)
        if scale_atol and fin.any():
            a_tol *= max(1.0, float(np.max(np.abs(o[fin]))))
        close = np.abs(f - o)[fin] <= a_tol + r_tol * np.abs(o[fin])
        accurate = err_f <= REFERENCE_FACTOR * err_o + a_tol + r_tol * np.abs(r[fin])
        if bool(np.all(close | accurate)):
            check.ok, check.problem = True, ""
            check.accepted_by_reference = True


def _explain_nondeterminism(original, ref_sess, report, refs, feeds_of, rtol, atol, scale_atol) -> None:
    """Before blaming the rewrite: does the original even agree with itself (training-mode Dropout,
    random ops)? Then no comparison can succeed, and the report says why. First by construction (an
    output downstream of a random op), then by experiment: a few more runs of the original. One extra
    run is not enough: a 2-element Dropout mask repeats by chance more often than not."""
    sources = random_sources(original)
    failing = [c for c in report.outputs if not c.ok and c.problem != "output missing"]
    for check in failing:
        if sources.get(check.name):
            ops = ", ".join(sources[check.name][:3])
            check.problem = f"the original is nondeterministic (depends on random op {ops})"
    unexplained = [c for c in failing if "nondeterministic" not in c.problem]
    for _ in range(_EXTRA_RUNS if unexplained else 0):
        for check in unexplained:
            if "nondeterministic" in check.problem:
                continue
            again = run(ref_sess, feeds_of[check.name])
            if not _compare(check.name, refs[check.name][check.name], again[check.name], rtol, atol, scale_atol).ok:
                check.problem = "the original is nondeterministic (differs from itself run to run)"


#: how many extra runs of the original look for run-to-run differences when a comparison fails
_EXTRA_RUNS = 4

#: ops whose output is random at inference time, and the input index of their `training_mode` flag
#: (None: always random). Dropout-like ops are deterministic when that flag is a constant false, or
#: their ratio (the input before it) is a constant 0.
_RANDOM_OPS = {
    "RandomNormal": None, "RandomUniform": None, "RandomNormalLike": None, "RandomUniformLike": None,
    "Multinomial": None, "Bernoulli": None,
    "Dropout": 2, "BitmaskDropout": 2, "BiasDropout": 4, "BitmaskBiasDropout": 4,
}


def random_sources(model) -> dict[str, list[str]]:
    """Graph output name -> names of the random ops it depends on (training-mode Dropout, RandomNormal, ...).

    Static and conservative: a Dropout whose `training_mode` is not a constant false counts as random,
    and so does any node whose subgraphs (If/Loop/Scan bodies) contain a random op.
    """
    if isinstance(model, Graph):
        proto = model.to_proto()
    elif isinstance(model, onnx.ModelProto):
        proto = model
    else:
        try:
            proto = onnx.load_from_string(model_bytes(model))
        except Exception:
            return {}
    g = proto.graph
    opset = onnx_opset(proto)
    consts: dict[str, np.ndarray] = {}
    for init in g.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL and int(np.prod(init.dims)) == 1:
            try:
                consts[init.name] = onnx.numpy_helper.to_array(init)
            except Exception:
                pass
    for node in g.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.output:
            for a in node.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    consts[node.output[0]] = onnx.numpy_helper.to_array(a.t)

    def const_value(name: str):
        v = consts.get(name)
        return None if v is None or v.size != 1 else v.reshape(-1)[0]

    def is_random(node) -> bool:
        if any(_subgraph_has_random(a) for a in node.attribute):
            return True
        if node.op_type not in _RANDOM_OPS:
            return False
        flag = _RANDOM_OPS[node.op_type]
        if flag is None:
            return True
        if node.op_type == "Dropout" and opset < 7:
            is_test = next((a.i for a in node.attribute if a.name == "is_test"), 0)
            return not is_test
        mode = node.input[flag] if len(node.input) > flag else ""
        if not mode:
            return False  # training_mode absent: inference, the identity
        ratio = node.input[flag - 1] if len(node.input) > flag - 1 else ""
        if ratio and const_value(ratio) is not None and float(const_value(ratio)) == 0.0:
            return False
        value = const_value(mode)
        return value is None or bool(value)

    tainted: dict[str, set[str]] = {}
    for node in g.node:  # models are stored in topological order (load() sorts those that are not)
        taint: set[str] = set()
        for name in node.input:
            taint |= tainted.get(name, set())
        if is_random(node):
            taint = taint | {node.name or node.op_type}
        if taint:
            for out in node.output:
                tainted[out] = taint
    return {o.name: sorted(tainted[o.name]) for o in g.output if tainted.get(o.name)}


def _subgraph_has_random(attr) -> bool:
    graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
    for sub in graphs:
        for node in sub.node:
            if node.op_type in _RANDOM_OPS or any(_subgraph_has_random(a) for a in node.attribute):
                return True
    return False
