"""Triton's ``triton_python_backend_utils``, whole: what model.py files import as ``pb_utils``.

Installed as ``sys.modules["triton_python_backend_utils"]`` by the python backend, so an
unchanged Triton ``model.py`` (``import triton_python_backend_utils as pb_utils``) runs
in-process: no stub process, no shared-memory hop. The names are those of python_backend's
``triton_python_backend_utils.py`` and of the classes its stub binds from C++ (``Tensor``,
``InferenceRequest``, ``InferenceResponse``, ``InferenceResponseSender``, ``ResponseIterator``,
``TritonError``, ``Logger``, ``MetricFamily``/``Metric``, ``PreferredMemory``,
``InferenceTrace``, ``load_model``/``unload_model``/``is_model_ready``, ``get_model_dir``).

GPU tensors as in Triton: ``Tensor.from_dlpack`` keeps a DLPack tensor where it is (a CUDA
tensor stays on its GPU, ``is_cpu()`` False, and an output made of it flows on as a device
tensor, no copy), ``to_dlpack()`` hands it back as it is; with the model parameter
``FORCE_CPU_ONLY_INPUT_TENSORS`` "no" the inputs come as their producers made them (a torch
GPU model's output stays on the GPU). BLS responses (``PreferredMemory`` GPU) stay in host
memory: that call fails with an error naming it.

BLS (business logic scripting): ``pb_utils.InferenceRequest(model_name=..., inputs=[...],
requested_output_names=[...]).exec()`` (or ``await ....async_exec()`` in an ``async def
execute``) runs another loaded model or graph of the same engine; ``exec(decoupled=True)``
returns the stream of its responses. The python backend gives each instance's thread a
:class:`BlsLink` to its engine; requests are handed to the engine's event loop, never run on it.

Custom metrics (``MetricFamily``) are kept here, process-wide as in Triton's core, and
exported on ``/metrics`` by :func:`custom_metrics` (read by the metrics collector).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import enum
import json
import logging
import math
import queue
import re
import struct
import threading
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import ml_dtypes
import numpy as np

from flowserve.core.datatypes import from_config, from_numpy, to_numpy
from flowserve.core.device import DeviceTensor, on_current_stream, produced, tensor_map, wrap
from flowserve.core.errors import ErrorCode, FlowserveError
from flowserve.core.node import Context, TensorMap

_log = logging.getLogger("flowserve.python_model")

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# TRITONSERVER_DataType numbers (what Tensor.triton_dtype() returns, as in Triton)
_DTYPE_NUMBERS: dict[str, int] = {
    "BOOL": 1,
    "UINT8": 2,
    "UINT16": 3,
    "UINT32": 4,
    "UINT64": 5,
    "INT8": 6,
    "INT16": 7,
    "INT32": 8,
    "INT64": 9,
    "FP16": 10,
    "FP32": 11,
    "FP64": 12,
    "BYTES": 13,
    "BF16": 14,
}
_NUMBER_DTYPES: dict[int, Any] = {
    1: np.bool_,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}


class TritonModelException(Exception):
    def __init__(self, msg: str = "") -> None:
        super().__init__(msg)
        self._msg = msg

    def message(self) -> str:
        return self._msg


class _GpuOnly(TritonModelException):
    """A call that needs a GPU, which flowserve's in-process Python backend never hands out."""

    def __init__(self, call: str) -> None:
        super().__init__(
            f"{call} is not supported: flowserve's Python backend keeps tensors in CPU memory "
            "(no GPU tensors, no CUDA memory)"
        )


class TritonError:
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        if message is None or code is None:
            raise TypeError("TritonError(): message and code must not be None")
        self._message = message
        self._code = int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code})"


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


# ---------------------------------------------------------------------------- memory


class MemoryType(enum.IntEnum):
    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1
    TRITONSERVER_MEMORY_CPU_PINNED = 2


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU
TRITONSERVER_MEMORY_CPU_PINNED = MemoryType.TRITONSERVER_MEMORY_CPU_PINNED


class PreferredMemory:
    """Where a BLS request would like its outputs: CPU (and pinned CPU) memory only, here."""

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        if preferred_memory_type is None or preferred_device_id is None:
            raise TypeError("PreferredMemory(): arguments must not be None")
        kind = MemoryType(int(preferred_memory_type))
        if kind is MemoryType.TRITONSERVER_MEMORY_GPU:
            raise _GpuOnly("pb_utils.PreferredMemory(TRITONSERVER_MEMORY_GPU)")
        self.preferred_memory_type = kind
        self.preferred_device_id = int(preferred_device_id)


class InferenceTrace:
    """A request's trace handle; flowserve hands no OpenTelemetry context to model.py."""

    def __init__(self, context: str | None = None) -> None:
        self._context = context

    def get_context(self) -> str | None:
        return self._context or None


_NO_TRACE = InferenceTrace()  # what every request the server hands to execute() carries


# ---------------------------------------------------------------------------- tensors


class _Capsule:
    """A DLPack capsule dressed as a ``__dlpack__`` producer (numpy consumes only those)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


class Tensor:
    """A tensor of a request or a response: a numpy array (``Tensor(name, array)``, what the
    server hands to ``execute`` by default), or a DLPack tensor kept where it is
    (``Tensor.from_dlpack``, and the inputs of a model with ``FORCE_CPU_ONLY_INPUT_TENSORS``
    "no"), in host memory or on a GPU."""

    # a DLPack tensor as it came (host memory or a GPU); None for a numpy tensor
    _device: DeviceTensor | None = None

    def __init__(self, name: str, array: Any, triton_dtype: Any = None) -> None:
        if isinstance(array, np.ndarray):  # the common case: no conversion, no DLPack question
            arr = array
        elif hasattr(array, "__dlpack__"):
            raise TritonModelException(
                f"tensor '{name}': pb_utils.Tensor() takes a numpy array; use "
                "pb_utils.Tensor.from_dlpack() for a DLPack tensor"
            )
        else:
            arr = np.asarray(array)
        if arr.dtype.kind == "U":
            raise TritonModelException(
                f"tensor '{name}': numpy str arrays are not supported by the python backend; "
                "use dtype np.object_ (of bytes)"
            )
        self._name = name
        self._array: np.ndarray | None = arr

    @classmethod
    def _of(cls, name: str, array: np.ndarray) -> Tensor:
        """A tensor of an array the server decoded (already numpy, never a str array): the
        checks of the constructor, made for model.py's arguments, are not needed."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        return tensor

    @classmethod
    def _of_device(cls, name: str, value: Any) -> Tensor:
        """A tensor over a DLPack tensor (a DeviceTensor of the engine, or any DLPack array),
        kept where it is."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = None
        tensor._device = value if isinstance(value, DeviceTensor) else wrap(value)
        return tensor

    def _edge(self) -> np.ndarray | DeviceTensor:
        """What flows on from this tensor: the numpy array, or the DLPack tensor as it is."""
        device = self._device
        if device is not None:
            return device
        assert self._array is not None
        return self._array

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A tensor from a DLPack producer (a torch or cupy tensor...) or a DLPack capsule,
        without a copy, where it is: host memory (``as_numpy()`` is a view of it) or a GPU
        (``is_cpu()`` False; an output flows on as a device tensor, ordered after the work
        the calling thread queued on its current CUDA stream). BF16 included."""
        source = capsule
        if type(capsule).__name__ == "PyCapsule":
            try:
                import torch.utils.dlpack
            except ImportError:  # numpy reads host memory only
                return Tensor(name, np.from_dlpack(_Capsule(capsule)))
            source = torch.utils.dlpack.from_dlpack(capsule)
        elif isinstance(capsule, Tensor):
            return Tensor._of_device(name, capsule._edge()) if capsule._device is not None else capsule
        elif not hasattr(capsule, "__dlpack_device__"):
            raise TritonModelException(
                f"pb_utils.Tensor.from_dlpack('{name}'): expected a DLPack capsule or an object "
                f"with __dlpack__, got {type(capsule).__name__}"
            )
        if isinstance(source, np.ndarray):
            return Tensor(name, source)
        try:
            return Tensor._of_device(name, _described(source))
        except (TypeError, ValueError, BufferError, RuntimeError) as exc:
            raise TritonModelException(f"pb_utils.Tensor.from_dlpack('{name}'): {exc}") from exc

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the tensor, where it is (no copy; BF16 included). A GPU tensor
        is ordered first: the calling thread's current CUDA stream waits on its producer."""
        return self.__dlpack__()

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        device = self._device
        if device is not None:
            value = on_current_stream(device)
            if stream is not None:
                try:
                    return value.__dlpack__(stream=stream)
                except TypeError:
                    pass
            return value.__dlpack__()
        arr = self._array
        assert arr is not None
        if arr.dtype.kind in "OSU":
            raise TritonModelException(f"tensor '{self._name}': DLPack does not support BYTES tensors")
        if arr.dtype == ml_dtypes.bfloat16:
            import torch

            bits = torch.from_numpy(np.ascontiguousarray(arr).view(np.int16).copy())
            return bits.view(torch.bfloat16).__dlpack__()
        if not arr.flags.writeable:
            arr = arr.copy()  # DLPack (before 1.0) cannot say read-only
        return arr.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        device = self._device
        return (1, 0) if device is None else device.__dlpack_device__()

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        """The tensor as numpy (a view for host memory); a GPU tensor cannot be read so, as in
        Triton: use :meth:`to_dlpack`."""
        array = self._array
        if array is None:
            device = self._device
            assert device is not None
            if not device.device.is_cpu:
                raise TritonModelException(
                    f"tensor '{self._name}' is stored in GPU memory ({device.device}) and cannot be "
                    "converted to NumPy; use to_dlpack() (e.g. torch.utils.dlpack.from_dlpack("
                    "tensor.to_dlpack())) or leave FORCE_CPU_ONLY_INPUT_TENSORS at its default"
                )
            array = self._array = device.host()[0]  # a view, no copy
        return array

    def shape(self) -> list[int]:
        device = self._device
        if device is not None:
            return list(device.shape)
        assert self._array is not None
        return list(self._array.shape)

    def _dtype(self) -> np.dtype[Any]:
        device = self._device
        if device is not None:
            return device.dtype
        assert self._array is not None
        return self._array.dtype

    def triton_dtype(self) -> int:
        """The TRITONSERVER_DataType number (11 for FP32, 13 for BYTES...), as in Triton."""
        return _DTYPE_NUMBERS[from_numpy(self._dtype())]

    def is_cpu(self) -> bool:
        """Whether the tensor is in host memory (False for a GPU tensor: see
        ``FORCE_CPU_ONLY_INPUT_TENSORS`` and :meth:`from_dlpack`)."""
        device = self._device
        return device is None or device.device.is_cpu

    def __repr__(self) -> str:
        where = "" if self._device is None else f", device={self._device.device}"
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._dtype()}{where})"


def _described(source: Any) -> DeviceTensor:
    """A DLPack tensor as the engine describes it: a host tensor with a numpy view for
    ``as_numpy()``; a CUDA tensor with an event recorded on the calling thread's current stream
    after the work that made it (where a CUDA torch orders it), and its host copy."""
    if type(source).__module__.startswith("torch"):
        source = source.detach()
    tensor = wrap(source, to_numpy=_torch_to_numpy if type(source).__module__.startswith("torch") else None)
    if tensor.device.is_cpu:
        return tensor
    from flowserve.nodes.backends.cuda import cuda_ops, cuda_to_numpy

    ops = cuda_ops() if tensor.device.kind == "cuda" else None
    if ops is None:
        tensor.to_numpy_fn = cuda_to_numpy
        return tensor
    stream = ops.current(tensor.device)
    return produced(source, stream, ops, tensor.dtype, tensor.shape, tensor.device, cuda_to_numpy)


def _torch_to_numpy(tensor: Any) -> np.ndarray:
    """A CPU torch tensor as numpy, sharing its memory (BF16 as ``ml_dtypes.bfloat16``)."""
    import torch

    t = tensor.detach()
    if t.dtype == torch.bfloat16:
        return np.asarray(t.contiguous().view(torch.int16).numpy()).view(ml_dtypes.bfloat16)
    return np.asarray(t.numpy())


# ---------------------------------------------------------------------------- BLS


@dataclass
class BlsCall:
    """One BLS request as the engine needs it."""

    model: str
    version: str
    inputs: TensorMap
    parameters: dict[str, Any] = field(default_factory=dict)
    request_id: str = ""
    timeout_us: int = 0


class BlsLink(Protocol):
    """How a python model reaches its engine: BLS calls, model readiness and control."""

    def submit(self, call: BlsCall) -> concurrent.futures.Future[TensorMap]:
        """Run one request to its single response."""
        ...

    def stream(self, call: BlsCall, put: Callable[[TensorMap], None]) -> concurrent.futures.Future[bool]:
        """Run one request, calling ``put`` with each response (from the engine's loop); the
        future ends with whether the model was decoupled."""
        ...

    def is_model_ready(self, name: str, version: str) -> bool: ...

    def load_model(self, name: str, config: str, files: dict[str, bytes]) -> None: ...

    def unload_model(self, name: str, unload_dependents: bool) -> None: ...


_local = threading.local()
_default_link: BlsLink | None = None

_NO_BLS = "BLS is only supported during the 'execute' function."


def set_link(link: BlsLink | None, default: bool = False) -> None:
    """Give the calling thread (and, with ``default``, threads that have none) a BLS link."""
    global _default_link
    _local.link = link
    if default:
        _default_link = link


def current_link() -> BlsLink | None:
    return getattr(_local, "link", None) or _default_link


class outside_execute:  # noqa: N801 - used as a context manager, named like one
    """While model.py's ``initialize``/``finalize`` runs on this thread: BLS is refused (as in
    Triton) and ``get_model_dir`` answers the model's directory."""

    def __init__(self, model_dir: str) -> None:
        self.model_dir = model_dir

    def __enter__(self) -> None:
        self._saved = (getattr(_local, "refuse_bls", False), getattr(_local, "model_dir", None))
        _local.refuse_bls = True
        _local.model_dir = self.model_dir

    def __exit__(self, *_: object) -> None:
        _local.refuse_bls, _local.model_dir = self._saved


def set_model_dir(model_dir: str | None) -> None:
    """The directory ``get_model_dir()`` answers on this thread (its model's version dir)."""
    _local.model_dir = model_dir


def get_model_dir() -> str:
    """The directory of the model.py being run (its version directory), as Triton's stub."""
    model_dir = getattr(_local, "model_dir", None) or _default_model_dir
    if model_dir is None:
        raise TritonModelException("get_model_dir() works only inside a model that flowserve serves")
    return str(model_dir)


_default_model_dir: str | None = None


def _need_link(call: str) -> BlsLink:
    link = current_link()
    if link is None:
        raise TritonModelException(f"{call} works only inside a model that a flowserve engine serves")
    return link


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) a model of the repository, as Triton's model control API."""
    if model_name is None or config is None:
        raise TypeError("load_model(): model_name and config must not be None")
    _need_link("pb_utils.load_model()").load_model(model_name, config, dict(files or {}))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    if model_name is None:
        raise TypeError("unload_model(): model_name must not be None")
    _need_link("pb_utils.unload_model()").unload_model(model_name, bool(unload_dependents))


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    if model_name is None or model_version is None:
        raise TypeError("is_model_ready(): model_name and model_version must not be None")
    return _need_link("pb_utils.is_model_ready()").is_model_ready(model_name, str(model_version))


class _Required:
    def __repr__(self) -> str:
        return "<required>"


_REQUIRED: Any = _Required()


class InferenceRequest:
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
        """``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``: a decoupled model's ``execute`` is
        called again with this request once it returns (iterative sequences)."""
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
        if sender is None and self._replies is not None:
            # a non-decoupled model answering through the sender: made when first asked for
            sender = self._sender = InferenceResponseSender(_appender(self._replies), decoupled=False)
        if sender is None:
            raise TritonModelException(
                "get_response_sender() is only for decoupled models "
                "(model_transaction_policy { decoupled: true })"
            )
        return sender

    _sender: InferenceResponseSender | None = None
    _context: Context | None = None  # the server's view of the request (cancellation)
    # a non-decoupled request's responses sent through its sender (the backend reads them)
    _replies: list[InferenceResponse] | None = None

    # ------------------------------------------------------------------ BLS

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
        inputs = tensor_map({t.name(): t.as_numpy() if t.is_cpu() else t._edge() for t in self._inputs})
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
        self._request: InferenceRequest | None = None
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


class InferenceResponseSender:
    """Hands a model's responses to ``deliver(response, final)``, from any thread. A decoupled
    model sends any number, then the final flag; a non-decoupled one (``decoupled=False``)
    sends exactly one response, with the final flag."""

    def __init__(
        self, deliver: Callable[[InferenceResponse | None, bool], None], decoupled: bool = True
    ) -> None:
        self._deliver = deliver
        self._decoupled = decoupled
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


def _appender(box: list[InferenceResponse]) -> Callable[[InferenceResponse | None, bool], None]:
    def deliver(response: InferenceResponse | None, final: bool) -> None:
        if response is not None:
            box.append(response)

    return deliver


async def _ready(value: Any) -> Any:
    return value


def _error_response(model: str, exc: BaseException) -> InferenceResponse:
    if isinstance(exc, FlowserveError):
        return InferenceResponse(error=TritonError(exc.message, _CODES.get(exc.code, TritonError.INTERNAL)))
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
    return InferenceResponse(error=TritonError(f"BLS request to model '{model}' failed: {exc}"))


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


# ---------------------------------------------------------------------------- module functions


def serialize_byte_tensor(input_tensor: np.ndarray) -> Any:
    """A bytes tensor as Triton's wire form: each element's 4-byte little-endian length, then
    its bytes, in C order (``()`` for an empty tensor, None for a non-bytes one)."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype == np.object_ or input_tensor.dtype.type == np.bytes_:
        parts: list[bytes] = []
        for item in input_tensor.ravel(order="C").tolist():
            s = item if isinstance(item, bytes) else str(item).encode("utf-8")
            parts.append(struct.pack("<I", len(s)))
            parts.append(s)
        return b"".join(parts)
    return None


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The inverse of :func:`serialize_byte_tensor`: a 1-D object array of bytes."""
    strs: list[bytes] = []
    offset = 0
    buf = bytes(encoded_tensor)
    while offset < len(buf):
        (length,) = struct.unpack_from("<I", buf, offset)
        offset += 4
        strs.append(buf[offset : offset + length])
        offset += length
    return np.array(strs, dtype=np.object_)


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return request.get_input_tensor_by_name(name)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    for t in response.output_tensors():
        if t.name() == name:
            return t
    return None


def _find(config: dict[str, Any], key: str, name: str) -> dict[str, Any] | None:
    for item in config.get(key, []):
        if item.get("name") == name:
            return dict(item)
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return _find(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return _find(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    """Whether the model's configuration says ``model_transaction_policy { decoupled: true }``."""
    policy = model_config.get("model_transaction_policy")
    if policy:
        return bool(policy.get("decoupled", False))
    return False


def triton_to_numpy_type(data_type: int) -> Any:
    """numpy type of a TRITONSERVER_DataType number (None for an unknown one)."""
    return _NUMBER_DTYPES.get(int(data_type))


def numpy_to_triton_type(data_type: Any) -> int | None:
    """TRITONSERVER_DataType number of a numpy type (None for one Triton lacks), as Triton's."""
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in "OS":
        return 13
    try:
        return _DTYPE_NUMBERS[from_numpy(dtype)]
    except FlowserveError:
        return None


def triton_string_to_numpy(triton_type_string: str) -> Any:
    if triton_type_string in TRITON_STRING_TO_NUMPY:
        return TRITON_STRING_TO_NUMPY[triton_type_string]
    dtype = to_numpy(from_config(triton_type_string))  # TYPE_BF16: ml_dtypes.bfloat16
    return dtype.type


class ModelConfig:
    """What ``TritonPythonModel.auto_complete_config`` receives: the config as a dict, and the
    few changes Triton allows (max_batch_size, inputs, outputs, dynamic batching, decoupled)."""

    _TENSOR_KEYS = frozenset({"name", "data_type", "dims", "optional"})

    def __init__(self, model_config: dict[str, Any] | str) -> None:
        parsed: dict[str, Any] = json.loads(model_config) if isinstance(model_config, str) else model_config
        self._config = copy.deepcopy(parsed)
        self._config.setdefault("max_batch_size", 0)
        self._config.setdefault("input", [])
        self._config.setdefault("output", [])

    @property
    def _model_config(self) -> dict[str, Any]:  # the attribute Triton's stub reads
        return self._config

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


# ---------------------------------------------------------------------------- logging


class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LEVELS = {
    LogLevel.INFO: logging.INFO,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.ERROR: logging.ERROR,
    LogLevel.VERBOSE: logging.DEBUG,
}


class Logger:
    """Triton's ``pb_utils.Logger``, writing to python logging (logger ``flowserve.python_model``;
    VERBOSE is DEBUG), each record naming the model.py line that logged it."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        try:
            py_level = _LEVELS[LogLevel(int(level))]
        except ValueError:
            raise TritonModelException(f"Logger.log(): unknown log level {level!r}") from None
        _log.log(py_level, message, stacklevel=2)

    @staticmethod
    def log_info(message: str) -> None:
        _log.info(message, stacklevel=2)

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning(message, stacklevel=2)

    @staticmethod
    def log_error(message: str) -> None:
        _log.error(message, stacklevel=2)

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug(message, stacklevel=2)


# ---------------------------------------------------------------------------- custom metrics


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


COUNTER = MetricKind.COUNTER
GAUGE = MetricKind.GAUGE
HISTOGRAM = MetricKind.HISTOGRAM

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_metrics_lock = threading.Lock()


class _Series:
    """One labelled series of a family (shared by every Metric object with its labels)."""

    def __init__(self, kind: MetricKind, buckets: list[float] | None) -> None:
        self.kind = kind
        self.value = 0.0
        self.buckets = buckets or []
        self.counts = [0] * len(self.buckets)
        self.sum = 0.0
        self.count = 0
        self.refs = 0


class _FamilyState:
    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        self.name = name
        self.description = description
        self.kind = kind
        self.series: dict[tuple[tuple[str, str], ...], _Series] = {}
        self.refs = 0


_FAMILIES: dict[str, _FamilyState] = {}


def _release_family(name: str) -> None:
    with _metrics_lock:
        state = _FAMILIES.get(name)
        if state is not None:
            state.refs -= 1
            if state.refs <= 0:
                del _FAMILIES[name]


def _release_series(state: _FamilyState, key: tuple[tuple[str, str], ...]) -> None:
    with _metrics_lock:
        series = state.series.get(key)
        if series is not None:
            series.refs -= 1
            if series.refs <= 0:
                del state.series[key]


class MetricFamily:
    """A custom metric family, exported on ``/metrics`` with the server's own, as in Triton.
    Families of one name are shared (while any object of that name lives); a family and its
    series go away when the last object holding them is deleted (the model unloaded)."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: int) -> None:
        if name is None or description is None or kind is None:
            raise TypeError("MetricFamily(): name, description and kind must not be None")
        try:
            metric_kind = MetricKind(int(kind))
        except ValueError:
            raise TritonModelException("Error when creating MetricFamily: Unknown metric kind") from None
        if not _METRIC_NAME.match(name):
            raise TritonModelException(f"Error when creating MetricFamily: invalid metric name '{name}'")
        with _metrics_lock:
            state = _FAMILIES.get(name)
            if state is None:
                state = _FAMILIES[name] = _FamilyState(name, description, metric_kind)
            elif state.kind != metric_kind or state.description != description:
                raise TritonModelException(
                    f"Error when creating MetricFamily: a metric family named '{name}' already "
                    "exists with a different kind or description"
                )
            state.refs += 1
        self._state = state
        self.name = name
        self.description = description
        self.kind = metric_kind
        weakref.finalize(self, _release_family, name)

    def Metric(  # noqa: N802 - Triton's name
        self, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> Metric:
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if self.kind is not MetricKind.HISTOGRAM:
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
        elif self.kind is MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        return Metric(self, {str(k): str(v) for k, v in (labels or {}).items()}, buckets)


class Metric:
    """One series of a :class:`MetricFamily` (made by ``family.Metric(labels=..., buckets=...)``)."""

    def __init__(self, family: MetricFamily, labels: dict[str, str], buckets: list[float] | None) -> None:
        for label in labels:
            if not _LABEL_NAME.match(label):
                raise TritonModelException(f"Error when creating Metric: invalid label name '{label}'")
        bounds = sorted(float(b) for b in buckets) if buckets is not None else None
        key = tuple(labels.items())
        state = family._state
        with _metrics_lock:
            series = state.series.get(key)
            if series is None:
                series = state.series[key] = _Series(family.kind, bounds)
            series.refs += 1
        self._family = family  # a metric keeps its family alive
        self._series = series
        self._kind = family.kind
        weakref.finalize(self, _release_series, state, key)

    def increment(self, value: float) -> None:
        if self._kind is MetricKind.HISTOGRAM:
            raise TritonModelException(
                "Failed to increment metric value: Incorrect operation for histogram metric, use observe()"
            )
        if self._kind is MetricKind.COUNTER and value < 0:
            raise TritonModelException(
                "Failed to increment metric value: value must be non-negative for a counter"
            )
        with _metrics_lock:
            self._series.value += float(value)

    def set(self, value: float) -> None:
        if self._kind is not MetricKind.GAUGE:
            raise TritonModelException(
                "Failed to set metric value: set() is only for gauges "
                f"(this metric is a {self._kind.name.lower()})"
            )
        with _metrics_lock:
            self._series.value = float(value)

    def observe(self, value: float) -> None:
        if self._kind is not MetricKind.HISTOGRAM:
            raise TritonModelException(
                "Failed to observe metric value: observe() is only for histograms "
                f"(this metric is a {self._kind.name.lower()})"
            )
        v = float(value)
        with _metrics_lock:
            s = self._series
            for i, bound in enumerate(s.buckets):
                if v <= bound:
                    s.counts[i] += 1
            s.sum += v
            s.count += 1

    def value(self) -> float:
        if self._kind is MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to get metric value: value() is not supported for histograms")
        return self._series.value


def _le(bound: float) -> str:
    if math.isinf(bound):
        return "+Inf"
    return str(int(bound)) if bound == int(bound) else repr(bound)


def custom_metrics() -> list[tuple[str, str, str, list[tuple[str, dict[str, str], float]]]]:
    """Every live custom metric family as (name, description, type, samples), for /metrics:
    a histogram has Prometheus' ``_bucket`` (cumulative, ``le``), ``_sum`` and ``_count``."""
    out: list[tuple[str, str, str, list[tuple[str, dict[str, str], float]]]] = []
    with _metrics_lock:
        for state in _FAMILIES.values():
            samples: list[tuple[str, dict[str, str], float]] = []
            for key, s in state.series.items():
                labels = dict(key)
                if state.kind is MetricKind.HISTOGRAM:
                    for bound, n in zip(s.buckets, s.counts, strict=True):
                        if math.isinf(bound):
                            continue
                        samples.append((state.name + "_bucket", {**labels, "le": _le(bound)}, n))
                    samples.append((state.name + "_bucket", {**labels, "le": "+Inf"}, s.count))
                    samples.append((state.name + "_sum", labels, s.sum))
                    samples.append((state.name + "_count", labels, s.count))
                else:
                    samples.append((state.name, labels, s.value))
            typ = {MetricKind.COUNTER: "counter", MetricKind.GAUGE: "gauge"}.get(state.kind, "histogram")
            out.append((state.name, state.description, typ, samples))
    return out
