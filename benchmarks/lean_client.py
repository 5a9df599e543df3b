"""Clients of equal cost on HTTP and gRPC for one large tensor in and out, so that what differs
between the protocols' latencies is the server's.

perf_analyzer's gRPC client copies a 16 MiB tensor three times in user space per request (into
the request message, protobuf's serialization into gRPC's buffer, the response's parse into a
string: a `perf record --call-graph dwarf` of it puts 37 % of its CPU there) where its HTTP
client copies it about once each way, so at one request at a time its gRPC latency carries the
client's copies, whatever the server does. These two clients make no user-space copy of the
payload on either protocol: the request's bytes (built once) go out with ``sendmsg`` from the
tensor's own buffer, the response is received with ``recv_into`` into a buffer allocated (and
faulted in) once, and only the kernel copies. Both are blocking sockets in this process; each
request is parsed as far as finding the output's bytes, and the first is checked in full.

- ``HttpClient``: HTTP/1.1 keep-alive with the binary tensor extension (outputs asked binary).
- ``GrpcClient``: HTTP/2 by hand: the preface and SETTINGS (a 2^31-1 stream window and 16 MiB
  frames for the server's answer), one stream per request (HPACK via ``hpack``), the message as
  DATA frames sized to the server's SETTINGS_MAX_FRAME_SIZE and windows (waiting on its
  WINDOW_UPDATEs when the message is larger than its window), ``raw_input_contents`` written as
  the protobuf field's tag and length in front of the tensor's buffer (no serialization of the
  payload); the response's DATA frames are read straight into the buffer.

Used by ``large_tensors.py --client lean``; ``python benchmarks/lean_client.py HOST HTTP GRPC``
sends one 1 MiB request each way and checks the answers.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hpack
import numpy as np
from tritonclient.grpc import service_pb2 as pb

# the protocol's constants and frame codec as flowserve's transport has them (tests/h2raw.py's
# raw client takes them from there too)
from flowserve.frontends.grpc.h2.frames import (
    ACK,
    DATA,
    END_HEADERS,
    END_STREAM,
    FRAME_HEAD,
    GOAWAY,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_FRAME_SIZE,
    PADDED,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
)
from flowserve.frontends.grpc.h2.frames import MAX_WINDOW as BIG_WINDOW

sys.path.insert(0, str(Path(__file__).resolve().parent))
from servers import cpu_seconds

INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
RAW_INPUT_TAG = b"\x3a"  # ModelInferRequest.raw_input_contents: field 7, length-delimited


class ProtocolError(Exception):
    """The server answered something this client does not expect."""


def _connect(host: str, port: int) -> socket.socket:
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def send_all(sock: socket.socket, pieces: Sequence[bytes | memoryview]) -> None:
    """``sendmsg`` until every piece is out (the kernel copies them; no join here)."""
    views = [memoryview(piece).cast("B") for piece in pieces]
    while views:
        sent = sock.sendmsg(views[:1024])
        while sent:
            if sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from the socket."""
    while view:
        got = sock.recv_into(view)
        if not got:
            raise ProtocolError("the server closed the connection")
        view = view[got:]


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _buffer(size: int) -> bytearray:
    buf = bytearray(size)
    np.frombuffer(buf, np.uint8)[::4096] = 1  # fault every page in now, not in the first request
    return buf


class HttpClient:
    """One keep-alive HTTP/1.1 connection; ``infer()`` sends the tensor (FP32 INPUT0, ``shape``
    or flat) and returns OUTPUT0's bytes as a view of the client's receive buffer (valid until
    the next call)."""

    def __init__(
        self, host: str, port: int, model: str, payload: np.ndarray, shape: Sequence[int] = ()
    ) -> None:
        self.payload = np.ascontiguousarray(payload, np.float32)
        size = self.payload.nbytes
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "INPUT0",
                        "shape": list(shape or [self.payload.size]),
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": size},
                    }
                ],
                "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
            }
        ).encode()
        self.head = (
            f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Content-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\n"
            f"Content-Length: {len(header) + size}\r\n\r\n"
        ).encode() + header
        self.buf = _buffer(size + (1 << 16))
        self.sock = _connect(host, port)

    def infer(self) -> memoryview:
        send_all(self.sock, [self.head, self.payload.data])
        view = memoryview(self.buf)
        got = 0
        while True:  # the status line and headers: a few hundred bytes
            n = self.sock.recv_into(view[got:])
            if not n:
                raise ProtocolError("the server closed the connection")
            got += n
            end = self.buf.find(b"\r\n\r\n", 0, got)
            if end >= 0:
                break
        head = bytes(view[:end]).decode("latin-1")
        fields = dict(line.lower().split(":", 1) for line in head.split("\r\n")[1:] if ":" in line)
        if "content-length" not in fields:
            raise ProtocolError("no Content-Length in the answer")
        total = end + 4 + int(fields["content-length"])
        if total > len(self.buf):
            raise ProtocolError(f"answer of {total} bytes, larger than expected")
        recv_exact(self.sock, view[got:total])
        if not head.startswith("HTTP/1.1 200"):
            body = bytes(view[end + 4 : total]).decode("utf-8", "replace")
            raise ProtocolError(f"{head.split(chr(13), 1)[0]}: {body}")
        return view[total - self.payload.nbytes : total]

    def check(self) -> None:
        """One request, its output compared with the input (the JSON part parsed too)."""
        out = self.infer()
        if bytes(out) != self.payload.tobytes():
            raise ProtocolError("HTTP: the output differs from the input")

    def close(self) -> None:
        self.sock.close()


class GrpcClient:
    """One HTTP/2 connection, one stream per ``infer()``; returns the output's bytes as a view of
    the client's receive buffer (valid until the next call)."""

    def __init__(
        self, host: str, port: int, model: str, payload: np.ndarray, shape: Sequence[int] = ()
    ) -> None:
        self.payload = np.ascontiguousarray(payload, np.float32)
        size = self.payload.nbytes
        request = pb.ModelInferRequest(model_name=model)
        request.inputs.add(name="INPUT0", datatype="FP32", shape=list(shape or [self.payload.size]))
        request.outputs.add(name="OUTPUT0")
        field = RAW_INPUT_TAG + _varint(size)
        message = request.SerializeToString() + field
        self.prefix = b"\x00" + struct.pack(">I", len(message) + size) + message
        self.body_size = len(self.prefix) + size
        self.buf = _buffer(size + (1 << 16))
        self.header = bytearray(9)
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()
        self.authority = f"{host}:{port}"
        self.sid = -1
        self.max_frame = 16_384
        self.stream_window_init = 65_535
        self.conn_window = 65_535
        self.stream_window = 0
        self.consumed = 0
        self._settled = False
        self.sock = _connect(host, port)
        # no server push, a stream window of 2^31-1 and 16 MiB frames for the answer
        settings = struct.pack(
            ">HIHIHI", 2, 0, INITIAL_WINDOW_SIZE, BIG_WINDOW, MAX_FRAME_SIZE, (1 << 24) - 1
        )
        send_all(
            self.sock,
            [
                PREFACE,
                frame(SETTINGS, 0, 0, settings),
                frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", BIG_WINDOW - 65_535)),
            ],
        )
        while not self._settled:  # the server's SETTINGS, acknowledged
            self._read_control()

    def _read_header(self) -> tuple[int, int, int, int]:
        recv_exact(self.sock, memoryview(self.header))
        length = int.from_bytes(self.header[:3], "big")
        kind, flags = self.header[3], self.header[4]
        sid = int.from_bytes(self.header[5:9], "big") & 0x7FFFFFFF
        return length, kind, flags, sid

    def _payload(self, length: int) -> bytes:
        data = bytearray(length)
        recv_exact(self.sock, memoryview(data))
        return bytes(data)

    def _control(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if kind == SETTINGS and not flags & ACK:
            for offset in range(0, len(payload), 6):
                key, value = struct.unpack_from(">HI", payload, offset)
                if key == INITIAL_WINDOW_SIZE:
                    self.stream_window += value - self.stream_window_init
                    self.stream_window_init = value
                elif key == MAX_FRAME_SIZE:
                    self.max_frame = value
            send_all(self.sock, [frame(SETTINGS, ACK, 0)])
            self._settled = True
        elif kind == WINDOW_UPDATE:
            increment = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
            if sid == 0:
                self.conn_window += increment
            elif sid == self.sid:
                self.stream_window += increment
        elif kind == PING and not flags & ACK:
            send_all(self.sock, [frame(PING, ACK, 0, payload)])
        elif kind == GOAWAY:
            raise ProtocolError(f"GOAWAY {payload[4:8].hex()} {payload[8:]!r}")
        elif kind == RST_STREAM and sid == self.sid:
            raise ProtocolError(f"RST_STREAM {payload.hex()}")

    def _read_control(self) -> None:
        length, kind, flags, sid = self._read_header()
        payload = self._payload(length)
        if kind == HEADERS and sid == self.sid:  # answered before the whole request was sent
            headers: dict[Any, Any] = dict(self.decoder.decode(payload))
            message = headers.get("grpc-message", "")
            raise ProtocolError(f"grpc-status {headers.get('grpc-status')} while sending: {message}")
        if kind in (DATA, HEADERS):
            raise ProtocolError(f"frame {kind} on stream {sid} while sending")
        self._control(kind, flags, sid, payload)

    def _send_body(self) -> None:
        pieces: list[bytes | memoryview] = [self.prefix, self.payload.data.cast("B")]
        left = self.body_size
        while left:
            room = min(self.conn_window, self.stream_window, self.max_frame * 64)
            if room <= 0:
                self._read_control()
                continue
            batch: list[bytes | memoryview] = []
            take = min(room, left)
            taken = 0
            while taken < take:  # frames of at most max_frame, their payloads uncopied
                chunk = min(self.max_frame, take - taken)
                flags = END_STREAM if left - taken - chunk == 0 else 0
                batch.append(
                    FRAME_HEAD.pack(chunk >> 16, chunk & 0xFFFF, DATA, flags, self.sid)
                )  # payload apart
                need = chunk
                while need:
                    head = pieces[0]
                    if len(head) <= need:
                        batch.append(head)
                        need -= len(head)
                        pieces.pop(0)
                    else:
                        view = memoryview(head)
                        batch.append(view[:need])
                        pieces[0] = view[need:]
                        need = 0
                taken += chunk
            send_all(self.sock, batch)
            left -= take
            self.conn_window -= take
            self.stream_window -= take

    def infer(self) -> memoryview:
        self.sid += 2
        self.stream_window = self.stream_window_init
        block = self.encoder.encode(
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", INFER_PATH),
                (":authority", self.authority),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ]
        )
        send_all(self.sock, [frame(HEADERS, END_HEADERS, self.sid, block)])
        self._send_body()
        view = memoryview(self.buf)
        got = 0
        status, headers = None, dict[Any, Any]()
        while True:
            length, kind, flags, sid = self._read_header()
            if kind == DATA and sid == self.sid:
                if flags & PADDED or got + length > len(self.buf):
                    raise ProtocolError("a padded or oversized DATA frame")
                recv_exact(self.sock, view[got : got + length])
                got += length
                self.consumed += length
            elif kind == HEADERS and sid == self.sid:
                headers = dict(self.decoder.decode(self._payload(length)))
                status = headers.get("grpc-status", status)
                if flags & END_STREAM:
                    break
            else:
                self._control(kind, flags, sid, self._payload(length))
        if status != "0":
            raise ProtocolError(f"grpc-status {status}: {headers.get('grpc-message', '')}")
        if self.consumed > BIG_WINDOW // 2:  # give the connection's window back now and then
            send_all(self.sock, [frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.consumed))])
            self.consumed = 0
        return view[got - self.payload.nbytes : got]

    def check(self) -> None:
        """One request, its response parsed with protobuf and compared with the input."""
        self.infer()
        length = struct.unpack(">I", self.buf[1:5])[0]
        response = pb.ModelInferResponse.FromString(bytes(self.buf[5 : 5 + length]))
        if list(response.raw_output_contents) != [self.payload.tobytes()]:
            raise ProtocolError("gRPC: the output differs from the input")

    def close(self) -> None:
        self.sock.close()


def measure(
    host: str, port: int, protocol: str, model: str, size: int, window_s: float, server_pid: int
) -> dict[str, Any]:
    """One request at a time for ``window_s`` (at least 10 requests) over a new connection after
    a checked request and two unmeasured ones: the same keys as ``perf.measure`` (requests per
    second, latency percentiles, the server's CPU per request, this client's own)."""
    payload = np.random.default_rng(size).random(size // 4, dtype=np.float32)
    client: HttpClient | GrpcClient
    client = (HttpClient if protocol == "http" else GrpcClient)(host, port, model, payload)
    try:
        client.check()
        client.infer()
        client.infer()
        latencies: list[float] = []
        server0, client0, start = cpu_seconds(server_pid), time.process_time(), time.perf_counter()
        now = start
        while now - start < window_s or len(latencies) < 10:
            client.infer()
            latencies.append(time.perf_counter() - now)
            now = time.perf_counter()
        server_cpu, client_cpu = cpu_seconds(server_pid) - server0, time.process_time() - client0
    finally:
        client.close()
    count = len(latencies)
    points = np.percentile(np.asarray(latencies) * 1e6, [50, 90, 99])
    return {
        "infer_per_s": count / (now - start),
        "p50_us": float(points[0]),
        "p90_us": float(points[1]),
        "p99_us": float(points[2]),
        "settled": True,
        "server_cpu_us_per_infer": round(1e6 * server_cpu / count, 1),
        "client_cpu_us_per_infer": round(1e6 * client_cpu / count, 1),
    }


def main(argv: Sequence[str]) -> int:
    host, http_port, grpc_port = argv[0], int(argv[1]), int(argv[2])
    model = argv[3] if len(argv) > 3 else "identity"
    payload = np.random.default_rng(0).random(1 << 18, dtype=np.float32)
    for name, kind, port in (("HTTP", HttpClient, http_port), ("gRPC", GrpcClient, grpc_port)):
        client = kind(host, port, model, payload)
        client.check()
        t0 = time.perf_counter()
        client.infer()
        print(f"{name}: checked, {1e3 * (time.perf_counter() - t0):.2f} ms for 1 MiB in and out")
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
