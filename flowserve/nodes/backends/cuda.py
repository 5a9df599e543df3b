"""The real device behind :mod:`flowserve.core.device`'s ordering rule: ``torch.cuda``.

:class:`TorchCudaOps` implements :class:`~flowserve.core.device.StreamOps` with torch's CUDA
streams and events (``Stream``, ``Event.record``, ``Stream.wait_event``, ``Event.synchronize``
and ``Tensor.record_stream`` for the caching allocator). It is made only where a GPU and a CUDA
torch are present (:func:`cuda_ops`); the fake device runs the same calls in CI.

Also here, because only this package may import a framework: host copies of CUDA tensors
(:func:`cuda_to_numpy`), the torch.cuda copier behind an instance's pinned staging
(:class:`TorchCopier`, :func:`staging_for`; the pool and its logic are in
:mod:`flowserve.nodes.backends.staging`), external streams for frameworks that take a raw ``cudaStream_t``
(ONNX Runtime's ``user_compute_stream``, TensorRT's ``execute_async_v3``) and CUDA IPC for
CUDA shared memory (:func:`open_ipc_region`, :func:`ipc_handle`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from flowserve.core.device import Device, DeviceTensor, StreamOps, produced, register_concat, take
from flowserve.nodes.backends._support import Parameters, has_gpu
from flowserve.nodes.backends.staging import DEFAULT_LIMIT, LIMIT_PARAMETER, Staging
from flowserve.spec.schema import ModelSpec

log = logging.getLogger("flowserve")


class TorchCudaOps:
    """Streams and events of ``torch.cuda`` (no device-wide synchronize anywhere)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def stream(self, device: Device) -> Any:
        return self.torch.cuda.Stream(device=self.torch.device("cuda", device.index))

    def current(self, device: Device) -> Any:
        return self.torch.cuda.current_stream(self.torch.device("cuda", device.index))

    def external(self, pointer: int, device: Device) -> Any:
        """A torch view of a stream another framework made (``cudaStream_t`` as an int)."""
        return self.torch.cuda.ExternalStream(pointer, device=self.torch.device("cuda", device.index))

    def record(self, stream: Any) -> Any:
        event = self.torch.cuda.Event()
        event.record(stream)
        return event

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def use(self, value: Any, stream: Any) -> None:
        # the caching allocator must not hand this memory out again before ``stream`` is done
        record = getattr(value, "record_stream", None)
        if record is not None and getattr(value, "is_cuda", False):
            record(stream)

    def synchronize(self, event: Any) -> None:
        event.synchronize()


_lock = threading.Lock()


@functools.cache
def _ops() -> TorchCudaOps | None:
    try:
        import torch
    except Exception:
        return None
    if not torch.cuda.is_available():
        return None
    return TorchCudaOps(torch)


def cuda_ops() -> TorchCudaOps | None:
    """The CUDA device driver, or None without a GPU or a CUDA torch."""
    if not has_gpu():
        return None
    with _lock:
        return _ops()


def cuda_to_numpy(value: Any) -> np.ndarray:
    """A host numpy copy of a CUDA tensor (torch, cupy, OrtValue or any DLPack tensor)."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch
        from flowserve.nodes.backends.torch import torch_to_numpy

        return torch_to_numpy(value.detach().cpu())
    if hasattr(value, "get") and hasattr(value, "__cuda_array_interface__"):  # cupy
        return np.asarray(value.get())
    if hasattr(value, "numpy") and hasattr(value, "device_name"):  # OrtValue
        return np.asarray(value.numpy())
    if hasattr(value, "as_cpu"):  # DALI: TensorListCPU has as_array, TensorCPU the array interface
        host = value.as_cpu()
        return np.array(host.as_array() if hasattr(host, "as_array") else host, copy=True)
    return np.from_dlpack(value, device="cpu", copy=True)


def torch_tensor(value: Any, torch: Any) -> Any:
    """A torch tensor over the same memory as a DLPack value (no copy)."""
    if isinstance(value, torch.Tensor):
        return value
    return torch.from_dlpack(value)


def on_stream(tensor: DeviceTensor, stream: Any) -> Any:
    """``take``: the tensor's value ready for work on ``stream`` (the one ordering rule)."""
    return take(tensor, stream)


def for_peer_copy(tensor: DeviceTensor, ops: StreamOps) -> Any:
    """``take`` for a copy of ``tensor`` to another GPU. torch runs a copy between two GPUs on
    the *source* device's current stream (and then makes the destination's current stream
    wait for it: ``copy_device_to_device`` in ATen's Copy.cu), so it is the source device's
    current stream, not the destination's, that must wait on the producer's event."""
    return take(tensor, ops.current(tensor.device))


def cuda_tensor(
    value: Any,
    stream: Any,
    ops: TorchCudaOps,
    device: Device,
    to_numpy: Callable[[Any], np.ndarray] | None = None,
) -> DeviceTensor:
    """A CUDA result of work queued on ``stream``, with its event recorded; its host copy is
    ``to_numpy`` (an instance's ``Staging.to_numpy``), :func:`cuda_to_numpy` by default."""
    from flowserve.core.device import numpy_dtype

    shape_attr = value.shape
    shape = shape_attr() if callable(shape_attr) else shape_attr
    dtype = value.dtype if hasattr(value, "dtype") else value.data_type()
    return produced(
        value,
        stream,
        ops,
        numpy_dtype(dtype),
        tuple(int(d) for d in shape),
        device,
        to_numpy=to_numpy or cuda_to_numpy,
    )


# ----------------------------------------------------------------------------- pinned staging


def torch_dtype(torch: Any, dtype: np.dtype[Any]) -> Any:
    """torch's dtype for a numpy dtype (``ml_dtypes.bfloat16`` is ``torch.bfloat16``)."""
    if dtype == ml_dtypes.bfloat16:
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, dtype)).dtype


class TorchCopier:
    """The torch.cuda side of :class:`~flowserve.nodes.backends.staging.Staging`: pinned blocks
    from torch's pinned host allocator (``pin_memory=True``; a block it takes back is cached
    there, by power-of-two sizes as the pool's), events queried with ``Event.query``, copies
    with ``copy_(non_blocking=True)`` on the stream given."""

    def __init__(self, torch: Any, device: Device) -> None:
        self.torch = torch
        self.target = torch.device("cuda", device.index)
        self._dtypes: dict[np.dtype[Any], Any] = {}

    def _dtype(self, dtype: np.dtype[Any]) -> Any:
        found = self._dtypes.get(dtype)
        if found is None:
            found = self._dtypes[dtype] = torch_dtype(self.torch, dtype)
        return found

    def pinned(self, nbytes: int) -> np.ndarray:
        block = self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=True)
        return np.asarray(block.numpy())  # the array's base is the tensor: it keeps the memory

    def query(self, event: Any) -> bool:
        return bool(event.query())

    def _host(self, flat: np.ndarray, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Any:
        return self.torch.from_numpy(flat).view(self._dtype(dtype)).reshape(shape)

    def upload(self, host: np.ndarray, dtype: np.dtype[Any], shape: tuple[int, ...], stream: Any) -> Any:
        torch = self.torch
        source = self._host(host, dtype, shape)
        with torch.cuda.device(self.target), torch.cuda.stream(stream):
            target = torch.empty(shape, dtype=source.dtype, device=self.target)
            target.copy_(source, non_blocking=True)
        return target

    def upload_pageable(self, array: np.ndarray, stream: Any) -> Any:
        if not (array.flags.c_contiguous and array.flags.writeable):
            array = np.array(array, copy=True, order="C")  # torch takes no read-only array
        flat = array.reshape(-1).view(np.uint8)
        return self.upload(flat, array.dtype, tuple(array.shape), stream)

    def _as_torch(self, value: Any) -> Any:
        torch = self.torch
        if isinstance(value, torch.Tensor):
            return value.detach()
        if hasattr(value, "__dlpack__"):  # OrtValue, cupy, DALI: a view, no copy
            try:
                return torch.from_dlpack(value)
            except (TypeError, RuntimeError, BufferError):
                return None
        return None

    def download(self, value: Any, host: np.ndarray, stream: Any) -> bool:
        torch = self.torch
        source = self._as_torch(value)
        if source is None or not source.is_cuda:
            return False
        target = torch.from_numpy(host).view(source.dtype).reshape(source.shape)
        with torch.cuda.device(source.device), torch.cuda.stream(stream):
            target.copy_(source, non_blocking=True)
        return True

    def download_pageable(self, value: Any) -> np.ndarray:
        return cuda_to_numpy(value)


def staging_for(model: ModelSpec, ops: TorchCudaOps, device: Device, stream: Any) -> Staging | None:
    """A GPU instance's pinned staging (its two pools bounded by the model's
    ``flowserve.pinned_staging_bytes`` parameter each, 64 MiB by default), or None when the
    parameter is 0 (copies through pageable memory, as before)."""
    limit = Parameters(model).integer(LIMIT_PARAMETER, DEFAULT_LIMIT)
    if limit <= 0:
        return None
    return Staging(TorchCopier(ops.torch, device), ops, device, stream, limit)


def torch_concat(parts: Sequence[DeviceTensor]) -> DeviceTensor:
    """A batch's merge of torch tensors where they are (``torch.cat``): in host memory as is;
    on a GPU on the calling thread's current stream, after it waited on every part's event,
    with an event recorded after the copy (no synchronize)."""
    import torch

    head = parts[0]
    ops = next((p.ops for p in parts if p.ops is not None), None)
    if head.device.is_cpu or ops is None:
        value = torch.cat([p.value for p in parts])
        shape = tuple(int(d) for d in value.shape)
        return DeviceTensor(value, head.dtype, shape, head.device, to_numpy=head.to_numpy_fn)
    stream = ops.current(head.device)
    values = [take(p, stream) for p in parts]
    with torch.cuda.device(head.device.index), torch.cuda.stream(stream):
        value = torch.cat(values)
    shape = tuple(int(d) for d in value.shape)
    return produced(value, stream, ops, head.dtype, shape, head.device, to_numpy=cuda_to_numpy)


def register_torch_concat() -> bool:
    """Register :func:`torch_concat` for ``torch.Tensor`` (False without torch)."""
    try:
        import torch
    except Exception:
        return False
    register_concat(torch.Tensor, torch_concat)
    return True


# ----------------------------------------------------------------------------- CUDA IPC


IPC_HANDLE_SIZE = 64  # sizeof(cudaIpcMemHandle_t)
_TORCH_CUDA_MALLOC = ord("c")  # torch's shareable handle of a cudaMalloc'd segment (not an expandable one)


def ipc_handle(pointer_owner: Any) -> bytes:
    """The ``cudaIpcMemHandle_t`` (64 bytes) of a CUDA allocation (a torch tensor's storage),
    as a client registering CUDA shared memory sends it. The storage must start its
    allocation (a fresh tensor of its own, as tritonclient's ``cudaMalloc`` gives)."""
    storage = pointer_owner.untyped_storage()
    _device, handle, _size, offset, *_ = storage._share_cuda_()
    if offset:
        raise ValueError(f"the tensor starts {offset} bytes into its CUDA allocation; share a fresh one")
    return raw_ipc_handle(bytes(handle))


def raw_ipc_handle(shared: bytes) -> bytes:
    """The 64-byte ``cudaIpcMemHandle_t`` inside what torch's ``_share_cuda_()`` returns: the
    handle itself (older torch) or a version byte (2; 3 since torch 2.13, same layout), a kind
    byte (``c``: cudaMalloc) and the handle: 66 bytes (``shareIpcHandle`` of torch's caching
    allocator since expandable segments; ``e``, an expandable segment, has no such handle)."""
    if len(shared) == IPC_HANDLE_SIZE:
        return shared
    if len(shared) == IPC_HANDLE_SIZE + 2 and shared[1] == _TORCH_CUDA_MALLOC:
        return shared[2:]
    raise ValueError(f"not a cudaMalloc IPC handle ({len(shared)} bytes, kind byte {shared[1:2]!r})")


@functools.cache
def _ipc_handle_type() -> Any:
    """``cudaIpcMemHandle_t`` as ctypes sees it: a struct of 64 bytes, passed by value (a bare
    ``c_char * 64`` argument would be passed as a pointer, and CUDA answers cudaError 1)."""
    import ctypes

    class CudaIpcMemHandle(ctypes.Structure):
        _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_SIZE)]

    return CudaIpcMemHandle


def declare_ipc(cudart: Any) -> Any:
    """Declare the argument types of the CUDA runtime's IPC calls on ``cudart`` (a ctypes
    library), so the handle goes by value and pointers keep their 64 bits."""
    import ctypes

    open_args = [ctypes.POINTER(ctypes.c_void_p), _ipc_handle_type(), ctypes.c_uint]
    cudart.cudaIpcOpenMemHandle.argtypes = open_args
    cudart.cudaIpcOpenMemHandle.restype = ctypes.c_int
    cudart.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
    cudart.cudaIpcCloseMemHandle.restype = ctypes.c_int
    # const char* cudaGetErrorString(cudaError_t): a pointer, not an int (64-bit safe); only
    # for messages, so a runtime without it still opens handles
    error_string = getattr(cudart, "cudaGetErrorString", None)
    if error_string is not None:
        error_string.argtypes = [ctypes.c_int]
        error_string.restype = ctypes.c_char_p
    set_device = getattr(cudart, "cudaSetDevice", None)  # cudaError_t cudaSetDevice(int device)
    if set_device is not None:
        set_device.argtypes = [ctypes.c_int]
        set_device.restype = ctypes.c_int
    last_error = getattr(cudart, "cudaGetLastError", None)  # cudaError_t cudaGetLastError(void)
    if last_error is not None:
        last_error.argtypes = []
        last_error.restype = ctypes.c_int
    return cudart


def cuda_error(cudart: Any, status: int) -> str:
    """``cudaError <n>: <CUDA's text>`` (the number alone where the text cannot be had)."""
    try:
        text = cudart.cudaGetErrorString(int(status))
    except Exception:
        text = None
    name = text.decode(errors="replace") if isinstance(text, bytes) else ""
    return f"cudaError {status}: {name}" if name else f"cudaError {status}"


def cuda_failure(cudart: Any, call: str, status: int) -> RuntimeError:
    """The error of a failed runtime call, after clearing it as this thread's last error: the
    runtime keeps it there, and torch (the same libcudart) checks ``cudaGetLastError`` after
    each kernel it launches, so a client's bad handle would fail the next inference on this
    thread as "invalid argument"."""
    last_error = getattr(cudart, "cudaGetLastError", None)
    if last_error is not None:
        with contextlib.suppress(Exception):
            last_error()
    return RuntimeError(f"{call} failed ({cuda_error(cudart, status)})")


class _Opened:
    """Stands for a region's open mapping: when the last reference goes, a finalizer closes it
    (``cudaIpcCloseMemHandle``). The region holds one until it is closed, and every torch tensor
    over the region holds one through its :class:`_CudaView` (torch keeps the object whose
    ``__cuda_array_interface__`` it views until that memory is freed), so a region unregistered
    while a request still reads it is unmapped after that request, not under it (an access to
    unmapped device memory is a fault that ends the process's CUDA context)."""

    __slots__ = ("__weakref__",)


def _close_mapping(cudart: Any, pointer: int) -> None:
    import ctypes

    status = cudart.cudaIpcCloseMemHandle(ctypes.c_void_p(pointer))
    if status != 0:
        log.warning("%s", cuda_failure(cudart, "cudaIpcCloseMemHandle", status))


class IpcRegion:
    """Device memory another process exported with ``cudaIpcGetMemHandle``, opened here with
    ``cudaIpcOpenMemHandle`` (through the CUDA runtime, ``cudart``), as a flat byte buffer a
    torch tensor views without a copy."""

    def __init__(self, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        import ctypes

        import torch

        if len(raw_handle) != IPC_HANDLE_SIZE:
            raise ValueError(f"a cudaIpcMemHandle_t is {IPC_HANDLE_SIZE} bytes, got {len(raw_handle)}")
        self.device_id = device_id
        self.byte_size = byte_size
        self._torch = torch
        self._cudart = _cudart()
        with torch.cuda.device(device_id):
            # the handle opens on the calling thread's current device: device_id, for this
            # runtime too (torch set it through its own, which may be another copy of libcudart)
            set_device = getattr(self._cudart, "cudaSetDevice", None)
            status = set_device(device_id) if set_device is not None else 0
            if status != 0:
                raise cuda_failure(self._cudart, f"cudaSetDevice({device_id})", status)
            pointer = ctypes.c_void_p()
            handle = _ipc_handle_type().from_buffer_copy(raw_handle)
            # cudaIpcOpenMemHandle(void** devPtr, cudaIpcMemHandle_t handle, unsigned flags):
            # flag 1 is cudaIpcMemLazyEnablePeerAccess
            status = self._cudart.cudaIpcOpenMemHandle(ctypes.byref(pointer), handle, 1)
            if status != 0:
                raise cuda_failure(self._cudart, "cudaIpcOpenMemHandle", status)
        self.pointer = int(pointer.value or 0)
        self._keeper: _Opened | None = _Opened()
        finalizer = weakref.finalize(self._keeper, _close_mapping, self._cudart, self.pointer)
        finalizer.atexit = False  # the process's end unmaps it

    def _bytes(self, offset: int, byte_size: int) -> Any:
        """A torch uint8 tensor over ``[offset, offset + byte_size)`` of the region (no copy)."""
        if not self.pointer:
            raise RuntimeError("the CUDA shared memory region is closed")
        if offset < 0 or offset + byte_size > self.byte_size:
            raise ValueError(
                f"offset {offset} + byte size {byte_size} exceeds the region's {self.byte_size} bytes"
            )
        return _CudaView(self.pointer + offset, byte_size, self.device_id, self._keeper).as_torch(self._torch)

    def _view(self, offset: int, byte_size: int, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Any:
        """A torch tensor of ``dtype`` over ``[offset, offset + byte_size)`` of the region: a
        view, or a copy of the bytes where the offset leaves the elements misaligned (a kernel
        reading a misaligned element faults, and that fault ends the process's CUDA context)."""
        torch = self._torch
        raw = self._bytes(offset, byte_size)
        if (self.pointer + offset) % np.dtype(dtype).itemsize:
            raw = raw.clone()  # the caching allocator's blocks are aligned
            if raw.is_cuda:  # copied on that device's current stream: done before any other reads it
                torch.cuda.current_stream(raw.device).synchronize()
        return raw.view(torch_dtype(torch, np.dtype(dtype))).reshape(shape)

    def tensor(
        self, offset: int, byte_size: int, dtype: np.dtype[Any], shape: tuple[int, ...]
    ) -> DeviceTensor:
        """An input in the region as a DeviceTensor on its GPU (a view, or a copy where the
        offset misaligns the elements; no stream or event: the client finished writing it
        before it sent the request, as Triton assumes)."""
        view = self._view(offset, byte_size, dtype, shape)
        where = Device("cuda", self.device_id)
        return DeviceTensor(view, np.dtype(dtype), shape, where, ops=cuda_ops(), to_numpy=cuda_to_numpy)

    def read(self, offset: int, byte_size: int) -> bytes:
        """A host copy of ``[offset, offset + byte_size)`` (BYTES inputs)."""
        return bytes(self._bytes(offset, byte_size).cpu().numpy().tobytes())

    def write(self, offset: int, value: np.ndarray | DeviceTensor) -> None:
        """An output copied into the region: device to device on a stream of this region's
        device that first waits on the producer's event, host to device for a host output;
        the host then waits for that copy's event only (the response follows)."""
        torch = self._torch
        ops = cuda_ops()
        if isinstance(value, DeviceTensor) and not value.device.is_cpu and ops is not None:
            target = self._bytes(offset, value.nbytes)  # bytes: any offset, aligned or not
            where = Device("cuda", self.device_id)
            stream = ops.current(where)
            # from another GPU torch copies on that GPU's current stream: it waits for the producer
            taken = take(value, stream) if value.device == where else for_peer_copy(value, ops)
            with torch.cuda.device(value.device.index):  # torch's __dlpack__ wants its own device current
                source = torch_tensor(taken, torch)
            with torch.cuda.device(self.device_id), torch.cuda.stream(stream):
                target.copy_(source.contiguous().reshape(-1).view(torch.uint8), non_blocking=True)
            ops.synchronize(ops.record(stream))
            return
        if isinstance(value, DeviceTensor):
            array, _ = value.host()
        else:
            array = value
        host = np.ascontiguousarray(array)
        if not host.flags.writeable:  # torch.from_numpy warns on a read-only array
            host = host.copy()
        target = self._bytes(offset, int(host.nbytes))
        target.copy_(torch.from_numpy(host.reshape(-1).view(np.uint8)))  # synchronous host -> device

    def close(self) -> None:
        """No new views; the mapping closes now, or after the last tensor over it is freed."""
        self.pointer = 0
        self._keeper = None


class _CudaView:
    """``__cuda_array_interface__`` over raw device memory (how torch views a foreign pointer),
    as bytes: torch parses ``typestr`` with numpy, which has no bfloat16 (``ml_dtypes``' is
    ``<V2``, a void type torch refuses), so the caller views the bytes as its dtype in torch."""

    def __init__(self, pointer: int, byte_size: int, device: int, keeper: _Opened | None = None) -> None:
        self.keeper = keeper  # the mapping stays open while torch holds this view
        self.__cuda_array_interface__ = {
            "shape": (byte_size,),
            "typestr": "|u1",
            "data": (pointer, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }
        self.device = device
        self.byte_size = byte_size

    def as_torch(self, torch: Any) -> Any:
        with torch.cuda.device(self.device):
            return torch.as_tensor(self, device=f"cuda:{self.device}")


def cudart_candidates(maps: str, torch_lib: Path, site: Path, cuda_version: str | None) -> list[str]:
    """Where the CUDA runtime is, best first: the libcudart this process has already mapped
    (``maps``: /proc/self/maps; torch's own, loaded with ``import torch`` from the
    nvidia-cuda-runtime wheel: ``nvidia/cuda_runtime/lib/libcudart.so.12`` for CUDA 12,
    ``nvidia/cu13/lib/libcudart.so.13`` for CUDA 13), then torch's lib folder, those wheels'
    folders, and last the soname of torch's CUDA major version (``libcudart.so.12``) from the
    loader's path. Never the unversioned ``libcudart.so`` first: it is a toolkit's development
    link (absent where only the runtime is installed), possibly of another CUDA version."""
    found: list[str] = []

    def add(name: str) -> None:
        if name not in found:
            found.append(name)

    for line in maps.splitlines():
        mapped = line.split()[-1] if line.split() else ""
        if mapped.startswith("/") and Path(mapped).name.startswith("libcudart.so"):
            add(mapped)
    major = (cuda_version or "").split(".")[0]
    wheels = sorted(site.glob("nvidia/*/lib/libcudart.so*"))
    wheels = [w for w in wheels if not major or w.name.startswith(f"libcudart.so.{major}")] or wheels
    for path in [*sorted(torch_lib.glob("libcudart*.so*")), *wheels]:
        add(str(path))
    if major:
        add(f"libcudart.so.{major}")
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        add(name)
    return found


@functools.cache
def _cudart() -> Any:
    """The CUDA runtime library torch loaded (libcudart), for the IPC calls torch does not
    expose (:func:`cudart_candidates` says where it is looked for)."""
    import ctypes

    import torch

    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    torch_lib = Path(torch.__file__).resolve().parent / "lib"
    site = torch_lib.parent.parent
    tried: list[str] = []
    for name in cudart_candidates(maps, torch_lib, site, getattr(torch.version, "cuda", None)):
        try:
            return declare_ipc(ctypes.CDLL(name))
        except (OSError, AttributeError) as exc:
            tried.append(f"{name} ({exc})")
    raise RuntimeError(
        f"the CUDA runtime (libcudart) cannot be loaded for CUDA IPC; tried {'; '.join(tried)}"
    )


def open_ipc_region(raw_handle: bytes, device_id: int, byte_size: int) -> IpcRegion:
    """Open a client's CUDA shared-memory region (RuntimeError naming why not)."""
    if cuda_ops() is None:
        raise RuntimeError("CUDA shared memory needs a GPU and a CUDA build of torch")
    return IpcRegion(raw_handle, device_id, byte_size)


__all__ = [
    "IpcRegion",
    "TorchCopier",
    "TorchCudaOps",
    "cuda_error",
    "cuda_failure",
    "cuda_ops",
    "cuda_tensor",
    "cuda_to_numpy",
    "cudart_candidates",
    "for_peer_copy",
    "ipc_handle",
    "on_stream",
    "open_ipc_region",
    "raw_ipc_handle",
    "register_torch_concat",
    "staging_for",
    "torch_concat",
    "torch_dtype",
    "torch_tensor",
]
