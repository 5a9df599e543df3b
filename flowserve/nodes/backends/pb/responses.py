"""Responses: ``InferenceResponse`` and the ``InferenceResponseSender`` a request answers through."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import threading
from collections.abc import Callable
from typing import Any

from flowserve.core.errors import FlowserveError, InternalError, NodeError
from flowserve.nodes.backends.pb.errors import _CODES, TritonError, TritonModelException
from flowserve.nodes.backends.pb.flags import TRITONSERVER_RESPONSE_COMPLETE_FINAL
from flowserve.nodes.backends.pb.tensor import Tensor


class InferenceResponse:
    def __init__(
        self,
        output_tensors: list[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(
                f"InferenceResponse(error=...) must be a pb_utils.TritonError, got {type(error).__name__}"
            )
        self._outputs = list(output_tensors or [])
        self._error = error
        self._parameters = parameters

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        p = self._parameters
        return p if isinstance(p, str) else json.dumps(p or {})


# what a response sender hands on: a response (None: the final flag alone), or the error that
# ends the request (the server's: execute raised, or returned what it must not), and whether final
Deliver = Callable[[InferenceResponse | BaseException | None, bool], None]


class InferenceResponseSender:
    """Hands a model's responses to ``deliver(response, final)``, from any thread. A decoupled
    model sends any number, then the final flag; a non-decoupled one (``decoupled=False``)
    sends exactly one response, with the final flag."""

    def __init__(self, deliver: Deliver, decoupled: bool = True, model: str = "") -> None:
        self._deliver = deliver
        self._decoupled = decoupled
        self._model = model
        self._closed = False
        self._sent = 0
        self._lock = threading.Lock()
        self._cancelled: threading.Event | None = None  # made when first asked for (see cancelled)

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TypeError(f"send(): expected a pb_utils.InferenceResponse, got {type(response).__name__}")
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        with self._lock:
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if not self._decoupled:
                if response is not None and self._sent:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send more than one response."
                    )
                if final and response is None and not self._sent:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send complete final "
                        "before sending a response."
                    )
            if response is not None:
                self._sent += 1
            self._closed = final
        self._deliver(response, final)

    @property
    def cancelled(self) -> threading.Event:
        """Set by the server when nobody will read further responses (the client went away).
        Made on first use: most senders (every request of a non-decoupled model has one) are
        never asked, and an Event per request was a measurable share of a cheap model's call."""
        with self._lock:
            if self._cancelled is None:
                self._cancelled = threading.Event()
            return self._cancelled

    def is_cancelled(self) -> bool:
        event = self._cancelled
        return event is not None and event.is_set()

    @property
    def closed(self) -> bool:
        return self._closed

    def __del__(self) -> None:
        # the model let go of the sender before the final flag (its thread died, it forgot):
        # Triton's client would wait for ever; here the request ends with an error
        if not self._closed:
            self._closed = True
            with contextlib.suppress(Exception):  # nobody left to tell (a closed loop at shutdown)
                self._deliver(InternalError(_dropped(self._model)), True)

    def _close(self, error: BaseException | None = None) -> bool:
        """The server ends the request (no more sends: they raise "closed"), handing on
        ``error`` with the final flag when given; False when the model had already closed it."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
        if error is not None:
            self._deliver(error, True)
        return True


def _dropped(model: str) -> str:
    return (
        f"model '{model}' released a request's response sender without sending the final flag "
        "(send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)); the request ends here"
    )


def _error_response(model: str, exc: BaseException) -> InferenceResponse:
    """A BLS request's error as its response. An error raised before the model ran (an unknown
    model, inputs it refuses) reads as Triton words it: "Model <name> - Error when running
    inference: ..."; an error of the model's run reads as the model gave it."""
    if isinstance(exc, FlowserveError):
        message = exc.message
        if not isinstance(exc, NodeError):
            message = f"Model {model} - Error when running inference: {message}"
        return InferenceResponse(error=TritonError(message, _CODES.get(exc.code, TritonError.INTERNAL)))
    if isinstance(exc, TimeoutError | concurrent.futures.TimeoutError):
        return InferenceResponse(
            error=TritonError(f"BLS request to model '{model}' timed out", TritonError.UNAVAILABLE)
        )
    if isinstance(exc, concurrent.futures.CancelledError | asyncio.CancelledError):
        return InferenceResponse(
            error=TritonError(f"BLS request to model '{model}' cancelled", TritonError.CANCELLED)
        )
    if isinstance(exc, TritonModelException):
        return InferenceResponse(error=TritonError(exc.message()))
    return InferenceResponse(error=TritonError(f"Model {model} - Error when running inference: {exc}"))


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    for t in response.output_tensors():
        if t.name() == name:
            return t
    return None
