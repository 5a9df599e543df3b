"""gRPC front end: Triton's ``inference.GRPCInferenceService`` over the data plane.

::

    listener = await start_grpc(plane, "127.0.0.1", 8001)
    ...
    await listener.stop(grace_s=30)

Two transports serve the same servicer (``InferenceServicer``) and the same messages
(tritonclient's generated ones, so the wire format is exactly Triton's), both in the running
event loop: ``native`` (the default), flowserve's own HTTP/2 server for gRPC (``http2.py``,
about a tenth of grpcio's CPU per call, see there), and ``grpcio``, grpc's asyncio server
(``--grpc-server grpcio``). Both also serve ``grpc.health.v1.Health`` (``health.py``), and
both serve over TLS when given a :class:`GrpcTls` (``tls.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from flowserve.dataplane.access import Restrictions
from flowserve.dataplane.plane import DataPlane
from flowserve.frontends import GRPC_SERVERS
from flowserve.frontends.grpc import health, http2
from flowserve.frontends.grpc.access import RestrictionInterceptor, grpc_category
from flowserve.frontends.grpc.errors import STATUS, status_of
from flowserve.frontends.grpc.fields import guard_inference
from flowserve.frontends.grpc.http2 import (
    COMPRESSION_LEVELS,
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HANDSHAKE_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    Http2GrpcServer,
    ResponseCompression,
    service_methods,
)
from flowserve.frontends.grpc.service import InferenceServicer
from flowserve.frontends.grpc.tls import GrpcTls

__all__ = [
    "GRPC_SERVERS", "STATUS", "GrpcListener", "GrpcTls", "InferenceServicer", "start_grpc", "status_of",
]  # fmt: skip


SERVICE = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
# the rpcs whose responses --grpc-infer-response-compression-level compresses
INFER_METHODS = frozenset(f"/{SERVICE.full_name}/{name}" for name in ("ModelInfer", "ModelStreamInfer"))
# Largest message sent back (outputs can be bigger than the request that asked for them).
MAX_SEND_BYTES = 2**31 - 1


class GrpcListener:
    """A started gRPC server: its bound port, and a graceful stop."""

    def __init__(self, server: grpc.aio.Server | Http2GrpcServer, port: int) -> None:
        self.server = server
        self.port = port

    async def stop(self, grace_s: float) -> None:
        """Stop accepting calls; let in-flight ones finish for up to ``grace_s`` seconds."""
        await self.server.stop(grace_s)

    def __repr__(self) -> str:
        return f"GrpcListener(port={self.port})"


def server_options(
    max_request_bytes: int, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S, reuse_port: bool = False
) -> list[tuple[str, int]]:
    """grpcio's server options: the native transport's bounds where grpc has one (its C core
    also limits resets and control frames of its own accord)."""
    options = [
        ("grpc.max_receive_message_length", min(max_request_bytes, 2**31 - 1)),
        ("grpc.max_send_message_length", MAX_SEND_BYTES),
        # refuse to share a port with another process instead of silently splitting traffic,
        # unless the workers of one server share it (--workers N)
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        ("grpc.max_concurrent_streams", http2.MAX_STREAMS),
        ("grpc.max_metadata_size", http2.MAX_HEADER_LIST),
    ]
    if idle_timeout_s:
        options.append(("grpc.max_connection_idle_ms", int(idle_timeout_s * 1000)))
    return options


async def start_grpc(
    plane: DataPlane,
    host: str,
    port: int,
    restrictions: Restrictions | None = None,
    server: str = "native",
    tls: GrpcTls | None = None,
    response_compression: str = "none",
    *,
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    reuse_port: bool = False,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
) -> GrpcListener:
    """Serve ``plane`` on ``host:port`` (port 0: any free port; see ``listener.port``);
    ``restrictions``: rpc categories that need a header (``--grpc-restricted-protocol``);
    ``server``: ``native`` or ``grpcio`` (see the module docstring); ``tls``: serve over TLS
    (``--grpc-use-ssl``, see ``tls.py``); ``response_compression``: Triton's
    ``--grpc-infer-response-compression-level`` (none, low, medium, high): inference responses
    are compressed with gzip or deflate as the client accepts (grpcio: gzip at its own level,
    for every rpc); ``handshake_timeout_s``: a connection's TLS handshake, HTTP/2 preface and
    first SETTINGS must be done within it; ``idle_timeout_s``: a connection with no call for
    that long is closed (PINGs do not count); ``body_timeout_s``: a call whose request message
    makes no progress for that long ends DEADLINE_EXCEEDED (all three: the native transport; 0:
    no timeout; grpcio closes idle connections itself). The native
    transport also takes the plane's connection cap (``plane.guards.listener("grpc")``), its
    buffered-request budget (``plane.guards.budget``) and its budget of response bytes waiting
    for clients (``plane.guards.unsent``, ``--max-unsent-response-bytes``)."""
    if response_compression not in COMPRESSION_LEVELS:
        raise ValueError(
            f"unknown response compression level '{response_compression}' "
            f"(choose from {', '.join(COMPRESSION_LEVELS)})"
        )
    if server == "native":
        compression = ResponseCompression(COMPRESSION_LEVELS[response_compression], INFER_METHODS)
        return await _start_native(
            plane, host, port, restrictions, tls, compression, handshake_timeout_s, idle_timeout_s,
            reuse_port, body_timeout_s,
        )  # fmt: skip
    if server != "grpcio":
        raise ValueError(f"unknown gRPC server '{server}' (choose from {', '.join(GRPC_SERVERS)})")
    interceptors = [RestrictionInterceptor(restrictions)] if restrictions else None
    aio = grpc.aio.server(
        options=server_options(plane.limits.max_request_bytes, idle_timeout_s, reuse_port),
        interceptors=interceptors,
        compression=grpc.Compression.Gzip if response_compression != "none" else None,
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(plane), aio)
    aio.add_generic_rpc_handlers((health.grpcio_handler(health.HealthServicer(plane)),))
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = (
            aio.add_insecure_port(address) if tls is None else aio.add_secure_port(address, tls.credentials())
        )
    except RuntimeError as exc:
        await aio.stop(None)
        raise OSError(f"gRPC front end cannot listen on {address}: {exc}") from None
    if bound == 0:
        await aio.stop(None)
        raise OSError(f"gRPC front end cannot listen on {address}")
    await aio.start()
    return GrpcListener(aio, bound)


async def _start_native(
    plane: DataPlane,
    host: str,
    port: int,
    restrictions: Restrictions | None,
    tls: GrpcTls | None,
    compression: ResponseCompression,
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    reuse_port: bool = False,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
) -> GrpcListener:
    gate = None
    if restrictions:
        rules = restrictions

        def gate(path: str, header: Callable[[str], str | None]) -> str | None:
            return rules.denial(grpc_category(path), header)

    methods = service_methods(InferenceServicer(plane, wire_tail=True), SERVICE, service_pb2)
    guard_inference(methods, plane.limits.max_bytes_elements_per_request)  # fields, before parsing
    methods.update(health.native_methods(health.HealthServicer(plane)))
    native = Http2GrpcServer(
        methods,
        min(plane.limits.max_request_bytes, 2**31 - 1),
        gate,
        compression,
        guard=plane.guards.listener("grpc"),
        budget=plane.guards.budget,
        unsent=plane.guards.unsent,
        handshake_timeout_s=handshake_timeout_s,
        idle_timeout_s=idle_timeout_s,
        body_timeout_s=body_timeout_s,
    )
    try:
        bound = await native.start(host, port, tls.ssl_context() if tls is not None else None, reuse_port)
    except OSError as exc:
        raise OSError(f"gRPC front end cannot listen on {host}:{port}: {exc}") from None
    return GrpcListener(native, bound)
