"""Exercise: rotate queries and keys as LLaMA does (notebook 11).

The learner writes ``apply_rotary(x, positions, base)``: the rotary embedding of ``x`` [..., S, D] at the token
positions [S], in LLaMA's half-rotated form (channel i paired with channel i + D/2, turned by the angle p·θᵢ,
θᵢ = base^(−2i/D)), as notebook 11 §4 writes it: ``x · cos + rotate_half(x) · sin``. `check(apply_rotary)` grades
it on hidden shapes against onnxruntime's own ``com.microsoft:RotaryEmbedding`` kernel (``interleaved=0``, the
op fusionlab's `rotary` rule writes), fed the cos/sin cache of `lessons.decoding.rope_tables`, and names the
likely mistake: the interleaved form (pairs 2i, 2i + 1), the exponent −i/D for −2i/D, or the turn the wrong way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import helper

from ..build import make_model, tensor, value_info
from ..lessons.decoding import rope_tables
from ..verification import runtime
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, first_difference, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "run_rotary"]

EXERCISE = "rotary embeddings, LLaMA's half-rotated form"
TASK = "apply_rotary(x, positions, base)"
RTOL, ATOL = 1e-4, 1e-5  # float32 (onnxruntime) against the learner's float32 or float64


@dataclass(frozen=True)
class RotaryCase:
    shape: tuple  # [N heads, S, D]
    positions: tuple
    base: float = 10000.0
    seed: int = 0

    @property
    def x(self) -> np.ndarray:
        if self.seed < 0:  # notebook 11 §4's vector, at each position
            return np.tile(np.array([1.0, 0.0, 0.5, 2.0], np.float32), (1, len(self.positions), 1))
        return np.random.default_rng(self.seed).standard_normal(self.shape).astype(np.float32)


CASES = (
    Case("notebook 11's vector [1, 0, 0.5, 2] at positions 0, 1, 2 (D = 4)", RotaryCase((1, 3, 4), (0, 1, 2), seed=-1)),
    Case("one head of 64 at positions 0..7", RotaryCase((1, 8, 64), tuple(range(8)), seed=1)),
    Case("a decode step: 12 query heads of 64, one token at position 300", RotaryCase((12, 1, 64), (300,), seed=2)),
    Case("4 K/V heads of 16, positions 5..9 (a prompt after 5 cached tokens)",
         RotaryCase((4, 5, 16), (5, 6, 7, 8, 9), seed=3)),
    Case("head size 128 with LLaMA 3's base 500000, positions 0, 17, 255",
         RotaryCase((2, 3, 128), (0, 17, 255), base=500000.0, seed=4)),
)


def run_rotary(x: np.ndarray, positions, base: float = 10000.0, interleaved: bool = False) -> np.ndarray:
    """onnxruntime's com.microsoft:RotaryEmbedding on x [N, S, D] (as [1, N, S, D]), its cos/sin cache the first
    D/2 columns of `rope_tables` for positions 0..max(positions), the positions given as position_ids."""
    x = np.asarray(x, np.float32)
    n, s, d = x.shape
    pos = np.asarray(positions, np.int64)
    cos, sin = rope_tables(np.arange(int(pos.max()) + 1), d, base)
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft",
                            interleaved=int(interleaved))
    model = make_model([node], [value_info("x", np.float32, [1, n, s, d]), value_info("pos", np.int64, [1, s])],
                       [value_info("y", np.float32, [1, n, s, d])],
                       [tensor("cos", cos[:, : d // 2].astype(np.float32)),
                        tensor("sin", sin[:, : d // 2].astype(np.float32))],
                       opset=17, extra_opsets={"com.microsoft": 1})
    return runtime.session(model, "disable").run(["y"], {"x": x[None], "pos": pos[None]})[0][0]


def _variants(c: RotaryCase, x: np.ndarray) -> list[tuple[np.ndarray, str]]:
    """What the usual mistakes give on this case, and their names."""
    pos, d = np.asarray(c.positions), x.shape[-1]
    out = [(run_rotary(x, pos, c.base, interleaved=True),
            "the interleaved form (pairs 2i, 2i + 1): LLaMA pairs channel i with channel i + D/2"),
           (_numpy_rope(x, -pos.astype(float), c.base),
            "the rotation turned the wrong way: rotate_half(x) is [-x2, x1], the second half negated and put first")]
    half_exp = 1.0 / c.base ** (np.arange(d // 2) / d)  # base^(-i/D)
    ang = pos[:, None] * half_exp[None]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)
    out.append((x * cos + rot * sin, "the angles of base^(-i/D): the exponent is -2i/D"))
    return out


def _numpy_rope(x, positions, base):
    cos, sin = rope_tables(positions, x.shape[-1], base)
    d = x.shape[-1]
    return x * cos + np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1) * sin


def _judge(apply_rotary, case: Case) -> str | None:
    c: RotaryCase = case.data
    x = c.x
    got = attempt(apply_rotary, x.copy(), np.array(c.positions, np.int64), c.base)
    if is_stub(got):
        raise NotAnswered
    try:
        got = np.asarray(got, np.float64)
    except (TypeError, ValueError):
        raise AnswerRaised(f"apply_rotary must return an array, got {type(got).__name__}") from None
    if got.shape != x.shape:
        return f"your result has shape {got.shape}; x has {x.shape} (rotate each head's vectors in place)"
    want = run_rotary(x, c.positions, c.base)
    scale = float(np.abs(want).max())
    bad = first_difference(got, want, RTOL, ATOL * scale)
    if bad is None:
        return None
    err, idx = bad
    like = [words for value, words in _variants(c, x) if first_difference(got, value, RTOL, ATOL * scale) is None]
    return (f"at index {idx} you give {got[idx]:.6g}, onnxruntime's RotaryEmbedding {want[idx]:.6g} (off by "
            f"{err:.2g})" + (f": that is {like[0]}" if like else ""))


def check(apply_rotary) -> Verdict:
    """Grade `apply_rotary(x, positions, base)` on the hidden shapes."""
    return grade(EXERCISE, apply_rotary, CASES, _judge, task=TASK,
                 checked=f"Each case: your rotation against onnxruntime's RotaryEmbedding (interleaved=0) with the "
                         f"cos/sin of decoding.rope_tables, within rtol {RTOL:g} / atol {ATOL:g} x max |y|.")
