"""Layer 6: transport front ends (HTTP/REST, gRPC, OpenAI), thin translators over the data plane.

The servers each protocol can run on are named here, in a module that imports only the standard
library, so the command line can offer them without importing the servers themselves; so are
the two listening pieces the uvicorn-based front ends share (the front ends never import each
other)."""

from __future__ import annotations

import math
import socket
from typing import Any

# the first of each is the default
HTTP_SERVERS = ("native", "uvicorn")  # http/http1.py, or uvicorn with httptools
GRPC_SERVERS = ("native", "grpcio")  # grpc/http2.py, or grpc.aio


def listen_socket(host: str, port: int, owner: str, reuse_port: bool = False) -> socket.socket:
    """A bound, non-blocking socket on ``host:port`` (0: any free port) for the ``owner`` front
    end (named in the error); ``reuse_port`` lets other processes bind the same port
    (SO_REUSEPORT: the workers of one server, ``--workers N``)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        reason = f"{owner} front end cannot listen on {host}:{port}: {exc.strerror}"
        raise OSError(exc.errno, reason) from None
    sock.setblocking(False)
    return sock


async def stop_uvicorn(server: Any, grace_s: float) -> None:
    """Stop a started ``uvicorn.Server``: accept no more, let in-flight requests finish for up
    to ``grace_s`` (uvicorn takes whole seconds), then close what is left."""
    server.config.timeout_graceful_shutdown = max(math.ceil(grace_s), 0)
    await server.shutdown()
    for connection in list(server.server_state.connections):
        connection.transport.close()
