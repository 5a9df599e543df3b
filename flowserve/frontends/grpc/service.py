"""``inference.GRPCInferenceService``: every rpc translated to one data plane call.

Errors raised by the plane become the call's status through one table (errors.STATUS); on
the stream they become that message's ``error_message`` and the stream goes on.
"""

# ruff: noqa: N802  (rpc names are fixed by the protocol)

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote

import grpc
from tritonclient.grpc import service_pb2 as pb

from flowserve.core.errors import InvalidArgument, Unsupported
from flowserve.core.types import InferRequest
from flowserve.dataplane.cudashm import NO_CUDA_SHM
from flowserve.dataplane.headers import forward_headers, matching_headers
from flowserve.dataplane.plane import DataPlane
from flowserve.frontends.grpc import messages
from flowserve.frontends.grpc.codec import (
    ShmTarget,
    StreamWireResponse,
    WireResponse,
    decode_request,
    encode_response,
    encode_response_wire,
    encoded_one_by_one,
    one_by_one,
    params_to_dict,
    shm_targets,
)
from flowserve.frontends.grpc.errors import status_of

log = logging.getLogger("flowserve")

_S = TypeVar("_S", bound="InferenceServicer")
_Method = Callable[[_S, Any, Any], Awaitable[Any]]

# requests of one stream that may run at once; the reader waits when the window is full
STREAM_WINDOW = 256
# responses of one stream request that may wait for the ones before them to be sent
RESPONSES_AHEAD = 64
# request parameter asking for a final flag on responses, and that flag (Triton's names)
EMPTY_FINAL = "triton_enable_empty_final_response"
FINAL = "triton_final_response"
_END = object()
GRPC_ERROR = "triton_grpc_error"  # a stream request header: errors end the stream with their status
# a request with more elements than this to decode one by one (BYTES, typed contents), or a
# response with more BYTES elements, is decoded / encoded in a worker thread, off the event loop
ONE_BY_ONE_IN_THREAD = 1 << 16


@dataclass(frozen=True, slots=True)
class _Failed:
    """A stream request's error, with ``triton_grpc_error``: the stream ends with it."""

    code: grpc.StatusCode
    message: str


def rpc(method: _Method[_S]) -> _Method[_S]:
    """Run a unary rpc; an exception becomes the call's status (see errors.STATUS)."""

    @functools.wraps(method)
    async def call(self: _S, request: Any, context: Any) -> Any:
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            code, message = status_of(exc)
            await context.abort(code, message)

    return call


class InferenceServicer:
    """The servicer handed to ``add_GRPCInferenceServiceServicer_to_server``."""

    def __init__(self, plane: DataPlane, wire_tail: bool = False) -> None:
        """``wire_tail``: ModelInfer may answer a :class:`~.codec.WireResponse` (large raw
        outputs serialized by hand; the native transport only, which calls its
        ``SerializeToString``)."""
        self._plane = plane
        self._shm = plane.shm
        self._encode = encode_response_wire if wire_tail else encode_response

    # ------------------------------------------------------------ inference

    def _decode(self, msg: Any) -> tuple[InferRequest, dict[str, ShmTarget] | None]:
        try:
            request = decode_request(msg, self._shm, self._plane.limits)
            targets = shm_targets(msg) if msg.outputs else None
            if targets and self._shm.cuda_in_use:  # outputs into CUDA regions stay on the device
                request.keep_device = self._shm.on_device((n, t[0]) for n, t in targets.items())
        except InvalidArgument as exc:
            # an unknown model or version is reported as such, whatever its payload
            self._plane.model_config_proto(msg.model_name, msg.model_version)
            raise InvalidArgument(f"model '{msg.model_name}': {exc.message}") from None
        return request, targets

    async def _decode_off_loop(self, msg: Any) -> tuple[InferRequest, dict[str, ShmTarget] | None]:
        if one_by_one(msg) > ONE_BY_ONE_IN_THREAD:
            return await asyncio.to_thread(self._decode, msg)
        return self._decode(msg)

    async def _encode_off_loop(
        self, response: Any, targets: dict[str, ShmTarget] | None, encode: Any = encode_response
    ) -> Any:
        if encoded_one_by_one(response) > ONE_BY_ONE_IN_THREAD:
            return await asyncio.to_thread(encode, response, self._shm, targets)
        return encode(response, self._shm, targets)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        try:
            decoded, targets = await self._decode_off_loop(request)
            decoded.peer = peer_host(context)
            if "grpc" in self._plane.header_forward:
                metadata = context.invocation_metadata() or ()
                forward_headers(decoded.parameters, metadata, self._plane.header_forward["grpc"])
            response = await self._plane.infer(decoded)
            return await self._encode_off_loop(response, targets, self._encode)
        except Exception as exc:
            code, message = status_of(exc)
            await context.abort(code, message)

    async def ModelStreamInfer(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        """Requests of one stream run concurrently (up to STREAM_WINDOW at once); their
        responses go back in the order of the requests, each request's (one, or any number for
        a decoupled model) in its own order, as they are produced. An error becomes that
        request's ``error_message`` and the stream goes on; with the request header
        ``triton_grpc_error: true`` (Triton's), the first error ends the stream with its gRPC
        status instead."""
        metadata = context.invocation_metadata() or ()
        grpc_error = any(k == GRPC_ERROR and str(v).lower() == "true" for k, v in metadata)
        pattern = self._plane.header_forward.get("grpc")
        # the stream's metadata, forwarded to every request of it (as Triton does)
        forwarded = matching_headers(metadata, pattern) if pattern is not None else []
        peer = peer_host(context)
        window = asyncio.Semaphore(STREAM_WINDOW)
        pending: asyncio.Queue[asyncio.Queue[Any] | None] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()

        async def read() -> None:
            try:
                async for msg in request_iterator:
                    await window.acquire()
                    out: asyncio.Queue[Any] = asyncio.Queue(RESPONSES_AHEAD)
                    task = asyncio.create_task(self._stream_one(msg, out, grpc_error, peer, forwarded))
                    running.add(task)
                    task.add_done_callback(running.discard)
                    pending.put_nowait(out)
            finally:
                pending.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (out := await pending.get()) is not None:
                while (response := await out.get()) is not _END:
                    if isinstance(response, _Failed):
                        await context.abort(response.code, response.message)
                    yield response
                window.release()
            await reader
        finally:
            # the stream owns its tasks: none outlives it, and what failed in one is logged
            tasks = [reader, *running]
            for task in tasks:
                task.cancel()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            for outcome in outcomes[1:]:  # the reader's error, if any, ended the stream above
                if isinstance(outcome, Exception):
                    log.error("a stream request's task failed", exc_info=outcome)

    async def _stream_one(
        self,
        msg: Any,
        out: asyncio.Queue[Any],
        grpc_error: bool = False,
        peer: str = "",
        forwarded: list[tuple[str, str]] | None = None,
    ) -> None:
        """Every response to one stream request into ``out``, then _END (an error: a response
        carrying it, or with ``grpc_error`` a :class:`_Failed` that ends the stream).
        ``forwarded``: the stream's headers that become parameters of each of its requests."""
        try:
            request, targets = await self._decode_off_loop(msg)
            request.peer = peer
            if forwarded:
                parameters = request.parameters
                for name, value in forwarded:
                    parameters.setdefault(name, value)
            final_flag = request.parameters.get(EMPTY_FINAL) is True
            decoupled = final_flag and self._decoupled(request)
            async for response in self._plane.stream(request):
                encoded = await self._encode_off_loop(response, targets, self._encode)
                if isinstance(encoded, WireResponse):  # large outputs: written from their buffers
                    if final_flag:
                        encoded.head.parameters[FINAL].bool_param = not decoupled
                    await out.put(StreamWireResponse(encoded))
                    continue
                if final_flag:
                    encoded.parameters[FINAL].bool_param = not decoupled
                await out.put(pb.ModelStreamInferResponse(infer_response=encoded))
            if decoupled:
                # as Triton does for a decoupled model: the end is an empty, final response
                last = pb.ModelInferResponse(
                    model_name=msg.model_name, model_version=msg.model_version, id=msg.id
                )
                last.parameters[FINAL].bool_param = True
                await out.put(pb.ModelStreamInferResponse(infer_response=last))
        except Exception as exc:
            code, message = status_of(exc)
            if grpc_error:
                await out.put(_Failed(code, message))
                return
            echo = pb.ModelInferResponse(
                model_name=msg.model_name, model_version=msg.model_version, id=msg.id
            )
            await out.put(pb.ModelStreamInferResponse(error_message=message, infer_response=echo))
        await out.put(_END)

    def _decoupled(self, request: InferRequest) -> bool:
        """Whether the model may send any number of responses (then the stream ends each request
        with an empty final response)."""
        return self._plane.is_decoupled(request.model, request.version)

    # ------------------------------------------------------------ health and metadata

    @rpc
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=self._plane.live())

    @rpc
    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self._plane.ready())

    @rpc
    async def ModelReady(self, request: Any, context: Any) -> Any:
        return pb.ModelReadyResponse(ready=self._plane.model_ready(request.name, request.version))

    @rpc
    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return messages.server_metadata(self._plane.server_metadata())

    @rpc
    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        return messages.model_metadata(self._plane.model_metadata(request.name, request.version))

    @rpc
    async def ModelConfig(self, request: Any, context: Any) -> Any:
        return pb.ModelConfigResponse(config=self._plane.model_config_proto(request.name, request.version))

    @rpc
    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        return messages.statistics(await self._plane.server_statistics(request.name, request.version))

    # ------------------------------------------------------------ repository

    @rpc
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        return messages.repository_index(self._plane.repository_index(request.ready))

    @rpc
    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        await self._plane.load(request.model_name, params_to_dict(request.parameters))
        return pb.RepositoryModelLoadResponse()

    @rpc
    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        await self._plane.unload(request.model_name, params_to_dict(request.parameters))
        return pb.RepositoryModelUnloadResponse()

    # ------------------------------------------------------------ shared memory

    @rpc
    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        return messages.shm_status(self._shm.status(request.name))

    @rpc
    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        await self._plane.register_shm(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @rpc
    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        await self._plane.unregister_shm(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    # CUDA shared memory (flowserve/dataplane/cudashm.py) where CUDA is present. Without it,
    # as over HTTP: registering is UNSUPPORTED; status lists no regions (a named one is
    # NOT_FOUND) and unregistering is a no-op, so clients that clean up every kind of region
    # (perf_analyzer's UnregisterAllSharedMemory) succeed.

    @rpc
    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        return messages.cuda_shm_status(self._plane.cuda_shm.status(request.name))

    @rpc
    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        if not self._plane.cuda_shm.available:
            raise Unsupported(NO_CUDA_SHM)
        await self._plane.register_cuda_shm(
            request.name, bytes(request.raw_handle), int(request.device_id), int(request.byte_size)
        )
        return pb.CudaSharedMemoryRegisterResponse()

    @rpc
    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        await self._plane.unregister_cuda_shm(request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # ------------------------------------------------------------ trace and log settings

    @rpc
    async def TraceSetting(self, request: Any, context: Any) -> Any:
        plane = self._plane
        if request.settings:
            settings = await plane.set_trace_settings(
                messages.trace_request_settings(request), request.model_name
            )
        else:
            settings = plane.get_trace_settings(request.model_name)
        return messages.trace_settings(settings)

    @rpc
    async def LogSettings(self, request: Any, context: Any) -> Any:
        plane = self._plane
        if request.settings:
            settings = await plane.set_log_settings(messages.log_request_settings(request))
        else:
            settings = plane.get_log_settings()
        return messages.log_settings(settings)


def peer_host(context: Any) -> str:
    """The client's IP address (InferRequest.peer: a stateful model shares its sequence slots
    fairly between clients) from a call's ``peer()`` ("ipv4:1.2.3.4:5678", "ipv6:[::1]:5678",
    percent-encoded by grpcio); "" when unknown."""
    peer = getattr(context, "peer", None)
    text = unquote(peer()) if callable(peer) else ""
    kind, _, address = text.partition(":")
    if kind in ("ipv4", "ipv6"):
        return address.rpartition(":")[0].strip("[]")
    return text
