"""Where a tensor lives, and the one rule that orders device work between nodes.

A tensor on a graph edge is either a numpy array (the common case: front ends decode into
numpy, most nodes compute in numpy) or a :class:`DeviceTensor`: any array that speaks DLPack
(a torch tensor, an ONNX Runtime ``OrtValue``, a DALI tensor, a cupy array) with what the
engine needs to know without importing its framework: numpy ``dtype``, ``shape``, the
:class:`Device` it lives on and, on a GPU, the stream that produced it and an event recorded
there after the work that produced it.

A node that takes such tensors as they come (``device_tensors = True``; torch, ONNX Runtime,
TensorRT and DALI backends, graph steps, Python nodes with ``tensors: dlpack``) gets them
unchanged; every other node gets numpy, made by :func:`to_host`: a view (no copy) for a tensor
in host memory, a copy for one on a GPU. The executor counts the bytes such copies move as the
consuming node's ``bytes_copied`` (and a graph output's as its producer's).

Ordering on a GPU (one code path for the real device and the fake one)::

    value = take(tensor, my_stream)     # my_stream waits on the producer's event, never on the device
    ...run on my_stream...
    out = produced(value, my_stream, ops, dtype, shape, device)   # records my event

:class:`StreamOps` is the device driver behind those calls: ``torch.cuda`` on a GPU
(``flowserve.nodes.backends.cuda``), :class:`FakeDevice` in CI, which records every operation
and refuses a read on a stream that neither produced the tensor nor waited on its event.
Nothing here imports a framework.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import ml_dtypes
import numpy as np

# DLPack device types (dlpack.h, DLDeviceType)
KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3
KDL_ROCM = 10
KDL_CUDA_MANAGED = 13
_KINDS = {KDL_CPU: "cpu", KDL_CUDA: "cuda", KDL_CUDA_HOST: "cpu", KDL_ROCM: "rocm", KDL_CUDA_MANAGED: "cuda"}


@dataclass(frozen=True, slots=True)
class Device:
    """A device: ``cpu`` (host memory) or ``cuda`` number ``index``."""

    kind: str = "cpu"
    index: int = 0

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    def __str__(self) -> str:
        return "cpu" if self.is_cpu else f"{self.kind}:{self.index}"


CPU = Device()


def device_of(obj: object) -> Device:
    """The device of a numpy array (the CPU) or of any object with ``__dlpack_device__``."""
    if isinstance(obj, np.ndarray):
        return CPU
    if isinstance(obj, DeviceTensor):
        return obj.device
    probe = getattr(obj, "__dlpack_device__", None)
    if probe is None:
        raise TypeError(f"a {type(obj).__name__} is neither a numpy array nor a DLPack tensor")
    code, index = probe()
    kind = _KINDS.get(int(code), f"dlpack{int(code)}")
    return CPU if kind == "cpu" else Device(kind, int(index))


class StreamOps(Protocol):
    """The device driver the ordering rule runs against (torch.cuda, or the fake)."""

    def stream(self, device: Device) -> Any:
        """A new stream on ``device``, owned by one instance."""

    def current(self, device: Device) -> Any:
        """The calling thread's current stream on ``device`` (where user code queues work)."""

    def record(self, stream: Any) -> Any:
        """An event recorded on ``stream`` after the work queued there so far."""

    def wait(self, stream: Any, event: Any) -> None:
        """Work queued on ``stream`` from now on waits for ``event`` (the host does not)."""

    def use(self, value: Any, stream: Any) -> None:
        """``value`` is read on ``stream`` (a caching allocator must not reuse it before)."""

    def synchronize(self, event: Any) -> None:
        """The host waits for ``event`` (before it reads what the event guards)."""


class DeviceTensor:
    """A DLPack-capable array with its numpy dtype, shape, device and (on a GPU) the stream
    and event that order it. ``value`` is the framework's own object, handed on unchanged;
    ``to_numpy`` (given by the producer) makes a host numpy array of it."""

    __slots__ = ("device", "dtype", "event", "ops", "shape", "stream", "to_numpy_fn", "value")

    def __init__(
        self,
        value: Any,
        dtype: np.dtype[Any],
        shape: tuple[int, ...],
        device: Device = CPU,
        *,
        stream: Any = None,
        event: Any = None,
        ops: StreamOps | None = None,
        to_numpy: Callable[[Any], np.ndarray] | None = None,
    ) -> None:
        self.value = value
        self.dtype = dtype
        self.shape = shape
        self.device = device
        self.stream = stream
        self.event = event
        self.ops = ops
        self.to_numpy_fn = to_numpy

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.value.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        code, index = self.value.__dlpack_device__()
        return int(code), int(index)

    def __repr__(self) -> str:
        return f"DeviceTensor({type(self.value).__name__}, {self.dtype}, {list(self.shape)}, {self.device})"

    def _like(self, value: Any, shape: tuple[int, ...]) -> DeviceTensor:
        return DeviceTensor(
            value,
            self.dtype,
            shape,
            self.device,
            stream=self.stream,
            event=self.event,
            ops=self.ops,
            to_numpy=self.to_numpy_fn,
        )

    def reshape(self, *shape: Any) -> DeviceTensor:
        """The same memory with another shape (the framework's reshape; no copy for a
        contiguous tensor)."""
        dims = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple | list) else shape
        value = self.value.reshape(dims)
        return self._like(value, tuple(int(d) for d in value.shape))

    def __getitem__(self, key: Any) -> DeviceTensor:
        """Rows of the tensor (a batch's split): the framework's view."""
        value = self.value[key]
        return self._like(value, tuple(int(d) for d in value.shape))

    def host(self) -> tuple[np.ndarray, int]:
        """A numpy array of this tensor and the bytes copied to make it: 0 for host memory
        (a view through DLPack), ``nbytes`` for device memory (copied once the producer's
        event has completed, never after a device-wide synchronize)."""
        if self.device.is_cpu:
            if self.to_numpy_fn is not None:
                return self.to_numpy_fn(self.value), 0
            return np.from_dlpack(self.value), 0
        if self.event is not None and self.ops is not None:
            self.ops.synchronize(self.event)
        if self.to_numpy_fn is not None:
            return self.to_numpy_fn(self.value), self.nbytes
        return np.from_dlpack(self.value, device="cpu", copy=True), self.nbytes


Tensor = np.ndarray | DeviceTensor
# what flows on a graph's edges; the node contract's TensorMap (core/node.py) names numpy, which
# is what a node that does not set ``device_tensors`` gets
EdgeMap = dict[str, Tensor]


def edges(tensors: Mapping[str, Any]) -> EdgeMap:
    """A node's inputs typed as what may arrive at a node with ``device_tensors = True``."""
    return cast(EdgeMap, tensors)


def tensor_map(tensors: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Outputs of a ``device_tensors`` node typed as the node contract's TensorMap (the
    executor and the other device-aware code know they may be DeviceTensors)."""
    return cast(dict[str, np.ndarray], tensors)


def to_host(tensor: object) -> tuple[np.ndarray, int]:
    """``tensor`` as numpy, and how many bytes that copied (0 for numpy and host memory)."""
    if isinstance(tensor, np.ndarray):
        return tensor, 0
    if isinstance(tensor, DeviceTensor):
        return tensor.host()
    return wrap(tensor).host()


def host_map(tensors: dict[str, Any]) -> tuple[dict[str, np.ndarray], int]:
    """Every tensor of a map as numpy; the bytes copied."""
    copied = 0
    out: dict[str, np.ndarray] = {}
    for name, tensor in tensors.items():
        if type(tensor) is np.ndarray:
            out[name] = tensor
            continue
        out[name], n = to_host(tensor)
        copied += n
    return out, copied


def numpy_dtype(dtype: object) -> np.dtype[Any]:
    """A numpy dtype from a framework's (``torch.float32``, ``bfloat16``, a numpy dtype)."""
    if isinstance(dtype, np.dtype):
        return np.dtype(dtype)
    name = str(dtype).rsplit(".", 1)[-1]
    if name == "bfloat16":
        bf16: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
        return bf16
    if name.startswith("tensor(") and name.endswith(")"):  # ONNX Runtime's "tensor(float)"
        name = {"float": "float32", "double": "float64", "float16": "float16"}.get(name[7:-1], name[7:-1])
    return np.dtype(name)


def wrap(value: object, *, to_numpy: Callable[[Any], np.ndarray] | None = None) -> DeviceTensor:
    """A DeviceTensor for any DLPack-capable array (what a Python node may return), reading
    its dtype and shape from the object (``shape`` may be a method, as on an OrtValue)."""
    if isinstance(value, DeviceTensor):
        return value
    device = device_of(value)
    shape_attr = getattr(value, "shape", None)
    shape = shape_attr() if callable(shape_attr) else shape_attr
    raw_dtype = getattr(value, "dtype", None)
    if raw_dtype is None and hasattr(value, "data_type"):  # OrtValue
        raw_dtype = value.data_type()
    if shape is None or raw_dtype is None:
        raise TypeError(f"a {type(value).__name__} has no shape or dtype to describe it by")
    return DeviceTensor(
        value, numpy_dtype(raw_dtype), tuple(int(d) for d in shape), device, to_numpy=to_numpy
    )


def is_tensor(value: object) -> bool:
    """Whether a node may put ``value`` on an edge (numpy, or a DLPack-capable array)."""
    return isinstance(value, np.ndarray | DeviceTensor) or hasattr(value, "__dlpack_device__")


def take(tensor: DeviceTensor, stream: Any) -> Any:
    """``tensor``'s value, safe to use in work queued on ``stream`` from now on: a stream
    other than the producer's first waits on the producer's event (device side)."""
    ops = tensor.ops
    if ops is None:
        return tensor.value
    if tensor.event is not None and tensor.stream is not stream:
        ops.wait(stream, tensor.event)
    ops.use(tensor.value, stream)
    return tensor.value


def produced(
    value: Any,
    stream: Any,
    ops: StreamOps,
    dtype: np.dtype[Any],
    shape: tuple[int, ...],
    device: Device,
    to_numpy: Callable[[Any], np.ndarray] | None = None,
) -> DeviceTensor:
    """A tensor made by work queued on ``stream``: an event is recorded after that work, for
    consumers on other streams to wait on."""
    event = ops.record(stream)
    return DeviceTensor(value, dtype, shape, device, stream=stream, event=event, ops=ops, to_numpy=to_numpy)


def on_current_stream(tensor: DeviceTensor) -> Any:
    """``tensor``'s value, safe for work the calling thread queues on its current stream
    (user code: a Python node computing with torch)."""
    if tensor.ops is None:
        return tensor.value
    return take(tensor, tensor.ops.current(tensor.device))


def ordered_device(node: object) -> bool:
    """Whether a node takes DLPack tensors as they come (``device_tensors = True``). A node that
    wraps another (a batcher) forwards its inner node's answer."""
    return bool(getattr(node, "device_tensors", False))


# ----------------------------------------------------------------------------- merges on the device

# concatenates DeviceTensors whose values are of one framework type, on one device, along axis
# 0, where they are; on a GPU it orders itself with take/produced on the calling thread's
# current stream
Concat = Callable[[Sequence[DeviceTensor]], DeviceTensor]
_CONCAT: dict[type, Concat] = {}


def register_concat(kind: type, concat: Concat) -> None:
    """How values of ``kind`` (``torch.Tensor``) are concatenated on their device: registered by
    the code that knows the framework (``flowserve.nodes.backends.cuda``), never imported here."""
    _CONCAT[kind] = concat


def concat_on_device(parts: Sequence[DeviceTensor]) -> DeviceTensor | None:
    """The parts concatenated along axis 0 where they are (a batch's merge with no host copy),
    or None when they are not one registered framework's tensors of one dtype on one device
    (the caller then merges on the host)."""
    head = parts[0]
    kind = type(head.value)
    concat = _CONCAT.get(kind)
    if concat is None:
        return None
    for part in parts:
        if type(part.value) is not kind or part.device != head.device or part.dtype != head.dtype:
            return None
    return concat(parts)


# ----------------------------------------------------------------------------- the fake device


class OrderingError(RuntimeError):
    """A read on a stream that the tensor's producer did not order before it."""


@dataclass(eq=False)
class FakeStream:
    device: Device
    number: int
    waited: set[int] = field(default_factory=set)  # events this stream waited on

    def __repr__(self) -> str:
        return f"stream{self.number}"


@dataclass(frozen=True, slots=True)
class FakeEvent:
    number: int
    stream: FakeStream


@dataclass(eq=False)
class FakeBuffer:
    """Device memory of the fake device: a host array only the device may read."""

    data: np.ndarray
    stream: FakeStream  # the stream whose work wrote it
    guard: int | None = None  # the event recorded after the write (views share it)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.data.dtype

    def reshape(self, shape: tuple[int, ...]) -> FakeBuffer:
        return FakeBuffer(self.data.reshape(shape), self.stream, self.guard)

    def __getitem__(self, key: Any) -> FakeBuffer:
        return FakeBuffer(self.data[key], self.stream, self.guard)


class FakeDevice:
    """A device for CI: streams, events and buffers that record every operation in ``log``
    (``("record", stream, event)``, ``("wait", stream, event)``, ``("read", stream, buffer)``,
    ``("launch", stream, name)``, ``("host_wait", event)``, ``("to_host", nbytes)``) and refuse
    (:class:`OrderingError`) a read on a stream that neither wrote the buffer nor waited on an
    event recorded after the write. It has no device-wide synchronize at all."""

    def __init__(self, index: int = 0) -> None:
        self.device = Device("cuda", index)
        self.log: list[tuple[Any, ...]] = []
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self._current: dict[Device, FakeStream] = {}

    # StreamOps
    def stream(self, device: Device) -> FakeStream:
        return FakeStream(device, next(self._numbers))

    def current(self, device: Device) -> FakeStream:
        with self._lock:
            stream = self._current.get(device)
            if stream is None:
                stream = self._current[device] = FakeStream(device, next(self._numbers))
        return stream

    def record(self, stream: FakeStream) -> FakeEvent:
        event = FakeEvent(next(self._numbers), stream)
        with self._lock:
            self.log.append(("record", stream, event))
        return event

    def wait(self, stream: FakeStream, event: FakeEvent) -> None:
        with self._lock:
            stream.waited.add(event.number)
            self.log.append(("wait", stream, event))

    def use(self, value: Any, stream: FakeStream) -> None:
        if not isinstance(value, FakeBuffer):
            return
        with self._lock:
            self.log.append(("read", stream, value))
        if value.stream is stream:
            return
        if value.guard is None or value.guard not in stream.waited:
            raise OrderingError(
                f"{stream} reads a buffer written on {value.stream} without waiting on its event"
            )

    def synchronize(self, event: FakeEvent) -> None:
        with self._lock:
            self.log.append(("host_wait", event))

    # what a fake backend does with it
    def launch(
        self, stream: FakeStream, name: str, fn: Callable[..., np.ndarray], *inputs: FakeBuffer
    ) -> FakeBuffer:
        """Queue ``fn`` over the inputs' data on ``stream``; its result is a buffer written there."""
        with self._lock:
            self.log.append(("launch", stream, name))
        return FakeBuffer(np.ascontiguousarray(fn(*(b.data for b in inputs))), stream)

    def upload(self, array: np.ndarray, stream: FakeStream) -> FakeBuffer:
        """A host array copied to the device on ``stream`` (counted by the caller)."""
        with self._lock:
            self.log.append(("upload", stream, int(array.nbytes)))
        return FakeBuffer(np.array(array, copy=True), stream)

    def tensor(self, buffer: FakeBuffer, stream: FakeStream) -> DeviceTensor:
        """The tensor a node hands on: an event recorded after ``buffer``'s write."""
        out = produced(buffer, stream, self, buffer.dtype, buffer.shape, self.device, to_numpy=self._to_numpy)
        buffer.guard = out.event.number
        return out

    def _to_numpy(self, buffer: FakeBuffer) -> np.ndarray:
        with self._lock:
            self.log.append(("to_host", int(buffer.data.nbytes)))
        return np.array(buffer.data, copy=True)

    def concat(self, parts: Sequence[DeviceTensor]) -> DeviceTensor:
        """A batch's merge on the device: on the calling thread's current stream, after waiting
        on every part's event (the one ordering rule), its own event recorded after it."""
        stream = self.current(parts[0].device)
        buffers = [cast(FakeBuffer, take(part, stream)) for part in parts]
        out = self.launch(stream, "concat", lambda *data: np.concatenate(data), *buffers)
        return self.tensor(out, stream)

    def ops(self, kind: str) -> list[tuple[Any, ...]]:
        return [entry for entry in self.log if entry[0] == kind]


def _fake_concat(parts: Sequence[DeviceTensor]) -> DeviceTensor:
    device = parts[0].ops
    if not isinstance(device, FakeDevice):
        raise TypeError("fake device buffers without their FakeDevice")
    return device.concat(parts)


register_concat(FakeBuffer, _fake_concat)


__all__ = [
    "CPU",
    "Concat",
    "Device",
    "DeviceTensor",
    "EdgeMap",
    "FakeBuffer",
    "FakeDevice",
    "FakeEvent",
    "FakeStream",
    "OrderingError",
    "StreamOps",
    "Tensor",
    "concat_on_device",
    "device_of",
    "edges",
    "host_map",
    "is_tensor",
    "numpy_dtype",
    "on_current_stream",
    "ordered_device",
    "produced",
    "register_concat",
    "take",
    "tensor_map",
    "to_host",
    "wrap",
]
