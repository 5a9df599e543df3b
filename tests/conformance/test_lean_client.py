"""benchmarks/lean_client.py, the equal-cost clients large_tensors.py --client lean measures
with, against a real server: each must get back exactly what it sent on both protocols, also when
the gRPC message is larger than the server's stream window (the client then waits on the
server's WINDOW_UPDATE frames), and report the server's refusal rather than a wrong answer."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.benchmark_module import load_benchmark

lean = load_benchmark("lean_client")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("elements", [1 << 10, (17 << 20) // 4])  # 4 KiB; 17 MiB > a 16 MiB window
def test_the_answer_is_the_request(server: Any, protocol: str, elements: int) -> None:
    x = np.random.default_rng(elements).random(elements, dtype=np.float32)
    kind, port = (
        (lean.HttpClient, server.http_port) if protocol == "http" else (lean.GrpcClient, server.grpc_port)
    )
    client = kind("127.0.0.1", port, "identity_fp32", x, shape=(1, elements))
    try:
        client.check()  # parsed in full (JSON header; protobuf) and compared
        for _ in range(3):  # the connection is reused; each answer lands in the same buffer
            y = np.frombuffer(client.infer(), np.float32)
            np.testing.assert_array_equal(y, x)
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("elements", [4, (17 << 20) // 4])  # a large one may be refused mid-send
def test_a_refusal_is_an_error_naming_the_model(server: Any, protocol: str, elements: int) -> None:
    kind, port = (
        (lean.HttpClient, server.http_port) if protocol == "http" else (lean.GrpcClient, server.grpc_port)
    )
    client = kind("127.0.0.1", port, "no_such_model", np.zeros(elements, np.float32))
    try:
        with pytest.raises(lean.ProtocolError, match="no_such_model"):
            client.infer()
    finally:
        client.close()
