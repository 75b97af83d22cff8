"""The seeded generator: random valid ONNX models rich in fusable patterns and their near misses.

`generate(seed)` builds a model from `random.Random(f"fusionlab.fuzz/{seed}/{attempt}")`, validates it
(`onnx.checker.check_model(full_check=True)`, then onnxruntime with optimisations off on every draw the
oracle will use) and, when validation fails, tries the next attempt: the same seed always yields the same
bytes. A model is

- an opset (13..21 mostly; 7..12 in one model of five, where BatchNormalization, Pad, Clip, Reduce*
  and Unsqueeze have older forms), a float dtype (fp32, fp16 or fp64) and an IR version;
- one or two inputs in one layout — NCHW maps, [batch, seq, hidden] sequences or [batch, features]
  vectors — with symbolic batch/seq dims in some models;
- 1-6 *patterns* applied to live tensors (the latest one mostly, an older one sometimes, which makes
  residuals and multi-consumer intermediates): Conv/ConvTranspose chains, Pad+pool, MatMul/Gemm chains,
  GELU (erf and tanh), SiLU, LayerNorm, Add+LayerNormalization, horizontal siblings, elementwise and
  reduction chains, NCHW -> vector bridges, channels-last blocks (Transpose pairs, ConvNeXt's MLP with
  layer-scale) (`convs`, `linears`, `gelus`, `norms`, `chains`, `layouts`);
- near misses at a per-model rate (0 to 25% per opportunity): see each pattern module;
- then, at random: intermediates made graph outputs or given a second consumer; value_info from shape
  inference; node naming (named, exporter-style, unnamed, some unnamed); tensor and node names a pass
  might make up (`names.tempt`).

The model's metadata records its seed, attempt and pattern tags (`fuzz.tags`), for reports.
"""

from __future__ import annotations

import random

import numpy as np
import onnx
from onnx import helper

from ..verification.feeds import draws, feeds_for, session as _session
from . import attention, chains, convs, exporters, gelus, layouts, linears, norms, rotary
from .builder import Builder
from .names import tempt

__all__ = ["generate", "generate_with_tags", "validate", "declared_shape_problem", "build", "build_traced", "MAX_ATTEMPTS", "MODULES"]

MAX_ATTEMPTS = 50

_DTYPES = ((np.float32, 0.68), (np.float16, 0.2), (np.float64, 0.12))
_STYLES = (("named", 0.3), ("exporter", 0.15), ("unnamed", 0.3), ("some", 0.25))


def _pick(rng: random.Random, table):
    r, acc = rng.random(), 0.0
    for item, w in table:
        acc += w
        if r < acc:
            return item
    return table[-1][0]


#: the emitter modules, each listing its patterns in `PATTERNS` (a new family: a module with PATTERNS, added here)
MODULES = (chains, gelus, norms, convs, linears, layouts, exporters, rotary, attention)


def _patterns(b: Builder, x: str) -> list[tuple]:
    """(emitter, weight) pairs that apply to tensor `x`, from every module's `PATTERNS`."""
    out = []
    for module in MODULES:
        for pattern in module.PATTERNS:
            w = pattern.weight(b, x)
            if w > 0:
                out.append((pattern.emit, w))
    return out


def _layout(b: Builder) -> list[str]:
    """The graph inputs: one layout, one or two inputs, symbolic batch/seq in some models."""
    rng = b.rng
    kinds = ("img", "seq", "vec") if b.dtype != np.float64 else ("seq", "vec")
    weights = (0.45, 0.35, 0.2) if len(kinds) == 3 else (0.6, 0.4)
    kind = _pick(rng, list(zip(kinds, weights)))
    batch = rng.choice(("batch", "N")) if rng.random() < 0.45 else rng.choice((1, 1, 2))
    if kind == "img":
        shape = (batch, rng.choice((2, 3, 4, 8)), rng.randint(4, 9), rng.randint(4, 9))
    elif kind == "seq":
        seq = "seq" if rng.random() < 0.5 else rng.randint(2, 7)
        shape = (batch, seq, rng.choice((4, 8, 16)))
    else:
        shape = (batch, rng.choice((4, 6, 8, 16)))
    xs = [b.input(shape, "x")]
    if rng.random() < 0.3:
        xs.append(b.input(shape, "x"))
    return xs


def _near_miss_tail(b: Builder, pool: list[str]) -> None:
    """Intermediates that escape: made graph outputs, or read by a second consumer."""
    inner = [t for t in dict.fromkeys(b.inner) if t in b.shapes and b.dtype_of(t) == b.dtype]
    for _ in range(2):
        if not inner or not b.rng.random() < 2 * b.near + 0.05:
            continue
        t = b.rng.choice(inner)
        if b.rng.random() < 0.5:
            b.extra_outputs.append(t)
            b.tags.append("nm:intermediate_output")
        else:
            pool.append(b.unary(b.rng.choice(("Neg", "Relu", "Identity", "Sigmoid")), t))
            b.tags.append("nm:second_consumer")


def build(rng: random.Random) -> tuple[onnx.ModelProto, list[str]]:
    """One random model (not yet validated) and its pattern tags; raises ValueError when a pattern cannot fit."""
    model, tags, _ = build_traced(rng)
    return model, tags


def build_traced(rng: random.Random) -> tuple[onnx.ModelProto, list[str], Builder]:
    """`build`, and the Builder that made the model: the shape and dtype it tracked for every value (tests compare
    them with what onnxruntime computes)."""
    opset = rng.randint(13, 23) if rng.random() < 0.8 else rng.randint(7, 12)
    dtype = _pick(rng, _DTYPES)
    b = Builder(rng, dtype, opset, node_style=_pick(rng, _STYLES), near=rng.choice((0.0, 0.03, 0.08, 0.15)))
    pool = _layout(b)
    for _ in range(rng.randint(1, 6)):
        x = pool[-1] if rng.random() < 0.6 else rng.choice(pool)
        options = _patterns(b, x)
        emit = _pick(rng, [(f, w / sum(w for _, w in options)) for f, w in options])
        out = emit(b, x, pool)
        pool.extend(out if isinstance(out, list) else [out])
    _near_miss_tail(b, pool)
    outputs = [t for t in pool if not b.uses.get(t)] + b.extra_outputs
    outputs = [t for t in dict.fromkeys(outputs) if t not in {i.name for i in b.inputs}]
    if not outputs:
        raise ValueError("no outputs")
    min_ir = helper.find_min_ir_version_for([helper.make_opsetid("", opset)])
    model = b.model(outputs, ir_version=rng.randint(max(min_ir, 4), max(min_ir, 10)))
    if rng.random() < 0.4:
        inferred = onnx.shape_inference.infer_shapes(model)
        model.graph.value_info.extend(inferred.graph.value_info)
    if rng.random() < 0.3:
        b.tags += tempt(model, rng)
    tags = sorted(set(b.tags)) + [f"opset{opset}", np.dtype(dtype).name]
    return model, tags, b


def validate(model: onnx.ModelProto, n_draws: int = 3) -> str | None:
    """None when the model passes the full checker and runs in onnxruntime on every draw; else why not."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # noqa: BLE001 - any complaint rejects the model
        return f"checker: {str(exc).strip().splitlines()[0][:200]}"
    try:
        sess = _session(model)
    except Exception as exc:  # noqa: BLE001
        return f"onnxruntime load: {str(exc).strip().splitlines()[0][:200]}"
    for draw in draws(model, n_draws):
        try:
            got = sess.run(None, feeds_for(model, draw))
        except Exception as exc:  # noqa: BLE001
            return f"onnxruntime run: {str(exc).strip().splitlines()[0][:200]}"
        problem = declared_shape_problem(model, draw.dims, got)
        if problem:
            return problem
    return None


def declared_shape_problem(model: onnx.ModelProto, dims: dict, got: list) -> str | None:
    """Why the outputs `got` of one run do not have the shapes the model declares for them (None if they do).

    Neither the checker nor onnxruntime compares a run with the declared output shapes, and shape inference
    stops at a Reshape whose target is computed at run time: a pattern that tracked a shape wrongly (a near-miss
    constant of rank 3 broadcasting a rank-2 tensor up, then a node declared with the old shape) would make an
    original whose interface no fused model can keep. The generator's own bug, so the draw is rejected here.
    A static dim must be equal, a symbolic one the size the draw bound it to (any size if unbound)."""
    for vi, value in zip(model.graph.output, got):
        t = vi.type.tensor_type
        if not t.HasField("shape"):
            continue
        declared = [d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param) for d in t.shape.dim]
        actual = list(np.shape(value))
        if len(declared) != len(actual) or any(d is not None and d != a for d, a in zip(declared, actual)):
            shown = [d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in t.shape.dim]
            return f"declared shapes: output {vi.name!r} declared {shown}, computed {actual}"
    return None


def generate_with_tags(seed, *, max_attempts: int = MAX_ATTEMPTS, rejects: list | None = None) -> tuple[onnx.ModelProto, list[str]]:
    """The model for `seed` (an int or string) and its pattern tags; `rejects` collects invalid attempts' reasons."""
    for attempt in range(max_attempts):
        rng = random.Random(f"fusionlab.fuzz/{seed}/{attempt}")
        try:
            model, tags = build(rng)
        except ValueError as exc:
            if rejects is not None:
                rejects.append(f"build: {exc}")
            continue
        problem = validate(model)
        if problem is None:
            meta = {"fuzz.seed": str(seed), "fuzz.attempt": str(attempt), "fuzz.tags": " ".join(tags)}
            helper.set_model_props(model, meta)
            return model, tags
        if rejects is not None:
            rejects.append(problem)
    raise RuntimeError(f"no valid model for seed {seed!r} in {max_attempts} attempts")


def generate(seed, **kw) -> onnx.ModelProto:
    """A valid random model for `seed`; the same seed gives byte-identical models."""
    return generate_with_tags(seed, **kw)[0]
