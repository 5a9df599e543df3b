"""``--grpc-restricted-protocol``: each rpc's API category (``CATEGORIES``), and a server
interceptor refusing restricted rpcs that lack the header (metadata
``triton-grpc-protocol-<key>``) with UNAVAILABLE, as Triton does. Installed only when something
is restricted, so an unrestricted server pays nothing per call."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from flowserve.dataplane.access import Restrictions

# the restricted-API category of every rpc of inference.GRPCInferenceService
CATEGORIES: dict[str, str] = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory",
    "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
    "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory",
    "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}


def grpc_category(method: str) -> str | None:
    """The category of a gRPC method path (``/inference.GRPCInferenceService/ModelInfer``);
    every rpc of ``grpc.health.v1.Health`` is ``health``; None: no such rpc."""
    service, _, name = method.rpartition("/")
    if service.endswith("grpc.health.v1.Health"):
        return "health"
    return CATEGORIES.get(name)


class RestrictionInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, restrictions: Restrictions) -> None:
        self.restrictions = restrictions

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], handler_call_details: Any
    ) -> Any:
        metadata = {m.key: m.value for m in handler_call_details.invocation_metadata or ()}
        denial = self.restrictions.denial(grpc_category(handler_call_details.method), metadata.get)
        handler = await continuation(handler_call_details)
        if denial is None or handler is None:
            return handler
        return _refusing(handler, denial)


def _refusing(handler: Any, message: str) -> Any:
    """A handler of the same shape as ``handler`` that only aborts with ``message``."""
    if handler.request_streaming and handler.response_streaming:

        async def refuse_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
            await context.abort(grpc.StatusCode.UNAVAILABLE, message)
            yield  # pragma: no cover - abort raises

        return grpc.stream_stream_rpc_method_handler(
            refuse_stream, handler.request_deserializer, handler.response_serializer
        )

    async def refuse(request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)

    return grpc.unary_unary_rpc_method_handler(
        refuse, handler.request_deserializer, handler.response_serializer
    )
