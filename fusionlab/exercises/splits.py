"""Exercise: into how many groups the cost model would cut a long chain of Adds (notebook 08).

The chain is `fusionlab.lessons.overfusion.add_chain(k)`: k Adds in a row, each bringing in one more input, the
chain notebook 08 §1 costs. Fused whole, it needs two more UB tiles per input, so a long chain gets tiles below
16 KiB and slower transfers; cut into parts (`overfusion.chain_plan(chain, parts)`), each cut writes the running
sum to device memory, reads it back and launches one more kernel. The learner writes ``best_parts(k, device)``:
the number of parts, 1 to k, with the lowest latency `fusionlab.cost.plan_cost` predicts on the preset (the
fewest parts at a tie). `check` prices every split of each hidden chain with `plan_cost` itself; the hidden cases
include chains whose tiles have shrunk but which still run best whole, chains where two parts win, one where
three do, and one chain on presets that disagree. The hint names the likely mistake: "fusion never loses" (1
part), or the UB-fit rule (the fewest parts that each fit the UB at 16 KiB tiles).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..analysis.working_set import DEFAULT_TILE_KB
from ..cost import model as cost
from ..cost.devices import Device, get as get_device
from ..lessons.overfusion import add_chain, chain_plan
from .core import AnswerRaised, Case, NotAnswered, Verdict, attempt, grade, is_stub

__all__ = ["EXERCISE", "TASK", "CASES", "Chain", "latencies", "best", "check"]

EXERCISE = "where to cut a long chain"
TASK = "best_parts(k, device) returning the number of parts"


@dataclass(frozen=True)
class Chain:
    """A hidden case: a chain of `adds` Adds on the preset called `device`."""

    adds: int
    device: str


CASES = (
    Case("8 Adds on the Atlas 800I A2 (9 inputs: more than its UB holds at 16 KiB tiles)", Chain(8, "Atlas 800I A2")),
    Case("24 Adds on the Atlas 800I A2 (the last row of §1's table)", Chain(24, "Atlas 800I A2")),
    Case("24 Adds on the Atlas 300I Pro", Chain(24, "Atlas 300I Pro")),
    Case("24 Adds on the Atlas 300I Duo (the Pro's UB, more bandwidth)", Chain(24, "Atlas 300I Duo")),
    Case("32 Adds on the Atlas 800I A2", Chain(32, "Atlas 800I A2")),
    Case("48 Adds on the Atlas 800I A2", Chain(48, "Atlas 800I A2")),
    Case("48 Adds on the Atlas 800T", Chain(48, "Atlas 800T")),
)


@lru_cache(maxsize=None)
def _priced(c: Chain) -> tuple[Device, tuple[cost.PlanCost, ...]]:
    """The device and the cost model's price of the chain cut into 1, 2, ..., k parts."""
    device = get_device(c.device)
    chain = add_chain(c.adds)
    a = cost.Analysis(chain, None, device.precision)
    return device, tuple(cost.plan_cost(chain, chain_plan(chain, p), device, analysis=a)
                         for p in range(1, c.adds + 1))


def latencies(c: Chain) -> list[float]:
    """Predicted latency (s) of the chain in 1, 2, ..., k parts."""
    return [pc.latency_s for pc in _priced(c)[1]]


def best(c: Chain) -> int:
    """The fewest parts at the lowest predicted latency."""
    lat = latencies(c)
    return min(range(len(lat)), key=lambda i: (lat[i], i)) + 1


def _fits_ub(c: Chain) -> int:
    """The UB-fit rule: the fewest parts whose groups all fit one core's UB at 16 KiB tiles."""
    device, priced = _priced(c)
    tile = int(DEFAULT_TILE_KB * 1024)
    return next(p for p, pc in enumerate(priced, 1) if all(k.buffers.bytes_at(tile) <= device.ub_bytes
                                                           for k in pc.kernels_detail))


def _at(c: Chain, parts: int) -> str:
    pc = _priced(c)[1][parts - 1]
    widest = max(pc.kernels_detail, key=lambda k: len(k.nodes))
    return (f"{parts} part{'s' if parts > 1 else ''}: {pc.latency_s * 1e6:.1f} µs (largest group: tile "
            f"{widest.tile / 1024:.1f} KiB, transfers x{widest.transfer_factor:.2f})")


def _judge(best_parts, case: Case) -> str | None:
    c = case.data
    got = attempt(best_parts, c.adds, get_device(c.device))
    if is_stub(got):
        raise NotAnswered
    if isinstance(got, bool) or not isinstance(got, (int, np.integer)) or not 1 <= got <= c.adds:
        raise AnswerRaised(f"best_parts must return an int from 1 to k={c.adds}, got {got!r}")
    got, want = int(got), best(c)
    if got == want:
        return None
    lat = latencies(c)
    why = ""
    if lat[got - 1] == lat[want - 1]:
        why = " (as fast: the fewest parts at the lowest latency is asked for)"
    elif got == 1:
        why = (" (fusion never loses: true while the slower transfers of one group cost less than the running sum "
               "a cut writes and reads back, plus a launch)")
    elif got == _fits_ub(c):
        why = (" (that is the fewest parts that each fit the UB at 16 KiB tiles: a group that does not fit gets "
               "smaller tiles, which slow its transfers only a little)")
    return f"you say {_at(c, got)}; the model's best is {_at(c, want)}{why}"


def check(best_parts) -> Verdict:
    """Grade `best_parts(k, device)` against the cost model's price of every split of each hidden chain."""
    return grade(EXERCISE, best_parts, CASES, _judge, task=TASK,
                 checked="Each chain: your number of parts against the fewest with the lowest latency "
                         "cost.plan_cost predicts, every split from 1 part to k priced.")
