"""flowserve's own HTTP/2 transport for gRPC (flowserve/frontends/grpc/http2.py) against grpcio's
client (the C core that tritonclient and perf_analyzer use): flow control both ways, compression,
limits, cancellation, unknown methods, graceful stop, and what a non-gRPC peer gets. The
servicer-level behaviour (every Triton rpc) is covered by the other conformance suites, which
run on this transport by default; the last test runs a server on ``--grpc-server grpcio``."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from flowserve.frontends.grpc.http2 import (
    COMPRESSION_LEVELS,
    PREFACE,
    CallContext,
    Http2GrpcServer,
    Method,
    ResponseCompression,
    decode_block,
    frame,
    grpc_timeout_s,
)
from tests.h2raw import Blob, RawClient, parse_frames, request_headers, rst_codes, set_bound

SERVICE = "/test.Echo/"


class Echo:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def echo(self, request: bytes, context: CallContext) -> Blob:
        return Blob(request)

    async def double(self, request: bytes, context: CallContext) -> Blob:
        return Blob(request * 2)

    async def metadata(self, request: bytes, context: CallContext) -> Blob:
        return Blob(repr(sorted(context.invocation_metadata())).encode())

    async def fail(self, request: bytes, context: CallContext) -> Blob:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad input: 'x' ünïcode 100%")

    async def crash(self, request: bytes, context: CallContext) -> Blob:
        raise RuntimeError("boom")

    async def slow(self, request: bytes, context: CallContext) -> Blob:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return Blob(b"done")

    async def stream(self, requests: AsyncIterator[bytes], context: CallContext) -> AsyncIterator[Blob]:
        async for message in requests:
            await asyncio.sleep(0)  # a reader slower than the network
            yield Blob(message)


@pytest.fixture
async def echo_server() -> AsyncIterator[tuple[Http2GrpcServer, Echo, str]]:
    echo = Echo()
    methods = {
        SERVICE + name: Method(parse=bytes, unary=getattr(echo, name))
        for name in ("echo", "double", "metadata", "fail", "crash", "slow")
    }
    methods[SERVICE + "stream"] = Method(parse=bytes, streaming=echo.stream)
    server = Http2GrpcServer(methods, max_message=32 * 1024 * 1024)
    port = await server.start("127.0.0.1", 0)
    try:
        yield server, echo, f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


def _unary(target: str, name: str, payload: bytes, **kwargs: Any) -> bytes:
    with grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", -1)]) as channel:
        call = channel.unary_unary(SERVICE + name)
        result: bytes = call(payload, timeout=30, **kwargs)
        return result


async def test_large_messages_cross_the_flow_control_windows(echo_server: Any) -> None:
    _, _, target = echo_server
    payload = np.random.default_rng(0).bytes(5 * 1024 * 1024)
    # 5 MiB in, 10 MiB out: far over the client's initial window (64 KiB) and frame size
    assert await asyncio.to_thread(_unary, target, "double", payload) == payload * 2
    assert await asyncio.to_thread(_unary, target, "echo", b"") == b""


async def test_compressed_requests_are_decompressed(echo_server: Any) -> None:
    _, _, target = echo_server
    payload = b"abc" * 100_000
    for compression in (grpc.Compression.Gzip, grpc.Compression.Deflate):
        assert await asyncio.to_thread(_unary, target, "echo", payload, compression=compression) == payload


async def _status(target: str, method: str, payload: bytes, **kwargs: Any) -> tuple[grpc.StatusCode, str]:
    """The status and message a call ends with (it must fail)."""
    with pytest.raises(grpc.RpcError) as info:
        await asyncio.to_thread(_unary, target, method, payload, **kwargs)
    return info.value.code(), str(info.value.details())


async def test_status_and_message_of_an_aborted_call(echo_server: Any) -> None:
    _, _, target = echo_server
    assert await _status(target, "fail", b"x") == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "bad input: 'x' ünïcode 100%",
    )
    code, message = await _status(target, "crash", b"x")
    assert code == grpc.StatusCode.UNKNOWN and "boom" in message


async def test_unknown_method_is_unimplemented(echo_server: Any) -> None:
    _, _, target = echo_server
    code, message = await _status(target, "nope", b"x")
    assert code == grpc.StatusCode.UNIMPLEMENTED and "/test.Echo/nope" in message


async def test_message_over_the_limit_is_refused(echo_server: Any) -> None:
    server, _, target = echo_server
    server.max_message = 1000
    code, message = await _status(target, "echo", b"x" * 5000)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "5000 vs. 1000" in message
    assert await asyncio.to_thread(_unary, target, "echo", b"x" * 1000) == b"x" * 1000


async def test_metadata_reaches_the_servicer(echo_server: Any) -> None:
    _, _, target = echo_server
    seen = await asyncio.to_thread(_unary, target, "metadata", b"", metadata=[("x-request-tag", "abc")])
    assert b"('x-request-tag', 'abc')" in seen
    assert b"content-type" not in seen and b":path" not in seen


async def test_client_cancel_cancels_the_call(echo_server: Any) -> None:
    _, echo, target = echo_server

    def cancel_after_start() -> None:
        with grpc.insecure_channel(target) as channel:
            future = channel.unary_unary(SERVICE + "slow").future(b"", timeout=30)
            asyncio.run_coroutine_threadsafe(echo.started.wait(), loop).result(10)
            future.cancel()

    loop = asyncio.get_running_loop()
    await asyncio.to_thread(cancel_after_start)
    await asyncio.wait_for(echo.cancelled.wait(), 10)


async def test_bidi_stream_in_order_past_the_stream_window(echo_server: Any) -> None:
    _, _, target = echo_server
    messages = [bytes([i % 256]) * 65_536 for i in range(400)]  # 25 MiB: over the 16 MiB window

    def run() -> list[bytes]:
        with grpc.insecure_channel(target) as channel:
            call = channel.stream_stream(SERVICE + "stream")
            return list(call(iter(messages), timeout=60))

    assert await asyncio.to_thread(run) == messages


async def test_graceful_stop_lets_a_call_in_flight_finish(echo_server: Any) -> None:
    server, echo, target = echo_server
    loop = asyncio.get_running_loop()
    answer = loop.run_in_executor(None, _unary, target, "slow", b"")
    await asyncio.wait_for(echo.started.wait(), 10)
    stopping = asyncio.ensure_future(server.stop(10))
    await asyncio.sleep(0.1)
    assert not stopping.done()
    echo.release.set()
    assert await answer == b"done"
    await asyncio.wait_for(stopping, 10)
    with pytest.raises(grpc.RpcError) as info:
        await asyncio.to_thread(_unary, target, "echo", b"x")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def _raw_exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
                if len(received) > 100_000:
                    break
        except TimeoutError:
            pass
        return received


async def test_not_http2_gets_goaway_and_close(echo_server: Any) -> None:
    server, _, _ = echo_server
    received = await asyncio.to_thread(_raw_exchange, server.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    # SETTINGS and WINDOW_UPDATE on connect, then GOAWAY (type 7) with PROTOCOL_ERROR, then close
    types = _frame_types(received)
    assert types[-1] == 7
    assert received.endswith(b"not an HTTP/2 connection preface")


async def test_endless_continuation_frames_end_the_connection(echo_server: Any) -> None:
    server, _, _ = echo_server
    block = _request_headers(SERVICE + "echo")
    flood = b"".join(frame(9, 0, 1, bytes(16384)) for _ in range(5))  # 80 KiB of CONTINUATION
    received = await asyncio.to_thread(
        _raw_exchange, server.port, PREFACE + frame(4, 0, 0) + frame(1, 0, 1, block) + flood
    )
    goaway = [payload for ftype, payload in _frames(received) if ftype == 7]
    assert goaway and int.from_bytes(goaway[0][4:8], "big") == 11  # ENHANCE_YOUR_CALM


async def test_non_grpc_content_type_is_415(echo_server: Any) -> None:
    server, _, _ = echo_server
    import hpack

    block = hpack.Encoder().encode(
        [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + "echo"), (":authority", "x"),
         ("content-type", "application/json")]
    )  # fmt: skip
    request = PREFACE + frame(4, 0, 0) + frame(1, 0x5, 1, block) + frame(7, 0, 0, bytes(8))
    received = await asyncio.to_thread(_raw_exchange, server.port, request)
    headers = [payload for ftype, payload in _frames(received) if ftype == 1]
    assert hpack.Decoder().decode(headers[0]) == [(":status", "415")]


def _frames(data: bytes) -> list[tuple[int, bytes]]:
    return [(f.type, f.payload) for f in parse_frames(data)]


def _frame_types(data: bytes) -> list[int]:
    return [ftype for ftype, _ in _frames(data)]


@pytest.mark.slow
def test_grpcio_transport_still_serves(server_factory: Any) -> None:
    proc = server_factory.start("--grpc-server", "grpcio")
    with grpcclient.InferenceServerClient(proc.grpc_url) as client:
        assert client.is_server_live()
        x = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [
            grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
            grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(x)
        np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), x * 2)
        with pytest.raises(Exception, match="unknown model"):
            client.infer("no_such_model", inputs)


def test_indexed_fast_path_decodes_as_hpack_does() -> None:
    import hpack

    encoder, ours, reference = hpack.Encoder(), hpack.Decoder(), hpack.Decoder()
    many = [(f"x-filler-{i}", "v" * 40) for i in range(80)]  # pushes indices past 127 (0xFF)
    requests = [
        [(":method", "POST"), (":path", "/a/B"), ("content-type", "application/grpc"), ("x-id", "1")],
        [(":method", "POST"), (":path", "/a/B"), ("content-type", "application/grpc"), ("x-id", "1")],
        [(":method", "POST"), (":path", "/a/C"), ("x-id", "2")],
        many,
        many,
        [(":method", "POST"), (":path", "/a/B"), ("x-id", "1")],
    ]
    indexed_only = 0
    for headers in requests:
        block = encoder.encode(headers)
        indexed_only += bool(min(block) >= 0x80 and max(block) < 0xFF)
        expected = [(bytes(k), bytes(v)) for k, v in reference.decode(block, raw=True)]
        assert [(bytes(k), bytes(v)) for k, v in decode_block(ours, block)] == expected
    assert indexed_only >= 1  # the fast path ran
    with pytest.raises(hpack.exceptions.InvalidTableIndex):  # past the table, as in hpack
        decode_block(hpack.Decoder(), bytes([0x80 | 0x7E]))


def _request_headers(path: str) -> bytes:
    return request_headers(path)


def _read_frames(sock: socket.socket, seconds: float) -> list[tuple[int, int, bytes]]:
    """(type, stream id, payload) of every frame that arrives within ``seconds``."""
    sock.settimeout(seconds)
    data = b""
    try:
        while chunk := sock.recv(1 << 20):
            data += chunk
    except TimeoutError:
        pass
    return [(f.type, f.sid, f.payload) for f in parse_frames(data)]


async def test_connection_window_is_withheld_while_requests_wait_undelivered(
    echo_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:

    set_bound(monkeypatch, "CONNECTION_WINDOW", 1 << 20)  # 1 MiB; half of it acked at a time
    server, _, _ = echo_server
    server.max_message = 256 * 1024  # so at most max(2 x 256 KiB, 1 MiB) = 1 MiB waits undelivered
    body = b"\x00" + (220 * 1024).to_bytes(4, "big") + bytes(220 * 1024)

    def data_frames(sid: int, end: bool) -> bytes:
        chunks = [body[i : i + 16384] for i in range(0, len(body), 16384)]
        return b"".join(
            frame(0, 0x1 if end and i == len(chunks) - 1 else 0, sid, c) for i, c in enumerate(chunks)
        )

    def run() -> tuple[int, int, list[int]]:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(PREFACE + frame(4, 0, 0))
            for sid in (1, 3, 5, 7, 9):  # 1.1 MiB of requests, none complete
                sock.sendall(
                    frame(1, 0x4, sid, _request_headers(SERVICE + "echo")) + data_frames(sid, end=False)
                )
            before = [f for f in _read_frames(sock, 0.5) if f[0] == 8 and f[1] == 0]
            # the first request ends: it is delivered, and the window comes back
            sock.sendall(frame(0, 0x1, 1, b""))
            after = _read_frames(sock, 0.5)
            updates = [f for f in after if f[0] == 8 and f[1] == 0]
            return len(before), len(updates), [f[1] for f in after if f[0] == 1]

    before, after, answered = await asyncio.to_thread(run)
    assert before == 2  # the one sent on connecting, and one at 512 KiB; none at 1 MiB
    assert after == 1 and 1 in answered


async def test_a_refused_call_is_reset_only_while_the_client_still_sends(echo_server: Any) -> None:
    server, _, _ = echo_server
    unknown = _request_headers("/test.Echo/nope")

    def exchange(end_stream: bool) -> list[tuple[int, int, bytes]]:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(PREFACE + frame(4, 0, 0) + frame(1, 0x4 | (0x1 if end_stream else 0), 1, unknown))
            return _read_frames(sock, 0.5)

    import hpack

    for end_stream in (True, False):
        frames = await asyncio.to_thread(exchange, end_stream)
        headers = [payload for ftype, sid, payload in frames if ftype == 1 and sid == 1]
        assert ("grpc-status", "12") in hpack.Decoder().decode(headers[0])  # UNIMPLEMENTED, trailers only
        resets = [payload for ftype, sid, payload in frames if ftype == 3 and sid == 1]
        assert resets == ([] if end_stream else [bytes(4)])  # RST_STREAM NO_ERROR while still open


async def test_frames_for_an_ended_stream_leave_the_connection_up(echo_server: Any) -> None:
    """Frames the client sent before it knew of this side's reset are ignored; DATA on a
    stream that ended normally is a stream error (STREAM_CLOSED), not a connection error."""
    server, _, _ = echo_server
    echo = _request_headers(SERVICE + "echo")
    unknown = _request_headers("/test.Echo/nope")
    message = b"\x00" + (3).to_bytes(4, "big") + b"abc"

    def exchange() -> list[tuple[int, int, bytes]]:
        with RawClient(server.port) as client:
            client.handshake()
            # stream 1 ends normally; stream 3 is answered (and reset) before the client ends it
            client.send(frame(1, 0x4, 1, echo) + frame(0, 0x1, 1, message) + frame(1, 0x4, 3, unknown))
            client.read(0.3)
            # late frames: DATA for 1 (closed: STREAM_CLOSED), DATA and trailers for 3 (ignored)
            client.send(frame(0, 0x1, 1, message) + frame(0, 0, 3, message) + frame(1, 0x5, 3, echo))
            client.send(frame(1, 0x4, 5, echo) + frame(0, 0x1, 5, message))
            return [(f.type, f.sid, f.payload) for f in client.read(0.3)]

    frames = await asyncio.to_thread(exchange)
    answered = [sid for ftype, sid, payload in frames if ftype == 0]
    assert answered == [1, 5]  # one DATA (the echo) each; no GOAWAY
    assert all(ftype != 7 for ftype, _, _ in frames)
    assert rst_codes([_as_frame(f) for f in frames], 1) == [5]  # STREAM_CLOSED
    assert rst_codes([_as_frame(f) for f in frames], 3) == [0]  # NO_ERROR, only the one


def _as_frame(f: tuple[int, int, bytes]) -> Any:
    from tests.h2raw import Frame

    return Frame(f[0], 0, f[1], f[2])


def test_inflate_stops_at_the_limit() -> None:
    import zlib

    from flowserve.frontends.grpc.http2 import inflate

    bomb = zlib.compress(bytes(50 * 1024 * 1024))  # 50 MiB of zeros in about 50 KiB
    assert len(bomb) < 100_000
    assert inflate(bomb, zlib.MAX_WBITS, 1024 * 1024) is None
    assert inflate(zlib.compress(b"abc"), zlib.MAX_WBITS, 3) == b"abc"
    assert inflate(b"raw", None, 1) == b"raw"  # identity: not inflated
    with pytest.raises(zlib.error):
        inflate(zlib.compress(b"abc" * 1000)[:-8], zlib.MAX_WBITS, 10_000)  # cut short


async def test_a_compressed_bomb_is_refused(echo_server: Any) -> None:
    server, _, target = echo_server
    server.max_message = 1024 * 1024
    payload = bytes(20 * 1024 * 1024)  # gzip makes it about 20 KiB on the wire
    code, message = await _status(target, "echo", payload, compression=grpc.Compression.Gzip)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "inflated" in message


async def test_undelivered_byte_count_returns_to_zero_after_refusals(echo_server: Any) -> None:
    import zlib

    import hpack

    server, _, _ = echo_server
    server.max_message = 1024
    gzip_headers = hpack.Encoder().encode(
        [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + "echo"), (":authority", "x"),
         ("content-type", "application/grpc"), ("grpc-encoding", "gzip")]
    )  # fmt: skip
    packer = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    bomb = packer.compress(bytes(100_000)) + packer.flush()
    message = b"\x01" + len(bomb).to_bytes(4, "big") + bomb  # small on the wire, past the limit inflated
    _, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(
            PREFACE + frame(4, 0, 0) + frame(1, 0x4, 1, bytes(gzip_headers)) + frame(0, 0x1, 1, message)
        )
        await writer.drain()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if server.connections and not next(iter(server.connections)).streams:
                break
        (connection,) = server.connections
        assert not connection.streams  # answered RESOURCE_EXHAUSTED
        assert connection.buffered == 0  # counted once as delivered, not twice
    finally:
        writer.close()


def test_grpc_timeout_header_values() -> None:
    assert grpc_timeout_s("100m") == pytest.approx(0.1)
    assert grpc_timeout_s("2S") == 2.0 and grpc_timeout_s("1H") == 3600.0
    assert grpc_timeout_s("5000u") == pytest.approx(0.005) and grpc_timeout_s("7n") == pytest.approx(7e-9)
    for bad in (None, "", "m", "100", "100x", "123456789m", "-1S", "1.5S"):
        assert grpc_timeout_s(bad) is None, bad


async def test_the_deadline_a_client_sends_ends_the_call_here_too(echo_server: Any) -> None:
    """A client that never resets the stream still gets DEADLINE_EXCEEDED at its deadline,
    and the call is cancelled on the server."""
    server, echo, _ = echo_server
    import hpack

    block = hpack.Encoder().encode(
        [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + "slow"), (":authority", "x"),
         ("content-type", "application/grpc"), ("te", "trailers"), ("grpc-timeout", "100m")]
    )  # fmt: skip
    message = b"\x00" + (1).to_bytes(4, "big") + b"x"
    request = PREFACE + frame(4, 0, 0) + frame(1, 0x4, 1, block) + frame(0, 0x1, 1, message)

    def until_trailers() -> list[tuple[str, str]]:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(request)
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
                pos = 0
                while pos + 9 <= len(received):
                    length = int.from_bytes(received[pos : pos + 3], "big")
                    ftype, flags, sid = received[pos + 3], received[pos + 4], received[pos + 5 : pos + 9]
                    if ftype == 1 and flags & 0x1 and int.from_bytes(sid, "big") == 1:
                        payload = received[pos + 9 : pos + 9 + length]
                        return [(k, v) for k, v in hpack.Decoder().decode(payload)]
                    pos += 9 + length
        raise AssertionError("no trailers")

    headers = dict(await asyncio.to_thread(until_trailers))
    assert headers["grpc-status"] == str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
    assert headers["grpc-message"] == "Deadline Exceeded"
    await asyncio.wait_for(echo.cancelled.wait(), 5)


@pytest.fixture
async def compressing_server() -> AsyncIterator[Http2GrpcServer]:
    echo = Echo()
    methods = {SERVICE + name: Method(parse=bytes, unary=getattr(echo, name)) for name in ("echo", "double")}
    compression = ResponseCompression(COMPRESSION_LEVELS["high"], frozenset({SERVICE + "echo"}))
    server = Http2GrpcServer(methods, max_message=32 * 1024 * 1024, compression=compression)
    await server.start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.stop(0)


def _echo_raw(
    port: int, payload: bytes, accept: str | None, method: str = "echo"
) -> tuple[dict[str, str], bytes]:
    """One call over a raw connection: the response headers and the gRPC-framed response."""
    import hpack

    fields = [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + method), (":authority", "x"),
              ("content-type", "application/grpc"), ("te", "trailers")]  # fmt: skip
    if accept is not None:
        fields.append(("grpc-accept-encoding", accept))
    message = b"\x00" + len(payload).to_bytes(4, "big") + payload
    assert len(message) <= 16_384 and len(payload) * 2 < 65_535  # one frame in, the default window out
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(
            PREFACE
            + frame(4, 0, 0)
            + frame(1, 0x4, 1, hpack.Encoder().encode(fields))
            + frame(0, 0x1, 1, message)
        )
        frames = _read_frames(sock, 0.5)
    decoder = hpack.Decoder()
    blocks = [p for t, sid, p in frames if t == 1 and sid == 1]
    assert blocks, frames
    headers = dict(decoder.decode(blocks[0]))
    return headers, b"".join(p for t, sid, p in frames if t == 0 and sid == 1)


async def test_responses_are_compressed_as_the_client_accepts(compressing_server: Any) -> None:
    import gzip
    import zlib

    port = compressing_server.port
    payload = b"flowserve " * 1_500
    headers, body = await asyncio.to_thread(_echo_raw, port, payload, "identity,deflate,gzip")
    assert headers["grpc-encoding"] == "gzip" and body[0] == 1  # compressed flag
    assert int.from_bytes(body[1:5], "big") == len(body) - 5 < len(payload) // 50
    assert gzip.decompress(body[5:]) == payload
    headers, body = await asyncio.to_thread(_echo_raw, port, payload, "deflate")
    assert headers["grpc-encoding"] == "deflate" and zlib.decompress(body[5:]) == payload
    for accept in (None, "identity"):  # nothing it can decode: sent as it is
        headers, body = await asyncio.to_thread(_echo_raw, port, payload, accept)
        assert "grpc-encoding" not in headers and body[0] == 0 and body[5:] == payload
    headers, body = await asyncio.to_thread(_echo_raw, port, b"tiny", "gzip")  # too small to gain
    assert headers["grpc-encoding"] == "gzip" and body == b"\x00\x00\x00\x00\x04tiny"
    headers, body = await asyncio.to_thread(_echo_raw, port, payload, "gzip", "double")  # not listed
    assert "grpc-encoding" not in headers and body[5:] == payload * 2
    # grpcio's client (tritonclient's) accepts gzip and reads the compressed answer
    target = f"127.0.0.1:{port}"
    assert await asyncio.to_thread(_unary, target, "echo", payload) == payload


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["native", "grpcio"])
def test_compressed_inference_responses_reach_tritonclient(server_factory: Any, transport: str) -> None:
    proc = server_factory.start(
        f"--grpc-server={transport}", "--grpc-infer-response-compression-level=high", listeners="grpc"
    )
    x = np.tile(np.arange(64, dtype=np.float32), 64).reshape(1, 4096)  # 16 KiB, compressible
    with grpcclient.InferenceServerClient(proc.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT0", [1, 4096], "FP32")
        tensor.set_data_from_numpy(x)
        np.testing.assert_array_equal(client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"), x)
        assert client.get_model_metadata("identity_fp32").name == "identity_fp32"
