"""The tiny ASGI server behind the metrics port: requests, bodies, errors, keep-alive, stop, and
its bounds (connection cap, head and body timeouts, head size)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from flowserve.dataplane.guard import ConnectionGuard
from flowserve.observability.httpserver import MAX_HEAD, AsgiListener, Receive, Scope, Send, serve_asgi


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["path"] == "/boom":
        raise RuntimeError("boom")
    message = await receive()
    body = f"{scope['method']} {scope['path']} {scope['query_string'].decode()} ".encode() + message["body"]
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})


async def exchange(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5)  # until the server closes
    writer.close()
    return data


async def test_request_body_query_and_close() -> None:
    listener = await serve_asgi(echo, "127.0.0.1", 0)
    try:
        data = await exchange(
            listener.port,
            b"POST /x%20y?a=1 HTTP/1.1\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
        )
        assert data.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"connection: close" in data
        assert data.endswith(b"\r\n\r\nPOST /x y a=1 hello")
        data = await exchange(listener.port, b"GET / HTTP/1.0\r\n\r\n")  # 1.0: closes by default
        assert data.startswith(b"HTTP/1.1 200 OK") and data.endswith(b"GET /  ")
    finally:
        await listener.stop(1.0)


async def test_bad_requests_and_app_errors() -> None:
    listener = await serve_asgi(echo, "127.0.0.1", 0)
    try:
        assert (await exchange(listener.port, b"NONSENSE\r\n\r\n")).startswith(b"HTTP/1.1 400")
        too_big = b"POST / HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n"
        assert (await exchange(listener.port, too_big)).startswith(b"HTTP/1.1 413")
        chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        assert (await exchange(listener.port, chunked)).startswith(b"HTTP/1.1 400")
        boom = await exchange(listener.port, b"GET /boom HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert boom.startswith(b"HTTP/1.1 500")
    finally:
        await listener.stop(1.0)


async def test_stop_does_not_wait_for_idle_keep_alive_connections() -> None:
    listener = await serve_asgi(echo, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    writer.write(b"GET / HTTP/1.1\r\n\r\n")
    await writer.drain()
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    started = time.monotonic()
    await listener.stop(10.0)
    assert time.monotonic() - started < 2.0
    writer.close()


async def test_connection_cap_and_timeouts() -> None:
    guard = ConnectionGuard("metrics", limit=2)
    listener = AsgiListener(echo, idle_timeout_s=0.3, body_timeout_s=0.3, guard=guard)
    await listener.start("127.0.0.1", 0)
    try:
        held = [await asyncio.open_connection("127.0.0.1", listener.port) for _ in range(2)]
        for _ in range(200):
            if guard.open == 2:
                break
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        with contextlib.suppress(ConnectionError):  # closed at once, nothing answered
            assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        assert guard.refused == 1
        # the two held ones: a trickled head is closed after idle_timeout_s, a stalled body gets 408
        (r1, w1), (r2, w2) = held
        w1.write(b"GET / HTTP/1.1\r\nHost: x\r\n")
        w2.write(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n12345")
        assert await asyncio.wait_for(r1.read(), 5) == b""
        answer = await asyncio.wait_for(r2.read(), 5)
        assert answer.startswith(b"HTTP/1.1 408") and answer.endswith(b"within 0.3 s")
        w1.close()
        w2.close()
        for _ in range(200):
            if guard.open == 0:
                break
            await asyncio.sleep(0.01)
        assert guard.open == 0  # each slot given back once
        data = await exchange(listener.port, b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert data.startswith(b"HTTP/1.1 200")
    finally:
        await listener.stop(1.0)


async def test_a_head_over_the_limit_is_431() -> None:
    listener = await serve_asgi(echo, "127.0.0.1", 0)
    try:
        data = await exchange(listener.port, b"GET / HTTP/1.1\r\nX: " + b"a" * MAX_HEAD + b"\r\n\r\n")
        assert data.startswith(b"HTTP/1.1 431")
    finally:
        await listener.stop(1.0)
