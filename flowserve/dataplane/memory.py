"""Memory that large requests freed, given back to the system.

glibc's malloc keeps what a process frees: after a block larger than its mmap threshold is
freed, the threshold rises to that block's size (up to 32 MiB, the "dynamic mmap threshold"),
so later large blocks come from the heaps, and freed heap memory is returned only when it
lies at a heap's top. After a burst of large requests the resident size stays at the burst's
peak: measured on ``flowserve serve``, 20 gzip bombs took it from 96 MiB to 1.6 GiB, and it
was 1.6 GiB still, idle, minutes later.

:data:`trimmer` (a :class:`Trimmer`): code that freed a lot of request memory reports it
(:meth:`Trimmer.freed`, on the event loop); once ``TRIM_AFTER`` bytes were freed since the
last trim, ``malloc_trim(0)`` (which returns the free pages of every arena, not only a heap's
top) runs in a worker thread, at most once every ``TRIM_EVERY_S`` seconds. Rate-limited, so a
steady stream of large requests pays for it once a second at most: the pages given back are
faulted in again by the next large request. Not glibc (musl, macOS): nothing happens.

The other way, ``mallopt(M_MMAP_THRESHOLD, ...)`` at start, would give every large block
back when it is freed, and make every large request map and fault its memory afresh
(measured in benchmarks/README.md, "Compression bombs and giving memory back": 1.3-1.4x
on a 16 MiB request).

:func:`tune_malloc` (``flowserve`` calls it at start) fixes glibc's two thresholds from the
start: 32 MiB for mmap (the top of its dynamic range: larger blocks are always mapped) and the
same for trimming (a heap keeps a free top up to the largest block it serves). Left dynamic,
they follow the largest block freed so far: a model whose working set is many blocks of a few
MiB (a conv net's activations on the CPU: torch allocates and frees each layer's output every
batch) raises the trim threshold only to twice such a block, so after every batch the heap's
free top is given back and the next batch faults all of it in again. Measured on this
project's 2-core machine (benchmarks/README.md, "glibc's malloc thresholds"): raw torch on the
conv net of ``benchmarks/gpu_serving.py``, 1,837-2,668 -> 3,720-3,966 images/s, 1.2-1.6M ->
55k page faults (whether a process falls into it depends on the order of its first frees: in
another hour glibc's own rule read 3,500-4,148); served over system shm, 31-55 -> 5-7 faults
and 113-189 -> 43-45 us of system time per request. Blocks over 32 MiB are still mapped and
unmapped as before, the resident size after a burst is still brought down by :data:`trimmer`,
and what a user set through glibc's environment (``MALLOC_*_`` or ``GLIBC_TUNABLES``) is left
alone.

:func:`buffer` is the buffer a large request body is received into (HTTP and gRPC), and a large
input read from a system shared-memory region (``dataplane/shm.py``): not zero-filled, and
numpy's allocator asks the kernel for huge pages for it (``madvise``), so a block over the mmap
threshold, mapped afresh for every request, is faulted in 2 MiB at a time instead of 4 KiB. A
``bytearray`` of the same size is zero-filled page by page: a 64 MiB HTTP request took 16,389
page faults and 75-87 ms of server CPU against gRPC's 33 and 30-42 ms, and a 64 MiB ``bytes``
read with ``os.pread`` the same 16,385 faults (benchmarks/README.md, "16 MiB gRPC against HTTP
with clients of equal cost, and 64 MiB over HTTP").
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import time
from collections.abc import Callable, MutableMapping
from typing import Any

import numpy as np

log = logging.getLogger("flowserve")

TRIM_AFTER = 64 << 20  # bytes freed since the last trim before the next one
TRIM_EVERY_S = 1.0  # at most one trim this often


def _libc(name: str, argtypes: list[Any]) -> Any | None:
    """The C library's function ``name`` returning an int, from the symbols the process has
    loaded already (no library search at start), or None where the C library has none (glibc's
    ``malloc_trim`` and ``mallopt``: musl and macOS lack the first; musl's ``mallopt`` does
    nothing and says so)."""
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return function


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)`` (it lets the GIL go), or None where there is none."""
    trim = _libc("malloc_trim", [ctypes.c_size_t])
    return None if trim is None else lambda: trim(0)


def buffer(size: int) -> memoryview:
    """A writable buffer of ``size`` bytes, not zero-filled, in huge pages where the kernel gives
    them (numpy advises them for large blocks); MemoryError when it cannot be had."""
    return np.empty(size, np.uint8).data


# glibc's mallopt parameters (malloc.h) and the values set
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # DEFAULT_MMAP_THRESHOLD_MAX: blocks above it are always mapped
TRIM_THRESHOLD = MMAP_THRESHOLD  # a heap's free top kept: up to the largest block a heap serves
# set by hand, any of these turns glibc's dynamic thresholds off: the user chose
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
# the same two, as a process started with this environment reads them
ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}


def tune_malloc(
    environ: MutableMapping[str, str] = os.environ,
    mallopt: Callable[[int, int], int] | None = None,
) -> bool:
    """Fix glibc's mmap and trim thresholds at 32 MiB (see the module's doc): in this process
    with ``mallopt``, in the processes it starts (``--workers``, the servers ``analyze`` runs)
    through glibc's environment; nothing where the user set either, or without glibc. True
    when they were set."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    if any(name in environ for name in USER_SETTINGS) or "glibc.malloc." in tunables:
        return False
    mallopt = mallopt if mallopt is not None else _libc("mallopt", [ctypes.c_int, ctypes.c_int])
    if mallopt is None:
        return False
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return False  # mallopt answers 0 for a value it refuses
    environ.update(ENVIRONMENT)
    return True


class Trimmer:
    """Runs ``trim`` in a worker thread once ``after`` bytes were freed, at most once every
    ``every_s`` seconds of ``clock``; ``trim`` None: never."""

    def __init__(
        self,
        trim: Callable[[], object] | None,
        after: int = TRIM_AFTER,
        every_s: float = TRIM_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.trim = trim
        self.after = after
        self.every_s = every_s
        self.clock = clock
        self.pending = 0  # bytes freed since the last trim began
        self.trims = 0
        self._last = -1e9
        self._scheduled: asyncio.TimerHandle | None = None

    def freed(self, size: int) -> None:
        """``size`` bytes of request memory were freed (call on the event loop)."""
        if self.trim is None:
            return
        self.pending += size
        if self.pending < self.after or self._scheduled is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        delay = max(0.0, self._last + self.every_s - self.clock())
        self._scheduled = loop.call_later(delay, self._start, loop)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._scheduled = None
        self._last = self.clock()
        self.pending = 0
        self.trims += 1
        future = loop.run_in_executor(None, self._run)
        future.add_done_callback(_logged)

    def _run(self) -> None:
        assert self.trim is not None
        self.trim()


def _logged(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("giving freed memory back failed: %s", future.exception())


trimmer = Trimmer(_malloc_trim())
