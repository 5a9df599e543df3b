"""Frame-level fuzzing of flowserve's HTTP/2 gRPC transport (flowserve/frontends/grpc/http2.py).

One server (its own loop, in a thread, on 127.0.0.1) for the module; hypothesis sends it
sequences of frames: arbitrary ones (any type, flags, stream id, payload, some lying about
their length), mutations of valid ones, and valid-looking requests built with an HPACK encoder.
After each sequence a PING: the server must answer it or close the connection within a few
seconds (never hang), must never raise out of its handlers (no ERROR log record, no call to
the loop's exception handler), and a good client (tritonclient's ServerLive over its own
connection) must still be answered. FLOWSERVE_FUZZ_EXAMPLES sets the number of examples
(default 150: well under a minute on a 2-core machine)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import hpack
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from flowserve.frontends.grpc.http2 import CallContext, Http2GrpcServer, Method
from tests.h2raw import PING, SETTINGS, Blob, RawClient, frame, grpc_message, request_headers

EXAMPLES = int(os.environ.get("FLOWSERVE_FUZZ_EXAMPLES", "150"))
SERVICE = "/test.Echo/"
LIVE = "/inference.GRPCInferenceService/ServerLive"


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        # ERROR and above, and the transport's own line for an exception while handling a frame
        if record.levelno >= logging.ERROR or record.exc_info or "handling a frame" in record.getMessage():
            self.records.append(record)


async def _echo(request: bytes, context: CallContext) -> Blob:
    return Blob(request)


async def _live(request: Any, context: CallContext) -> Any:
    return service_pb2.ServerLiveResponse(live=True)


async def _stream(requests: AsyncIterator[bytes], context: CallContext) -> AsyncIterator[Blob]:
    async for message in requests:
        yield Blob(message)


class Running:
    """The server, its loop's thread, and what went wrong on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.errors = _Errors()
        self.loop_errors: list[dict[str, Any]] = []
        self.loop.set_exception_handler(lambda loop, context: self.loop_errors.append(context))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        methods = {
            SERVICE + "echo": Method(parse=bytes, unary=_echo),
            SERVICE + "stream": Method(parse=bytes, streaming=_stream),
            LIVE: Method(parse=service_pb2.ServerLiveRequest.FromString, unary=_live),
        }

        async def start() -> Http2GrpcServer:
            server = Http2GrpcServer(methods, max_message=1024 * 1024)
            await server.start("127.0.0.1", 0)
            return server

        self.server = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        self.port = self.server.port

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def running() -> Iterator[Running]:
    logger = logging.getLogger("flowserve")
    run = Running()
    logger.addHandler(run.errors)
    try:
        yield run
    finally:
        logger.removeHandler(run.errors)
        run.stop()


@pytest.fixture(scope="module")
def good(running: Running) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{running.port}")
    try:
        yield client
    finally:
        client.close()


# ------------------------------------------------------------------ frame strategies

FRAME_TYPES = st.one_of(st.integers(0, 9), st.integers(10, 255))
SIDS = st.one_of(st.sampled_from([0, 1, 2, 3, 5, 7, 2**31 - 1]), st.integers(0, 2**31 - 1))
FLAGS = st.one_of(st.sampled_from([0, 0x1, 0x4, 0x5, 0x8, 0x20, 0x2D]), st.integers(0, 255))


@st.composite
def raw_frame(draw: st.DrawFn) -> bytes:
    """Any frame; now and then one whose length field lies."""
    payload = draw(st.binary(max_size=64))
    data = frame(draw(FRAME_TYPES), draw(FLAGS), draw(SIDS), payload)
    if draw(st.integers(0, 19)) == 0:
        lie = draw(st.integers(0, 2**24 - 1))
        data = lie.to_bytes(3, "big") + data[3:]
    return data


def _paths() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from([SERVICE + "echo", SERVICE + "stream", LIVE, SERVICE + "nope", "/", ""]),
        st.text(max_size=40).map(lambda s: "/" + s),
    )


@st.composite
def request(draw: st.DrawFn) -> bytes:
    """A valid-looking request (headers with an HPACK encoder, messages), sometimes cut or
    mutated: stray fields, compression flags, bad prefixes, grpc-timeout, no END_STREAM."""
    sid = draw(st.sampled_from([1, 3, 5, 7, 9, 11]))
    extra = draw(
        st.lists(
            st.one_of(
                st.tuples(
                    st.sampled_from(["grpc-timeout", "grpc-encoding", "te", "x-a", "content-type"]),
                    st.text(max_size=12),
                ),
                st.tuples(st.text("abcdefgh-", min_size=1, max_size=8), st.text(max_size=20)),
            ),
            max_size=3,
        )
    )
    encoder = hpack.Encoder()
    try:
        block = request_headers(draw(_paths()), extra, encoder=encoder)
    except Exception:  # hpack refuses some fields: send it without them
        block = request_headers(SERVICE + "echo")
    flags = draw(st.sampled_from([0x4, 0x5, 0x0]))
    out = frame(1, flags, sid, block)
    if not flags & 0x4:
        out += frame(9, 0x4, sid, b"")
    body = draw(st.binary(max_size=40))
    message = grpc_message(body, compressed=draw(st.booleans()))
    if draw(st.booleans()):
        message = message[: draw(st.integers(0, len(message)))]  # cut
    if draw(st.integers(0, 4)) == 0:
        message = b"\x00" + draw(st.integers(0, 2**32 - 1)).to_bytes(4, "big") + body  # any prefix
    out += frame(0, draw(st.sampled_from([0x1, 0x0, 0x9])), sid, message)
    return out


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid request with bytes flipped."""
    data = bytearray(draw(request()))
    for _ in range(draw(st.integers(1, 4))):
        if data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


SEQUENCES = st.lists(st.one_of(raw_frame(), request(), mutated()), min_size=1, max_size=8)


def _answered_or_closed(port: int, data: bytes) -> None:
    """Send ``data`` after the handshake, then a PING: the server must answer the PING or close."""
    marker = os.urandom(8)
    with RawClient(port, timeout=3) as client:
        client.handshake()
        client.send(data)
        client.send(frame(PING, 0, 0, marker))
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            if any(f.type == PING and f.flags & 1 and f.payload == marker for f in client.frames()):
                return
            if client.closed:
                return
            client._recv(deadline)
        # a frame whose length lied may still wait for bytes: end our side, the server must close
        client.sock.shutdown(1)
        assert client.wait_closed(3), "the server neither answered nor closed"


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)
@given(sequence=SEQUENCES)
def test_fuzzed_frames(
    running: Running, good: grpcclient.InferenceServerClient, sequence: list[bytes]
) -> None:
    _answered_or_closed(running.port, b"".join(sequence))
    assert good.is_server_live(client_timeout=5)
    assert not running.errors.records, [r.getMessage() for r in running.errors.records]
    assert not running.loop_errors, running.loop_errors


def test_settings_then_garbage_still_serves(running: Running, good: grpcclient.InferenceServerClient) -> None:
    """A fixed case beside the generated ones: the handshake, then bytes that are no frame."""
    with RawClient(running.port) as client:
        client.handshake()
        client.send(frame(SETTINGS, 1, 0) + os.urandom(2000))
        client.read(0.3)
    assert good.is_server_live(client_timeout=5)
    assert not running.errors.records and not running.loop_errors
