"""Large messages on the native gRPC transport without copies: a request message read into its
own buffer as its DATA frames arrive (in pieces, across reads, straight from the socket), its
raw tensor contents parsed as views of that buffer (codec.parse_request), and a response written
from its outputs' buffers as DATA frame heads and views (Outgoing, _data_frames, wire_parts),
never joined. What this must not change: the bytes each side sees, the request budget, the
flow-control and message-count rules (a unary call takes exactly one message)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from flowserve.dataplane.guard import ByteBudget
from flowserve.frontends.grpc.codec import SPLIT_FROM, ViewRequest, WireResponse, parse_request
from flowserve.frontends.grpc.h2.calls import Outgoing
from flowserve.frontends.grpc.h2.connection import Connection
from flowserve.frontends.grpc.h2.frames import (
    DATA,
    END_STREAM,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_WINDOW,
    PADDED,
    PING,
    RST_STREAM,
    SETTING,
    SETTINGS,
    WINDOW,
    WINDOW_UPDATE,
    frame,
)
from flowserve.frontends.grpc.h2.limits import READ_BUFFER
from flowserve.frontends.grpc.h2.sending import _data_frames
from flowserve.frontends.grpc.http2 import CallContext, Http2GrpcServer, Method
from tests.h2raw import Blob, RawClient, grpc_message, parse_frames, request_headers, trailers

SERVICE = "/test.Echo/"
MiB = 1024 * 1024


async def _echo(request: bytes, context: CallContext) -> Blob:
    return Blob(request)


@pytest.fixture
async def echo() -> AsyncIterator[tuple[Http2GrpcServer, ByteBudget]]:
    budget = ByteBudget(256 * MiB)
    seen: list[type] = []

    def parse(data: bytes | memoryview) -> bytes:
        seen.append(type(data))
        return bytes(data)

    server = Http2GrpcServer(
        {SERVICE + "echo": Method(parse=parse, unary=_echo)}, max_message=64 * MiB, budget=budget
    )
    server.seen = seen  # type: ignore[attr-defined]
    await server.start("127.0.0.1", 0)
    try:
        yield server, budget
    finally:
        await server.stop(0)


@pytest.fixture
def sunk(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The byte counts of the reads made straight into a message's own buffer."""
    counts: list[int] = []
    original = Connection._sunk

    def counted(self: Connection, nbytes: int) -> None:
        counts.append(nbytes)
        original(self, nbytes)

    monkeypatch.setattr(Connection, "_sunk", counted)
    return counts


def _send_in_pieces(client: RawClient, data: bytes, sizes: list[int]) -> None:
    """``data`` in pieces of the given sizes (cycled), each its own ``send`` and a pause, so the
    server reads frame heads and payloads cut at odd places."""
    pos = i = 0
    while pos < len(data):
        n = sizes[i % len(sizes)]
        client.send(data[pos : pos + n])
        pos += n
        i += 1
        time.sleep(0.001)


def _call(
    port: int,
    message: bytes,
    frame_size: int,
    sizes: list[int],
    padded: bool = False,
    between: bytes = b"",
    head: int = 0,
) -> Any:
    """``message`` as DATA frames of ``frame_size`` (the first one of ``head`` bytes if set),
    the wire sent in pieces of ``sizes``; the trailers' fields and the echoed body."""
    with RawClient(port, timeout=20) as client:
        # windows for the whole answer (this client sends no WINDOW_UPDATE as it reads)
        client.handshake(SETTING.pack(INITIAL_WINDOW_SIZE, MAX_WINDOW))
        client.send(frame(WINDOW_UPDATE, 0, 0, WINDOW.pack(MAX_WINDOW - 65_535)))
        wire = bytearray(frame(HEADERS, 0x4, 1, request_headers(SERVICE + "echo")))
        if head:
            wire += frame(DATA, 0, 1, message[:head]) + between
        for start in range(head, len(message), frame_size):
            chunk = message[start : start + frame_size]
            last = start + frame_size >= len(message)
            flags = END_STREAM if last else 0
            if padded:
                wire += frame(DATA, flags | PADDED, 1, b"\x03" + chunk + b"\x00\x00\x00")
            else:
                wire += frame(DATA, flags, 1, chunk)
            if not last:
                wire += between  # a frame of another kind between two DATA frames
        _send_in_pieces(client, bytes(wire), sizes)
        client.until(HEADERS, sid=1, flags=END_STREAM, seconds=20)
        frames = client.frames()
        body = b"".join(f.payload for f in frames if f.type == DATA and f.sid == 1)
        return trailers(frames, 1), body


@pytest.mark.parametrize(
    ("frame_size", "sizes", "padded", "straight"),
    [
        (MiB, [7, 9, 100_000, 1, 600_000, 3], False, True),  # frame heads cut by reads
        (MiB, [5 * MiB], False, True),  # as fast as it comes
        (16_384, [70_000, 13], False, False),  # small frames: read through the server's buffer
        (200_000, [150_001], True, False),  # padded frames: handled whole
    ],
)
async def test_a_large_request_arrives_whole_however_it_is_cut(
    echo: tuple[Http2GrpcServer, ByteBudget],
    monkeypatch: pytest.MonkeyPatch,
    sunk: list[int],
    frame_size: int,
    sizes: list[int],
    padded: bool,
    straight: bool,
) -> None:
    server, budget = echo
    heads: list[int] = []
    get_buffer = Connection.get_buffer

    def buffer(self: Connection, hint: int) -> memoryview:
        view = get_buffer(self, hint)
        heads.append(view is self.server.read_head)
        return view

    monkeypatch.setattr(Connection, "get_buffer", buffer)
    payload = np.random.default_rng(1).bytes(3 * MiB + 12345)
    fields, body = await asyncio.to_thread(
        _call, server.port, grpc_message(payload), frame_size, sizes, padded
    )
    assert fields.get("grpc-status") == "0", fields
    assert body == grpc_message(payload)
    assert server.seen == [memoryview]  # type: ignore[attr-defined]
    assert budget.in_use == 0
    assert all(c.buffered == 0 for c in server.connections)
    # long DATA frames of a large message: most of it read straight into its buffer
    assert (sum(sunk) > len(payload) // 2) if straight else not sunk
    assert any(heads) == straight  # frame heads read alone only between long frames


@pytest.mark.parametrize("between", [b"", frame(PING, 0, 0, b"12345678"), frame(SETTINGS, 0, 0, b"")])
async def test_only_the_first_read_of_a_large_request_is_copied(
    echo: tuple[Http2GrpcServer, ByteBudget], sunk: list[int], between: bytes
) -> None:
    """Once a long DATA frame is being read into its message's buffer, all of it is, however
    little is left of it (its tail read through the read buffer would bring the next frame's head
    and payload with it, to be copied); a frame of another kind between two DATA frames is read
    alone too. What is copied is what came in the call's first read, before the message's length
    was known."""
    server, _ = echo
    payload = np.random.default_rng(2).bytes(3 * MiB + 777)
    # frames of 300,000 bytes sent in pieces that leave tails under SINK_FROM at many reads
    fields, body = await asyncio.to_thread(
        _call, server.port, grpc_message(payload), 300_000, [90_000, 200_000, 7, 50_000], False, between
    )
    assert fields.get("grpc-status") == "0", fields
    assert body == grpc_message(payload)
    assert len(payload) - sum(sunk) <= READ_BUFFER


@pytest.mark.parametrize("head", [1, 4, 5, 6])
async def test_a_length_prefix_cut_across_frames(
    echo: tuple[Http2GrpcServer, ByteBudget], sunk: list[int], head: int
) -> None:
    """The first DATA frame holds only part of the 5-byte length prefix (or just all of it):
    the message's buffer is made once the prefix is whole, and the rest goes straight in."""
    server, budget = echo
    payload = np.random.default_rng(3).bytes(2 * MiB + 5)
    fields, body = await asyncio.to_thread(
        _call, server.port, grpc_message(payload), MiB, [5 * MiB], False, b"", head
    )
    assert fields.get("grpc-status") == "0", fields
    assert body == grpc_message(payload)
    assert sum(sunk) > len(payload) // 2
    assert budget.in_use == 0


def _unary_trailers(port: int, *data: tuple[int, bytes]) -> dict[str, str]:
    """A unary call whose request is the DATA frames ``(flags, payload)``: its trailers' fields."""
    with RawClient(port, timeout=10) as client:
        client.handshake()
        client.send(frame(HEADERS, 0x4, 1, request_headers(SERVICE + "echo")))
        for flags, payload in data:
            client.send(frame(DATA, flags, 1, payload))
        client.until(HEADERS, sid=1, flags=END_STREAM)
        return trailers(client.frames(), 1)


async def test_a_message_declared_too_large_is_refused_from_its_prefix_however_cut(
    echo: tuple[Http2GrpcServer, ByteBudget],
) -> None:
    server, budget = echo
    prefix = b"\x00" + (65 * MiB).to_bytes(4, "big")  # over the 64 MiB limit
    data = [(0, prefix[:2]), (0, prefix[2:] + b"x" * 1000)]
    fields = await asyncio.to_thread(_unary_trailers, server.port, *data)
    assert fields.get("grpc-status") == "8", fields  # RESOURCE_EXHAUSTED
    assert f"{65 * MiB} vs. {64 * MiB}" in fields.get("grpc-message", "")
    assert budget.in_use == 0


async def test_more_than_one_message_in_a_large_unary_call_is_refused(
    echo: tuple[Http2GrpcServer, ByteBudget],
) -> None:
    server, budget = echo
    message = grpc_message(b"x" * MiB)
    data = [(0, message[: 512 * 1024]), (END_STREAM, message[512 * 1024 :] + b"\x00\x00\x00\x00\x01z")]
    fields = await asyncio.to_thread(_unary_trailers, server.port, *data)
    assert fields.get("grpc-status") == "13", fields  # INTERNAL
    assert "exactly one request message" in fields.get("grpc-message", "")
    assert budget.in_use == 0


def _reset_midway(port: int) -> tuple[dict[str, str], bytes]:
    with RawClient(port, timeout=10) as client:
        client.handshake()
        message = grpc_message(b"y" * (2 * MiB))
        client.send(frame(HEADERS, 0x4, 1, request_headers(SERVICE + "echo")))
        head = frame(DATA, 0, 1, message[:MiB])
        client.send(head[: 9 + 300_000])  # the frame cut in its middle
        time.sleep(0.05)
        client.send(head[9 + 300_000 :])
        client.send(frame(RST_STREAM, 0, 1, WINDOW.pack(8)))  # CANCEL
        client.send(frame(HEADERS, 0x4, 3, request_headers(SERVICE + "echo")))
        client.send(frame(DATA, END_STREAM, 3, grpc_message(b"after")))
        client.until(HEADERS, sid=3, flags=END_STREAM)
        frames = client.frames()
        return trailers(frames, 3), b"".join(f.payload for f in frames if f.type == DATA and f.sid == 3)


async def test_a_large_request_reset_midway_leaves_the_connection_and_budget_clean(
    echo: tuple[Http2GrpcServer, ByteBudget],
) -> None:
    server, budget = echo
    fields, body = await asyncio.to_thread(_reset_midway, server.port)
    assert fields.get("grpc-status") == "0"
    assert body == grpc_message(b"after")
    assert budget.in_use == 0
    assert all(c.buffered == 0 and c.frame_stream is None and c.expect is None for c in server.connections)


# ------------------------------------------------------------------ the send side, pure


def test_outgoing_takes_views_of_its_pieces_in_order() -> None:
    big = np.arange(100_000, dtype=np.uint8)
    out = Outgoing()
    out.add(b"head")
    out.add(big.data)
    out.add(b"")
    out.add(b"tail")
    assert len(out) == 4 + 100_000 + 4
    first = out.take(50)
    second = out.take(len(out))
    assert len(out) == 0 and not out.pieces
    joined = b"".join(bytes(p) for p in first + second)
    assert joined == b"head" + big.tobytes() + b"tail"
    views = [p for p in first + second if isinstance(p, memoryview)]
    assert views and all(v.obj is big for v in views)  # the array's own memory, not a copy


@pytest.mark.parametrize("max_frame", [16_384, 1 << 20])
def test_data_frames_are_heads_and_views_of_the_response(max_frame: int) -> None:
    big = np.random.default_rng(2).integers(0, 255, 3 * 1024 * 1024 + 7, dtype=np.uint8)
    pieces = [b"\x00\x00\x30\x00\x07", big.data[:1000], big.data[1000:]]
    room = sum(len(p) for p in pieces)
    frames = _data_frames(pieces, room, max_frame, 5)
    parsed = parse_frames(b"".join(bytes(p) for p in frames))
    assert all(f.type == DATA and f.sid == 5 and len(f.payload) <= max_frame for f in parsed)
    assert b"".join(f.payload for f in parsed) == b"".join(bytes(p) for p in pieces)
    assert sum(len(p) for p in frames if isinstance(p, memoryview)) == len(big)  # none copied


def test_a_small_response_is_one_framed_piece() -> None:
    assert _data_frames([b"hello"], 5, 16_384, 1) == [frame(DATA, 0, 1, b"hello")]


def test_wire_parts_are_the_serialized_message() -> None:
    head = pb.ModelInferResponse(model_name="m", outputs=[pb.ModelInferResponse.InferOutputTensor(name="o")])
    tiny = np.arange(3, dtype=np.float32)
    big = np.arange(300_000, dtype=np.float32)
    response = WireResponse(head, [tiny.view(np.uint8).data, b"", big.view(np.uint8).data])
    parts, size = response.wire_parts()
    assert size == sum(len(p) for p in parts)
    message = pb.ModelInferResponse.FromString(b"".join(bytes(p) for p in parts))
    assert list(message.raw_output_contents) == [tiny.tobytes(), b"", big.tobytes()]
    assert any(isinstance(p, memoryview) and np.shares_memory(np.frombuffer(p, np.uint8), big) for p in parts)


# ------------------------------------------------------------------ the request side, pure


def _request(raws: list[bytes], **fields: Any) -> pb.ModelInferRequest:
    inputs = [pb.ModelInferRequest.InferInputTensor(name=f"in{i}", datatype="UINT8", shape=[len(r)])
              for i, r in enumerate(raws)]  # fmt: skip
    request = pb.ModelInferRequest(model_name="m", id="req", inputs=inputs, raw_input_contents=raws, **fields)
    request.parameters["p"].int64_param = 7
    return request


@pytest.mark.parametrize("shape", [[SPLIT_FROM], [1, SPLIT_FROM * 3], [0, SPLIT_FROM, 5]])
def test_a_large_request_keeps_its_raw_contents_as_views(shape: list[int]) -> None:
    rng = np.random.default_rng(3)
    raws = [rng.bytes(n) for n in shape]
    wire = bytearray(_request(raws).SerializeToString())
    parsed = parse_request(memoryview(wire))
    expected = pb.ModelInferRequest.FromString(bytes(wire))
    assert isinstance(parsed, ViewRequest)
    assert [bytes(r) for r in parsed.raw_input_contents] == list(expected.raw_input_contents)
    assert all(r.readonly and r.obj is wire for r in parsed.raw_input_contents)
    assert parsed.model_name == "m" and parsed.id == "req" and list(parsed.inputs) == list(expected.inputs)
    assert parsed.parameters["p"].int64_param == 7
    array = np.frombuffer(parsed.raw_input_contents[-1], np.uint8)
    assert not array.flags.writeable


def test_small_or_unusual_requests_are_protobuf_messages() -> None:
    small = _request([b"abc"]).SerializeToString()
    assert isinstance(parse_request(small), pb.ModelInferRequest)
    no_raw = pb.ModelInferRequest(model_name="m" * SPLIT_FROM).SerializeToString()
    assert isinstance(parse_request(no_raw), pb.ModelInferRequest)
    broken = _request([b"z" * SPLIT_FROM]).SerializeToString()[:-10]
    with pytest.raises(DecodeError):
        parse_request(broken)


# ------------------------------------------------------------------ through a real server


@pytest.mark.parametrize("size", [5 * MiB + 4])
def test_tritonclient_round_trip_of_a_large_tensor(server: Any, size: int) -> None:
    data = np.random.default_rng(4).standard_normal(size // 4).astype(np.float32)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        tensor = grpcclient.InferInput("INPUT0", [1, data.size], "FP32")
        tensor.set_data_from_numpy(data.reshape(1, -1))
        result = client.infer("identity_fp32", [tensor])
        out = result.as_numpy("OUTPUT0")
    assert out is not None and out.shape == (1, data.size)
    assert np.array_equal(out.reshape(-1), data)
