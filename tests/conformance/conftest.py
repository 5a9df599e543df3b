"""Clients of the session ``server`` (tests/conftest.py) for the conformance suites.

``client`` is tritonclient's gRPC client in ``test_grpc_*`` modules and its HTTP client in
every other module; ``stub`` is the raw generated gRPC stub (messages a client would not send).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2_grpc


@pytest.fixture
def client(server: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.module.__name__.rpartition(".")[2].startswith("test_grpc_"):
        c: Any = grpcclient.InferenceServerClient(server.grpc_url)
    else:
        c = httpclient.InferenceServerClient(server.http_url)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def stub(server: Any) -> Iterator[Any]:
    channel = grpc.insecure_channel(server.grpc_url)
    try:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    finally:
        channel.close()
