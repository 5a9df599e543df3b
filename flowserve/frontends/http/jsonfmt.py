"""JSON for the HTTP front end: python-rapidjson (a dependency of tritonclient, which flowserve
already requires) is 2-3x faster than the standard library on the small documents of the
protocol; the standard library is the fallback. Both accept and write NaN/Infinity as Triton does.

Both refuse documents nested deeper than about a thousand levels with ``RecursionError``
(rapidjson's own bound; the standard library's recursion limit): callers turn it into a 400.
:func:`loads_chunked` parses a large document from a stream of ``CHUNK`` bytes, so a thread
parsing it gives the GIL back between chunks (one ``loads`` call of a 40 MB document holds the
GIL, and with it the event loop, for half a second).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

_fast: Any
try:
    import rapidjson as _fast
except ImportError:  # pragma: no cover - rapidjson ships with tritonclient
    _fast = None


def loads(data: bytes | bytearray | memoryview) -> Any:
    """Parse a UTF-8 JSON document; ValueError (UnicodeDecodeError included) when malformed.
    A memoryview (a large body's own buffer, :func:`flowserve.dataplane.memory.buffer`) is
    copied first: rapidjson reads bytes, and documents this small are parsed here."""
    if _fast is not None:
        return _fast.loads(bytes(data) if isinstance(data, memoryview) else data)
    return json.loads(bytes(data).decode("utf-8"))


_SPACE = np.frombuffer(b" \t\n\r\x0b\x0c", np.uint8)  # what bytes.strip() strips


def blank(data: bytes | bytearray | memoryview) -> bool:
    """True when ``data`` is empty or only whitespace (``bytes.strip`` empties it), without
    copying a large memoryview."""
    if not isinstance(data, memoryview):
        return not data.strip()
    if bytes(data[:64]).strip():
        return False
    return bool(np.isin(np.frombuffer(data, np.uint8), _SPACE).all())


CHUNK = 64 << 10


class _Chunks:
    """A read-only stream over bytes (what rapidjson's ``load`` reads, CHUNK bytes a call)."""

    __slots__ = ("data", "offset")

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.data = memoryview(data)
        self.offset = 0

    def read(self, size: int = -1) -> bytes:
        start = self.offset
        end = len(self.data) if size < 0 else start + size
        self.offset = end
        return bytes(self.data[start:end])


def loads_chunked(data: bytes | bytearray | memoryview) -> Any:
    """:func:`loads` for large documents, meant for a worker thread: the parser reads
    ``CHUNK`` bytes at a time through Python code, where the thread lets others run."""
    if _fast is not None:
        return _fast.load(_Chunks(data), chunk_size=CHUNK)
    return json.loads(bytes(data).decode("utf-8"))


def dumps(obj: Any) -> bytes:
    if _fast is not None:
        text: str = _fast.dumps(obj)
    else:
        text = json.dumps(obj, separators=(",", ":"))
    return text.encode()
