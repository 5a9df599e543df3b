"""The OpenAI-compatible front end's listener: uvicorn (httptools) on its own port, started
inside the running event loop. As for the HTTP front end, the socket is bound here (a busy
port is a clear ``OSError``; port 0 gives the port bound) and uvicorn's ``serve()`` is not used
(it installs signal handlers, which belong to the composition root)."""

from __future__ import annotations

import uvicorn

from flowserve.dataplane.plane import DataPlane
from flowserve.frontends import listen_socket, stop_uvicorn
from flowserve.frontends.openai.app import OpenAIApp

KEEP_ALIVE_S = 75


class OpenAIListener:
    """A started OpenAI front end: ``port`` (the bound one, also when 0 was asked) and ``stop``."""

    def __init__(self, server: uvicorn.Server, port: int) -> None:
        self._server = server
        self.port = port
        self._stopped = False

    async def stop(self, grace_s: float) -> None:
        """Stop accepting, let in-flight requests finish for up to ``grace_s``, then close."""
        if self._stopped:
            return
        self._stopped = True
        await stop_uvicorn(self._server, grace_s)


async def start_openai(plane: DataPlane, host: str, port: int) -> OpenAIListener:
    """Serve the OpenAI-compatible API for ``plane`` on ``host:port`` (0: any free port)."""
    config = uvicorn.Config(
        OpenAIApp(plane),
        http="httptools",
        lifespan="off",
        interface="asgi3",
        access_log=False,
        log_config=None,
        server_header=False,
        timeout_keep_alive=KEEP_ALIVE_S,
        # --max-connections, as for the HTTP front end on uvicorn (0: no cap)
        limit_concurrency=plane.guards.listener("openai").limit or None,
    )
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    sock = listen_socket(host, port, "OpenAI")
    try:
        await server.startup(sockets=[sock])
    except BaseException:
        sock.close()
        raise
    return OpenAIListener(server, int(sock.getsockname()[1]))
