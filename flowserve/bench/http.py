"""A lean HTTP/1.1 keep-alive client for load: each request is a prebuilt byte string (the
binary tensor extension, outputs asked as binary, as perf_analyzer sends them), each connection
an asyncio Protocol that finds the end of a response from its Content-Length and nothing more.

Nothing is parsed per request beyond the status line and that header, so the client costs
little of the CPU it shares with the server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.error
import urllib.request
from typing import Any, cast

from flowserve.bench.inputs import Sample
from flowserve.bench.model import ModelInfo, model_info
from flowserve.core.datatypes import from_numpy
from flowserve.core.wire import to_raw


class RequestFailed(Exception):
    """A request answered with an error; the message is the server's."""


def _get_json(url: str, timeout: float = 10.0) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return dict(json.loads(reply.read()))
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")
        with contextlib.suppress(ValueError, AttributeError):
            body = str(json.loads(body).get("error", body))
        raise RequestFailed(f"GET {url}: {exc.code} {body}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise RequestFailed(f"GET {url}: {getattr(exc, 'reason', exc)}") from None


def fetch_model(url: str, model: str, version: str = "") -> ModelInfo:
    base = f"http://{url}/v2/models/{model}" + (f"/versions/{version}" if version else "")
    return model_info(model, _get_json(base), _get_json(base + "/config"))


def encode_request(host: str, model: ModelInfo, sample: Sample, version: str = "") -> bytes:
    """The whole HTTP request (head and body) for one sample."""
    inputs = []
    blobs = []
    for name, array in sample.items():
        raw = to_raw(array)
        blobs.append(raw)
        inputs.append(
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": from_numpy(array.dtype),
                "parameters": {"binary_data_size": len(raw)},
            }
        )
    outputs = [{"name": n, "parameters": {"binary_data": True}} for n in model.outputs]
    header = json.dumps({"inputs": inputs, "outputs": outputs}, separators=(",", ":")).encode()
    body = header + b"".join(blobs)
    path = f"/v2/models/{model.name}" + (f"/versions/{version}" if version else "") + "/infer"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class _Connection(asyncio.Protocol):
    """One keep-alive connection with at most one request outstanding."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.need = -1  # bytes of the whole response, once its head is read
        self.body_at = 0
        self.status = 0
        self.waiter: asyncio.Future[None] | None = None
        self.lost: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no asyncio.Transport subclass

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = exc or ConnectionError("the server closed the connection")
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(RequestFailed(f"connection lost: {self.lost}"))

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        if self.need < 0:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buffer[:end]).lower()
            at = head.find(b"\r\ncontent-length:")
            if at < 0:
                self._finish(RequestFailed("response without Content-Length (chunked is not supported)"))
                return
            stop = head.find(b"\r\n", at + 2)
            self.status = int(head[9:12])
            self.body_at = end + 4
            self.need = self.body_at + int(head[at + 17 : stop if stop > 0 else len(head)])
        if len(buffer) >= self.need:
            error = None
            if self.status != 200:
                error = RequestFailed(_error_text(self.status, bytes(buffer[self.body_at : self.need])))
            del buffer[: self.need]
            self.need = -1
            self._finish(error)

    def _finish(self, error: BaseException | None) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

    def send(self, payload: bytes) -> asyncio.Future[None]:
        if self.lost is not None or self.transport is None:
            raise RequestFailed(f"connection lost: {self.lost}")
        waiter = self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return waiter


def _error_text(status: int, body: bytes) -> str:
    text = body.decode(errors="replace")
    with contextlib.suppress(ValueError, AttributeError):
        text = str(json.loads(text).get("error", text))
    return f"HTTP {status}: {text}"


class HttpSession:
    """One connection; ``send(i)`` sends payload ``i`` and waits for its response."""

    def __init__(self, connection: _Connection, payloads: list[bytes]) -> None:
        self.connection = connection
        self.payloads = payloads

    async def send(self, index: int) -> None:
        if self.connection.lost is not None:
            raise RequestFailed(f"connection lost: {self.connection.lost}")
        await self.connection.send(self.payloads[index])

    def close(self) -> None:
        if self.connection.transport is not None:
            self.connection.transport.close()


class HttpClient:
    """Sessions to ``url`` (host:port) for ``model``, each request one of ``samples``."""

    def __init__(self, url: str, model: ModelInfo, samples: list[Sample], version: str = "") -> None:
        self.host, _, port = url.rpartition(":")
        self.port = int(port)
        self.payloads = [encode_request(url, model, s, version) for s in samples]
        self.sessions: list[HttpSession] = []

    async def session(self) -> HttpSession:
        loop = asyncio.get_running_loop()
        try:
            _, connection = await loop.create_connection(_Connection, self.host, self.port)
        except OSError as exc:
            raise RequestFailed(f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}") from None
        session = HttpSession(connection, self.payloads)
        self.sessions.append(session)
        return session

    async def close(self) -> None:
        for session in self.sessions:
            session.close()
        self.sessions.clear()


__all__ = ["HttpClient", "HttpSession", "RequestFailed", "encode_request", "fetch_model"]
