"""netron in an iframe: one model served on 127.0.0.1, through jupyter-server-proxy under a Jupyter
server."""

from __future__ import annotations

import atexit
import base64
import html
import importlib.util
import io
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

from ..graph import as_graph
from ..verification.runtime import model_bytes
from .drawing import draw

__all__ = ["NETRON_NOTICE", "NetronView", "jupyter_base_url", "netron_view"]


# --------------------------------------------------------------------------------------------------
# netron
# --------------------------------------------------------------------------------------------------

_LIVE: set["NetronView"] = set()
_LIVE_LOCK = threading.Lock()

#: What netron shows on its first visit, and what to do about it (its page has no switch to skip it).
NETRON_NOTICE = ("The first time, netron's page asks you to accept its cookie notice ('This app uses cookies "
                 "to report errors and anonymous usage information'): click Accept once; netron remembers it "
                 "for 30 days. The static pictures (viz.draw) need no server.")


def jupyter_base_url() -> str | None:
    """The base URL of the Jupyter server running this kernel, if it serves jupyter-server-proxy; else None."""

    pid = os.environ.get("JPY_PARENT_PID")  # jupyter_client sets it for the kernels it launches
    if not pid or importlib.util.find_spec("jupyter_server_proxy") is None:
        return None
    try:
        from jupyter_server.serverapp import list_running_servers

        for info in list_running_servers():
            if str(info.get("pid")) == pid:
                return info.get("base_url") or "/"
    except Exception:  # no server files we can read: fall back to the direct address
        return None
    return None


class NetronView:
    """One model served by netron on 127.0.0.1 from a private temporary folder; shows as an iframe."""

    def __init__(self, model, *, port: int | None = None, height: int = 600, filename: str = "model.onnx"):
        import netron
        from netron import server as netron_server

        data = model_bytes(model)
        self.model = model  # what the stored view draws
        self.height = height
        self.dir = Path(tempfile.mkdtemp(prefix="fusionlab-netron-"))
        os.chmod(self.dir, 0o700)
        self.path = self.dir / filename
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        log = logging.getLogger("netron.server")
        log.setLevel(logging.WARNING)  # its "Serving ... at http://localhost:PORT" would be noisy, varying stderr
        root = logging.getLogger()
        guard = None
        if not root.hasHandlers():  # else netron calls logging.basicConfig(INFO) on the caller's root logger
            guard = logging.NullHandler()
            root.addHandler(guard)
        try:
            self.address = netron.serve(str(self.path), browse=False, address=("127.0.0.1", port or 0))
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        finally:
            if guard is not None:
                root.removeHandler(guard)
        self._threads = list(netron_server._threads(self.address))
        # netron keeps the served content on the handler *class*, so a second server would make the first
        # serve the second's model; give each of our servers its own handler subclass.
        for t in self._threads:
            cls = t.server.RequestHandlerClass
            t.server.RequestHandlerClass = type("FusionlabNetronHandler", (cls,), {"content": cls.content})
        self.host, self.port = self.address
        self.url = f"http://{self.host}:{self.port}/"
        base = jupyter_base_url()
        #: the same page through the Jupyter server (None outside one): reachable wherever the lab is
        self.proxy_url = f"{base.rstrip('/')}/proxy/{self.host}:{self.port}/" if base else None
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def alive(self) -> bool:
        """Whether the server is still running."""
        return any(t.alive() for t in self._threads)

    @property
    def src(self) -> str:
        """The address the iframe uses: through the Jupyter server when possible, else 127.0.0.1 directly."""
        return self.proxy_url or self.url

    def iframe(self, width: str | int = "100%", height: int | None = None):
        """An IPython IFrame showing the model (through the Jupyter server when it has jupyter-server-proxy)."""
        from IPython.display import IFrame

        return IFrame(self.src, width=width, height=height or self.height)

    def _repr_html_(self) -> str:
        if not self.alive:
            return "<p>netron view stopped</p>"
        if not self.proxy_url:
            return self.static_html()
        src = html.escape(self.src)
        return (f'<p>netron through this Jupyter server: <a href="{src}" target="_blank" rel="noopener">open in a '
                f'new tab</a>. {html.escape(NETRON_NOTICE)}</p>'
                f'<iframe src="{src}" width="100%" height="{int(self.height)}" frameborder="0" '
                'allowfullscreen></iframe>')

    #: how many of the model's first ops the stored view draws
    STATIC_OPS = 10

    def static_html(self) -> str:
        """Outside a Jupyter server that proxies (a notebook built or viewed without a lab): no frame that cannot
        load, but a picture of the model's first ops and one sentence on how to open the live view."""

        graph = as_graph(self.model, check=False)
        first = [n.name for n in graph.topological_order()][: self.STATIC_OPS]
        fig = draw(graph, nodes=first, title=f"the served model's first {len(first)} of {len(graph)} ops")
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        png = base64.b64encode(buf.getvalue()).decode()
        return (f'<img alt="the first ops of the served model" src="data:image/png;base64,{png}" '
                f'style="max-width: 100%; max-height: {int(self.height)}px">'
                "<p>Run this cell in the lab <code>make lab</code> starts and netron's live view of the whole model "
                f"opens here (in another Jupyter, open {html.escape(self.url)} on the machine running the kernel)."
                "</p>")

    def __repr__(self) -> str:
        return f"NetronView({self.src if self.alive else 'stopped'})"

    def stop(self) -> None:
        """Stop the server and delete the temporary folder."""
        for t in self._threads:
            t.stop()
        for t in self._threads:
            t.join(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def __enter__(self) -> "NetronView":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def netron_view(model, *, port: int | None = None, height: int = 600) -> NetronView:
    """Serve `model` with netron on 127.0.0.1 (a free port unless `port`); display the result for an iframe."""
    return NetronView(model, port=port, height=height)


@atexit.register
def _stop_all_views() -> None:
    with _LIVE_LOCK:
        views = list(_LIVE)
    for v in views:
        try:
            v.stop()
        except Exception:
            pass
