"""The server: listener, connections, server-wide budgets and timers, and the method table
built from a protobuf service."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from flowserve.dataplane.guard import ByteBudget, ConnectionGuard
from flowserve.frontends.grpc.h2.calls import Gate, Method
from flowserve.frontends.grpc.h2.compression import ResponseCompression
from flowserve.frontends.grpc.h2.connection import Connection
from flowserve.frontends.grpc.h2.limits import (
    CONNECTION_WINDOW,
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HANDSHAKE_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    READ_BUFFER,
    limited_log,
)


class Http2GrpcServer:
    """``methods``: ``/package.Service/Method`` -> :class:`Method`; ``gate`` may refuse a call
    before it runs (restricted protocols); ``max_message``: largest request message;
    ``compression``: compress responses (Triton's ``--grpc-infer-response-compression-level``);
    ``guard``: the listener's connection cap; ``budget``: the server's budget of buffered request
    bytes; ``unsent``: its budget of response bytes waiting for clients (flow-control windows,
    the socket; see :meth:`shed`); ``body_timeout_s``: a call whose request message makes no
    progress for that long ends DEADLINE_EXCEEDED (:meth:`Connection.expire_bodies`);
    ``handshake_timeout_s``: the TLS handshake, the connection
    preface and the client's first SETTINGS must be done within it; ``idle_timeout_s``: a
    connection with no open stream and no frame for that long is closed (0 for either: no
    timeout)."""

    def __init__(
        self,
        methods: dict[str, Method],
        max_message: int,
        gate: Gate | None = None,
        compression: ResponseCompression | None = None,
        *,
        guard: ConnectionGuard | None = None,
        budget: ByteBudget | None = None,
        unsent: ByteBudget | None = None,
        handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    ) -> None:
        if handshake_timeout_s < 0 or idle_timeout_s < 0 or body_timeout_s < 0:
            raise ValueError("timeouts must be >= 0 (0: none)")
        self.methods = {path.encode("latin-1"): m for path, m in methods.items()}
        self.max_message = max_message
        self.gate = gate
        self.compression = compression if compression is not None and compression.level > 0 else None
        self.guard = guard
        self.budget = budget
        self.unsent = unsent
        self.shedding = False
        self.handshake_timeout_s = handshake_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.body_timeout_s = body_timeout_s
        # body ticks: one every body_timeout_s / 2; a stream stamps the tick of its last progress
        self.tick = 0
        self.body_timer: asyncio.TimerHandle | None = None
        self.connections: set[Connection] = set()
        self.notes = limited_log()  # connection ends (GOAWAY), at most once a second
        self.server: asyncio.Server | None = None
        self.port = 0
        # what every connection reads into (Connection.get_buffer): one read is handled before
        # the next, whichever connection makes it; and its first frame head's worth
        self.read_buffer = memoryview(bytearray(READ_BUFFER))
        self.read_head = self.read_buffer[:9]

    def unsent_tight(self) -> bool:
        """Over half the budget of unsent response bytes is taken: streaming calls whose answers
        wait for their client produce no more until they are sent."""
        unsent = self.unsent
        return unsent is not None and unsent.limit > 0 and unsent.in_use * 2 > unsent.limit

    def unsent_refusal(self, size: int) -> str:
        unsent = self.unsent
        assert unsent is not None
        return (
            f"{size} more response bytes waiting for their client do not fit beside the {unsent.in_use} "
            f"held for other clients (--max-unsent-response-bytes {unsent.limit}); retry later"
        )

    def shed(self, need: int) -> bool:
        """Make room in the budget of unsent response bytes for ``need`` more: the connections
        holding the most of it are ended (:meth:`Connection.shed`), largest first, until it
        fits. True when it fits; False when it cannot (``need`` alone is over the budget)."""
        unsent = self.unsent
        if unsent is None or not unsent.limit or need > unsent.limit or self.shedding:
            return False
        self.shedding = True  # what shedding writes may need room too: it is not shed again
        try:
            holders = [c for c in self.connections if not c.dead and c.held_unsent()]
            holders.sort(key=Connection.held_unsent, reverse=True)
            for conn in holders:
                if unsent.in_use + need <= unsent.limit:
                    break
                conn.shed(
                    f"the server's budget of unsent response bytes is spent (--max-unsent-response-bytes "
                    f"{unsent.limit}); this connection held {conn.held_unsent()} bytes, the most"
                )
        finally:
            self.shedding = False
        return unsent.in_use + need <= unsent.limit

    @property
    def max_buffered(self) -> int:
        """Request bytes one connection may hold undelivered before its window is withheld
        (room for two of the largest messages)."""
        return max(2 * self.max_message, CONNECTION_WINDOW)

    async def start(
        self, host: str, port: int, tls: ssl.SSLContext | None = None, reuse_port: bool = False
    ) -> int:
        """Listen on ``host:port`` (0: any free port), over TLS when ``tls`` is given;
        ``reuse_port``: the workers of one server share the port (SO_REUSEPORT)."""
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: Connection(self),
            host,
            port,
            reuse_address=True,
            reuse_port=reuse_port or None,
            ssl=tls,
            ssl_handshake_timeout=(self.handshake_timeout_s or None) if tls is not None else None,
        )
        self.port = int(self.server.sockets[0].getsockname()[1])
        if self.body_timeout_s:
            self.body_timer = loop.call_later(self.body_timeout_s / 2, self._body_tick)
        return self.port

    def _body_tick(self) -> None:
        """Every half body timeout: a tick, and the calls stuck on their request end."""
        self.tick += 1
        for conn in list(self.connections):
            if conn.streams and not conn.dead:
                conn.expire_bodies(self.tick)
        self.body_timer = asyncio.get_running_loop().call_later(self.body_timeout_s / 2, self._body_tick)

    async def stop(self, grace_s: float | None) -> None:
        """Stop accepting; GOAWAY to every connection; calls in flight may finish for up to
        ``grace_s`` seconds, then the connections close."""
        if self.server is not None:
            self.server.close()
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None
        connections = list(self.connections)
        for conn in connections:
            conn.go_away()
        if grace_s and connections:
            waits = [asyncio.ensure_future(c.wait_idle()) for c in connections]
            _, late = await asyncio.wait(waits, timeout=grace_s)
            for w in late:
                w.cancel()
        for conn in list(self.connections):
            conn.close()
        if self.server is not None:
            await self.server.wait_closed()


def service_methods(servicer: Any, service: Any, module: Any) -> dict[str, Method]:
    """The :class:`Method` table of a protobuf service descriptor served by ``servicer``
    (an object with one coroutine, or async generator, per rpc name)."""
    methods: dict[str, Method] = {}
    for m in service.methods:
        handler = getattr(servicer, m.name, None)
        if handler is None:
            continue
        parse = getattr(module, m.input_type.name).FromString
        path = f"/{service.full_name}/{m.name}"
        if m.client_streaming or m.server_streaming:
            methods[path] = Method(parse=parse, streaming=handler)
        else:
            methods[path] = Method(parse=parse, unary=handler)
    return methods
