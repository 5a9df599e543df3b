"""A raw-socket HTTP/2 client for the tests of flowserve's gRPC transport
(flowserve/frontends/grpc/http2.py): frames in and out, no client library in between, so a test
can send what no real client would (floods, bad lengths, resets, bombs) and see exactly what the
server answers. Shared by tests/conformance/test_grpc_http2.py, test_grpc_h2_hardening.py and
tests/reliability/test_h2_fuzz.py."""

from __future__ import annotations

import importlib
import pkgutil
import socket
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

import hpack
import pytest

from flowserve.frontends.grpc import h2
from flowserve.frontends.grpc.h2.connection import Connection
from flowserve.frontends.grpc.http2 import PREFACE, frame

__all__ = [
    "PREFACE", "FakeTransport", "Frame", "RawClient", "feed", "frame", "goaway_code", "grpc_message",
    "parse_frames", "request_headers", "rst_codes", "set_bound", "trailers", "unary",
]  # fmt: skip

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0, 1, 2, 3, 4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 5, 6, 7, 8, 9


# every module of the transport (a bound moved to a new module is still found)
H2_MODULES = tuple(
    importlib.import_module(f"{h2.__name__}.{info.name}") for info in pkgutil.iter_modules(h2.__path__)
)


def set_bound(monkeypatch: pytest.MonkeyPatch, name: str, value: object) -> None:
    """Set one of the transport's module-level names (a bound, a function) in every module of
    ``flowserve.frontends.grpc.h2`` that holds it (each reads its own copy)."""
    holders = [m for m in H2_MODULES if hasattr(m, name)]
    assert holders, f"no module of {h2.__name__} has {name}"
    for module in holders:
        monkeypatch.setattr(module, name, value)


class FakeTransport:
    """What a Connection writes, and nothing else (reads are fed by hand: :func:`feed`)."""

    def __init__(self) -> None:
        self.out = bytearray()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1234) if name == "peername" else default

    def write(self, data: bytes) -> None:
        self.out += data

    def writelines(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            self.out += piece

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def feed(conn: Connection, data: bytes) -> None:
    """``data`` as one read of the socket (several when it is larger than the read buffer)."""
    view = memoryview(data)
    while view:
        into = conn.get_buffer(-1)
        n = min(len(into), len(view))
        into[:n] = view[:n]
        conn.buffer_updated(n)
        view = view[n:]


class Blob:
    """A message that is its own bytes (the server only needs SerializeToString)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializeToString(self) -> bytes:  # noqa: N802 - protobuf's name
        return self.data


class Frame(NamedTuple):
    type: int
    flags: int
    sid: int
    payload: bytes


def parse_frames(data: bytes) -> list[Frame]:
    """The complete frames at the start of ``data``."""
    out, pos = [], 0
    while pos + 9 <= len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        if pos + 9 + length > len(data):
            break
        sid = int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
        out.append(Frame(data[pos + 3], data[pos + 4], sid, data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    return out


def request_headers(
    path: str, extra: Iterable[tuple[str, str]] = (), encoder: hpack.Encoder | None = None
) -> bytes:
    """A gRPC request's header block (a fresh encoder unless one is given: its dynamic table
    must then be the connection's)."""
    fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
              ("content-type", "application/grpc"), ("te", "trailers"), *extra]  # fmt: skip
    return bytes((encoder or hpack.Encoder()).encode(fields))


def grpc_message(payload: bytes, compressed: bool = False) -> bytes:
    return (b"\x01" if compressed else b"\x00") + len(payload).to_bytes(4, "big") + payload


def goaway_code(frames: Iterable[Frame]) -> int | None:
    """The error code of the first GOAWAY among ``frames``."""
    for f in frames:
        if f.type == GOAWAY:
            return int.from_bytes(f.payload[4:8], "big")
    return None


def rst_codes(frames: Iterable[Frame], sid: int) -> list[int]:
    return [int.from_bytes(f.payload, "big") for f in frames if f.type == RST_STREAM and f.sid == sid]


def trailers(frames: Iterable[Frame], sid: int) -> dict[str, str]:
    """The fields of the last header block (END_STREAM) of stream ``sid`` (response headers of
    this server are literals: a fresh decoder reads any block)."""
    fields: dict[str, str] = {}
    for f in frames:
        if f.type == HEADERS and f.sid == sid:
            fields.update((str(name), str(value)) for name, value in hpack.Decoder().decode(f.payload))
    return fields


class RawClient:
    """One connection: ``send`` bytes, ``read`` frames for a while, or ``until`` one arrives."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.data = b""
        self.closed = False  # the server closed (EOF or reset)

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def handshake(self, settings: bytes = b"") -> RawClient:
        self.send(PREFACE + frame(SETTINGS, 0, 0, settings))
        return self

    def send(self, data: bytes) -> bool:
        """Send ``data``; False when the server has closed the connection meanwhile."""
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            self._drain()  # what the server said before it closed (its GOAWAY) is still to read
            self.closed = True
            return False

    def _drain(self) -> None:
        """Read what the socket already holds (after a failed send: a reset ends the sending,
        not the reading of the bytes that arrived before it)."""
        self.sock.settimeout(0.2)
        try:
            while chunk := self.sock.recv(1 << 20):
                self.data += chunk
        except OSError:
            pass

    def _recv(self, deadline: float) -> bool:
        left = deadline - time.monotonic()
        if left <= 0 or self.closed:
            return False
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(1 << 20)
        except TimeoutError:
            return False
        except OSError:
            self.closed = True
            return False
        if not chunk:
            self.closed = True
            return False
        self.data += chunk
        return True

    def frames(self) -> list[Frame]:
        return parse_frames(self.data)

    def read(self, seconds: float) -> list[Frame]:
        """Every frame that arrives within ``seconds`` (or until the server closes)."""
        deadline = time.monotonic() + seconds
        while self._recv(deadline):
            pass
        return self.frames()

    def until(self, wanted: int, sid: int | None = None, seconds: float = 5.0, flags: int = 0) -> bool:
        """Read until a frame of type ``wanted`` (on ``sid``, with ``flags``) has arrived, the
        server closed, or ``seconds`` passed; whether it arrived."""
        deadline = time.monotonic() + seconds
        while True:
            if any(
                f.type == wanted and (sid is None or f.sid == sid) and f.flags & flags == flags
                for f in self.frames()
            ):
                return True
            if not self._recv(deadline):
                return any(
                    f.type == wanted and (sid is None or f.sid == sid) and f.flags & flags == flags
                    for f in self.frames()
                )

    def goaway(self, seconds: float = 5.0) -> int | None:
        """The code of the GOAWAY the server sends within ``seconds`` (None: none came)."""
        self.until(GOAWAY, seconds=seconds)
        return goaway_code(self.frames())

    def wait_closed(self, seconds: float = 5.0) -> bool:
        deadline = time.monotonic() + seconds
        while self._recv(deadline):
            pass
        return self.closed


def unary(port: int, path: str, payload: bytes, timeout: float = 5.0) -> tuple[dict[str, str], bytes, float]:
    """One gRPC call over a fresh raw connection: its trailers, its response DATA and the
    seconds it took (the good client beside an attack)."""
    start = time.monotonic()
    with RawClient(port, timeout) as client:
        client.handshake()
        client.send(
            frame(HEADERS, 0x4, 1, request_headers(path)) + frame(DATA, 0x1, 1, grpc_message(payload))
        )
        client.until(HEADERS, 1, timeout, flags=0x1)
        frames = client.frames()
    body = b"".join(f.payload for f in frames if f.type == DATA and f.sid == 1)
    return trailers(frames, 1), body, time.monotonic() - start
