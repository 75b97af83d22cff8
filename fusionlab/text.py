"""Plain-text tables: every table the package prints, in one format (nbval compares them)."""

from __future__ import annotations

import textwrap
from typing import Sequence

__all__ = ["text_table", "MAX_WIDTH", "clip", "wrap", "wrap_cell"]

#: Widest line a table may print: JupyterLab's notebook column shows about 110 monospace characters
#: at its default width before it wraps lines (and a wrapped table is unreadable).
MAX_WIDTH = 110
_MIN_COLUMN = 8


def clip(text: str, width: int) -> str:
    """`text` cut to `width` characters, ending in '…' when cut."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def wrap(text: object, width: int = MAX_WIDTH, indent: str = "    ") -> str:
    """`str(text)` with every line longer than `width` broken at spaces, continuations indented."""

    out = []
    for line in str(text).split("\n"):
        if len(line) <= width:
            out.append(line)
        else:
            out.append(textwrap.fill(line, width, subsequent_indent=indent, break_on_hyphens=False,
                                     drop_whitespace=True))
    return "\n".join(out)


def wrap_cell(text: str, width: int, seps: str = "+, ") -> list[str]:
    """`text` in pieces of at most `width` characters, each ending at a separator where one is in reach
    ('Reshape+Transpose+...' breaks after a '+'); a piece with no separator in reach is cut at `width`."""
    out = []
    while len(text) > width:
        cut = max(text.rfind(c, 0, width) for c in seps)
        cut = width if cut < 0 else cut + 1
        out.append(text[:cut].rstrip())
        text = text[cut:].lstrip()
    return out + [text]


def _split_header(h: str, cells_width: int) -> tuple[str, str]:
    """A header over two lines ('launches saved' -> 'launches' / 'saved') when that narrows its column."""
    best = (h, "")
    for i, ch in enumerate(h):
        if ch == " ":
            a, b = h[:i], h[i + 1:]
            if max(len(a), len(b), cells_width) < max(len(best[0]), len(best[1]), cells_width):
                best = (a, b)
    return best


def _fit(header: Sequence[str], rows: Sequence[Sequence[str]], max_width: int | None):
    """(header lines, column widths) so that a line fits in `max_width` when it can.

    First long headers go over two lines, then the widest columns are narrowed (their cells clipped)."""
    cells = [max([0] + [len(r[i]) for r in rows]) for i in range(len(header))]
    heads = [(h, "") for h in header]

    def total(ws):
        return sum(ws) + 2 * (len(ws) - 1)

    widths = [max(len(a), len(b), c) for (a, b), c in zip(heads, cells)]
    if max_width is None or total(widths) <= max_width:
        return heads, widths
    heads = [_split_header(h, c) for h, c in zip(header, cells)]
    if not any(b for _, b in heads):
        heads = [(h, "") for h in header]
    widths = [max(len(a), len(b), c) for (a, b), c in zip(heads, cells)]
    floor = [max(_MIN_COLUMN, len(a), len(b)) for a, b in heads]
    while total(widths) > max_width:
        i = max(range(len(widths)), key=lambda k: (widths[k] - floor[k], widths[k]))
        if widths[i] <= floor[i]:
            break  # nothing left to narrow: the table stays wider than max_width
        widths[i] -= 1
    return heads, widths


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, rule: bool = True,
               align: str = "left", max_width: int | None = MAX_WIDTH) -> list[str]:
    """Lines of a column-aligned table: the header, a dashed rule (optional), one line per row.

    A table wider than `max_width` first puts long headers over two lines, then narrows its widest
    columns, clipping their cells ('…').
    """
    heads, widths = _fit(header, rows, max_width)
    if align == "right":
        def line(vals):
            return "  ".join(clip(v, w).rjust(w) for v, w in zip(vals, widths))
    else:
        def line(vals):
            return "  ".join(clip(v, w).ljust(w) for v, w in zip(vals, widths)).rstrip()
    top = [line([a for a, _ in heads])]
    if any(b for _, b in heads):
        top.append(line([b for _, b in heads]))
    return top + ([line(["-" * w for w in widths])] if rule else []) + [line(r) for r in rows]
