"""A tiny HTTP/1.1 server for small raw ASGI apps (the metrics port, and the web page in tests).

Not a general web server: bodies are read by Content-Length only (no chunked uploads),
responses are buffered and sent with a Content-Length, keep-alive is honoured, and requests
larger than ``max_body`` are refused. That is all a Prometheus scrape or a browser polling
small JSON documents needs, with no framework and no extra dependency.

Bounds, so that no client can hold the port (or the process's file descriptors): a request head
is at most ``MAX_HEAD`` bytes (431 beyond) and must arrive whole within ``idle_timeout_s`` of
the connection opening or its last answer (else the connection closes), a body within
``body_timeout_s`` (else 408 and close); ``guard`` (the plane's ``guards.listener("metrics")``)
caps open connections, and those of one client address: when full, the connection idle the
longest (waiting for a request head for ``guard.EVICT_AFTER_S`` or more) is evicted (closed) to
make room, and with none idle the new one is closed at once; the guard counts and logs both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import unquote

from flowserve.dataplane.guard import ConnectionGuard

log = logging.getLogger("flowserve.observability")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

REASONS = {
    200: "OK",
    204: "No Content",
    301: "Moved Permanently",
    302: "Found",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Payload Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}


MAX_HEAD = 64 * 1024  # bytes of request line and headers
BODY_TIMEOUT_S = 30.0


class _BadRequest(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


class _Tracked:
    """One connection as the listener's guard sees it (:class:`~flowserve.dataplane.guard.Tracked`):
    idle since its last answer (or since it opened) while it waits for a request head."""

    __slots__ = ("busy", "since", "writer")

    def __init__(self, writer: asyncio.StreamWriter, now: float) -> None:
        self.writer = writer
        self.since = now
        self.busy = False

    def idle_since(self) -> float | None:
        return None if self.busy else self.since

    def evict(self) -> None:
        self.writer.transport.abort()  # its task sees the end of the stream and ends


class AsgiListener:
    """A started server: ``port`` (the bound one, also when 0 was asked) and ``stop``."""

    def __init__(
        self,
        app: ASGIApp,
        max_body: int = 1 << 20,
        idle_timeout_s: float = 75.0,
        body_timeout_s: float = BODY_TIMEOUT_S,
        guard: ConnectionGuard | None = None,
    ) -> None:
        self.app = app
        self.port = 0
        self.max_body = max_body
        self.idle_timeout_s = idle_timeout_s
        self.body_timeout_s = body_timeout_s
        self.guard = guard
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._busy: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int, reuse_port: bool = False) -> AsgiListener:
        self._server = await asyncio.start_server(
            self._connection, host, port, limit=MAX_HEAD, reuse_port=reuse_port or None
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def stop(self, grace_s: float) -> None:
        """Stop accepting; requests being answered get up to ``grace_s`` seconds."""
        if self._server is None:
            return
        self._server.close()
        idle = self._connections - self._busy
        for task in idle:
            task.cancel()
        if self._busy:
            await asyncio.wait(set(self._busy), timeout=grace_s)
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), timeout=1.0)
        self._server = None

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        guard = self.guard
        peer = writer.get_extra_info("peername")
        tracked = _Tracked(writer, time.monotonic())
        address = str(peer[0]) if isinstance(peer, tuple) else None
        if guard is not None and not guard.admit(tracked, address):  # full: closed, nothing read
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            sock = writer.get_extra_info("sockname")
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.idle_timeout_s)
                except asyncio.LimitOverrunError:
                    text = f"request line and headers exceed {MAX_HEAD} bytes".encode()
                    await _write(writer, 431, [(b"content-type", b"text/plain")], text, False)
                    return
                except (asyncio.IncompleteReadError, TimeoutError):
                    return
                self._busy.add(task)
                tracked.busy = True
                try:
                    keep = await self._request(head, reader, writer, peer, sock)
                finally:
                    self._busy.discard(task)
                    tracked.busy = False
                    tracked.since = time.monotonic()
                if not keep:
                    return
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._connections.discard(task)
            if guard is not None:
                guard.release(tracked)  # nothing when it was evicted
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _request(
        self,
        head: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: Any,
        sock: Any,
    ) -> bool:
        try:
            method, target, version, headers = parse_head(head)
            length = int(dict(headers).get(b"content-length", b"0") or b"0")
            if length < 0 or length > self.max_body:
                raise _BadRequest(413, "request body too large")
            if dict(headers).get(b"transfer-encoding", b"").lower() == b"chunked":
                raise _BadRequest(400, "chunked request bodies are not supported")
        except (_BadRequest, ValueError) as exc:
            status = exc.status if isinstance(exc, _BadRequest) else 400
            await _write(writer, status, [(b"content-type", b"text/plain")], str(exc).encode(), False)
            return False
        try:
            body = await asyncio.wait_for(reader.readexactly(length), self.body_timeout_s) if length else b""
        except TimeoutError:
            text = f"request body not received within {self.body_timeout_s:g} s".encode()
            await _write(writer, 408, [(b"content-type", b"text/plain")], text, False)
            return False
        connection = dict(headers).get(b"connection", b"").lower()
        keep = connection != b"close" if version == "1.1" else connection == b"keep-alive"
        path, _, query = target.partition("?")
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": version,
            "method": method,
            "scheme": "http",
            "path": unquote(path),
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": headers,
            "client": tuple(peer[:2]) if isinstance(peer, tuple) else None,
            "server": tuple(sock[:2]) if isinstance(sock, tuple) else None,
        }
        status, out_headers, parts = await call_app(self.app, scope, body)
        await _write(writer, status, out_headers, b"".join(parts), keep, method == "HEAD")
        return keep


def parse_head(head: bytes) -> tuple[str, str, str, list[tuple[bytes, bytes]]]:
    """Request line and headers (names lower-cased) of one request head."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _BadRequest(400, f"bad request line: {lines[0][:80]!r}")
    method, target, proto = parts
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise _BadRequest(400, "bad header line")
        headers.append((name.strip().lower().encode("latin-1"), value.strip().encode("latin-1")))
    return method.upper(), target, proto.removeprefix("HTTP/"), headers


async def call_app(app: ASGIApp, scope: Scope, body: bytes = b"") -> tuple[int, list[Any], list[bytes]]:
    """Run one ASGI request to completion; returns (status, headers, body parts).

    Also what tests use to call an ASGI app directly, without a server."""
    sent = False
    status = 500
    headers: list[Any] = []
    parts: list[bytes] = []

    async def receive() -> Message:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # the request has no more body: wait forever (disconnect)
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = int(message["status"])
            headers = list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            parts.append(bytes(message.get("body", b"")))

    try:
        await app(scope, receive, send)
    except Exception:
        log.exception("error answering %s %s", scope.get("method"), scope.get("path"))
        return 500, [(b"content-type", b"text/plain")], [b"internal error"]
    return status, headers, parts


async def _write(
    writer: asyncio.StreamWriter,
    status: int,
    headers: list[Any],
    body: bytes,
    keep: bool,
    head_only: bool = False,
) -> None:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}".encode()]
    names = set()
    for name, value in headers:
        name_b = name if isinstance(name, bytes) else str(name).encode()
        value_b = value if isinstance(value, bytes) else str(value).encode()
        names.add(name_b.lower())
        lines.append(name_b + b": " + value_b)
    if b"content-length" not in names:
        lines.append(b"content-length: " + str(len(body)).encode())
    lines.append(b"connection: keep-alive" if keep else b"connection: close")
    writer.write(b"\r\n".join(lines) + b"\r\n\r\n" + (b"" if head_only else body))
    await writer.drain()


async def serve_asgi(app: ASGIApp, host: str, port: int) -> AsgiListener:
    """Serve ``app`` on (host, port); port 0 picks a free one (see ``listener.port``)."""
    return await AsgiListener(app).start(host, port)


__all__ = ["ASGIApp", "AsgiListener", "Message", "Receive", "Scope", "Send", "call_app", "serve_asgi"]
