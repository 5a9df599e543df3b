"""The HTTP front end's listener: :class:`HttpApp` served inside the running event loop by
flowserve's own HTTP/1.1 server (``native``, the default: ``http1.py``, about two thirds of
uvicorn's CPU per request, bare) or by uvicorn with httptools (``--http-server uvicorn``).

The socket is bound here, so a busy port is a clear ``OSError`` rather than uvicorn's
``sys.exit``, and port 0 gives the port actually bound. uvicorn's ``serve()`` is not used: it
installs its own SIGINT/SIGTERM handlers, and signals belong to the composition root.

Bounds (see ``http1.py`` and ``app.py``): the listener's connection cap is the plane's
``guards.listener("http")`` (the native server evicts idle connections to make room, and caps
each client address, ``per_peer``); the native server also closes idle connections and trickled
heads (``idle_timeout_s``), answers 408 to a stalled body (``body_timeout_s``) and counts
unsent response bytes against ``guards.unsent`` (``--max-unsent-response-bytes``). uvicorn, best
effort: ``limit_concurrency`` is the same cap (uvicorn answers 503 past it, counting
connections and requests in flight together), ``timeout_keep_alive`` is ``idle_timeout_s``; it
has no body or head timeout. The request byte budget, the JSON limits and the disconnect of a
``generate_stream`` are the app's and apply to both.
"""

from __future__ import annotations

import math

import uvicorn

from flowserve.dataplane.access import Restrictions
from flowserve.dataplane.plane import DataPlane
from flowserve.frontends import HTTP_SERVERS, listen_socket, stop_uvicorn
from flowserve.frontends.http.app import HttpApp
from flowserve.frontends.http.asgi import ASGIApp
from flowserve.frontends.http.http1 import BODY_TIMEOUT_S, Http1Server

KEEP_ALIVE_S = 75  # clients (tritonclient, perf_analyzer) hold pooled connections open


class HttpListener:
    """A started HTTP front end: ``port`` is the bound port; ``stop`` shuts it down gracefully."""

    def __init__(self, server: uvicorn.Server | Http1Server, port: int) -> None:
        self._server = server
        self.port = port
        self._stopped = False

    async def stop(self, grace_s: float) -> None:
        """Stop accepting, let in-flight requests finish for up to ``grace_s``, then close."""
        if self._stopped:
            return
        self._stopped = True
        server = self._server
        if isinstance(server, Http1Server):
            await server.stop(grace_s)
            return
        await stop_uvicorn(server, grace_s)


async def start_http(
    plane: DataPlane,
    host: str,
    port: int,
    mounts: dict[str, ASGIApp] | None = None,
    restrictions: Restrictions | None = None,
    server: str = "native",
    idle_timeout_s: float = KEEP_ALIVE_S,
    body_timeout_s: float = BODY_TIMEOUT_S,
    max_json_bytes: int | None = None,
    reuse_port: bool = False,
) -> HttpListener:
    """Serve Triton's HTTP/REST protocol for ``plane`` on ``host:port`` (0: any free port);
    ``restrictions``: API categories that need a header (``--http-restricted-api``);
    ``server``: one of ``HTTP_SERVERS``; ``idle_timeout_s``: keep-alive and request-head
    timeout; ``body_timeout_s``: a request body with no progress this long gets 408 (native
    server only); ``max_json_bytes``: JSON bodies over this get 413 (None: the app's default)."""
    if server not in HTTP_SERVERS:
        raise ValueError(f"unknown HTTP server {server!r}; choose one of {', '.join(HTTP_SERVERS)}")
    app = HttpApp(plane, mounts, restrictions, max_json_bytes)
    guard = plane.guards.listener("http")
    chosen: Http1Server | uvicorn.Server
    if server == "native":
        chosen = Http1Server(app, idle_timeout_s, body_timeout_s, guard, plane.guards.unsent)
    else:
        chosen = _uvicorn(app, idle_timeout_s, guard.limit)
    sock = listen_socket(host, port, "HTTP", reuse_port)
    try:
        if isinstance(chosen, Http1Server):
            await chosen.start(sock)
        else:
            await chosen.startup(sockets=[sock])
    except BaseException:
        sock.close()
        raise
    return HttpListener(chosen, int(sock.getsockname()[1]))


def _uvicorn(app: ASGIApp, keep_alive_s: float, max_connections: int) -> uvicorn.Server:
    """uvicorn with httptools, configured for this front end (its serve() is not used);
    ``max_connections`` 0: no cap."""
    config = uvicorn.Config(
        app,
        http="httptools",
        ws="auto",
        lifespan="off",
        interface="asgi3",
        access_log=False,
        log_config=None,
        proxy_headers=False,
        server_header=False,
        date_header=False,
        timeout_keep_alive=max(math.ceil(keep_alive_s), 1),  # uvicorn takes whole seconds
        limit_concurrency=max_connections or None,
    )
    config.load()
    uv = uvicorn.Server(config)
    uv.lifespan = config.lifespan_class(config)
    return uv
