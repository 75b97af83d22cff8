"""The on-chip working set of a fused kernel, in tiles: the one model the mixed pass and the cost model share.

A fused kernel on an Ascend AI core (or any tiled accelerator kernel) does not hold whole tensors on chip.
It streams them through the Unified Buffer (UB) in tiles, as the canonical Ascend C kernel does
(`cann_facts.md` §3.2: `TQue<..., BUFFER_NUM=2>`, `tileLength`):

- every tensor the group reads from device memory through the UB, and every tensor it writes back, takes
  **two** tiles (double buffering: the copy of tile i+1 overlaps the compute of tile i);
- an intermediate lives only in the UB, **one** tile, from the member that makes it to its last reader in
  the group's execution order (a compiler that reuses a buffer once its tensor is dead);
- inputs of Conv/MatMul/Gemm/pooling go to the cube unit through L1/L0, not through the UB: they are
  transfers, but take no UB tile; their outputs do (the epilogue runs on them in the UB).

A tensor smaller than the tile takes its own size. The working set at tile size T is

    Σ_inputs 2·min(b, T) + Σ_outputs 2·min(b, T) + max over the schedule of Σ_live intermediates min(b, T)

The **mixed pass** asks whether a candidate group fits its UB budget at the efficient tile
(`DEFAULT_TILE_KB`, 16 KiB) and splits it if not. The **cost model** asks the converse: given the UB of one
core, what is the largest tile the group can use (`WorkingSet.fit_tile`), and what does moving its tensors
in transfers of that size cost (`transfer_efficiency`)? A group that holds many live tensors gets smaller
tiles, and small transfers waste bandwidth. Nothing is ever "spilled": a group spills only if not even one
32-byte block per buffer fits (`BLOCK_BYTES`), which no group of a real network comes near.

Published figure behind the tile: Huawei's Ascend C best-practice guide ("Transferring a Large Data Block
at a Time", atlas_ascendc_best_practices_10_0013) says that, by measurement, transfers of more than 16 KB
reach the best bandwidth. The curve below 16 KiB is **modelled**: a fixed cost per transfer (the time to
move `TRANSFER_OVERHEAD_BYTES`), chosen so that a 16 KiB transfer reaches 90 % of the streaming rate. The
guide's figure shows a curve of this shape; its exact values are for one processor and not published as
numbers. The UB block is 32 bytes (`ubblock_size=32` in the SoC ini files, `cann_facts.md` §3.3).

Simplifications, stated: tensors are not split across cores first (a tensor of b bytes on c cores moves
b/c per core; small tensors are therefore treated as more efficient than they are); alignment (512 B GM
addresses on A2) and bank conflicts are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["DEFAULT_TILE_KB", "BLOCK_BYTES", "DOUBLE_BUFFER", "TRANSFER_OVERHEAD_BYTES", "Member", "Buffer",
           "WorkingSet", "working_set", "transfer_efficiency"]

#: the efficient tile: transfers of at least 16 KB reach the best bandwidth (Ascend C best practices, 10_0013)
DEFAULT_TILE_KB = 16.0
#: the UB's allocation unit (ubblock_size=32)
BLOCK_BYTES = 32
#: tiles per tensor moved to or from device memory (copy-in/copy-out overlap compute)
DOUBLE_BUFFER = 2
#: modelled per-transfer overhead, in bytes of streaming time: 16 KiB / (16 KiB + this) = 90 %
TRANSFER_OVERHEAD_BYTES = int(DEFAULT_TILE_KB * 1024 / 9)


def transfer_efficiency(size: int, efficient: int = int(DEFAULT_TILE_KB * 1024),
                        overhead: int = TRANSFER_OVERHEAD_BYTES) -> float:
    """Fraction of the device's bandwidth one transfer of `size` bytes reaches (1 at >= `efficient` bytes; modelled).

    A transfer costs a fixed overhead plus its bytes at the streaming rate (t = t0 + s/B, Hockney's model);
    the device's published bandwidth is taken as what transfers of `efficient` bytes or more reach.
    """
    if size <= 0:
        return 1.0
    if size >= efficient:
        return 1.0
    raw = size / (size + overhead)
    return raw / (efficient / (efficient + overhead))


@dataclass(frozen=True)
class Member:
    """One member of a group, as the working-set model sees it.

    `reads`: tensors it reads from outside the group, (key, bytes); `writes`: tensors it hands on (written to
    device memory); `keeps`: intermediates (key, bytes, position of the last member reading it). `cube`: its
    reads go to the cube unit through L1, not through the UB.
    """

    cube: bool = False
    reads: tuple[tuple[str, int], ...] = ()
    writes: tuple[tuple[str, int], ...] = ()
    keeps: tuple[tuple[str, int, int], ...] = ()
    op: str = ""  # the member's op type, for `WorkingSet.account` (no effect on the sizes)


@dataclass(frozen=True)
class Buffer:
    """A tensor the kernel touches: its bytes, how it travels, and when it is live in the UB."""

    key: str
    bytes: int
    role: str  # "in" (device memory -> UB), "l1" (device memory -> L1 -> cube), "out" (UB -> device memory), "mid"
    start: int = 0
    end: int = 0
    op: str = ""  # op type of the member that reads it (in, l1) or makes it (out, mid)

    @property
    def copies(self) -> int:
        """UB tiles it takes: 2 for a transfer through the UB, 1 for an intermediate, 0 through L1."""
        return {"in": DOUBLE_BUFFER, "out": DOUBLE_BUFFER, "mid": 1}.get(self.role, 0)


@dataclass(frozen=True)
class WorkingSet:
    """The buffers of one kernel and what they take in the UB at a given tile size."""

    buffers: tuple[Buffer, ...]
    steps: int = 1
    ops: tuple[str, ...] = ()  # the members' op types in order (for `describe`)

    def bytes_at(self, tile: int) -> int:
        """UB bytes the kernel needs with tiles of `tile` bytes (the formula in the module docstring)."""
        fixed = sum(b.copies * min(b.bytes, tile) for b in self.buffers if b.role in ("in", "out"))
        mids = [b for b in self.buffers if b.role == "mid"]
        peak = 0
        for k in range(self.steps):
            peak = max(peak, sum(min(b.bytes, tile) for b in mids if b.start <= k <= b.end))
        return fixed + peak

    def fit_tile(self, budget: int) -> int | None:
        """The largest tile (a multiple of 32 B) whose working set fits `budget` bytes; None if not even 32 B fits."""
        sizes = [b.bytes for b in self.buffers if b.copies]
        if not sizes:
            return max((b.bytes for b in self.buffers), default=BLOCK_BYTES)
        largest = max(sizes)
        if self.bytes_at(largest) <= budget:
            return largest
        if self.bytes_at(BLOCK_BYTES) > budget:
            return None
        lo, hi = 1, largest // BLOCK_BYTES  # bytes_at is non-decreasing in the tile: bisect on blocks
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.bytes_at(mid * BLOCK_BYTES) <= budget:
                lo = mid
            else:
                hi = mid - 1
        return lo * BLOCK_BYTES

    def peak_step(self, tile: int) -> int:
        """The first member position at which the live intermediates take the most UB (what `bytes_at` counts)."""
        mids = [b for b in self.buffers if b.role == "mid"]
        live = [sum(min(b.bytes, tile) for b in mids if b.start <= k <= b.end) for k in range(self.steps)]
        return max(range(self.steps), key=lambda k: (live[k], -k))

    def account(self, tile: int) -> list[tuple[Buffer, int, int]]:
        """What `bytes_at(tile)` is made of: (buffer, UB copies, bytes) for every buffer it counts.

        The transfers through the UB (two copies each) and the intermediates live at `peak_step`; the bytes
        add up to `bytes_at(tile)` exactly, so a sentence built from this account cannot disagree with it.
        """
        k = self.peak_step(tile)
        rows = []
        for b in self.buffers:
            if b.role in ("in", "out") or (b.role == "mid" and b.start <= k <= b.end):
                rows.append((b, b.copies, b.copies * min(b.bytes, tile)))
        return rows

    def describe(self, tile: int) -> str:
        """`account(tile)` in words: which tensors take the UB at the peak, and how many tiles each.

        Tensors at least a tile large are named by the op that reads (inputs) or makes (the rest) them;
        smaller ones (a BatchNorm's per-channel parameters, a reduction's output) are summed.
        """
        rows = self.account(tile)
        full = [(b, c) for b, c, _ in rows if b.bytes >= tile]
        small = [(b, n) for b, c, n in rows if b.bytes < tile]
        k = self.peak_step(tile)
        parts = []
        for b, c in full:
            if b.role == "in":
                parts.append(f"an input of the {b.op or 'group'} read from memory ({c} tiles, double-buffered)")
        mids = [b for b, c in full if b.role == "mid"]
        if mids:
            at = f", all live while the {self.ops[k]} runs" if self.ops and len(mids) > 1 else ""
            parts.append(f"the output{'s' if len(mids) > 1 else ''} of the {_join([b.op for b in mids])}, kept on chip "
                         f"(one tile each{at})")
        for b, c in full:
            if b.role == "out":
                parts.append(f"the {b.op or 'group'}'s output written to memory ({c} tiles, double-buffered)")
        if small:
            parts.append(f"{len(small)} tensor{'s' if len(small) > 1 else ''} smaller than a tile "
                         f"({sum(n for _, n in small) / 1024:.1f} KiB, of the {_join(sorted({b.op for b, _ in small}))})")
        tiles = sum(c for _, c in full)
        return (f"{tiles} tiles of {tile / 1024:g} KiB = {tiles * tile / 1024:g} KiB: " + "; ".join(parts)
                + f"; {self.bytes_at(tile) / 1024:.1f} KiB in all")

    def transfers(self) -> list[Buffer]:
        """The buffers moved between device memory and the chip (inputs through UB or L1, outputs)."""
        return [b for b in self.buffers if b.role in ("in", "l1", "out")]

    def intermediates(self) -> list[Buffer]:
        return [b for b in self.buffers if b.role == "mid"]

    def transfer_time_factor(self, tile: int | None, efficient_kb: float | None = DEFAULT_TILE_KB) -> float:
        """Traffic-weighted 1/efficiency of the UB transfers at this tile (1.0: the device's full bandwidth).

        `efficient_kb` is the transfer size that reaches the full bandwidth (None: every size does).
        """
        moved = [b for b in self.transfers() if b.bytes > 0]
        total = sum(b.bytes for b in moved)
        if not total or efficient_kb is None:
            return 1.0
        efficient = int(efficient_kb * 1024)
        overhead = efficient // 9
        slow = 0.0
        for b in moved:
            size = b.bytes if b.role == "l1" or tile is None else min(b.bytes, tile)
            slow += b.bytes / (1.0 if b.role == "l1" else transfer_efficiency(size, efficient, overhead))
        return slow / total


def working_set(members: Sequence[Member]) -> WorkingSet:
    """The buffers of a group whose members run in this order (see the module docstring for the rules)."""
    buffers: dict[str, Buffer] = {}
    for pos, m in enumerate(members):
        for key, size in m.reads:
            role = "l1" if m.cube else "in"
            k = f"{role}:{key}"  # a tensor read by the cube and by the vector unit travels twice (L1 and UB)
            if k not in buffers:
                buffers[k] = Buffer(key, int(size), role, op=m.op)
        for key, size in m.writes:
            buffers.setdefault(f"out:{key}", Buffer(key, int(size), "out", op=m.op))
        for key, size, last in m.keeps:
            buffers.setdefault(f"mid:{key}", Buffer(key, int(size), "mid", pos, last, op=m.op))
    return WorkingSet(tuple(buffers.values()), steps=max(len(members), 1), ops=tuple(m.op for m in members))


def _join(words: Sequence[str]) -> str:
    words = [w or "?" for w in words]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]

