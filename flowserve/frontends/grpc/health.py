"""``grpc.health.v1.Health``: the standard gRPC health service (Kubernetes gRPC probes,
``grpc_health_probe``), as Triton serves it beside ``inference.GRPCInferenceService``.

``Check`` answers SERVING while the server is ready, else NOT_SERVING, for the service ``""``
(the server) and ``inference.GRPCInferenceService``; a model or graph name asks about that
model (SERVING while it is ready); any other name is NOT_FOUND, as the protocol says.
``Watch`` sends the status at once and again whenever it changes (looked at every
``WATCH_INTERVAL_S``).

The two messages are built from a descriptor here: the ``grpcio-health-checking`` wheels that
carry them generated want protobuf 7, which tritonclient's pin (protobuf < 7) rules out.
"""

# ruff: noqa: N802  (rpc names are fixed by the protocol)

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from flowserve.dataplane.plane import DataPlane

SERVICE_NAME = "grpc.health.v1.Health"
WATCH_INTERVAL_S = 0.5
UNKNOWN, SERVING, NOT_SERVING, SERVICE_UNKNOWN = 0, 1, 2, 3
_SERVER_NAMES = frozenset({"", "inference.GRPCInferenceService"})


def _message_classes() -> tuple[Any, Any]:
    proto = descriptor_pb2.FileDescriptorProto(
        name="flowserve/grpc/health/v1/health.proto", package="grpc.health.v1", syntax="proto3"
    )
    request = proto.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                      label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)  # fmt: skip
    response = proto.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for name, number in (("UNKNOWN", 0), ("SERVING", 1), ("NOT_SERVING", 2), ("SERVICE_UNKNOWN", 3)):
        status.value.add(name=name, number=number)
    response.field.add(name="status", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_ENUM,
                       type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus",
                       label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)  # fmt: skip
    pool = descriptor_pool.DescriptorPool()  # its own pool: no clash with a generated module
    pool.Add(proto)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("grpc.health.v1.HealthCheckRequest")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName("grpc.health.v1.HealthCheckResponse")),
    )


HealthCheckRequest, HealthCheckResponse = _message_classes()


class HealthServicer:
    def __init__(self, plane: DataPlane) -> None:
        self._plane = plane

    def status(self, service: str) -> int | None:
        """The service's status; None when there is no such service."""
        plane = self._plane
        if service in _SERVER_NAMES:
            return SERVING if plane.ready() else NOT_SERVING
        if plane.has_model(service):
            return SERVING if plane.ready() and plane.model_ready(service) else NOT_SERVING
        return None

    async def Check(self, request: Any, context: Any) -> Any:
        status = self.status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service '{request.service}'")
        return HealthCheckResponse(status=status)

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        last = -1
        while True:
            status = self.status(request.service)
            now = SERVICE_UNKNOWN if status is None else status
            if now != last:
                last = now
                yield HealthCheckResponse(status=now)
            await asyncio.sleep(WATCH_INTERVAL_S)


def native_methods(servicer: HealthServicer) -> dict[str, Any]:
    """The two rpcs for the native transport (``http2.Method`` by path)."""
    from flowserve.frontends.grpc.http2 import Method

    async def watch(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        async for request in requests:  # a server-streaming rpc: one request
            async for response in servicer.Watch(request, context):
                yield response
            return

    prefix = f"/{SERVICE_NAME}/"
    return {
        prefix + "Check": Method(parse=HealthCheckRequest.FromString, unary=servicer.Check),
        prefix + "Watch": Method(parse=HealthCheckRequest.FromString, streaming=watch),
    }


def grpcio_handler(servicer: HealthServicer) -> grpc.GenericRpcHandler:
    """The service for grpcio's server."""
    parse, dump = HealthCheckRequest.FromString, HealthCheckResponse.SerializeToString
    return grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            "Check": grpc.unary_unary_rpc_method_handler(servicer.Check, parse, dump),
            "Watch": grpc.unary_stream_rpc_method_handler(servicer.Watch, parse, dump),
        },
    )
