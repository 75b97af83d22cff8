"""Judging one output of a fused model against the original and the float64 reference.

An element of a fused output `f` is accepted when

1. **close to the original** `o`:  |f - o| <= atol·s + rtol·|o|; or
2. **no further from the reference than the original is**, up to a factor and the tolerance:
   |f - r| <= FACTOR·|o - r| + atol·s + rtol·|r|, where `r` is the float64 run of the original; or
3. **ill-conditioned**: where the original itself misses the reference by more than the tolerance
   (|o - r| > atol·s + rtol·|r|: cancellation, division by a rounding residue), rounding decides the
   value and a rewrite cannot be held to it: accepted when |f - r| <= ILL_FACTOR·|o - r| + atol·s + rtol·|r|;
4. **non-finite where the original is**: NaN where `o` is NaN, the same infinity where `o` is infinite.
   Where `o` is non-finite but `r` is finite (the original overflowed or divided by a rounding residue),
   the original's NaN/Inf is an artifact of rounding and any `f` is accepted; where `r` is non-finite
   but of another kind (x/0 with the sign of a rounding residue), any non-finite `f` is. Where `r` has
   the original's NaN/Inf, it is real and `f` must have it. Where the original is finite but `r` is
   NaN/Inf (Pow(-tiny, 2.0015): the original's finite value is the rounding artifact), an `f` with the
   reference's NaN/Inf is accepted;
5. **at the end of the range**: where one of the two values lies within a factor RANGE_FACTOR of the dtype's
   largest finite value and the other is the infinity of the same sign, it is accepted: a sum that close to overflow
   overflows or not depending on the order it is accumulated in (BatchNormalization folded into the
   weights scales the partial sums), which no rewrite that reorders arithmetic can control. A NaN is accepted there
   too: partial sums that overflow to +inf and -inf in the reordered sum add to NaN;
6. **on an output the original itself overflowed** (some element non-finite where the reference is finite: these
   inputs take the model beyond what the dtype can compute), a non-finite `f` where `r` is finite is accepted where
   the original's finite value is no witness either: it lies at the end of the range or already misses the
   reference by more than the tolerance (a ReLU of an overflowed sum that the original clipped to 0 and the fused
   kernel, with its BatchNorm scale in the weights, saw as NaN).

(rtol, atol) are the project's per-dtype tolerances (`fusionlab.verification.runtime.TOLERANCES`: fp32 1e-4/1e-5, fp16
1e-3/2.5e-3, fp64 1e-7/1e-7), s = max(1, max|o| over finite elements) (rounding grows with magnitude),
FACTOR = 2, ILL_FACTOR = 10, RANGE_FACTOR = 256. Shapes and dtypes must be equal; integer and bool outputs must be equal
exactly, except elements that flip when the original's float inputs move by a few ulps (an argmax of
values that tie to rounding). Rules 2-3 make the judgement fair: a rewrite that changes rounding (a fused kernel that
accumulates in another order) may differ from the original by more than the tolerance and still be as
accurate; a rewrite that changes the function (0.4996 matched as 0.5, a folded fp16 weight that lost
precision the original kept) is further from the reference than the original, however small the
difference. Without a reference (neither onnxruntime nor onnx.reference can run the float64 model) only
rule 1 and the strict part of rule 4 apply.
"""

from __future__ import annotations

import numpy as np

from .runtime import TOLERANCES

__all__ = ["FACTOR", "ILL_FACTOR", "RANGE_FACTOR", "accepted", "judge_output", "tolerance", "deviation", "spread",
           "within_rounding"]

FACTOR = 2.0
ILL_FACTOR = 10.0
RANGE_FACTOR = 256.0


def tolerance(dtype) -> tuple[float, float]:
    return TOLERANCES.get(np.dtype(dtype), (0.0, 0.0))


def judge_output(o: np.ndarray, f: np.ndarray, r: np.ndarray | None = None, *,
                 ignore: np.ndarray | None = None) -> str | None:
    """None when `f` is an acceptable result for original output `o` (reference `r`); else what is wrong.

    `ignore` masks integer-output elements that are not stable under rounding (see `judge.Case.unstable`).
    """
    o, f = np.asarray(o), np.asarray(f)
    if f.shape != o.shape:
        what = "rank" if f.ndim != o.ndim else "shape"
        return f"{what} {list(f.shape)} instead of {list(o.shape)}"
    if f.dtype != o.dtype:
        return f"dtype {f.dtype} instead of {o.dtype}"
    if o.dtype.kind not in "fc":
        same = o == f
        if ignore is not None and np.shape(ignore) == o.shape:
            same |= ignore
        return None if same.all() else "integer values differ"
    ok = accepted(o, f, r)
    if ok.all():
        return None
    bad = ~ok
    o64, f64 = o.astype(np.float64), f.astype(np.float64)
    fin_o, fin_f = np.isfinite(o64), np.isfinite(f64)
    with np.errstate(invalid="ignore", over="ignore"):
        return _describe(o64, f64, _reference(r, o.shape), bad, fin_o, fin_f)


def accepted(o: np.ndarray, f: np.ndarray, r: np.ndarray | None = None) -> np.ndarray:
    """Per element of float arrays of one shape, whether `f` is accepted for `o` (rules 1-5; 2-4 need `r`)."""
    o, f = np.asarray(o), np.asarray(f)
    rtol, atol = tolerance(o.dtype)
    o64, f64 = o.astype(np.float64), f.astype(np.float64)
    fin_o, fin_f = np.isfinite(o64), np.isfinite(f64)
    s = max(1.0, float(np.max(np.abs(o64[fin_o])))) if fin_o.any() else 1.0
    t = atol * s
    both = fin_o & fin_f
    with np.errstate(invalid="ignore", over="ignore"):
        ok = both & (np.abs(f64 - o64) <= t + rtol * np.abs(o64))
        same_nonfinite = ~fin_o & ~fin_f & ((np.isnan(o64) & np.isnan(f64)) | (o64 == f64))
        ok |= same_nonfinite
        edge = float(np.finfo(o.dtype).max) / RANGE_FACTOR
        ok |= fin_o & np.isinf(f64) & (np.abs(o64) >= edge) & (np.sign(f64) == np.sign(o64))
        ok |= fin_o & np.isnan(f64) & (np.abs(o64) >= edge)
        ok |= fin_f & np.isinf(o64) & (np.abs(f64) >= edge) & (np.sign(f64) == np.sign(o64))
        r64 = _reference(r, o.shape)
        if r64 is not None:
            fin_r = np.isfinite(r64)
            err_o, err_f, tol_r = np.abs(o64 - r64), np.abs(f64 - r64), t + rtol * np.abs(r64)
            ok |= both & fin_r & (err_f <= FACTOR * err_o + tol_r)
            ok |= both & fin_r & (err_o > tol_r) & (err_f <= ILL_FACTOR * err_o + tol_r)
            ok |= ~fin_o & fin_r
            o_is_r = (np.isnan(o64) & np.isnan(r64)) | (o64 == r64)
            ok |= ~fin_o & ~fin_f & ~o_is_r  # the original's NaN/Inf is not the reference's: its kind is rounding
            ok |= fin_o & ~fin_r & ~fin_f & ((np.isnan(r64) & np.isnan(f64)) | (r64 == f64))  # f agrees with r
            if (~fin_o & fin_r).any():  # rule 6: the original overflowed on this output
                ok |= fin_o & ~fin_f & fin_r & ((np.abs(o64) >= edge) | (err_o > tol_r))
    return ok


def deviation(a, b) -> np.ndarray:
    """|a - b| per element in float64: 0 where both hold the same NaN/Inf, infinite where only one is NaN."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        d = np.where((np.isnan(a) & np.isnan(b)) | (a == b), 0.0, np.abs(a - b))
    return np.where(np.isnan(d), np.inf, d)


def spread(base, runs) -> np.ndarray:
    """Per element, the farthest any of `runs` lies from `base` (`deviation`: infinite where a run changes finiteness)."""
    out = np.zeros(np.shape(base))
    for run in runs:
        out = np.fmax(out, deviation(run, base))
    return out


def within_rounding(o, f, runs: list, factor: float = FACTOR) -> np.ndarray:
    """Per element, whether fused `f` is what the original could compute with its rounding moved: `runs` are the
    original's outputs with its float inputs (or stored parameters) moved by a few ulps. The one excuse both the
    fuzzer's judge (`judge._ill_conditioned`) and `fuse()`'s safety net (`passes.runcheck._rounding`) give for
    an ill-conditioned output, so the two cannot disagree on it. Accepted where

    - `f` deviates from `o` by a finite amount at most `factor` times the farthest finite run (backward
      stability; a run that went NaN/Inf bounds nothing), or holds the same value / the same NaN/Inf;
    - `f` is NaN or infinite where `o` is not (or of another kind): some run of the original holds that very
      NaN/Inf there. A normalisation of a row that is constant in exact arithmetic (a padded border, eps 0)
      is 0/0: the original's finite ±1 is the sign of a rounding residue, and one ulp moved makes it ±1 or NaN;
    - `f` is finite where `o` is NaN/Inf: some run of the original is finite there (its NaN/Inf is rounding).

    A NaN/Inf that no run of the original shows is never excused, however large the spread elsewhere.
    """
    o64, f64 = np.asarray(o, dtype=np.float64), np.asarray(f, dtype=np.float64)
    dev = deviation(o64, f64)
    wide = np.zeros(o64.shape)
    seen = np.zeros(o64.shape, dtype=bool)  # f's NaN/Inf appears in a run
    finite_run = np.zeros(o64.shape, dtype=bool)
    with np.errstate(invalid="ignore"):
        for r in runs:
            r64 = np.asarray(r, dtype=np.float64)
            if r64.shape != o64.shape:
                continue
            d = deviation(r64, o64)
            # a run driven to NaN/Inf (the original at a singularity) bounds no finite deviation: a planted
            # Sigmoid -> Tanh bug was once excused as "ill-conditioned" by an infinite spread
            wide = np.fmax(wide, np.where(np.isfinite(d), d, 0.0))
            seen |= (np.isnan(f64) & np.isnan(r64)) | (np.isinf(f64) & (f64 == r64))
            finite_run |= np.isfinite(r64)
        ok = np.isfinite(dev) & (dev <= factor * wide)
        ok |= ~np.isfinite(dev) & ~np.isfinite(f64) & seen
        ok |= ~np.isfinite(dev) & np.isfinite(f64) & ~np.isfinite(o64) & finite_run
    return ok


def _reference(r, shape) -> np.ndarray | None:
    """The reference as float64, or None when there is none or its shape is not the original's."""
    return np.asarray(r, dtype=np.float64) if r is not None and np.shape(r) == tuple(shape) else None


def _describe(o64, f64, r64, bad, fin_o, fin_f) -> str:
    if (fin_o != fin_f)[bad].any() or (~fin_o & ~fin_f)[bad].any():
        k = int(np.argmax(bad & (fin_o != fin_f))) if (bad & (fin_o != fin_f)).any() else int(np.argmax(bad))
        return (f"NaN/Inf at different positions ({int((bad & (fin_o != fin_f)).sum())} of {o64.size}; "
                f"original {o64.flat[k]:.4g}, fused {f64.flat[k]:.4g})")
    err = np.where(bad, np.abs(f64 - o64), 0.0)
    k = int(np.argmax(err))
    ref = f", reference {r64.flat[k]:.6g}" if r64 is not None else ""
    return (f"values: max |fused - original| {err.flat[k]:.3g} (original {o64.flat[k]:.6g}, fused {f64.flat[k]:.6g}"
            f"{ref}; {int(bad.sum())} of {o64.size} elements)")
