"""``InferenceRequest``: what ``execute`` receives, or what model.py builds for BLS (see :mod:`.bls`)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from flowserve.core.node import Context, TensorMap
from flowserve.nodes.backends.pb.bls import BlsRequest
from flowserve.nodes.backends.pb.errors import TritonModelException
from flowserve.nodes.backends.pb.flags import (
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
)
from flowserve.nodes.backends.pb.responses import Deliver, InferenceResponseSender
from flowserve.nodes.backends.pb.tensor import PreferredMemory, Tensor


class InferenceTrace:
    """A request's trace handle; flowserve hands no OpenTelemetry context to model.py."""

    def __init__(self, context: str | None = None) -> None:
        self._context = context

    def get_context(self) -> str | None:
        return self._context or None


_NO_TRACE = InferenceTrace()  # what every request the server hands to execute() carries


class _Required:
    def __repr__(self) -> str:
        return "<required>"


_REQUIRED: Any = _Required()


class InferenceRequest(BlsRequest):
    """A request: handed to ``execute`` by the backend, or built by model.py for BLS.

    The arguments are Triton's (``inputs``, ``requested_output_names`` and ``model_name`` are
    required: leaving one out raises TypeError); ``timeout`` is in microseconds."""

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] = _REQUIRED,
        requested_output_names: list[str] = _REQUIRED,
        model_name: str | bytes = _REQUIRED,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        missing = [
            n
            for n, v in (
                ("inputs", inputs),
                ("requested_output_names", requested_output_names),
                ("model_name", model_name),
            )
            if v is _REQUIRED
        ]
        if missing:
            raise TypeError(f"InferenceRequest(): missing required argument(s): {', '.join(missing)}")
        if not isinstance(correlation_id, int | str):
            raise TritonModelException("Correlation ID must be integer or string")
        if isinstance(model_name, bytes):
            model_name = model_name.decode()
        self.model_name: str = model_name
        for name in requested_output_names:
            if name == "":
                raise TritonModelException(
                    f"Requested output name for request with id '{request_id}' and model name "
                    f"'{model_name}' should not be empty."
                )
        self._inputs = list(inputs)
        self._by_name = {t.name(): t for t in self._inputs}
        self._id = request_id
        self._correlation_id = correlation_id
        self._version = model_version
        self._flags = int(flags)
        self._timeout = int(timeout)
        self._preferred_memory = preferred_memory
        self._trace = trace or InferenceTrace()
        if isinstance(parameters, str):
            parameters = json.loads(parameters) if parameters else {}
        for key, value in (parameters or {}).items():
            if not isinstance(key, str) or not isinstance(value, bool | int | str):
                raise TritonModelException(
                    "Expect parameters keys to have type str and values to have type bool, int or str, "
                    f"found {key!r}: {value!r}"
                )
        self._parameters: dict[str, Any] = dict(parameters or {})
        self._requested = list(requested_output_names)
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    @classmethod
    def _incoming(
        cls,
        model_name: str,
        inputs: TensorMap,
        model_version: int,
        request_id: str = "",
        parameters: dict[str, Any] | None = None,
        correlation_id: int | str = 0,
        flags: int = 0,
        context: Context | None = None,
        device_inputs: bool = False,
    ) -> InferenceRequest:
        """A request handed to model.py's ``execute``; ``context`` says when it was cancelled.
        ``device_inputs`` (``FORCE_CPU_ONLY_INPUT_TENSORS`` "no"): inputs may be DLPack tensors,
        kept where they are (a GPU's included)."""
        request = cls.__new__(cls)
        request._context = context
        request.model_name = model_name
        if device_inputs:
            request._inputs = [
                Tensor._of(k, v) if type(v) is np.ndarray else Tensor._of_device(k, v)
                for k, v in inputs.items()
            ]
        else:
            request._inputs = [Tensor._of(k, v) for k, v in inputs.items()]
        request._by_name = {t.name(): t for t in request._inputs}
        request._id = request_id
        request._correlation_id = correlation_id
        request._version = model_version
        request._flags = flags
        request._timeout = 0
        request._preferred_memory = None
        request._trace = _NO_TRACE
        request._parameters = (
            {k: v for k, v in parameters.items() if isinstance(v, bool | int | str | float)}
            if parameters
            else {}
        )
        request._requested = []
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        return request

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def get_input_tensor_by_name(self, name: str) -> Tensor | None:
        return self._by_name.get(name)

    def request_id(self) -> str:
        return self._id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = int(flags)

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return json.dumps(self._parameters)

    def trace(self) -> InferenceTrace:
        return self._trace

    def requested_output_names(self) -> list[str]:
        return self._requested

    def set_release_flags(self, flags: int) -> None:
        """``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``: once ``execute`` returned (None in its
        list for this request, for a non-decoupled model), the request goes back in the queue for
        a free instance and ``execute`` gets it again (Triton's request rescheduling, iterative
        sequences)."""
        flags = int(flags)
        if flags not in (TRITONSERVER_REQUEST_RELEASE_ALL, TRITONSERVER_REQUEST_RELEASE_RESCHEDULE):
            raise TritonModelException(f"Unsupported release flags: {flags}")
        self._release_flags = flags

    def release_flags(self) -> int:
        return self._release_flags

    def is_cancelled(self) -> bool:
        """Whether the client went away (or its stream was ended, or its deadline passed)
        before the final response."""
        context = self._context
        if context is not None and context.cancelled:
            return True
        return self._sender is not None and self._sender.is_cancelled()

    def get_response_sender(self) -> InferenceResponseSender:
        """A decoupled model's way to answer: any number of ``send`` calls, then one with
        ``flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL`` (possibly after execute returned)."""
        sender = self._sender
        if sender is None and self._reply_to is not None:
            # a non-decoupled model answering through the sender: made when first asked for
            sender = self._sender = InferenceResponseSender(
                self._reply_to, decoupled=False, model=self.model_name
            )
        if sender is None:
            raise TritonModelException(
                "get_response_sender() is only for decoupled models "
                "(model_transaction_policy { decoupled: true })"
            )
        return sender

    _sender: InferenceResponseSender | None = None
    _context: Context | None = None  # the server's view of the request (cancellation)
    # a non-decoupled request's responses sent through its sender (the backend reads them)
    _reply_to: Deliver | None = None


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return request.get_input_tensor_by_name(name)
