"""System shared memory regions registered by clients (Triton's system_shared_memory extension).

A region is a POSIX shared memory object (``/dev/shm/<key>``) mapped once at registration;
inputs are read from it and outputs written to it, every access bounds-checked. Registration
is open to any client by default (as in Triton), so the number of regions is bounded
(:data:`MAX_REGIONS`): each is a mapping the process holds until it is unregistered.

Region names are one namespace with CUDA shared memory (:mod:`flowserve.dataplane.cudashm`),
as in Triton: :meth:`SharedMemoryRegistry.read_tensor` and :meth:`~SharedMemoryRegistry.write_tensor`,
which the front ends call, find a name in either.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from flowserve.core.device import DeviceTensor, to_host
from flowserve.core.errors import AlreadyExists, InvalidArgument, NotFound, ResourceExhausted, Unsupported
from flowserve.core.limits import Limits
from flowserve.core.wire import check_shm_size, from_raw, to_raw

if TYPE_CHECKING:
    from flowserve.dataplane.cudashm import CudaSharedMemoryRegistry

SHM_ROOT = Path("/dev/shm")
# regions registered at once (Linux allows a process about 65k mappings in all)
MAX_REGIONS = 4096


@dataclass(slots=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap

    def status(self) -> dict[str, object]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


class SharedMemoryRegistry:
    def __init__(self, enabled: bool = True, max_regions: int = MAX_REGIONS) -> None:
        self.enabled = enabled
        self.max_regions = max_regions
        self._regions: dict[str, Region] = {}
        # the CUDA regions (same namespace), set by the data plane
        self.cuda: CudaSharedMemoryRegistry | None = None

    def names(self) -> Collection[str]:
        """The registered regions' names."""
        return self._regions.keys()

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise Unsupported("client shared memory is disabled on this server (start with --allow-shm)")

    def check_register(self, name: str, key: str, offset: int, byte_size: int) -> str:
        """Refuse a registration that cannot succeed (before it is made in every worker);
        returns the object's file name."""
        self._check_enabled()
        if name in self._regions or (self.cuda is not None and self.cuda.has(name)):
            raise AlreadyExists(f"shared memory region '{name}' is already registered")
        if len(self._regions) >= self.max_regions:
            raise ResourceExhausted(
                f"shared memory region '{name}': {len(self._regions)} regions are registered, the "
                "most this server holds; unregister some first"
            )
        if offset < 0 or byte_size <= 0:
            raise InvalidArgument(
                f"shared memory region '{name}': invalid offset {offset} / byte_size {byte_size}"
            )
        fname = key.lstrip("/")
        if not fname or "/" in fname or "\0" in fname or fname in (".", ".."):
            raise InvalidArgument(f"shared memory region '{name}': invalid key '{key}'")
        return fname

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        path = SHM_ROOT / self.check_register(name, key, offset, byte_size)
        try:
            # never through a symbolic link (outputs are written into the region), and only a
            # regular file: a FIFO or device under /dev/shm is not a region
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            raise InvalidArgument(
                f"unable to open shared memory region '{name}' with key '{key}': {exc.strerror}"
            ) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidArgument(
                    f"shared memory region '{name}': key '{key}' is not a shared memory object"
                )
            size = info.st_size
            if offset + byte_size > size:
                raise InvalidArgument(
                    f"shared memory region '{name}': offset {offset} + byte_size {byte_size} "
                    f"exceeds the object's size {size}"
                )
            try:
                mapping = mmap.mmap(fd, size)
            except OSError as exc:  # no address space or mapping left for it
                raise ResourceExhausted(
                    f"shared memory region '{name}': cannot map key '{key}': {exc.strerror}"
                ) from None
        finally:
            os.close(fd)
        self._regions[name] = Region(name, key, offset, byte_size, mapping)

    def unregister(self, name: str = "") -> None:
        self._check_enabled()
        names = [name] if name else list(self._regions)
        for n in names:
            region = self._regions.pop(n, None)
            if region is not None:
                # BufferError: a view is still alive; the mapping closes when it dies
                with contextlib.suppress(BufferError):
                    region.mapping.close()

    def status(self, name: str = "") -> list[dict[str, object]]:
        self._check_enabled()
        if name:
            if name not in self._regions:
                raise NotFound(f"unable to find system shared memory region: '{name}'")
            return [self._regions[name].status()]
        return [r.status() for r in self._regions.values()]

    def _span(self, name: str, offset: int, byte_size: int, tensor: str) -> tuple[Region, int]:
        self._check_enabled()
        region = self._regions.get(name)
        if region is None:
            raise NotFound(f"tensor '{tensor}': unable to find system shared memory region: '{name}'")
        check_span("shared memory", name, region.byte_size, offset, byte_size, tensor)
        return region, region.offset + offset

    def read(self, name: str, offset: int, byte_size: int, tensor: str) -> bytes:
        region, start = self._span(name, offset, byte_size, tensor)
        return bytes(region.mapping[start : start + byte_size])

    def write(self, name: str, offset: int, byte_size: int, data: bytes, tensor: str) -> None:
        region, start = self._span(name, offset, byte_size, tensor)
        if len(data) > byte_size:
            raise InvalidArgument(
                f"output '{tensor}' needs {len(data)} bytes, but shared memory region '{name}' "
                f"was given {byte_size}"
            )
        region.mapping[start : start + len(data)] = data

    def read_tensor(
        self,
        region: str,
        offset: int,
        byte_size: int,
        tensor: str,
        datatype: str,
        shape: list[int] | tuple[int, ...],
        limits: Limits,
    ) -> np.ndarray | DeviceTensor:
        """An input from a region of either kind: numpy over a copy of system shared memory,
        or a DeviceTensor view of a CUDA region (see flowserve/dataplane/cudashm.py)."""
        cuda = self.cuda
        if cuda is not None and region not in self._regions and cuda.has(region):
            return cuda.read_tensor(region, offset, byte_size, tensor, datatype, shape, limits)
        check_shm_size(tensor, datatype, shape, byte_size, limits)
        return from_raw(tensor, datatype, shape, self.read(region, offset, byte_size, tensor), limits)

    @property
    def cuda_in_use(self) -> bool:
        """Whether a CUDA region is registered: the front ends look for CUDA targets only then
        (a request's outputs cost nothing more when none is)."""
        cuda = self.cuda
        return cuda is not None and cuda.in_use

    def on_device(self, targets: Iterable[tuple[str, str]]) -> frozenset[str]:
        """Of ``(output, region)`` pairs, the outputs that go to CUDA regions: the engine
        leaves them where the graph made them, to be copied device to device."""
        cuda = self.cuda
        if cuda is None or not cuda.available:
            return frozenset()
        return frozenset(n for n, r in targets if r not in self._regions and cuda.has(r))

    def write_tensor(
        self, region: str, offset: int, byte_size: int, value: np.ndarray | DeviceTensor, tensor: str
    ) -> int:
        """An output into a region of either kind; returns the bytes written."""
        cuda = self.cuda
        if cuda is not None and region not in self._regions and cuda.has(region):
            return cuda.write(region, offset, byte_size, value, tensor)
        array = value if isinstance(value, np.ndarray) else to_host(value)[0]
        data = to_raw(array)
        self.write(region, offset, byte_size, data, tensor)
        return len(data)

    def close(self) -> None:
        for region in list(self._regions.values()):
            self.unregister(region.name)


def check_span(kind: str, name: str, size: int, offset: int, byte_size: int, tensor: str) -> None:
    """``offset`` + ``byte_size`` must lie within a region of ``size`` bytes (either kind)."""
    if offset < 0 or byte_size < 0 or offset + byte_size > size:
        raise InvalidArgument(
            f"tensor '{tensor}': {kind} region '{name}' has {size} bytes, "
            f"offset {offset} + byte_size {byte_size} does not fit"
        )
