"""``--grpc-restricted-protocol``: a server interceptor refusing restricted rpcs that lack the
header (metadata ``triton-grpc-protocol-<key>``) with UNAVAILABLE, as Triton does. Installed
only when something is restricted, so an unrestricted server pays nothing per call."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from flowserve.dataplane.access import Restrictions, grpc_category


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
