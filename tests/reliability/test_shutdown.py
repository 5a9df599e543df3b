"""Graceful shutdown of a real ``flowserve serve`` process: SIGTERM stops accepting at once (new
connections are refused on every port), in-flight requests finish, and the process exits 0; if
they take longer than --exit-timeout-secs they are cancelled and the process still exits 0,
even with a node thread that cannot be interrupted."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

pytestmark = pytest.mark.slow


def slow_body(seconds: float) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [seconds]}]}
    ).encode()


def refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True
    except ConnectionResetError:  # accepted into the backlog as the listener closed: ask again
        return False


def wait_refused(*ports: int, within: float = 3.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if all(refused(p) for p in ports):
            return True
        time.sleep(0.05)
    return False


def test_sigterm_finishes_in_flight_requests_then_exits_0(rel: Any) -> None:
    proc = rel.start("--exit-timeout-secs=20")
    results: dict[str, Any] = {}

    def http_call() -> None:
        results["http"] = rel.post(proc.http_port, "/v2/models/slow/infer", slow_body(2.0))

    def grpc_call() -> None:
        with grpc.insecure_channel(proc.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            msg = service_pb2.ModelInferRequest(model_name="add_sub")
            for name in ("INPUT0", "INPUT1"):
                msg.inputs.add(name=name, datatype="INT32", shape=[1, 16])
                msg.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
            time.sleep(1.0)  # sent while the server is draining: on an open channel, refused
            try:
                stub.ModelInfer(msg, timeout=10)
                results["grpc_late"] = "served"
            except grpc.RpcError as exc:
                results["grpc_late"] = exc.code()  # type: ignore[attr-defined]

    callers = [threading.Thread(target=http_call), threading.Thread(target=grpc_call)]
    for t in callers:
        t.start()
    time.sleep(0.5)  # the slow request is in flight
    started = time.monotonic()
    proc.process.send_signal(signal.SIGTERM)
    assert wait_refused(proc.http_port, proc.grpc_port), "still accepting connections after SIGTERM"
    for t in callers:
        t.join(30)
    assert proc.process.wait(20) == 0, proc.log()
    status, body = results["http"]
    assert status == 200 and body["outputs"][0]["data"] == [2.0], body
    assert results["grpc_late"] != "served"
    assert time.monotonic() - started < 10
    assert "shutting down" in proc.log() and "stopped" in proc.log()


def test_sigterm_deadline_expires_and_still_exits_0(rel: Any) -> None:
    """A request that outlives --exit-timeout-secs is cancelled; its node thread (sleeping for
    30 s) cannot be interrupted, and the process exits 0 anyway, well before the sleep ends."""
    proc = rel.start("--exit-timeout-secs=1")
    results: dict[str, Any] = {}

    def http_call() -> None:
        try:
            results["http"] = rel.post(proc.http_port, "/v2/models/slow/infer", slow_body(30.0), timeout=40)
        except OSError as exc:  # the connection is closed under it
            results["http"] = exc

    caller = threading.Thread(target=http_call)
    caller.start()
    time.sleep(0.5)
    started = time.monotonic()
    proc.process.send_signal(signal.SIGTERM)
    assert wait_refused(proc.http_port, proc.grpc_port)
    code = proc.process.wait(25)
    elapsed = time.monotonic() - started
    caller.join(40)
    assert code == 0, proc.log()
    assert elapsed < 15, elapsed
    assert not (isinstance(results["http"], tuple) and results["http"][0] == 200)
    assert "still busy" in proc.log()
