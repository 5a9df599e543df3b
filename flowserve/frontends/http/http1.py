"""flowserve's own HTTP/1.1 server for the ASGI app (the default; ``--http-server uvicorn``
keeps uvicorn).

Why: uvicorn's httptools protocol costs most of a bare HTTP handler's time. Answering add_sub
with no engine behind it (``benchmarks/bare_http.py``) at concurrency 8 over perf_analyzer,
uvicorn gave 13.1k infer/s and a raw httptools protocol 22.6k (1.7x) on the same machine, in
the same run. What uvicorn spends it on: a ``RequestResponseCycle`` object, a header-validation
regex per response header, two socket writes per response (status line and headers, then the
body), ASGI messages checked field by field. This server keeps the ASGI interface (the same
:class:`~flowserve.frontends.http.app.HttpApp` and mounts) and drops the rest:

- one :class:`asyncio.Protocol` per connection on the engine's loop, parsing with ``httptools``;
- the response head is held until the first body message, so a response goes out in one write;
- response headers are written as the app gives them (the app is this server's own code);
- requests on one connection are answered in order (pipelining): one runs at a time, those
  parsed behind it wait, and reading pauses when ``MAX_PIPELINED`` are waiting, or when the
  body of a waiting request passes ``QUEUED_BODY_HIGH_WATER`` (so one connection holds at most
  about ``BODY_HIGH_WATER`` + 16 heads + ``QUEUED_BODY_HIGH_WATER`` of request bytes);
- a request body is kept in memory as it arrives and handed to the app by ``receive``; reading
  pauses while more than ``BODY_HIGH_WATER`` bytes wait unread (the app enforces the request
  size limit and the server's byte budget and answers 413/503 as soon as they are passed;
  what follows of that body is discarded);
- a body of known length of ``RAW_BODY_FROM`` bytes or more: reading pauses after its head;
  when the app asks for it (it has accepted its length), the rest is read straight from the
  socket into a buffer of its size (the connection is a ``BufferedProtocol``: every other read
  goes to the server's read buffer and is parsed from there) and handed over whole, so its bytes
  are not copied in user space (``benchmarks/copies.py``). That buffer comes from
  :func:`flowserve.dataplane.memory.buffer` (a memoryview: not zero-filled, huge pages), so
  the app's ``receive`` may hand on ``bytes``, ``bytearray`` or ``memoryview`` bodies;
- ``Expect: 100-continue`` is answered when the app first asks for the body;
- a response without Content-Length is sent chunked (HTTP/1.1) or ends by closing (HTTP/1.0);
- a streamed response (no Content-Length) waits in ``send`` while the transport's buffer is
  over its high-water mark (a slow reader holds its own stream, not the server's memory); a
  response of known length is written whole (it is in memory already), and while a client
  has not taken it (the transport over its high-water mark) the connection reads and answers
  nothing more (pipelined requests wait);
- unsent response bytes (the transport's buffer while it is over its high-water mark) are
  counted against the server-wide budget ``unsent`` (``--max-unsent-response-bytes``, shared
  with gRPC); when a write does not fit it, the connections of this listener holding the most
  unsent bytes are closed at once (abort: what they hold is dropped), the writing one included
  when it holds the most, until it fits, logged at most once a second. Why close rather than
  refuse new responses with 503: the bytes are already computed, a 503 would punish the
  client whose answer comes next (often a good one) and leave the holders in place, while the
  holders are the clients that stopped reading;
- keep-alive by HTTP version and ``Connection``; a connection closes after
  ``idle_timeout_s`` with no request, with an answer its client takes none of (aborted), or with
  a request head still incomplete (a client
  trickling headers: the timer is armed once when the connection goes idle and is not reset
  by the bytes of a head, so it bounds the whole head); a head over ``MAX_HEAD`` bytes or
  ``MAX_HEADERS`` lines gets 431, a malformed request 400, and the connection closes;
- a request body that makes no progress for ``body_timeout_s`` while the server is reading
  it gets 408 and the connection closes (one timer per connection, armed only when a body
  does not arrive with its head and none is pending, re-armed from a progress counter when it
  fires, never per chunk or cancelled per request: a stall is seen within one to two
  ``body_timeout_s``; time when the server itself does not read, paused or before 100-continue, does
  not count);
- an answer with ``Connection: close`` (the app's, for a body it will not read) while the
  body is still arriving: the server ends its side of the stream after the answer, drops
  what still comes unparsed for up to ``LINGER_S`` and closes (closing at once would reset
  the connection and the client could lose the answer);
- at most ``guard.limit`` connections, and ``guard.per_peer`` from one client address (the
  listener's :class:`ConnectionGuard`): when full, the connection idle the longest (no request
  being answered, for at least ``guard.EVICT_AFTER_S``; the bytes of an incomplete head do not
  count as work, as for the idle timeout) is evicted to make room (closed; aborted if its
  client left an answer unread); with none idle, the new one gets a canned 503 and is closed
  before anything is parsed; the guard counts and logs both;
- a client that goes away: ``receive`` answers ``http.disconnect``, later sends are dropped
  at once (a send waiting on a full socket is woken), so the app can end what it was doing.

``stop(grace_s)`` stops accepting, closes idle connections, lets requests in flight finish for
up to ``grace_s`` (their connections close after the response), then cancels what is left
and closes the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import deque
from collections.abc import Callable
from http import HTTPStatus
from typing import cast
from urllib.parse import unquote

import httptools

from flowserve.core.ratelog import LimitedLog
from flowserve.dataplane.guard import ByteBudget, ConnectionGuard
from flowserve.dataplane.memory import buffer
from flowserve.frontends.http.asgi import ASGIApp, Headers, Message, Scope

log = logging.getLogger("flowserve.http")

MAX_PIPELINED = 16  # requests parsed and waiting behind the one being answered
MAX_HEAD = 64 << 10  # bytes of request line and headers (beyond: 431 and the connection closes)
MAX_HEADERS = 256  # header lines of one request (beyond: 431 and the connection closes)
BODY_HIGH_WATER = 4 << 20  # unread request body bytes before reading pauses
RAW_BODY_FROM = 64 << 10  # a body of known length this large is read straight into its own buffer
READ_BUFFER = 256 << 10  # the server's read buffer (its connections' reads take turns)
QUEUED_BODY_HIGH_WATER = 64 << 10  # ... for a pipelined request waiting behind another one
IDLE_TIMEOUT_S = 75.0  # no request on a kept-alive connection, or a request head incomplete
BODY_TIMEOUT_S = 30.0  # a request body with no progress while the server waits for it
LINGER_S = 2.0  # a connection closed with a request body still arriving: read and drop it this long
_FULL = (  # the canned answer to a connection past the listener's cap
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: 29\r\n"
    b"connection: close\r\n\r\nserver connection limit hit\r\n"
)
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_DISCONNECT: Message = {"type": "http.disconnect"}


def status_line(status: int) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Status"))


class _Request:
    """One request on a connection: its scope, its body as it arrives, its response state."""

    __slots__ = (
        "body",
        "buffered",
        "chunked",
        "complete",
        "continue_sent",
        "declared",
        "delivered",
        "discard",
        "expect_continue",
        "filled",
        "head",
        "head_sent",
        "into",
        "keep_alive",
        "length",
        "reader",
        "responded",
        "scope",
    )

    def __init__(self, scope: Scope, keep_alive: bool, expect_continue: bool) -> None:
        self.scope = scope
        self.keep_alive = keep_alive
        self.expect_continue = expect_continue
        self.continue_sent = False
        self.body: list[bytes | bytearray | memoryview] = []
        self.buffered = 0
        # a large body of known length (Content-Length, RAW_BODY_FROM or more): once the app asks
        # for it, the rest is read straight into ``into`` (its size), ``filled`` bytes so far
        self.declared = 0
        self.into: memoryview | None = None  # (dataplane.memory.buffer: huge pages, not zeroed)
        self.filled = 0
        self.complete = False  # the whole body has arrived
        self.delivered = False  # ... and receive() has handed all of it to the app
        self.discard = False  # the app answered: what follows of the body is dropped
        self.reader: asyncio.Future[None] | None = None  # receive() waiting for body bytes
        self.head: bytes | None = None  # status line and headers, until the first body write
        self.head_sent = False
        self.chunked = False
        self.length: int | None = None  # Content-Length the app declared
        self.responded = False  # the last body message was sent


class Connection(asyncio.BufferedProtocol):
    """One client connection: parses requests, runs the app on them in order, writes answers.
    Bytes are read into the server's read buffer and parsed from there, except the body of a
    large request of known length that the app is reading: that is read straight into the
    body's own buffer (``get_buffer``), no copy in user space."""

    def __init__(self, server: Http1Server) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.client: tuple[str, int] | None = None
        self.local: tuple[str, int] | None = None
        self.gone = False
        self.closing = False  # answer what is in flight, then close
        self.parsing: _Request | None = None  # the request whose body is arriving
        self.raw: _Request | None = None  # ... when it is read straight into its buffer
        self.current: _Request | None = None  # the request the app is answering
        self.waiting: deque[_Request] = deque()
        self.task: asyncio.Task[None] | None = None
        self._url = b""
        self._headers: Headers = []
        self._idle: asyncio.TimerHandle | None = None
        self._writable: asyncio.Future[None] | None = None
        self._paused = False
        self._broken = False  # the parser failed or stopped: later bytes are not read
        self._head_bytes = 0
        self._admitted = False  # holds a slot of the server's ConnectionGuard
        self._idle_at = 0.0  # server.clock() when it last finished an answer (or opened)
        self._idle_mark = 0  # unsent bytes when the idle timer was armed (progress, if fewer later)
        self._unsent = 0  # bytes of the server's ``unsent`` budget this connection holds
        self._blocked = False  # an answer is not taken yet: the next request waits for it
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_seen = 0  # on_body calls: progress, as the body timer sees it
        self._body_mark = 0  # ... when the body timer was armed
        self._body_request: _Request | None = None  # ... and for which request

    # ------------------------------------------------------------------ transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        peer = transport.get_extra_info("peername")
        self.client = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else None
        self._idle_at = self.server.clock()
        guard = self.server.guard
        if guard is not None:
            if not guard.admit(self, self.client[0] if self.client else None):
                # full, none idle to evict: a canned answer, nothing parsed, closed
                self._broken = self.gone = True
                transport.write(_FULL)
                transport.close()
                return
            self._admitted = True
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        local = transport.get_extra_info("sockname")
        self.local = (str(local[0]), int(local[1])) if isinstance(local, tuple) else None
        self.server.connections.add(self)
        self._arm_idle()

    def idle_since(self) -> float | None:
        """(:class:`~flowserve.dataplane.guard.Tracked`) When it last finished an answer, or
        opened; None while a request is being answered. The bytes of a head still incomplete
        do not count (a client trickling heads is as idle as a silent one), nor do requests
        waiting behind an answer their client has not taken (one that stopped reading)."""
        return None if self.current is not None else self._idle_at

    def evict(self) -> None:
        """(:class:`~flowserve.dataplane.guard.Tracked`) Closed to make room for a new
        connection (the guard has released its slot already)."""
        self._admitted = False
        self._drop()

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
        if self._admitted:
            self._admitted = False
            guard = self.server.guard
            if guard is not None:
                guard.release(self)
        self._give_unsent()
        self.server.connections.discard(self)
        if self._idle is not None:
            self._idle.cancel()
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        self.raw = None
        for request in (self.current, self.parsing, *self.waiting):
            if request is not None:
                _wake(request)
        self.waiting.clear()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def get_buffer(self, sizehint: int) -> memoryview:
        raw = self.raw
        if raw is not None:
            assert raw.into is not None
            return raw.into[raw.filled :]
        return self.server.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        if self.raw is not None:
            self._raw_received(nbytes)
        else:
            self.data_received(self.server.read_buffer[:nbytes])

    def _raw_received(self, nbytes: int) -> None:
        """``nbytes`` of the body being read straight into its buffer arrived."""
        request = self.raw
        assert request is not None and request.into is not None
        request.filled += nbytes
        self._body_seen += 1
        if request.filled == len(request.into):  # the body is complete: on to the next request
            self.raw = None
            self.parser = httptools.HttpRequestParser(self)  # (the old one is in the body)
            self.on_message_complete()

    def data_received(self, data: bytes | memoryview) -> None:
        if self._broken:
            return
        try:
            self.parser.feed_data(data)
            parsing = self.parsing
            if parsing is not None and not self._broken:
                # a body is still to come (rare for a small request: it came with its head)
                if self._body_timer is None:
                    self._arm_body()
                if parsing.declared and parsing is self.current and parsing.into is None:
                    self._pause()  # read when the app asks for it, straight into its buffer
        except httptools.HttpParserUpgrade:
            # an upgrade (h2c, websocket) this server does not do: the request was parsed
            # and is answered as plain HTTP/1.1; the connection closes after it
            self._broken = True
            self.shutdown()
        except httptools.HttpParserError as exc:
            self._broken = True
            if self._head_bytes > MAX_HEAD:
                self._bad_request(f"request line and headers exceed {MAX_HEAD} bytes", 431)
            elif len(self._headers) > MAX_HEADERS:
                self._bad_request(f"a request has more than {MAX_HEADERS} header lines", 431)
            else:
                self._bad_request(f"malformed HTTP request: {exc}")

    def pause_writing(self) -> None:
        self._writable = self.loop.create_future()

    def resume_writing(self) -> None:
        self._give_unsent()  # what waits is under the low-water mark now
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None
        if self._blocked:  # the client took its answer: on to the next request
            self._blocked = False
            if not self.gone and not self.closing:
                self._next()

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._head_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        headers = self._headers
        headers.append((name.lower(), value))
        if len(headers) > MAX_HEADERS:
            raise ValueError("too many headers")  # the parser stops: data_received answers 431
        self._count_head(len(name) + len(value) + 4)

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD:
            raise ValueError("request head too large")  # the parser stops: data_received answers 431

    def on_headers_complete(self) -> None:
        # the idle timer runs until a request's head is complete: a client that trickles
        # its headers is closed like an idle one
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        parser = self.parser
        url = self._url
        raw, _, query = url.partition(b"?")
        if not raw.startswith(b"/"):  # absolute-form (a proxy's request line)
            parsed = httptools.parse_url(url)
            raw, query = parsed.path or b"/", parsed.query or b""
        path = raw.decode("latin-1")
        if "%" in path:
            path = unquote(path)
        version = parser.get_http_version()
        scope: Scope = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": version,
            "server": self.local,
            "client": self.client,
            "scheme": "http",
            "method": parser.get_method().decode("ascii"),
            "root_path": "",
            "path": path,
            "raw_path": raw,
            "query_string": query,
            "headers": self._headers,
        }
        expect = False
        declared = 0
        for name, value in self._headers:
            if name == b"expect" and value.lower() == b"100-continue":
                expect = True
            elif name == b"content-length":
                declared = int(value)  # (the parser checked it)
            elif name == b"transfer-encoding":
                declared = -(1 << 62)  # chunked: no length to read into
        request = _Request(scope, parser.should_keep_alive() and not self.closing, expect)
        if declared >= RAW_BODY_FROM:
            request.declared = declared
        self.parsing = request
        if self.current is None:
            self._start(request)
        else:
            self.waiting.append(request)
            if len(self.waiting) >= MAX_PIPELINED:
                self._pause()

    def on_body(self, body: bytes) -> None:
        request = self.parsing
        if request is None or request.discard:
            return
        self._body_seen += 1
        request.body.append(body)
        request.buffered += len(body)
        if request.buffered > (BODY_HIGH_WATER if request is self.current else QUEUED_BODY_HIGH_WATER):
            self._pause()
        _wake(request)

    def on_message_complete(self) -> None:
        request = self.parsing
        if request is not None:
            request.complete = True
            _wake(request)
        self.parsing = None

    # ------------------------------------------------------------------ running requests

    def _start(self, request: _Request) -> None:
        self.current = request
        self.task = self.loop.create_task(self._run(request))

    async def _run(self, request: _Request) -> None:
        try:
            await self.server.app(
                request.scope, lambda: self._receive(request), lambda m: self._send(request, m)
            )
        except Exception as exc:
            scope = request.scope
            log.exception("HTTP %s %s failed in the ASGI app", scope["method"], scope["path"])
            if not request.head_sent and not self.gone:
                self._write_whole(request, 500, b"internal error: " + type(exc).__name__.encode())
        if not request.responded and not self.gone:
            if request.head_sent:  # a streamed response the app did not end: it cannot be framed
                self.closing = True
            else:
                self._write_whole(request, 500, b"the application sent no response")
        self._finished(request)

    def _finished(self, request: _Request) -> None:
        self.current = None
        self.task = None
        if self.gone:
            return
        self._idle_at = self.server.clock()
        if self.raw is request:  # answered before its body ended: the parser is out of step
            self.raw = None
            self.closing = True
        if self.parsing is request and not request.complete:
            if _body_unasked(request):
                self.closing = True
            request.discard = True  # answered before its body ended: drop the rest
            request.body.clear()
            request.into = None
            request.buffered = 0
        if not request.keep_alive or self.closing:
            if self.parsing is request:  # its body is still arriving: drop it, then close
                self._linger()
            else:
                self._close()
            return
        if self._writable is not None:
            # the client has not taken this answer: nothing more is read or answered until it
            # does (resume_writing), and one that takes none of it for idle_timeout_s is cut
            self._blocked = True
            self._pause()
            self._arm_idle()
            return
        self._next()

    def _next(self) -> None:
        """Answer the next pipelined request, or wait (idle) for one."""
        if self.waiting:
            if self._idle is not None:
                self._idle.cancel()
                self._idle = None
            self._start(self.waiting.popleft())
        else:
            self._arm_idle()
        self._resume()

    async def _receive(self, request: _Request) -> Message:
        while True:
            if self.gone:
                return _DISCONNECT
            if request.delivered or request.responded or request.discard:
                # nothing more will come: as ASGI asks, wait for the client to go away
                await self._until_gone(request)
                return _DISCONNECT
            if request.declared and not request.complete and not self._broken and not self.gone:
                await self._read_whole(request)  # a large body: all of it, in one piece
                continue
            if request.body or request.complete:
                body = request.body[0] if len(request.body) == 1 else b"".join(request.body)
                request.body = []
                request.into = None  # the app holds it now (nothing here may keep it alive)
                request.buffered = 0
                request.delivered = request.complete
                self._resume()
                return {"type": "http.request", "body": body, "more_body": not request.complete}
            if request.expect_continue and not request.continue_sent:
                request.continue_sent = True
                self._write(_CONTINUE)
            await self._more(request)

    async def _read_whole(self, request: _Request) -> None:
        """Read the rest of a large body of known length straight into a buffer of its size
        (the app asked for it: it accepted its length), and hand it on whole once complete."""
        if request.into is None:
            into = request.into = buffer(request.declared)
            filled = 0
            for chunk in request.body:  # what arrived before the app asked
                into[filled : filled + len(chunk)] = chunk
                filled += len(chunk)
            request.body = [into]  # (delivered once complete)
            request.filled = filled
            request.buffered = 0  # taken by the app (reading does not pause for it)
            if filled < len(into) and self.parsing is request:
                self.raw = request
            if request.expect_continue and not request.continue_sent:
                request.continue_sent = True
                self._write(_CONTINUE)
            self._resume()
        await self._more(request)

    async def _until_gone(self, request: _Request) -> None:
        while not self.gone:
            await self._more(request)

    async def _more(self, request: _Request) -> None:
        """Wait until ``request`` has more body, its body ends or the connection is gone."""
        waiter = request.reader = self.loop.create_future()
        try:
            await waiter
        finally:
            request.reader = None

    async def _send(self, request: _Request, message: Message) -> None:
        if self.gone or request.responded:
            return
        kind = message["type"]
        if kind == "http.response.start":
            status = int(message["status"])
            lines = [status_line(status)]
            length: int | None = None
            for name, value in message.get("headers", ()):
                lines.append(b"%s: %s\r\n" % (name, value))
                if len(name) == 14 and name.lower() == b"content-length":
                    length = int(value)
                elif len(name) == 10 and name.lower() == b"connection" and value.lower() == b"close":
                    request.keep_alive = False  # the app closes it (a body it will not read)
                    lines.pop()
            request.length = length
            # stopping, an upgrade asked for, or a body that may never come: close after this
            if self.closing or _body_unasked(request):
                request.keep_alive = False
            if not request.keep_alive:
                lines.append(b"connection: close\r\n")
            elif request.scope["http_version"] == "1.0":  # kept open only when it says so
                lines.append(b"connection: keep-alive\r\n")
            request.head = b"".join(lines)
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        head = request.head
        if head is None and not request.head_sent:
            raise RuntimeError("ASGI app sent a body before http.response.start")
        body: bytes = message.get("body", b"")
        more = bool(message.get("more_body", False))
        if request.scope["method"] == "HEAD":
            body = b""
        out: bytes
        if head is not None:
            request.head = None
            request.head_sent = True
            if request.length is None:
                if not more:
                    head += b"content-length: %d\r\n" % len(body)
                elif request.scope["http_version"] == "1.1":
                    request.chunked = True
                    head += b"transfer-encoding: chunked\r\n"
                else:  # HTTP/1.0 has no chunks: the body ends when the connection does
                    request.keep_alive = False
            head += b"\r\n"
            out = head + _framed(request, body, more)
        else:
            out = _framed(request, body, more)
        if not more:
            request.responded = True
        self._write(out)
        if self._writable is not None and more and request.length is None:
            await self._writable  # a stream waits for its reader (a known length is all here)

    # ------------------------------------------------------------------ helpers

    def _write(self, data: bytes) -> None:
        if data and self.transport is not None and not self.gone:
            self.transport.write(data)
            if self._writable is not None:  # over the high-water mark: these bytes wait here
                self._count_unsent()

    def _count_unsent(self) -> None:
        """Count what waits in the transport against the server's ``unsent`` budget; when it
        does not fit, connections holding the most are closed (see ``Http1Server.make_room``)."""
        server = self.server
        if server.unsent is None or self.transport is None:
            return
        more = self.transport.get_write_buffer_size() - self._unsent
        if more > 0 and (server.unsent.take(more) or server.make_room(self, more)):
            self._unsent += more
            server.holding.add(self)

    def _give_unsent(self) -> None:
        if self._unsent:
            unsent = self.server.unsent
            if unsent is not None:
                unsent.give(self._unsent)
            self._unsent = 0
            self.server.holding.discard(self)

    def _recount_unsent(self) -> None:
        """Give back what the client took since it was counted."""
        transport = self.transport
        if self._unsent and transport is not None:
            taken = self._unsent - transport.get_write_buffer_size()
            if taken > 0 and self.server.unsent is not None:
                self.server.unsent.give(taken)
                self._unsent -= taken
                if not self._unsent:
                    self.server.holding.discard(self)

    def _drop(self) -> None:
        """Close now (evicted, or over the unsent budget): what the client left unread is
        dropped (abort), an idle connection with nothing waiting is closed politely."""
        self._broken = self.closing = True
        self._give_unsent()
        transport = self.transport
        if transport is not None and not transport.is_closing():
            if transport.get_write_buffer_size():
                transport.abort()
            else:
                transport.close()

    def _write_whole(self, request: _Request, status: int, text: bytes) -> None:
        self._write(_plain(status, text, close=not request.keep_alive))
        request.head_sent = request.responded = True

    def _bad_request(self, text: str, status: int = 400) -> None:
        current = self.current
        mid_body = self.parsing is not None and self.parsing is current
        # answered now when nothing is being answered, or when the request being answered is
        # the one whose body broke and its app has not begun a response: that response is
        # dropped (its receive() sees the disconnect). Behind a request still being answered,
        # the connection closes after that answer.
        if not self.gone and (
            current is None or (mid_body and current.head is None and not current.head_sent)
        ):
            self._write(_plain(status, text.encode("utf-8", "replace"), close=True))
            if current is not None:
                current.head_sent = current.responded = True
        self.waiting.clear()
        self.parsing = None
        self.closing = True
        if current is None or mid_body:  # a body that cannot be read on cannot be answered
            self._close()

    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def _resume(self) -> None:
        parsing = self.parsing
        if (
            self._paused
            and self.transport is not None
            and not self._broken
            and len(self.waiting) < MAX_PIPELINED
            and (
                parsing is None
                or parsing.buffered
                <= (BODY_HIGH_WATER if parsing is self.current else QUEUED_BODY_HIGH_WATER)
            )
        ):
            self._paused = False
            self.transport.resume_reading()

    def _arm_body(self) -> None:
        self._body_mark = self._body_seen
        self._body_request = self.parsing
        self._body_timer = self.loop.call_later(self.server.body_timeout_s, self._body_check)

    def _body_check(self) -> None:
        """The body timer: a request body that made no progress for ``body_timeout_s`` while
        the server was reading it ends with 408 and the connection closes (a timer left from
        an earlier request's body is re-armed for this one: never a timer per request). Time
        the server itself did not read (paused: the app has not asked, or requests wait ahead
        of it; 100-continue not yet sent) does not count."""
        self._body_timer = None
        request = self.parsing
        if request is None or self.gone or self._broken:
            self._body_request = None
            return
        if (
            self._paused
            or request is not self._body_request  # the body it was armed for has ended
            or self._body_seen != self._body_mark
            or (request.expect_continue and not request.continue_sent)
        ):
            self._arm_body()
            return
        self._broken = True
        self._bad_request(f"request body not received: no progress for {self.server.body_timeout_s:g} s", 408)

    def _linger(self) -> None:
        """Close a connection whose request body is still arriving without resetting it (a
        close with unread bytes sends RST, and the client may lose the answer): the answer is
        followed by our end of the stream, what the client still sends is dropped unparsed,
        and the connection closes when the client closes its end or after ``LINGER_S``."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self._broken = True
        self.parsing = None
        if self._paused:
            self._paused = False
            transport.resume_reading()
        if transport.can_write_eof():
            transport.write_eof()
        self.loop.call_later(LINGER_S, self._close)

    def _arm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        transport = self.transport
        self._idle_mark = transport.get_write_buffer_size() if self._blocked and transport is not None else 0
        self._idle = self.loop.call_later(self.server.idle_timeout_s, self._idle_expired)

    def _idle_expired(self) -> None:
        """No request for ``idle_timeout_s`` (or a head still incomplete): closed; with an
        answer its client has not taken, aborted, unless the client took some of it since."""
        self._idle = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        unsent = transport.get_write_buffer_size()
        if not unsent:
            transport.close()
        elif self._blocked and unsent < self._idle_mark:  # a slow reader: progress, wait on
            self._recount_unsent()
            self._arm_idle()
        else:
            self._drop()

    def shutdown(self) -> None:
        """Close now if idle, else after the response in flight."""
        self.closing = True
        if self.current is None:
            self._close()


def _body_unasked(request: _Request) -> bool:
    """The client waits for 100-continue, was never sent it, and its body has not come: it
    may never come, and the parser would read the next request as this body, so the
    connection ends with this request's answer."""
    return request.expect_continue and not request.continue_sent and not request.complete


def _plain(status: int, text: bytes, close: bool) -> bytes:
    """A whole text/plain response (the server's own answers: errors)."""
    connection = b"connection: close\r\n" if close else b""
    head = b"content-type: text/plain\r\ncontent-length: %d\r\n%s\r\n" % (len(text), connection)
    return status_line(status) + head + text


def _framed(request: _Request, body: bytes, more: bool) -> bytes:
    if not request.chunked:
        return body
    chunk = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
    return chunk if more else chunk + b"0\r\n\r\n"


def _wake(request: _Request) -> None:
    reader = request.reader
    if reader is not None and not reader.done():
        reader.set_result(None)


class Http1Server:
    """Serves an ASGI app over HTTP/1.1 on a bound socket, in the running loop.

    ``idle_timeout_s``: a kept-alive connection with no request, or a request head not
    complete, this long after the connection opened or its last answer, is closed.
    ``body_timeout_s``: a request body with no progress for this long gets 408 and the
    connection closes. ``guard``: the listener's connection cap (idle connections are evicted
    to make room; without one, connections past it get a canned 503 and are closed before
    anything is parsed). ``unsent``: the server's budget of response bytes not taken by their
    clients (past it, the connections holding the most are closed). ``clock``: the guard's
    (when connections went idle)."""

    def __init__(
        self,
        app: ASGIApp,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        body_timeout_s: float = BODY_TIMEOUT_S,
        guard: ConnectionGuard | None = None,
        unsent: ByteBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.idle_timeout_s = idle_timeout_s
        self.body_timeout_s = body_timeout_s
        self.guard = guard
        self.unsent = unsent
        self.clock = clock
        self.connections: set[Connection] = set()
        self.holding: set[Connection] = set()  # connections holding unsent bytes
        self.dropped = 0  # connections closed because the unsent budget was spent
        self._drops = LimitedLog(log, clock)  # logged at most once a second
        self._server: asyncio.Server | None = None
        # every connection reads into this (Connection.get_buffer); a read is parsed before the next
        self.read_buffer = memoryview(bytearray(READ_BUFFER))

    def make_room(self, asking: Connection, size: int) -> bool:
        """The ``unsent`` budget has no room for ``size`` more bytes of ``asking``: close the
        connections holding the most unsent bytes (``asking`` counted with ``size`` more)
        until they fit; True when they were taken for ``asking``, False when it was closed."""
        budget = self.unsent
        assert budget is not None
        for conn in list(self.holding):
            conn._recount_unsent()
        if budget.take(size):
            return True
        weight = {c: c._unsent for c in self.holding}
        weight[asking] = asking._unsent + size
        for conn in sorted(weight, key=weight.__getitem__, reverse=True):
            self._log_drop(conn, weight[conn], budget)
            conn._drop()
            if conn is asking:
                return False
            if budget.take(size):
                return True
        return False  # not reached: ``asking`` is among them

    def _log_drop(self, conn: Connection, held: int, budget: ByteBudget) -> None:
        self.dropped += 1
        peer = conn.client[0] if conn.client else "?"
        self._drops(
            logging.WARNING,
            "HTTP: closed a connection from %s holding %d response bytes its client has not read: "
            "the server's budget of unsent response bytes is spent (--max-unsent-response-bytes %d)",
            peer, held, budget.limit,
        )  # fmt: skip

    async def start(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: Connection(self), sock=sock, backlog=1024)

    async def stop(self, grace_s: float) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for connection in list(self.connections):
            connection.shutdown()
        tasks = [c.task for c in self.connections if c.task is not None]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=max(grace_s, 0))
            for task in late:  # past the grace: cancelled, as the request's deadline would be
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=1.0)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.abort()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), timeout=1.0)
