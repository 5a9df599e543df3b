"""The few ASGI types this front end needs (no framework: a raw ASGI 3 callable)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# (name, value) pairs as ASGI sends them
Headers = list[tuple[bytes, bytes]]
# a request body as ``receive`` hands it on: a large one of known length is the buffer it was
# read straight into (a memoryview of flowserve.dataplane.memory.buffer)
Body = bytes | bytearray | memoryview
