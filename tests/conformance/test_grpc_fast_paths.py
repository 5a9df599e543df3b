"""The native gRPC transport's short cuts, and what they must not change.

- A small unary request whose one message arrives whole in one DATA frame (END_STREAM) is
  parsed from the frame as it lies in the read and its call started at once (``Receiver._data``),
  skipping the stream's buffer; one cut anywhere takes the general path. Same answers either way.
- A small answer with nothing queued before it and room in the windows leaves as one DATA frame,
  in one write with its HEADERS and trailers (``Sender._send``); otherwise it is queued as before.
- A streaming call's large request messages are read into their own buffers as a unary call's
  are (straight from the socket while long frames arrive, ``Connection._into_done`` queues each),
  and its large answers are written from the outputs' buffers (``codec.StreamWireResponse``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb

from flowserve.dataplane.guard import ByteBudget
from flowserve.frontends.grpc.codec import (
    StreamWireResponse,
    ViewRequest,
    WireResponse,
    parse_request,
    parses_quickly,
)
from flowserve.frontends.grpc.h2.connection import Connection
from flowserve.frontends.grpc.h2.frames import (
    DATA,
    END_STREAM,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_WINDOW,
    PREFACE,
    SETTING,
    SETTINGS,
    WINDOW,
    WINDOW_UPDATE,
    frame,
)
from flowserve.frontends.grpc.http2 import CallContext, Http2GrpcServer, Method
from tests.h2raw import (
    Blob,
    FakeTransport,
    RawClient,
    feed,
    grpc_message,
    parse_frames,
    request_headers,
    trailers,
)

SERVICE = "/test.Echo/"
MiB = 1024 * 1024


async def _echo(request: bytes, context: CallContext) -> Blob:
    return Blob(request)


async def _echo_stream(requests: AsyncIterator[bytes], context: CallContext) -> AsyncIterator[Blob]:
    async for request in requests:
        yield Blob(request)


@pytest.fixture
async def echo() -> AsyncIterator[Http2GrpcServer]:
    seen: list[type] = []

    def parse(data: bytes | memoryview) -> bytes:
        seen.append(type(data))
        return bytes(data)

    server = Http2GrpcServer(
        {
            SERVICE + "echo": Method(parse=parse, unary=_echo),
            SERVICE + "stream": Method(parse=parse, streaming=_echo_stream),
        },
        max_message=64 * MiB,
        budget=ByteBudget(256 * MiB),
    )
    server.seen = seen  # type: ignore[attr-defined]
    await server.start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.stop(0)


def _count(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Count the calls of ``Connection.<name>``."""
    calls: list[int] = []
    original: Callable[..., Any] = getattr(Connection, name)

    def counted(self: Connection, *args: Any) -> Any:
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(Connection, name, counted)
    return calls


def _clean(server: Http2GrpcServer) -> bool:
    budget = server.budget
    return (budget is None or budget.in_use == 0) and all(
        c.buffered == 0 and c.frame_stream is None and c.expect is None for c in server.connections
    )


# ------------------------------------------------------------------ small unary calls


def _unary_calls(port: int, payloads: list[bytes], cut: list[int] | None, settings: bytes = b"") -> Any:
    """One call per payload on one connection, all sent at once (``cut``: in pieces of these
    sizes, cycled, with a pause after each); each call's trailers and answer."""
    with RawClient(port, timeout=10) as client:
        client.handshake(settings)
        wire = b"".join(
            frame(HEADERS, 0x4, 2 * i + 1, request_headers(SERVICE + "echo"))
            + frame(DATA, END_STREAM, 2 * i + 1, grpc_message(payload))
            for i, payload in enumerate(payloads)
        )
        if cut is None:
            client.send(wire)
        else:
            pos = i = 0
            while pos < len(wire):
                client.send(wire[pos : pos + cut[i % len(cut)]])
                pos += cut[i % len(cut)]
                i += 1
                time.sleep(0.002)
        last = 2 * len(payloads) - 1
        for sid in range(1, last + 1, 2):
            client.until(HEADERS, sid=sid, flags=END_STREAM, seconds=10)
        frames = client.frames()
        return [
            (trailers(frames, sid), b"".join(f.payload for f in frames if f.type == DATA and f.sid == sid))
            for sid in range(1, last + 1, 2)
        ]


async def test_a_small_request_that_arrives_whole_skips_the_stream_buffer(
    echo: Http2GrpcServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    pieces = _count(monkeypatch, "_data_piece")
    payloads = [bytes([i]) * (10 + 100 * i) for i in range(5)] + [b""]
    results = await asyncio.to_thread(_unary_calls, echo.port, payloads, None)
    for (fields, body), payload in zip(results, payloads, strict=True):
        assert fields.get("grpc-status") == "0", fields
        assert body == grpc_message(payload)
    assert not pieces  # parsed straight from the frames as read
    assert _clean(echo)


@pytest.mark.parametrize("cut", [[1], [7, 3], [9, 5, 40]])
async def test_small_requests_cut_anywhere_get_the_same_answers(
    echo: Http2GrpcServer, cut: list[int]
) -> None:
    payloads = [b"abc" * 30, b"xyz" * 7]
    results = await asyncio.to_thread(_unary_calls, echo.port, payloads, cut)
    for (fields, body), payload in zip(results, payloads, strict=True):
        assert fields.get("grpc-status") == "0", fields
        assert body == grpc_message(payload)
    assert _clean(echo)


@pytest.mark.parametrize("cut", [None, 1, 8, 9 + 3, 9 + 5 + 2, 20])
async def test_a_frame_whole_in_a_read_or_cut_gives_the_same_answer(
    monkeypatch: pytest.MonkeyPatch, cut: int | None
) -> None:
    """In process, the reads exactly as given: a request's DATA frame whole in one read, or cut
    at ``cut`` bytes into it. Cut within its 9-byte head, it waits whole in the connection's
    buffer (the short cut still: its pieces never go to the stream's buffer); cut within its
    payload (the message's prefix, or the message), its pieces take the general path."""
    pieces = _count(monkeypatch, "_data_piece")
    server = Http2GrpcServer({SERVICE + "echo": Method(parse=bytes, unary=_echo)}, max_message=MiB)
    conn = Connection(server)
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    feed(conn, PREFACE + frame(SETTINGS, 0, 0))
    results = []
    for sid, payload in ((1, b"first" * 20), (3, b""), (5, b"third")):
        transport.out.clear()
        data = frame(DATA, END_STREAM, sid, grpc_message(payload))
        head = frame(HEADERS, 0x4, sid, request_headers(SERVICE + "echo"))
        if cut is None:
            feed(conn, head + data)
        else:
            feed(conn, head + data[:cut])
            feed(conn, data[cut:])
        for _ in range(5):
            await asyncio.sleep(0)
        conn._write_pending()
        frames = parse_frames(bytes(transport.out))
        status = trailers(frames, sid).get("grpc-status")
        results.append((status, b"".join(f.payload for f in frames if f.type == DATA)))
        assert [f.type for f in frames if f.sid == sid] == [HEADERS, DATA, HEADERS]  # one write
    assert results == [
        ("0", grpc_message(b"first" * 20)),
        ("0", grpc_message(b"")),
        ("0", grpc_message(b"third")),
    ]
    assert bool(pieces) == (cut is not None and cut > 9)
    assert not conn.streams and conn.buffered == 0


def _one_frame(port: int, data: bytes, path: str = SERVICE + "echo") -> dict[str, str]:
    with RawClient(port, timeout=10) as client:
        client.handshake()
        client.send(frame(HEADERS, 0x4, 1, request_headers(path)) + frame(DATA, END_STREAM, 1, data))
        client.until(HEADERS, sid=1, flags=END_STREAM)
        return trailers(client.frames(), 1)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (grpc_message(b"one") + grpc_message(b"two"), "exactly one request message"),  # two messages
        (grpc_message(b"short")[:-2], "exactly one request message"),  # declares more than it has
        (b"\x00\x00\x00", "exactly one request message"),  # not even a prefix
    ],
)
async def test_a_whole_frame_that_is_not_one_message_is_refused(
    echo: Http2GrpcServer, data: bytes, message: str
) -> None:
    fields = await asyncio.to_thread(_one_frame, echo.port, data)
    assert fields.get("grpc-status") == "13", fields  # INTERNAL
    assert message in fields.get("grpc-message", "")
    assert _clean(echo)


async def test_a_whole_small_message_over_the_limit_is_refused() -> None:
    server = Http2GrpcServer({SERVICE + "echo": Method(parse=bytes, unary=_echo)}, max_message=100)
    await server.start("127.0.0.1", 0)
    try:
        fields = await asyncio.to_thread(_one_frame, server.port, grpc_message(b"z" * 101))
        ok = await asyncio.to_thread(_one_frame, server.port, grpc_message(b"z" * 100))
    finally:
        await server.stop(0)
    assert fields.get("grpc-status") == "8", fields  # RESOURCE_EXHAUSTED
    assert "101 vs. 100" in fields.get("grpc-message", "")
    assert ok.get("grpc-status") == "0", ok


def _answer_frames(port: int, window: int, payload: bytes) -> tuple[list[Any], list[Any]]:
    """A call whose answer needs more than the stream window ``window`` the client gives: the
    frames before and after the client opens the window."""
    with RawClient(port, timeout=10) as client:
        client.handshake(SETTING.pack(INITIAL_WINDOW_SIZE, window))
        client.send(
            frame(HEADERS, 0x4, 1, request_headers(SERVICE + "echo"))
            + frame(DATA, END_STREAM, 1, grpc_message(payload))
        )
        client.until(HEADERS, sid=1, seconds=2)
        before = client.read(0.3)
        client.send(frame(WINDOW_UPDATE, 0, 1, WINDOW.pack(MAX_WINDOW - window)))
        client.until(HEADERS, sid=1, flags=END_STREAM)
        return before, client.frames()


async def test_a_small_answer_leaves_in_one_frame_or_waits_for_the_window(echo: Http2GrpcServer) -> None:
    payload = b"q" * 300
    before, after = await asyncio.to_thread(_answer_frames, echo.port, MAX_WINDOW, payload)
    data = [f for f in after if f.type == DATA]
    assert [f.payload for f in data] == [grpc_message(payload)]  # one frame, the whole answer
    assert [f.type for f in after if f.sid == 1] == [HEADERS, DATA, HEADERS]
    # a window of 100 bytes: 100 bytes go, the rest (and the trailers) wait for the window
    before, after = await asyncio.to_thread(_answer_frames, echo.port, 100, payload)
    assert sum(len(f.payload) for f in before if f.type == DATA) == 100
    assert not any(f.type == HEADERS and f.flags & END_STREAM for f in before)
    assert b"".join(f.payload for f in after if f.type == DATA) == grpc_message(payload)
    assert trailers(after, 1).get("grpc-status") == "0"
    assert _clean(echo)


# ------------------------------------------------------------------ streams with large messages


def _stream(port: int, messages: list[bytes], frame_size: int, cut: list[int], end: bool = True) -> Any:
    """One streaming call: ``messages`` (gRPC-framed, joined) in DATA frames of ``frame_size``
    bytes, sent in pieces of ``cut`` sizes; its trailers and the answers' bytes."""
    with RawClient(port, timeout=20) as client:
        client.handshake(SETTING.pack(INITIAL_WINDOW_SIZE, MAX_WINDOW))
        client.send(frame(WINDOW_UPDATE, 0, 0, WINDOW.pack(MAX_WINDOW - 65_535)))
        body = b"".join(messages)
        wire = bytearray(frame(HEADERS, 0x4, 1, request_headers(SERVICE + "stream")))
        for start in range(0, len(body), frame_size):
            last = start + frame_size >= len(body)
            wire += frame(DATA, END_STREAM if last and end else 0, 1, body[start : start + frame_size])
        pos = i = 0
        while pos < len(wire):
            n = cut[i % len(cut)]
            client.send(bytes(wire[pos : pos + n]))
            pos += n
            i += 1
            time.sleep(0.001)
        client.until(HEADERS, sid=1, flags=END_STREAM, seconds=20)
        frames = client.frames()
        return trailers(frames, 1), b"".join(f.payload for f in frames if f.type == DATA and f.sid == 1)


@pytest.mark.parametrize(
    ("frame_size", "cut", "straight"),
    [
        (MiB, [5 * MiB], True),  # long frames, as fast as they come: straight from the socket
        (MiB, [7, 9, 100_000, 1, 600_000, 3], True),  # frame heads cut by reads
        (16_384, [70_000, 13], False),  # small frames: through the server's read buffer
        (1_000_000, [MiB + 17], True),  # reads ending inside frames, frames across messages
    ],
)
async def test_large_messages_on_a_stream_are_read_into_their_own_buffers(
    echo: Http2GrpcServer, monkeypatch: pytest.MonkeyPatch, frame_size: int, cut: list[int], straight: bool
) -> None:
    done = _count(monkeypatch, "_into_done")
    sunk = _count(monkeypatch, "_sunk")
    rng = np.random.default_rng(7)
    payloads = [rng.bytes(2 * MiB + 3), b"small", rng.bytes(MiB), rng.bytes(100_000), b""]
    messages = [grpc_message(p) for p in payloads]
    fields, body = await asyncio.to_thread(_stream, echo.port, messages, frame_size, cut)
    assert fields.get("grpc-status") == "0", fields
    assert body == b"".join(messages)  # every answer, in order, unchanged
    # the two messages larger than a read at least, each parsed from its own buffer
    assert len(done) >= 2
    assert echo.seen.count(memoryview) == len(done)  # type: ignore[attr-defined]
    assert bool(sunk) == straight
    assert _clean(echo)


async def test_a_stream_that_ends_inside_a_large_message_is_refused(echo: Http2GrpcServer) -> None:
    message = grpc_message(b"w" * (2 * MiB))
    fields, _ = await asyncio.to_thread(_stream, echo.port, [grpc_message(b"ok"), message[:MiB]], MiB, [MiB])
    assert fields.get("grpc-status") == "13", fields
    assert "truncated request message" in fields.get("grpc-message", "")
    assert _clean(echo)


def test_stream_wire_response_is_the_serialized_stream_message() -> None:
    head = pb.ModelInferResponse(model_name="m", id="7")
    head.outputs.add(name="OUT", datatype="FP32", shape=[300_000])
    head.parameters["triton_final_response"].bool_param = True
    raw = np.arange(300_000, dtype=np.float32)
    wire = StreamWireResponse(WireResponse(head, [raw.data.cast("B"), b"tail"]))
    parts, size = wire.wire_parts()
    assert size == sum(memoryview(p).nbytes for p in parts)
    big = [p for p in parts if isinstance(p, memoryview) and p.nbytes == raw.nbytes]
    assert big and np.shares_memory(np.asarray(big[0]), raw)  # the output's own buffer
    parsed = pb.ModelStreamInferResponse.FromString(wire.SerializeToString())
    assert parsed.error_message == ""
    assert parsed.infer_response.id == "7"
    assert parsed.infer_response.parameters["triton_final_response"].bool_param
    assert parsed.infer_response.raw_output_contents == [raw.tobytes(), b"tail"]
    assert wire.infer_response is head


def test_a_large_stream_request_keeps_its_raw_contents_as_views() -> None:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="IN", datatype="FP32", shape=[100_000])
    request.raw_input_contents.append(np.ones(100_000, np.float32).tobytes())
    data = bytearray(request.SerializeToString())
    parsed = parse_request(memoryview(data))
    assert isinstance(parsed, ViewRequest)


# ------------------------------------------------------------------ through a real server


def test_tritonclient_stream_of_large_tensors(server: Any) -> None:
    sizes = [3 * MiB // 4, 10, 2 * MiB // 4]
    rng = np.random.default_rng(9)
    sent = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    results: list[Any] = []
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        client.start_stream(callback=lambda result, error: results.append(error or result))
        for i, data in enumerate(sent):
            tensor = grpcclient.InferInput("INPUT0", [1, data.size], "FP32")
            tensor.set_data_from_numpy(data.reshape(1, -1))
            client.async_stream_infer("identity_fp32", [tensor], request_id=str(i))
        deadline = time.monotonic() + 30
        while len(results) < len(sent) and time.monotonic() < deadline:
            time.sleep(0.05)
        client.stop_stream()
    assert len(results) == len(sent)
    for i, data in enumerate(sent):
        result = results[i]
        assert not isinstance(result, Exception), result
        assert result.get_response().id == str(i)
        assert np.array_equal(result.as_numpy("OUTPUT0").reshape(-1), data)


# ------------------------------------------------------------------ large messages parsed on the loop


def _large_call(port: int, payload: bytes) -> tuple[dict[str, str], bytes]:
    with RawClient(port, timeout=20) as client:
        client.handshake(SETTING.pack(INITIAL_WINDOW_SIZE, MAX_WINDOW))
        client.send(frame(WINDOW_UPDATE, 0, 0, WINDOW.pack(MAX_WINDOW - 65_535)))
        message = grpc_message(payload)
        wire = frame(HEADERS, 0x4, 1, request_headers(SERVICE + "echo"))
        for start in range(0, len(message), MiB):
            last = start + MiB >= len(message)
            wire += frame(DATA, END_STREAM if last else 0, 1, message[start : start + MiB])
        client.send(wire)
        client.until(HEADERS, sid=1, flags=END_STREAM, seconds=20)
        frames = client.frames()
        return trailers(frames, 1), b"".join(f.payload for f in frames if f.type == DATA)


@pytest.mark.parametrize("quick", [None, True, False])
async def test_a_large_message_is_parsed_in_a_thread_unless_its_method_says_it_parses_quickly(
    monkeypatch: pytest.MonkeyPatch, quick: bool | None
) -> None:
    later = _count(monkeypatch, "_parse_later")
    asked: list[int] = []

    def inline(data: bytes | memoryview) -> bool:
        asked.append(len(data))
        return bool(quick)

    method = Method(parse=bytes, unary=_echo, inline=None if quick is None else inline)
    server = Http2GrpcServer({SERVICE + "echo": method}, max_message=64 * MiB)
    await server.start("127.0.0.1", 0)
    payload = np.random.default_rng(3).bytes(2 * MiB + 1)
    try:
        fields, body = await asyncio.to_thread(_large_call, server.port, payload)
    finally:
        await server.stop(0)
    assert fields.get("grpc-status") == "0", fields
    assert body == grpc_message(payload)
    assert len(later) == (0 if quick else 1)
    assert asked == ([] if quick is None else [len(payload)])


def test_parses_quickly_when_what_protobuf_parses_is_small() -> None:
    raw = pb.ModelInferRequest(model_name="m")
    raw.inputs.add(name="IN", datatype="FP32", shape=[50_000])
    raw.raw_input_contents.append(np.ones(50_000, np.float32).tobytes())
    typed = pb.ModelInferRequest(model_name="m")
    typed.inputs.add(name="IN", datatype="BYTES", shape=[50_000]).contents.bytes_contents.extend(
        [b"x"] * 50_000
    )
    many = pb.ModelInferRequest(model_name="m")
    for i in range(5000):  # top-level fields past what the split walks
        many.outputs.add(name=f"o{i}")
    for message in (raw, typed, many):
        data = message.SerializeToString()
        assert parses_quickly(data, most=len(data))  # small enough: quick
        assert parses_quickly(memoryview(data), most=len(data))
    assert parses_quickly(raw.SerializeToString(), most=1000)  # its bytes are raw contents
    assert parses_quickly(memoryview(bytearray(raw.SerializeToString())), most=1000)
    assert not parses_quickly(typed.SerializeToString(), most=1000)  # 50,000 fields to parse
    assert not parses_quickly(many.SerializeToString(), most=1000)
