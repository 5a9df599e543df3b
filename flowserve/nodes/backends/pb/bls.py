"""BLS (business logic scripting): ``InferenceRequest(...).exec()`` / ``async_exec()`` run another
model or graph of the same engine; ``exec(decoupled=True)`` returns a :class:`ResponseIterator`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
from collections.abc import Awaitable
from typing import Any

from flowserve.core.device import tensor_map
from flowserve.core.node import TensorMap
from flowserve.nodes.backends.pb.errors import TritonError, TritonModelException
from flowserve.nodes.backends.pb.link import _NO_BLS, BlsCall, BlsLink, _local, current_link
from flowserve.nodes.backends.pb.responses import InferenceResponse, _error_response
from flowserve.nodes.backends.pb.tensor import Tensor


class BlsRequest:
    """The BLS half of ``InferenceRequest``: running a request built by model.py."""

    model_name: str
    _inputs: list[Tensor]
    _parameters: dict[str, Any]
    _id: str
    _version: int
    _timeout: int
    _requested: list[str]

    def _call(self) -> tuple[BlsLink, BlsCall]:
        if getattr(_local, "refuse_bls", False):
            raise TritonModelException(_NO_BLS)
        link = current_link()
        if link is None:
            raise TritonModelException(
                "InferenceRequest.exec(): BLS works only inside a model that a flowserve engine serves"
            )
        if not self.model_name:
            raise TritonModelException("InferenceRequest.exec(): model_name is required")
        version = "" if self._version is None or int(self._version) < 0 else str(self._version)
        # host tensors as numpy (views), GPU tensors as they are (the engine's nodes take them
        # or copy them, counted)
        inputs = tensor_map({t.name(): t._host() if t.is_cpu() else t._edge() for t in self._inputs})
        call = BlsCall(self.model_name, version, inputs, dict(self._parameters), self._id, self._timeout)
        return link, call

    def _response(self, outputs: TensorMap) -> InferenceResponse:
        wanted = self._requested
        names = [n for n in wanted if n in outputs] if wanted else list(outputs)
        return InferenceResponse(output_tensors=[Tensor(n, outputs[n]) for n in names])

    def exec(self, decoupled: bool = False) -> Any:
        """Run the request on the engine and wait; errors come back in the response. With
        ``decoupled=True``: a :class:`ResponseIterator` over every response of the model."""
        if decoupled:
            return self._stream()
        try:
            link, call = self._call()
        except TritonModelException as exc:
            if str(exc) == _NO_BLS:
                raise
            return _error_response(self.model_name, exc)
        try:
            return self._response(link.submit(call).result())
        except Exception as exc:
            return _error_response(self.model_name, exc)

    def _stream(self) -> ResponseIterator:
        try:
            link, call = self._call()
        except TritonModelException as exc:
            if str(exc) == _NO_BLS:
                raise
            return ResponseIterator(_error_response(self.model_name, exc))
        it = ResponseIterator(None)
        it._request = self
        try:
            it._future = link.stream(call, it._put)
        except Exception as exc:
            return ResponseIterator(_error_response(self.model_name, exc))
        it._future.add_done_callback(it._done)
        return it

    def async_exec(self, decoupled: bool = False) -> Awaitable[Any]:
        """Like :meth:`exec`, as an awaitable for ``async def execute``."""
        if decoupled:
            return _ready(self._stream())
        try:
            link, call = self._call()
            future = link.submit(call)
        except TritonModelException as exc:
            if str(exc) == _NO_BLS:
                raise
            return _ready(_error_response(self.model_name, exc))
        except Exception as exc:
            return _ready(_error_response(self.model_name, exc))

        async def wait() -> Any:
            try:
                return self._response(await asyncio.wrap_future(future))
            except Exception as exc:
                return _error_response(self.model_name, exc)

        return wait()


_END = object()


class ResponseIterator:
    """The responses of a BLS ``exec(decoupled=True)``, as they come: each is an
    :class:`InferenceResponse`, errors included; the last one is final (from a decoupled model
    that closed its stream with a bare final flag: an empty response). Iterating again after
    the end replays them; :meth:`cancel` asks the called model to stop."""

    def __init__(self, response: InferenceResponse | None) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._seen: list[InferenceResponse] = []
        self._finished = False
        self._index = 0
        self._request: BlsRequest | None = None
        self._future: concurrent.futures.Future[bool] | None = None
        if response is not None:
            self._queue.put(response)
            self._queue.put(_END)

    def _put(self, outputs: TensorMap) -> None:
        assert self._request is not None
        self._queue.put(self._request._response(outputs))

    def _done(self, future: concurrent.futures.Future[bool]) -> None:
        if future.cancelled():
            self._queue.put(
                InferenceResponse(error=TritonError("BLS request cancelled", TritonError.CANCELLED))
            )
        else:
            exc = future.exception()
            if exc is not None:
                model = self._request.model_name if self._request is not None else ""
                self._queue.put(_error_response(model, exc))
            elif future.result():
                self._queue.put(InferenceResponse())  # a decoupled model's bare final flag
        self._queue.put(_END)

    def __iter__(self) -> ResponseIterator:
        if self._finished and self._index >= len(self._seen):
            self._index = 0
        return self

    def __next__(self) -> InferenceResponse:
        if self._finished:
            if self._index < len(self._seen):
                self._index += 1
                return self._seen[self._index - 1]
            raise StopIteration
        item = self._queue.get()
        if item is _END:
            self._finished = True
            self._index = len(self._seen)
            raise StopIteration
        self._seen.append(item)
        return item  # type: ignore[no-any-return]

    def cancel(self) -> None:
        if self._future is not None:
            self._future.cancel()


async def _ready(value: Any) -> Any:
    return value
