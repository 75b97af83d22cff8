"""A layered layout (a small Sugiyama: longest-path layers, barycenter ordering, bands for tall
graphs): where each box and edge of a scene goes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..plan import FusionGroup, FusionPlan
from .scene import Item, Scene, scene_of

__all__ = ["Layout", "layered_layout", "layout_scene"]


# --------------------------------------------------------------------------------------------------
# layered layout (Sugiyama-lite)
# --------------------------------------------------------------------------------------------------

_CHAR_TITLE = 0.074  # inches per character at 9 pt
_CHAR_SUB = 0.056  # at 7 pt
_GAP_ORDER = 0.22  # between boxes in one layer
_GAP_RANK = {"TB": 0.42, "LR": 0.55}  # between layers


@dataclass
class Layout:
    """Box centres and sizes (inches at scale 1), layers, and edge polylines of a layered drawing."""

    positions: dict[str, tuple[float, float]]
    sizes: dict[str, tuple[float, float]]
    layers: list[list[str]]
    edges: list[tuple[str, str, list[tuple[float, float]]]]
    kinds: dict[str, str]
    labels: dict[str, tuple[str, str]]
    groups: list[tuple[FusionGroup, list[str]]]
    direction: str = "TB"
    crossings: int = 0
    name: str = "model"
    #: keys of fused ops (drawn as such)
    fused: set = field(default_factory=set)
    #: the band (column of wrapped layers, left to right) of every key; all 0 when the layers are not wrapped
    band_of: dict = field(default_factory=dict)

    @property
    def bands(self) -> int:
        return 1 + max(self.band_of.values(), default=0)

    def box(self, key: str) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1) of one box."""
        (x, y), (w, h) = self.positions[key], self.sizes[key]
        return (x - w / 2, y - h / 2, x + w / 2, y + h / 2)

    def extent(self) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1) around every box."""
        boxes = [self.box(k) for k in self.positions] or [(0.0, 0.0, 0.0, 0.0)]
        return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))

    @property
    def width(self) -> float:
        x0, _, x1, _ = self.extent()
        return x1 - x0

    @property
    def height(self) -> float:
        _, y0, _, y1 = self.extent()
        return y1 - y0


def _item_label(it: Item) -> tuple[str, str]:
    """(head, sub) lines of a box: op type and short name, or "input x" and the value's shape."""
    if it.kind == "op":
        if it.fused:
            return it.title, f"= {it.fused}"
        return it.title, (it.subtitle if it.subtitle != it.title else "")
    if it.kind == "cut":  # the dashed stub is the arrow: the label says where it goes
        return it.title.removeprefix("→ "), it.subtitle
    if it.kind == "from":  # and here where it comes from
        return it.title, it.subtitle
    return it.title + " " + it.subtitle, (it.detail[0] if it.detail else "")


def _item_size(it: Item) -> tuple[float, float]:
    """(width, height) of a box, from the lengths of its two lines."""
    title, sub = _item_label(it)
    w = max(0.7, len(title) * _CHAR_TITLE + 0.26, len(sub) * _CHAR_SUB + 0.26)
    h = 0.44 if sub else 0.30
    return w, h


def _crossings(upper: list[str], lower: list[str], edges: list[tuple[str, str]]) -> int:
    pu = {k: i for i, k in enumerate(upper)}
    pl = {k: i for i, k in enumerate(lower)}
    segs = sorted((pu[a], pl[b]) for a, b in edges if a in pu and b in pl)
    count = 0
    for i in range(len(segs)):
        for j in range(i + 1, len(segs)):
            if segs[i][0] < segs[j][0] and segs[i][1] > segs[j][1]:
                count += 1
    return count


def _place(order: list[str], desired: dict[str, float], size: dict[str, float]) -> dict[str, float]:
    """Positions as close to `desired` as the order and the minimum gaps allow (average of two sweeps)."""
    n = len(order)
    if n == 0:
        return {}
    gap = [(size[order[i]] + size[order[i + 1]]) / 2 + _GAP_ORDER for i in range(n - 1)]
    left = [0.0] * n
    for i, k in enumerate(order):
        left[i] = desired[k] if i == 0 else max(desired[k], left[i - 1] + gap[i - 1])
    right = [0.0] * n
    for i in range(n - 1, -1, -1):
        k = order[i]
        right[i] = desired[k] if i == n - 1 else min(desired[k], right[i + 1] - gap[i])
    return {k: (left[i] + right[i]) / 2 for i, k in enumerate(order)}


def _longest_path_layers(sc: Scene) -> dict[str, int]:
    """Layer of each item: longest path from the sources; then sources sink to just above their first consumer."""
    keys = [it.key for it in sc.items]
    preds: dict[str, list[str]] = {k: [] for k in keys}
    succs: dict[str, list[str]] = {k: [] for k in keys}
    for a, b, _ in sc.edges:
        preds[b].append(a)
        succs[a].append(b)
    layer: dict[str, int] = {}
    for k in keys:  # items are in topological order
        layer[k] = max((layer[p] + 1 for p in preds[k]), default=0)
    for k in reversed(keys):  # every node as late as its readers allow: side computations sit where they are used
        if succs[k]:
            layer[k] = max(layer[k], min(layer[s] for s in succs[k]) - 1)
    return layer


@dataclass
class _Ranked:
    """Items and dummy points (which split edges spanning several layers) by layer, and their links."""

    rank_of: dict[str, int]
    size: dict[str, tuple[float, float]]
    up: dict[str, list[str]]  # neighbours in the layer above
    down: dict[str, list[str]]  # neighbours in the layer below
    chains: list[tuple[str, str, list[str]]]  # each edge: (from, to, its path through dummy points)
    layers: list[list[str]]
    pair_edges: list[list[tuple[str, str]]]  # links between layer r and r + 1

    def crossings(self, layers: list[list[str]]) -> int:
        """Edge crossings of an ordering of the layers."""
        return sum(_crossings(layers[r], layers[r + 1], self.pair_edges[r]) for r in range(len(layers) - 1))


def _ranked(sc: Scene, layer: dict[str, int]) -> _Ranked:
    """Split every edge that spans several layers with dummy points; list each layer's keys in item order."""
    keys = [it.key for it in sc.items]
    order_of = {it.key: idx for idx, it in enumerate(sc.items)}
    size: dict[str, tuple[float, float]] = {it.key: _item_size(it) for it in sc.items}
    rank_of = dict(layer)
    up: dict[str, list[str]] = {k: [] for k in keys}
    down: dict[str, list[str]] = {k: [] for k in keys}
    chains: list[tuple[str, str, list[str]]] = []
    for a, b, _ in sc.edges:
        path = [a]
        for r in range(layer[a] + 1, layer[b]):
            d = f"~{order_of[a]}>{order_of[b]}@{r}"
            rank_of[d] = r
            order_of[d] = order_of[a] + 0.5
            size[d] = (0.02, 0.02)
            up[d], down[d] = [], []
            path.append(d)
        path.append(b)
        for u, v in zip(path, path[1:]):
            down[u].append(v)
            up[v].append(u)
        chains.append((a, b, path))
    nodes_in: dict[int, list[str]] = {}
    for k, r in sorted(rank_of.items(), key=lambda kv: (kv[1], order_of[kv[0]], kv[0])):
        nodes_in.setdefault(r, []).append(k)
    n_layers = max(nodes_in) + 1 if nodes_in else 0
    layers = [nodes_in.get(r, []) for r in range(n_layers)]
    pair_edges = [[(u, v) for u in layers[r] for v in down[u]] for r in range(max(0, n_layers - 1))]
    return _Ranked(rank_of, size, up, down, chains, layers, pair_edges)


def _by_barycenter(layer: list[str], ref: list[str], neigh: dict[str, list[str]]) -> list[str]:
    """A layer sorted by the mean position of each key's neighbours in `ref` (its own index where it has none)."""
    pos = {k: i for i, k in enumerate(ref)}

    def bary(k: str, i: int) -> tuple[float, int]:
        ps = [pos[p] for p in neigh[k] if p in pos]
        return (sum(ps) / len(ps) if ps else float(i), i)

    return [k for _, k in sorted((bary(k, i), k) for i, k in enumerate(layer))]


def _groups_together(layer_keys: list[str], member_of: dict[str, str]) -> list[str]:
    """A layer reordered so that members of one group sit next to each other, where the group first appears."""
    first: dict[str, int] = {}
    for i, k in enumerate(layer_keys):
        gid = member_of.get(k)
        if gid is not None:
            first.setdefault(gid, i)
    return sorted(layer_keys, key=lambda k: (first.get(member_of.get(k), layer_keys.index(k)), layer_keys.index(k)))


def _ordered_layers(rk: _Ranked, member_of: dict[str, str]) -> list[list[str]]:
    """Barycenter sweeps down and up (six rounds) keeping the best ordering; then groups kept together if no worse."""
    n_layers = len(rk.layers)
    best = [list(l) for l in rk.layers]
    best_cross = rk.crossings(best)
    current = [list(l) for l in rk.layers]
    sweeps = [(r, True) for r in range(1, n_layers)] + [(r, False) for r in range(n_layers - 2, -1, -1)]
    for _ in range(6):
        for r, down in sweeps:
            current[r] = _by_barycenter(current[r], current[r - 1] if down else current[r + 1],
                                        rk.up if down else rk.down)
        c = rk.crossings(current)
        if c < best_cross:
            best, best_cross = [list(l) for l in current], c
    final = [_groups_together(l, member_of) for l in best]
    return best if rk.crossings(final) > best_cross else final  # grouping must not make it messier


def _pulled(layer: list[str], x: dict[str, float], neigh: dict[str, list[str]]) -> dict[str, float]:
    """Where each key of a layer would like to be: the mean position of its neighbours (else where it is)."""
    return {k: (sum(x[p] for p in neigh[k]) / len(neigh[k]) if neigh[k] else x[k]) for k in layer}


def _along_positions(layers: list[list[str]], rk: _Ranked, along) -> dict[str, float]:
    """Centres along the layers: packed and centred, pulled toward their neighbours (4 rounds), from 0."""
    x: dict[str, float] = {}
    for l in layers:
        cur = 0.0
        for k in l:
            x[k] = cur + along(k) / 2
            cur += along(k) + _GAP_ORDER
        shift = (cur - _GAP_ORDER) / 2
        for k in l:
            x[k] -= shift
    sizes_along = {k: along(k) for k in x}
    for _ in range(4):
        for r in range(1, len(layers)):
            x.update(_place(layers[r], _pulled(layers[r], x, rk.up), sizes_along))
        for r in range(len(layers) - 2, -1, -1):
            x.update(_place(layers[r], _pulled(layers[r], x, rk.down), sizes_along))
    lo = min((x[k] - along(k) / 2 for k in x), default=0.0)
    for k in x:
        x[k] -= lo
    return x


def _rank_positions(layers: list[list[str]], across, gap: float) -> list[float]:
    """Centre of each layer across the layers: each as deep as its deepest box, `gap` apart."""
    rank_pos: list[float] = []
    cur = 0.0
    for l in layers:
        depth = max((across(k) for k in l), default=0.0)
        rank_pos.append(cur + depth / 2)
        cur += depth + gap
    return rank_pos


def _edge_points(a: str, b: str, path: list[str], centre: dict, size: dict, direction: str) -> list:
    """An edge's polyline: from the side of box `a`, through its dummy points, to the side of box `b`."""
    (ax_, ay), (bx, by) = centre[a], centre[b]
    (aw, ah), (bw, bh) = size[a], size[b]
    inner = [centre[d] for d in path[1:-1]]
    if direction == "TB":
        return [(ax_, ay - ah / 2)] + inner + [(bx, by + bh / 2)]
    return [(ax_ + aw / 2, ay)] + inner + [(bx - bw / 2, by)]


#: gap between two bands of wrapped layers (inches): room for the edges that go on in the next band
_GUTTER = 0.6
#: the height / width a wrapped picture aims at (a little taller than wide: a page, a notebook column)
_ASPECT = 1.25


def _band_breaks(depths: list[float], k: int, gap: float) -> list[int]:
    """First layer of each of `k` bands of consecutive layers, cut where the running depth passes i/k."""
    total = sum(depths) + gap * (len(depths) - 1)
    starts, cur = [0], 0.0
    for r, d in enumerate(depths):
        if len(starts) < k and r > starts[-1] and cur >= total * len(starts) / k:
            starts.append(r)
        cur += d + gap
    return starts


def _bands(final: list[list[str]], x: dict, rank_pos: list[float], along, across, k: int, gap: float):
    """(band of each layer, x offset per band, top per band, width and height of the whole) for `k` bands."""
    depths = [max((across(key) for key in l), default=0.0) for l in final]
    starts = _band_breaks(depths, k, gap)
    band = [0] * len(final)
    for b, st in enumerate(starts):
        for r in range(st, len(final)):
            band[r] = b
    offs, tops, width, height = [], [], 0.0, 0.0
    for b, st in enumerate(starts):
        layers = [r for r in range(len(final)) if band[r] == b]
        keys = [key for r in layers for key in final[r]]
        lo = min((x[key] - along(key) / 2 for key in keys), default=0.0)
        hi = max((x[key] + along(key) / 2 for key in keys), default=0.0)
        offs.append(width + (_GUTTER if b else 0.0) - lo)
        width += (hi - lo) + (_GUTTER if b else 0.0)
        tops.append(rank_pos[layers[0]] - depths[layers[0]] / 2)
        height = max(height, rank_pos[layers[-1]] + depths[layers[-1]] / 2 - tops[-1])
    return band, offs, tops, width, height


def _choose_bands(final, x, rank_pos, along, across, gap: float, wrap) -> int:
    """How many bands: `wrap` itself when it is a number; for "auto" the count whose picture is nearest
    `_ASPECT` (height / width), one band when the picture is not tall."""
    if wrap in (None, False, 1):
        return 1
    if wrap != "auto":
        return max(1, min(int(wrap), len(final)))
    best, best_err = 1, None
    for k in range(1, min(len(final), 40) + 1):
        *_, w, h = _bands(final, x, rank_pos, along, across, k, gap)
        err = abs(math.log(max(h, 1e-6) / max(w, 1e-6) / _ASPECT))
        if best_err is None or err < best_err - 1e-9:
            best, best_err = k, err
    return best


def _banded_edge(pts: list, bands: list[int], bottoms: list[float], gutters: list[float], lane: float) -> list:
    """An edge's polyline with a detour wherever it goes on in the next band: down below its band, along
    the gutter, up above the next band's top, then on (TB drawings)."""
    out = [pts[0]]
    for (p, q), (bp, bq) in zip(zip(pts, pts[1:]), zip(bands, bands[1:])):
        if bq != bp:
            yb, xg = bottoms[bp] - 0.12 - lane, gutters[bq] + lane
            out += [(p[0], yb), (xg, yb), (xg, 0.12 + lane), (q[0], 0.12 + lane)]
        out.append(q)
    return out


def layout_scene(sc: Scene, direction: str = "TB", wrap=None) -> Layout:
    """Lay a scene out in layers: rank, split long edges, order to cut crossings, then place the boxes.

    `wrap` (TB only): None/1 one column of layers; an int that many bands of consecutive layers side by side;
    "auto" as many as bring the picture nearest a page's proportions (a long chain becomes columns).
    """
    if direction not in ("TB", "LR"):
        raise ValueError(f"direction must be 'TB' or 'LR', not {direction!r}")
    rk = _ranked(sc, _longest_path_layers(sc))
    final = _ordered_layers(rk, {k: g.id for g, ks in sc.groups for k in ks})
    # coordinates: along the layer (order axis) and across layers (rank axis)
    along_i, across_i = (0, 1) if direction == "TB" else (1, 0)

    def along(k):
        return rk.size[k][along_i]

    def across(k):
        return rk.size[k][across_i]

    x = _along_positions(final, rk, along)
    gap = _GAP_RANK[direction]
    rank_pos = _rank_positions(final, across, gap)
    n_bands = _choose_bands(final, x, rank_pos, along, across, gap, wrap) if direction == "TB" else 1
    layer_band = [0] * len(final)
    if n_bands > 1:
        layer_band, offs, tops, _, _ = _bands(final, x, rank_pos, along, across, n_bands, gap)
        centre = {k: (x[k] + offs[layer_band[r]], -(rank_pos[r] - tops[layer_band[r]])) for k, r in rk.rank_of.items()}
    else:
        centre = {k: ((x[k], -rank_pos[r]) if direction == "TB" else (rank_pos[r], -x[k]))
                  for k, r in rk.rank_of.items()}
    keys = [it.key for it in sc.items]
    real = set(keys)
    edges = [(a, b, _edge_points(a, b, path, centre, rk.size, direction)) for a, b, path in rk.chains]
    if n_bands > 1:
        band_of_key = {k: layer_band[r] for k, r in rk.rank_of.items()}
        bottoms = [min(centre[k][1] - rk.size[k][1] / 2 for k in centre if band_of_key[k] == b) for b in range(n_bands)]
        gutters = [min(centre[k][0] - rk.size[k][0] / 2 for k in centre if band_of_key[k] == b) - _GUTTER / 2
                   for b in range(n_bands)]
        crossing = 0
        for i, (a, b, path) in enumerate(rk.chains):
            bands = [band_of_key[k] for k in path]
            if len(set(bands)) > 1:
                lane = 0.04 * (crossing % 6)  # edges that go on in the next band keep apart
                crossing += 1
                edges[i] = (a, b, _banded_edge(edges[i][2], bands, bottoms, gutters, lane))
    return Layout(
        positions={k: centre[k] for k in keys},
        sizes={k: rk.size[k] for k in keys},
        layers=[[k for k in l if k in real] for l in final],
        edges=edges,
        kinds={it.key: it.kind for it in sc.items},
        labels={it.key: _item_label(it) for it in sc.items},
        groups=sc.groups,
        direction=direction,
        crossings=rk.crossings(final),
        name=sc.name,
        fused={it.key for it in sc.items if it.fused},
        band_of={k: layer_band[r] for k, r in rk.rank_of.items() if k in real},
    )


def layered_layout(model, plan: FusionPlan | None = None, nodes=None, *, hops: int = 0,
                   direction: str = "TB", wrap=None, source=None) -> Layout:
    """Deterministic layered layout of a model (or of `nodes`, plus `hops` neighbours); see `layout_scene`
    for `wrap`, `scene_of` for `source`."""
    return layout_scene(scene_of(model, plan, nodes, hops, source), direction, wrap)
