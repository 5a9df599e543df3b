"""The response cache: one LRU pool, bounded in bytes, shared by every model that enables it.

The key hashes the model name, version and every input (sorted by name: name, datatype,
shape and bytes), as Triton's cache does; a hit returns the stored outputs without running a
node. Stored tensors are private read-only copies, so no caller can change a cached answer.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from flowserve.core.node import TensorMap
from flowserve.core.wire import to_raw


def cache_key(name: str, version: int, inputs: TensorMap) -> bytes:
    digest = hashlib.blake2b(digest_size=20)
    digest.update(f"{name}\0{version}\0".encode())
    for key in sorted(inputs):
        array = inputs[key]
        digest.update(f"{key}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(to_raw(array) if array.dtype.kind == "O" else np.ascontiguousarray(array).data)
    return digest.digest()


def _nbytes(outputs: TensorMap) -> int:
    return sum(len(to_raw(a)) if a.dtype.kind == "O" else a.nbytes for a in outputs.values())


class ResponseCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._entries: OrderedDict[bytes, tuple[TensorMap, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> TensorMap | None:
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return dict(entry[0])

    def put(self, key: bytes, outputs: TensorMap) -> None:
        size = _nbytes(outputs)
        if size > self.max_bytes or key in self._entries:
            return
        stored = {}
        for name, array in outputs.items():
            copy = np.array(array, copy=True)
            copy.setflags(write=False)
            stored[name] = copy
        while self.bytes + size > self.max_bytes and self._entries:
            _, (_, old) = self._entries.popitem(last=False)
            self.bytes -= old
            self.evictions += 1
        self._entries[key] = (stored, size)
        self.bytes += size
