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
- ``Guards.unsent``: a second :class:`ByteBudget` (``count_small``) for response bytes that
  are encoded but not yet taken by their clients (a peer that never opens its flow-control
  window, a reader that stops reading), across every connection of every listener; a
  connection that cannot take more from it waits or, past its own bounds, is closed.

Eviction (a full listener, a peer at its own cap): a connection registers itself as a
:class:`Tracked` with :meth:`ConnectionGuard.admit`; when the listener (or the peer) is full,
the connection idle the longest (no request in flight, nothing but keep-alives for at least
``EVICT_AFTER_S``) is evicted to make room, and only when none is idle is the new connection
refused. So idle sockets held open by keep-alive PINGs cannot lock new clients out, and one
peer address cannot hold every slot of a listener (``per_peer``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from flowserve.core.ratelog import LimitedLog

log = logging.getLogger("flowserve")

DEFAULT_MAX_CONNECTIONS = 4096  # per listener
DEFAULT_MAX_BUFFERED_BYTES = 1024 * 1024 * 1024  # request bytes in memory, all listeners together
DEFAULT_MAX_CONNECTIONS_PER_PEER = 1024  # per listener and peer address
DEFAULT_MAX_UNSENT_BYTES = 512 * 1024 * 1024  # response bytes waiting for clients, all listeners together
EVICT_AFTER_S = 2.0  # a connection idle this long may be evicted to make room for a new one
SMALL = 64 * 1024  # requests below this size are not counted against the byte budget


class Tracked(Protocol):
    """A connection as its listener's :class:`ConnectionGuard` sees it."""

    def idle_since(self) -> float | None:
        """When (the guard's clock) it last had work: a request in flight, or a frame or byte
        of one (keep-alive PINGs and empty reads do not count); None while it has a request in
        flight (never evicted then)."""
        ...

    def evict(self) -> None:
        """Close it to make room (politely: gRPC GOAWAY, HTTP close of an idle keep-alive). The
        guard has already released its slot; a later :meth:`ConnectionGuard.release` of it is
        a no-op."""
        ...


class ConnectionGuard:
    """Open connections of one listener, with a cap for the listener and one per peer address."""

    def __init__(
        self,
        listener: str,
        limit: int = DEFAULT_MAX_CONNECTIONS,
        clock: Callable[[], float] = time.monotonic,
        per_peer: int = 0,
    ) -> None:
        if limit < 0 or per_peer < 0:
            raise ValueError("a connection limit must be >= 0 (0: no limit)")
        self.listener = listener
        self.limit = limit
        self.per_peer = per_peer
        self.open = 0
        self.opened = 0  # ever accepted
        self.refused = 0
        self.evicted = 0
        self._clock = clock
        self._refusals = LimitedLog(log, clock)  # logged at most once a second
        self._tracked: dict[Tracked, str | None] = {}  # connection -> its peer address
        self._peers: dict[str, int] = {}  # peer address -> open connections

    def admit(self, conn: Tracked | None = None, peer: str | None = None) -> bool:
        """Take a slot for a new connection; False (counted, logged) when the listener, or the
        peer's share of it, is full and no connection idle for ``EVICT_AFTER_S`` could be
        evicted to make room. ``conn``: the connection, tracked until :meth:`release` (only
        tracked connections can be evicted); ``peer``: its address (the per-peer cap)."""
        crowded = self.per_peer and peer is not None and self._peers.get(peer, 0) >= self.per_peer
        if crowded and not self._evict(peer):
            return self._refuse(
                f"{self._peers[peer or '']} open from {peer}, the limit per peer "
                f"(--max-connections-per-peer {self.per_peer})"
            )
        if self.limit and self.open >= self.limit and not self._evict(None):
            return self._refuse(f"{self.open} open, the limit (--max-connections {self.limit})")
        self.open += 1
        self.opened += 1
        if conn is not None:
            self._tracked[conn] = peer
            if peer is not None:
                self._peers[peer] = self._peers.get(peer, 0) + 1
        return True

    def release(self, conn: Tracked | None = None) -> None:
        """Give back the slot of a connection that ended (a tracked one once: after an eviction
        or a second call, nothing happens)."""
        if conn is None:
            self.open -= 1
            return
        if conn not in self._tracked:
            return
        self._untrack(conn)

    def _untrack(self, conn: Tracked) -> None:
        peer = self._tracked.pop(conn)
        self.open -= 1
        if peer is not None:
            left = self._peers[peer] - 1
            if left:
                self._peers[peer] = left
            else:
                del self._peers[peer]

    def _evict(self, peer: str | None) -> bool:
        """Evict the connection (of ``peer``, or any) idle the longest, if one has been idle
        for ``EVICT_AFTER_S``; True when one was."""
        latest = self._clock() - EVICT_AFTER_S
        chosen: Tracked | None = None
        oldest = latest
        for conn, its_peer in self._tracked.items():
            if peer is not None and its_peer != peer:
                continue
            since = conn.idle_since()
            if since is not None and since <= oldest:
                chosen, oldest = conn, since
        if chosen is None:
            return False
        self._untrack(chosen)
        self.evicted += 1
        chosen.evict()
        return True

    def _refuse(self, why: str) -> bool:
        self.refused += 1
        message = "%s listener: refused a connection: %s, none idle to evict"
        self._refusals(logging.WARNING, message, self.listener, why)
        return False


class ByteBudget:
    """Request bytes held in memory across all requests of the server."""

    def __init__(self, limit: int = DEFAULT_MAX_BUFFERED_BYTES, count_small: bool = False) -> None:
        if limit < 0:
            raise ValueError("a byte budget must be >= 0 (0: no budget)")
        self.limit = limit
        self.in_use = 0
        self.refused = 0
        self._small = 0 if count_small else SMALL  # sizes below this are not counted

    def take(self, size: int) -> bool:
        """Reserve ``size`` bytes; False (counted) when they do not fit. A caller that got True
        gives the same ``size`` back with :meth:`give` exactly once."""
        if size < self._small:
            return True
        if self.limit and self.in_use + size > self.limit:
            self.refused += 1
            return False
        self.in_use += size
        return True

    def give(self, size: int) -> None:
        if size >= self._small:
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
    """The bounds of one server: a :class:`ConnectionGuard` per listener, the request
    :class:`ByteBudget` and the budget of unsent response bytes."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    budget: ByteBudget = field(default_factory=ByteBudget)
    listeners: dict[str, ConnectionGuard] = field(default_factory=dict)
    max_connections_per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER
    unsent: ByteBudget = field(default_factory=lambda: ByteBudget(DEFAULT_MAX_UNSENT_BYTES, count_small=True))

    def listener(self, name: str) -> ConnectionGuard:
        """The guard of listener ``name`` (made on first use, with ``max_connections`` and
        ``max_connections_per_peer``)."""
        guard = self.listeners.get(name)
        if guard is None:
            guard = ConnectionGuard(name, self.max_connections, per_peer=self.max_connections_per_peer)
            self.listeners[name] = guard
        return guard
