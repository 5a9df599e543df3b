"""CUDA shared memory regions registered by clients (Triton's cuda_shared_memory extension).

A client exports device memory with ``cudaIpcGetMemHandle`` and registers it by name with the
raw handle (64 bytes; base64 in HTTP's JSON), its device id and its byte size. The server opens
each region once, when it is registered (``cudaIpcOpenMemHandle``, in every worker with
``--workers``), and closes it when it is unregistered or the server stops. Inputs read from a
region reach the nodes as :class:`~flowserve.core.device.DeviceTensor` views of that memory on
its device (no host copy; a node that wants numpy gets a counted copy from the executor);
outputs are copied into a region on the device (host to device for an output on the host).
Every access is bounds-checked against the registered size, with errors naming the region, the
tensor and the sizes. Region names share one namespace with system shared memory.

Where a region comes from is a seam, an :data:`Opener`: where CUDA is present it is
:func:`flowserve.nodes.backends.cuda.open_ipc_region` (through the CUDA runtime); CI passes
:class:`HostMemoryOpener`, whose "handles" name host buffers seen as fake-GPU memory
(:class:`~flowserve.core.device.FakeDevice`), so the protocol paths are tested without a GPU.
Without CUDA there is no opener and the behaviour is Triton's without GPU support: registering
is UNSUPPORTED, status lists no regions (a named one is NOT_FOUND), unregistering is a no-op.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from flowserve.core.datatypes import to_numpy
from flowserve.core.device import DeviceTensor, FakeBuffer, FakeDevice, to_host
from flowserve.core.errors import AlreadyExists, InvalidArgument, NotFound, ResourceExhausted, Unsupported
from flowserve.core.limits import Limits
from flowserve.core.wire import check_shm_size, from_raw, to_raw
from flowserve.dataplane.shm import check_span

log = logging.getLogger("flowserve")

NO_CUDA_SHM = "CUDA shared memory is not supported by this server (no GPU support); use system shared memory"
# regions registered at once (each holds an open IPC mapping of device memory)
MAX_CUDA_REGIONS = 1024
IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)


class CudaRegion(Protocol):
    """An opened region: device memory of ``byte_size`` bytes on GPU ``device_id``."""

    device_id: int
    byte_size: int

    def tensor(
        self, offset: int, byte_size: int, dtype: np.dtype[Any], shape: tuple[int, ...]
    ) -> DeviceTensor:
        """A view of ``[offset, offset + byte_size)`` as a tensor on the device (no copy)."""

    def read(self, offset: int, byte_size: int) -> bytes:
        """A host copy of ``[offset, offset + byte_size)`` (BYTES inputs)."""

    def write(self, offset: int, value: np.ndarray | DeviceTensor) -> None:
        """``value`` copied to ``offset`` (device to device, or host to device), complete
        when this returns (the client reads it once the response arrives)."""

    def close(self) -> None:
        """Release the mapping (``cudaIpcCloseMemHandle``)."""


# (raw handle, device id, byte size) -> an opened region; ValueError for a handle that is not one
Opener = Callable[[bytes, int, int], CudaRegion]


def cuda_opener() -> Opener | None:
    """The real opener where a GPU and a CUDA build of torch are present, else None."""
    try:
        from flowserve.nodes.backends.cuda import cuda_ops, open_ipc_region
    except Exception:  # pragma: no cover - the backends package always imports
        return None
    try:
        if cuda_ops() is None:
            return None
    except Exception as exc:  # a broken CUDA install: no CUDA shared memory, said once
        log.warning("CUDA shared memory is off: %s", exc)
        return None
    return open_ipc_region


@dataclass(slots=True)
class _Registered:
    name: str
    device_id: int
    byte_size: int
    region: CudaRegion

    def status(self) -> dict[str, object]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}


class CudaSharedMemoryRegistry:
    """The server's CUDA shared-memory regions (module docstring). ``opener``: how a handle is
    opened; ``"auto"`` finds CUDA (:func:`cuda_opener`), None means no CUDA here."""

    def __init__(
        self, opener: Opener | str | None = "auto", enabled: bool = True, max_regions: int = MAX_CUDA_REGIONS
    ) -> None:
        self.opener: Opener | None = cuda_opener() if opener == "auto" else opener  # type: ignore[assignment]
        self.enabled = enabled
        self.max_regions = max_regions
        self._regions: dict[str, _Registered] = {}
        self._lock = threading.Lock()  # registration vs the worker threads' reads and writes
        # names of the system shared-memory regions (one namespace), set by the data plane
        self.taken: Callable[[], Collection[str]] = tuple

    @property
    def available(self) -> bool:
        """Whether CUDA shared memory works here (a GPU, or the CI seam)."""
        return self.opener is not None

    def has(self, name: str) -> bool:
        return name in self._regions

    @property
    def in_use(self) -> bool:
        """Whether any region is registered (a request can only name one then)."""
        return bool(self._regions)

    # ------------------------------------------------------------------ registration

    def check_register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Refuse a registration that cannot succeed (before it is made in every worker)."""
        if self.opener is None:
            raise Unsupported(NO_CUDA_SHM)
        if not self.enabled:
            raise Unsupported("client shared memory is disabled on this server (start with --allow-shm)")
        where = f"CUDA shared memory region '{name}'"
        if not name:
            raise InvalidArgument("a CUDA shared memory region needs a name")
        if name in self._regions or name in self.taken():
            raise AlreadyExists(f"{where} is already registered")
        if len(self._regions) >= self.max_regions:
            raise ResourceExhausted(
                f"{where}: {len(self._regions)} CUDA regions are registered, the most this server "
                "holds; unregister some first"
            )
        if len(raw_handle) != IPC_HANDLE_BYTES:
            raise InvalidArgument(
                f"{where}: raw_handle is {len(raw_handle)} bytes, a cudaIpcMemHandle_t is {IPC_HANDLE_BYTES}"
            )
        if device_id < 0:
            raise InvalidArgument(f"{where}: invalid device_id {device_id}")
        if byte_size <= 0:
            raise InvalidArgument(f"{where}: invalid byte_size {byte_size}")

    def register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Open the client's region once; INVALID_ARG naming the region when the handle does
        not open (not a handle, another device, freed memory)."""
        self.check_register(name, raw_handle, device_id, byte_size)
        assert self.opener is not None
        try:
            region = self.opener(raw_handle, device_id, byte_size)
        except (ValueError, RuntimeError, OSError) as exc:
            raise InvalidArgument(
                f"unable to open CUDA shared memory region '{name}' on device {device_id}: {exc}"
            ) from None
        with self._lock:
            self._regions[name] = _Registered(name, device_id, byte_size, region)

    def unregister(self, name: str = "") -> None:
        """Close one region, or every region (no name); an unknown name is a no-op, as in Triton."""
        with self._lock:
            names = [name] if name else list(self._regions)
            gone = [r for r in (self._regions.pop(n, None) for n in names) if r is not None]
        for registered in gone:
            try:
                registered.region.close()
            except Exception as exc:  # the client may have freed it already: nothing left to do
                log.warning("closing CUDA shared memory region '%s': %s", registered.name, exc)

    def status(self, name: str = "") -> list[dict[str, object]]:
        if name:
            registered = self._regions.get(name)
            if registered is None:
                why = "" if self.opener is not None else f" ({NO_CUDA_SHM})"
                raise NotFound(f"unable to find CUDA shared memory region: '{name}'{why}")
            return [registered.status()]
        return [r.status() for r in self._regions.values()]

    def close(self) -> None:
        self.unregister()

    # ------------------------------------------------------------------ tensors

    def _span(self, name: str, offset: int, byte_size: int, tensor: str) -> _Registered:
        registered = self._regions.get(name)
        if registered is None:
            raise NotFound(f"tensor '{tensor}': unable to find CUDA shared memory region: '{name}'")
        check_span("CUDA shared memory", name, registered.byte_size, offset, byte_size, tensor)
        return registered

    def read_tensor(
        self,
        name: str,
        offset: int,
        byte_size: int,
        tensor: str,
        datatype: str,
        shape: list[int] | tuple[int, ...],
        limits: Limits,
    ) -> np.ndarray | DeviceTensor:
        """An input from a region: a DeviceTensor view of its memory (BYTES: decoded on the host)."""
        check_shm_size(tensor, datatype, shape, byte_size, limits)
        registered = self._span(name, offset, byte_size, tensor)
        if datatype == "BYTES":
            return from_raw(tensor, datatype, shape, registered.region.read(offset, byte_size), limits)
        dims = tuple(int(d) for d in shape)
        return registered.region.tensor(offset, byte_size, to_numpy(datatype), dims)

    def write(
        self, name: str, offset: int, byte_size: int, value: np.ndarray | DeviceTensor, tensor: str
    ) -> int:
        """An output into a region; returns the bytes written. BYTES go through the host."""
        registered = self._span(name, offset, byte_size, tensor)
        if value.dtype.kind in "OSU":
            host, _ = to_host(value)
            data = np.frombuffer(to_raw(host), np.uint8)
            value = data
        needed = int(value.nbytes)
        if needed > byte_size:
            raise InvalidArgument(
                f"output '{tensor}' needs {needed} bytes, but CUDA shared memory region '{name}' "
                f"was given {byte_size}"
            )
        registered.region.write(offset, value)
        return needed


# ----------------------------------------------------------------------------- the CI seam


class HostMemoryRegion:
    """A "CUDA" region that is a host buffer seen as memory of a :class:`FakeDevice`: inputs
    are fake-GPU tensors (a numpy node gets them through a counted host copy, a read on a
    stream that did not wait for the client's event fails), outputs are written into it."""

    def __init__(self, buffer: np.ndarray, device: FakeDevice, byte_size: int) -> None:
        self.buffer = buffer
        self.device = device
        self.device_id = device.device.index
        self.byte_size = byte_size
        self.closed = False
        self._client = device.stream(device.device)  # where "the client" wrote the memory

    def tensor(
        self, offset: int, byte_size: int, dtype: np.dtype[Any], shape: tuple[int, ...]
    ) -> DeviceTensor:
        self._check()
        view = self.buffer[offset : offset + byte_size].view(dtype).reshape(shape)
        return self.device.tensor(FakeBuffer(view, self._client), self._client)

    def read(self, offset: int, byte_size: int) -> bytes:
        self._check()
        return self.buffer[offset : offset + byte_size].tobytes()

    def write(self, offset: int, value: np.ndarray | DeviceTensor) -> None:
        self._check()
        if isinstance(value, DeviceTensor) and isinstance(value.value, FakeBuffer):
            self.device.use(value.value, value.stream)  # a device-to-device copy on its stream
            data = np.ascontiguousarray(value.value.data)
        else:
            host, _ = to_host(value)
            data = np.ascontiguousarray(host)
            self.device.log.append(("upload", self._client, int(data.nbytes)))
        raw = data.reshape(-1).view(np.uint8)
        self.buffer[offset : offset + raw.size] = raw

    def close(self) -> None:
        self.closed = True

    def _check(self) -> None:
        if self.closed:
            raise RuntimeError("region used after it was closed")


class HostMemoryOpener:
    """The CI opener: a "handle" is any 64 bytes :meth:`export` handed out for a host buffer."""

    def __init__(self, device: FakeDevice | None = None) -> None:
        self.device = device or FakeDevice()
        self.buffers: dict[bytes, np.ndarray] = {}
        self.opened: list[HostMemoryRegion] = []

    def export(self, buffer: np.ndarray) -> bytes:
        """The handle of ``buffer`` (uint8, the "device memory" a client allocated)."""
        handle = len(self.buffers).to_bytes(4, "little") + b"\x5a" * (IPC_HANDLE_BYTES - 4)
        self.buffers[handle] = buffer
        return handle

    def __call__(self, raw_handle: bytes, device_id: int, byte_size: int) -> HostMemoryRegion:
        buffer = self.buffers.get(raw_handle)
        if buffer is None:
            raise ValueError("not a handle this process exported (cudaErrorInvalidValue)")
        if device_id != self.device.device.index:
            raise ValueError(f"no device {device_id} (cudaErrorInvalidDevice)")
        if byte_size > buffer.nbytes:
            raise ValueError(f"byte_size {byte_size} is more than the allocation's {buffer.nbytes} bytes")
        region = HostMemoryRegion(buffer, self.device, byte_size)
        self.opened.append(region)
        return region


__all__ = [
    "IPC_HANDLE_BYTES",
    "MAX_CUDA_REGIONS",
    "NO_CUDA_SHM",
    "CudaRegion",
    "CudaSharedMemoryRegistry",
    "HostMemoryOpener",
    "HostMemoryRegion",
    "Opener",
    "cuda_opener",
]
