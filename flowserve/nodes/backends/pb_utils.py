"""The subset of Triton's ``triton_python_backend_utils`` that model.py files use.

Installed as ``sys.modules["triton_python_backend_utils"]`` by the python backend, so an
unchanged Triton ``model.py`` (``import triton_python_backend_utils as pb_utils``) runs
in-process: no stub process, no shared-memory hop.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

from flowserve.core.datatypes import from_config, to_numpy

_log = logging.getLogger("flowserve.python_model")


class TritonModelException(Exception):
    pass


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


class Tensor:
    def __init__(self, name: str, array: Any) -> None:
        self._name = name
        self._array = np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True


class InferenceRequest:
    def __init__(
        self,
        inputs: list[Tensor],
        request_id: str = "",
        parameters: dict[str, Any] | None = None,
        requested_output_names: list[str] | None = None,
        model_name: str = "",
    ) -> None:
        self._inputs = inputs
        self._by_name = {t.name(): t for t in inputs}
        self._id = request_id
        self._parameters = parameters or {}
        self._requested = requested_output_names or []
        self.model_name = model_name

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def get_input_tensor_by_name(self, name: str) -> Tensor | None:
        return self._by_name.get(name)

    def request_id(self) -> str:
        return self._id

    def parameters(self) -> str:
        return json.dumps(self._parameters)

    def requested_output_names(self) -> list[str]:
        return self._requested

    def is_cancelled(self) -> bool:
        return False


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None) -> None:
        self._outputs = output_tensors or []
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


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


class Logger:
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
