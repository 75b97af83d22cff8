"""Exercise: merge two blocks' (count, mean, M2), the step of Welford's one-pass variance (notebook 09).

The learner writes ``merge(a, b) -> (count, mean, m2)``: `a` and `b` are the statistics of two blocks of the same
rows, each a tuple (count, mean, m2) with `count` an int (values per row in the block), `mean` and `m2` float32
arrays with one value per row (`m2`: the sum of squared deviations from the block's mean). The result is the
statistics of the two blocks together: Chan's pairwise update, which `lessons.reductions.welford` applies block by
block (notebook 09 §5). `check(merge)` computes each block's statistics exactly (in float64, stored as float32),
merges them with the learner's function, left to right from the empty (0, 0, 0) or as a tree, and compares the
mean and the variance m2 / count with float64 `np.mean` and `np.var` of the whole rows. The hidden rows include
blocks of unequal sizes, a block of one value, blocks whose means differ, and rows around 1e4 where E[x²] - E[x]²
in float32 loses every digit of the variance. The hint names the likely mistake: the delta² term left out (or
weighted wrongly), an unweighted mean, or the sums of squares (the naive two-moment form).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "rows", "blocks", "run"]

EXERCISE = "merge two blocks' mean and variance"
TASK = "merge(a, b) returning (count, mean, m2)"
#: float32 tolerance, relative to the variance and to the rows' spread (the mean, which also gets a few float32
#: units in the last place of its size: 1e4 is stored to 1e-3)
RTOL, MEAN_ULPS = 1e-4, 8 * float(np.finfo(np.float32).eps)


@dataclass(frozen=True)
class Moments:
    """`n_rows` rows of `sizes` blocks; values ~ offset + scale * N(0, 1), block i shifted by shift * i; merged
    `order` 'left' (from the empty statistics, as welford does) or 'tree' ((a + b) + (c + d), as cores would)."""

    sizes: tuple[int, ...]
    offset: float = 0.0
    scale: float = 1.0
    shift: float = 0.0
    order: str = "left"
    n_rows: int = 4
    seed: int = 0


CASES = (
    Case("two blocks of 64 values, centred", Moments((64, 64), seed=1)),
    Case("blocks of 100, 28 and 5 values (unequal sizes)", Moments((100, 28, 5), offset=2.0, seed=2)),
    Case("a block of a single value (its m2 is 0) after one of 31", Moments((31, 1), offset=1.0, scale=3.0, seed=3)),
    Case("four blocks whose means differ by 5 from one block to the next", Moments((16, 16, 16, 16), shift=5.0, seed=4)),
    Case("blocks of 48, 16, 8 and 56 merged as a tree, (a + b) + (c + d)",
         Moments((48, 16, 8, 56), shift=2.0, order="tree", seed=5)),
    Case("rows around 1e4 with a spread of 1 (float32): two blocks of 256", Moments((256, 256), offset=1e4, seed=6)),
    Case("rows around 1e4, 32 blocks of 64 merged as a tree", Moments((64,) * 32, offset=1e4, order="tree", seed=7)),
)


def rows(c: Moments) -> np.ndarray:
    """The case's rows, float32 (rows x sum(sizes))."""
    rng = np.random.default_rng(800 + c.seed)
    x = c.offset + c.scale * rng.standard_normal((c.n_rows, sum(c.sizes)))
    edges = np.cumsum((0,) + c.sizes)
    for i in range(len(c.sizes)):
        x[:, edges[i]:edges[i + 1]] += c.shift * i
    return x.astype(np.float32)


def blocks(c: Moments, x: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Each block's exact (count, mean, m2): computed in float64 from the float32 rows, stored as float32."""
    edges = np.cumsum((0,) + c.sizes)
    out = []
    for i in range(len(c.sizes)):
        xb = x[:, edges[i]:edges[i + 1]].astype(np.float64)
        mb = xb.mean(axis=1)
        out.append((int(xb.shape[1]), mb.astype(np.float32), ((xb - mb[:, None]) ** 2).sum(axis=1).astype(np.float32)))
    return out


def _call(merge, a, b, n_rows: int):
    out = attempt(merge, (a[0], a[1].copy(), a[2].copy()), (b[0], b[1].copy(), b[2].copy()))
    if is_stub(out):
        raise NotAnswered
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        what = f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list)) else type(out).__name__
        raise AnswerRaised(f"merge must return (count, mean, m2); it returned {what}")
    count, mean, m2 = out
    mean, m2 = np.asarray(mean), np.asarray(m2)
    for name, arr in (("mean", mean), ("m2", m2)):
        if arr.shape != (n_rows,):
            raise AnswerRaised(f"merge returned {name} of shape {list(arr.shape)}; it must keep one value per row, "
                               f"[{n_rows}]")
    return count, mean.astype(np.float32), m2.astype(np.float32)


def run(merge, c: Moments, x: np.ndarray):
    """The merged (count, mean, m2) of the case's blocks, in the case's order, with `merge`."""
    bs = blocks(c, x)
    if c.order == "tree":
        while len(bs) > 1:
            bs = [_call(merge, bs[i], bs[i + 1], c.n_rows) if i + 1 < len(bs) else bs[i] for i in range(0, len(bs), 2)]
        return bs[0]
    acc = (0, np.zeros(c.n_rows, np.float32), np.zeros(c.n_rows, np.float32))
    for b in bs:
        acc = _call(merge, acc, b, c.n_rows)
    return acc


def _mistake(c: Moments, x: np.ndarray, got_var: np.ndarray) -> str:
    """Which plausible merge the learner's variance matches (computed in float64 from the blocks)."""
    bs = [(n, m.astype(np.float64), q.astype(np.float64)) for n, m, q in blocks(c, x)]
    total = sum(n for n, _, _ in bs)
    mean = sum(n * m for n, m, _ in bs) / total
    spread = sum(n * (m - mean) ** 2 for n, m, _ in bs)
    within = sum(q for _, _, q in bs)
    said = []
    if np.allclose(got_var, within / total, rtol=RTOL, atol=0.0) and not np.allclose(spread, 0.0, atol=1e-12):
        said.append("the delta² term left out or weighted wrongly: the blocks' means differ, and "
                    "delta² · count_a · count_b / count adds what lies between them")
    if c.offset >= 1e3:
        said.append("at a mean of 1e4, Σx² and count · mean² agree in their first 7 or 8 digits, so their float32 "
                    "difference (E[x²] - E[x]², the sums of squares) is rounding noise: merge the M2s instead")
    return f" ({'; or '.join(said)})" if said else ""


def _judge(merge, case: Case) -> str | None:
    c: Moments = case.data
    x = rows(c)
    count, mean, m2 = run(merge, c, x)
    x64 = x.astype(np.float64)
    want_mean, want_var = x64.mean(axis=1), x64.var(axis=1)
    if count != x.shape[1]:
        return f"your merged count is {count}, the rows hold {x.shape[1]} values: count_a + count_b"
    with np.errstate(all="ignore"):
        var = m2.astype(np.float64) / count
    spread = np.sqrt(want_var)
    bad_mean = ~(np.abs(mean - want_mean) <= RTOL * spread + MEAN_ULPS * np.abs(want_mean))
    if bad_mean.any() or not np.isfinite(mean).all():
        r = int(np.argmax(~np.isfinite(mean) | bad_mean))
        return (f"row {r}: your mean is {mean[r]:.7g}, the rows' is {want_mean[r]:.7g} (weight each block's mean "
                f"by its count)")
    bad_var = ~(np.abs(var - want_var) <= RTOL * want_var)
    if bad_var.any():
        r = int(np.argmax(bad_var))
        return (f"row {r}: your variance m2 / count is {var[r]:.5g}, float64 np.var of the row is {want_var[r]:.5g}"
                f"{_mistake(c, x, var)}")
    return None


def check(merge) -> Verdict:
    """Grade `merge(a, b) -> (count, mean, m2)` against float64 mean and variance of the whole rows."""
    return grade(EXERCISE, merge, CASES, _judge, task=TASK,
                 checked="Each case: your merges over the blocks (left to right from (0, 0, 0), or as a tree); the "
                         "mean within 1e-4 of the rows' spread and m2 / count within 1e-4 relative of float64 "
                         "np.mean and np.var.")
