"""A real `flowserve serve` with the connection flags: --max-connections per listener (refused
connections closed at once and logged, the others keep serving), the gRPC handshake and idle
timeouts, the HTTP body timeout, and the series /metrics shows for them."""

from __future__ import annotations

import socket
import time
import urllib.request
from typing import Any

import pytest

pytestmark = pytest.mark.slow

FLAGS = (
    "--max-connections=4",
    "--grpc-handshake-timeout-secs=1",
    "--grpc-idle-timeout-secs=2",
    "--http-body-timeout-secs=1",
)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    return sock


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` (EOF or reset) within ``seconds``; what it sends first
    (a 408 or GOAWAY) is read and dropped."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:
            return True
    return False


def metric(port: int, name: str, listener: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(f'{name}{{listener="{listener}"}} '):
                return float(line.split()[-1])
    raise KeyError(f"{name} for listener {listener} not in /metrics")


def live(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=10) as reply:
        return int(reply.status)


def test_connection_cap_per_listener_is_logged_and_shown(rel: Any) -> None:
    proc = rel.start(*FLAGS, listeners="http,grpc,metrics")
    held = [connect(proc.http_port) for _ in range(4)]
    try:
        time.sleep(0.3)
        over = connect(proc.http_port)
        assert closed_within(over, 5), "a connection past --max-connections must be closed at once"
        over.close()
        assert metric(proc.metrics_port, "flowserve_connections_open", "http") == 4
        assert metric(proc.metrics_port, "flowserve_connections_refused", "http") >= 1
        # gRPC has its own cap: the HTTP connections do not count against it
        assert metric(proc.metrics_port, "flowserve_connections_open", "grpc") == 0
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 10
    while metric(proc.metrics_port, "flowserve_connections_open", "http") > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert live(proc.http_port) == 200  # a good client is served again at once
    assert "refused a connection" in proc.log() and "--max-connections 4" in proc.log()


def test_grpc_connections_that_never_handshake_or_go_idle_are_closed(rel: Any) -> None:
    proc = rel.start(*FLAGS, listeners="http,grpc")
    silent = connect(proc.grpc_port)  # TCP only: no preface
    try:
        assert closed_within(silent, 6), "a connection with no HTTP/2 preface must not live forever"
    finally:
        silent.close()
    idle = connect(proc.grpc_port)  # a proper preface and SETTINGS, then nothing
    try:
        idle.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        assert not closed_within(idle, 0.8), "a connection that did its handshake is not closed at once"
        assert closed_within(idle, 8), "an idle gRPC connection is closed past --grpc-idle-timeout-secs"
    finally:
        idle.close()


def test_http_body_that_stalls_gets_408(rel: Any) -> None:
    proc = rel.start(*FLAGS, listeners="http,grpc")
    sock = connect(proc.http_port)
    try:
        sock.sendall(
            b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"inputs": ['
        )
        sock.settimeout(8)
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408"), answer
    finally:
        sock.close()
    assert live(proc.http_port) == 200
