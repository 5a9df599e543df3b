"""JSON for the HTTP front end: python-rapidjson (a dependency of tritonclient, which flowserve
already requires) is 2-3x faster than the standard library on the small documents of the
protocol; the standard library is the fallback. Both accept and write NaN/Infinity as Triton does.
"""

from __future__ import annotations

import json
from typing import Any

_fast: Any
try:
    import rapidjson as _fast
except ImportError:  # pragma: no cover - rapidjson ships with tritonclient
    _fast = None


def loads(data: bytes | bytearray) -> Any:
    """Parse a UTF-8 JSON document; ValueError (UnicodeDecodeError included) when malformed."""
    if _fast is not None:
        return _fast.loads(data)
    return json.loads(bytes(data).decode("utf-8"))


def dumps(obj: Any) -> bytes:
    if _fast is not None:
        text: str = _fast.dumps(obj)
    else:
        text = json.dumps(obj, separators=(",", ":"))
    return text.encode()
