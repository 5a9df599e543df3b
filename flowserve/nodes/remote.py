"""Remote nodes: a graph step served by a model on another KServe V2 server (flowserve or
Triton), over gRPC (``grpc://host:port``) or HTTP (``http://host:port``), through tritonclient's
asyncio clients (a client library for calling out, not a serving stack: the front ends alone
serve)::

    nodes:
      net:
        remote: {urls: [grpc://gpu-a:8001, grpc://gpu-b:8001], model: resnet50, version: "1"}
        inputs: {input: pre.tensor}

**Load.** The node's signature is the remote model's metadata (its inputs and outputs, full
shapes), read when the graph compiles from the first endpoint that answers within
``timeout_s``, so declared types are checked against the remote like any step's. The query
blocks, so the repository compiles a graph with a remote node in a thread, off the event loop.
A remote that is down, or a model it does not serve, fails the graph's load with a reason naming
the node, the model and every endpoint, and marks the remote as not answering
(:func:`waiting_for_remote`): in poll mode the repository loads such a graph again at every poll,
so it becomes ready when the remote does; an explicit load (``POST
/v2/repository/models/NAME/load``) loads it once the remote answers. A node that declares every
output's type (``outputs: {y: {datatype: FP32, dims: [-1, 4]}}``) loads while the remote is
down, its signature taken from the declaration (inputs unchecked); its calls fail fast with
UNAVAILABLE until an endpoint answers ready.

**Calls.** One client per endpoint, made when the node starts and reused by every call, with at
most ``max_in_flight`` calls in flight on it (the rest wait, within their deadline). Tensors
travel binary (gRPC raw contents; HTTP's binary extension). A call goes to the ready endpoint
with the fewest calls in flight; an endpoint whose call fails at the transport (or answers
UNAVAILABLE) is marked down and the call fails over to the next ready one; a down endpoint is
skipped until the node's health probe (``is_model_ready`` every second) finds it ready again.
With no endpoint ready a call fails at once (UNAVAILABLE, naming the node, model and
endpoints), it never waits for one. What the request carries goes on (:func:`forwarded`): its
id, priority, sequence controls and custom parameters, and its deadline, both as the call's
timeout and as the remote request's ``timeout`` parameter (microseconds left);
``binary_data_output`` (this server's response encoding), ``headers`` and ``triton_*`` keys do
not. Its cancellation cancels the call (over gRPC the remote sees it; over HTTP the connection
is closed). Errors the remote answers keep their code (INVALID_ARG stays INVALID_ARG...) and
name the model and endpoint; the executor adds the graph and node. A trace gets one span per
remote call (graph ``remote:URL``, node: the model), inside the node's own span: the call's
time as this side sees it (V2 responses carry no server timings).

Not done: system shared memory when both ends share a host; decoupled (streaming) remote models.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

import numpy as np

from flowserve.core.clock import MONOTONIC, Clock
from flowserve.core.datatypes import DATATYPES, from_numpy
from flowserve.core.errors import (
    AlreadyExists,
    Cancelled,
    FlowserveError,
    InternalError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    Unsupported,
)
from flowserve.core.node import Context, Node, Span, TensorMap
from flowserve.graph.plan import Signature
from flowserve.spec.kinds import RemoteSpec, remote_spec
from flowserve.spec.schema import GraphSpec, NodeSpec, TensorSpec

log = logging.getLogger("flowserve")

PROBE_INTERVAL_S = 1.0

# tritonclient's gRPC status text (``str(grpc.StatusCode.X)``) and HTTP status -> the engine's errors
_GRPC_ERRORS: dict[str, type[FlowserveError]] = {
    "StatusCode.INVALID_ARGUMENT": InvalidArgument,
    "StatusCode.NOT_FOUND": NotFound,
    "StatusCode.UNAVAILABLE": Unavailable,
    "StatusCode.DEADLINE_EXCEEDED": Unavailable,
    "StatusCode.UNIMPLEMENTED": Unsupported,
    "StatusCode.ALREADY_EXISTS": AlreadyExists,
    "StatusCode.CANCELLED": Cancelled,
    "StatusCode.RESOURCE_EXHAUSTED": ResourceExhausted,
    "StatusCode.FAILED_PRECONDITION": InvalidArgument,
    "StatusCode.OUT_OF_RANGE": InvalidArgument,
}
_HTTP_ERRORS: dict[str, type[FlowserveError]] = {
    "400": InvalidArgument,
    "404": NotFound,
    "409": AlreadyExists,
    "413": ResourceExhausted,
    "429": ResourceExhausted,
    "499": Cancelled,
    "501": Unsupported,
    "503": Unavailable,
    "504": Unavailable,
}


def error_class(status: str | None) -> type[FlowserveError]:
    """The engine's error class for a tritonclient status (gRPC code text or HTTP status)."""
    status = status or ""
    return _GRPC_ERRORS.get(status) or _HTTP_ERRORS.get(status) or InternalError


# ----------------------------------------------------------------------------- load: the signature


@dataclass(frozen=True, slots=True)
class RemoteModel:
    """What the remote says about its model: metadata inputs/outputs and max_batch_size."""

    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    max_batch_size: int


def _tensors(raw: Any) -> dict[str, TensorSpec]:
    out = {}
    for item in raw or ():
        datatype = str(item.get("datatype", ""))
        if datatype not in DATATYPES:
            raise InvalidArgument(f"tensor '{item.get('name')}' has the unknown datatype {datatype!r}")
        out[str(item["name"])] = TensorSpec(str(item["name"]), datatype, tuple(int(d) for d in item["shape"]))
    return out


def _fetch_grpc(address: str, remote: RemoteSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    grpc_client = importlib.import_module("tritonclient.grpc")
    client = grpc_client.InferenceServerClient(address)
    try:
        meta = client.get_model_metadata(
            remote.model, remote.version, as_json=True, client_timeout=remote.timeout_s
        )
        config = client.get_model_config(
            remote.model, remote.version, as_json=True, client_timeout=remote.timeout_s
        )
        return dict(meta), dict(config.get("config", {}))
    finally:
        client.close()


def _http_get(url: str, timeout: float) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body: dict[str, Any] = json.loads(response.read() or b"{}")
            return body
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read() or b"{}").get("error", "") or exc.reason
        except ValueError:
            message = exc.reason
        raise error_class(str(exc.code))(str(message)) from None


def _fetch_http(address: str, remote: RemoteSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    base = f"http://{address}/v2/models/{urllib.parse.quote(remote.model)}"
    if remote.version:
        base += f"/versions/{remote.version}"
    meta = _http_get(base, remote.timeout_s)
    config = _http_get(f"{base}/config", remote.timeout_s)
    return meta, config


def fetch_model(url: str, remote: RemoteSpec) -> RemoteModel:
    """The remote model's metadata from one endpoint (blocking, at most ``timeout_s`` a query);
    raises a FlowserveError whose code is the remote's."""
    scheme, _, address = url.partition("://")
    try:
        meta, config = (_fetch_grpc if scheme == "grpc" else _fetch_http)(address, remote)
    except FlowserveError:
        raise
    except Exception as exc:  # tritonclient's InferenceServerException, OSError, timeouts
        status = _status(exc)
        raise (error_class(status) if status else Unavailable)(_message(exc)) from None
    return RemoteModel(
        _tensors(meta.get("inputs")), _tensors(meta.get("outputs")), int(config.get("max_batch_size", 0) or 0)
    )


# the remotes (endpoints, model, version) whose last metadata query failed on every endpoint,
# so that a graph which failed to load for want of one is loaded again by the next repository
# poll (``waiting_for_remote``); any thread may add or discard (a set's add is atomic)
_UNANSWERED: set[tuple[tuple[str, ...], str, str]] = set()


def _key(remote: RemoteSpec) -> tuple[tuple[str, ...], str, str]:
    return remote.urls, remote.model, remote.version


def has_remote_nodes(spec: GraphSpec) -> bool:
    """Whether loading ``spec`` queries a remote (so its compile may wait on the network)."""
    return any(node.kind == "remote" for node in spec.nodes.values())


def waiting_for_remote(spec: GraphSpec) -> bool:
    """Whether ``spec`` has a remote node whose remote did not answer its last metadata query
    (no endpoint reachable, or none serving the model): loading it again may now succeed."""
    return any(
        node.kind == "remote" and _key(remote_spec(node)) in _UNANSWERED for node in spec.nodes.values()
    )


def _declared(spec: NodeSpec) -> dict[str, TensorSpec] | None:
    """The node's ``outputs:`` when every one of them declares its type, else None."""
    if not spec.outputs or any(t is None for t in spec.outputs.values()):
        return None
    return {name: t for name, t in spec.outputs.items() if t is not None}


def remote_signature(spec: NodeSpec) -> Signature:
    """The node's signature from the remote model's metadata (see the module's docs)."""
    remote = remote_spec(spec)
    reasons = []
    for url in remote.urls:
        try:
            model = fetch_model(url, remote)
        except FlowserveError as exc:
            reasons.append(f"{url}: {exc.message}")
            continue
        outputs: dict[str, TensorSpec | None] = dict(model.outputs)
        for name, declared in spec.outputs.items():
            if name not in model.outputs:
                raise InvalidArgument(
                    f"{remote.where()} has no output '{name}' (it has {sorted(model.outputs)})"
                )
            if declared is not None and declared.datatype != model.outputs[name].datatype:
                raise InvalidArgument(
                    f"output '{name}' is declared {declared.datatype}, but {remote.where()} "
                    f"answers {model.outputs[name].datatype}"
                )
        _UNANSWERED.discard(_key(remote))
        return Signature(inputs=dict(model.inputs), outputs=outputs)
    complete = _declared(spec)
    if complete is not None:
        log.warning(
            "node '%s': %s does not answer (%s); loading with the declared outputs",
            spec.name,
            remote.where(),
            "; ".join(reasons),
        )
        return Signature(inputs=None, outputs=dict(complete))
    _UNANSWERED.add(_key(remote))
    raise Unavailable(
        f"{remote.where()} cannot be reached or has no such model ({'; '.join(reasons)}); the "
        "graph loads once it answers (in poll mode at the next poll, else when loaded again), or "
        "declare the node's outputs with their types to load while it is down"
    )


# ----------------------------------------------------------------------------- run time


class _Endpoint:
    """One remote server: its client (made in ``open``, reused by every call), the calls it
    has in flight (at most ``limit``), and whether it is ready (a failed call marks it down, the
    probe marks it ready again)."""

    def __init__(self, url: str, limit: int) -> None:
        self.url = url
        self.scheme, _, self.address = url.partition("://")
        self.limit = limit
        self.gate = asyncio.Semaphore(limit)
        self.in_flight = 0
        self.ready = True
        self.reason = ""
        self.client: Any = None
        self.lib: Any = None  # tritonclient.grpc or tritonclient.http (InferInput...)

    def open(self) -> None:
        if self.scheme == "grpc":
            self.lib = importlib.import_module("tritonclient.grpc")
            aio = importlib.import_module("tritonclient.grpc.aio")
            self.client = aio.InferenceServerClient(self.address, channel_args=_channel_args(self.lib))
        else:
            try:
                self.lib = importlib.import_module("tritonclient.http")
                aio = importlib.import_module("tritonclient.http.aio")
            except ImportError as exc:
                raise Unsupported(
                    f"{self.url}: an HTTP remote needs tritonclient[http] installed: {exc}"
                ) from None
            self.client = aio.InferenceServerClient(self.address, conn_limit=self.limit)

    async def close(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()
            self.client = None

    def down(self, reason: str) -> None:
        if self.ready:
            log.warning("remote endpoint %s is down: %s", self.url, reason)
        self.ready = False
        self.reason = reason


def _channel_args(lib: Any) -> list[tuple[str, Any]]:
    """tritonclient's channel defaults, plus a short reconnect back-off: a remote that comes back
    is found by the next probe, not after gRPC's back-off has grown to minutes."""
    keepalive = lib.KeepAliveOptions()
    return [
        ("grpc.max_send_message_length", lib.MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", lib.MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        # this node's own connections: a fresh node (a reload once the remote is back) must not
        # inherit another channel's connection that is still backing off after a failure
        ("grpc.use_local_subchannel_pool", 1),
    ]


def _status(exc: BaseException) -> str | None:
    status = getattr(exc, "status", None)
    return str(status()) if callable(status) and status() is not None else None


def _message(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    text = message() if callable(message) else str(exc)
    return str(text or type(exc).__name__)


def _transport_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says the endpoint, not the request, failed: no answer at all (connection
    refused or reset, a dead server) or UNAVAILABLE."""
    status = _status(exc)
    if status is None:
        return True  # not an answer of the server: aiohttp's connection errors, OSError
    return status in ("StatusCode.UNAVAILABLE", "503")


# request parameters a remote call sets from the request itself, never copied verbatim:
# sequence controls (infer()'s sequence arguments), priority and timeout (the request's own and
# its deadline left), headers; binary_data_output asks for this server's response encoding (a
# remote call always asks for binary), and the client refuses triton_* keys
_OWN_PARAMETERS = frozenset(
    ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers", "binary_data_output")
)


def forwarded(ctx: Context, timeout_s: float | None) -> dict[str, Any]:
    """The keyword arguments of a remote ``infer`` call that carry the request on: its custom
    parameters (str, int, float, bool; no ``triton_*`` key), sequence controls, priority, and the
    deadline left as the request's ``timeout`` in microseconds (at least 1)."""
    out: dict[str, Any] = {}
    params = ctx.parameters
    custom = {
        key: value
        for key, value in params.items()
        if key not in _OWN_PARAMETERS
        and not key.startswith("triton_")
        and isinstance(value, str | int | float)
    }
    if custom:
        out["parameters"] = custom
    sequence = params.get("sequence_id")
    if sequence not in (None, 0, "") and isinstance(sequence, str | int):
        out["sequence_id"] = sequence
        out["sequence_start"] = bool(params.get("sequence_start", False))
        out["sequence_end"] = bool(params.get("sequence_end", False))
    if ctx.priority:
        out["priority"] = ctx.priority
    if timeout_s is not None:
        out["timeout"] = max(1, int(timeout_s * 1e6))
    return out


class RemoteNode(Node):
    """Calls a model on other V2 servers (see the module's docs)."""

    def __init__(self, spec: NodeSpec, graph: str, outputs: list[str], clock: Clock = MONOTONIC) -> None:
        self.name = spec.name
        self.graph = graph
        self.remote = remote_spec(spec)
        self.outputs = outputs
        self.clock = clock
        self.endpoints = [_Endpoint(url, self.remote.max_in_flight) for url in self.remote.urls]
        self._probe: asyncio.Task[None] | None = None
        self._turn = 0

    async def start(self) -> None:
        for endpoint in self.endpoints:
            endpoint.open()
        self._probe = asyncio.create_task(self._probe_forever(), name=f"flowserve-remote-{self.name}")

    async def stop(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(BaseException):
                await self._probe
            self._probe = None
        for endpoint in self.endpoints:
            await endpoint.close()

    # ---------------------------------------------------------------- health

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(PROBE_INTERVAL_S)
            await asyncio.gather(*(self._check(e) for e in self.endpoints if not e.ready))

    async def _check(self, endpoint: _Endpoint) -> None:
        if endpoint.client is None:
            return
        try:
            async with asyncio.timeout(self.remote.timeout_s):
                ready = await endpoint.client.is_model_ready(self.remote.model, self.remote.version)
        except Exception as exc:  # still down
            endpoint.reason = _message(exc)
            return
        if ready:
            log.info("remote endpoint %s is ready again", endpoint.url)
            endpoint.ready = True
            endpoint.reason = ""

    def _order(self) -> list[_Endpoint]:
        """The ready endpoints, fewest calls in flight first (ties taken in turn)."""
        self._turn += 1
        n = len(self.endpoints)
        turned = [self.endpoints[(self._turn + i) % n] for i in range(n)]
        return sorted((e for e in turned if e.ready), key=lambda e: e.in_flight)

    def _unavailable(self, tried: list[str]) -> Unavailable:
        down = [f"{e.url}: {e.reason or 'down'}" for e in self.endpoints if not e.ready]
        return Unavailable(f"{self.remote.where()}: no endpoint is ready ({'; '.join(tried or down)})")

    # ---------------------------------------------------------------- calls

    async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
        tried: list[str] = []
        for endpoint in self._order():
            if not endpoint.ready:  # marked down by a concurrent call meanwhile
                continue
            try:
                return await self._call(endpoint, inputs, ctx)
            except _EndpointDown as exc:
                tried.append(f"{endpoint.url}: {exc}")
        raise self._unavailable(tried)

    def _timeout_s(self, ctx: Context) -> float | None:
        if ctx.deadline_ns is None:
            return None
        left = ctx.deadline_ns - self.clock.now_ns()
        if left <= 0:
            raise Unavailable(f"{self.remote.where()}: the request timed out before it was sent")
        return left / 1e9

    def _left_s(self, ctx: Context) -> float | None:
        if ctx.deadline_ns is None:
            return None
        return max(1e-6, (ctx.deadline_ns - self.clock.now_ns()) / 1e9)

    async def _call(self, endpoint: _Endpoint, inputs: TensorMap, ctx: Context) -> TensorMap:
        timeout = self._timeout_s(ctx)
        lib = endpoint.lib
        grpc = endpoint.scheme == "grpc"
        request = []
        for name, array in inputs.items():
            tensor = lib.InferInput(name, list(array.shape), from_numpy(array.dtype))
            if grpc:
                tensor.set_data_from_numpy(array)
            else:
                tensor.set_data_from_numpy(array, binary_data=True)
            request.append(tensor)
        wanted = [
            lib.InferRequestedOutput(name) if grpc else lib.InferRequestedOutput(name, binary_data=True)
            for name in self.outputs
        ]
        start = self.clock.now_ns()
        span = Span(f"remote:{endpoint.url}", self.remote.model, start) if ctx.trace is not None else None
        try:
            async with asyncio.timeout(timeout):
                async with endpoint.gate:
                    endpoint.in_flight += 1
                    try:
                        left = self._left_s(ctx)  # after the wait for a slot
                        extra = forwarded(ctx, left)
                        if grpc:
                            extra["client_timeout"] = left
                        result = await endpoint.client.infer(
                            self.remote.model,
                            request,
                            model_version=self.remote.version,
                            outputs=wanted,
                            request_id=ctx.request_id,
                            **extra,
                        )
                    finally:
                        endpoint.in_flight -= 1
        except TimeoutError:
            self._finish(span, ctx, "timed out")
            raise Unavailable(
                f"{self.remote.where()}: no answer from {endpoint.url} within the request's deadline"
            ) from None
        except asyncio.CancelledError:
            self._finish(span, ctx, "cancelled")
            raise
        except Exception as exc:
            message = _message(exc)
            self._finish(span, ctx, message)
            status = _status(exc)
            if status == "StatusCode.DEADLINE_EXCEEDED":
                raise Unavailable(
                    f"{self.remote.where()}: no answer from {endpoint.url} within the request's deadline"
                ) from None
            if _transport_failure(exc):
                endpoint.down(message)
                raise _EndpointDown(message) from None
            where = f"remote model '{self.remote.model}' at {endpoint.url}"
            raise error_class(status)(f"{where}: {message}") from None
        self._finish(span, ctx, None)
        outputs: TensorMap = {}
        for name in self.outputs:
            array = result.as_numpy(name)
            if array is None:
                raise InternalError(
                    f"remote model '{self.remote.model}' at {endpoint.url} returned no output '{name}'"
                )
            outputs[name] = np.asarray(array)
        return outputs

    def _finish(self, span: Span | None, ctx: Context, error: str | None) -> None:
        if span is not None and ctx.trace is not None:
            span.end_ns = self.clock.now_ns()
            span.error = error
            ctx.trace.append(span)


class _EndpointDown(Exception):
    """A call found its endpoint down: the caller tries the next one."""


__all__ = [
    "RemoteModel",
    "RemoteNode",
    "error_class",
    "fetch_model",
    "forwarded",
    "has_remote_nodes",
    "remote_signature",
    "waiting_for_remote",
]
