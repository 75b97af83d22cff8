"""Exercise: write the online-softmax update FlashAttention is built on (notebook 09).

The learner writes ``update(m, l, acc, scores, v) -> (m, l, acc)``: one key block's step for a tile of query rows.
`m` (rows, 1) is the running max of the scores seen so far, `l` (rows, 1) the running sum of exp(score - m),
`acc` (rows, d) the running sum of exp(score - m) * v; `scores` (rows, block) are this block's scores (q k^T,
already scaled and masked: a masked score is -inf) and `v` (block, d) its values. The driver starts from
m = -inf, l = 0, acc = 0, calls `update` once per key block, and returns acc / l.

`check(update)` compares that with a float64 softmax(scores) @ v on hidden cases: one block, several, a block size
that does not divide the number of keys, a block of size 1, blocks masked to -inf (the first one too: exp(-inf -
(-inf)) is NaN unless the update guards it), logits around 1e4 (exp overflows unless the max is subtracted), and
a max that rises from block to block (the running sums must be rescaled). Tolerance: fp32 rtol 1e-4, atol 1e-5
(scaled by the output's magnitude).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, first_difference, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "drive", "reference"]

EXERCISE = "the online-softmax update"
TASK = "update(m, l, acc, scores, v) returning the new (m, l, acc)"
RTOL, ATOL = 1e-4, 1e-5


@dataclass(frozen=True)
class SoftmaxCase:
    """`rows` queries over `keys` keys in blocks of `block`, head size `d`; `kind` shapes the scores."""

    rows: int
    keys: int
    block: int
    d: int = 4
    kind: str = "normal"
    seed: int = 0

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(700 + self.seed)
        s = rng.standard_normal((self.rows, self.keys)) * 2.0
        if self.kind == "huge":
            s = 1e4 + s * 50.0
        elif self.kind == "rising":
            s = s + np.linspace(0.0, 40.0, self.keys)[None, :]
        elif self.kind == "first_masked":
            s[:, : self.block] = -np.inf
        elif self.kind == "causal":  # row r sees keys up to (r + 1) * block - 1: later blocks fully masked
            for r in range(self.rows):
                s[r, (r + 1) * self.block:] = -np.inf
        elif self.kind == "middle_masked":
            s[:, self.block: 3 * self.block] = -np.inf
        v = rng.standard_normal((self.keys, self.d))
        return s.astype(np.float32), v.astype(np.float32)


CASES = (
    Case("one block holding all 8 keys", SoftmaxCase(4, 8, 8, seed=1)),
    Case("4 blocks of 16 keys", SoftmaxCase(5, 64, 16, seed=2)),
    Case("23 keys in blocks of 5 (the last block holds 3)", SoftmaxCase(3, 23, 5, seed=3)),
    Case("a max that rises block by block (logits 0 to 40)", SoftmaxCase(4, 40, 8, kind="rising", seed=4)),
    Case("the first block fully masked (-inf) for every row", SoftmaxCase(4, 24, 8, kind="first_masked", seed=5)),
    Case("blocks 2 and 3 masked (-inf), a 5-block row", SoftmaxCase(3, 30, 6, kind="middle_masked", seed=6)),
    Case("causal blocks: row r sees blocks 0..r only", SoftmaxCase(4, 32, 8, kind="causal", seed=7)),
    Case("huge logits around 1e4", SoftmaxCase(4, 32, 8, kind="huge", seed=8)),
    Case("blocks of a single key", SoftmaxCase(3, 7, 1, seed=9)),
)


def reference(scores: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(scores) @ v in float64 (the safe three-pass way)."""
    s = np.asarray(scores, np.float64)
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)) @ np.asarray(v, np.float64)


def drive(update, scores: np.ndarray, v: np.ndarray, block: int) -> np.ndarray:
    """Run `update` over the key blocks from m = -inf, l = 0, acc = 0; return acc / l (float32 state)."""
    rows, keys = scores.shape
    m = np.full((rows, 1), -np.inf, np.float32)
    l = np.zeros((rows, 1), np.float32)
    acc = np.zeros((rows, v.shape[1]), np.float32)
    for j in range(0, keys, block):
        out = attempt(update, m.copy(), l.copy(), acc.copy(), scores[:, j:j + block].copy(), v[j:j + block].copy())
        if is_stub(out):
            raise NotAnswered
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            what = f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list)) else type(out).__name__
            raise AnswerRaised(f"update must return (m, l, acc); it returned {what}")
        shapes = [(rows, 1), (rows, 1), (rows, v.shape[1])]
        arrays = [np.asarray(a) for a in out]
        for name, a, want in zip(("m", "l", "acc"), arrays, shapes):
            if a.shape != want:
                raise AnswerRaised(f"update returned {name} of shape {list(a.shape)}; it must keep {list(want)} "
                                   f"(block starting at key {j})")
        m, l, acc = (a.astype(np.float32) for a in arrays)
    with np.errstate(all="ignore"):
        return acc / l


def _judge(update, case: Case) -> str | None:
    c: SoftmaxCase = case.data
    scores, v = c.arrays()
    want = reference(scores, v)
    with np.errstate(all="ignore"):
        got = drive(update, scores, v, c.block)
    atol = ATOL * max(1.0, float(np.max(np.abs(want))))
    bad = first_difference(got, want, RTOL, atol)
    if bad is None:
        return None
    err, idx = bad
    where = f"[{','.join(map(str, idx))}]"
    if np.isnan(got[idx]):
        why = ("; a block where a row's scores are all -inf leaves m = -inf, and exp(-inf - (-inf)) is NaN: "
               "subtract a finite stand-in where the new max is -inf" if "masked" in c.kind or c.kind == "causal"
               else "; exp overflowed to inf and inf - inf is NaN: subtract the running max before exp"
               if c.kind == "huge" else "")
        return f"your output is NaN at {where} (the reference is {want[idx]:.4g}){why}"
    if np.isinf(got[idx]) or c.kind == "huge" and not np.isfinite(got).all():
        return f"your output is {got[idx]} at {where}: exp overflowed; subtract the running max before exp"
    hint = ""
    if c.kind == "rising" or c.keys > c.block:
        hint = " (when the max rises, what l and acc hold was summed under the old max: rescale both by " \
               "exp(m_old - m_new))"
    return f"your output differs from float64 softmax(scores) @ v by {err:.3g} at {where}{hint}"


def check(update) -> Verdict:
    """Grade `update(m, l, acc, scores, v) -> (m, l, acc)` against a float64 softmax(scores) @ v."""
    return grade(EXERCISE, update, CASES, _judge, task=TASK,
                 checked="Each case: acc / l after your update over every key block, against float64 softmax(scores) "
                         "@ v, rtol 1e-4, atol 1e-5 (scaled by the output's magnitude).")
