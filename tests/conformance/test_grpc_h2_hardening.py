"""flowserve's HTTP/2 gRPC transport (flowserve/frontends/grpc/http2.py) under hostile clients,
in process over raw sockets (tests/h2raw.py): every attack of the attack run reproduced and
its bound checked (output to a peer that does not read, responses held by zero windows, rapid
reset, control-frame floods, CONTINUATION floods, compression bombs, header lists, half-open
and idle connections, the connection cap, message prefixes and the server's byte budget,
malformed grpc-timeout), where it matters with a good client on another connection answered
promptly meanwhile; then RFC 9113's error cases, table-driven in the spirit of h2spec (frames
sent -> the GOAWAY or RST_STREAM code expected)."""

from __future__ import annotations

import asyncio
import gzip
import logging
import socket
import threading
import time
import zlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import hpack
import pytest

from flowserve.dataplane import guard as guard_module
from flowserve.dataplane.guard import ByteBudget, ConnectionGuard
from flowserve.frontends.grpc import http2
from flowserve.frontends.grpc.http2 import CallContext, Connection, Http2GrpcServer, Method
from tests.h2raw import (
    CONTINUATION,
    DATA,
    GOAWAY,
    HEADERS,
    PING,
    PRIORITY,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    Blob,
    FakeTransport,
    RawClient,
    feed,
    frame,
    goaway_code,
    grpc_message,
    request_headers,
    rst_codes,
    set_bound,
    trailers,
    unary,
)
from tests.pacing import patient, prompt_bound

SERVICE = "/test.Echo/"
ENHANCE_YOUR_CALM, PROTOCOL_ERROR, FRAME_SIZE_ERROR, FLOW_CONTROL_ERROR = 11, 1, 6, 3
STREAM_CLOSED, REFUSED_STREAM, INTERNAL_ERROR, NO_ERROR = 5, 7, 2, 0


class Echo:
    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.cancelled = 0
        self.spewed = 0

    async def echo(self, request: bytes, context: CallContext) -> Blob:
        return Blob(request)

    async def big(self, request: bytes, context: CallContext) -> Blob:
        return Blob(bytes(int(request or b"0")))  # as many bytes as the request says

    async def slow(self, request: bytes, context: CallContext) -> Blob:
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return Blob(b"done")

    async def stream(self, requests: AsyncIterator[bytes], context: CallContext) -> AsyncIterator[Blob]:
        async for message in requests:
            yield Blob(message)

    async def hold(self, requests: AsyncIterator[bytes], context: CallContext) -> AsyncIterator[Blob]:
        """A streaming call that reads none of its requests until released."""
        await self.release.wait()
        yield Blob(b"done")

    async def spew(self, requests: AsyncIterator[bytes], context: CallContext) -> AsyncIterator[Blob]:
        """For each request "COUNT,SIZE", COUNT answers of SIZE bytes (``spewed`` counts them)."""
        async for request in requests:
            count, size = (int(part) for part in request.split(b","))
            for _ in range(count):
                self.spewed += 1
                yield Blob(bytes(size))


Start = Callable[..., Any]


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    """``await start(**Http2GrpcServer kwargs)``: a server of :class:`Echo` on 127.0.0.1."""
    servers: list[Http2GrpcServer] = []

    async def make(max_message: int = 64 * 1024 * 1024, **kwargs: Any) -> Http2GrpcServer:
        echo = Echo()
        methods = {
            SERVICE + name: Method(parse=bytes, unary=getattr(echo, name)) for name in ("echo", "big", "slow")
        }
        methods[SERVICE + "stream"] = Method(parse=bytes, streaming=echo.stream)
        methods[SERVICE + "hold"] = Method(parse=bytes, streaming=echo.hold)
        methods[SERVICE + "spew"] = Method(parse=bytes, streaming=echo.spew)
        server = Http2GrpcServer(methods, max_message=max_message, **kwargs)
        server.echo = echo  # type: ignore[attr-defined]
        await server.start("127.0.0.1", 0)
        servers.append(server)
        return server

    try:
        yield make
    finally:
        for server in servers:
            await server.stop(0)


def held_bytes(conn: Connection) -> int:
    """What one connection holds for its peer: the transport's buffer, frames not yet handed
    to it, bytes read and not parsed, responses waiting for windows."""
    transport = conn.transport
    buffered = (
        transport.get_write_buffer_size() if transport is not None and not transport.is_closing() else 0
    )
    return buffered + conn.pending_size + len(conn.buf) + conn.out_blocked


async def under_attack(
    server: Http2GrpcServer, attack: Callable[[], Any], path: str = SERVICE + "echo"
) -> tuple[Any, float, int]:
    """Run ``attack`` (in a thread) while a good client calls ``path`` on other connections and
    the loop watches what connections hold: (the attack's result, the good client's slowest
    call, the most any connection held)."""
    done = threading.Event()
    worst = [0]

    def good() -> float:
        slowest = 0.0
        calls = 0
        while not done.is_set() or calls < 3:
            fields, body, took = unary(server.port, path, b"ping", timeout=10)
            assert fields.get("grpc-status") == "0" and body.endswith(b"ping"), fields
            slowest = max(slowest, took)
            calls += 1
            time.sleep(0.02)
        return slowest

    async def watch() -> None:
        while not done.is_set():
            worst[0] = max([worst[0], *(held_bytes(c) for c in list(server.connections))])
            await asyncio.sleep(0.01)

    def run() -> Any:
        try:
            return attack()
        finally:
            done.set()

    watcher = asyncio.ensure_future(watch())
    result, slowest = await asyncio.gather(asyncio.to_thread(run), asyncio.to_thread(good))
    await watcher
    return result, slowest, worst[0]


def flood(port: int, unit: bytes, seconds: float, setup: bytes = b"", settings: bytes = b"") -> int | None:
    """Send ``unit`` over and over for ``seconds`` without reading a byte; the GOAWAY code the
    server sent (None: it only stopped reading, or nothing came)."""
    with RawClient(port, timeout=0.2) as client:
        client.handshake(settings)
        client.send(setup)
        batch = unit * max(1, 16384 // len(unit))
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                client.sock.sendall(batch)
            except TimeoutError:
                continue  # the server stopped reading: it is our send buffer that is full
            except OSError:
                break  # closed
        return client.goaway(seconds=3)


# ------------------------------------------------------------------ 1, 2: output back-pressure


async def test_unknown_methods_from_a_non_reader_are_bounded(start: Start) -> None:
    """Tiny requests (the long path indexed in HPACK's table) answered UNIMPLEMENTED: the path
    echoed is cut, and once the peer stops reading the server stops reading too."""
    server = await start()
    encoder = hpack.Encoder()
    path = "/test.Echo/" + "x" * 3000
    first = request_headers(path, encoder=encoder)
    again = request_headers(path, encoder=encoder)  # all indexed: a few bytes
    assert len(again) < 16

    def attack() -> int | None:
        with RawClient(server.port) as client:
            client.handshake()
            client.send(frame(HEADERS, 0x5, 1, first))
            client.until(HEADERS, 1)
            fields = trailers(client.frames(), 1)
            assert fields["grpc-status"] == "12" and len(fields["grpc-message"]) < 200
        sid = [1]

        def unit() -> bytes:
            sid[0] += 2
            return frame(HEADERS, 0x5, sid[0], again)

        with RawClient(server.port, timeout=0.2) as client:
            client.handshake()
            client.send(frame(HEADERS, 0x5, 1, first))
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                try:
                    client.sock.sendall(b"".join(unit() for _ in range(500)))
                except TimeoutError:
                    pass
                except OSError:
                    break
        return None

    _, slowest, worst = await under_attack(server, attack)
    assert worst < 8 * 1024 * 1024, worst  # was gigabytes
    assert slowest < prompt_bound()


@pytest.mark.parametrize(
    "unit", [frame(PING, 0, 0, bytes(8)), frame(SETTINGS, 0, 0)], ids=["ping", "settings"]
)
async def test_control_floods_from_a_non_reader_are_bounded(start: Start, unit: bytes) -> None:
    server = await start()
    code, slowest, worst = await under_attack(server, lambda: flood(server.port, unit, 1.5))
    assert worst < 8 * 1024 * 1024, worst
    assert code in (None, ENHANCE_YOUR_CALM)
    assert slowest < prompt_bound()


async def test_responses_held_by_zero_windows_are_bounded(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that opens no window: past CONN_SEND_AHEAD new streams are refused, past
    CONN_SEND_HARD the connection is closed (ENHANCE_YOUR_CALM), which frees it all."""
    set_bound(monkeypatch, "CONN_SEND_AHEAD", 1024 * 1024)
    set_bound(monkeypatch, "CONN_SEND_HARD", 4 * 1024 * 1024)
    server = await start()
    zero_window = (4).to_bytes(2, "big") + (0).to_bytes(4, "big")  # SETTINGS_INITIAL_WINDOW_SIZE 0
    call = request_headers(SERVICE + "big")

    def attack() -> tuple[list[int], int | None]:
        with RawClient(server.port) as client:
            client.handshake(zero_window)
            for sid in range(1, 13, 2):  # 6 x 200 KB: over the soft bound
                client.send(frame(HEADERS, 0x4, sid, call) + frame(DATA, 0x1, sid, grpc_message(b"200000")))
            time.sleep(0.3)
            client.send(frame(HEADERS, 0x4, 13, call) + frame(DATA, 0x1, 13, grpc_message(b"10")))
            client.until(RST_STREAM, 13, seconds=2)
            refused = rst_codes(client.frames(), 13)
            for sid in range(15, 200, 2):  # far more than the hard bound, sent without waiting
                client.send(frame(HEADERS, 0x4, sid, call) + frame(DATA, 0x1, sid, grpc_message(b"200000")))
            return refused, client.goaway(seconds=3)

    (refused, code), slowest, worst = await under_attack(server, attack)
    assert refused == [REFUSED_STREAM]
    assert code in (ENHANCE_YOUR_CALM, None)  # None: refused all along, never past the hard bound
    assert worst < 6 * 1024 * 1024, worst
    assert slowest < prompt_bound()


ZERO_WINDOW = (4).to_bytes(2, "big") + (0).to_bytes(4, "big")  # SETTINGS_INITIAL_WINDOW_SIZE 0


async def test_answers_held_for_zero_windows_share_one_server_budget(start: Start) -> None:
    """zero_window_stream: each connection could hold up to CONN_SEND_HARD of answers its client
    never opens a window for, and 16 of them held 2.5 GB. The server's budget of unsent bytes
    now bounds them all together: past it, the connections holding the most are shed (their
    waiting calls end RESOURCE_EXHAUSTED, then GOAWAY ENHANCE_YOUR_CALM), and the budget goes
    back to 0 once they are gone; a good client is answered meanwhile."""
    unsent = ByteBudget(4 * 1024 * 1024, count_small=True)
    server = await start(unsent=unsent)
    call = request_headers(SERVICE + "big")
    worst = [0]

    def one() -> tuple[int | None, list[str]]:
        with RawClient(server.port, timeout=5) as client:
            client.handshake(ZERO_WINDOW)
            for sid in range(1, 33, 2):  # 16 x 300 KB each, none of it readable
                client.send(frame(HEADERS, 0x4, sid, call) + frame(DATA, 0x1, sid, grpc_message(b"300000")))
                worst[0] = max(worst[0], unsent.in_use)
                client.read(0.01)  # (read as it goes: data it never reads could cost it the GOAWAY)
            code = client.goaway(seconds=2)
            statuses = [trailers(client.frames(), sid).get("grpc-status", "") for sid in range(1, 33, 2)]
            return code, statuses

    def attack() -> list[tuple[int | None, list[str]]]:
        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(lambda _: one(), range(8)))

    results, slowest, held = await under_attack(server, attack)
    assert worst[0] <= unsent.limit and held < 8 * 1024 * 1024, (worst[0], held)  # was 8 x 4.8 MB
    shed = [statuses for code, statuses in results if code == ENHANCE_YOUR_CALM]
    assert shed and all("8" in statuses for statuses in shed), results
    assert slowest < prompt_bound()
    for _ in range(100):
        if unsent.in_use == 0:
            break
        await asyncio.sleep(0.02)
    assert unsent.in_use == 0


async def test_a_stream_is_held_back_while_the_budget_is_tight(start: Start) -> None:
    """A streaming call whose client opens no window stops producing once half the server's
    budget of unsent bytes is taken (instead of growing to SEND_AHEAD and being shed), and goes
    on when its client reads."""
    unsent = ByteBudget(2 * 1024 * 1024, count_small=True)
    server = await start(unsent=unsent)

    def exchange() -> tuple[int, int, bytes, int]:
        with RawClient(server.port, timeout=5) as client:
            client.handshake(ZERO_WINDOW)
            client.send(
                frame(HEADERS, 0x4, 1, request_headers(SERVICE + "spew"))
                + frame(DATA, 0x1, 1, grpc_message(b"400,10000"))
            )
            time.sleep(0.5)
            held, spewed = unsent.in_use, server.echo.spewed  # type: ignore[attr-defined]
            for _ in range(400):  # the client reads: a window for everything, a bit at a time
                client.send(frame(WINDOW_UPDATE, 0, 1, (100_000).to_bytes(4, "big")))
                client.send(frame(WINDOW_UPDATE, 0, 0, (100_000).to_bytes(4, "big")))
                if client.until(HEADERS, 1, seconds=0.02, flags=0x1):
                    break
            client.until(HEADERS, 1, seconds=5, flags=0x1)
            body = b"".join(f.payload for f in client.frames() if f.type == DATA and f.sid == 1)
            return held, spewed, trailers(client.frames(), 1).get("grpc-status", "").encode(), len(body)

    held, spewed, status, received = await asyncio.to_thread(exchange)
    assert unsent.limit // 2 <= held <= unsent.limit // 2 + 20_000, held
    assert spewed < 200, spewed  # held back at about 100 answers of 10 KB
    assert status == b"0" and received == 400 * 10_005
    assert unsent.in_use == 0


# ------------------------------------------------------------------ 3: rapid reset, floods


async def test_rapid_reset_ends_the_connection(start: Start) -> None:
    server = await start()
    block = request_headers(SERVICE + "slow")

    def attack() -> int | None:
        with RawClient(server.port, timeout=0.5) as client:
            client.handshake()
            sid = 1
            for _ in range(20):
                batch = []
                for _ in range(500):
                    batch.append(
                        frame(HEADERS, 0x4, sid, block) + frame(RST_STREAM, 0, sid, (8).to_bytes(4, "big"))
                    )
                    sid += 2
                if not client.send(b"".join(batch)):
                    break
            code = client.goaway(seconds=3)
            return code if code is not None or not client.wait_closed(3) else ENHANCE_YOUR_CALM  # (see above)

    code, slowest, _ = await under_attack(server, attack)
    assert code == ENHANCE_YOUR_CALM
    assert slowest < prompt_bound()


def _open(sid: int) -> bytes:
    return frame(HEADERS, 0x4, sid, request_headers(SERVICE + "slow"))


@pytest.mark.parametrize(
    ("setup", "unit"),
    [
        (b"", frame(PING, 0, 0, bytes(8))),
        (b"", frame(SETTINGS, 0, 0)),
        (b"", frame(SETTINGS, 0x1, 0)),  # ACKs of SETTINGS this side never sent
        (b"", frame(PRIORITY, 0, 3, bytes(5))),
        (b"", frame(WINDOW_UPDATE, 0, 0, (1).to_bytes(4, "big"))),
        (b"", frame(0x42, 0, 0, b"?")),  # unknown frame type
        (_open(1), frame(DATA, 0, 1, b"")),
    ],
    ids=["ping", "settings", "settings_ack", "priority", "window_update", "unknown", "empty_data"],
)
async def test_control_frame_floods_end_the_connection(start: Start, setup: bytes, unit: bytes) -> None:
    server = await start()

    def attack() -> int | None:
        with RawClient(server.port, timeout=0.5) as client:
            client.handshake()
            client.send(setup)
            for _ in range(40):  # reading what comes back, so that it is the bucket that ends it
                if not client.send(unit * 3000) or client.closed:
                    break
                client.read(0.001)
            code = client.goaway(seconds=3)
            # closed with data still unread on its side, the server's kernel may reset the
            # connection, and the GOAWAY is lost with it: closed soon after the flood is enough
            return code if code is not None or not client.wait_closed(3) else ENHANCE_YOUR_CALM

    code, slowest, _ = await under_attack(server, attack)
    assert code == ENHANCE_YOUR_CALM
    assert slowest < prompt_bound()


async def test_a_fast_client_takes_no_control_tokens(
    start: Start, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """perf_analyzer over gRPC was cut off with GOAWAY ENHANCE_YOUR_CALM (logged nowhere): gRPC
    C-core sends a WINDOW_UPDATE on each new stream and one on the connection as each answer
    arrives, plus BDP PINGs and a SETTINGS ACK, and the control-frame bucket counted them all,
    so past 5k calls a second one connection ran it dry. With a bucket of 20 tokens that never
    refills, a C-core client (grpcio) makes thousands of unary and streamed calls on one
    connection: none fails, nothing is logged, no token is taken; a flood still ends it."""
    set_bound(monkeypatch, "CONTROL_BURST", 20)
    set_bound(monkeypatch, "CONTROL_RATE", 1e-9)
    server = await start()

    def calls() -> int:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            echo = channel.unary_unary(SERVICE + "echo")
            big = channel.unary_unary(SERVICE + "big")
            for i in range(1500):
                assert echo(b"x" * (i % 300), timeout=10) == b"x" * (i % 300)
            for _ in range(100):  # answers of several DATA frames, WINDOW_UPDATEs in between
                assert len(big(b"300000", timeout=10)) == 300_000
            stream = channel.stream_stream(SERVICE + "stream")
            messages = [bytes([i % 256]) * 2000 for i in range(1500)]
            assert list(stream(iter(messages), timeout=30)) == messages
        return len(server.connections)

    with caplog.at_level(logging.INFO, logger="flowserve.grpc"):
        assert await asyncio.to_thread(calls) <= 1
    assert not [r for r in caplog.records if "GOAWAY" in r.getMessage()]
    # a flood of PINGs on a connection that earned 4 by opening a stream ends it
    opening = frame(HEADERS, 0x5, 1, request_headers(SERVICE + "echo"))
    code = await asyncio.to_thread(flood, server.port, frame(PING, 0, 0, bytes(8)), 1.0, opening)
    assert code in (None, ENHANCE_YOUR_CALM)
    assert [r for r in caplog.records if "GOAWAY ENHANCE_YOUR_CALM" in r.getMessage()]


async def test_empty_continuation_frames_are_bounded(start: Start) -> None:
    server = await start()

    def attack() -> int | None:
        with RawClient(server.port) as client:
            client.handshake()
            client.send(
                frame(HEADERS, 0, 1, request_headers(SERVICE + "echo")) + frame(CONTINUATION, 0, 1) * 1000
            )
            return client.goaway()

    assert await asyncio.to_thread(attack) == ENHANCE_YOUR_CALM


# ------------------------------------------------------------------ 4: compression bombs


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9)


async def test_gzip_bombs_do_not_stall_the_loop(start: Start) -> None:
    server = await start(max_message=64 * 1024 * 1024)
    bomb = _gzip(bytes(100 * 1024 * 1024))  # about 100 KiB that inflate past the limit
    headers = request_headers(SERVICE + "echo", [("grpc-encoding", "gzip")])
    lag = [0.0]
    stop = asyncio.Event()

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            before = loop.time()
            await asyncio.sleep(0.005)
            lag[0] = max(lag[0], loop.time() - before - 0.005)

    def attack() -> list[str]:
        statuses = []
        with RawClient(server.port, timeout=10) as client:
            client.handshake()
            message = grpc_message(bomb, compressed=True)
            for sid in (1, 3, 5):
                chunks = [message[i : i + 16384] for i in range(0, len(message), 16384)]
                client.send(frame(HEADERS, 0x4, sid, headers))
                client.send(
                    b"".join(
                        frame(DATA, 0x1 if i == len(chunks) - 1 else 0, sid, c) for i, c in enumerate(chunks)
                    )
                )
            for sid in (1, 3, 5):
                client.until(HEADERS, sid, seconds=10, flags=0x1)
                statuses.append(trailers(client.frames(), sid).get("grpc-status", ""))
        return statuses

    tick = asyncio.ensure_future(ticker())
    statuses, slowest, _ = await under_attack(server, attack)
    stop.set()
    await tick
    assert statuses == ["8", "8", "8"]  # RESOURCE_EXHAUSTED
    # was 0.73 s per bomb, one after the other: 2.2 s for these; generous for a shared 2-core machine
    assert lag[0] < prompt_bound(), lag[0]
    assert slowest < prompt_bound()


async def test_large_compressed_messages_inflate_off_the_loop_correctly(start: Start) -> None:
    server = await start(max_message=8 * 1024 * 1024)
    payload = b"flowserve " * 300_000  # 3 MB, inflates past INFLATE_INLINE
    for encoding, packed in (("gzip", _gzip(payload)), ("deflate", zlib.compress(payload))):
        headers = request_headers(SERVICE + "echo", [("grpc-encoding", encoding)])

        def call(headers: bytes = headers, packed: bytes = packed) -> bytes:
            with RawClient(server.port, timeout=10) as client:
                client.handshake((4).to_bytes(2, "big") + (2**24).to_bytes(4, "big"))
                client.send(frame(WINDOW_UPDATE, 0, 0, (2**24).to_bytes(4, "big")))
                client.send(frame(HEADERS, 0x4, 1, headers) + frame(DATA, 0x1, 1, grpc_message(packed, True)))
                client.until(HEADERS, 1, seconds=10, flags=0x1)
                assert trailers(client.frames(), 1)["grpc-status"] == "0"
                return b"".join(f.payload for f in client.frames() if f.type == DATA)

        assert (await asyncio.to_thread(call))[5:] == payload
    # the same in a stream, in order with small messages around it
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stream = channel.stream_stream(SERVICE + "stream")
        messages = [b"a", payload, b"b", payload[:1000]]
        got = await asyncio.to_thread(
            lambda: list(stream(iter(messages), timeout=20, compression=grpc.Compression.Gzip))
        )
    assert got == messages


# ------------------------------------------------------------------ 5: header lists


def _big_headers_then_indexed(repeat: int) -> tuple[bytes, bytes]:
    """A request that puts a 3700-byte header in the table (beside the request's own fields,
    under the table's 4096 bytes), and one that names it ``repeat`` times, every field indexed
    (a byte each on the wire)."""
    encoder = hpack.Encoder()
    big = ("x-big", "v" * 3700)
    base = [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + "echo"),
            ("content-type", "application/grpc")]  # fmt: skip
    first = bytes(encoder.encode([big, *base]))
    again = bytes(encoder.encode([*base, *[big] * repeat]))
    return first, again


async def test_decoded_header_lists_are_bounded(start: Start) -> None:
    server = await start()
    first, again = _big_headers_then_indexed(50)  # 50 x 4 KB decoded from about 56 bytes
    assert len(again) <= 64

    def exchange() -> tuple[dict[str, str], dict[str, str], int | None, list[int]]:
        with RawClient(server.port) as client:
            client.handshake()
            settings = next(f for f in client.read(0.2) if f.type == SETTINGS).payload
            advertised = {int.from_bytes(settings[i : i + 2], "big"): int.from_bytes(settings[i + 2 : i + 6], "big")
                          for i in range(0, len(settings), 6)}  # fmt: skip
            client.send(frame(HEADERS, 0x4, 1, first) + frame(DATA, 0x1, 1, grpc_message(b"x")))
            client.send(frame(HEADERS, 0x4, 3, again) + frame(DATA, 0x1, 3, grpc_message(b"x")))
            client.until(HEADERS, 3, flags=0x1)
            frames = client.frames()
            ok, refused = trailers(frames, 1), trailers(frames, 3)
            # a list so large hpack stops decoding it: the connection ends
            big = request_headers(SERVICE + "echo", [(f"x-{i}", "v" * 4000) for i in range(40)])
            blocks = [big[i : i + 16384] for i in range(0, len(big), 16384)]
            client.send(
                frame(HEADERS, 0x4 if len(blocks) == 1 else 0, 5, blocks[0])
                + b"".join(
                    frame(CONTINUATION, 0x4 if i == len(blocks) - 1 else 0, 5, b)
                    for i, b in enumerate(blocks)
                    if i
                )
            )
            return ok, refused, client.goaway(), [advertised.get(6, 0)]

    ok, refused, code, advertised = await asyncio.to_thread(exchange)
    assert ok["grpc-status"] == "0"
    assert refused["grpc-status"] == "8" and "header list" in refused["grpc-message"]
    assert code == ENHANCE_YOUR_CALM
    assert advertised == [http2.MAX_HEADER_LIST]


async def test_header_bytes_held_by_open_streams_are_bounded(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_bound(monkeypatch, "MAX_HEADERS_HELD", 64 * 1024)
    server = await start()

    def exchange() -> list[int]:
        with RawClient(server.port) as client:
            client.handshake()
            for sid in range(1, 41, 2):  # 20 open streams of about 10 KB of headers each
                fields = [(f"x-h{sid}-{i}", "v" * 1000) for i in range(10)]
                client.send(frame(HEADERS, 0x4, sid, request_headers(SERVICE + "slow", fields)))
            client.read(0.5)
            return [sid for sid in range(1, 41, 2) if rst_codes(client.frames(), sid) == [REFUSED_STREAM]]

    refused = await asyncio.to_thread(exchange)
    assert 5 <= len(refused) <= 14 and refused == sorted(refused) and refused[-1] == 39


def _count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the header blocks the transport decodes from now on, in order."""
    decoded: list[int] = []
    decode = http2.decode_headers

    def counting(decoder: hpack.Decoder, block: bytes) -> tuple[list[tuple[bytes, bytes]], int]:
        decoded.append(len(block))
        return decode(decoder, block)

    set_bound(monkeypatch, "decode_headers", counting)
    return decoded


def _indexed_fields(count: int, path: str = SERVICE + "echo", content_type: bool = True) -> bytes:
    """A request's header block with ``count`` more fields, each one indexed byte (HPACK's
    static ":method: GET", 42 bytes decoded): cheap to send, dear to decode in Python."""
    block = request_headers(path) if content_type else bytes(hpack.Encoder().encode([(":path", path)]))
    return block + b"\x82" * count


async def test_header_blocks_of_many_fields_are_bounded(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hpack_hold: 3,000 header fields took hpack 50 ms to decode, a client sent them block after
    block. Past MAX_HEADER_FIELDS a call is answered RESOURCE_EXHAUSTED; a block of more than
    twice that is not decoded at all: the connection ends (GOAWAY ENHANCE_YOUR_CALM)."""
    server = await start()
    decoded = _count_decodes(monkeypatch)

    def exchange() -> tuple[dict[str, str], dict[str, str], int | None]:
        with RawClient(server.port) as client:
            client.handshake()
            client.send(
                frame(HEADERS, 0x4, 1, _indexed_fields(300)) + frame(DATA, 0x1, 1, grpc_message(b"x"))
            )
            client.send(frame(HEADERS, 0x4, 3, request_headers(SERVICE + "echo")))
            client.send(frame(DATA, 0x1, 3, grpc_message(b"ok")))
            client.until(HEADERS, 3, flags=0x1)
            refused, ok = trailers(client.frames(), 1), trailers(client.frames(), 3)
            client.send(frame(HEADERS, 0x5, 5, _indexed_fields(1500)))
            return refused, ok, client.goaway()

    refused, ok, code = await asyncio.to_thread(exchange)
    assert refused["grpc-status"] == "8" and "fields" in refused["grpc-message"], refused
    assert ok["grpc-status"] == "0"
    assert code == ENHANCE_YOUR_CALM
    assert len(decoded) == 2  # the block of 1,500 fields was never decoded


async def test_streams_answered_from_heavy_headers_end_the_connection(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    """hpack_hold: a client opening stream after stream that is refused or answered from its
    headers alone (here: not gRPC, 415), each with hundreds of fields to decode, never got a
    GOAWAY. Each now costs the reset bucket a token per 8 fields: the connection ends soon, a
    good client is answered meanwhile."""
    server = await start()
    block = _indexed_fields(500, content_type=False)

    def attack() -> int:
        with RawClient(server.port, timeout=0.5) as client:
            client.handshake()
            sid = 1
            while sid < 8192 and client.send(frame(HEADERS, 0x5, sid, block)):
                sid += 2
                client.read(0.001)  # what it has answered so far (its GOAWAY, once it comes)
                if client.closed or goaway_code(client.frames()) is not None:
                    break
            client.wait_closed(3)
            return sid // 2

    with caplog.at_level(logging.WARNING, logger="flowserve.grpc"):
        sent, slowest, _ = await under_attack(server, attack)
    told = [r.getMessage() for r in caplog.records if "GOAWAY ENHANCE_YOUR_CALM" in r.getMessage()]
    assert told and "too many streams reset" in told[0], told
    assert sent < 256, sent  # about RESET_BURST / 63 streams, then it was told to go
    assert slowest < prompt_bound()


async def test_a_connections_turn_is_weighed_by_its_header_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule behind the next test, without timing: 50 header blocks of 500 fields in one read
    weigh ``FRAMES_PER_TURN`` long before they are all handled (they counted 50 frames, a quarter
    of a turn), so the connection defers the rest to the loop's next turn; the rest is then
    handled, none lost."""
    set_bound(monkeypatch, "RESET_BURST", 10**9)
    decoded = _count_decodes(monkeypatch)
    server = Http2GrpcServer({SERVICE + "echo": Method(parse=bytes, unary=Echo().echo)}, max_message=1 << 20)
    conn = Connection(server)
    conn.connection_made(FakeTransport())  # type: ignore[arg-type]
    feed(conn, http2.PREFACE + frame(SETTINGS, 0, 0))
    block = _indexed_fields(500, content_type=False)
    per_turn = http2.FRAMES_PER_TURN // (1 + len(block) // http2.HEADER_BYTES_PER_FRAME) + 1
    feed(conn, b"".join(frame(HEADERS, 0x5, 1 + 2 * i, block) for i in range(50)))
    assert conn.deferred and len(decoded) <= per_turn < 50, (len(decoded), per_turn)
    for _ in range(50):  # the loop's next turns
        if len(decoded) == 50:
            break
        await asyncio.sleep(0)
    assert len(decoded) == 50


async def test_header_blocks_of_one_connection_cannot_hold_the_loop(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hpack_hold: FRAMES_PER_TURN counted a block of 500 fields (1 ms to decode) as one frame,
    so 200 of them ran before any other connection had its turn. Header bytes now weigh in:
    with the reset bucket out of the way, three connections sending such blocks as fast as
    they can leave a good client answered at once (it waited 3.4 to 4.6 s)."""
    set_bound(monkeypatch, "RESET_BURST", 10**9)
    server = await start()
    block = _indexed_fields(500, content_type=False)

    def one(deadline: float) -> None:
        with RawClient(server.port, timeout=0.5) as client:
            client.handshake()
            sid = 1
            while time.monotonic() < deadline and sid < 2**20:
                batch = b"".join(frame(HEADERS, 0x5, sid + 2 * i, block) for i in range(50))
                sid += 100
                try:
                    client.sock.sendall(batch)
                except TimeoutError:
                    continue
                except OSError:
                    return
                client.read(0.001)  # (its 415s, so that the server keeps reading)

    def attack() -> None:
        deadline = time.monotonic() + 2.5
        threads = [threading.Thread(target=one, args=(deadline,)) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    _, slowest, _ = await under_attack(server, attack)
    # twice the other attack tests' bound: the three senders are threads of this process (decoding
    # their blocks and the good client's calls share one interpreter lock), and on a busy machine
    # that alone read 1.5 s (bound 1.24); the rule itself is checked exactly by the test above
    assert slowest < 2 * prompt_bound()


# ------------------------------------------------------------------ 6: timeouts, connection cap


async def test_half_open_connections_time_out(start: Start) -> None:
    server = await start(handshake_timeout_s=0.3, idle_timeout_s=0)

    def exchange() -> list[float]:
        took = []
        for opening in (b"", b"PRI * HTTP/2.0\r\n", http2.PREFACE):  # nothing, half a preface, no SETTINGS
            begin = time.monotonic()
            with RawClient(server.port) as client:
                client.send(opening)
                assert client.wait_closed(5)
            took.append(time.monotonic() - begin)
        return took

    for took in await asyncio.to_thread(exchange):
        assert 0.25 <= took < patient(2.5)


async def test_idle_connections_get_goaway_and_close(start: Start) -> None:
    server = await start(idle_timeout_s=0.3)

    def exchange() -> tuple[int | None, float, bool]:
        with RawClient(server.port) as client:
            client.handshake()
            client.send(
                frame(HEADERS, 0x4, 1, request_headers(SERVICE + "echo"))
                + frame(DATA, 0x1, 1, grpc_message(b"x"))
            )
            begin = time.monotonic()
            code = client.goaway(seconds=5)
            return code, time.monotonic() - begin, client.wait_closed(3)

    code, took, closed = await asyncio.to_thread(exchange)
    assert code == NO_ERROR and closed and took < patient(2.5)

    # a call in progress keeps its connection
    def busy() -> int | None:
        with RawClient(server.port) as client:
            client.handshake()
            client.send(frame(HEADERS, 0x4, 1, request_headers(SERVICE + "slow")))
            return client.goaway(seconds=1.0)

    assert await asyncio.to_thread(busy) is None


async def test_connection_cap(start: Start) -> None:
    guard = ConnectionGuard("grpc", limit=2)
    server = await start(guard=guard)

    def exchange() -> tuple[bool, int]:
        with RawClient(server.port) as a, RawClient(server.port) as b:
            a.handshake()
            b.handshake()
            assert a.until(SETTINGS) and b.until(SETTINGS)
            with RawClient(server.port) as c:
                refused = c.wait_closed(3) and not c.frames()  # closed at once, not even SETTINGS
            return refused, guard.refused

    refused, count = await asyncio.to_thread(exchange)
    assert refused and count == 1
    for _ in range(100):
        if guard.open == 0:
            break
        await asyncio.sleep(0.02)
    assert guard.open == 0  # each admitted connection released once
    fields, _, _ = await asyncio.to_thread(unary, server.port, SERVICE + "echo", b"x")
    assert fields["grpc-status"] == "0"
    await asyncio.sleep(0.1)
    assert guard.open == 0 and guard.opened == 3


class RawClientFrom(RawClient):
    """A raw connection from another loopback address (Linux routes all of 127/8 to lo): a
    second peer, as the guard's per-peer cap sees it."""

    def __init__(self, port: int, source: str, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))
        self.data = b""
        self.closed = False


def _pinging(
    port: int, seconds: float, every: float = 0.1, source: str = "127.0.0.1"
) -> tuple[int | None, float]:
    """A connection with no call that sends a keep-alive PING every ``every`` seconds for up
    to ``seconds``: the GOAWAY code it got (None: none, or refused at once) and when."""
    begin = time.monotonic()
    with RawClientFrom(port, source) as client:
        client.handshake()
        while time.monotonic() - begin < seconds:
            if not client.send(frame(PING, 0, 0, bytes(8))) or client.until(GOAWAY, seconds=every):
                break
            if client.closed:
                break
        return goaway_code(client.frames()), time.monotonic() - begin


async def test_pings_do_not_hold_off_the_idle_timeout(start: Start) -> None:
    """One PING every 20 s kept a gRPC connection open for ever (any frame reset the idle
    timer); a connection with no call now goes after ``idle_timeout_s`` whatever it pings."""
    server = await start(idle_timeout_s=0.5)
    code, took = await asyncio.to_thread(_pinging, server.port, 5.0)
    assert code == NO_ERROR and 0.4 <= took < patient(2.0), (code, took)


async def test_a_full_listener_evicts_its_idlest_connection(
    start: Start, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """4,200 idle sockets, each a PING every 20 s, locked new clients out of a full listener.
    A connection with no call for EVICT_AFTER_S now gives its slot to a new one (GOAWAY NO_ERROR,
    the idlest first, PINGs or not); one with a call in progress never does."""
    monkeypatch.setattr(guard_module, "EVICT_AFTER_S", 0.3)
    guard = ConnectionGuard("grpc", limit=3)
    server = await start(guard=guard)

    def exchange() -> tuple[list[int | None], str, bool, float]:
        with RawClient(server.port) as busy:
            busy.handshake()
            busy.send(frame(HEADERS, 0x4, 1, request_headers(SERVICE + "slow")))  # a call, never ends
            with ThreadPoolExecutor(2) as pool:
                idle = [pool.submit(_pinging, server.port, 4.0) for _ in range(2)]
                time.sleep(0.6)  # all three are in; the two idle ones for longer than EVICT_AFTER_S
                fields, _, took = unary(server.port, SERVICE + "echo", b"new")  # evicts one
                for _ in range(100):  # its connection closed: busy and one idle left
                    if guard.open == 2:
                        break
                    time.sleep(0.01)
                with RawClient(server.port) as late, RawClient(server.port) as later:
                    late.handshake()  # the slot the call above left
                    assert late.until(SETTINGS, seconds=2)
                    later.handshake()  # evicts the other idle one
                    assert later.until(SETTINGS, seconds=2)
                    codes = sorted((f.result()[0] for f in idle), key=str)
                    with RawClient(server.port) as refused:  # busy is busy, the others new: no room
                        shut = refused.wait_closed(2) and not refused.frames()
            return codes, fields.get("grpc-status", ""), shut, took

    with caplog.at_level(logging.INFO, logger="flowserve.grpc"):
        codes, status, refused, took = await asyncio.to_thread(exchange)
    assert codes == [NO_ERROR, NO_ERROR] and status == "0" and took < prompt_bound()
    assert refused and guard.evicted == 2 and guard.refused == 1
    assert [r for r in caplog.records if "evicted" in r.getMessage()]
    server.echo.release.set()  # type: ignore[attr-defined]


async def test_a_peer_at_its_cap_evicts_only_its_own(start: Start, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection guard's per-peer cap: a third connection from 127.0.0.2 (cap 2) evicts
    that peer's idlest one, never another peer's; with both of its own busy it is refused."""
    monkeypatch.setattr(guard_module, "EVICT_AFTER_S", 0.3)
    guard = ConnectionGuard("grpc", limit=10, per_peer=2)
    server = await start(guard=guard)

    def exchange() -> tuple[list[int | None], int | None, bool]:
        with ThreadPoolExecutor(3) as pool:
            other = pool.submit(_pinging, server.port, 2.0)  # 127.0.0.1, idle the longest
            time.sleep(0.1)
            mine = [pool.submit(_pinging, server.port, 2.0, 0.1, "127.0.0.2") for _ in range(2)]
            time.sleep(0.6)
            with RawClientFrom(server.port, "127.0.0.2") as third:
                third.handshake()
                assert third.until(SETTINGS, seconds=2)
                third.send(frame(HEADERS, 0x4, 1, request_headers(SERVICE + "slow")))
                codes = sorted((f.result()[0] for f in mine), key=str)
                with RawClientFrom(server.port, "127.0.0.2") as fourth:
                    fourth.handshake()
                    fourth.send(frame(HEADERS, 0x4, 1, request_headers(SERVICE + "slow")))
                    time.sleep(0.5)  # both of 127.0.0.2's busy now
                    with RawClientFrom(server.port, "127.0.0.2") as fifth:
                        shut = fifth.wait_closed(2) and not fifth.frames()
            return codes, other.result()[0], shut

    codes, others, shut = await asyncio.to_thread(exchange)
    assert codes == [NO_ERROR, None] and others is None and shut, (codes, others, shut)
    server.echo.release.set()  # type: ignore[attr-defined]


def test_tls_handshake_timeout_is_passed_to_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    import ssl

    seen: dict[str, Any] = {}

    async def run() -> None:
        loop = asyncio.get_running_loop()
        original = loop.create_server

        async def create_server(*args: Any, **kwargs: Any) -> Any:
            seen.update(kwargs)
            kwargs.pop("ssl")
            kwargs.pop("ssl_handshake_timeout")
            return await original(*args, **kwargs)

        monkeypatch.setattr(loop, "create_server", create_server)
        server = Http2GrpcServer({}, 1024, handshake_timeout_s=3.5)
        await server.start("127.0.0.1", 0, tls=ssl.create_default_context(ssl.Purpose.CLIENT_AUTH))
        await server.stop(0)

    asyncio.run(run())
    assert seen["ssl_handshake_timeout"] == 3.5


# ------------------------------------------------------------------ 7: message prefix, budget


async def test_a_message_over_the_limit_is_refused_from_its_prefix(start: Start) -> None:
    server = await start(max_message=1024 * 1024)

    def exchange() -> tuple[dict[str, str], list[int]]:
        with RawClient(server.port) as client:
            client.handshake()
            prefix = b"\x00" + (50 * 1024 * 1024).to_bytes(4, "big") + b"abc"
            client.send(frame(HEADERS, 0x4, 1, request_headers(SERVICE + "echo")) + frame(DATA, 0, 1, prefix))
            client.until(HEADERS, 1, flags=0x1, seconds=3)
            answered = trailers(client.frames(), 1)
            client.send(frame(DATA, 0, 1, bytes(16000)) * 4)  # the rest: ignored, window kept right
            client.send(
                frame(HEADERS, 0x4, 3, request_headers(SERVICE + "echo"))
                + frame(DATA, 0x1, 3, grpc_message(b"ok"))
            )
            client.until(HEADERS, 3, flags=0x1)
            return answered | {"next": trailers(client.frames(), 3)["grpc-status"]}, rst_codes(
                client.frames(), 1
            )

    fields, resets = await asyncio.to_thread(exchange)
    assert fields["grpc-status"] == "8" and "52428800 vs. 1048576" in fields["grpc-message"]
    assert fields["next"] == "0" and resets == [NO_ERROR]


async def test_the_byte_budget_refuses_and_is_given_back(start: Start) -> None:
    budget = ByteBudget(limit=1024 * 1024)
    server = await start(budget=budget)
    declare = b"\x00" + (700 * 1024).to_bytes(4, "big") + bytes(1000)

    def exchange() -> tuple[str, str, int]:
        with RawClient(server.port) as client:
            client.handshake()
            client.send(
                frame(HEADERS, 0x4, 1, request_headers(SERVICE + "echo")) + frame(DATA, 0, 1, declare)
            )
            client.send(
                frame(HEADERS, 0x4, 3, request_headers(SERVICE + "echo")) + frame(DATA, 0, 3, declare)
            )
            client.until(HEADERS, 3, flags=0x1)
            refused = trailers(client.frames(), 3)
            in_use = budget.in_use
            client.send(frame(RST_STREAM, 0, 1, (8).to_bytes(4, "big")))  # the first one dies
            time.sleep(0.1)
            return refused["grpc-status"], refused["grpc-message"], in_use

    status, message, in_use = await asyncio.to_thread(exchange)
    assert status == "8" and "budget" in message
    assert in_use == 700 * 1024
    assert budget.in_use == 0
    # a stream of large messages: each taken while it arrives, given back once parsed
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stream = channel.stream_stream(SERVICE + "stream")
        messages = [bytes([i]) * (300 * 1024) for i in range(6)]
        assert await asyncio.to_thread(lambda: list(stream(iter(messages), timeout=20))) == messages
    assert budget.in_use == 0

    # a connection lost mid-message gives its bytes back
    def lose() -> None:
        with RawClient(server.port) as client:
            client.handshake()
            client.send(
                frame(HEADERS, 0x4, 1, request_headers(SERVICE + "stream")) + frame(DATA, 0, 1, declare)
            )
            time.sleep(0.1)
            assert budget.in_use == 700 * 1024

    await asyncio.to_thread(lose)
    for _ in range(100):
        if budget.in_use == 0:
            break
        await asyncio.sleep(0.02)
    assert budget.in_use == 0


async def test_a_request_message_that_stops_arriving_is_timed_out(start: Start) -> None:
    """A call that sent its headers and no body was held for ever (its stream, its header
    bytes, and for a large declared message its share of the byte budget). A request message
    that makes no progress for ``body_timeout_s`` now ends DEADLINE_EXCEEDED (then RST_STREAM:
    the client need not send on) and what it held goes back; a message arriving slowly but
    steadily, and a streaming call idle between messages, go on."""
    budget = ByteBudget(limit=1024 * 1024)
    server = await start(budget=budget, body_timeout_s=0.4)
    declare = b"\x00" + (700 * 1024).to_bytes(4, "big") + bytes(1000)

    def exchange() -> tuple[dict[int, dict[str, str]], dict[int, float], list[int], int, int]:
        with RawClient(server.port) as client:
            client.handshake()
            begin = time.monotonic()
            client.send(frame(HEADERS, 0x4, 1, request_headers(SERVICE + "echo")))  # no body, ever
            client.send(
                frame(HEADERS, 0x4, 3, request_headers(SERVICE + "echo")) + frame(DATA, 0, 3, declare)
            )
            client.send(frame(HEADERS, 0x4, 5, request_headers(SERVICE + "stream")))
            client.send(frame(DATA, 0, 5, grpc_message(b"one")))  # then nothing: between messages
            client.send(frame(HEADERS, 0x4, 7, request_headers(SERVICE + "echo")))
            message = grpc_message(b"slow but steady")
            ended: dict[int, float] = {}
            held = 0
            for i, byte in enumerate(message):  # a byte every 0.1 s: 2 s in all
                client.send(frame(DATA, 0x1 if i == len(message) - 1 else 0, 7, bytes([byte])))
                client.read(0.1)
                held = max(held, budget.in_use)
                for sid in (1, 3):
                    if sid not in ended and trailers(client.frames(), sid).get("grpc-status"):
                        ended[sid] = time.monotonic() - begin
            client.until(HEADERS, 7, flags=0x1, seconds=3)
            fields = {sid: trailers(client.frames(), sid) for sid in (1, 3, 5, 7)}
            return fields, ended, rst_codes(client.frames(), 1), held, budget.in_use

    fields, ended, resets, held, after = await asyncio.to_thread(exchange)
    for sid in (1, 3):
        assert fields[sid]["grpc-status"] == "4" and "no progress" in fields[sid]["grpc-message"], fields
        assert 0.3 <= ended[sid] < 1.5, ended
    assert resets == [NO_ERROR]
    assert held == 700 * 1024 and after == 0  # the declared message's budget went back
    assert "grpc-status" not in fields[5]  # the stream idle between messages is still open
    assert fields[7]["grpc-status"] == "0"


# ------------------------------------------------------------------ 8: grpc-timeout, exceptions


@pytest.mark.parametrize(
    "value",
    [
        "\u0661\u0660\u0660m".encode(),
        "\uff11\uff10\uff10m".encode(),
        b"\xb2\xb2m",
        b"1.5S",
        b"100x",
        b"123456789m",
    ],
    ids=["arabic-indic", "fullwidth", "superscript", "fraction", "unit", "too-long"],
)
async def test_a_malformed_grpc_timeout_is_answered(start: Start, value: bytes) -> None:
    server = await start()
    block = hpack.Encoder().encode(
        [(b":method", b"POST"), (b":scheme", b"http"), (b":path", (SERVICE + "echo").encode()), (b":authority", b"x"),
         (b"content-type", b"application/grpc"), (b"grpc-timeout", value)]
    )  # fmt: skip

    def exchange() -> dict[str, str]:
        with RawClient(server.port) as client:
            client.handshake()
            client.send(frame(HEADERS, 0x4, 1, block) + frame(DATA, 0x1, 1, grpc_message(b"x")))
            client.until(HEADERS, 1, flags=0x1, seconds=3)
            return trailers(client.frames(), 1)

    fields = await asyncio.to_thread(exchange)
    assert fields["grpc-status"] == "13" and "grpc-timeout" in fields["grpc-message"]
    assert all(not c.streams for c in server.connections)  # no stream slot leaked


async def test_an_unexpected_exception_is_one_line_and_goaway(
    start: Start, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    server = await start()

    def broken(self: Connection, sid: int, payload: bytes) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(Connection, "_priority", broken)

    def exchange() -> int | None:
        with RawClient(server.port) as client:
            client.handshake()
            client.send(frame(PRIORITY, 0, 1, bytes(5)))
            return client.goaway()

    with caplog.at_level(logging.DEBUG, logger="flowserve.grpc"):
        assert await asyncio.to_thread(exchange) == INTERNAL_ERROR
    lines = [r for r in caplog.records if "a bug" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None and lines[0].levelno == logging.WARNING


# ------------------------------------------------------------------ RFC 9113 error cases


def _h(sid: int, flags: int = 0x4, method: str = "slow") -> bytes:
    return frame(HEADERS, flags, sid, request_headers(SERVICE + method))


def _u32(value: int) -> bytes:
    return value.to_bytes(4, "big")


def _setting(key: int, value: int) -> bytes:
    return key.to_bytes(2, "big") + value.to_bytes(4, "big")


# (case, frames after the handshake, ("goaway", code) or ("rst", sid, code))
RFC_CASES: list[tuple[str, bytes, tuple[Any, ...]]] = [
    # 4.2 frame size
    # (the size this side advertises, http2.MAX_FRAME_IN)
    ("4.2 DATA over SETTINGS_MAX_FRAME_SIZE", _h(1) + frame(DATA, 0, 1, bytes(http2.MAX_FRAME_IN + 1)), ("goaway", FRAME_SIZE_ERROR)),
    # frames may be as large as MAX_FRAME_IN for DATA; a header block still stops at its bound
    ("HEADERS frame over the header block bound", frame(HEADERS, 0x4, 1, bytes(http2.MAX_HEADER_BLOCK + 1)), ("goaway", ENHANCE_YOUR_CALM)),
    # 5.1 stream states
    ("5.1 DATA on an idle stream", frame(DATA, 0, 1, b"x"), ("goaway", PROTOCOL_ERROR)),
    ("5.1 RST_STREAM on an idle stream", frame(RST_STREAM, 0, 1, _u32(8)), ("goaway", PROTOCOL_ERROR)),
    ("5.1 WINDOW_UPDATE on an idle stream", frame(WINDOW_UPDATE, 0, 1, _u32(1)), ("goaway", PROTOCOL_ERROR)),
    ("5.1 DATA on a half-closed (remote) stream", _h(1, 0x5) + frame(DATA, 0, 1, b"x"), ("rst", 1, STREAM_CLOSED)),
    ("5.1 DATA after the client reset", _h(1) + frame(RST_STREAM, 0, 1, _u32(8)) + frame(DATA, 0, 1, b"x"),
     ("rst", 1, STREAM_CLOSED)),
    ("5.1 HEADERS (not END_STREAM) as trailers", _h(1) + _h(1), ("rst", 1, PROTOCOL_ERROR)),
    ("5.1.1 an even stream id", _h(2), ("goaway", PROTOCOL_ERROR)),
    ("5.1.1 a stream id going backwards", _h(5) + _h(3), ("goaway", PROTOCOL_ERROR)),
    # 5.3.1 a stream depending on itself
    ("5.3.1 HEADERS depending on itself", frame(HEADERS, 0x24, 1, _u32(1) + b"\x10" + request_headers(SERVICE + "slow")),
     ("rst", 1, PROTOCOL_ERROR)),
    ("5.3.1 PRIORITY depending on itself", frame(PRIORITY, 0, 1, _u32(1) + b"\x10"), ("rst", 1, PROTOCOL_ERROR)),
    # 6.1 DATA
    ("6.1 DATA on stream 0", frame(DATA, 0, 0, b"x"), ("goaway", PROTOCOL_ERROR)),
    ("6.1 DATA with padding past its payload", _h(1) + frame(DATA, 0x8, 1, b"\x05abc"), ("goaway", PROTOCOL_ERROR)),
    ("6.1 PADDED DATA without a pad length", _h(1) + frame(DATA, 0x8, 1, b""), ("goaway", PROTOCOL_ERROR)),
    # 6.2 HEADERS
    ("6.2 HEADERS on stream 0", frame(HEADERS, 0x4, 0, request_headers(SERVICE + "slow")), ("goaway", PROTOCOL_ERROR)),
    ("6.2 PADDED HEADERS, empty", frame(HEADERS, 0xC, 1, b""), ("goaway", PROTOCOL_ERROR)),
    ("6.2 HEADERS with padding past its payload", frame(HEADERS, 0xC, 1, b"\xff" + request_headers(SERVICE + "slow")),
     ("goaway", PROTOCOL_ERROR)),
    ("6.2 another frame inside a header block", frame(HEADERS, 0, 1, b"") + frame(PING, 0, 0, bytes(8)),
     ("goaway", PROTOCOL_ERROR)),
    # 6.3 PRIORITY
    ("6.3 PRIORITY on stream 0", frame(PRIORITY, 0, 0, bytes(5)), ("goaway", PROTOCOL_ERROR)),
    ("6.3 PRIORITY of the wrong length", frame(PRIORITY, 0, 1, bytes(4)), ("rst", 1, FRAME_SIZE_ERROR)),
    # 6.4 RST_STREAM
    ("6.4 RST_STREAM on stream 0", frame(RST_STREAM, 0, 0, _u32(8)), ("goaway", PROTOCOL_ERROR)),
    ("6.4 RST_STREAM of the wrong length", _h(1) + frame(RST_STREAM, 0, 1, bytes(3)), ("goaway", FRAME_SIZE_ERROR)),
    # 6.5 SETTINGS
    ("6.5 SETTINGS ACK with a payload", frame(SETTINGS, 0x1, 0, bytes(6)), ("goaway", FRAME_SIZE_ERROR)),
    ("6.5 SETTINGS on a stream", frame(SETTINGS, 0, 1), ("goaway", PROTOCOL_ERROR)),
    ("6.5 SETTINGS not a multiple of 6", frame(SETTINGS, 0, 0, bytes(3)), ("goaway", FRAME_SIZE_ERROR)),
    ("6.5.2 ENABLE_PUSH 2", frame(SETTINGS, 0, 0, _setting(2, 2)), ("goaway", PROTOCOL_ERROR)),
    ("6.5.2 INITIAL_WINDOW_SIZE past 2^31-1", frame(SETTINGS, 0, 0, _setting(4, 2**31)), ("goaway", FLOW_CONTROL_ERROR)),
    ("6.5.2 MAX_FRAME_SIZE too small", frame(SETTINGS, 0, 0, _setting(5, 16383)), ("goaway", PROTOCOL_ERROR)),
    ("6.5.2 MAX_FRAME_SIZE too large", frame(SETTINGS, 0, 0, _setting(5, 2**24)), ("goaway", PROTOCOL_ERROR)),
    # 6.7 PING
    ("6.7 PING on a stream", frame(PING, 0, 1, bytes(8)), ("goaway", PROTOCOL_ERROR)),
    ("6.7 PING of the wrong length", frame(PING, 0, 0, bytes(7)), ("goaway", FRAME_SIZE_ERROR)),
    # 6.8 GOAWAY
    ("6.8 GOAWAY on a stream", frame(GOAWAY, 0, 1, bytes(8)), ("goaway", PROTOCOL_ERROR)),
    ("6.8 GOAWAY too short", frame(GOAWAY, 0, 0, bytes(7)), ("goaway", FRAME_SIZE_ERROR)),
    # 6.9 WINDOW_UPDATE
    ("6.9 WINDOW_UPDATE of 0 on the connection", frame(WINDOW_UPDATE, 0, 0, _u32(0)), ("goaway", PROTOCOL_ERROR)),
    ("6.9 WINDOW_UPDATE of 0 on a stream", _h(1) + frame(WINDOW_UPDATE, 0, 1, _u32(0)), ("rst", 1, PROTOCOL_ERROR)),
    ("6.9 WINDOW_UPDATE of the wrong length", frame(WINDOW_UPDATE, 0, 0, bytes(3)), ("goaway", FRAME_SIZE_ERROR)),
    ("6.9.1 connection window past 2^31-1", frame(WINDOW_UPDATE, 0, 0, _u32(2**31 - 1)), ("goaway", FLOW_CONTROL_ERROR)),
    ("6.9.1 stream window past 2^31-1", _h(1) + frame(WINDOW_UPDATE, 0, 1, _u32(2**31 - 1)),
     ("rst", 1, FLOW_CONTROL_ERROR)),
    ("6.9.2 INITIAL_WINDOW_SIZE overflowing a stream", _h(1) + frame(WINDOW_UPDATE, 0, 1, _u32(2**31 - 70_000))
     + frame(SETTINGS, 0, 0, _setting(4, 100_000)), ("goaway", FLOW_CONTROL_ERROR)),
    # 6.10 CONTINUATION
    ("6.10 CONTINUATION without HEADERS", frame(CONTINUATION, 0x4, 1, b"\x82"), ("goaway", PROTOCOL_ERROR)),
    ("6.10 CONTINUATION on another stream", frame(HEADERS, 0, 1, b"") + frame(CONTINUATION, 0x4, 3, b"\x82"),
     ("goaway", PROTOCOL_ERROR)),
    # 8.4 server push
    ("8.4 PUSH_PROMISE from a client", frame(5, 0x4, 1, _u32(2)), ("goaway", PROTOCOL_ERROR)),
    # HPACK
    ("4.3 a header block that does not decode", frame(HEADERS, 0x4, 1, b"\xff\xff\xff\xff"),
     ("goaway", 9)),
]  # fmt: skip


@pytest.fixture
async def rfc_server(start: Start) -> Http2GrpcServer:
    server: Http2GrpcServer = await start()
    return server


@pytest.mark.parametrize(("sent", "expected"), [c[1:] for c in RFC_CASES], ids=[c[0] for c in RFC_CASES])
async def test_rfc9113_error_cases(
    rfc_server: Http2GrpcServer, sent: bytes, expected: tuple[Any, ...]
) -> None:
    def exchange() -> tuple[int | None, list[int], bool]:
        with RawClient(rfc_server.port) as client:
            client.handshake()
            client.send(sent)
            if expected[0] == "goaway":
                return client.goaway(seconds=3), [], client.wait_closed(3)
            client.until(RST_STREAM, expected[1], seconds=3)
            # and the connection is still up: a PING is answered
            client.send(frame(PING, 0, 0, b"12345678"))
            alive = client.until(PING, 0, seconds=3, flags=0x1)
            return None, rst_codes(client.frames(), expected[1]), alive

    code, resets, flag = await asyncio.to_thread(exchange)
    if expected[0] == "goaway":
        assert code == expected[1] and flag  # GOAWAY, then closed
    else:
        assert resets[:1] == [expected[2]] and flag


async def test_first_frame_must_be_settings(rfc_server: Http2GrpcServer) -> None:
    def exchange() -> int | None:
        with RawClient(rfc_server.port) as client:
            client.send(http2.PREFACE + frame(PING, 0, 0, bytes(8)))
            return client.goaway()

    assert await asyncio.to_thread(exchange) == PROTOCOL_ERROR


# ------------------------------------------------------------------ peers that ignore flow control


def _data_frames(sid: int, total: int, message_size: int) -> bytes:
    """``total`` bytes of gRPC messages of ``message_size`` bytes on ``sid``, in DATA frames."""
    body = grpc_message(bytes(message_size - 5)) * (total // message_size + 1)
    return b"".join(frame(DATA, 0, sid, body[i : i + 16384]) for i in range(0, total, 16384))


async def test_data_past_a_streams_window_resets_it(start: Start) -> None:
    """A streaming call whose reader lags gets no window back; a peer that sends past the
    stream's window anyway (the requests would queue without bound) gets RST_STREAM
    FLOW_CONTROL_ERROR, and the connection and other calls go on."""
    server = await start()

    def attack() -> tuple[list[int], dict[str, str]]:
        with RawClient(server.port, timeout=10) as client:
            client.handshake()
            client.send(frame(HEADERS, 0x4, 1, request_headers(SERVICE + "hold")))
            client.send(_data_frames(1, http2.STREAM_WINDOW + 64 * 1024, 1024))
            client.until(RST_STREAM, 1, seconds=10)
            client.send(frame(HEADERS, 0x4, 3, request_headers(SERVICE + "echo")))
            client.send(frame(DATA, 0x1, 3, grpc_message(b"after")))
            client.until(HEADERS, 3, seconds=10, flags=0x1)
            return rst_codes(client.frames(), 1), trailers(client.frames(), 3)

    (codes, after), slowest, _ = await under_attack(server, attack)
    assert codes == [FLOW_CONTROL_ERROR], codes
    assert after.get("grpc-status") == "0", after  # the same connection serves on
    assert slowest < prompt_bound()


async def test_data_past_the_connection_window_ends_it(start: Start, monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls that do not read hold the connection's undelivered bytes at its budget, so its
    window is withheld; a peer that sends on regardless gets GOAWAY FLOW_CONTROL_ERROR."""
    set_bound(monkeypatch, "CONNECTION_WINDOW", 256 * 1024)
    set_bound(monkeypatch, "STREAM_WINDOW", 64 * 1024)
    server = await start(max_message=4096)

    def attack() -> int | None:
        with RawClient(server.port, timeout=10) as client:
            client.handshake()
            sent = 0
            sid = 1
            while sent <= 3 * http2.CONNECTION_WINDOW and not client.closed:
                client.send(frame(HEADERS, 0x4, sid, request_headers(SERVICE + "hold")))
                client.send(_data_frames(sid, 48 * 1024, 1024))  # inside each stream's window
                client.read(0.05)  # what the server says meanwhile (its GOAWAY, once it comes)
                client.sock.settimeout(10)  # read() leaves its own timeout on the socket
                sent += 48 * 1024
                sid += 2
            return goaway_code(client.frames())

    assert await asyncio.to_thread(attack) == FLOW_CONTROL_ERROR
