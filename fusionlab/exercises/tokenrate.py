"""Exercise: the most tokens per second one chip can generate, from the bytes and FLOPs of a decode step (notebook 12).

The learner writes ``tokens_per_second(cfg, context, batch, device) -> float``: an upper bound on the tokens per
second one chip of `device` (a `fusionlab.cost.devices` preset; the Atlas 300I Duo is a card of two) generates for
`batch` requests decoded together, each with `context` tokens cached, for the decoder shape `cfg`
(`lessons.decoding.LlamaConfig`) in fp16: a step's time is at least the larger of its bytes over the chip's
bandwidth and its FLOPs over the chip's fp16 peak, where the batch shares one read of the weights and each request
reads its own embedding row and cache and writes its new K/V (all of `token_bytes`'s total but the weights); the
step makes `batch` tokens. `check(tokens_per_second)` grades it against
``lessons.decoding.modelled_decode(cfg, context, device, batch=batch)``, the model notebook 12 §5 prints, prints
the relative difference (the counts left out are small), and names the likely mistake: the whole card's
bandwidth, the weights read once per request, the cache left out, only the cache read (or the embedding row or the
new K/V left out), the compute time ignored where the batch makes the step compute-bound, fp32 bytes, or one token
per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cost.devices import get as get_device
from ..lessons.decoding import LlamaConfig, modelled_decode, step_flops, token_bytes
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "check", "expected"]

EXERCISE = "tokens per second at most"
TASK = "tokens_per_second(cfg, context, batch, device)"
RTOL = 1e-6

#: the 8-billion-parameter LLaMA-style shape of notebook 11 §3
BIG = LlamaConfig(vocab=128256, hidden=4096, heads=32, kv_heads=8, intermediate=14336, layers=32)


@dataclass(frozen=True)
class Step:
    """One decode step: the shape, the context each request has cached, the batch, the preset."""

    cfg: LlamaConfig
    context: int
    batch: int
    device: str


CASES = (
    Case("the 8B shape, 4096 cached, one request, on the Atlas 300I Pro", Step(BIG, 4096, 1, "Atlas 300I Pro")),
    Case("the same on the Atlas 300I Duo (a card of two chips)", Step(BIG, 4096, 1, "Atlas 300I Duo")),
    Case("notebook 12's decoder, 128 cached, one request, on the Atlas 800I A2", Step(LlamaConfig(), 128, 1,
                                                                                       "Atlas 800I A2")),
    Case("the 8B shape, 16 requests with 4096 cached each, on the Atlas 800I A2", Step(BIG, 4096, 16,
                                                                                         "Atlas 800I A2")),
    Case("the 8B shape, 512 requests each at its first token (nothing cached), on the Atlas 800I A2",
         Step(BIG, 0, 512, "Atlas 800I A2")),
    Case("the 8B shape, 512 requests with 4096 cached each, on the Atlas 800I A2", Step(BIG, 4096, 512,
                                                                                          "Atlas 800I A2")),
)


def expected(s: Step) -> dict:
    """The lesson's model of the step (`modelled_decode`): its bytes, FLOPs, times and tokens/s bound."""
    return modelled_decode(s.cfg, s.context, get_device(s.device), batch=s.batch)


def _mistakes(s: Step) -> list[tuple[float, str]]:
    """(tokens/s, words) of the plausible wrong answers, from the same counts the lesson makes."""
    d = get_device(s.device)
    chip = d.one_chip()
    b, f = s.batch, s.batch * step_flops(s.cfg, s.context, 1)

    def rate(nbytes, bandwidth=chip.bandwidth, flops=f, tokens=b):
        return tokens / max(nbytes / bandwidth, flops / chip.peak_flops("float16"))

    tb, tb4 = token_bytes(s.cfg, s.context, 1, 2), token_bytes(s.cfg, s.context, 1, 4)
    own = tb["total"] - tb["weights"]
    right = tb["weights"] + b * own
    return [
        (rate(right, bandwidth=d.bandwidth), f"the whole card's {d.mem_bandwidth_gbs:g} GB/s: one model instance "
                                             f"runs on one chip, {chip.mem_bandwidth_gbs:g} GB/s"),
        (rate(b * tb["total"]), "the weights read once per request: the batch shares one read of them"),
        (rate(tb["weights"] + b * (own - tb["KV cache read"])), "the KV cache left out: each request reads its own"),
        (rate(tb["weights"] + b * tb["KV cache read"]), "only the cache read: each request also reads its embedding "
                                                        "row and writes its new K/V"),
        (rate(right - b * tb["embedding rows"]), "the embedding row left out: each request reads its token's row"),
        (rate(right - b * tb["KV cache written"]), "the new K/V left out: each request writes its token's K and V"),
        (b / (right / chip.bandwidth), "the memory time alone: with a large batch the FLOPs take longer"),
        (rate(tb4["weights"] + b * (tb4["total"] - tb4["weights"])), "fp32 bytes: the model runs in fp16, 2 bytes"),
        (rate(right, tokens=1), "one token per step: the step makes one token for each request in the batch"),
    ]


def _judge(tokens_per_second, case: Case) -> str | None:
    s: Step = case.data
    got = attempt(tokens_per_second, s.cfg, s.context, s.batch, get_device(s.device))
    if is_stub(got):
        raise NotAnswered
    if isinstance(got, bool) or not isinstance(got, (int, float, np.integer, np.floating)):
        raise AnswerRaised(f"tokens_per_second must return a number, got {type(got).__name__}")
    got = float(got)
    m = expected(s)
    want = m["tokens_per_s_bound"]
    if np.isfinite(got) and abs(got - want) <= RTOL * want:
        return None
    near = [(abs(got - value), words) for value, words in _mistakes(s)
            if np.isclose(got, value, rtol=RTOL, atol=0.0) and not np.isclose(value, want, rtol=RTOL, atol=0.0)]
    said = [words for gap, words in near if gap == min(g for g, _ in near)]  # the closest, where several are near
    bound = "memory" if m["t_memory_s"] >= m["t_compute_s"] else "compute"
    return (f"you say {_digits(got, want)} tokens/s, {_off(got, want)}; the model says {_digits(want, got)} "
            f"({_size(m['bytes'])}, {_size(m['flops'], 'FLOP')} a step, {bound}-bound)"
            + (f" (that is {' or '.join(said)})" if said else ""))


def _digits(x: float, other: float) -> str:
    """`x` with the fewest decimals (one at least, six at most) that tell it from `other`."""
    for k in range(1, 7):
        if f"{x:,.{k}f}" != f"{other:,.{k}f}":
            break
    return f"{x:,.{k}f}"


def _off(got: float, want: float) -> str:
    """'0.0123% too many' (or too few): how far off, relative to the model's figure."""
    if not np.isfinite(got):
        return "not a finite number"
    return f"{100 * abs(got - want) / want:.3g}% {'too many' if got > want else 'too few'}"


def _size(x: float, unit: str = "B") -> str:
    """`x` bytes (binary prefixes) or FLOP (decimal prefixes) with three significant digits: 14.5 GiB, 21.4 MFLOP."""
    base, prefixes = (1024, ("", "Ki", "Mi", "Gi", "Ti")) if unit == "B" else (1000, ("", "k", "M", "G", "T"))
    k = 0
    while k < len(prefixes) - 1 and x >= base ** (k + 1):
        k += 1
    return f"{x / base ** k:.3g} {prefixes[k]}{unit}"


def check(tokens_per_second) -> Verdict:
    """Grade `tokens_per_second(cfg, context, batch, device)` on the hidden steps."""
    return grade(EXERCISE, tokens_per_second, CASES, _judge, task=TASK,
                 checked="Each step: your tokens/s against lessons.decoding.modelled_decode's bound (bytes over one "
                         "chip's bandwidth, FLOPs over its fp16 peak), within 1e-6 relative.")
