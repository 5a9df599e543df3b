"""Server-wide bounds that no single client may exceed: open connections per listener and
request bytes buffered across all requests (issue: "no client can stall or exhaust the server").

Both are counters the front ends consult on their own hot paths (an integer comparison each),
held by the :class:`~flowserve.dataplane.plane.DataPlane` so that every listener of one server
shares one budget and the metrics endpoint can show them:

- :class:`ConnectionGuard`: one per listener (``http``, ``grpc``, ``metrics``). A connection
  past ``limit`` is closed at once; the refusal is counted and logged (at most once a second
  per listener, so a flood cannot flood the log too). ``limit`` 0 means no cap.
- :class:`ByteBudget`: request bytes held in memory before (and while) a request is served,
  across every connection of every listener, and the responses of streaming requests that
  wait for slow clients (``streams.py``). A request whose declared size does not fit is
  refused before its bytes are read (HTTP 503, gRPC RESOURCE_EXHAUSTED) instead of the server
  growing until the kernel kills it. Requests under ``SMALL`` bytes are not counted: they are
  bounded by the per-connection stream and pipelining bounds, and counting them would put a
  call on every small request's path for nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("flowserve")

DEFAULT_MAX_CONNECTIONS = 4096  # per listener
DEFAULT_MAX_BUFFERED_BYTES = 1024 * 1024 * 1024  # request bytes in memory, all listeners together
SMALL = 64 * 1024  # requests below this size are not counted against the byte budget


class ConnectionGuard:
    """Open connections of one listener, with a cap."""

    def __init__(
        self, listener: str, limit: int = DEFAULT_MAX_CONNECTIONS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if limit < 0:
            raise ValueError("a connection limit must be >= 0 (0: no limit)")
        self.listener = listener
        self.limit = limit
        self.open = 0
        self.opened = 0  # ever accepted
        self.refused = 0
        self._clock = clock
        self._logged_at = -1e9
        self._unlogged = 0

    def admit(self) -> bool:
        """Take a slot for a new connection; False (counted, logged) when the listener is full."""
        if self.limit and self.open >= self.limit:
            self.refused += 1
            now = self._clock()
            if now - self._logged_at >= 1.0:
                also = f" (and {self._unlogged} more since the last message)" if self._unlogged else ""
                log.warning(
                    "%s listener: refused a connection: %d open, the limit (--max-connections %d)%s",
                    self.listener, self.open, self.limit, also,
                )  # fmt: skip
                self._logged_at = now
                self._unlogged = 0
            else:
                self._unlogged += 1
            return False
        self.open += 1
        self.opened += 1
        return True

    def release(self) -> None:
        self.open -= 1


class ByteBudget:
    """Request bytes held in memory across all requests of the server."""

    def __init__(self, limit: int = DEFAULT_MAX_BUFFERED_BYTES) -> None:
        if limit < 0:
            raise ValueError("a byte budget must be >= 0 (0: no budget)")
        self.limit = limit
        self.in_use = 0
        self.refused = 0

    def take(self, size: int) -> bool:
        """Reserve ``size`` bytes; False (counted) when they do not fit. A caller that got True
        gives the same ``size`` back with :meth:`give` exactly once."""
        if size < SMALL:
            return True
        if self.limit and self.in_use + size > self.limit:
            self.refused += 1
            return False
        self.in_use += size
        return True

    def give(self, size: int) -> None:
        if size >= SMALL:
            self.in_use -= size

    def refusal(self, size: int) -> str:
        """The message for a refused request of ``size`` bytes."""
        return (
            f"server memory budget exhausted: {size} bytes do not fit beside the {self.in_use} bytes "
            f"held for requests in progress (--max-buffered-request-bytes {self.limit}); "
            "retry later"
        )


@dataclass
class Guards:
    """The bounds of one server: a :class:`ConnectionGuard` per listener and one :class:`ByteBudget`."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    budget: ByteBudget = field(default_factory=ByteBudget)
    listeners: dict[str, ConnectionGuard] = field(default_factory=dict)

    def listener(self, name: str) -> ConnectionGuard:
        """The guard of listener ``name`` (made on first use, with ``max_connections``)."""
        guard = self.listeners.get(name)
        if guard is None:
            guard = self.listeners[name] = ConnectionGuard(name, self.max_connections)
        return guard
