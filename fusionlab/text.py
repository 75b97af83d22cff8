"""Plain-text tables: every table the package prints, in one format (nbval compares them)."""

from __future__ import annotations

from typing import Sequence

__all__ = ["text_table"]


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, rule: bool = True,
               align: str = "left") -> list[str]:
    """Lines of a column-aligned table: the header, a dashed rule (optional), one line per row."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    if align == "right":
        def line(vals):
            return "  ".join(v.rjust(w) for v, w in zip(vals, widths))
    else:
        def line(vals):
            return "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()
    return [line(header)] + ([line(["-" * w for w in widths])] if rule else []) + [line(r) for r in rows]
