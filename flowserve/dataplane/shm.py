"""System shared memory regions registered by clients (Triton's system_shared_memory extension).

A region is a POSIX shared memory object (``/dev/shm/<key>``) opened once at registration
and kept open until it is unregistered; inputs are read from it with ``pread`` and outputs
written to it with ``pwrite``, every access bounds-checked against the span registered and
against the object's size at that moment. Registration is open to any client by default (as in
Triton), so the number of regions is bounded (:data:`MAX_REGIONS`): each holds one file
descriptor.

Why no mapping: the client owns the object and may shrink it (``ftruncate``) at any time.
Touching a mapped page past the object's end raises SIGBUS, which kills the process (Triton
2.51 dies this way); ``pread`` and ``pwrite`` cannot fault. A read past the end comes back
short: the request gets INVALID_ARGUMENT naming the region, the tensor, the span and the
object's size now. A write checks the size first (``fstat``: past the end ``pwrite`` would
grow the object again); a shrink between that check and the copy only grows it back within
the span the client registered. Either way the server lives. The cost against a copy through
a mapping is in ``benchmarks/shm_path.py`` (a syscall or two per tensor; a 16 MiB output is
faster, as numeric outputs are written from the array's own buffer).

Region names are one namespace with CUDA shared memory (:mod:`flowserve.dataplane.cudashm`),
as in Triton: :meth:`SharedMemoryRegistry.read_tensor` and :meth:`~SharedMemoryRegistry.write_tensor`,
which the front ends call, find a name in either.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from flowserve.core.device import DeviceTensor, to_host
from flowserve.core.errors import AlreadyExists, InvalidArgument, NotFound, ResourceExhausted, Unsupported
from flowserve.core.limits import Limits
from flowserve.core.wire import check_shm_size, from_raw, raw_view
from flowserve.dataplane.memory import buffer

if TYPE_CHECKING:
    from flowserve.dataplane.cudashm import CudaSharedMemoryRegistry

SHM_ROOT = Path("/dev/shm")
# regions registered at once: each holds a file descriptor (server.open_files_for counts them)
MAX_REGIONS = 4096
READ_INTO_FROM = 4 << 20  # inputs this large are read into a buffer of huge pages (_pread)


class _File:
    """An open shared memory object, closed when the last reference to it goes: a read in a
    worker thread holds one, so an unregister meanwhile never closes the descriptor under it
    (nor lets the number be reused for another file before the read is done)."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self, _close: Callable[[int], None] = os.close) -> None:
        _close(self.fd)


@dataclass(slots=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    file: _File

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
            if exc.errno in (errno.EMFILE, errno.ENFILE):  # no descriptor left for it
                raise ResourceExhausted(
                    f"shared memory region '{name}': cannot open key '{key}': {exc.strerror}"
                ) from None
            raise InvalidArgument(
                f"unable to open shared memory region '{name}' with key '{key}': {exc.strerror}"
            ) from None
        file = _File(fd)  # closes the descriptor if the checks below refuse the region
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidArgument(f"shared memory region '{name}': key '{key}' is not a shared memory object")
        if offset + byte_size > info.st_size:
            raise InvalidArgument(
                f"shared memory region '{name}': offset {offset} + byte_size {byte_size} "
                f"exceeds the object's size {info.st_size}"
            )
        self._regions[name] = Region(name, key, offset, byte_size, file)

    def unregister(self, name: str = "") -> None:
        self._check_enabled()
        names = [name] if name else list(self._regions)
        for n in names:
            # its descriptor closes with the last reference (at once, unless a read holds it)
            self._regions.pop(n, None)

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

    def read(self, name: str, offset: int, byte_size: int, tensor: str) -> bytes | memoryview:
        """``byte_size`` bytes at ``offset`` in region ``name``, for input ``tensor``."""
        region, start = self._span(name, offset, byte_size, tensor)
        file = region.file  # held for the read: see _File
        try:
            data = _pread(file.fd, byte_size, start)
        except OSError as exc:
            raise InvalidArgument(
                f"tensor '{tensor}': cannot read shared memory region '{name}': {exc.strerror}"
            ) from None
        if data is None:  # the object ends before the span: pread stopped there
            raise _past_end(region, file, offset, byte_size, tensor)
        return data

    def write(self, name: str, offset: int, byte_size: int, data: memoryview, tensor: str) -> None:
        """``data`` (bytes of output ``tensor``) at ``offset`` in region ``name``, whose span
        for it is ``byte_size`` bytes."""
        region, start = self._span(name, offset, byte_size, tensor)
        size = data.nbytes
        if size > byte_size:
            raise InvalidArgument(
                f"output '{tensor}' needs {size} bytes, but shared memory region '{name}' "
                f"was given {byte_size}"
            )
        file = region.file
        # past the object's end pwrite would grow it back: the client gets an error instead
        _check_size(region, file, offset, size, tensor)
        try:
            _pwrite(file.fd, data, start)
        except OSError as exc:  # e.g. ENOSPC: the client's object is sparse and /dev/shm is full
            raise InvalidArgument(
                f"output '{tensor}': cannot write shared memory region '{name}': {exc.strerror}"
            ) from None

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
        data = memoryview(raw_view(array))  # the array's own bytes where they are the wire's
        self.write(region, offset, byte_size, data, tensor)
        return data.nbytes

    def close(self) -> None:
        for region in list(self._regions.values()):
            self.unregister(region.name)


def _check_size(region: Region, file: _File, offset: int, byte_size: int, tensor: str) -> None:
    """The object behind ``region`` still holds ``offset`` + ``byte_size`` (its client may
    have shrunk it since it was registered)."""
    if region.offset + offset + byte_size > os.fstat(file.fd).st_size:
        raise _past_end(region, file, offset, byte_size, tensor)


def _past_end(region: Region, file: _File, offset: int, byte_size: int, tensor: str) -> InvalidArgument:
    """The error for a span past the end of a region's object, naming its size now."""
    size = os.fstat(file.fd).st_size
    start = region.offset + offset
    return InvalidArgument(
        f"tensor '{tensor}': shared memory region '{region.name}' (key '{region.key}') is {size} bytes "
        f"now, offset {offset} + byte_size {byte_size} (bytes {start} to {start + byte_size} of the "
        "object) is past its end: was it truncated after it was registered?"
    )


def _pread(fd: int, size: int, start: int) -> bytes | memoryview | None:
    """``size`` bytes at ``start`` of ``fd``; None when the file ends first. A large span is
    read into :func:`flowserve.dataplane.memory.buffer` (huge pages): a 64 MiB ``bytes`` is
    mapped afresh for every request and faulted in 4 KiB at a time (16,385 faults a request)."""
    if size >= READ_INTO_FROM:
        into = buffer(size)
        got = 0
        while got < size:  # a short read: one read's cap (about 2 GiB), or the end of the file
            count = os.preadv(fd, [into[got:]], start + got)
            if not count:
                return None
            got += count
        return into.toreadonly()  # inputs stay read-only, as bytes made them (and HTTP and gRPC do)
    data = os.pread(fd, size, start)
    if len(data) == size:
        return data
    parts = [data]  # a short read: one read's cap (about 2 GiB), or the end of the file
    got = len(data)
    while got < size:
        more = os.pread(fd, size - got, start + got)
        if not more:
            return None
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _pwrite(fd: int, data: memoryview, start: int) -> None:
    """All of ``data`` at ``start`` of ``fd`` (past the file's end it grows, never faults)."""
    done = os.pwrite(fd, data, start)
    while done < data.nbytes:
        done += os.pwrite(fd, data[done:], start + done)


def check_span(kind: str, name: str, size: int, offset: int, byte_size: int, tensor: str) -> None:
    """``offset`` + ``byte_size`` must lie within a region of ``size`` bytes (either kind)."""
    if offset < 0 or byte_size < 0 or offset + byte_size > size:
        raise InvalidArgument(
            f"tensor '{tensor}': {kind} region '{name}' has {size} bytes, "
            f"offset {offset} + byte_size {byte_size} does not fit"
        )
