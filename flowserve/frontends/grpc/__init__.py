"""gRPC front end: Triton's ``inference.GRPCInferenceService`` over the data plane.

::

    listener = await start_grpc(plane, "127.0.0.1", 8001)
    ...
    await listener.stop(grace_s=30)

The server runs on grpc's asyncio API in the running event loop, with tritonclient's generated
stubs (so the wire format is exactly Triton's).
"""

from __future__ import annotations

import grpc
from tritonclient.grpc import service_pb2_grpc

from flowserve.dataplane.access import Restrictions
from flowserve.dataplane.plane import DataPlane
from flowserve.frontends.grpc.access import RestrictionInterceptor
from flowserve.frontends.grpc.errors import STATUS, status_of
from flowserve.frontends.grpc.service import InferenceServicer

__all__ = ["STATUS", "GrpcListener", "InferenceServicer", "start_grpc", "status_of"]

# Largest message sent back (outputs can be bigger than the request that asked for them).
MAX_SEND_BYTES = 2**31 - 1


class GrpcListener:
    """A started gRPC server: its bound port, and a graceful stop."""

    def __init__(self, server: grpc.aio.Server, port: int) -> None:
        self.server = server
        self.port = port

    async def stop(self, grace_s: float) -> None:
        """Stop accepting calls; let in-flight ones finish for up to ``grace_s`` seconds."""
        await self.server.stop(grace_s)

    def __repr__(self) -> str:
        return f"GrpcListener(port={self.port})"


def server_options(max_request_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", min(max_request_bytes, 2**31 - 1)),
        ("grpc.max_send_message_length", MAX_SEND_BYTES),
        # refuse to share a port with another process instead of silently splitting traffic
        ("grpc.so_reuseport", 0),
    ]


async def start_grpc(
    plane: DataPlane, host: str, port: int, restrictions: Restrictions | None = None
) -> GrpcListener:
    """Serve ``plane`` on ``host:port`` (port 0: any free port; see ``listener.port``);
    ``restrictions``: rpc categories that need a header (``--grpc-restricted-protocol``)."""
    interceptors = [RestrictionInterceptor(restrictions)] if restrictions else None
    server = grpc.aio.server(
        options=server_options(plane.limits.max_request_bytes), interceptors=interceptors
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(plane), server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        await server.stop(None)
        raise OSError(f"gRPC front end cannot listen on {address}: {exc}") from None
    if bound == 0:
        await server.stop(None)
        raise OSError(f"gRPC front end cannot listen on {address}")
    await server.start()
    return GrpcListener(server, bound)
