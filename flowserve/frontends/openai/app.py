"""The OpenAI-compatible routes as one raw ASGI callable over the data plane (no framework on the
request path). Streams are server-sent events; a client that goes away cancels its requests'
work in the graph at once (the plane's stream is closed, which cancels the generation)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import numpy as np

from flowserve.core.errors import InvalidArgument, NotFound
from flowserve.dataplane.plane import DataPlane
from flowserve.frontends.openai import translate as tr

log = logging.getLogger("flowserve.openai")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY = 4 * 1024 * 1024
JSON = [(b"content-type", b"application/json")]
SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class _Disconnected(Exception):
    pass


class OpenAIApp:
    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"].rstrip("/"), scope["method"]
        try:
            if path == "/v1/models" and method == "GET":
                await _json(send, 200, self.models())
            elif path.startswith("/v1/models/") and method == "GET":
                await _json(send, 200, self.model(path[len("/v1/models/") :]))
            elif path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
                body = await _body(receive)
                req = tr.read_completion(body, chat=path.endswith("chat/completions"))
                if req.stream:
                    await self.stream(req, receive, send)
                else:
                    await _json(send, 200, await self.complete(req))
            elif path == "/v1/embeddings" and method == "POST":
                await _json(send, 200, await self.embed(await _body(receive)))
            else:
                raise NotFound(f"no route {method} {scope['path']}")
        except _Disconnected:
            return
        except Exception as exc:
            status, doc = tr.error_object(exc)
            if status >= 500:
                log.warning("OpenAI request failed: %s", doc["error"]["message"])
            with contextlib.suppress(Exception):
                await _json(send, status, doc)

    # --- routes ---

    def _generation_models(self) -> list[str]:
        names = []
        for entry in self.plane.repository_index(ready_only=True):
            name = entry["name"]
            with contextlib.suppress(Exception):
                inputs = {t["name"] for t in self.plane.model_metadata(name)["inputs"]}
                if "text_input" in inputs:
                    names.append(name)
        return sorted(set(names))

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(n) for n in self._generation_models()]}

    def model(self, name: str) -> dict[str, Any]:
        if not self.plane.model_ready(name):
            raise NotFound(f"model '{name}' is not ready or does not exist")
        return _model_card(name)

    def _inputs(self, model: str) -> list[str]:
        if not self.plane.model_ready(model):
            raise NotFound(f"model '{model}' is not ready or does not exist")
        return [t["name"] for t in self.plane.model_metadata(model)["inputs"]]

    async def _choice(self, req: tr.Completion, inputs: list[str], index: int) -> AsyncIterator[tr.Piece]:
        async for response in self.plane.stream(tr.plane_request(req, inputs, index)):
            yield tr.piece(response)

    async def complete(self, req: tr.Completion) -> dict[str, Any]:
        inputs = self._inputs(req.model)

        async def one(index: int) -> tr.Choice:
            choice = tr.Choice()
            async for p in self._choice(req, inputs, index):
                choice.add(p)
            return choice

        choices = await asyncio.gather(*(one(i) for i in range(req.n)))
        return tr.completion_object(req, choices)

    async def stream(self, req: tr.Completion, receive: Receive, send: Send) -> None:
        inputs = self._inputs(req.model)
        tr.plane_request(req, inputs)  # refuse a model that cannot serve it before the 200
        # one queue for the choices' pieces, their ends (None), errors and the client's going away
        chunks: asyncio.Queue[tuple[int, tr.Piece | None] | BaseException | None] = asyncio.Queue()
        choices = [tr.Choice() for _ in range(req.n)]

        async def run(index: int) -> None:
            try:
                async for p in self._choice(req, inputs, index):
                    chunks.put_nowait((index, p))
            except Exception as exc:
                chunks.put_nowait(exc)
            finally:
                chunks.put_nowait(None)

        async def watch_client() -> None:
            await _wait_disconnect(receive)
            chunks.put_nowait(_Disconnected())

        tasks = [asyncio.ensure_future(run(i)) for i in range(req.n)]
        watch = asyncio.ensure_future(watch_client())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": SSE})
            if req.chat:
                for i in range(req.n):
                    await _event(send, tr.chunk_object(req, i, None, first=True))
            running = req.n
            while running:
                item = await chunks.get()
                if isinstance(item, _Disconnected):
                    return  # the client went away: the finally cancels the work
                if item is None:
                    running -= 1
                elif isinstance(item, BaseException):
                    _, doc = tr.error_object(item)
                    await _event(send, doc)
                    break
                else:
                    index, p = item
                    assert p is not None
                    offset = len(choices[index].text)
                    choices[index].add(p)
                    if p.text or p.finish_reason:
                        await _event(send, tr.chunk_object(req, index, p, first=False, offset=offset))
            else:
                if req.include_usage:
                    await _event(send, tr.usage_chunk(req, choices))
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        finally:
            for task in (*tasks, watch):
                task.cancel()
            await asyncio.gather(*tasks, watch, return_exceptions=True)

    async def embed(self, body: Any) -> dict[str, Any]:
        model, texts, encoding = tr.read_embeddings(body)
        if not self.plane.model_ready(model):
            raise NotFound(f"model '{model}' is not ready or does not exist")
        meta = self.plane.model_metadata(model)
        vectors: list[np.ndarray] = []
        for text in texts:
            request, output = tr.embedding_request(model, text, meta)
            response = await self.plane.infer(request)
            vector = response.outputs.get(output)
            if vector is None:
                raise InvalidArgument(f"model '{model}' did not return output '{output}'")
            vectors.append(np.asarray(vector))
        return tr.embedding_object(model, vectors, sum(len(t.split()) for t in texts), encoding)


def _model_card(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "flowserve"}


async def _body(receive: Receive) -> Any:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise InvalidArgument(f"the request body is larger than {MAX_BODY} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    try:
        return json.loads(b"".join(chunks) or b"null")
    except ValueError as exc:
        raise InvalidArgument(f"the request body is not valid JSON: {exc}") from None


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _json(send: Send, status: int, doc: Any) -> None:
    body = json.dumps(doc).encode()
    await send({"type": "http.response.start", "status": status, "headers": JSON})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _event(send: Send, doc: Any) -> None:
    await send(
        {
            "type": "http.response.body",
            "body": b"data: " + json.dumps(doc).encode() + b"\n\n",
            "more_body": True,
        }
    )


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
