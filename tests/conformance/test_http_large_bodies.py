"""Large HTTP bodies without copies: a request body of known length (``RAW_BODY_FROM`` or more)
is read, once the app asks for it, straight from the socket into a buffer of its size and handed
to the app whole; binary outputs are answered from the outputs' own memory (``raw_view``). What
must not change: the bytes, keep-alive and pipelining after such a body, 100-continue, and that
tensors decoded from a request are read-only."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from flowserve.core.limits import DEFAULT_LIMITS
from flowserve.core.types import InferResponse
from flowserve.frontends.http.http1 import RAW_BODY_FROM, Connection, Http1Server
from flowserve.frontends.http.infer import ResponsePlan, _decode_inputs, encode_response
from tests.conformance.test_http1 import App, read_response, until

MiB = 1024 * 1024


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


def _head(path: str, length: int, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.parametrize("pieces", [[7, 100_000, 1, 600_000, 13], [8 * MiB]])
async def test_a_large_body_arrives_whole_and_the_connection_goes_on(
    served: tuple[Http1Server, App, int], monkeypatch: pytest.MonkeyPatch, pieces: list[int]
) -> None:
    _, app, port = served
    straight: list[int] = []
    original = Connection._raw_received

    def counted(self: Connection, nbytes: int) -> None:
        straight.append(nbytes)
        original(self, nbytes)

    monkeypatch.setattr(Connection, "_raw_received", counted)
    body = np.random.default_rng(5).bytes(3 * MiB + 7)
    small = b"after"
    wire = _head("/echo", len(body)) + body + _head("/next", len(small)) + small  # pipelined
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        pos = i = 0
        while pos < len(wire):
            n = pieces[i % len(pieces)]
            writer.write(wire[pos : pos + n])
            await writer.drain()
            await asyncio.sleep(0.001)
            pos, i = pos + n, i + 1
        status, _, answer = await read_response(reader)
        assert status == 201 and answer == b"POST /echo " + body
        status, _, answer = await read_response(reader)
        assert status == 201 and answer == b"POST /next after"
    finally:
        writer.close()
    large = [m for m in app.messages if len(m.get("body", b"")) > RAW_BODY_FROM]
    assert len(large) == 1 and not large[0]["more_body"]  # one message, the whole body
    received = large[0]["body"]  # the buffer it was read into (dataplane.memory.buffer), writable
    assert isinstance(received, memoryview) and not received.readonly and received.nbytes == len(body)
    assert sum(straight) > len(body) // 2  # most of it read straight into its buffer


def _resident_mib() -> float:
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) / 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the resident size from /proc")
async def test_a_declared_size_is_not_resident_before_its_bytes_arrive(
    served: tuple[Http1Server, App, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The buffer a large body is read into (dataplane.memory.buffer) is not zero-filled: a
    client that declares 200 MiB and sends 1 MiB holds about 1 MiB of the server's memory, not
    200 (a bytearray of the declared size held it all at once: four such clients took a
    server from 83 to 883 MiB resident)."""
    _, _, port = served
    filled: list[int] = []
    original = Connection._raw_received

    def counted(self: Connection, nbytes: int) -> None:
        original(self, nbytes)
        assert self.raw is not None
        filled.append(self.raw.filled)

    monkeypatch.setattr(Connection, "_raw_received", counted)
    before = _resident_mib()
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_head("/echo", 200 * MiB) + bytes(MiB))
        await writer.drain()
        await until(lambda: bool(filled) and filled[-1] >= MiB // 2)
        assert _resident_mib() - before < 64
    finally:
        writer.close()


async def test_a_large_body_after_100_continue(served: tuple[Http1Server, App, int]) -> None:
    _, _, port = served
    body = bytes(range(256)) * (RAW_BODY_FROM // 128)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_head("/echo", len(body), "Expect: 100-continue"))
        await writer.drain()
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert interim.startswith(b"HTTP/1.1 100")
        writer.write(body)
        status, _, answer = await read_response(reader)
        assert status == 201 and answer == b"POST /echo " + body
    finally:
        writer.close()


def test_tensors_from_a_writable_body_are_read_only() -> None:
    data = np.arange(1000, dtype=np.float32)
    body = bytearray(data.tobytes())
    items = [{"name": "x", "datatype": "FP32", "shape": [1000], "parameters": {"binary_data_size": 4000}}]
    tensors = _decode_inputs(SimpleNamespace(limits=DEFAULT_LIMITS), "m", items, memoryview(body))  # type: ignore[arg-type]
    assert np.array_equal(tensors["x"], data) and not tensors["x"].flags.writeable


def test_binary_outputs_are_answered_from_their_own_memory() -> None:
    out = np.arange(100_000, dtype=np.float32)
    response = InferResponse("m", "1", {"y": out})
    encoded = encode_response(SimpleNamespace(), response, ResponsePlan(default_binary=True))  # type: ignore[arg-type]
    (blob,) = encoded.blobs
    assert isinstance(blob, memoryview) and np.shares_memory(np.frombuffer(blob, np.float32), out)
    assert bytes(blob) == out.tobytes()


def test_tritonclient_round_trip_of_a_large_tensor(server: Any) -> None:
    data = np.random.default_rng(6).standard_normal(5 * MiB // 4 + 1).astype(np.float32)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    try:
        tensor = httpclient.InferInput("INPUT0", [1, data.size], "FP32")
        tensor.set_data_from_numpy(data.reshape(1, -1), binary_data=True)
        wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
        out = client.infer("identity_fp32", [tensor], outputs=[wanted]).as_numpy("OUTPUT0")
    finally:
        client.close()
    assert out is not None and np.array_equal(out.reshape(-1), data)
