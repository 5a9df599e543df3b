"""``pb_utils.Tensor``: a numpy array, or a DLPack tensor kept where it is (host or GPU), and
where a BLS request would like its outputs (``PreferredMemory``)."""

from __future__ import annotations

import enum
from typing import Any

import ml_dtypes
import numpy as np

from flowserve.core.datatypes import from_numpy
from flowserve.core.device import DeviceTensor, on_current_stream, produced, wrap
from flowserve.nodes.backends.pb.dtypes import _DTYPE_NUMBERS
from flowserve.nodes.backends.pb.errors import TritonModelException, _GpuOnly

_BF16 = np.dtype(ml_dtypes.bfloat16)


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
        elif isinstance(capsule, Tensor):  # the same memory under the new name
            if capsule._device is not None:
                return Tensor._of_device(name, capsule._device)
            array = capsule._array
            assert array is not None
            if array.dtype.kind in "OSU":
                raise TritonModelException(
                    f"pb_utils.Tensor.from_dlpack('{name}'): tensor '{capsule._name}' is BYTES, "
                    "which DLPack does not support"
                )
            return Tensor._of(name, array)
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
            framework = getattr(device.ops, "torch", None)  # the CUDA driver's (backends/cuda.py)
            if framework is None or device.device.is_cpu:
                return _export(value, stream)
            # torch exports a CUDA tensor only while its GPU is the current device ("Can't
            # export tensors on a different CUDA device index"): a model on GPU 1 may not be
            with framework.cuda.device(device.device.index):
                return _export(value, stream)
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
        """The tensor as numpy (a view for host memory). As in Triton, a GPU tensor and a BF16
        tensor (numpy has no bfloat16) cannot be read so: use :meth:`to_dlpack`."""
        array = self._array
        if array is not None and array.dtype is not _BF16:  # the common case
            return array
        device = self._device
        if (device is None or device.device.is_cpu) and self._dtype() == _BF16:  # (GPU: _host says)
            raise TritonModelException(
                f"Tensor dtype is BF16 and cannot be converted to NumPy (tensor '{self._name}'). "
                "Use to_dlpack() and from_dlpack() instead."
            )
        return self._host()

    def _host(self) -> np.ndarray:
        """The host tensor as numpy (a view; BF16 as ``ml_dtypes.bfloat16``): what the engine
        reads (BLS inputs), without :meth:`as_numpy`'s refusals made for model.py."""
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


def _export(value: Any, stream: Any) -> Any:
    """``value.__dlpack__``, handing on the consumer's stream where the producer takes one."""
    if stream is not None:
        try:
            return value.__dlpack__(stream=stream)
        except TypeError:
            pass
    return value.__dlpack__()


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
