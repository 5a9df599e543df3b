"""What the data plane sees of the other worker processes of one server (``--workers N``).

A server started with several workers (``flowserve/cluster/``) is still one server: the data
plane of the worker that decoded a request asks its :class:`Peers` for what must be the same
everywhere. Changes of server state (model load and unload, shared-memory registrations, trace
and log settings) are *applied everywhere*: ``broadcast`` returns once every worker has applied
the change (each through :meth:`DataPlane.apply`), so a call that returned is in effect whichever
worker serves the next request. Reports (statistics, metrics) are *gathered* from every worker
and summed. A model whose meaning needs one place (a sequence's state, a response cache, the
rate limiter's resources, or one the config pins) is loaded by one worker only, and the others
*forward* its requests there (``repository/placement.py``, ``nodes/forward.py``). A request
that finds its model busy here may *spill* to a less busy worker, so one connection's requests
use every worker. In a single process there are no peers (``plane.peers`` is None) and none of
this costs anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from flowserve.core.types import InferRequest, InferResponse


class Peers(Protocol):
    def all_ready(self) -> bool:
        """Whether every worker is up and has loaded what it should (readiness)."""
        ...

    async def broadcast(self, op: str, args: dict[str, Any]) -> None:
        """Apply ``op`` in every worker, this one included; returns when all have, raises the
        first failure (with its code and message)."""
        ...

    async def statistics(self, name: str, version: str) -> dict[str, Any]:
        """The whole server's statistics (every worker's, summed)."""
        ...

    async def metrics(self) -> str:
        """The whole server's Prometheus exposition (every worker's, merged)."""
        ...

    def spill_target(self, model: str, in_flight: int) -> int | None:
        """The worker that should run a request to ``model`` that found ``in_flight`` others of
        it running here: another worker when this one is the busier (None: run it here)."""
        ...

    async def spill(self, target: int, request: InferRequest) -> InferResponse:
        """Run ``request`` on worker ``target`` (here again if that worker is gone)."""
        ...

    async def gather(self, kind: str, args: dict[str, Any]) -> list[Any]:
        """Every worker's answer to a view registered with :meth:`serve_local` as ``kind``."""
        ...

    def serve_local(self, kind: str, view: Callable[[dict[str, Any]], Any]) -> None:
        """Answer ``gather(kind, args)`` for this worker with ``view(args)``."""
        ...

    def trace_taken(self, model: str) -> None:
        """This worker took one trace of the trace count of ``model``'s settings ("": the
        global ones); the count is the whole server's, kept by the supervisor."""
        ...

    def status(self) -> dict[str, Any]:
        """The workers: ``workers`` (configured), ``up`` (ready now), ``restarts``, ``ready``."""
        ...
