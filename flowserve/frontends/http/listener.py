"""uvicorn (httptools) serving :class:`HttpApp` inside the running event loop.

The socket is bound here, so a busy port is a clear ``OSError`` rather than uvicorn's
``sys.exit``, and port 0 gives the port actually bound. uvicorn's ``serve()`` is not used: it
installs its own SIGINT/SIGTERM handlers, and signals belong to the composition root.
"""

from __future__ import annotations

import math
import socket

import uvicorn

from flowserve.dataplane.access import Restrictions
from flowserve.dataplane.plane import DataPlane
from flowserve.frontends.http.app import HttpApp
from flowserve.frontends.http.asgi import ASGIApp

KEEP_ALIVE_S = 75  # clients (tritonclient, perf_analyzer) hold pooled connections open


class HttpListener:
    """A started HTTP front end: ``port`` is the bound port; ``stop`` shuts it down gracefully."""

    def __init__(self, server: uvicorn.Server, port: int) -> None:
        self._server = server
        self.port = port
        self._stopped = False

    async def stop(self, grace_s: float) -> None:
        """Stop accepting, let in-flight requests finish for up to ``grace_s``, then close."""
        if self._stopped:
            return
        self._stopped = True
        server = self._server
        server.config.timeout_graceful_shutdown = max(math.ceil(grace_s), 0)  # uvicorn takes whole seconds
        await server.shutdown()
        for connection in list(server.server_state.connections):
            connection.transport.close()


def bind(host: str, port: int) -> socket.socket:
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"HTTP front end cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


async def start_http(
    plane: DataPlane,
    host: str,
    port: int,
    mounts: dict[str, ASGIApp] | None = None,
    restrictions: Restrictions | None = None,
) -> HttpListener:
    """Serve Triton's HTTP/REST protocol for ``plane`` on ``host:port`` (0: any free port);
    ``restrictions``: API categories that need a header (``--http-restricted-api``)."""
    config = uvicorn.Config(
        HttpApp(plane, mounts, restrictions),
        http="httptools",
        ws="auto",
        lifespan="off",
        interface="asgi3",
        access_log=False,
        log_config=None,
        proxy_headers=False,
        server_header=False,
        date_header=False,
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    sock = bind(host, port)
    try:
        await server.startup(sockets=[sock])
    except BaseException:
        sock.close()
        raise
    return HttpListener(server, int(sock.getsockname()[1]))
