"""Shared memory for the large tensors that cross a link (``cluster/link.py``).

A buffer of at least :data:`SHARED_MIN` bytes does not travel through the link's socket: the
sender copies it once into a block of its :class:`Arena` (shared memory it created in
``/dev/shm``) and sends the block's place (segment, offset, length); the receiver's
:class:`Mapping` maps the segment (once per segment and link) and hands pickle a
numpy view of the block, which the unpickled array then uses as its memory: no copy
on the receiving side, no system call for the bytes, and no fresh pages to zero-fill and fault
in (a block's pages stay mapped in both processes and are reused). When the last array using a
block is gone, the receiver tells the sender (a RELEASE frame, batched) and the block is free
again. Until then it belongs to the receiver, so an array kept longer (a cache, a model's state)
stays valid; an arena that is full sends through the socket instead (never an error).

Cost of a hop (a round trip to an echo peer, both processes' CPU; ``benchmarks/ipc_hop.py``
on the loaded 2-core development machine, ``benchmarks/README.md``), socket / shared memory:
over the socket a buffer is copied twice (into the kernel, then out of it into a fresh
``bytearray`` whose pages the kernel must zero and fault in); through the arena once, by the
sender, into pages already mapped:

    payload                   CPU per round trip      MB/s one way (c=8)
    3x224x224 FP32 (588 KiB)  690 / 435 us            374 / 931
    1 MiB                     1.01 / 0.71 ms          320 / 674
    16 MiB                    16.8 / 6.6 ms           265 / 557
    64 MiB                    128 / 30 ms             160 / 632

Blocks come in power-of-two sizes from :data:`SHARED_MIN` up; a segment holds the blocks of one
size (at least one block, else :data:`SEGMENT_BYTES` worth). Memory: at most ``capacity`` bytes
of segments per arena (one arena per link direction that sent a large tensor), a block using up
to twice its buffer's size. Segments are named ``flowserve-link-<pid>-<arena>-<segment>`` so the
supervisor can remove what a worker that died left behind (:func:`remove_leftovers`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import mmap
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger("flowserve.cluster")
SHM_DIR = Path("/dev/shm")
PREFIX = "flowserve-link-"
SHARED_MIN = 256 << 10  # buffers at least this large go through shared memory
SEGMENT_BYTES = 16 << 20  # a segment of small blocks holds this much
DEFAULT_CAPACITY = 1 << 30  # bytes of segments one arena may hold

_arenas = itertools.count(1)


def available() -> bool:
    """Whether this machine has POSIX shared memory where the arena puts it."""
    return SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)


def segment_name(key: int) -> str:
    """The file in /dev/shm of a segment key (pid, arena, segment: 32, 16 and 16 bits)."""
    return f"{PREFIX}{key >> 32}-{(key >> 16) & 0xFFFF}-{key & 0xFFFF}"


def block_size(length: int) -> int:
    """The size of the block a buffer of ``length`` bytes goes into: a power of two."""
    return max(SHARED_MIN, 1 << (length - 1).bit_length())


@dataclass(slots=True)
class _Segment:
    key: int
    block: int  # size of each of its blocks
    memory: mmap.mmap
    free: list[int] = field(default_factory=list)  # offsets of free blocks


class Arena:
    """The sending side's shared memory: blocks to copy large buffers into (module docstring)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self.bytes = 0  # of segments created
        self.sent = 0  # buffers sent through the arena
        self.full = 0  # buffers that found it full (sent through the socket)
        self._number = next(_arenas) & 0xFFFF
        self._segments: dict[int, _Segment] = {}
        self._by_size: dict[int, list[_Segment]] = {}
        self._closed = False

    @property
    def in_use(self) -> int:
        """Blocks the receiver holds now."""
        total = 0
        for segment in self._segments.values():
            total += len(segment.memory) // segment.block - len(segment.free)
        return total

    def put(self, data: memoryview) -> tuple[int, int] | None:
        """Copy ``data`` into a free block: its (segment key, offset), or None when full."""
        if self._closed:
            return None
        size = block_size(data.nbytes)
        segment = self._free_segment(size)
        if segment is None:
            self.full += 1
            return None
        offset = segment.free.pop()
        segment.memory[offset : offset + data.nbytes] = data
        self.sent += 1
        return segment.key, offset

    def release(self, key: int, offset: int) -> None:
        """The receiver no longer uses the block at (``key``, ``offset``)."""
        segment = self._segments.get(key)
        if segment is not None and offset % segment.block == 0 and offset not in segment.free:
            segment.free.append(offset)

    def close(self) -> None:
        """Remove every segment (the receiver's mappings stay valid until it drops them)."""
        self._closed = True
        for segment in self._segments.values():
            with contextlib.suppress(OSError):
                (SHM_DIR / segment_name(segment.key)).unlink()
            with contextlib.suppress(BufferError):
                segment.memory.close()
        self._segments.clear()
        self._by_size.clear()

    def _free_segment(self, size: int) -> _Segment | None:
        for segment in self._by_size.get(size, ()):
            if segment.free:
                return segment
        total = max(size, SEGMENT_BYTES // size * size)
        if self.bytes + total > self.capacity:
            return None
        index = len(self._segments)
        if index > 0xFFFF:
            return None
        key = (os.getpid() << 32) | (self._number << 16) | index
        path = SHM_DIR / segment_name(key)
        try:
            memory = _allocate(path, total)
        except OSError as exc:  # /dev/shm full (a container's 64 MiB default): use the socket
            log.warning(
                "link arena: no room for %d bytes in %s (%s); large tensors go over the socket",
                total, SHM_DIR, exc,
            )  # fmt: skip
            self.capacity = self.bytes  # do not try again for every tensor
            return None
        segment = _Segment(key, size, memory, list(range(total - size, -1, -size)))
        self._segments[key] = segment
        self._by_size.setdefault(size, []).append(segment)
        self.bytes += total
        return segment


def _allocate(path: Path, total: int) -> mmap.mmap:
    """A new shared-memory file of ``total`` bytes, mapped. Its pages are reserved first
    (``posix_fallocate``): a file only truncated to size would take its pages when first
    written, and where tmpfs has no room then (a container's small /dev/shm) the write is a
    SIGBUS that kills the process, where this is an OSError (ENOSPC) before anything is sent."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.posix_fallocate(fd, 0, total)
        return mmap.mmap(fd, total)
    except OSError:
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    finally:
        os.close(fd)


class Mapping:
    """The receiving side: the sender's segments mapped here, and blocks handed out as views
    whose end (the last array using one is gone) calls ``released(key, offset)``.

    A block is handed out as a uint8 numpy array, not a memoryview: an array that numpy (or
    pickle) builds on it keeps a reference to that array as the buffer's exporter, so its
    finalizer runs exactly when the last user is gone (numpy would take a new memoryview of a
    memoryview's memory and let the one given to it go at once)."""

    def __init__(self, released: Callable[[int, int], None]) -> None:
        self._released = released
        self._maps: dict[int, mmap.mmap] = {}
        self.received = 0

    def view(self, key: int, offset: int, length: int) -> np.ndarray:
        """A writable view of ``length`` bytes at ``offset`` of segment ``key``; raises
        ValueError for a place outside the segment, OSError when it cannot be mapped."""
        memory = self._maps.get(key)
        if memory is None:
            memory = self._map(key)
        if offset < 0 or length < 0 or offset + length > len(memory):
            raise ValueError(f"a shared block [{offset}, +{length}) outside its segment of {len(memory)}")
        view = np.frombuffer(memory, np.uint8, length, offset)
        weakref.finalize(view, self._released, key, offset)
        self.received += 1
        return view

    def _map(self, key: int) -> mmap.mmap:
        fd = os.open(SHM_DIR / segment_name(key), os.O_RDWR)
        try:
            memory = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        self._maps[key] = memory
        return memory

    def close(self) -> None:
        """Forget the mappings (each is unmapped once no array uses it any more)."""
        self._maps.clear()


def remove_leftovers(pid: int) -> int:
    """Remove the segments a process that ended (``pid``) left in /dev/shm; how many."""
    removed = 0
    with contextlib.suppress(OSError):
        for path in SHM_DIR.glob(f"{PREFIX}{pid}-*"):
            with contextlib.suppress(OSError):
                path.unlink()
                removed += 1
    return removed


__all__ = ["SHARED_MIN", "Arena", "Mapping", "available", "block_size", "remove_leftovers", "segment_name"]
