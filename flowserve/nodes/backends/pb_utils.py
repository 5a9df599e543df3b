"""The subset of Triton's ``triton_python_backend_utils`` that model.py files use.

Installed as ``sys.modules["triton_python_backend_utils"]`` by the python backend, so an
unchanged Triton ``model.py`` (``import triton_python_backend_utils as pb_utils``) runs
in-process: no stub process, no shared-memory hop.

BLS (business logic scripting): ``pb_utils.InferenceRequest(model_name=..., inputs=[...],
requested_output_names=[...]).exec()`` (or ``await ....async_exec()`` in an ``async def
execute``) runs another loaded model or graph of the same engine. The python backend gives
each instance's thread a :class:`BlsLink` to its engine; requests are handed to the engine's
event loop, never run on it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import json
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np

from flowserve.core.datatypes import from_config, from_numpy, to_config, to_numpy
from flowserve.core.errors import ErrorCode, FlowserveError
from flowserve.core.node import TensorMap

_log = logging.getLogger("flowserve.python_model")

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2


class TritonModelException(Exception):
    def __init__(self, msg: str = "") -> None:
        super().__init__(msg)
        self._msg = msg

    def message(self) -> str:
        return self._msg


class TritonError:
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = 1) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message


# TritonError codes <-> flowserve error codes
_CODES: dict[ErrorCode, int] = {
    ErrorCode.UNKNOWN: TritonError.UNKNOWN,
    ErrorCode.INTERNAL: TritonError.INTERNAL,
    ErrorCode.NOT_FOUND: TritonError.NOT_FOUND,
    ErrorCode.INVALID_ARG: TritonError.INVALID_ARG,
    ErrorCode.UNAVAILABLE: TritonError.UNAVAILABLE,
    ErrorCode.UNSUPPORTED: TritonError.UNSUPPORTED,
    ErrorCode.ALREADY_EXISTS: TritonError.ALREADY_EXISTS,
    ErrorCode.CANCELLED: TritonError.CANCELLED,
}
ERROR_CODES: dict[int, ErrorCode] = {v: k for k, v in _CODES.items()}


class Tensor:
    def __init__(self, name: str, array: Any, triton_dtype: Any = None) -> None:
        arr = np.asarray(array)
        if arr.dtype.kind == "U":
            raise TritonModelException(
                f"tensor '{name}': numpy str arrays are not supported by the python backend; "
                "use dtype np.object_ (of bytes)"
            )
        self._name = name
        self._array = arr

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        return Tensor(name, np.from_dlpack(capsule))

    def to_dlpack(self) -> Any:
        return self._array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> str:
        return from_numpy(self._array.dtype)

    def is_cpu(self) -> bool:
        return True


class BlsLink(Protocol):
    """How a python model reaches its engine for BLS: submit a request, get a future."""

    def submit(
        self, model: str, version: str, inputs: TensorMap, parameters: dict[str, Any], request_id: str
    ) -> concurrent.futures.Future[TensorMap]: ...


_local = threading.local()
_default_link: BlsLink | None = None


def set_link(link: BlsLink | None, default: bool = False) -> None:
    """Give the calling thread (and, with ``default``, threads that have none) a BLS link."""
    global _default_link
    _local.link = link
    if default:
        _default_link = link


def current_link() -> BlsLink | None:
    return getattr(_local, "link", None) or _default_link


class InferenceRequest:
    """A request: handed to ``execute`` by the backend, or built by model.py for BLS."""

    def __init__(
        self,
        model_name: str | list[Tensor] = "",
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        request_id: str = "",
        correlation_id: int | str = 0,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        parameters: dict[str, Any] | str | None = None,
        **_ignored: Any,
    ) -> None:
        if isinstance(model_name, list):  # old positional form: InferenceRequest(inputs, ...)
            inputs = model_name
            model_name = ""
        self.model_name: str = model_name
        self._inputs = list(inputs or [])
        self._by_name = {t.name(): t for t in self._inputs}
        self._id = request_id
        self._correlation_id = correlation_id
        self._version = model_version
        self._flags = flags
        self._timeout = timeout
        if isinstance(parameters, str):
            parameters = json.loads(parameters) if parameters else {}
        self._parameters: dict[str, Any] = dict(parameters or {})
        self._requested = list(requested_output_names or [])

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

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return json.dumps(self._parameters)

    def requested_output_names(self) -> list[str]:
        return self._requested

    def is_cancelled(self) -> bool:
        """Whether the client went away (or its stream was ended) before the final response."""
        return self._sender is not None and self._sender.is_cancelled()

    def get_response_sender(self) -> InferenceResponseSender:
        """A decoupled model's way to answer: any number of ``send`` calls, then one with
        ``flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL`` (possibly after execute returned)."""
        sender = self._sender
        if sender is None:
            raise TritonModelException(
                "get_response_sender() is only for decoupled models "
                "(model_transaction_policy { decoupled: true })"
            )
        return sender

    _sender: InferenceResponseSender | None = None

    # ------------------------------------------------------------------ BLS

    def _submit(self) -> concurrent.futures.Future[TensorMap]:
        link = current_link()
        if link is None:
            raise TritonModelException(
                "InferenceRequest.exec(): BLS works only inside a model that a flowserve engine serves"
            )
        if not self.model_name:
            raise TritonModelException("InferenceRequest.exec(): model_name is required")
        version = "" if self._version is None or int(self._version) < 0 else str(self._version)
        inputs = {t.name(): t.as_numpy() for t in self._inputs}
        return link.submit(self.model_name, version, inputs, self._parameters, self._id)

    def _response(self, outputs: TensorMap) -> InferenceResponse:
        wanted = self._requested
        names = [n for n in wanted if n in outputs] if wanted else list(outputs)
        return InferenceResponse(output_tensors=[Tensor(n, outputs[n]) for n in names])

    def exec(self, decoupled: bool = False) -> Any:
        """Run the request on the engine and wait; errors come back in the response."""
        try:
            response = self._response(self._submit().result())
        except Exception as exc:
            response = _error_response(self.model_name, exc)
        return iter([response]) if decoupled else response

    def async_exec(self, decoupled: bool = False) -> Awaitable[Any]:
        """Like :meth:`exec`, as an awaitable for ``async def execute``."""
        try:
            future = self._submit()
        except Exception as exc:
            failed = _error_response(self.model_name, exc)
            return _ready(iter([failed]) if decoupled else failed)

        async def wait() -> Any:
            try:
                response = self._response(await asyncio.wrap_future(future))
            except Exception as exc:
                response = _error_response(self.model_name, exc)
            return iter([response]) if decoupled else response

        return wait()


class InferenceResponseSender:
    """Hands a decoupled model's responses to ``deliver(response, final)``, from any thread."""

    def __init__(self, deliver: Callable[[InferenceResponse | None, bool], None]) -> None:
        self._deliver = deliver
        self._closed = False
        # set by the server when nobody will read further responses (the client went away)
        self.cancelled = threading.Event()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self._closed:
            raise TritonModelException("the response sender is closed: the final flag was already sent")
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        self._closed = final
        self._deliver(response, final)

    def is_cancelled(self) -> bool:
        return self.cancelled.is_set()


async def _ready(value: Any) -> Any:
    return value


def _error_response(model: str, exc: BaseException) -> InferenceResponse:
    if isinstance(exc, FlowserveError):
        return InferenceResponse(error=TritonError(exc.message, _CODES.get(exc.code, TritonError.INTERNAL)))
    return InferenceResponse(error=TritonError(f"BLS request to model '{model}' failed: {exc}"))


class InferenceResponse:
    def __init__(
        self,
        output_tensors: list[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
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


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return request.get_input_tensor_by_name(name)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    for t in response.output_tensors():
        if t.name() == name:
            return t
    return None


def _find(config: dict[str, Any], key: str, name: str) -> dict[str, Any]:
    for item in config.get(key, []):
        if item.get("name") == name:
            return dict(item)
    return {}


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any]:
    return _find(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any]:
    return _find(model_config, "output", name)


def triton_string_to_numpy(triton_type: str) -> Any:
    dtype = to_numpy(from_config(triton_type))
    return np.object_ if dtype.kind == "O" else dtype.type


def numpy_to_triton_type(dtype: Any) -> str:
    return to_config(from_numpy(np.dtype(dtype)))


class ModelConfig:
    """What ``TritonPythonModel.auto_complete_config`` receives: the config as a dict, and the
    few changes Triton allows (max_batch_size, inputs, outputs, dynamic batching, decoupled)."""

    _TENSOR_KEYS = frozenset({"name", "data_type", "dims", "optional"})

    def __init__(self, model_config: dict[str, Any]) -> None:
        self._config = copy.deepcopy(model_config)
        self._config.setdefault("max_batch_size", 0)
        self._config.setdefault("input", [])
        self._config.setdefault("output", [])

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def _name(self) -> str:
        return str(self._config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        configured = int(self._config.get("max_batch_size", 0))
        if configured > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {configured}, but in auto-complete-config "
                f"function for model '{self._name()}' specified max_batch_size {max_batch_size}"
            )
        self._config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if self._config.get(other):
                raise ValueError(
                    f"configuration specified scheduling_choice as '{other}', but auto-complete-config "
                    f"function for model '{self._name()}' tries to set it as 'dynamic_batching'"
                )
        self._config.setdefault("dynamic_batching", {})

    def _add(self, key: str, tensor: dict[str, Any]) -> None:
        extra = set(tensor) - self._TENSOR_KEYS
        if extra:
            raise ValueError(f"{key} '{tensor.get('name')}' has unsupported properties {sorted(extra)}")
        for required in ("name", "data_type", "dims"):
            if required not in tensor:
                raise ValueError(f"{key} {tensor} of model '{self._name()}' is missing '{required}'")
        for existing in self._config[key]:
            if existing.get("name") == tensor["name"]:
                if existing.get("data_type") not in ("TYPE_INVALID", None, tensor["data_type"]):
                    raise ValueError(
                        f"{key} '{tensor['name']}' of model '{self._name()}' has data_type "
                        f"{existing['data_type']} in the configuration, {tensor['data_type']} in "
                        "auto_complete_config"
                    )
                if existing.get("dims") and list(existing["dims"]) != list(tensor["dims"]):
                    raise ValueError(
                        f"{key} '{tensor['name']}' of model '{self._name()}' has dims {existing['dims']} "
                        f"in the configuration, {tensor['dims']} in auto_complete_config"
                    )
                return
        self._config[key].append(dict(tensor))

    def add_input(self, input: dict[str, Any]) -> None:
        self._add("input", input)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        self._config.setdefault("model_transaction_policy", {}).update(transaction_policy_dict)


class Logger:
    @staticmethod
    def log(message: str, level: int = logging.INFO) -> None:
        _log.log(level, message)

    @staticmethod
    def log_info(message: str) -> None:
        _log.info(message)

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning(message)

    @staticmethod
    def log_error(message: str) -> None:
        _log.error(message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug(message)
