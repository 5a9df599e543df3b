"""grpc.health.v1.Health on both gRPC transports: Check for the server, a model and an unknown
name; Watch following a model through an unload; the ``health`` restriction."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
import tritonclient.grpc as grpcclient

from flowserve.frontends.grpc.health import (
    SERVICE_UNKNOWN,
    SERVING,
    HealthCheckRequest,
    HealthCheckResponse,
)

pytestmark = pytest.mark.slow

PREFIX = "/grpc.health.v1.Health/"


def check(url: str, service: str, metadata: tuple[tuple[str, str], ...] = ()) -> int:
    with grpc.insecure_channel(url) as channel:
        call = channel.unary_unary(
            PREFIX + "Check",
            request_serializer=HealthCheckRequest.SerializeToString,
            response_deserializer=HealthCheckResponse.FromString,
        )
        return int(call(HealthCheckRequest(service=service), timeout=10, metadata=metadata).status)


def test_check_answers_for_the_server_and_its_models(server: Any) -> None:
    assert check(server.grpc_url, "") == SERVING
    assert check(server.grpc_url, "inference.GRPCInferenceService") == SERVING
    assert check(server.grpc_url, "simple") == SERVING
    assert check(server.grpc_url, "fanout") == SERVING  # a YAML graph
    with pytest.raises(grpc.RpcError) as info:
        check(server.grpc_url, "no_such_model")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "no_such_model" in str(info.value.details())


@pytest.mark.parametrize("transport", ["native", "grpcio"])
def test_watch_follows_a_model_through_unload_and_load(server_factory: Any, transport: str) -> None:
    proc = server_factory.start(
        f"--grpc-server={transport}", "--model-control-mode=explicit", "--load-model=simple"
    )
    assert check(proc.grpc_url, "") == SERVING
    with grpc.insecure_channel(proc.grpc_url) as channel:
        watch = channel.unary_stream(
            PREFIX + "Watch",
            request_serializer=HealthCheckRequest.SerializeToString,
            response_deserializer=HealthCheckResponse.FromString,
        )
        updates = watch(HealthCheckRequest(service="simple"), timeout=30)
        assert next(updates).status == SERVING
        with grpcclient.InferenceServerClient(proc.grpc_url) as client:
            client.unload_model("simple")
            assert next(updates).status == SERVICE_UNKNOWN  # not loaded: no such service now
            client.load_model("simple")
            assert next(updates).status == SERVING
        updates.cancel()


def test_health_can_be_restricted(server_factory: Any) -> None:
    proc = server_factory.start("--grpc-restricted-protocol=health:probe-key=ok")
    with pytest.raises(grpc.RpcError) as info:
        check(proc.grpc_url, "")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert check(proc.grpc_url, "", metadata=(("triton-grpc-protocol-probe-key", "ok"),)) == SERVING
