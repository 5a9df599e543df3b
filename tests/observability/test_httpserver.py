"""The tiny ASGI server behind the metrics port: requests, bodies, errors, keep-alive, stop."""

from __future__ import annotations

import asyncio
import time

from flowserve.observability.httpserver import Receive, Scope, Send, serve_asgi


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
