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
:class:`~flowserve.core.errors.InternalError` naming the node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from flowserve.core.clock import Clock
from flowserve.core.node import Context, Node, TensorMap
from flowserve.nodes.batching.tensors import check_split, merge_rows, split_rows


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
        self, batch: Sequence[TensorMap], rows: Sequence[int], ctx: Context, phases: Phases
    ) -> list[TensorMap]: ...


@runtime_checkable
class BatchExecutor(Protocol):
    """A node whose instances execute a list of requests at once (BackendNode)."""

    name: str

    @property
    def instance_count(self) -> int: ...

    async def run_batch(
        self, batch: list[TensorMap], on_acquired: Callable[[], None] | None = None
    ) -> list[TensorMap]: ...


class InstanceRunner:
    def __init__(self, node: BatchExecutor, clock: Clock) -> None:
        self.node = node
        self.clock = clock

    @property
    def capacity(self) -> int:
        return max(1, self.node.instance_count)

    def runs_inline(self) -> bool:
        """Whether the next batch will run on the event loop, start to end (never suspending)."""
        probe = getattr(self.node, "runs_inline", None)
        return bool(probe()) if probe is not None else False

    async def run(
        self, batch: Sequence[TensorMap], rows: Sequence[int], ctx: Context, phases: Phases
    ) -> list[TensorMap]:
        clock = self.clock

        def acquired() -> None:
            phases.start_ns = phases.infer_start_ns = clock.now_ns()

        results = await self.node.run_batch(list(batch), acquired)
        phases.infer_end_ns = phases.end_ns = clock.now_ns()
        return check_split(results, rows, self.node.name)


class NodeRunner:
    def __init__(
        self, node: Node, clock: Clock, ragged: frozenset[str] = frozenset(), capacity: int = 1
    ) -> None:
        self.node = node
        self.clock = clock
        self.ragged = ragged
        self._capacity = max(1, capacity)

    @property
    def capacity(self) -> int:
        return self._capacity

    def runs_inline(self) -> bool:
        return False  # a node call may suspend at any point

    async def run(
        self, batch: Sequence[TensorMap], rows: Sequence[int], ctx: Context, phases: Phases
    ) -> list[TensorMap]:
        clock = self.clock
        phases.start_ns = clock.now_ns()
        merged = merge_rows(batch, self.ragged)
        phases.infer_start_ns = clock.now_ns()
        outputs = await self.node(merged, ctx)
        phases.infer_end_ns = clock.now_ns()
        parts = split_rows(outputs, rows, self.node.name)
        phases.end_ns = clock.now_ns()
        return parts
