"""The raw ASGI application: one small router by path split, one handler per endpoint.

No framework and no middleware: the hot path (``POST /v2/models/{m}/infer``) reads the body,
decodes the tensors straight into numpy, awaits the data plane and writes the encoded response.
Every error becomes ``{"error": "..."}`` with the status from :mod:`.errors`.

What a client can make the server hold or do, and its bound:

- a request body: at most ``limits.max_request_bytes`` (413, refused from Content-Length
  before anything is read, with ``Connection: close``). Bodies of ``guard.SMALL`` bytes or
  more also take their size from the server's :class:`~flowserve.dataplane.guard.ByteBudget`
  (``plane.guards.budget``) before they are read (chunked ones as they arrive, in doubling
  steps); what does not fit is refused with 503 and ``Connection: close``. The bytes are
  given back once, when the request's answer has been sent (or it failed, or the client
  left), so they cover the body and what is decoded from it (tensors are views of a binary
  body). Small requests take no part in this: one comparison on their path.
- a compressed body: inflated by :mod:`flowserve.dataplane.inflate` (as gRPC's are), in
  steps, at most ``inflate.INLINE`` bytes on the loop and the rest in a worker thread, never
  past the request limit (a JSON body: ``max_json_bytes``) nor past ``inflate.RATIO`` times
  its compressed size (413, naming the bound), its inflated bytes taken from the budget as
  they are produced (503 when they do not fit) and held until the answer is sent; then freed
  memory goes back to the system (``memory.trimmer``).
- a JSON body (all JSON: no Inference-Header-Content-Length) is held to ``max_json_bytes``
  as it arrives, chunked or not (413 as soon as it passes; nothing more is read).
- a JSON document: JSON becomes about ``JSON_EXPANSION`` times its size in Python objects, so
  JSON bodies (or the JSON header of a binary request) over ``max_json_bytes`` (default
  ``DEFAULT_MAX_JSON_BYTES``, 32 MiB, never more than the request limit) get 413 naming the
  binary tensor data extension, and those of SMALL bytes or more take ``JSON_EXPANSION`` times
  their size from the budget. Over ``JSON_IN_THREAD`` (1 MiB) a document is parsed in a
  worker thread, in chunks, so the GIL (and the event loop) is let go between chunks.
  Documents nested deeper than the parser allows (about 1000 levels, both parsers), or too
  deep for any later walk of them (``RecursionError``), are 400.
- a compressed response (Accept-Encoding) over ``INFLATE_IN_THREAD`` is compressed in a
  worker thread.
- a ``generate_stream``: cancelled as soon as its client disconnects, on either server (a
  task watches ``receive`` for ``http.disconnect``), which closes the plane's stream and with
  it the graph's work; a client that stops reading holds its own stream (the server's sends
  wait for the socket) and nothing else.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from flowserve.core.errors import (
    FlowserveError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unsupported,
)
from flowserve.core.types import InferRequest
from flowserve.dataplane.access import Restrictions
from flowserve.dataplane.cudashm import NO_CUDA_SHM
from flowserve.dataplane.guard import SMALL
from flowserve.dataplane.headers import forward_headers
from flowserve.dataplane.inflate import WBITS, Inflater, OverBudget, inflate
from flowserve.dataplane.memory import trimmer
from flowserve.dataplane.plane import DataPlane
from flowserve.frontends.http import jsonfmt
from flowserve.frontends.http.asgi import ASGIApp, Body, Headers, Receive, Scope, Send
from flowserve.frontends.http.errors import HttpStatusError, error_body, http_status
from flowserve.frontends.http.generate import (
    SSE_CONTENT_TYPE,
    generate_events,
    generate_one,
    generate_request,
    generate_response,
    parse_body,
)
from flowserve.frontends.http.infer import (
    TOO_DEEP,
    decode_request_off_loop,
    encode_response_off_loop,
    is_uint,
    parse_json,
    raw_request_off_loop,
)

log = logging.getLogger("flowserve.http")

_JSON = b"application/json"
_OCTET = b"application/octet-stream"
_JOIN_LIMIT = 1 << 20  # bodies above this go out in several chunks instead of one copy
_GZIP_WBITS = 16 + zlib.MAX_WBITS
INFLATE_IN_THREAD = 64 << 10  # responses to compress above this: a thread
JSON_IN_THREAD = 1 << 20  # JSON documents above this are parsed in a worker thread, in chunks
DEFAULT_MAX_JSON_BYTES = 32 << 20  # JSON bodies above this: 413 (use binary tensor data)
JSON_EXPANSION = 8  # a JSON body becomes about this many times its size in Python objects
_HELD = "flowserve.held_bytes"  # scope key: the bytes a request holds of the server's ByteBudget


class ClientGone(Exception):
    """The client disconnected before its request body arrived: nothing to answer."""


class BodyRefused(HttpStatusError):
    """A request refused before its body was read (over the size limit, or the server's
    budget of buffered request bytes is spent): answered with ``Connection: close``, so that
    the server does not read (or wait for) a body nobody will use."""


@dataclass(slots=True)
class Reply:
    status: int
    chunks: list[bytes | memoryview]  # memoryview: an output's own bytes (infer.raw_view)
    content_type: bytes = _JSON
    headers: Headers = field(default_factory=list)


@dataclass(slots=True)
class StreamReply:
    """A streamed answer: server-sent events, each chunk sent as it is produced, with the HTTP
    status the first one sets (200 when there is none)."""

    events: AsyncIterator[tuple[int, bytes]]


def json_reply(obj: Any, status: int = 200) -> Reply:
    return Reply(status, [jsonfmt.dumps(obj)])


@dataclass(slots=True)
class RequestHeaders:
    content_length: int | None = None
    header_length: int | None = None
    content_encoding: str = ""
    accept_encoding: str = ""


def read_headers(scope: Scope) -> RequestHeaders:
    out = RequestHeaders()
    for key, value in scope["headers"]:
        if key == b"content-length":
            out.content_length = _header_int(value, "Content-Length")
        elif key == b"inference-header-content-length":
            out.header_length = _header_int(value, "Inference-Header-Content-Length")
        elif key == b"content-encoding":
            out.content_encoding = value.decode("latin-1").strip().lower()
        elif key == b"accept-encoding":
            out.accept_encoding = value.decode("latin-1")
    return out


def _header_int(value: bytes, name: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise InvalidArgument(
            f"header {name} must be a non-negative integer, got {value.decode('latin-1')!r}"
        )
    return number


class HttpApp:
    """The ASGI 3 callable serving Triton's HTTP/REST protocol over a :class:`DataPlane`."""

    def __init__(
        self,
        plane: DataPlane,
        mounts: dict[str, ASGIApp] | None = None,
        restrictions: Restrictions | None = None,
        max_json_bytes: int | None = None,
    ) -> None:
        self.plane = plane
        # JSON bodies (or JSON headers of binary requests) over this are refused with 413;
        # None: DEFAULT_MAX_JSON_BYTES, and never more than the request size limit
        limit = plane.limits.max_request_bytes
        self.max_json_bytes = min(DEFAULT_MAX_JSON_BYTES if max_json_bytes is None else max_json_bytes, limit)
        # restricted API categories (--http-restricted-api); empty: nothing is checked
        self.restrictions = restrictions or Restrictions()
        prefixes = {p: p.rstrip("/") for p in mounts or {}}
        bad = [p for p, clean in prefixes.items() if not clean.startswith("/") or clean.startswith("/v2")]
        if bad:
            raise ValueError(f"mount prefixes must be paths like '/ui' outside '/v2', got {bad}")
        # longest prefix first, so "/ui/admin" wins over "/ui"
        self.mounts = sorted(
            ((prefixes[p], app) for p, app in (mounts or {}).items()), key=lambda m: -len(m[0])
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.restrictions and scope["type"] == "http":
            denial = self.restrictions.denial(category(scope), lambda name: _header(scope, name))
            if denial is not None:
                await _send(send, Reply(403, [error_body(denial)]))
                return
        if self.mounts:
            mounted = self._mounted(scope)
            if mounted is not None:
                prefix, app = mounted
                child = dict(scope)
                child["root_path"] = scope.get("root_path", "") + prefix
                await app(child, receive, send)
                return
        if scope["type"] != "http":
            return
        try:
            await self._serve(scope, receive, send)
        finally:
            held = scope.get(_HELD)  # set only for requests of SMALL bytes or more
            if held:
                scope[_HELD] = 0
                self.plane.guards.budget.give(held)
                trimmer.freed(held)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            reply = await self._route(scope, receive)
            if isinstance(reply, StreamReply):
                await _send_stream(send, receive, reply)
                return
        except ClientGone:
            return
        except FlowserveError as exc:
            reply = Reply(http_status(exc), [error_body(exc.message)])
            if isinstance(exc, BodyRefused):
                reply.headers.append((b"Connection", b"close"))
        except RecursionError:  # a document nested too deep for a recursive walk of it
            reply = Reply(400, [error_body(f"malformed request: {TOO_DEEP}")])
        except Exception as exc:
            log.exception("HTTP %s %s failed", scope["method"], scope["path"])
            reply = Reply(500, [error_body(f"internal error: {type(exc).__name__}: {exc}")])
        await _send(send, reply)

    def _mounted(self, scope: Scope) -> tuple[str, ASGIApp] | None:
        path: str = scope.get("path", "")
        for prefix, app in self.mounts:
            if path == prefix or path.startswith(prefix + "/"):
                return prefix, app
        return None

    # ------------------------------------------------------------------ routing

    async def _route(self, scope: Scope, receive: Receive) -> Reply | StreamReply:
        path: str = scope["path"]
        parts = path.rstrip("/").split("/")
        method: str = scope["method"]
        # the hot path first: /v2/models/{m}/infer
        if len(parts) == 5 and parts[4] == "infer" and parts[2] == "models" and parts[1] == "v2":
            _need(method, "POST", path)
            return await self._infer(parts[3], "", scope, receive)
        if len(parts) < 2 or parts[0] or parts[1] != "v2":
            raise NotFound(f"unknown route: {method} {path}")
        if len(parts) == 2:
            _need(method, "GET", path)
            return json_reply(self.plane.server_metadata())
        section = SECTIONS.get(parts[2])
        if section is None:
            raise NotFound(f"unknown route: {method} {path}")
        handler: _Section = getattr(self, section[0])
        return await handler(method, path, parts[3:], scope, receive)

    async def _health(self, method: str, path: str, rest: list[str], scope: Scope, receive: Receive) -> Reply:
        if len(rest) == 1 and rest[0] in ("live", "ready"):
            _need(method, "GET", path)
            ok = self.plane.live() if rest[0] == "live" else self.plane.ready()
            return Reply(200 if ok else 400, [])
        raise NotFound(f"unknown route: {method} {path}")

    async def _trace_setting(
        self, method: str, path: str, rest: list[str], scope: Scope, receive: Receive
    ) -> Reply:
        if rest == ["setting"]:
            return await self._trace(method, "", scope, receive)
        raise NotFound(f"unknown route: {method} {path}")

    async def _logging(
        self, method: str, path: str, rest: list[str], scope: Scope, receive: Receive
    ) -> Reply:
        if rest:
            raise NotFound(f"unknown route: {method} {path}")
        if method == "GET":
            return json_reply(self.plane.get_log_settings())
        _need(method, "POST", path)
        settings = await self._json_body(scope, receive, "log settings")
        return json_reply(await self.plane.set_log_settings(_object(settings, "log settings")))

    async def _models(
        self, method: str, path: str, rest: list[str], scope: Scope, receive: Receive
    ) -> Reply | StreamReply:
        if rest == ["stats"]:
            _need(method, "GET", path)
            return json_reply(await self.plane.server_statistics())
        if not rest or not rest[0]:
            raise NotFound(f"unknown route: {method} {path}")
        name, rest = rest[0], rest[1:]
        version = ""
        if len(rest) >= 2 and rest[0] == "versions":
            version, rest = rest[1], rest[2:]
        if len(rest) <= 1:
            action = MODEL_ACTIONS.get(rest[0] if rest else "")
            if action is not None:
                _need(method, action[0], path)
                handler: _Action = getattr(self, action[2])
                return await handler(name, version, scope, receive)
        if rest == ["trace", "setting"] and not version:
            return await self._trace(method, name, scope, receive)
        raise NotFound(f"unknown route: {method} {path}")

    async def _metadata(self, name: str, version: str, scope: Scope, receive: Receive) -> Reply:
        return json_reply(self.plane.model_metadata(name, version))

    async def _ready(self, name: str, version: str, scope: Scope, receive: Receive) -> Reply:
        return Reply(200 if self.plane.model_ready(name, version) else 400, [])

    async def _config(self, name: str, version: str, scope: Scope, receive: Receive) -> Reply:
        return json_reply(self.plane.model_config(name, version))

    async def _stats(self, name: str, version: str, scope: Scope, receive: Receive) -> Reply:
        return json_reply(await self.plane.server_statistics(name, version))

    async def _generate(self, name: str, version: str, scope: Scope, receive: Receive) -> Reply:
        request = await self._generate_request(name, version, scope, receive)
        return json_reply(generate_response(await generate_one(self.plane, request)))

    async def _generate_stream(self, name: str, version: str, scope: Scope, receive: Receive) -> StreamReply:
        request = await self._generate_request(name, version, scope, receive)
        # a request the model refuses is a JSON error, not an event (as Triton answers it)
        self.plane.check_request(request)
        return StreamReply(generate_events(self.plane, request))

    async def _generate_request(
        self, name: str, version: str, scope: Scope, receive: Receive
    ) -> InferRequest:
        headers = read_headers(scope)
        body = await self._body(headers, receive, scope, "generate request")
        if headers.content_encoding and headers.content_encoding != "identity":
            body = await self._inflate(body, headers.content_encoding, scope, json_only=True)
        if len(body) <= JSON_IN_THREAD:
            doc = parse_body(body)
        else:  # the standard library's parser: held to the budget, off the loop
            self._hold(scope, len(body) * JSON_EXPANSION)
            doc = await asyncio.to_thread(parse_body, body)
        del body
        request = generate_request(self.plane, name, version, doc)
        if "http" in self.plane.header_forward:
            forward_headers(request.parameters, scope["headers"], self.plane.header_forward["http"])
        request.peer = client_address(scope)
        return request

    # ------------------------------------------------------------------ inference

    async def _infer(self, model: str, version: str, scope: Scope, receive: Receive) -> Reply:
        headers = read_headers(scope)
        json_only = headers.header_length is None
        body = await self._body(headers, receive, scope, "inference request JSON" if json_only else None)
        if headers.content_encoding and headers.content_encoding != "identity":
            body = await self._inflate(body, headers.content_encoding, scope, json_only)
        plane = self.plane
        length = headers.header_length
        if length is None:
            doc = await self._parse_json(body, "inference request JSON", scope)
            del body  # the tensors decoded from a JSON body are copies
            request, plan = await decode_request_off_loop(plane, model, version, doc)
            del doc
        elif length == 0:
            request, plan = await raw_request_off_loop(plane, model, version, memoryview(body))
        else:
            if length > len(body):
                raise InvalidArgument(
                    f"Inference-Header-Content-Length is {length} but the request body has only "
                    f"{len(body)} bytes"
                )
            header = await self._parse_json(body[:length], "inference request JSON header", scope)
            binary = memoryview(body)[length:]
            request, plan = await decode_request_off_loop(plane, model, version, header, binary)
        if "http" in plane.header_forward:
            forward_headers(request.parameters, scope["headers"], plane.header_forward["http"])
        request.peer = client_address(scope)
        response = await plane.infer(request)
        encoded = await encode_response_off_loop(plane, response, plan)
        if encoded.blobs:
            extra = [(b"Inference-Header-Content-Length", str(len(encoded.header)).encode())]
            reply = Reply(200, [encoded.header, *encoded.blobs], _OCTET, extra)
        else:
            reply = Reply(200, [encoded.header])
        if headers.accept_encoding:
            if sum(len(c) for c in reply.chunks) <= INFLATE_IN_THREAD:
                _compress(reply, headers.accept_encoding)
            else:
                await asyncio.to_thread(_compress, reply, headers.accept_encoding)
        return reply

    # ------------------------------------------------------------------ repository

    async def _repository(
        self, method: str, path: str, rest: list[str], scope: Scope, receive: Receive
    ) -> Reply:
        # /v2/repository[/{repo}]/index and /v2/repository[/{repo}]/models/{m}/(load|unload);
        # the repository name is accepted and ignored (all repositories form one namespace)
        if rest and rest[-1] == "index" and len(rest) <= 2:
            _need(method, "POST", path)
            body = _object(await self._json_body(scope, receive, "repository index request"), "index request")
            ready = body.get("ready", False)
            if not isinstance(ready, bool):
                raise InvalidArgument("repository index: 'ready' must be a boolean")
            return json_reply(self.plane.repository_index(ready))
        if len(rest) in (3, 4) and rest[-3] == "models" and rest[-1] in ("load", "unload"):
            _need(method, "POST", path)
            name, action = rest[-2], rest[-1]
            body = _object(await self._json_body(scope, receive, f"{action} request"), f"{action} request")
            params = body.get("parameters", {})
            if not isinstance(params, dict):
                raise InvalidArgument(f"{action} of '{name}': 'parameters' must be an object")
            if action == "load":
                await self.plane.load(name, _load_parameters(name, params))
            else:
                dependents = params.get("unload_dependents", False)
                if not isinstance(dependents, bool):
                    raise InvalidArgument(f"unload of '{name}': 'unload_dependents' must be a boolean")
                await self.plane.unload(name, params)
            return Reply(200, [])
        raise NotFound(f"unknown route: {method} {path}")

    # ------------------------------------------------------------------ shared memory

    async def _system_shm(
        self, method: str, path: str, rest: list[str], scope: Scope, receive: Receive
    ) -> Reply:
        shm = self.plane.shm
        region = ""
        if len(rest) == 3 and rest[0] == "region":
            region, rest = rest[1], rest[2:]
        if len(rest) != 1:
            raise NotFound(f"unknown route: {method} {path}")
        action = rest[0]
        if action == "status":
            _need(method, "GET", path)
            return json_reply(shm.status(region))
        if action == "register" and region:
            _need(method, "POST", path)
            body = _object(await self._json_body(scope, receive, "register request"), "register request")
            key = body.get("key")
            offset = body.get("offset", 0)
            byte_size = body.get("byte_size")
            where = f"register of shared memory region '{region}'"
            if not isinstance(key, str):
                raise InvalidArgument(f"{where}: 'key' must be a string")
            if not is_uint(offset):
                raise InvalidArgument(f"{where}: 'offset' must be a non-negative integer")
            if not is_uint(byte_size):
                raise InvalidArgument(f"{where}: 'byte_size' must be a non-negative integer")
            await self.plane.register_shm(region, key, offset, byte_size)
            return Reply(200, [])
        if action == "unregister":
            _need(method, "POST", path)
            await self._body(read_headers(scope), receive, scope)
            await self.plane.unregister_shm(region)
            return Reply(200, [])
        raise NotFound(f"unknown route: {method} {path}")

    async def _cuda_shm(
        self, method: str, path: str, rest: list[str], scope: Scope, receive: Receive
    ) -> Reply:
        """CUDA shared memory (flowserve/dataplane/cudashm.py) where CUDA is present. Without
        it: registering is UNSUPPORTED; status lists no regions and unregistering is a no-op, so
        clients that clean up every kind (perf_analyzer) succeed."""
        cuda = self.plane.cuda_shm
        region = ""
        if len(rest) == 3 and rest[0] == "region":
            region, rest = rest[1], rest[2:]
        action = rest[0] if len(rest) == 1 else ""
        if action == "register" and region:
            _need(method, "POST", path)
            if not cuda.available:
                raise Unsupported(NO_CUDA_SHM)
            body = _object(await self._json_body(scope, receive, "register request"), "register request")
            handle, device_id, byte_size = _cuda_register_body(region, body)
            await self.plane.register_cuda_shm(region, handle, device_id, byte_size)
            return Reply(200, [])
        if action == "status":
            _need(method, "GET", path)
            return json_reply(cuda.status(region))
        if action == "unregister":
            _need(method, "POST", path)
            await self._body(read_headers(scope), receive, scope)
            await self.plane.unregister_cuda_shm(region)
            return Reply(200, [])
        raise NotFound(f"unknown route: {method} {path}")

    # ------------------------------------------------------------------ trace settings

    async def _trace(self, method: str, model: str, scope: Scope, receive: Receive) -> Reply:
        if method == "GET":
            return json_reply(self.plane.get_trace_settings(model))
        _need(method, "POST", scope["path"])
        settings = _object(await self._json_body(scope, receive, "trace settings"), "trace settings")
        return json_reply(await self.plane.set_trace_settings(settings, model))

    # ------------------------------------------------------------------ bodies

    async def _body(
        self, headers: RequestHeaders, receive: Receive, scope: Scope, json_what: str | None = None
    ) -> Body:
        """The whole request body. A declared size over the limit, or one that does not fit
        the server's budget of buffered request bytes, is refused before anything is read;
        a chunked body is counted against both as it arrives. ``json_what``: the body is all
        JSON (what it is, for messages), held to ``max_json_bytes`` (compressed or not: gzip
        never makes JSON larger), chunked or not."""
        limit = self.plane.limits.max_request_bytes if json_what is None else self.max_json_bytes
        declared = headers.content_length
        if declared is not None:
            if declared > limit:
                raise BodyRefused(413, self._too_big(declared, limit, json_what))
            if declared >= SMALL:
                self._hold(scope, declared, before_body=True)
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        body: Body = message.get("body", b"")
        size = len(body)
        if size > limit:
            raise BodyRefused(413, self._too_big(None, limit, json_what))
        held = declared if declared is not None else 0
        if size > held and size >= SMALL:  # no size declared (chunked), or more than declared
            held += self._hold(scope, max(size - held, held, SMALL), before_body=True)
        if not message.get("more_body", False):
            return body
        chunks = [body]
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:  # what arrived is dropped; the connection closes (BodyRefused)
                raise BodyRefused(413, self._too_big(None, limit, json_what))
            if size > held and size >= SMALL:  # at least doubled: a few budget calls per body
                held += self._hold(scope, max(size - held, held, SMALL), before_body=True)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _too_big(self, size: int | None, limit: int, json_what: str | None) -> str:
        """The 413 message for a body of ``size`` bytes (None: more than ``limit``)."""
        if json_what is not None:
            return self._json_refusal(size, json_what)
        shown = f" of {size} bytes" if size is not None else ""
        return f"request body{shown} exceeds the server's limit of {limit} bytes"

    def _hold(self, scope: Scope, size: int, before_body: bool = False) -> int:
        """Take ``size`` (>= SMALL) bytes of the server's budget for this request until its
        answer is sent (``__call__`` gives them back); 503 when they do not fit."""
        budget = self.plane.guards.budget
        if not budget.take(size):
            message = budget.refusal(size)
            raise BodyRefused(503, message) if before_body else HttpStatusError(503, message)
        scope[_HELD] = scope.get(_HELD, 0) + size
        return size

    async def _inflate(self, body: Body, encoding: str, scope: Scope, json_only: bool) -> bytes:
        """The decompressed body (:mod:`flowserve.dataplane.inflate`): never past the request
        limit (``json_only``: the JSON limit) nor ``RATIO`` times its size (413), its bytes
        taken from the budget as they are inflated (503 when they do not fit) and held until
        the answer is sent."""
        wbits = WBITS.get(encoding)
        if wbits is None:
            raise Unsupported(f"unsupported Content-Encoding '{encoding}' (supported: gzip, deflate)")
        if json_only:
            inflater = Inflater(body, wbits, self.max_json_bytes, self.plane.guards.budget,
                                limit_text=self._json_limit_text())  # fmt: skip
        else:
            inflater = Inflater(body, wbits, self.plane.limits.max_request_bytes, self.plane.guards.budget)
        try:
            out = await inflate(inflater)
        except OverBudget as exc:
            raise HttpStatusError(503, exc.message) from None
        held = inflater.detach()
        if held:
            scope[_HELD] = scope.get(_HELD, 0) + held
        return out

    async def _parse_json(self, data: Body, what: str, scope: Scope) -> Any:
        """A JSON document: parsed here when small; over JSON_IN_THREAD bytes refused over
        ``max_json_bytes``, its Python objects counted against the budget, and parsed in a
        worker thread in chunks."""
        size = len(data)
        if size <= JSON_IN_THREAD:
            return parse_json(data, what)
        if size > self.max_json_bytes:
            raise ResourceExhausted(self._json_refusal(size, what))
        self._hold(scope, size * JSON_EXPANSION)
        return await asyncio.to_thread(parse_json, data, what, True)

    def _json_refusal(self, size: int | None, what: str) -> str:
        """The 413 message for a JSON body of ``size`` bytes (None: more than the limit)."""
        shown = f"of {size} bytes " if size is not None else ""
        return f"{what} {shown}exceeds {self._json_limit_text()}"

    def _json_limit_text(self) -> str:
        return (
            f"the server's limit of {self.max_json_bytes} bytes for JSON (--http-max-json-bytes); "
            "send large tensors as binary data (the binary tensor data extension: "
            "'binary_data_size' and the Inference-Header-Content-Length header)"
        )

    async def _json_body(self, scope: Scope, receive: Receive, what: str) -> Any:
        headers = read_headers(scope)
        body = await self._body(headers, receive, scope, what)
        if headers.content_encoding and headers.content_encoding != "identity":
            body = await self._inflate(body, headers.content_encoding, scope, json_only=True)
        if jsonfmt.blank(body):
            return {}
        return await self._parse_json(body, what, scope)


# ------------------------------------------------------------------ the route table

_Section = Callable[[str, str, list[str], Scope, Receive], Awaitable[Reply | StreamReply]]
_Action = Callable[[str, str, Scope, Receive], Awaitable[Reply | StreamReply]]

# /v2/<section>/...: the HttpApp method that routes the rest, and the restricted-API category
# of the section ("" for models: decided by the model route, MODEL_ACTIONS); /v2 itself is
# metadata, and /v2/models/{m}[/versions/{v}]/trace/setting and any .../stats are trace and
# statistics. The router and ``category`` both read these tables.
SECTIONS: dict[str, tuple[str, str]] = {
    "models": ("_models", ""),
    "health": ("_health", "health"),
    "repository": ("_repository", "model-repository"),
    "systemsharedmemory": ("_system_shm", "shared-memory"),
    "cudasharedmemory": ("_cuda_shm", "shared-memory"),
    "trace": ("_trace_setting", "trace"),
    "logging": ("_logging", "logging"),
}
# /v2/models/{m}[/versions/{v}][/<action>]: (HTTP method, category, HttpApp method)
MODEL_ACTIONS: dict[str, tuple[str, str, str]] = {
    "": ("GET", "metadata", "_metadata"),
    "infer": ("POST", "inference", "_infer"),
    "ready": ("GET", "health", "_ready"),
    "config": ("GET", "model-config", "_config"),
    "stats": ("GET", "statistics", "_stats"),
    "generate": ("POST", "inference", "_generate"),
    "generate_stream": ("POST", "inference", "_generate_stream"),
}


def path_category(parts: list[str]) -> str | None:
    """The restricted-API category of a path split on '/' (``['', 'v2', ...]``), from the
    route table; None: no /v2 section (the router answers 404)."""
    if len(parts) < 2 or parts[0] or parts[1] != "v2":
        return None
    if len(parts) == 2:
        return "metadata"
    section = SECTIONS.get(parts[2])
    if section is None:
        return None
    if section[1]:
        return section[1]
    rest = parts[3:]
    if rest and rest[-1] == "stats":
        return "statistics"
    if rest[-2:] == ["trace", "setting"]:
        return "trace"
    action = MODEL_ACTIONS.get(rest[-1] if len(rest) in (2, 4) else "")
    return action[1] if action is not None else "metadata"


def category(scope: Scope) -> str | None:
    """The restricted-API category of a request; the mounted UI's trace endpoints are
    ``trace`` and the rest of it ``statistics`` (it shows models, graphs and their stats)."""
    path: str = scope["path"]
    if path.startswith("/v2"):
        return path_category(path.rstrip("/").split("/"))
    return "trace" if "/api/trace" in path else "statistics"


def _header(scope: Scope, name: str) -> str | None:
    wanted = name.encode("latin-1")
    for key, value in scope["headers"]:
        if key == wanted:
            return bytes(value).decode("latin-1")
    return None


def _need(method: str, wanted: str, path: str) -> None:
    if method != wanted:
        raise HttpStatusError(405, f"method {method} not allowed for {path}; use {wanted}")


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidArgument(f"{what}: the JSON body must be an object")
    return value


def _cuda_register_body(region: str, body: dict[str, Any]) -> tuple[bytes, int, int]:
    """A CUDA register request's raw handle (``{"raw_handle": {"b64": ...}}``), device id
    and byte size, each checked with an error naming the region."""
    where = f"register of CUDA shared memory region '{region}'"
    raw = body.get("raw_handle")
    encoded = raw.get("b64") if isinstance(raw, dict) else None
    if not isinstance(encoded, str):
        raise InvalidArgument(f"{where}: 'raw_handle' must be an object {{\"b64\": <base64 handle>}}")
    handle = _base64(encoded, f"{where}: 'raw_handle'")
    device_id = body.get("device_id", 0)
    byte_size = body.get("byte_size")
    if not is_uint(device_id):
        raise InvalidArgument(f"{where}: 'device_id' must be a non-negative integer")
    if not is_uint(byte_size):
        raise InvalidArgument(f"{where}: 'byte_size' must be a non-negative integer")
    return handle, device_id, byte_size


def _load_parameters(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """``config`` stays a JSON string (an object is accepted and serialised); ``file:<path>``
    values arrive base64-encoded and go to the plane as bytes."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key == "config" and isinstance(value, dict):
            value = jsonfmt.dumps(value).decode()
        elif key.startswith("file:"):
            if not isinstance(value, str):
                raise InvalidArgument(f"load of '{name}': '{key}' must be a base64 string")
            value = _base64(value, f"load of '{name}': '{key}'")
        out[key] = value
    return out


def _base64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument(f"{what} is not valid base64") from None


# ------------------------------------------------------------------ compression


def _accepted_encoding(accept: str) -> str:
    """gzip or deflate if the client accepts one (highest q wins, as Triton picks), else ''."""
    best, weight = "", 0.0
    for part in accept.split(","):
        token, _, params = part.strip().partition(";")
        token = token.strip().lower()
        q = 1.0
        params = params.strip()
        if params.startswith("q="):
            try:
                q = float(params[2:])
            except ValueError:
                continue
        if token in ("gzip", "deflate", "identity") and q > weight:
            best, weight = token, q
    return "" if best == "identity" else best


def _compress(reply: Reply, accept: str) -> None:
    encoding = _accepted_encoding(accept)
    if not encoding:
        return
    data = b"".join(reply.chunks)
    packer = zlib.compressobj(wbits=_GZIP_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    reply.chunks = [packer.compress(data) + packer.flush()]
    reply.headers.append((b"Content-Encoding", encoding.encode()))


# ------------------------------------------------------------------ sending


async def _send_stream(send: Send, receive: Receive, reply: StreamReply) -> None:
    """Send the events as they come, the answer's status being the first event's (Triton's
    generate_stream: a model whose first answer is an error sets the error's status); a client
    that goes away (``receive`` answers ``http.disconnect``, on either server) cancels the
    stream at once, which closes the event generator and with it the graph's work for this
    request."""
    pump = asyncio.ensure_future(_pump(send, reply.events))
    watch = asyncio.ensure_future(_until_disconnect(receive))
    try:
        await asyncio.wait((pump, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not pump.done():  # the client left (or this request is cancelled): stop the stream
            pump.cancel()
        await asyncio.wait((pump, watch))
    if not pump.cancelled():
        pump.result()  # what went wrong in it, if anything


_SSE_HEADERS: Headers = [(b"Content-Type", SSE_CONTENT_TYPE), (b"Cache-Control", b"no-cache")]


async def _pump(send: Send, events: AsyncIterator[tuple[int, bytes]]) -> None:
    started = False
    try:
        async for status, event in events:
            if not started:
                await send({"type": "http.response.start", "status": status, "headers": _SSE_HEADERS})
                started = True
            await send({"type": "http.response.body", "body": event, "more_body": True})
        if not started:  # no response at all (a decoupled model may send none)
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        await send({"type": "http.response.body", "body": b""})
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:  # stopped while sending: the generator waits at its yield
            with contextlib.suppress(Exception):
                await aclose()


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _send(send: Send, reply: Reply) -> None:
    chunks = reply.chunks
    size = sum(len(c) for c in chunks)
    headers: Headers = [(b"Content-Type", reply.content_type), (b"Content-Length", str(size).encode())]
    if reply.headers:
        headers.extend(reply.headers)
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    if len(chunks) <= 1 or size <= _JOIN_LIMIT:
        await send(
            {"type": "http.response.body", "body": b"".join(chunks) if len(chunks) != 1 else chunks[0]}
        )
        return
    last = len(chunks) - 1
    for i, chunk in enumerate(chunks):
        await send({"type": "http.response.body", "body": chunk, "more_body": i < last})


def client_address(scope: Scope) -> str:
    """The client's IP address (InferRequest.peer: a stateful model shares its sequence slots
    fairly between clients), "" when the server does not know it."""
    client = scope.get("client")
    return str(client[0]) if client else ""
