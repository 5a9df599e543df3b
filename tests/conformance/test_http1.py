"""flowserve's own HTTP/1.1 server (frontends/http/http1.py) over raw sockets, in process: the
protocol cases a client library does not show (pipelining, 100-continue, chunked both ways,
HTTP/1.0, malformed requests, disconnects, back-pressure, idle timeout) and its bounds (header
lines, stalled bodies, the connection cap, pipelined bodies, closing before a body ends).
Every HTTP suite of
the conformance tests also runs over it, as it is the default server."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from flowserve.dataplane.guard import EVICT_AFTER_S, ByteBudget, ConnectionGuard
from flowserve.frontends.http.http1 import (
    _CONTINUE,
    BODY_HIGH_WATER,
    LINGER_S,
    MAX_HEAD,
    MAX_HEADERS,
    QUEUED_BODY_HIGH_WATER,
    Http1Server,
)


class App:
    """Echoes the body; '/stream' streams three chunks with no Content-Length; '/fail' raises;
    '/early' answers without reading the body; '/hold' waits for ``release``, '/later' too but
    before it reads the body."""

    def __init__(self) -> None:
        self.active = 0
        self.most_active = 0
        self.messages: list[dict[str, Any]] = []
        self.scopes: list[dict[str, Any]] = []
        self.release = asyncio.Event()
        self.disconnected = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.scopes.append(scope)
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            path = scope["path"]
            if path == "/fail":
                raise RuntimeError("boom")
            if path == "/sized":  # an answer of the size the query string says
                out = bytes(int(scope["query_string"]))
                headers = [(b"content-length", b"%d" % len(out))]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": out})
                return
            if path == "/stream":
                await send({"type": "http.response.start", "status": 200, "headers": []})
                for part in (b"one", b"two", b"three"):
                    await send({"type": "http.response.body", "body": part, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
                return
            body = b""
            if path == "/later":
                await self.release.wait()
            if path != "/early":
                while True:
                    message = await receive()
                    self.messages.append(message)
                    if message["type"] == "http.disconnect":
                        self.disconnected.set()
                        return
                    body += message.get("body", b"")
                    if not message.get("more_body"):
                        break
            if path == "/hold":
                await self.release.wait()
            out = b"%s %s %s" % (scope["method"].encode(), scope["path"].encode(), body)
            headers = [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(out))]
            await send({"type": "http.response.start", "status": 201, "headers": headers})
            await send({"type": "http.response.body", "body": out})
        finally:
            self.active -= 1


@pytest.fixture
async def served() -> AsyncIterator[tuple[Http1Server, App, int]]:
    app = App()
    server = Http1Server(app, idle_timeout_s=30)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    await server.start(sock)
    try:
        yield server, app, int(sock.getsockname()[1])
    finally:
        app.release.set()
        await server.stop(grace_s=0)


Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@pytest.fixture
async def conn(served: tuple[Http1Server, App, int]) -> AsyncIterator[Stream]:
    """A client connection to ``served``, closed after the test."""
    reader, writer = await asyncio.open_connection("127.0.0.1", served[2])
    yield reader, writer
    writer.close()


async def read_response(
    reader: asyncio.StreamReader, body: bool = True
) -> tuple[int, dict[bytes, bytes], bytes]:
    """One response: status, headers (lower-cased), body (Content-Length, chunked or to EOF;
    none when ``body`` is false, as for HEAD)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
    if not body:
        return status, headers, b""
    if b"content-length" in headers:
        return status, headers, await reader.readexactly(int(headers[b"content-length"]))
    if headers.get(b"transfer-encoding") != b"chunked":
        return status, headers, await asyncio.wait_for(reader.read(), 5)
    data = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            return status, headers, data
        data += chunk[:-2]


def post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def test_keep_alive_and_pipelined_requests_are_answered_in_order(
    served: tuple[Http1Server, App, int],
) -> None:
    _, app, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/a", b"1") + post("/b", b"22") + post("/c%20d", b"333"))
    answers = [await read_response(reader) for _ in range(3)]
    assert [a[2] for a in answers] == [b"POST /a 1", b"POST /b 22", b"POST /c d 333"]
    assert all(a[0] == 201 for a in answers)
    assert app.most_active == 1  # one request at a time per connection
    assert app.scopes[2]["raw_path"] == b"/c%20d" and app.scopes[0]["http_version"] == "1.1"
    writer.write(b"GET /q?x=1&y=2 HTTP/1.1\r\nHost: x\r\n\r\n")  # same connection, later
    status, _, body = await read_response(reader)
    assert (status, body) == (201, b"GET /q ")
    assert app.scopes[-1]["query_string"] == b"x=1&y=2"
    writer.close()


async def test_expect_100_continue_is_answered_when_the_body_is_wanted(conn: Stream) -> None:
    reader, writer = conn
    writer.write(post("/echo", b"", "Expect: 100-continue").replace(b"Length: 0", b"Length: 5"))
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"hello")
    assert (await read_response(reader))[2] == b"POST /echo hello"


async def test_expect_100_not_wanted_closes_after_the_answer(conn: Stream) -> None:
    reader, writer = conn
    writer.write(post("/early", b"", "Expect: 100-continue").replace(b"Length: 0", b"Length: 5"))
    status, headers, body = await read_response(reader)
    assert (status, body, headers[b"connection"]) == (201, b"POST /early ", b"close")
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed: no 100, no body read


async def test_a_chunked_request_body_arrives_decoded(conn: Stream) -> None:
    reader, writer = conn
    writer.write(
        b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )
    assert (await read_response(reader))[2] == b"POST /c abcde"


async def test_streamed_responses_are_chunked_on_1_1_and_end_by_close_on_1_0(conn: Stream) -> None:
    reader, writer = conn
    writer.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = await read_response(reader)
    assert (status, headers[b"transfer-encoding"], body) == (200, b"chunked", b"onetwothree")
    writer.write(b"GET /stream HTTP/1.0\r\n\r\n")
    status, headers, body = await read_response(reader)
    assert b"transfer-encoding" not in headers and body == b"onetwothree"  # read to EOF


async def test_connection_close_http_1_0_and_head(served: tuple[Http1Server, App, int]) -> None:
    port = served[2]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, _ = await read_response(reader, body=False)
    assert status == 201 and headers[b"content-length"] == b"8"  # "HEAD /h ": what GET would send; no body
    writer.write(post("/x", b"", "Connection: close"))
    status, headers, body = await read_response(reader)
    assert (body, headers[b"connection"]) == (b"POST /x ", b"close")
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /kept HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    status, headers, body = await read_response(reader)
    assert (body, headers[b"connection"]) == (b"GET /kept ", b"keep-alive")
    writer.write(b"GET /old HTTP/1.0\r\n\r\n")
    assert (await read_response(reader))[2] == b"GET /old "
    assert await asyncio.wait_for(reader.read(), 5) == b""  # HTTP/1.0 without keep-alive: closed
    writer.close()


async def test_malformed_requests_get_400_and_the_connection_closes(
    served: tuple[Http1Server, App, int],
) -> None:
    _, app, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"NOT HTTP AT ALL\r\n\r\n")
    status, headers, body = await read_response(reader)
    assert status == 400 and headers[b"connection"] == b"close" and b"malformed" in body
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert not app.scopes


async def test_an_app_failure_is_500_and_the_connection_lives_on(conn: Stream) -> None:
    reader, writer = conn
    writer.write(post("/fail", b"ignored"))
    status, _, body = await read_response(reader)
    assert status == 500 and b"RuntimeError" in body
    writer.write(post("/after", b"ok"))  # the unread body was discarded, not parsed as a request
    assert (await read_response(reader))[2] == b"POST /after ok"


async def test_an_answer_before_the_body_ends_discards_the_rest(conn: Stream) -> None:
    reader, writer = conn
    writer.write(post("/early", b"0123456789")[:-4])  # six of ten body bytes so far
    assert (await read_response(reader))[2] == b"POST /early "
    writer.write(b"6789" + post("/next", b"n"))
    assert (await read_response(reader))[2] == b"POST /next n"


async def test_a_client_that_goes_away_mid_body_is_a_disconnect(served: tuple[Http1Server, App, int]) -> None:
    server, app, port = served
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/echo", b"0123456789")[:-5])
    for _ in range(500):  # until the app has the first half of the body
        if app.messages:
            break
        await asyncio.sleep(0.01)
    writer.close()
    await asyncio.wait_for(app.disconnected.wait(), 5)
    assert app.messages[0]["more_body"] is True and app.messages[-1]["type"] == "http.disconnect"
    for _ in range(500):
        if not server.connections:
            break
        await asyncio.sleep(0.01)
    assert not server.connections


async def test_large_bodies_arrive_whole_through_paused_reading(served: tuple[Http1Server, App, int]) -> None:
    _, app, port = served
    body = bytes(range(256)) * (3 * BODY_HIGH_WATER // 256)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/big", body))
    status, _, answer = await read_response(reader)
    assert status == 201 and answer == b"POST /big " + body
    assert len(app.messages) >= 1
    writer.close()


async def test_idle_connections_and_trickled_heads_close_after_the_timeout() -> None:
    server = Http1Server(App(), idle_timeout_s=0.1)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    await server.start(sock)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
        writer.write(post("/x", b"1"))
        await read_response(reader)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server when idle
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
        writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n")  # and the rest of the head never comes
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    finally:
        await server.stop(grace_s=0)


async def test_a_request_head_over_the_limit_is_431(conn: Stream) -> None:
    reader, writer = conn
    writer.write(b"GET /h HTTP/1.1\r\n" + b"X-Big: " + b"a" * MAX_HEAD + b"\r\n\r\n")
    status, headers, body = await read_response(reader)
    assert status == 431 and headers[b"connection"] == b"close" and str(MAX_HEAD).encode() in body
    assert await asyncio.wait_for(reader.read(), 5) == b""


async def test_stop_lets_the_request_in_flight_finish_then_closes(
    served: tuple[Http1Server, App, int],
) -> None:
    server, app, port = served
    busy_reader, busy_writer = await asyncio.open_connection("127.0.0.1", port)
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
    busy_writer.write(post("/hold", b"h"))
    for _ in range(500):
        if app.active:
            break
        await asyncio.sleep(0.01)
    stopping = asyncio.create_task(server.stop(grace_s=10))
    assert await asyncio.wait_for(idle_reader.read(), 5) == b""  # idle: closed at once
    assert not stopping.done()
    app.release.set()
    status, headers, body = await read_response(busy_reader)
    assert (status, body, headers[b"connection"]) == (201, b"POST /hold h", b"close")
    await stopping
    busy_writer.close()
    idle_writer.close()


async def test_a_malformed_body_ends_the_request_reading_it(served: tuple[Http1Server, App, int]) -> None:
    _, app, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nZZ\r\n")
    # the app is reading this body and has not answered: the server answers 400 and closes
    status, headers, body = await read_response(reader)
    assert (status, headers[b"connection"]) == (400, b"close")
    assert body.startswith(b"malformed HTTP request:") and b"chunk" in body.lower()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    await asyncio.wait_for(app.disconnected.wait(), 5)  # the app's receive() saw the disconnect
    writer.close()


# ------------------------------------------------------------------ bounds (hardening)


async def start_server(app: Any, **options: Any) -> tuple[Http1Server, int]:
    """An Http1Server for ``app`` on a free 127.0.0.1 port, with ``options``; stop it after."""
    server = Http1Server(app, **options)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    await server.start(sock)
    return server, int(sock.getsockname()[1])


async def until(condition: Any, seconds: float = 5) -> None:
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


async def test_too_many_header_lines_is_431(conn: Stream) -> None:
    reader, writer = conn
    writer.write(b"GET /h HTTP/1.1\r\n" + b"X: y\r\n" * (MAX_HEADERS + 1) + b"\r\n")
    status, headers, body = await read_response(reader)
    assert status == 431 and headers[b"connection"] == b"close" and str(MAX_HEADERS).encode() in body
    assert await asyncio.wait_for(reader.read(), 5) == b""


async def test_a_stalled_body_gets_408_and_a_trickled_one_lives() -> None:
    app = App()
    server, port = await start_server(app, body_timeout_s=0.3)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/echo", b"0123456789")[:-5])  # and the other five bytes never come
        status, headers, body = await read_response(reader)
        assert (status, headers[b"connection"]) == (408, b"close") and b"no progress" in body
        assert await asyncio.wait_for(reader.read(), 5) == b""
        await asyncio.wait_for(app.disconnected.wait(), 5)  # the app's receive() saw it end
        writer.close()
        # a body that keeps coming, however slowly, is not cut off
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/echo", b"0123456789")[:-8])
        for byte in b"23456789":
            await asyncio.sleep(0.1)
            writer.write(bytes([byte]))
        assert (await read_response(reader))[:3:2] == (201, b"POST /echo 0123456789")
        writer.close()
        # a body the app has not asked for yet (waiting for 100-continue) does not time out
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/later", b"", "Expect: 100-continue").replace(b"Length: 0", b"Length: 2"))
        await asyncio.sleep(0.7)
        app.release.set()
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == _CONTINUE
        writer.write(b"ok")
        assert (await read_response(reader))[2] == b"POST /later ok"
        writer.close()
    finally:
        await server.stop(grace_s=0)


async def test_connections_past_the_cap_are_refused_and_slots_come_back() -> None:
    guard = ConnectionGuard("http", limit=3)
    server, port = await start_server(App(), guard=guard)
    try:
        clients = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        for reader, writer in clients:  # all three are served
            writer.write(post("/x", b"1"))
            assert (await read_response(reader))[0] == 201
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        status, headers, _ = await read_response(reader)  # refused before it sends anything
        assert (status, headers[b"connection"]) == (503, b"close") and guard.refused == 1
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        clients[0][1].close()
        await until(lambda: guard.open == 2)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/again", b"2"))
        assert (await read_response(reader))[2] == b"POST /again 2"
        writer.close()
        for _, other in clients[1:]:
            other.close()
        await until(lambda: guard.open == 0)  # each released exactly once
        assert guard.opened == 4
    finally:
        await server.stop(grace_s=0)


async def test_a_pipelined_body_waiting_behind_a_request_is_bounded(
    served: tuple[Http1Server, App, int],
) -> None:
    server, app, port = served
    big = b"b" * (4 * QUEUED_BODY_HIGH_WATER + 3 * (1 << 20))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/hold", b"h") + post("/big", big))
    await until(lambda: app.active == 1)
    await asyncio.sleep(0.3)  # the server reads what it will of the second request
    (connection,) = server.connections
    queued = sum(r.buffered for r in connection.waiting)
    assert queued <= QUEUED_BODY_HIGH_WATER + (1 << 20), queued  # + at most one read's bytes
    app.release.set()
    assert (await read_response(reader))[2] == b"POST /hold h"
    assert (await read_response(reader))[2] == b"POST /big " + big
    writer.close()


class Refuses:
    """Answers 413 with ``Connection: close`` without reading the body (as the app does for a
    body it will not buffer)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-length", b"2"), (b"Connection", b"close")]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": b"no"})


async def test_an_answer_that_closes_before_the_body_does_not_reset_the_client() -> None:
    server, port = await start_server(Refuses())
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/r", b"x" * (8 << 20))[: 1 << 20])  # a big body, one eighth sent so far
        status, headers, body = await read_response(reader)
        assert (status, body, headers[b"connection"]) == (413, b"no", b"close")
        writer.write(b"x" * (1 << 20))  # still sending: dropped, not parsed, no reset
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # then the server's end closes
        writer.close()
        await until(lambda: not server.connections, LINGER_S + 3)
    finally:
        await server.stop(grace_s=0)


async def test_a_stream_to_a_client_that_went_away_does_not_block(
    served: tuple[Http1Server, App, int],
) -> None:
    server, app, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
    await read_response(reader)
    writer.transport.abort()
    await until(lambda: not server.connections)
    assert app.active == 0


async def test_the_body_timer_left_by_one_request_watches_the_next() -> None:
    server, port = await start_server(App(), body_timeout_s=0.3)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        first = post("/a", b"0123456789")
        writer.write(first[:-5])  # the body comes in two parts: the timer is armed
        await asyncio.sleep(0.05)
        writer.write(first[-5:])
        assert (await read_response(reader))[2] == b"POST /a 0123456789"
        writer.write(post("/b", b"0123456789")[:-5])  # and this one stalls
        status, headers, _ = await read_response(reader)
        assert (status, headers[b"connection"]) == (408, b"close")
        writer.close()
    finally:
        await server.stop(grace_s=0)


# ------------------------------------------------------------------ answers nobody reads


def never_reads(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A client socket that reads nothing (a small receive buffer: answers wait in the server)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


async def test_a_pipelined_request_waits_until_its_client_takes_the_answer() -> None:
    """While a client has not taken an answer (the transport over its high-water mark), its
    connection reads and answers nothing more; once it reads, the next request is answered."""
    app = App()
    server, port = await start_server(app)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.transport.pause_reading()  # the client reads nothing for now
        writer.write(b"GET /sized?%d HTTP/1.1\r\nHost: x\r\n\r\n" % (32 << 20) + post("/a", b"1"))
        await until(lambda: len(app.scopes) == 1)
        await asyncio.sleep(0.3)
        assert len(app.scopes) == 1  # the second request waits for the first answer
        (conn,) = server.connections
        assert conn._blocked and conn.idle_since() is not None
        writer.transport.resume_reading()
        status, _, body = await read_response(reader)
        assert status == 200 and len(body) == 32 << 20
        assert (await read_response(reader))[2] == b"POST /a 1"
        writer.close()
    finally:
        await server.stop(grace_s=0)


async def test_the_unsent_budget_closes_the_connections_holding_the_most() -> None:
    """Past the server's budget of unsent response bytes the connections holding the most are
    closed (what they hold is given back at once); a client that reads is served meanwhile."""
    unsent = ByteBudget(24 << 20, count_small=True)
    server, port = await start_server(App(), unsent=unsent)
    try:
        big = never_reads(port)
        big.send(b"GET /sized?%d HTTP/1.1\r\nHost: x\r\n\r\n" % (20 << 20))
        await until(lambda: unsent.in_use > 16 << 20)
        small = never_reads(port)
        small.send(b"GET /sized?%d HTTP/1.1\r\nHost: x\r\n\r\n" % (16 << 20))
        await until(lambda: server.dropped == 1)  # together over 24 MiB: the one holding 20 MiB is closed
        assert unsent.in_use < 16 << 20
        (holder,) = server.holding  # the smaller holder stays
        assert holder.client is not None and holder.client[1] == small.getsockname()[1]
        assert unsent.in_use == holder._unsent
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /sized?%d HTTP/1.1\r\nHost: x\r\n\r\n" % (4 << 20))
        status, _, body = await read_response(reader)
        assert status == 200 and len(body) == 4 << 20
        writer.close()
        # a single answer larger than the whole budget: its own connection is closed
        huge = never_reads(port)
        huge.send(b"GET /sized?%d HTTP/1.1\r\nHost: x\r\n\r\n" % (64 << 20))
        await until(lambda: server.dropped >= 2)
        for sock in (big, small, huge):
            sock.close()
        await until(lambda: unsent.in_use == 0 and not server.holding)
    finally:
        await server.stop(grace_s=0)


async def test_an_answer_nobody_takes_is_cut_after_the_idle_timeout() -> None:
    server, port = await start_server(App(), idle_timeout_s=0.3, unsent=ByteBudget(1 << 30, count_small=True))
    try:
        sock = never_reads(port)
        sock.send(b"GET /sized?%d HTTP/1.1\r\nHost: x\r\n\r\n" % (16 << 20))
        await until(lambda: len(server.connections) == 1)
        await until(lambda: not server.connections, seconds=5)  # aborted: close() would wait forever
        assert server.unsent is not None and server.unsent.in_use == 0
        sock.close()
    finally:
        await server.stop(grace_s=0)


# ------------------------------------------------------------------ eviction


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def closed(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), 5) == b""
    except ConnectionError:
        return True


async def test_the_connection_idle_longest_is_evicted_for_a_new_one() -> None:
    """A full listener evicts the connection idle the longest (a trickled head counts as idle)
    for a new one, never one whose request is being answered; with none idle: 503."""
    clock = Clock()
    guard = ConnectionGuard("http", limit=3, clock=clock)
    app = App()
    server, port = await start_server(app, guard=guard, clock=clock)
    try:
        busy = await asyncio.open_connection("127.0.0.1", port)
        busy[1].write(post("/hold", b"x"))
        await until(lambda: app.active == 1)
        clock.now += 1
        trickler = await asyncio.open_connection("127.0.0.1", port)
        trickler[1].write(b"GET /h HTTP/1.1\r\nX-Slow: ")  # a head that never ends
        clock.now += 1
        served = await asyncio.open_connection("127.0.0.1", port)
        served[1].write(post("/a", b"1"))
        assert (await read_response(served[0]))[2] == b"POST /a 1"
        # none idle long enough yet: refused
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert (await read_response(reader))[0] == 503 and guard.refused == 1
        writer.close()
        clock.now += EVICT_AFTER_S
        # now the trickler (idle since it opened, its head bytes do not count) goes first
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/b", b"2"))
        assert (await read_response(reader))[2] == b"POST /b 2"
        assert await closed(trickler[0]) and guard.evicted == 1
        clock.now += EVICT_AFTER_S
        # then the one idle longest of the others; the one being answered never
        fresh = await asyncio.open_connection("127.0.0.1", port)
        assert await closed(served[0]) and guard.evicted == 2
        fresh[1].write(post("/c", b"3"))
        assert (await read_response(fresh[0]))[2] == b"POST /c 3"
        app.release.set()
        assert (await read_response(busy[0]))[2] == b"POST /hold x"
        assert guard.open == 3
        for _, w in (busy, fresh, (reader, writer), trickler, served):
            w.close()
        await until(lambda: guard.open == 0)
    finally:
        await server.stop(grace_s=0)


async def test_one_address_holds_at_most_its_share() -> None:
    """--max-connections-per-peer: a fourth connection from 127.0.0.2 is refused while the
    listener has room, and 127.0.0.1 is served."""
    guard = ConnectionGuard("http", limit=10, per_peer=3)
    server, port = await start_server(App(), guard=guard)
    try:
        held = [
            await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0)) for _ in range(3)
        ]
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
        assert (await read_response(reader))[0] == 503 and guard.refused == 1
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/a", b"1"))
        assert (await read_response(reader))[2] == b"POST /a 1"
        writer.close()
        for _, w in held:
            w.close()
    finally:
        await server.stop(grace_s=0)
