"""Pinned host staging for copies between host memory and a GPU, per instance.

A copy from pageable host memory (numpy's) to a GPU is not asynchronous: the driver first
copies it into pinned memory of its own and the host waits. Each GPU instance therefore owns a
:class:`Staging`: two bounded pools of pinned (page-locked) host blocks, one for inputs and one
for outputs, and the copies through them, ordered by the rule of :mod:`flowserve.core.device`
(events, never a device-wide synchronize):

- **host -> device** (:meth:`Staging.upload`, on the instance's thread, inside ``execute``): the
  numpy input is copied once into a pinned block (``np.copyto``, which also makes a strided or
  read-only request buffer contiguous), then copied to the device with ``non_blocking`` on the
  instance's stream, and an event is recorded there. The block goes back to the pool and is
  handed out again only once that event has completed (:meth:`PinnedPool.acquire` asks the
  driver, ``Event.query``, it never waits).
- **device -> host** (:meth:`Staging.to_numpy`, a device tensor's ``to_numpy``; and
  :meth:`Staging.download`): the output is copied into a pinned block on the instance's copy
  stream (its own, so the copy does not queue behind the instance's next batch), an event is
  recorded there, and the consumer (the thread that asked for the host array) waits on that
  one event. The numpy array it gets is a view of the block; the block goes back to the pool
  when the last array over it is gone. :meth:`Staging.download` copies straight into a buffer
  the caller provides (a response buffer), with no pinned block at all; :func:`download_into`
  finds a device tensor's staging for that (a shared-memory output can use it).

Pools grow as needed (blocks of a power-of-two size, 64 KiB at least, so one block serves
requests of nearby sizes), reuse the smallest free block that fits, and are bounded
(``limit`` bytes of pinned memory each): to grow past the bound an idle block whose copy has
completed is dropped; when none can be, the copy goes through pageable memory as before (and
``refused`` counts it). Copies count in ``bytes_copied`` exactly as before (the backends count
each host <-> device copy once, whatever buffer it goes through).

The pool and the copy logic are pure: the device behind them is a :class:`Copier` (torch.cuda
in :mod:`flowserve.nodes.backends.cuda`, :class:`FakeCopier` over the fake device in CI).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from flowserve.core.device import (
    Device,
    DeviceTensor,
    FakeBuffer,
    FakeDevice,
    FakeEvent,
    StreamOps,
    numpy_dtype,
    take,
)

MIN_BLOCK = 64 << 10  # the smallest pinned block (64 KiB)
DEFAULT_LIMIT = 64 << 20  # pinned bytes per pool (each instance has two) unless configured
# a model's config parameter: pinned bytes per pool of each GPU instance (0: no pinned staging)
LIMIT_PARAMETER = "flowserve.pinned_staging_bytes"


def block_size(nbytes: int) -> int:
    """The size of the block that holds ``nbytes``: a power of two, MIN_BLOCK at least."""
    return max(MIN_BLOCK, 1 << max(nbytes - 1, 0).bit_length())


class Copier(Protocol):
    """The device behind a :class:`Staging`: pinned memory, event queries and the copies."""

    def pinned(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of page-locked host memory as a flat uint8 array (which keeps it alive)."""

    def query(self, event: Any) -> bool:
        """Whether the work queued before ``event`` has completed (never waits)."""

    def upload(self, host: np.ndarray, dtype: np.dtype[Any], shape: tuple[int, ...], stream: Any) -> Any:
        """A device tensor of ``dtype`` and ``shape`` filled from ``host`` (a flat uint8 view of
        pinned memory) by an asynchronous copy queued on ``stream``."""

    def upload_pageable(self, array: np.ndarray, stream: Any) -> Any:
        """A device tensor copied from pageable ``array`` on ``stream`` (no pinned block)."""

    def download(self, value: Any, host: np.ndarray, stream: Any) -> bool:
        """Queue an asynchronous copy of device ``value`` into ``host`` (flat uint8, its size)
        on ``stream``; False when ``value`` is of a kind this copier cannot copy."""

    def download_pageable(self, value: Any) -> np.ndarray:
        """A host numpy copy of device ``value`` without a pinned block (synchronous)."""


@dataclass(eq=False)
class Block:
    """One pinned host block of a pool."""

    memory: np.ndarray  # flat uint8 over the pinned memory
    event: Any = None  # recorded after the last copy that used the block; None once completed

    @property
    def nbytes(self) -> int:
        return int(self.memory.nbytes)


class _Lease:
    """What a host array lent from a pool holds on to: its block goes back to the pool when the
    last array over it is gone (numpy keeps this object as the arrays' base)."""

    __slots__ = ("__array_interface__", "block", "returned")

    def __init__(self, block: Block, nbytes: int, returned: collections.deque[Block]) -> None:
        self.block = block
        self.returned = returned
        self.__array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (int(block.memory.ctypes.data), False),
            "version": 3,
        }

    def __del__(self) -> None:
        # may run on any thread, inside another operation of the pool: a deque append is atomic
        self.returned.append(self.block)


class PinnedPool:
    """A bounded pool of pinned host blocks (see the module's docstring). Thread-safe."""

    def __init__(self, copier: Copier, limit: int = DEFAULT_LIMIT) -> None:
        self._copier = copier
        self.limit = limit
        self._free: list[Block] = []
        self._returned: collections.deque[Block] = collections.deque()  # lent arrays gone
        self._lock = threading.Lock()
        self.held = 0  # pinned bytes the pool holds (free, in flight and lent)
        self.allocations = 0  # blocks allocated so far
        self.refused = 0  # requests that found no room under the bound (went pageable)

    def _ready(self, block: Block) -> bool:
        if block.event is not None and self._copier.query(block.event):
            block.event = None
        return block.event is None

    def _drain(self) -> None:
        returned = self._returned
        while returned:
            self._free.append(returned.popleft())

    def acquire(self, nbytes: int) -> Block | None:
        """A block of ``nbytes`` at least whose last copy has completed, or None when the bound
        leaves no room for one (the caller then copies through pageable memory)."""
        size = block_size(nbytes)
        with self._lock:
            self._drain()
            best: Block | None = None
            for block in self._free:
                fits = block.nbytes >= size and (best is None or block.nbytes < best.nbytes)
                if fits and self._ready(block):
                    best = block
            if best is not None:
                self._free.remove(best)
                return best
            if self.held + size > self.limit:  # grow by dropping idle blocks, largest first
                for block in sorted(self._free, key=lambda b: -b.nbytes):
                    if self.held + size <= self.limit:
                        break
                    if self._ready(block):
                        self._free.remove(block)
                        self.held -= block.nbytes
            if self.held + size > self.limit:
                self.refused += 1
                return None
            self.held += size  # reserved while the memory is allocated outside the lock
            self.allocations += 1
        try:
            return Block(self._copier.pinned(size))
        except Exception:  # out of pinned memory: this copy goes through pageable memory
            with self._lock:
                self.held -= size
                self.refused += 1
            return None

    def release(self, block: Block, event: Any) -> None:
        """``block`` back in the pool, to be handed out once ``event`` (recorded after the last
        copy that uses it) has completed."""
        block.event = event
        with self._lock:
            self._free.append(block)

    def lend(self, block: Block, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
        """A host array of ``dtype`` and ``shape`` over ``block``, whose copy the caller has
        waited for; the block goes back to the pool when the last array over it is gone."""
        block.event = None
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        raw = np.asarray(_Lease(block, nbytes, self._returned))
        return raw.view(dtype).reshape(shape)

    @property
    def free(self) -> int:
        """Blocks in the pool now (idle or with a copy in flight)."""
        with self._lock:
            self._drain()
            return len(self._free)


def _described(value: Any) -> tuple[np.dtype[Any], tuple[int, ...]]:
    """(numpy dtype, shape) of a framework tensor (a torch tensor, an OrtValue, a fake buffer)."""
    shape = value.shape() if callable(value.shape) else value.shape
    dtype = value.data_type() if not hasattr(value, "dtype") else value.dtype
    return numpy_dtype(dtype), tuple(int(d) for d in shape)


class Staging:
    """One GPU instance's pinned staging: ``upload`` host inputs on the instance's ``stream``,
    ``to_numpy``/``download`` device outputs on its copy stream (see the module's docstring)."""

    def __init__(
        self, copier: Copier, ops: StreamOps, device: Device, stream: Any, limit: int = DEFAULT_LIMIT
    ) -> None:
        self.copier = copier
        self.ops = ops
        self.device = device
        self.stream = stream
        self.inputs = PinnedPool(copier, limit)
        self.outputs = PinnedPool(copier, limit)
        self._copy_stream: Any = None
        self._lock = threading.Lock()

    def copy_stream(self) -> Any:
        """The instance's stream for device -> host copies (made when first needed)."""
        stream = self._copy_stream
        if stream is None:
            with self._lock:
                if self._copy_stream is None:
                    self._copy_stream = self.ops.stream(self.device)
                stream = self._copy_stream
        return stream

    def upload(self, array: np.ndarray) -> Any:
        """``array`` (host memory) as a device tensor, copied on the instance's stream: work
        queued there after this call may use it. Called on the instance's thread."""
        if array.dtype.hasobject:
            raise TypeError("BYTES tensors cannot be copied to a GPU")
        nbytes = int(array.nbytes)
        block = self.inputs.acquire(nbytes) if nbytes else None
        if block is None:
            return self.copier.upload_pageable(array, self.stream)
        host = block.memory[:nbytes]
        np.copyto(host.view(array.dtype).reshape(array.shape), array, casting="no")
        value = self.copier.upload(host, array.dtype, tuple(array.shape), self.stream)
        self.inputs.release(block, self.ops.record(self.stream))
        return value

    def to_numpy(self, value: Any) -> np.ndarray:
        """A device tensor's host copy (its ``DeviceTensor.to_numpy``: the host has already
        waited on the event of the work that made ``value``), through a pinned block."""
        dtype, shape = _described(value)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        block = self.outputs.acquire(nbytes) if nbytes else None
        if block is None:
            return self.copier.download_pageable(value)
        stream = self.copy_stream()
        if not self.copier.download(value, block.memory[:nbytes], stream):
            self.outputs.release(block, None)
            return self.copier.download_pageable(value)
        event = self.ops.record(stream)
        self.ops.synchronize(event)  # the consumer waits on this copy's event, nothing else
        return self.outputs.lend(block, dtype, shape)

    def download(self, tensor: DeviceTensor, out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """``tensor`` in host memory and the bytes copied: into ``out`` when given (a response
        buffer of the tensor's size, C-contiguous, written straight from the device), else into
        a pinned block (as :meth:`to_numpy`). The copy stream waits on the producer's event
        (device side), the host on the copy's event only."""
        nbytes = tensor.nbytes
        if out is not None and (out.nbytes != nbytes or not (out.flags.c_contiguous and out.flags.writeable)):
            raise ValueError(
                f"a buffer of {out.nbytes} bytes (contiguous: {out.flags.c_contiguous}) cannot take "
                f"a {nbytes}-byte tensor"
            )
        stream = self.copy_stream()
        value = take(tensor, stream)
        if out is not None:
            target = out.reshape(-1).view(np.uint8)
            if self.copier.download(value, target, stream):
                self.ops.synchronize(self.ops.record(stream))
            else:
                np.copyto(target, self._pageable(tensor, value).reshape(-1).view(np.uint8))
            return out, nbytes
        block = self.outputs.acquire(nbytes) if nbytes else None
        if block is not None and self.copier.download(value, block.memory[:nbytes], stream):
            event = self.ops.record(stream)
            self.ops.synchronize(event)
            return self.outputs.lend(block, tensor.dtype, tensor.shape), nbytes
        if block is not None:
            self.outputs.release(block, None)
        return self._pageable(tensor, value), nbytes

    def _pageable(self, tensor: DeviceTensor, value: Any) -> np.ndarray:
        """A synchronous host copy, once the host waited on the producer's event."""
        if tensor.event is not None and tensor.ops is not None:
            tensor.ops.synchronize(tensor.event)
        return self.copier.download_pageable(value)


def download_into(tensor: DeviceTensor, out: np.ndarray) -> int:
    """``tensor``'s bytes written into ``out``, a host buffer of its size (a response's, a
    shared-memory region's; C-contiguous): straight from the device through the producer's
    staging when it has one (:meth:`Staging.download`), else through its host copy. Returns the
    bytes copied off the device (0 for a tensor in host memory)."""
    staging = getattr(tensor.to_numpy_fn, "__self__", None)
    if isinstance(staging, Staging) and not tensor.device.is_cpu:
        staging.download(tensor, out)
        return tensor.nbytes
    array, copied = tensor.host()
    source = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    target = out.reshape(-1).view(np.uint8)
    if source.nbytes != target.nbytes:
        raise ValueError(f"a buffer of {target.nbytes} bytes cannot take a {source.nbytes}-byte tensor")
    np.copyto(target, source)
    return copied


# ----------------------------------------------------------------------------- the fake device


class FakeCopier:
    """Pinned memory and copies of :class:`~flowserve.core.device.FakeDevice`, for CI: pinned
    blocks are numpy arrays, copies are recorded in ``log`` (``("upload", stream, nbytes,
    pinned)``, ``("download", stream, nbytes, pinned)``), and an event has completed once the
    test says so (:meth:`complete`), so reuse before completion can be seen."""

    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.log: list[tuple[Any, ...]] = []
        self.allocated: list[int] = []  # sizes of the pinned blocks allocated
        self.done: set[int] = set()  # numbers of completed events
        self.fail_pinned = False  # the next pinned allocations fail (out of pinned memory)

    def complete(self, *events: FakeEvent) -> None:
        """The work before ``events`` (every event recorded so far, when none is named) has
        completed."""
        if events:
            self.done.update(e.number for e in events)
        else:
            self.done.update(entry[2].number for entry in self.device.ops("record"))

    # Copier
    def pinned(self, nbytes: int) -> np.ndarray:
        if self.fail_pinned:
            raise MemoryError("out of pinned memory")
        self.allocated.append(nbytes)
        return np.zeros(nbytes, np.uint8)

    def query(self, event: FakeEvent) -> bool:
        return event.number in self.done

    def upload(self, host: np.ndarray, dtype: np.dtype[Any], shape: tuple[int, ...], stream: Any) -> Any:
        self.log.append(("upload", stream, int(host.nbytes), True))
        return self.device.upload(host.view(dtype).reshape(shape), stream)

    def upload_pageable(self, array: np.ndarray, stream: Any) -> Any:
        self.log.append(("upload", stream, int(array.nbytes), False))
        return self.device.upload(array, stream)

    def download(self, value: Any, host: np.ndarray, stream: Any) -> bool:
        if not isinstance(value, FakeBuffer):
            return False
        self.log.append(("download", stream, int(host.nbytes), True))
        host.view(value.dtype).reshape(value.shape)[...] = value.data
        return True

    def download_pageable(self, value: Any) -> np.ndarray:
        self.log.append(("download", None, int(value.data.nbytes), False))
        return np.array(value.data, copy=True)


__all__ = [
    "DEFAULT_LIMIT",
    "LIMIT_PARAMETER",
    "MIN_BLOCK",
    "Block",
    "Copier",
    "FakeCopier",
    "PinnedPool",
    "Staging",
    "block_size",
    "download_into",
]
