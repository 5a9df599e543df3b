"""The HTTP front end under hostile clients, in process over raw sockets (both servers where
the bound is the app's): gzip bombs and large JSON bodies handled off the event loop, JSON
nested too deep, the budget of buffered request bytes, stalled bodies, the connection cap, and
a ``generate_stream`` whose client goes away or stops reading. Each checks that a good client
on another connection is still answered promptly."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import textwrap
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flowserve.core.limits import Limits
from flowserve.dataplane.engine import Engine
from flowserve.dataplane.guard import ByteBudget, Guards
from flowserve.dataplane.inflate import RATIO
from flowserve.dataplane.plane import DataPlane
from flowserve.frontends.http import HTTP_SERVERS, jsonfmt, start_http
from flowserve.frontends.http.http1 import RAW_BODY_FROM, Http1Server
from flowserve.frontends.http.listener import HttpListener
from tests.conformance.test_http1 import read_response, until
from tests.pacing import prompt_bound

ROOT = Path(__file__).resolve().parents[2]

SCALE = """
name: scale
inputs: {x: {datatype: INT32, dims: [-1]}}
outputs: {y: double.y}
nodes:
  double:
    python: nodes.arith:Scale
    parameters: {factor: 2}
    inputs: {x: $x}
    outputs: {y: {datatype: INT32, dims: [-1]}}
"""


@dataclass
class Served:
    plane: DataPlane
    listener: HttpListener
    port: int

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)


Start = Callable[..., Awaitable[Served]]


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Start]:
    """Starts an engine with the bundled graphs and a 'scale' graph, and an HTTP listener on
    it (``limits``, ``guards``, start_http's options); all stopped after the test."""
    (tmp_path / "scale.yaml").write_text(textwrap.dedent(SCALE))
    engines: list[Engine] = []
    listeners: list[HttpListener] = []

    async def starter(limits: Limits | None = None, guards: Guards | None = None, **options: Any) -> Served:
        engine = await Engine.start(graphs=[ROOT / "graphs", tmp_path])
        engines.append(engine)
        plane = DataPlane(engine, limits=limits, guards=guards)
        listener = await start_http(plane, "127.0.0.1", 0, **options)
        listeners.append(listener)
        return Served(plane, listener, listener.port)

    try:
        yield starter
    finally:
        for listener in listeners:
            await listener.stop(grace_s=0)
        for engine in engines:
            await engine.stop()


def request(method: str, path: str, body: bytes = b"", *headers: str) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: x", *headers]
    if method == "POST" and not any(h.lower().startswith("transfer-encoding") for h in headers):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def call(served: Served, raw: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    reader, writer = await served.open()
    try:
        writer.write(raw)
        return await read_response(reader)
    finally:
        writer.close()


class Prober:
    """GET /v2/health/live on its own keep-alive connection, over and over, while something
    else runs: the slowest answer is what a good client saw."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.slowest = 0.0
        self.answers = 0
        self._task: asyncio.Task[None] | None = None
        self._stop = False

    async def __aenter__(self) -> Prober:
        reader, writer = await self.served.open()
        self._task = asyncio.create_task(self._run(reader, writer))
        return self

    async def _run(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            # a flag as well as the cancel: Python 3.11's asyncio.wait_for (read_response's)
            # may swallow a cancellation that arrives as its read completes, and the loop
            # would run on forever
            while not self._stop:
                started = time.monotonic()
                writer.write(request("GET", "/v2/health/live"))
                assert (await read_response(reader))[0] == 200
                self.slowest = max(self.slowest, time.monotonic() - started)
                self.answers += 1
                await asyncio.sleep(0.02)
        finally:
            writer.close()

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._stop = True
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        assert self.answers > 0 and self.slowest < prompt_bound(), (self.answers, self.slowest)


def scale_body(count: int) -> bytes:
    doc = {"inputs": [{"name": "x", "datatype": "INT32", "shape": [count], "data": [1] * count}]}
    return json.dumps(doc).encode()


def error(body: bytes) -> str:
    return str(json.loads(body)["error"])


# ------------------------------------------------------------------ compressed and JSON bodies


def bomb(inflated: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    parts = [packer.compress(zeros) for _ in range(inflated >> 20)]
    return b"".join(parts) + packer.flush()


async def test_large_json_bodies_read_into_their_own_buffer_are_parsed(start: Start) -> None:
    """A body of known length over RAW_BODY_FROM is handed on as the buffer it was read into (a
    memoryview): JSON inference, JSON-only endpoints (a whitespace-only body is an empty
    document) and the binary extension's JSON header all read it as they read bytes."""
    served = await start()
    body = scale_body(60_000)
    assert len(body) > RAW_BODY_FROM
    status, _, answer = await call(served, request("POST", "/v2/models/scale/infer", body))
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [2] * 60_000
    status, _, answer = await call(served, request("POST", "/v2/repository/index", b" \n" * RAW_BODY_FROM))
    assert status == 200 and isinstance(json.loads(answer), list)
    status, _, answer = await call(served, request("POST", "/v2/repository/index", b"[" * RAW_BODY_FROM * 2))
    assert status == 400 and "malformed" in error(answer)
    header = json.dumps({"inputs": [{"name": "x", "datatype": "INT32", "shape": [40_000],
                                     "parameters": {"binary_data_size": 160_000}}]}).encode()  # fmt: skip
    raw = np.ones(40_000, np.int32).tobytes()
    status, _, answer = await call(
        served,
        request(
            "POST", "/v2/models/scale/infer", header + raw, f"Inference-Header-Content-Length: {len(header)}"
        ),
    )
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [2] * 40_000


async def test_a_gzip_bomb_is_inflated_in_steps_off_the_loop(start: Start) -> None:
    served = await start(limits=Limits(max_request_bytes=32 << 20))
    payload = bomb(160 << 20)  # 160 MiB of zeros in ~160 KiB: a thread, stopped at the limit
    assert 64 << 10 < len(payload) < 1 << 20
    raw = request("POST", "/v2/models/scale/infer", payload, "Content-Encoding: gzip")
    async with Prober(served):
        answers = await asyncio.gather(*(call(served, raw) for _ in range(3)))
    for status, _, body in answers:
        assert status == 413 and "decompressed" in error(body)
    assert served.plane.guards.budget.in_use == 0
    # a small compressed body still takes the fast path and works
    status, _, body = await call(
        served,
        request("POST", "/v2/models/scale/infer", gzip.compress(scale_body(4)), "Content-Encoding: gzip"),
    )
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2, 2, 2, 2]


async def test_a_bomb_stops_at_its_ratio_and_counts_against_the_budget(start: Start) -> None:
    """A bomb well under the request limit stops at RATIO times its size (413 naming the
    ratio), however large the limit; a body that does inflate takes the budget as it grows
    (503 naming --max-buffered-request-bytes when it is spent, before all of it exists), and
    all of it comes back."""
    served = await start()  # the default 256 MiB request limit
    payload = bomb(64 << 20)  # 64 MiB of zeros in ~64 KB: 1000:1
    raw = request("POST", "/v2/models/scale/infer", payload, "Content-Encoding: gzip")
    async with Prober(served):
        status, _, body = await call(served, raw)
    assert status == 413 and f"exceeds {RATIO} times its compressed size of {len(payload)} bytes" in error(
        body
    )
    # a binary request whose 16 MiB tensor compresses about 4:1 (4 MiB sent)
    tensor = np.random.default_rng(0).integers(0, 4, 4 << 20, dtype=np.int32)
    header = jsonfmt.dumps(
        {"inputs": [{"name": "x", "datatype": "INT32", "shape": [tensor.size],
                     "parameters": {"binary_data_size": tensor.nbytes}}],
         "parameters": {"binary_data_output": True}}
    )  # fmt: skip
    packed = gzip.compress(header + tensor.tobytes(), 1)
    raw = request(
        "POST", "/v2/models/scale/infer", packed, "Content-Encoding: gzip",
        f"Inference-Header-Content-Length: {len(header)}",
    )  # fmt: skip
    for budget, answer in ((ByteBudget(24 << 20), 503), (ByteBudget(64 << 20), 200)):
        served = await start(guards=Guards(budget=budget))
        async with Prober(served):
            status, headers, body = await call(served, raw)
        assert status == answer, body[:300]
        if status == 503:  # its 4 MiB fit; the inflated bytes (16 MiB, joined: twice) do not
            assert "decompressing the request body" in error(body)
            assert "(--max-buffered-request-bytes 25165824)" in error(body)
        else:
            length = int(headers[b"inference-header-content-length"])
            assert (np.frombuffer(body[length:], np.int32) == tensor * 2).all()
        assert budget.in_use == 0


async def test_a_chunked_json_body_is_refused_as_soon_as_it_passes_the_json_limit(start: Start) -> None:
    """The JSON limit holds for a chunked body as it arrives: 413 while the client is still
    sending (it never ends its body here), the rest dropped, the budget back to zero."""
    served = await start(max_json_bytes=1 << 20)
    reader, writer = await served.open()
    writer.write(request("POST", "/v2/models/scale/infer", b"", "Transfer-Encoding: chunked"))
    chunk = b" " * (64 << 10)
    async with Prober(served):
        with contextlib.suppress(ConnectionError):
            for _ in range(24):  # 1.5 MiB, and no last chunk: the body never ends
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()
        status, headers, body = await read_response(reader)
    assert status == 413 and headers[b"connection"] == b"close"
    assert f"limit of {1 << 20} bytes for JSON (--http-max-json-bytes)" in error(body) and "binary" in error(
        body
    )
    writer.close()
    await until(lambda: served.plane.guards.budget.in_use == 0)
    # the same for the other JSON endpoints (here: the repository index)
    reader, writer = await served.open()
    writer.write(request("POST", "/v2/repository/index", b"", "Transfer-Encoding: chunked"))
    with contextlib.suppress(ConnectionError):
        for _ in range(24):
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
    status, _, body = await read_response(reader)
    assert status == 413 and "repository index request exceeds" in error(body)
    writer.close()


async def test_large_json_is_parsed_off_the_loop_and_bounded(start: Start) -> None:
    served = await start(limits=Limits(max_request_bytes=32 << 20), max_json_bytes=4 << 20)
    big = scale_body(1_000_000)  # ~3 MB of JSON
    assert 1 << 20 < len(big) < 4 << 20
    async with Prober(served):
        status, _, body = await call(served, request("POST", "/v2/models/scale/infer", big))
    assert status == 200 and len(json.loads(body)["outputs"][0]["data"]) == 1_000_000
    status, _, body = await call(served, request("POST", "/v2/models/scale/infer", scale_body(2_000_000)))
    assert status == 413 and "binary" in error(body) and str(4 << 20) in error(body)
    assert served.plane.guards.budget.in_use == 0


async def test_large_json_counts_against_the_byte_budget(start: Start) -> None:
    # 3 MB of JSON holds ~24 MB of Python objects: more than this 16 MiB budget
    served = await start(guards=Guards(budget=ByteBudget(16 << 20)))
    status, _, body = await call(served, request("POST", "/v2/models/scale/infer", scale_body(1_000_000)))
    assert status == 503 and "memory budget" in error(body)
    assert served.plane.guards.budget.in_use == 0


@pytest.mark.parametrize("parser", ["rapidjson", "stdlib"])
def test_json_reads_a_memoryview_as_it_reads_bytes(monkeypatch: pytest.MonkeyPatch, parser: str) -> None:
    if parser == "stdlib":
        monkeypatch.setattr(jsonfmt, "_fast", None)
    doc = b'{"a": [1, 2.5, "x"], "b": null}'
    buffer = np.frombuffer(doc, np.uint8).copy().data  # as dataplane.memory.buffer hands it on
    assert jsonfmt.loads(buffer) == jsonfmt.loads(doc) == jsonfmt.loads_chunked(buffer)
    with pytest.raises(ValueError):
        jsonfmt.loads(np.frombuffer(b'{"a": ', np.uint8).copy().data)


@pytest.mark.parametrize(
    "data", [b"", b"  ", b" \t\r\n\x0b\x0c" * 50, b" " * 100 + b"{}", b"{}", b"\x00" * 80]
)
def test_blank_is_bytes_strip_on_bytes_and_buffers(data: bytes) -> None:
    expected = not data.strip()
    assert jsonfmt.blank(data) is expected
    assert jsonfmt.blank(bytearray(data)) is expected
    assert jsonfmt.blank(np.frombuffer(data, np.uint8).copy().data) is expected


def nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


@pytest.mark.parametrize("parser", ["rapidjson", "stdlib"])
@pytest.mark.parametrize("depth", [900, 100_000])
async def test_json_nested_too_deep_is_400(
    start: Start, monkeypatch: pytest.MonkeyPatch, parser: str, depth: int
) -> None:
    if parser == "stdlib":
        monkeypatch.setattr(jsonfmt, "_fast", None)
    served = await start()
    data = nested(depth)
    infer = '{"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": ' + data + "}]}"
    cases = [
        ("/v2/models/scale/infer", infer),
        ("/v2/models/repeat/generate", '{"x": ' + data + ', "n": [1]}'),
        ("/v2/models/repeat/generate_stream", '{"x": ' + data + ', "n": [1]}'),
        ("/v2/logging", '{"log_info": ' + data + "}"),
        ("/v2/repository/index", data),
    ]
    for path, doc in cases:
        status, _, body = await call(served, request("POST", path, doc.encode()))
        assert status == 400, (path, body[:300])
        assert "traceback" not in body.decode().lower()
    status, _, _ = await call(served, request("GET", "/v2/health/live"))
    assert status == 200


# ------------------------------------------------------------------ the byte budget


async def test_the_byte_budget_refuses_before_reading_and_comes_back(start: Start) -> None:
    budget = ByteBudget(1 << 20)
    served = await start(limits=Limits(max_request_bytes=8 << 20), guards=Guards(budget=budget))
    size = 700 << 10
    body = scale_body(4).ljust(size)  # JSON padded with spaces to 700 KiB
    raw = request("POST", "/v2/models/scale/infer", body)
    # one request holds 700 KiB while its body arrives
    first_reader, first_writer = await served.open()
    first_writer.write(raw[: len(raw) // 2])
    await until(lambda: budget.in_use == size)
    # a second one does not fit: refused from its head, the connection closed, nothing read
    reader, writer = await served.open()
    writer.write(raw[:200])
    status, headers, answer = await read_response(reader)
    assert status == 503 and headers[b"connection"] == b"close" and "memory budget" in error(answer)
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert budget.refused == 1
    # a chunked body is counted as it arrives
    reader, writer = await served.open()
    writer.write(request("POST", "/v2/models/scale/infer", b"", "Transfer-Encoding: chunked"))
    chunk = b" " * (64 << 10)
    try:
        for _ in range(16):
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
    except ConnectionError:
        pass
    status, _, answer = await read_response(reader)
    assert status == 503 and "memory budget" in error(answer)
    writer.close()
    # the first one ends: answered, and its bytes come back
    first_writer.write(raw[len(raw) // 2 :])
    status, _, answer = await read_response(first_reader)
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [2, 2, 2, 2]
    await until(lambda: budget.in_use == 0)
    # and a client that leaves mid-body gives its bytes back too
    reader, writer = await served.open()
    writer.write(raw[: len(raw) // 2])
    await until(lambda: budget.in_use == size)
    writer.transport.abort()
    await until(lambda: budget.in_use == 0)
    first_writer.close()


# ------------------------------------------------------------------ slow clients, many clients


async def test_a_stalled_body_times_out_with_408(start: Start) -> None:
    served = await start(body_timeout_s=0.3)
    reader, writer = await served.open()
    async with Prober(served):
        writer.write(request("POST", "/v2/models/scale/infer", scale_body(4))[:-10])
        status, headers, body = await read_response(reader)
    assert (status, headers[b"connection"]) == (408, b"close") and b"no progress" in body
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


async def test_the_connection_cap_holds_and_the_server_stays_usable(start: Start) -> None:
    served = await start(guards=Guards(max_connections=8))
    guard = served.plane.guards.listener("http")
    idle = [await served.open() for _ in range(7)]
    await until(lambda: guard.open == 7)
    async with Prober(served):  # the eighth: it is served
        for _ in range(5):  # past the cap: refused at once
            reader, writer = await served.open()
            status, _, _ = await read_response(reader)
            assert status == 503
            writer.close()
    assert guard.refused == 5
    for _, writer in idle:
        writer.close()
    await until(lambda: guard.open == 0)
    assert (await call(served, request("GET", "/v2/health/live")))[0] == 200


def test_uvicorn_gets_the_connection_cap_and_keep_alive() -> None:
    from flowserve.frontends.http.app import HttpApp
    from flowserve.frontends.http.listener import _uvicorn

    uv = _uvicorn(HttpApp(DataPlane(Engine())), 75, 100)
    assert (uv.config.limit_concurrency, uv.config.timeout_keep_alive) == (100, 75)


# ------------------------------------------------------------------ generate_stream


STREAM = request("POST", "/v2/models/repeat/generate_stream", b'{"x": [7], "n": [2000000000]}')


async def first_event(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head
    return await asyncio.wait_for(reader.readuntil(b"\n\n"), 5)


async def graph_is_free(served: Served) -> None:
    raw = request("POST", "/v2/models/repeat/generate", b'{"x": [3], "n": [1]}')
    status, _, body = await asyncio.wait_for(call(served, raw), 5)
    assert status == 200 and json.loads(body)["y"] == 30, body


@pytest.mark.parametrize("server", HTTP_SERVERS)
async def test_a_stream_whose_client_leaves_is_cancelled(start: Start, server: str) -> None:
    served = await start(server=server)
    reader, writer = await served.open()
    writer.write(STREAM)
    assert b'"y":70' in (await first_event(reader)).replace(b" ", b"")
    writer.transport.abort()
    await until(lambda: served.plane.admission.in_flight == 0)  # the plane's stream was closed
    await graph_is_free(served)
    started = time.monotonic()
    await served.listener.stop(grace_s=10)
    assert time.monotonic() - started < 3


@pytest.mark.parametrize("server", HTTP_SERVERS)
async def test_a_stream_reader_that_stops_reading_holds_only_itself(start: Start, server: str) -> None:
    served = await start(server=server)
    reader, writer = await served.open()
    writer.transport.set_write_buffer_limits(0)
    writer.write(STREAM)
    await first_event(reader)
    async with Prober(served):  # while this client reads nothing more
        await asyncio.sleep(1.0)
        if server == "native":
            listener_server = served.listener._server
            assert isinstance(listener_server, Http1Server)
            buffered = [
                c.transport.get_write_buffer_size() for c in listener_server.connections if c.transport
            ]
            assert max(buffered) < 1 << 20, buffered  # writes wait for the reader
    writer.transport.abort()
    await until(lambda: served.plane.admission.in_flight == 0)  # the plane's stream was closed
    await graph_is_free(served)
    started = time.monotonic()
    await served.listener.stop(grace_s=10)
    assert time.monotonic() - started < 3
