"""Drawing a layout with matplotlib: boxes, groups, the legend; `draw`, `before_after`, `save_picture`."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Sequence

from ..files import atomic_write
from ..plan import FusionGroup, FusionPlan
from .layout import Layout, layout_scene
from .scene import FONT, group_colors, scene_of

__all__ = ["before_after", "draw", "save_picture"]


# --------------------------------------------------------------------------------------------------
# matplotlib drawing
# --------------------------------------------------------------------------------------------------

_MAX_INCHES = 40.0
#: a drawing is never scaled below this (fonts stay readable: 9 pt x 0.7 at 120 dpi is 10 px); a bigger
#: model makes a bigger picture, in bands of layers (`wrap="auto"`) so it is not one tall strip
_MIN_SCALE = 0.7
_MARGIN = 0.2
_FUSED_FACE, _FUSED_EDGE = "#fff3d1", "#b7791f"
_LEGEND_ROW = 0.24  # inches per legend row


def _legend_entries(groups: list[tuple[FusionGroup, list[str]]]) -> list[tuple[str, str, int]]:
    colors = group_colors([g for g, _ in groups])
    seen: dict[tuple[str, str], list] = {}
    for g, _ in groups:
        seen.setdefault((g.kind, g.rule), [colors[g.id], 0])[1] += 1
    return [(f"{kind} · {rule} ({n} group{'s' if n != 1 else ''})", col, n) for (kind, rule), (col, n) in seen.items()]


def _legend_columns(n: int) -> int:
    return min(3, n) if n else 1


def _group_parts(lay: Layout, ks: list[str]) -> list[list[str]]:
    """A group's members by band (one rectangle per band, so a group cut by a wrap draws no giant box)."""
    by_band: dict[int, list[str]] = {}
    for k in ks:
        by_band.setdefault(lay.band_of.get(k, 0), []).append(k)
    return [by_band[b] for b in sorted(by_band)]


def _render(lay: Layout, ax, *, title: str | None, scale: float) -> None:
    colors = group_colors([g for g, _ in lay.groups])
    member_color = {k: colors[g.id] for g, ks in lay.groups for k in ks}
    _draw_groups(lay, ax, colors, scale)
    _draw_edges(lay, ax, scale)
    _draw_boxes(lay, ax, member_color, scale)
    _finish_axes(lay, ax, title, scale)


def _draw_groups(lay: Layout, ax, colors: dict, scale: float) -> None:
    """One rounded rectangle per fusion group (per band it spans), behind its members, with the group's id."""
    from matplotlib.patches import FancyBboxPatch

    pad = 0.09
    label_strip = 0.14  # room above the members for the group's id, so no box hides it
    for g, ks in lay.groups:
        col = colors[g.id]
        for part_no, part in enumerate(_group_parts(lay, ks)):
            boxes = [lay.box(k) for k in part]
            x0, y0 = min(b[0] for b in boxes) - pad, min(b[1] for b in boxes) - pad
            x1, y1 = max(b[2] for b in boxes) + pad, max(b[3] for b in boxes) + pad + label_strip
            suffix = "" if part_no == 0 else f":part{part_no}"
            rect = FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0,rounding_size=0.1",
                                  facecolor=col, alpha=0.16, edgecolor="none", zorder=1)
            rect.set_gid(f"group:{g.id}" if part_no == 0 else f"group-part:{g.id}{suffix}")
            ax.add_patch(rect)
            outline = FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0,rounding_size=0.1",
                                     facecolor="none", edgecolor=col, linewidth=1.2 * scale, linestyle="--", zorder=1)
            outline.set_gid(f"group-outline:{g.id}{suffix}")
            ax.add_patch(outline)
            ax.text(x0 + 0.07, y1 - 0.025, g.id if part_no == 0 else f"{g.id} (cont.)", ha="left", va="top",
                    fontsize=7.5 * scale, color=col, zorder=6, fontfamily=FONT, fontweight="bold", clip_on=False,
                    bbox={"boxstyle": "round,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})


def _draw_edges(lay: Layout, ax, scale: float) -> None:
    """The edges; a value read by nodes not drawn, or made by one, as a dashed grey stub."""
    from matplotlib.patches import FancyArrowPatch
    from matplotlib.path import Path as MplPath

    for a, b, pts in lay.edges:
        codes = [MplPath.MOVETO] + [MplPath.LINETO] * (len(pts) - 1)
        # a value read by nodes not drawn, or made by one: a dashed grey stub, no output or input pill
        cut = lay.kinds.get(b) == "cut" or lay.kinds.get(a) == "from"
        arrow = FancyArrowPatch(path=MplPath(pts, codes), arrowstyle="-|>", mutation_scale=9 * scale,
                                linewidth=0.9 * scale, color="#999999" if cut else "#555555", shrinkA=0, shrinkB=0,
                                zorder=2, linestyle="--" if cut else "-")
        arrow.set_gid(f"edge:{a}->{b}")
        ax.add_patch(arrow)


def _draw_boxes(lay: Layout, ax, member_color: dict, scale: float) -> None:
    """One box per op or value (fused ops highlighted), with its label; a stub's end as plain grey text."""
    from matplotlib.patches import FancyBboxPatch

    for k, (xc, yc) in lay.positions.items():
        w, h = lay.sizes[k]
        kind = lay.kinds[k]
        head, sub = lay.labels[k]
        fused = k in lay.fused
        if kind in ("cut", "from"):  # plain grey text at the stub's end: no box, never read as a graph output/input
            ax.text(xc, yc + (0.075 if sub else 0), head, ha="center", va="center", fontsize=8 * scale, zorder=4,
                    fontfamily=FONT, color="#666666", style="italic", gid=f"{kind}:{k}")
            if sub:
                ax.text(xc, yc - 0.095, sub, ha="center", va="center", fontsize=7 * scale, color="#888888",
                        zorder=4, fontfamily=FONT, style="italic")
            continue
        if kind == "op":
            face, edge, lw, rounding = "#ffffff", member_color.get(k, "#444444"), (1.6 if k in member_color else 0.9), 0.06
            if fused:
                face, edge, lw = _FUSED_FACE, member_color.get(k, _FUSED_EDGE), 2.2
        else:
            face, edge, lw, rounding = "#eeeeee", "#888888", 0.8, min(h / 2, 0.15)
        box = FancyBboxPatch((xc - w / 2, yc - h / 2), w, h, boxstyle=f"round,pad=0,rounding_size={rounding}",
                             facecolor=face, edgecolor=edge, linewidth=lw * scale, zorder=3)
        box.set_gid(f"node:{k}")
        ax.add_patch(box)
        if sub:
            ax.text(xc, yc + 0.075, head, ha="center", va="center", fontsize=9 * scale, zorder=4, fontfamily=FONT,
                    fontweight="bold" if kind == "op" else "normal")
            ax.text(xc, yc - 0.095, sub, ha="center", va="center", fontsize=7 * scale,
                    color="#7a4b00" if fused else "#555555", zorder=4, fontfamily=FONT)
        else:
            ax.text(xc, yc, head, ha="center", va="center", fontsize=9 * scale, zorder=4, fontfamily=FONT,
                    fontweight="bold" if kind == "op" else "normal")


def _finish_axes(lay: Layout, ax, title: str | None, scale: float) -> None:
    """Limits, aspect, the legend of groups and fused ops at the top, and the title above it."""
    from matplotlib.patches import Patch

    x0, y0, x1, y1 = lay.extent()
    m = _MARGIN
    ax.set_xlim(x0 - m, x1 + m)
    ax.set_ylim(y0 - m, y1 + m)
    ax.set_aspect("equal", adjustable="box")
    ax.axis("off")
    entries = _legend_entries(lay.groups)
    handles = [Patch(facecolor=col + "29", edgecolor=col, label=text) for text, col, _ in entries]
    if lay.fused:
        handles.append(Patch(facecolor=_FUSED_FACE, edgecolor=_FUSED_EDGE, linewidth=2,
                             label=f"fused op ({len(lay.fused)}): '= …' names the original ops it replaces"))
    if title:
        ax.set_title(title, fontsize=11 * scale, fontfamily=FONT, pad=(6 + _LEGEND_ROW * 72 * scale *
                     math.ceil(len(handles) / _legend_columns(len(handles))) if handles else 6))
    if handles:  # at the top, where a reader starts (below a tall drawing it was off screen)
        ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=_legend_columns(len(handles)),
                  frameon=False, prop={"family": FONT, "size": 8 * scale}, handlelength=1.6, borderaxespad=0.3)


def _check_size(lay_or_scene_ops: int, max_nodes: int | None) -> None:
    if max_nodes is not None and lay_or_scene_ops > max_nodes:
        raise ValueError(
            f"graph has {lay_or_scene_ops} nodes, more than max_nodes={max_nodes}: draw a part with "
            f"nodes=[...] (e.g. nodes=viz.neighbourhood(model, ['some_node'], hops=3)) or raise max_nodes"
        )


def _legend_rows(lay: Layout) -> int:
    n = len(_legend_entries(lay.groups)) + (1 if lay.fused else 0)
    return math.ceil(n / _legend_columns(n)) if n else 0


def _figure_inches(lay: Layout, n_legend: int, title: bool) -> tuple[float, float, float, float]:
    """(width, height, extra height for title and legend, scale): 1 up to _MAX_INCHES, then smaller, never
    below _MIN_SCALE (a bigger model makes a bigger picture rather than unreadable text)."""
    w = lay.width + 2 * _MARGIN
    h = lay.height + 2 * _MARGIN
    extra_h = (0.35 if title else 0) + (_LEGEND_ROW * n_legend + 0.1 if n_legend else 0)
    scale = max(_MIN_SCALE, min(1.0, _MAX_INCHES / max(w, h + extra_h)))
    return w, h, extra_h, scale


def draw(model, plan: FusionPlan | None = None, *, nodes=None, ax=None, title: str | None = None,
         max_nodes: int | None = None, direction: str = "TB", hops: int = 0, wrap="auto", source=None):
    """A matplotlib Figure of a model: op boxes, arrows, fusion groups as coloured rounded rectangles, fused
    ops (a `source`'s nodes they stand for, or contrib ops) filled, the legend on top.

    Any size: a tall graph is laid out in bands of consecutive layers side by side (`wrap="auto"`; an int
    forces that many, None one column), and text is never scaled below `_MIN_SCALE`. `max_nodes` refuses
    bigger drawings when given."""
    sc = scene_of(model, plan, nodes, hops, source)
    _check_size(sc.op_count, max_nodes)
    lay = layout_scene(sc, direction, wrap if ax is None else None)
    rows = _legend_rows(lay)
    w, h, extra_h, scale = _figure_inches(lay, rows, bool(title))
    if ax is None:
        import matplotlib.pyplot as plt

        fw, fh = max(w, 2.5) * scale, (h + extra_h) * scale
        fig = plt.figure(figsize=(fw, fh))
        plt.close(fig)  # not managed by pyplot: a notebook shows the returned figure once, not twice
        ax = fig.add_axes((0, 0, 1, h * scale / fh))  # the legend and the title above it
    else:
        fig = ax.figure
        bbox = ax.get_position()
        fw, fh = fig.get_size_inches()
        scale = min(1.0, bbox.width * fw / w, bbox.height * fh / h)
        scale = max(scale, 0.35)
    _render(lay, ax, title=title, scale=scale)
    return fig


def before_after(model_a, model_b, plan: FusionPlan | None = None, *, nodes_a=None, nodes_b=None,
                 titles: Sequence[str] = ("before", "after"), plan_b: FusionPlan | None = None,
                 direction: str = "TB", max_nodes: int | None = None):
    """Two models side by side (e.g. before and after fusion); `plan` colours the first one, and the second's
    fused ops say which of the first one's ops they stand for."""
    import matplotlib.pyplot as plt

    sa, sb = scene_of(model_a, plan, nodes_a), scene_of(model_b, plan_b, nodes_b, source=model_a)
    _check_size(sa.op_count, max_nodes)
    _check_size(sb.op_count, max_nodes)
    la, lb = layout_scene(sa, direction), layout_scene(sb, direction)
    wa, ha, xa, _ = _figure_inches(la, _legend_rows(la), True)
    wb, hb, xb, _ = _figure_inches(lb, _legend_rows(lb), True)
    wa, wb = max(wa, 2.2), max(wb, 2.2)
    gap = 0.4
    fw, body = wa + wb + gap, max(ha, hb)
    extra = max(xa, xb)
    scale = max(_MIN_SCALE, min(1.0, _MAX_INCHES / max(fw, body + extra)))
    fig = plt.figure(figsize=(fw * scale, (body + extra) * scale))
    plt.close(fig)
    axa = fig.add_axes((0, 0, wa / fw, body / (body + extra)))
    axb = fig.add_axes(((wa + gap) / fw, 0, wb / fw, body / (body + extra)))
    _render(la, axa, title=titles[0] if titles else None, scale=scale)
    _render(lb, axb, title=titles[1] if titles and len(titles) > 1 else None, scale=scale)
    return fig


def save_picture(model, path, plan: FusionPlan | None = None, **kw) -> Path:
    """Write a drawing (or an existing Figure) to .png or .svg atomically; SVG output is byte-stable."""
    import matplotlib
    from matplotlib.figure import Figure

    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in ("png", "svg"):
        raise ValueError(f"{path}: save_picture writes .png or .svg, not {path.suffix or 'no suffix'!r}")
    fig = model if isinstance(model, Figure) else draw(model, plan, **kw)
    metadata = {"Date": None} if fmt == "svg" else {"Software": None}
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": "fusionlab", "svg.fonttype": "path"}):
        big = fmt == "png" and max(fig.get_size_inches()) > 12  # a big drawing: one render, faster compression
        fig.savefig(buf, format=fmt, metadata=metadata, bbox_inches=None if big else "tight", dpi=120,
                    facecolor="white", **({"pil_kwargs": {"compress_level": 3}} if big else {}))
    return atomic_write(path, buf.getvalue())
