"""flowserve's own HTTP/2 gRPC transport against the ``h2`` library (python-hyper's sans-I/O
HTTP/2, as hypercorn and grpclib use it), serving the same servicer, in the same run::

    python benchmarks/h2_transport.py                      # 3 repeats x 5 s per side (~1.5 min)
    python benchmarks/h2_transport.py --repeats 5 --duration 10
    python benchmarks/h2_transport.py --show benchmarks/results/h2_transport.json
    python benchmarks/h2_transport.py --replay /tmp/old-tree   # in-process CPU per call, two trees

The servicer is ``bare_grpc.py``'s ``BareServicer`` (add_sub, FP32 [16], no engine), so what
differs between the sides is the transport alone. Sides, each a server process of its own on
127.0.0.1 (a free port), uvloop:

- ``own``: ``bare_grpc.py`` as compare.py runs it, on ``flowserve.frontends.grpc.http2``.
- ``h2``: this script with ``--serve``: one ``asyncio.Protocol`` per connection around an
  ``h2.connection.H2Connection`` configured as grpclib configures it (no header validation or
  normalisation), doing the same job as the own transport for unary calls: SETTINGS
  (initial stream window 16 MiB, connection window 64 MiB, 4096 streams), request headers,
  DATA, the 5-byte gRPC framing, the response headers, message and trailers, flow control
  both ways (``acknowledge_received_data`` as data arrives; sends wait for the peer's
  windows), RST_STREAM cancelling the call, ``grpc-timeout``, UNIMPLEMENTED for unknown
  methods, everything written in one loop iteration sent in one ``write``. No compressed
  requests and no streaming calls (the bare servicer has no ModelStreamInfer).
- ``h2-validating``: the same with h2's default header validation and normalisation on (as
  hypercorn runs it).

Load: perf_analyzer at concurrency ``--concurrency`` (8) over gRPC when ``find_perf_analyzer``
finds one (it never downloads: ``python benchmarks/perf_analyzer_setup.py`` fetches it), else
this script's own closed-loop load generator: one HTTP/2 connection (as perf_analyzer's gRPC
client uses), ``--concurrency`` calls in flight, request headers HPACK-encoded with indexing
(the steady state of a C-core client: every field one indexed byte), each response's trailers
decoded and checked (``grpc-status: 0``), per-call latency taken; a 1 s warm-up on the
connection, then ``--duration`` seconds measured. Before measuring, each server answers one
``ModelInfer`` from grpcio's client, checked against a + b and a - b.

Measured per run: calls per second, p50/p99 latency, and the server's CPU per call (user +
system CPU time of the server process from /proc over the measured window, divided by the
calls completed in it: a number a busy machine disturbs much less than throughput). Sides run
back to back within a repeat, in an order that rotates from one repeat to the next. The table
gives the medians per side and the ratios against ``own`` (median of the per-repeat ratios,
with their range). Writes ``benchmarks/results/h2_transport.json``.

``--replay TREE...``: the own transport's CPU per small unary call, in process, against the
same transport of other source trees (each run in a fresh interpreter with the tree first on
``PYTHONPATH``). A recorded client byte stream (preface, SETTINGS, then reads of
``--concurrency`` ModelInfer calls each: HPACK-indexed headers and an add_sub request in one
DATA frame, and a connection WINDOW_UPDATE) is fed to a ``Connection`` on a fake transport,
the servicer answering at once with a constant response; the process CPU time of each fifth of
the reads is divided by its calls, the best fifth kept per run. Trees alternate for
``--repeats`` rounds; reported per tree: the median and the minimum over rounds (a loaded
machine only adds). No sockets, no load generator: what the transport itself costs per call.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import grpc

try:  # the h2 sides need python-hyper's h2 (pip install h2); --replay does not
    import h2
    import h2.config
    import h2.connection
    import h2.events
    import h2.exceptions
    import h2.settings
except ImportError:
    pass
import hpack
import numpy as np
import uvloop

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bare_grpc import MODEL, BareServicer  # noqa: E402
from compare import WORK, run_script, write_result  # noqa: E402
from perf import Settings, measure  # noqa: E402
from perf_analyzer_setup import find_perf_analyzer  # noqa: E402
from servers import Server, ServerGroup, bare_command, cpu_seconds, free_port, sigterm_as_interrupt  # noqa: E402
from tritonclient.grpc import service_pb2 as pb  # noqa: E402
from tritonclient.grpc import service_pb2_grpc  # noqa: E402

from flowserve.frontends.grpc import SERVICE  # noqa: E402
from flowserve.frontends.grpc.http2 import (  # noqa: E402
    ACK,
    CONNECTION_WINDOW,
    CONTINUATION,
    DATA,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_STREAMS,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    STREAM_WINDOW,
    WINDOW_UPDATE,
    CallContext,
    Method,
    frame,
    grpc_timeout_s,
    service_methods,
)

RESULTS = HERE / "results"
SIDES = ("own", "h2", "h2-validating")
INFER_PATH = f"/{SERVICE.full_name}/ModelInfer"
_FRAME_HEAD = 9

# ------------------------------------------------------------------------------------------------
# the h2 side: a gRPC server on h2.connection.H2Connection


_RESPONSE_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]
_TRAILERS_OK = [(b"grpc-status", b"0")]


@dataclass(slots=True)
class _Call:
    sid: int
    method: Method | None
    context: CallContext
    data: bytearray = field(default_factory=bytearray)
    out: bytearray = field(default_factory=bytearray)  # framed response bytes waiting for windows
    trailers: list[tuple[bytes, bytes]] | None = None
    task: asyncio.Task[None] | None = None


class H2GrpcProtocol(asyncio.Protocol):
    """One HTTP/2 connection of gRPC unary calls on ``h2``."""

    def __init__(self, methods: dict[bytes, Method], validate: bool, max_message: int) -> None:
        config = h2.config.H2Configuration(
            client_side=False,
            header_encoding=None,
            validate_inbound_headers=validate,
            validate_outbound_headers=validate,
            normalize_inbound_headers=validate,
            normalize_outbound_headers=validate,
        )
        self.conn = h2.connection.H2Connection(config=config)
        self.methods = methods
        self.max_message = max_message
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.calls: dict[int, _Call] = {}
        self.blocked: dict[int, _Call] = {}
        self.flush_scheduled = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            },
        )
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(CONNECTION_WINDOW - DEFAULT_WINDOW)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        for call in self.calls.values():
            if call.task is not None:
                call.task.cancel()
        self.calls.clear()
        self.blocked.clear()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self._flush()
            if self.transport is not None:
                self.transport.close()
            return
        for event in events:
            if isinstance(event, h2.events.DataReceived):
                sid = event.stream_id
                call = self.calls.get(sid)
                if call is not None and event.data:
                    call.data += event.data
                    if len(call.data) > self.max_message + 5:
                        self._finish(call, grpc.StatusCode.RESOURCE_EXHAUSTED, "message too large")
                with contextlib.suppress(h2.exceptions.StreamClosedError):
                    self.conn.acknowledge_received_data(event.flow_controlled_length, sid)
            elif isinstance(event, h2.events.RequestReceived):
                self._request(event.stream_id, cast(list[tuple[bytes, bytes]], event.headers))
            elif isinstance(event, h2.events.StreamEnded):
                self._remote_end(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                reset = self.calls.pop(event.stream_id, None)
                self.blocked.pop(event.stream_id, None)
                if reset is not None and reset.task is not None:
                    reset.task.cancel()
            elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
                for waiting in list(self.blocked.values()):
                    self._pump(waiting)
            elif isinstance(event, h2.events.ConnectionTerminated):
                self._flush()
                if self.transport is not None:
                    self.transport.close()
                return
        self._schedule_flush()

    def _request(self, sid: int, headers: list[tuple[bytes, bytes]]) -> None:
        path = content_type = b""
        for name, value in headers:
            if name == b":path":
                path = value
            elif name == b"content-type":
                content_type = value
        if not content_type.startswith(b"application/grpc"):
            self.conn.send_headers(sid, [(b":status", b"415")], end_stream=True)
            return
        method = self.methods.get(path)
        call = _Call(sid, method, CallContext(headers))
        self.calls[sid] = call
        if method is None or method.unary is None:
            self._finish(call, grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {path.decode('latin-1')}")

    def _remote_end(self, sid: int) -> None:
        call = self.calls.get(sid)
        if call is None or call.trailers is not None:
            return
        data = call.data
        if len(data) < 5 or int.from_bytes(data[1:5], "big") != len(data) - 5:
            self._finish(call, grpc.StatusCode.INTERNAL, "a unary call needs exactly one request message")
            return
        if data[0]:
            self._finish(call, grpc.StatusCode.UNIMPLEMENTED, "compressed requests are not served here")
            return
        assert call.method is not None and call.method.unary is not None
        try:
            request = call.method.parse(bytes(data[5:]))
        except Exception as exc:
            self._finish(call, grpc.StatusCode.INTERNAL, f"Failed to parse the request message: {exc}")
            return
        call.data = bytearray()
        call.task = self.loop.create_task(self._run(call, request))

    async def _run(self, call: _Call, request: Any) -> None:
        assert call.method is not None and call.method.unary is not None
        seconds = grpc_timeout_s(call.context.header("grpc-timeout"))
        try:
            if seconds is None:
                response = await call.method.unary(request, call.context)
            else:
                async with asyncio.timeout(seconds):
                    response = await call.method.unary(request, call.context)
        except asyncio.CancelledError:
            return
        except TimeoutError:
            self._finish(call, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        except grpc.aio.AbortError:
            self._finish(call, call.context.code, call.context.details)
        except Exception as exc:
            self._finish(call, grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}")
        else:
            if call.sid in self.calls:
                message = response.SerializeToString()
                self.conn.send_headers(call.sid, _RESPONSE_HEADERS)
                call.out += b"\x00" + len(message).to_bytes(4, "big") + message
                call.trailers = _TRAILERS_OK
                self._pump(call)
        self._schedule_flush()

    def _finish(self, call: _Call, code: grpc.StatusCode, message: str) -> None:
        """A trailers-only answer (nothing was sent on the call yet)."""
        if self.calls.pop(call.sid, None) is None:
            return  # reset by the client meanwhile
        if call.task is not None and call.task is not asyncio.current_task():
            call.task.cancel()
        block = [*_RESPONSE_HEADERS, (b"grpc-status", str(code.value[0]).encode())]
        if message:
            block.append((b"grpc-message", message.encode("ascii", "replace")))
        self.conn.send_headers(call.sid, block, end_stream=True)
        self._schedule_flush()

    def _pump(self, call: _Call) -> None:
        """Send what the peer's windows allow, then the trailers once everything is out."""
        conn = self.conn
        while call.out:
            room = min(conn.local_flow_control_window(call.sid), len(call.out), conn.max_outbound_frame_size)
            if room <= 0:
                self.blocked[call.sid] = call
                return
            conn.send_data(call.sid, bytes(call.out[:room]))
            del call.out[:room]
        self.blocked.pop(call.sid, None)
        if call.trailers is not None:
            conn.send_headers(call.sid, call.trailers, end_stream=True)
            self.calls.pop(call.sid, None)

    def _schedule_flush(self) -> None:
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        data = self.conn.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)


async def serve_h2(host: str, port: int, validate: bool) -> None:
    methods = {path.encode("latin-1"): m for path, m in service_methods(BareServicer(), SERVICE, pb).items()}
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: H2GrpcProtocol(methods, validate, 2**31 - 1), host, port, reuse_address=True
    )
    async with server:
        await server.serve_forever()


# ------------------------------------------------------------------------------------------------
# the load generator: closed loop over one HTTP/2 connection


def _request_message() -> tuple[bytes, np.ndarray, np.ndarray]:
    a = np.arange(16, dtype=np.float32)
    b = np.ones(16, dtype=np.float32)
    tensor = pb.ModelInferRequest.InferInputTensor
    request = pb.ModelInferRequest(
        model_name=MODEL,
        inputs=[tensor(name=n, datatype="FP32", shape=[1, 16]) for n in ("INPUT0", "INPUT1")],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name=n) for n in ("OUTPUT0", "OUTPUT1")],
        raw_input_contents=[a.tobytes(), b.tobytes()],
    )
    return request.SerializeToString(), a, b


class LoadClient(asyncio.Protocol):
    """``concurrency`` unary ModelInfer calls in flight on one connection, each answered call
    replaced by a new one until ``stop()``."""

    def __init__(self, port: int, concurrency: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.concurrency = concurrency
        message, _, _ = _request_message()
        self.body = b"\x00" + len(message).to_bytes(4, "big") + message
        self.headers = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", INFER_PATH.encode()),
            (b":authority", f"127.0.0.1:{port}".encode()),
            (b"te", b"trailers"),
            (b"content-type", b"application/grpc"),
            (b"user-agent", b"grpc-c++/1.58.0 grpc-c/35.0.0 (linux; chttp2)"),
            (b"grpc-accept-encoding", b"identity,deflate,gzip"),
        ]
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.next_sid = 1
        self.started: dict[int, int] = {}
        self.latencies_ns: list[int] = []
        self.errors = 0
        self.unacked = 0
        self.running = False
        self.idle: asyncio.Future[None] = self.loop.create_future()
        self.lost: asyncio.Future[None] = self.loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        settings = INITIAL_WINDOW_SIZE.to_bytes(2, "big") + STREAM_WINDOW.to_bytes(4, "big")
        update = (CONNECTION_WINDOW - DEFAULT_WINDOW).to_bytes(4, "big")
        self.transport.write(PREFACE + frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, update))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.lost.done():
            self.lost.set_result(None)
        if not self.idle.done():
            self.idle.set_result(None)

    def start(self) -> None:
        self.running = True
        self._send(b"".join(self._call() for _ in range(self.concurrency - len(self.started))))

    def stop(self) -> asyncio.Future[None]:
        """Issue no more calls; the future is done once the calls in flight are answered."""
        self.running = False
        if not self.started and not self.idle.done():
            self.idle.set_result(None)
        return self.idle

    def take(self) -> tuple[list[int], int]:
        latencies, errors = self.latencies_ns, self.errors
        self.latencies_ns, self.errors = [], 0
        return latencies, errors

    def _call(self) -> bytes:
        sid = self.next_sid
        self.next_sid += 2
        self.started[sid] = time.perf_counter_ns()
        block = self.encoder.encode(self.headers, huffman=True)
        return frame(HEADERS, END_HEADERS, sid, block) + frame(DATA, END_STREAM, sid, self.body)

    def _send(self, data: bytes) -> None:
        if data and self.transport is not None:
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos, end = 0, len(buf)
        out: list[bytes] = []
        while end - pos >= _FRAME_HEAD:
            length = int.from_bytes(buf[pos : pos + 3], "big")
            stop = pos + _FRAME_HEAD + length
            if stop > end:
                break
            ftype, flags = buf[pos + 3], buf[pos + 4]
            sid = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
            payload = bytes(buf[pos + _FRAME_HEAD : stop])
            pos = stop
            if ftype == DATA:
                self.unacked += length
                if self.unacked >= CONNECTION_WINDOW // 2:
                    out.append(frame(WINDOW_UPDATE, 0, 0, self.unacked.to_bytes(4, "big")))
                    self.unacked = 0
                if flags & END_STREAM:
                    self._done(sid, ok=False, out=out)
            elif ftype == HEADERS:
                if not flags & END_HEADERS:
                    raise RuntimeError("the load generator does not take CONTINUATION frames")
                fields = dict(self.decoder.decode(_header_block(flags, payload), raw=True))
                if flags & END_STREAM:
                    self._done(sid, ok=fields.get(b"grpc-status") == b"0", out=out)
            elif ftype == SETTINGS and not flags & ACK:
                out.append(frame(SETTINGS, ACK, 0))
            elif ftype == PING and not flags & ACK:
                out.append(frame(PING, ACK, 0, payload))
            elif ftype == RST_STREAM:
                if sid in self.started:
                    self._done(sid, ok=False, out=out)
            elif ftype == GOAWAY:
                self.errors += 1
            elif ftype == CONTINUATION:
                raise RuntimeError("the load generator does not take CONTINUATION frames")
        del buf[:pos]
        self._send(b"".join(out))

    def _done(self, sid: int, ok: bool, out: list[bytes]) -> None:
        t0 = self.started.pop(sid, None)
        if t0 is None:
            return
        if ok:
            self.latencies_ns.append(time.perf_counter_ns() - t0)
        else:
            self.errors += 1
        if self.running:
            out.append(self._call())
        elif not self.started and not self.idle.done():
            self.idle.set_result(None)


def _header_block(flags: int, payload: bytes) -> bytes:
    start, stop = 0, len(payload)
    if flags & 0x8:  # PADDED
        start, stop = 1, stop - payload[0]
    if flags & 0x20:  # PRIORITY
        start += 5
    return payload[start:stop]


def _percentile(sorted_ns: list[int], q: float) -> float:
    if not sorted_ns:
        return 0.0
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1000


async def _load(
    server: Server, port: int, concurrency: int, warmup_s: float, duration_s: float
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(lambda: LoadClient(port, concurrency), "127.0.0.1", port)
    try:
        client.start()
        await asyncio.sleep(warmup_s)
        client.take()
        cpu0, own0, t0 = cpu_seconds(server.pid), time.process_time(), time.perf_counter()
        await asyncio.sleep(duration_s)
        await asyncio.wait_for(client.stop(), 10)
        wall = time.perf_counter() - t0
        cpu, own = cpu_seconds(server.pid) - cpu0, time.process_time() - own0
        latencies, errors = client.take()
    finally:
        if client.transport is not None:
            client.transport.close()
            await asyncio.wait_for(client.lost, 5)
    calls = len(latencies)
    if not calls or errors:
        raise RuntimeError(f"{server.name}: {calls} calls answered, {errors} failed")
    latencies.sort()
    return {
        "calls": calls,
        "infer_per_s": round(calls / wall, 1),
        "p50_us": _percentile(latencies, 0.50),
        "p90_us": _percentile(latencies, 0.90),
        "p99_us": _percentile(latencies, 0.99),
        "server_cores": round(cpu / wall, 3),
        "server_cpu_us_per_infer": round(1e6 * cpu / calls, 1),
        "client_cores": round(own / wall, 3),
        "client_cpu_us_per_infer": round(1e6 * own / calls, 1),
        "settled": True,
    }


# ------------------------------------------------------------------------------------------------
# the run


def check(port: int) -> None:
    """One ModelInfer from grpcio's client, answered with a + b and a - b."""
    message, a, b = _request_message()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        reply = stub.ModelInfer(pb.ModelInferRequest.FromString(message), timeout=10)
        live = stub.ServerLive(pb.ServerLiveRequest(), timeout=10)
    out0 = np.frombuffer(reply.raw_output_contents[0], np.float32)
    out1 = np.frombuffer(reply.raw_output_contents[1], np.float32)
    if not live.live or not np.array_equal(out0, a + b) or not np.array_equal(out1, a - b):
        raise RuntimeError(f"the server on port {port} answered ModelInfer wrongly")


def start_side(group: ServerGroup, side: str) -> Server:
    port = free_port()
    if side == "own":
        command = bare_command("grpc", port)
    else:
        command = [sys.executable, str(Path(__file__).resolve()), "--serve", "--port", str(port)]
        if side == "h2-validating":
            command.append("--validate")
    server = group.start(side, command, -1, port, ready_paths=(), timeout_s=60)
    check(port)
    return server


def run(args: argparse.Namespace) -> tuple[str, list[dict[str, Any]]]:
    binary = None if args.load == "builtin" else find_perf_analyzer()
    if args.load == "perf_analyzer" and binary is None:
        raise SystemExit("perf_analyzer: not available (run benchmarks/perf_analyzer_setup.py)")
    load = "perf_analyzer" if binary is not None else "builtin"
    print(f"load generator: {load}", flush=True)
    settings = Settings(window_ms=1000)
    records: list[dict[str, Any]] = []
    with sigterm_as_interrupt(), ServerGroup(WORK / "logs") as group:
        servers = {side: start_side(group, side) for side in args.sides}
        for repeat in range(args.repeats):
            shift = repeat % len(args.sides)
            for side in args.sides[shift:] + args.sides[:shift]:
                server = servers[side]
                if binary is not None:
                    result = measure(binary, server, MODEL, "grpc", args.concurrency, settings)
                else:
                    result = uvloop.run(
                        _load(server, server.grpc_port, args.concurrency, args.warmup, args.duration)
                    )
                result.update(side=side, repeat=repeat, concurrency=args.concurrency)
                records.append(result)
                print(
                    f"repeat {repeat}  {side:14s} {result['infer_per_s']:8.0f} calls/s  "
                    f"p99 {result['p99_us'] / 1000:5.2f} ms  server {result['server_cpu_us_per_infer']:6.1f} "
                    f"us/call ({result['server_cores']:.2f} cores)  "
                    f"client {result['client_cores']:.2f} cores",
                    flush=True,
                )
    return load, records


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    own = {r["repeat"]: r for r in records if r["side"] == "own"}
    rows = []
    for side in dict.fromkeys(r["side"] for r in records):
        runs = [r for r in records if r["side"] == side]
        rates = [r["infer_per_s"] for r in runs]
        cpus = [r["server_cpu_us_per_infer"] for r in runs]
        paired = [(r, own[r["repeat"]]) for r in runs if r["repeat"] in own]
        cpu_ratios = [r["server_cpu_us_per_infer"] / o["server_cpu_us_per_infer"] for r, o in paired]
        rate_ratios = [r["infer_per_s"] / o["infer_per_s"] for r, o in paired]
        rows.append(
            {
                "side": side,
                "infer_per_s": round(statistics.median(rates)),
                "infer_per_s_min": round(min(rates)),
                "infer_per_s_max": round(max(rates)),
                "p50_ms": round(statistics.median(r["p50_us"] for r in runs) / 1000, 3),
                "p99_ms": round(statistics.median(r["p99_us"] for r in runs) / 1000, 3),
                "server_cpu_us_per_call": round(statistics.median(cpus), 1),
                "server_cpu_us_min": round(min(cpus), 1),
                "server_cpu_us_max": round(max(cpus), 1),
                "server_cores": round(statistics.median(r["server_cores"] for r in runs), 2),
                "client_cores": round(statistics.median(r["client_cores"] for r in runs), 2),
                "cpu_vs_own": _ratio(cpu_ratios),
                "rate_vs_own": _ratio(rate_ratios),
            }
        )
    return rows


def _ratio(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def _show_ratio(ratio: dict[str, float] | None) -> str:
    return "-" if ratio is None else f"{ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})"


def render(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'side':14s} | {'calls/s (range)':>21s} {'p50 ms':>6s} {'p99 ms':>6s} | "
        f"{'server us/call (range)':>22s} {'cores':>5s} {'client':>6s} | "
        f"{'cpu/call vs own':>17s} {'calls/s vs own':>17s}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        rate = f"{r['infer_per_s']} ({r['infer_per_s_min']}-{r['infer_per_s_max']})"
        cpu = f"{r['server_cpu_us_per_call']:.1f} ({r['server_cpu_us_min']:.1f}-{r['server_cpu_us_max']:.1f})"
        lines.append(
            f"{r['side']:14s} | {rate:>21s} {r['p50_ms']:6.2f} {r['p99_ms']:6.2f} | {cpu:>22s} "
            f"{r['server_cores']:5.2f} {r['client_cores']:6.2f} | "
            f"{_show_ratio(r['cpu_vs_own']):>17s} {_show_ratio(r['rate_vs_own']):>17s}"
        )
    lines.append(
        "medians over the repeats; server us/call: server process CPU / calls; "
        "vs own: median (range) of the per-repeat ratios side / own"
    )
    return "\n".join(lines)


REPLAY = r"""
import asyncio, json, sys, time
import hpack, numpy as np, uvloop
from tritonclient.grpc import service_pb2 as pb
from flowserve.frontends.grpc.http2 import Connection, Http2GrpcServer, Method, PREFACE, frame
from flowserve.frontends.grpc.fields import guard_inference

READS, PER = int(sys.argv[1]), int(sys.argv[2])
PATH = "/inference.GRPCInferenceService/ModelInfer"
request = pb.ModelInferRequest(model_name="add_sub")
response = pb.ModelInferResponse(model_name="add_sub", model_version="1")
for i in range(2):
    request.inputs.add(name=f"INPUT{i}", datatype="FP32", shape=[16])
    request.raw_input_contents.append(np.arange(16, dtype=np.float32).tobytes())
    request.outputs.add(name=f"OUTPUT{i}")
    response.outputs.add(name=f"OUTPUT{i}", datatype="FP32", shape=[16])
    response.raw_output_contents.append(np.arange(16, dtype=np.float32).tobytes())
body = request.SerializeToString()
message = b"\x00" + len(body).to_bytes(4, "big") + body


class Transport:
    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 5555) if name == "peername" else default
    def write(self, data): pass
    def writelines(self, pieces): pass
    def is_closing(self): return False
    def pause_reading(self): pass
    def resume_reading(self): pass
    def get_write_buffer_size(self): return 0
    def close(self): pass
    def abort(self): pass


async def answer(request, context):
    return response


async def main():
    methods = {PATH: Method(parse=pb.ModelInferRequest.FromString, unary=answer)}
    guard_inference(methods, 1 << 20)
    conn = Connection(Http2GrpcServer(methods, 64 << 20))
    conn.connection_made(Transport())

    def feed(data):
        if not hasattr(conn, "get_buffer"):  # a tree before the BufferedProtocol
            conn.data_received(data)
            return
        view = memoryview(data)
        while view:
            into = conn.get_buffer(-1)
            n = min(len(into), len(view))
            into[:n] = view[:n]
            conn.buffer_updated(n)
            view = view[n:]

    encoder = hpack.Encoder()
    fields = [(":method", "POST"), (":scheme", "http"), (":path", PATH), (":authority", "127.0.0.1"),
              ("content-type", "application/grpc"), ("te", "trailers"),
              ("grpc-accept-encoding", "identity,deflate,gzip"), ("user-agent", "grpc-c++/1.67.1")]
    reads, sid = [], 1
    for _ in range(READS + 200):
        read = []
        for _ in range(PER):
            read.append(frame(1, 4, sid, encoder.encode(fields)) + frame(0, 1, sid, message))
            sid += 2
        read.append(frame(8, 0, 0, (PER * 1000).to_bytes(4, "big")))
        reads.append(b"".join(read))
    feed(PREFACE + frame(4, 0, 0, (4).to_bytes(2, "big") + (2**31 - 1).to_bytes(4, "big")))
    timed = []
    for i, read in enumerate(reads):
        if i >= 200 and (i - 200) % (READS // 5) == 0:
            timed.append(time.process_time())
        feed(read)
        for _ in range(3):
            await asyncio.sleep(0)
    timed.append(time.process_time())
    assert not conn.streams, f"{len(conn.streams)} calls unanswered"
    fifths = [(b - a) / (READS // 5 * PER) * 1e6 for a, b in zip(timed, timed[1:])]
    print(json.dumps({"us_per_call": min(fifths[:5])}))


uvloop.run(main())
"""


def replay(trees: list[Path], repeats: int, reads: int, per: int) -> list[dict[str, Any]]:
    """The own transport's CPU per call in process, this tree and ``trees`` alternating."""
    sides = {"this": HERE.parent, **{str(t): t.resolve() for t in trees}}
    records: list[dict[str, Any]] = []
    for repeat in range(repeats):
        for name, tree in sides.items():
            env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
            done = subprocess.run(
                [sys.executable, "-c", REPLAY, str(reads), str(per)],
                cwd=tree, env=env, capture_output=True, text=True, timeout=600, check=False,
            )  # fmt: skip
            if done.returncode:
                raise RuntimeError(f"replay in {tree} failed: {done.stderr.strip()[-500:]}")
            us = float(json.loads(done.stdout.strip().splitlines()[-1])["us_per_call"])
            records.append({"repeat": repeat, "tree": name, "us_per_call": us})
            print(f"  repeat {repeat}  {name:<30} {us:7.2f} us/call", flush=True)
    return records


def replay_summary(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    mine = statistics.median(r["us_per_call"] for r in records if r["tree"] == "this")
    for tree in dict.fromkeys(r["tree"] for r in records):
        values = [r["us_per_call"] for r in records if r["tree"] == tree]
        median = statistics.median(values)
        rows.append({"tree": tree, "median_us": round(median, 2), "min_us": round(min(values), 2),
                     "this_vs_tree": round(mine / median, 3)})  # fmt: skip
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per run")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of load before each run")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--load", choices=("auto", "perf_analyzer", "builtin"), default="auto")
    parser.add_argument("--output", type=Path, default=RESULTS / "h2_transport.json")
    parser.add_argument("--show", type=Path, metavar="JSON", help="print a recorded run's table and exit")
    parser.add_argument("--serve", action="store_true", help="(internal) run the h2 server")
    parser.add_argument("--validate", action="store_true", help="(with --serve) h2's header validation on")
    parser.add_argument("--port", type=int, default=0, help="(with --serve) port on 127.0.0.1")
    parser.add_argument(
        "--replay", type=Path, nargs="+", metavar="TREE",
        help="in-process CPU per call of the own transport against these source trees",
    )  # fmt: skip
    parser.add_argument("--reads", type=int, default=2500, help="(--replay) reads per run")
    args = parser.parse_args(argv)
    if args.replay:
        started = time.time()
        records = replay(args.replay, args.repeats, args.reads, args.concurrency)
        rows = replay_summary(records)
        print()
        for row in rows:
            print(f"{row['tree']:<40} median {row['median_us']:7.2f} us/call  min {row['min_us']:7.2f}"
                  f"  this / tree {row['this_vs_tree']:.3f}")  # fmt: skip
        output = args.output
        if output == RESULTS / "h2_transport.json":
            output = RESULTS / "h2_transport-replay.json"
        settings = {"repeats": args.repeats, "reads": args.reads, "per_read": args.concurrency}
        write_result(output, "own gRPC transport, CPU per small unary call in process, trees side by side",
                     started, settings=settings, summary=rows, runs=records)  # fmt: skip
        return 0
    if args.serve:
        uvloop.run(serve_h2("127.0.0.1", args.port, args.validate))
        return 0
    if args.show is not None:
        print(render(json.loads(args.show.read_text())["summary"]))
        return 0
    if "h2" not in sys.modules:
        raise SystemExit("the h2 sides need python-hyper's h2 (pip install h2); --replay does not")
    if "own" not in args.sides:
        args.sides.insert(0, "own")
    started = time.time()
    load, records = run(args)
    rows = summarize(records)
    print()
    print(render(rows))
    benchmark = f"flowserve's own HTTP/2 gRPC transport vs h2 {h2.__version__}, bare servicer, same run"
    settings = {
        "repeats": args.repeats,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "concurrency": args.concurrency,
        "load": load,
        "h2": h2.__version__,
        "hpack": hpack.__version__,
    }
    write_result(args.output, benchmark, started, settings=settings, summary=rows, runs=records)
    return 0


if __name__ == "__main__":
    run_script(main)
