"""Pictures of graphs and fusion plans, with nothing beyond pip: DOT text, matplotlib drawings, netron.

- `to_dot` writes Graphviz DOT text (fusion groups as coloured clusters). It is plain text, so tests and
  nbval can compare it; render it with any Graphviz you have, none is needed here.
- `layered_layout` + `draw` lay a graph out in layers (a small Sugiyama: longest-path layers, every node as
  late as its readers allow, barycenter ordering, dummy points for long edges) and draw it with matplotlib;
  fusion groups are coloured rounded rectangles behind their members, fused ops are filled and say which
  original ops they replace, the legend is on top. Any size: a tall graph goes in bands of layers side by
  side (`wrap="auto"`) and text is never scaled below readable. Deterministic: the same model gives the same
  picture, byte for byte through `save_picture`. Constant nodes, like initializers, are weights, not boxes.
- `netron_view` serves one model with netron on 127.0.0.1 for interactive exploration in an iframe; under
  a Jupyter server with jupyter-server-proxy the iframe goes through the server (`/proxy/127.0.0.1:PORT/`),
  so it works wherever the lab itself is reached (an SSH tunnel, a remote host, a hub).

Weights (initializers) are never drawn as boxes; their shapes are noted in the DOT labels instead.
"""

from .dot import to_dot
from .drawing import before_after, draw, save_picture
from .layout import Layout, layered_layout
from .netron import NETRON_NOTICE, NetronView, jupyter_base_url, netron_view
from .scene import GROUP_COLORS, neighbourhood

__all__ = ["GROUP_COLORS", "neighbourhood", "to_dot", "Layout", "layered_layout", "before_after", "draw", "save_picture", "NETRON_NOTICE", "NetronView", "jupyter_base_url", "netron_view"]
