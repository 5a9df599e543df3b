"""How one formed batch runs on the node a batcher wraps.

- :class:`InstanceRunner`, for a node whose instances take several requests at once (a
  :class:`~flowserve.nodes.backends.base.BackendNode`): the requests go, unmerged, to
  ``run_batch``, which runs ``execute_batch`` on a free instance's thread; the backend merges
  and splits (or hands Triton's python backend the list of requests). ``capacity`` is its
  instance count, so N instances run N batches at once.
- :class:`NodeRunner`, for any other node (a Python node, a model or graph step): the rows are
  merged here, the inner node's ``__call__`` runs once on the merged request, and the outputs
  are split back here. ``capacity`` is how many merged calls may be in flight at once.

Either way the result is one TensorMap per request with exactly that request's rows, or an
:class:`~flowserve.core.errors.InternalError` naming the node. Each request's own context
(request id, parameters) reaches an instance runner's node; a merged call runs with the first
request's, with the latest deadline (:func:`batch_context`).

- :class:`StreamRunner`, for a decoupled node (Triton's decoupled python models with
  ``dynamic_batching``): the requests go, unmerged, to ``run_stream_batch``, which runs one
  ``execute(requests)`` on a free instance; each request's responses go to its own
  :class:`StreamSink` as the model sends them, during or after ``execute`` (the instance is free
  again once ``execute`` returns, as in Triton).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

from flowserve.core.clock import Clock
from flowserve.core.node import Context, Node, TensorMap
from flowserve.nodes.batching.tensors import CopyMeter, check_split, merge_rows, split_rows


@dataclass(slots=True)
class Phases:
    """When a batch's phases began and ended (clock nanoseconds); queue time ends at start_ns."""

    start_ns: int = 0
    infer_start_ns: int = 0
    infer_end_ns: int = 0
    end_ns: int = 0


class BatchRunner(Protocol):
    @property
    def capacity(self) -> int: ...

    def runs_inline(self) -> bool: ...

    async def run(
        self, batch: Sequence[TensorMap], rows: Sequence[int], contexts: Sequence[Context], phases: Phases
    ) -> list[TensorMap | Exception]: ...


@runtime_checkable
class BatchExecutor(Protocol):
    """A node whose instances execute a list of requests at once (BackendNode). A result may be
    an exception: that request's own error (Triton's python backend fails requests one by one)."""

    name: str

    @property
    def instance_count(self) -> int: ...

    async def run_batch(
        self,
        batch: list[TensorMap],
        on_acquired: Callable[[], None] | None = None,
        contexts: Sequence[Context] | None = None,
    ) -> Sequence[TensorMap | Exception]: ...


class StreamSink:
    """One streamed request's responses: put from any thread (the model's sender), read by the
    request's caller with :meth:`responses` until the final flag or an error. Once the caller
    has left (:meth:`leave`), what the model still sends is dropped, not held."""

    __slots__ = ("_gone", "_loop", "_queue", "cancel")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[tuple[TensorMap | None, bool] | BaseException] = asyncio.Queue()
        self._gone = False
        # set by the node that runs the request: tells the model nobody reads further responses
        self.cancel: Callable[[], None] | None = None

    def put(self, outputs: TensorMap | None, final: bool) -> None:
        if not self._gone:
            self._loop.call_soon_threadsafe(self._put, (outputs, final))

    def fail(self, error: BaseException) -> None:
        if not self._gone:
            self._loop.call_soon_threadsafe(self._put, error)

    def _put(self, item: tuple[TensorMap | None, bool] | BaseException) -> None:
        if not self._gone:  # (on the loop) left since it was sent
            self._queue.put_nowait(item)

    def leave(self) -> None:
        """The caller stops reading (on the loop): drop what is queued and what comes later,
        and tell the model (its ``is_cancelled()``)."""
        self._gone = True
        queue = self._queue
        while not queue.empty():
            queue.get_nowait()
        if self.cancel is not None:
            self.cancel()

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    async def responses(self) -> AsyncGenerator[TensorMap, None]:
        queue = self._queue
        while True:
            item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            outputs, final = item
            if outputs is not None:
                yield outputs
            if final:
                return


@runtime_checkable
class StreamBatchExecutor(Protocol):
    """A decoupled node whose instances execute a list of requests at once (python models)."""

    name: str

    @property
    def instance_count(self) -> int: ...

    async def run_stream_batch(
        self,
        batch: list[TensorMap],
        contexts: Sequence[Context],
        sinks: Sequence[StreamSink],
        on_acquired: Callable[[], None] | None = None,
    ) -> None: ...


def batch_context(contexts: Sequence[Context]) -> Context:
    """The context a merged call runs with: the first request's, with the latest deadline."""
    head = contexts[0]
    if len(contexts) == 1:
        return head
    deadlines = [c.deadline_ns for c in contexts]
    latest = None if None in deadlines else max(d for d in deadlines if d is not None)
    return Context(
        request_id=head.request_id, parameters=head.parameters, deadline_ns=latest, priority=head.priority
    )


class _Instances(Protocol):
    name: str

    @property
    def instance_count(self) -> int: ...


N = TypeVar("N", bound=_Instances)


class _OnInstances(Generic[N]):
    """Runs batches on a node's instances: as many at once as it has."""

    def __init__(self, node: N, clock: Clock) -> None:
        self.node = node
        self.clock = clock

    @property
    def capacity(self) -> int:
        return max(1, self.node.instance_count)


class InstanceRunner(_OnInstances[BatchExecutor]):
    def runs_inline(self) -> bool:
        """Whether the next batch will run on the event loop, start to end (never suspending)."""
        probe = getattr(self.node, "runs_inline", None)
        return bool(probe()) if probe is not None else False

    async def run(
        self, batch: Sequence[TensorMap], rows: Sequence[int], contexts: Sequence[Context], phases: Phases
    ) -> list[TensorMap | Exception]:
        clock = self.clock

        def acquired() -> None:
            phases.start_ns = phases.infer_start_ns = clock.now_ns()

        results = await self.node.run_batch(list(batch), acquired, contexts)
        phases.infer_end_ns = phases.end_ns = clock.now_ns()
        return check_split(results, rows, self.node.name)


class StreamRunner(_OnInstances[StreamBatchExecutor]):
    def runs_inline(self) -> bool:
        return False  # execute() of a decoupled model may block (its examples sleep)

    async def run_streams(
        self,
        batch: Sequence[TensorMap],
        contexts: Sequence[Context],
        sinks: Sequence[StreamSink],
        phases: Phases,
    ) -> None:
        """One ``execute`` of the batch; returns when it returned (responses may still come)."""
        clock = self.clock

        def acquired() -> None:
            phases.start_ns = phases.infer_start_ns = clock.now_ns()

        await self.node.run_stream_batch(list(batch), contexts, sinks, acquired)
        phases.infer_end_ns = phases.end_ns = clock.now_ns()


class NodeRunner:
    def __init__(
        self,
        node: Node,
        clock: Clock,
        ragged: frozenset[str] = frozenset(),
        capacity: int = 1,
        meter: CopyMeter | None = None,
    ) -> None:
        self.node = node
        self.clock = clock
        self.ragged = ragged
        self._capacity = max(1, capacity)
        self.meter = meter  # the node's statistics: a merge's copies count as its bytes copied

    @property
    def capacity(self) -> int:
        return self._capacity

    def runs_inline(self) -> bool:
        return False  # a node call may suspend at any point

    async def run(
        self, batch: Sequence[TensorMap], rows: Sequence[int], contexts: Sequence[Context], phases: Phases
    ) -> list[TensorMap | Exception]:
        clock = self.clock
        phases.start_ns = clock.now_ns()
        merged = merge_rows(batch, self.ragged, self.meter)
        phases.infer_start_ns = clock.now_ns()
        outputs = await self.node(merged, batch_context(contexts))
        phases.infer_end_ns = clock.now_ns()
        parts: list[TensorMap | Exception] = list(split_rows(outputs, rows, self.node.name))
        phases.end_ns = clock.now_ns()
        return parts
