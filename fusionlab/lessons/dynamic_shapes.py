"""Dynamic shapes on a static-shape compiler: shape gears, a bounded cache keyed by shape, padding.

A compiler such as Ascend's ATC builds a kernel schedule for fixed tensor shapes. Transformer inputs
vary in sequence length, so a deployment either compiles one model per shape it meets (the seed's
``DynamicFusionOp``: a dict keyed by ``hash(str(shapes))``, never emptied), or compiles a few
**gears** (档位) ahead of time and pads every request up to the nearest one::

    atc --model=bert.onnx --framework=5 --output=bert_gears --soc_version=Ascend310P3 \\
        --input_shape="input_ids:1,-1;attention_mask:1,-1" --input_format=ND \\
        --dynamic_dims="64,64;128,128;256,256;512,512"

(each gear lists one value per ``-1`` in ``--input_shape``, here two; `atc_dynamic_dims` writes
them). At run time ``aclmdlSetInputDynamicDims`` selects the gear. With the attention mask set to 0 on the
padded positions, padding does not change the outputs at the real positions.

On this machine onnxruntime plays the compiler: `static_session` builds a session with every
symbolic input dimension fixed (``SessionOptions.add_free_dimension_override_by_name``), which lets
its optimiser see concrete shapes, as ATC does. `ShapeCache` is the bounded, exactly keyed cache of
such sessions; `replay` runs a stream of request lengths through a caching policy and accounts for
compiles, hits, evictions, padding waste and time.
"""

from __future__ import annotations

import bisect
import math
import os
import tempfile
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generic, Hashable, Iterable, Mapping, Sequence, TypeVar, Union

import numpy as np
import onnx
import onnxruntime as ort

from ..graph import load
from ..text import text_table
from ..verification import runtime

__all__ = [
    "MAX_GEARS", "POLICIES", "gears", "gear_for", "best_gears", "atc_dynamic_dims", "request_lengths", "shape_key",
    "ShapeCache", "pad_feeds", "unpad", "verify_padding", "symbolic_dims", "static_session", "ort_ops", "rss_mib",
    "interpolate", "ReplayResult", "replay", "replay_table",
]

#: ATC accepts from 2 to 100 gears in ``--dynamic_dims``; one "gear" is simply a static model.
MAX_GEARS = 100

#: Replay policies and what each one models.
POLICIES = {
    "exact": "one compiled model per exact shape (the seed's DynamicFusionOp)",
    "gears": "pad up to one of a few compiled shape gears, LRU cache of compiled gears",
    "dynamic": "one dynamic-shape model, compiled once, run at the exact shape",
}

V = TypeVar("V")

#: A measured cost: f(length) -> seconds, {length: seconds} (interpolated), a constant, or None (0).
Cost = Union[Callable[[int], float], Mapping[int, float], float, None]


# --------------------------------------------------------------------------------------------------
# gears
# --------------------------------------------------------------------------------------------------

def gears(max_len: int, n: int, policy: str = "pow2") -> tuple[int, ...]:
    """`n` sequence-length gears up to `max_len`, sorted: halvings of `max_len` ("pow2") or equal steps ("linear")."""
    if not isinstance(max_len, (int, np.integer)) or max_len < 1:
        raise ValueError(f"max_len must be a positive integer, got {max_len!r}")
    if not isinstance(n, (int, np.integer)) or not 1 <= n <= MAX_GEARS:
        raise ValueError(f"n must be an integer from 1 to {MAX_GEARS} (ATC's limit), got {n!r}")
    max_len, n = int(max_len), int(n)
    if policy == "pow2":
        if max_len % 2 ** (n - 1):
            raise ValueError(f"pow2 gears: max_len {max_len} cannot be halved {n - 1} times exactly; "
                             f"use a max_len divisible by {2 ** (n - 1)} or fewer gears")
        out = tuple(max_len // 2 ** i for i in reversed(range(n)))
    elif policy == "linear":
        if n > max_len:
            raise ValueError(f"linear gears: {n} gears do not fit below max_len {max_len}")
        out = tuple(math.ceil(max_len * (i + 1) / n) for i in range(n))
    else:
        raise ValueError(f"unknown gear policy {policy!r}; choose 'pow2' or 'linear'")
    return out


def gear_for(length: int, gears: Sequence[int]) -> int:
    """The smallest gear >= `length` (the shape a request of that length is padded to)."""
    ordered = sorted(gears)
    if not ordered:
        raise ValueError("no gears given")
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    i = bisect.bisect_left(ordered, length)
    if i == len(ordered):
        raise ValueError(f"length {length} exceeds the largest gear {ordered[-1]}: "
                         f"truncate the request or compile a larger gear")
    return ordered[i]


def best_gears(lengths: Iterable[int], k: int) -> tuple[int, ...]:
    """The at most `k` gears that pad `lengths` least: the fewest computed tokens, each request on `gear_for`.

    An optimal gear sits at some request's length (lowering a gear to the longest request it serves
    pads less), and the top gear at the longest request. Over the distinct lengths sorted, a dynamic
    programme finds the cheapest split into `k` runs, each served by its last length. With `k` at
    least the number of distinct lengths, every length is its own gear and nothing is padded.
    Ties go to the lowest gears.
    """
    counts = Counter(int(n) for n in lengths)
    if not counts:
        raise ValueError("no request lengths given")
    if min(counts) < 1:
        raise ValueError(f"request lengths must be >= 1, got {min(counts)}")
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    u = np.array(sorted(counts), dtype=np.int64)
    before = np.concatenate([[0], np.cumsum([counts[int(x)] for x in u])])  # requests shorter than u[j]: before[j]
    m, k = len(u), min(int(k), len(u))
    cost = u * before[1:]  # one gear at u[j] serving every request up to u[j]
    back = np.zeros((k, m), dtype=np.int64)
    for t in range(1, k):
        new = np.full(m, np.iinfo(np.int64).max)
        for j in range(t, m):
            i = np.arange(t - 1, j)  # the previous gear sits at u[i]
            c = cost[i] + u[j] * (before[j + 1] - before[i + 1])
            best = int(np.argmin(c))
            new[j], back[t, j] = c[best], i[best]
        cost = new
    out, j = [], m - 1
    for t in reversed(range(k)):
        out.append(int(u[j]))
        j = int(back[t, j])
    return tuple(sorted(out))


def request_lengths(n: int, seed: int = 0, *, median: float = 96, sigma: float = 0.8, min_len: int = 8,
                    max_len: int = 512) -> np.ndarray:
    """`n` token counts of a seeded request stream: log-normal (parameter `median`, spread `sigma`), rounded,
    clipped to `min_len`..`max_len` (BERT's 512 by default): notebook 20's stream of 2000 requests."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(median), sigma, n)), min_len, max_len).astype(int)


def atc_dynamic_dims(input_shape: Mapping[str, Sequence[int]], gears: Sequence[int]) -> str:
    """ATC's ``--input_shape`` and ``--dynamic_dims`` arguments for sequence-length gears.

    Every ``-1`` in `input_shape` is a dynamic dimension; ATC wants each gear to list one value per
    ``-1``, in order, so a gear of 128 for two inputs of shape (1, -1) is written ``128,128``.
    """
    free = sum(1 for dims in input_shape.values() for d in dims if d == -1)
    if not free:
        raise ValueError("input_shape has no dynamic (-1) dimension")
    if not 2 <= len(gears) <= MAX_GEARS:
        raise ValueError(f"ATC accepts from 2 to {MAX_GEARS} gears, got {len(gears)}")
    shapes = ";".join(f"{name}:{','.join(str(int(d)) for d in dims)}" for name, dims in input_shape.items())
    dims = ";".join(",".join([str(int(g))] * free) for g in sorted(gears))
    return f'--input_shape="{shapes}" --input_format=ND --dynamic_dims="{dims}"'


# --------------------------------------------------------------------------------------------------
# the cache
# --------------------------------------------------------------------------------------------------

def shape_key(x) -> Hashable:
    """A cache key that *is* the shape: nested tuples of Python ints (lists, numpy ints and feed dicts normalised).

    A feed dict becomes ``((name, shape), ...)`` sorted by name, so the key says exactly which
    shapes were seen and two different shapes can never share a key.
    """
    if isinstance(x, Mapping):
        return tuple((str(k), shape_key(np.shape(v))) for k, v in sorted(x.items()))
    if isinstance(x, (bool, np.bool_)):
        raise TypeError("a shape key cannot contain booleans")
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, str):
        return x
    if isinstance(x, (tuple, list)):
        return tuple(shape_key(v) for v in x)
    raise TypeError(f"cannot make a shape key from {type(x).__name__}")


class ShapeCache(Generic[V]):
    """A least-recently-used cache of built (compiled) objects keyed by exact shape.

    ``get(key)`` returns the cached object or calls ``build(key)`` on a miss; keys are normalised
    with `shape_key`, so ``(1, 128)``, ``[1, 128]`` and ``(1, np.int64(128))`` are one entry.
    With ``capacity=None`` the cache never evicts (the seed's design: it grows with every new shape);
    otherwise the least recently used entry is dropped when a new one would exceed `capacity`.
    """

    def __init__(self, build: Callable[[Hashable], V], capacity: int | None = None, *,
                 timer: Callable[[], float] = time.perf_counter):
        if capacity is not None and (not isinstance(capacity, (int, np.integer)) or capacity < 1):
            raise ValueError(f"capacity must be None (unbounded) or an integer >= 1, got {capacity!r}")
        self.build = build
        self.capacity = None if capacity is None else int(capacity)
        self.timer = timer
        self._entries: OrderedDict[Hashable, V] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.peak = 0
        self.build_seconds = 0.0
        self.evicted: list[Hashable] = []

    def get(self, key) -> V:
        """The object built for `key`, building it on a miss (and evicting the LRU entry if full)."""
        key = shape_key(key)
        if key in self._entries:
            self.hits += 1
            self._entries.move_to_end(key)
            return self._entries[key]
        self.misses += 1
        t0 = self.timer()
        value = self.build(key)
        self.build_seconds += self.timer() - t0
        if self.capacity is not None and len(self._entries) >= self.capacity:
            old, _ = self._entries.popitem(last=False)
            self.evictions += 1
            self.evicted.append(old)
        self._entries[key] = value
        self.peak = max(self.peak, len(self._entries))
        return value

    def __contains__(self, key) -> bool:
        return shape_key(key) in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[Hashable]:
        """Cached keys, least recently used first."""
        return list(self._entries)

    def stats(self) -> dict:
        """Counters: hits, misses (= builds), evictions, entries now, peak entries, total build seconds."""
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions, "entries": len(self),
                "peak": self.peak, "build_seconds": self.build_seconds}

    def __repr__(self) -> str:
        cap = "unbounded" if self.capacity is None else f"capacity {self.capacity}"
        return (f"ShapeCache({cap}: {len(self)} entries, {self.hits} hits, {self.misses} misses, "
                f"{self.evictions} evictions)")


# --------------------------------------------------------------------------------------------------
# padding
# --------------------------------------------------------------------------------------------------

def _seq_len(feeds: Mapping[str, np.ndarray], axis: int) -> int:
    lengths = {np.shape(v)[axis] for v in feeds.values() if np.ndim(v) > axis}
    if len(lengths) != 1:
        raise ValueError(f"inputs disagree on the sequence length (axis {axis}): {sorted(lengths)}")
    return lengths.pop()


def pad_feeds(feeds: Mapping[str, np.ndarray], length: int, *, pad_id: int = 0, axis: int = 1,
              pad_values: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Pad every [batch, seq] integer input along `axis` to `length`: masks with 0, input_ids with `pad_id`.

    Inputs whose name contains "mask" get 0 (padded positions are masked out); ``input_ids`` gets
    `pad_id` (BERT's [PAD] is 0); any other integer input (token_type_ids, ...) gets 0 unless
    `pad_values` names a value. Float inputs are refused: there is no neutral value to pad with.
    """
    current = _seq_len(feeds, axis)
    if length < current:
        raise ValueError(f"cannot pad a sequence of {current} down to {length}")
    pad_values = dict(pad_values or {})
    out = {}
    for name, arr in feeds.items():
        arr = np.asarray(arr)
        if arr.ndim <= axis:
            out[name] = arr
            continue
        if arr.dtype.kind not in "iub":
            raise ValueError(f"input {name!r} is {arr.dtype}: only integer and boolean inputs can be padded")
        if name in pad_values:
            value = pad_values[name]
        elif "mask" in name.lower():
            value = 0
        elif name == "input_ids":
            value = pad_id
        else:
            value = 0
        widths = [(0, 0)] * arr.ndim
        widths[axis] = (0, length - current)
        out[name] = np.pad(arr, widths, constant_values=value)
    return out


def unpad(outputs: Mapping[str, np.ndarray], length: int, *, padded: int, axis: int = 1) -> dict[str, np.ndarray]:
    """Slice every output whose `axis` has the padded length back to the first `length` positions."""
    if not 1 <= length <= padded:
        raise ValueError(f"need 1 <= length <= padded, got length {length}, padded {padded}")
    out = {}
    for name, arr in outputs.items():
        arr = np.asarray(arr)
        if arr.ndim > axis and arr.shape[axis] == padded:
            index = [slice(None)] * arr.ndim
            index[axis] = slice(0, length)
            arr = arr[tuple(index)]
        out[name] = arr
    return out


def verify_padding(sess: ort.InferenceSession, feeds: Mapping[str, np.ndarray], length: int, *,
                   padded_session: ort.InferenceSession | None = None, rtol: float | None = None,
                   atol: float | None = None, scale_atol: bool = False) -> runtime.VerifyReport:
    """Compare a run on `feeds` with a run padded to `length` (sliced back), output by output.

    `sess` runs the exact shape; `padded_session` (default: `sess`) runs the padded one, e.g. a
    static session compiled for the gear. Tolerances default to the project's per-dtype values
    (fp32: rtol 1e-4, atol 1e-5), unscaled by default: the strict norm.
    """
    names = [o.name for o in sess.get_outputs()]
    exact = dict(zip(names, sess.run(names, dict(feeds))))
    psess = padded_session or sess
    pnames = [o.name for o in psess.get_outputs()]
    got = dict(zip(pnames, psess.run(pnames, pad_feeds(feeds, length))))
    got = unpad(got, _seq_len(feeds, 1), padded=length)
    report = runtime.VerifyReport()
    for name in names:
        report.outputs.append(runtime._compare(name, exact[name], got[name], rtol, atol, scale_atol))
    return report


# --------------------------------------------------------------------------------------------------
# "compiling" for one shape with onnxruntime
# --------------------------------------------------------------------------------------------------

def symbolic_dims(model) -> dict[str, list[str]]:
    """{input name: its symbolic dimension names}, e.g. {'input_ids': ['batch', 'sequence']}."""
    proto = onnx.load_model_from_string(runtime.model_bytes(model))
    out = {}
    for vi in proto.graph.input:
        if vi.name in {init.name for init in proto.graph.initializer}:
            continue
        dims = vi.type.tensor_type.shape.dim
        out[vi.name] = [d.dim_param for d in dims if d.HasField("dim_param")]
    return out


def static_session(model, dims: Mapping[str, int], *, level: str = "all", threads: int = 1,
                   disable: Sequence[str] = (), optimized_path: str | os.PathLike | None = None
                   ) -> ort.InferenceSession:
    """An onnxruntime session with every named free dimension fixed: the 'compile for one shape' analogue.

    Uses ``SessionOptions.add_free_dimension_override_by_name``; onnxruntime then optimises the graph
    knowing the concrete shapes, and refuses inputs of any other shape. Every symbolic dimension of
    the inputs must be given, and every name in `dims` must exist. `disable` names onnxruntime
    graph transformers to skip (e.g. ``"SkipLayerNormFusion"``); `optimized_path` saves the graph
    onnxruntime will run.
    """
    names = {d for ds in symbolic_dims(model).values() for d in ds}
    unknown = sorted(set(dims) - names)
    if unknown:
        raise ValueError(f"no input dimension named {', '.join(map(repr, unknown))}; the model has {sorted(names)}")
    missing = sorted(names - set(dims))
    if missing:
        raise ValueError(f"a static session needs every dimension fixed; missing {', '.join(map(repr, missing))}")
    so = ort.SessionOptions()
    for name, value in dims.items():
        if int(value) < 1:
            raise ValueError(f"dimension {name!r} must be >= 1, got {value}")
        so.add_free_dimension_override_by_name(name, int(value))
    if disable:
        so.add_session_config_entry("optimization.disable_specified_optimizers", ",".join(disable))
    return runtime.session(model, level, threads, session_options=so, optimized_path=optimized_path)


def ort_ops(model, dims: Mapping[str, int] | None = None, *, disable: Sequence[str] = ()) -> Counter:
    """{op type: count} of the graph onnxruntime runs at level "all": a dynamic session, or with `dims` a
    `static_session` for that shape; `disable` names onnxruntime transformers to skip (e.g. "SkipLayerNormFusion")."""
    with tempfile.TemporaryDirectory(prefix="fusionlab-ort-") as tmp:
        path = Path(tmp) / "optimised.onnx"
        if dims is None:
            runtime.session(model, "all", disabled_optimizers=tuple(disable), optimized_path=path)
        else:
            static_session(model, dims, disable=disable, optimized_path=path)
        return Counter(n.op_type for n in load(path, check=False).topological_order())


def rss_mib() -> float:
    """This process's resident memory in MiB (Linux's /proc/self/statm); NaN where it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, AttributeError):
        return float("nan")


# --------------------------------------------------------------------------------------------------
# replaying a stream of requests through a policy
# --------------------------------------------------------------------------------------------------

def interpolate(points: Mapping[int, float]) -> Callable[[int], float]:
    """Piecewise-linear f(length) through measured (length, seconds) points; refuses lengths outside them."""
    if len(points) < 1:
        raise ValueError("need at least one measured point")
    xs = np.array(sorted(points), dtype=float)
    ys = np.array([points[int(x)] for x in xs], dtype=float)

    def f(length: int) -> float:
        if not xs[0] <= length <= xs[-1]:
            raise ValueError(f"length {length} outside the measured range {int(xs[0])}..{int(xs[-1])}")
        return float(np.interp(length, xs, ys))

    return f


def _as_cost(cost: Cost) -> Callable[[int], float]:
    if cost is None:
        return lambda _length: 0.0
    if callable(cost):
        return cost
    if isinstance(cost, Mapping):
        return interpolate(cost)
    value = float(cost)
    return lambda _length: value


@dataclass
class ReplayResult:
    """What a stream of requests cost under one policy: counts are exact; seconds come from the costs given."""

    policy: str
    label: str
    requests: int
    compiles: int
    hits: int
    evictions: int
    peak_cached: int
    useful_tokens: int
    computed_tokens: int
    build_seconds: float
    run_seconds: float

    @property
    def waste(self) -> float:
        """Computed tokens / useful tokens (1.0: no padding)."""
        return self.computed_tokens / self.useful_tokens if self.useful_tokens else 1.0

    @property
    def total_seconds(self) -> float:
        return self.build_seconds + self.run_seconds


def replay(lengths: Iterable[int], policy: str, *, gears: Sequence[int] | None = None, capacity: int | None = None,
           run_seconds: Cost = None, build_seconds: Cost = None, batch: int = 1,
           label: str | None = None) -> ReplayResult:
    """Replay request lengths through a policy ("exact", "gears" or "dynamic", see `POLICIES`).

    `run_seconds` is the time of one run at a computed length: a callable, a {length: seconds}
    mapping of measurements (interpolated linearly), a constant, or None (0: count only).
    `build_seconds` is the time of one compile, in the same forms (called with the compiled length;
    for "dynamic", once, with the longest request).
    "exact" compiles per distinct length and caches with `capacity` (None: the seed's unbounded
    cache); "gears" pads to `gear_for(length, gears)` and caches gears with `capacity`; "dynamic"
    compiles once and runs every request at its own length.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    if policy == "gears" and not gears:
        raise ValueError("the 'gears' policy needs gears")
    if policy != "gears" and gears:
        raise ValueError(f"gears are only used by the 'gears' policy, not {policy!r}")
    if policy == "dynamic" and capacity is not None:
        raise ValueError("the 'dynamic' policy has a single model: no capacity to set")
    run_cost, build_cost = _as_cost(run_seconds), _as_cost(build_seconds)
    lengths = [int(n) for n in lengths]
    build_total = 0.0

    def build(key) -> int:
        nonlocal build_total
        build_total += build_cost(key[1])
        return key[1]

    cache: ShapeCache[int] = ShapeCache(build, capacity)
    useful = computed = 0
    run_total = 0.0
    for n in lengths:
        if n < 1:
            raise ValueError(f"request lengths must be >= 1, got {n}")
        target = gear_for(n, gears) if policy == "gears" else n
        useful += batch * n
        computed += batch * target
        run_total += run_cost(target)
        if policy != "dynamic":
            cache.get((batch, target))
    if policy == "dynamic":
        compiles = 1 if lengths else 0
        build_total = build_cost(max(lengths)) if lengths else 0.0
        hits, evictions, peak = max(0, len(lengths) - 1), 0, compiles
    else:
        compiles, hits, evictions, peak = cache.misses, cache.hits, cache.evictions, cache.peak
    if label is None:
        label = {"exact": "exact shape", "gears": f"gears {'/'.join(map(str, sorted(gears or ())))}",
                 "dynamic": "one dynamic session"}[policy]
        if policy != "dynamic":
            label += ", unbounded" if capacity is None else f", LRU {capacity}"
    return ReplayResult(policy, label, len(lengths), compiles, hits, evictions, peak, useful, computed,
                        build_total, run_total)


def replay_table(results: Sequence[ReplayResult], *, times: bool = False) -> str:
    """A plain-text table of replay results; with `times`, the build, run and total seconds too."""
    header = ["policy", "compiles", "hits", "evictions", "peak cached", "waste"]
    if times:
        header += ["build s", "run s", "total s"]
    rows = []
    for r in results:
        row = [r.label, str(r.compiles), str(r.hits), str(r.evictions), str(r.peak_cached), f"{r.waste:.2f}x"]
        if times:
            row += [f"{r.build_seconds:.2f}", f"{r.run_seconds:.2f}", f"{r.total_seconds:.2f}"]
        rows.append(row)
    return "\n".join(text_table(header, rows))
