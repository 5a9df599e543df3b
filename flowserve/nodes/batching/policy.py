"""The dynamic batching decision as a pure function (Triton's ``GetDynamicBatch``).

State
    The batcher's queue, seen as a sequence of :class:`Queued` requests in *scheduling order*:
    priority level 1 first; inside a level, arrival order, then the requests whose queue
    timeout expired with action DELAY. A request contributes its *rows* (its batch dimension,
    at least 1), not 1, and carries a *key*: its input names, dtypes and non-batch shapes.
    Requests with unequal keys never share a batch.

Policy (:func:`decide`, asked only when an instance is free)
    1. Scan from the head, adding rows to a pending batch. Stop before a request that would take
       the batch past ``max_batch_size`` or whose key differs from the head's (the batch cannot
       grow any more: "send now").
    2. Remember the last point where the pending rows equal a preferred size or, the first time
       the next request would go past the largest preferred size, the rows so far.
    3. If such a point exists and the oldest pending request has waited less than
       ``max_queue_delay``: take up to that point.
    4. Otherwise take everything pending when the batch cannot grow, has reached the largest
       preferred size, the delay is exceeded, or the delay is 0.
    5. Otherwise wait until the oldest pending request has waited ``max_queue_delay``.

    With no preferred sizes configured the preferred size is ``max_batch_size`` (Triton fills it
    in). Nothing here reads a clock, awaits or sleeps: ``now_ns`` is an argument.

Example::

    >>> cfg = BatchPolicy(max_batch_size=8, preferred=frozenset({4}), max_queue_delay_ns=100_000)
    >>> five = [Candidate(rows=1, key="a", enqueued_ns=0)] * 5
    >>> decide(five, now_ns=10, config=cfg)
    Take(count=4, rows=4)
    >>> decide(five[:3], now_ns=10, config=cfg)
    Wait(until_ns=100000)
    >>> decide(five[:3], now_ns=100_000, config=cfg)
    Take(count=3, rows=3)
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Protocol

from flowserve.core.errors import InvalidArgument
from flowserve.spec.schema import BatchingSpec


class Queued(Protocol):
    """What :func:`decide` sees of one queued request."""

    @property
    def rows(self) -> int: ...

    @property
    def key(self) -> Hashable: ...

    @property
    def enqueued_ns(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Candidate:
    """A plain :class:`Queued` (for tests and examples)."""

    rows: int
    key: Hashable
    enqueued_ns: int


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """The part of ``dynamic_batching`` that forms batches (queue policies live in queues.py)."""

    max_batch_size: int
    preferred: frozenset[int] = frozenset()
    max_queue_delay_ns: int = 0

    @property
    def largest_preferred(self) -> int:
        return max(self.preferred, default=self.max_batch_size)


@dataclass(frozen=True, slots=True)
class Take:
    """Send the first ``count`` requests of the queue (``rows`` rows in all) now."""

    count: int
    rows: int


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to send yet; decide again at ``until_ns`` (or when something changes)."""

    until_ns: int


Decision = Take | Wait | None


def policy_from_spec(spec: BatchingSpec) -> BatchPolicy:
    """Validate ``spec``'s batch-forming settings; an empty preferred list means max_batch_size."""
    if spec.max_batch_size < 1:
        raise InvalidArgument(f"batching needs max_batch_size >= 1, got {spec.max_batch_size}")
    bad = [s for s in spec.preferred_batch_size if not 1 <= s <= spec.max_batch_size]
    if bad:
        raise InvalidArgument(
            f"preferred_batch_size {list(bad)} must be between 1 and max_batch_size ({spec.max_batch_size})"
        )
    if spec.max_queue_delay_us < 0:
        raise InvalidArgument(f"max_queue_delay_us must be >= 0, got {spec.max_queue_delay_us}")
    preferred = frozenset(spec.preferred_batch_size) or frozenset({spec.max_batch_size})
    return BatchPolicy(spec.max_batch_size, preferred, spec.max_queue_delay_us * 1000)


def decide(queue: Iterable[Queued], now_ns: int, config: BatchPolicy) -> Decision:
    """Which requests to send now, or until when to wait; None when the queue is empty."""
    max_rows = config.max_batch_size
    preferred = config.preferred
    top = config.largest_preferred
    count = rows = 0
    best_count = best_rows = 0
    key: Hashable = None
    oldest = now_ns
    full = False
    for request in queue:
        size = max(1, request.rows)
        if count == 0:
            key = request.key
        else:
            if rows + size > top and best_count == 0:
                best_count, best_rows = count, rows
            if rows + size > max_rows or request.key != key:
                full = True
                break
        count += 1
        rows += size
        oldest = min(oldest, request.enqueued_ns)
        if rows in preferred:
            best_count, best_rows = count, rows
    if count == 0:
        return None
    delay = config.max_queue_delay_ns
    late = delay > 0 and now_ns - oldest >= delay
    if best_count and not late:
        return Take(best_count, best_rows)
    if full or rows >= top or late or delay == 0:
        return Take(count, rows)
    return Wait(oldest + delay)
