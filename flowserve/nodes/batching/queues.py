"""The batcher's queue: priority levels, per-level queue policies, timeouts. Pure state, no I/O.

State
    One FIFO per priority level (level 1 is drained first) plus, per level, the requests whose
    queue timeout expired with action DELAY: they stay in the queue but move behind every
    unexpired request of their level (Triton's ``PriorityQueue``). A heap of timeouts finds the
    next one to expire. ``len()`` counts every queued request; the queue holds at most
    ``capacity`` and each level at most its ``max_queue_size`` (0 = no per-level bound).

Policy (Triton's ``ModelQueuePolicy``, per level)
    - admission (:meth:`PriorityQueue.push`): a full level or a full queue raises
      ``Unavailable("request exceeds maximum queue size ...")`` at once;
    - a request's priority selects its level; 0 or out of range means the default level;
    - its timeout is ``default_timeout_us``; when ``allow_timeout_override`` is set, the
      request's ``timeout`` parameter can only lower it (0 means no timeout, which a request
      cannot turn into one);
    - :meth:`PriorityQueue.expire` runs the timeouts: once ``now > timeout``, REJECT removes the
      request and returns it (the batcher fails it with ``Unavailable("Request timeout
      expired")``), DELAY moves it behind the unexpired requests of its level.

Example::

    >>> q: PriorityQueue[str] = PriorityQueue([LevelPolicy(default_timeout_ns=10)], 1, 100)
    >>> _ = q.push("a", rows=1, key=(), now_ns=0)
    >>> [e.payload for e in q.expire(now_ns=11)]
    ['a']
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from flowserve.core.errors import InvalidArgument, Unavailable
from flowserve.spec.schema import BatchingSpec, QueuePolicy

P = TypeVar("P")


@dataclass(frozen=True, slots=True)
class LevelPolicy:
    """The queue policy of one priority level (times in nanoseconds)."""

    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    default_timeout_ns: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    @classmethod
    def from_spec(cls, policy: QueuePolicy) -> LevelPolicy:
        if policy.timeout_action not in ("REJECT", "DELAY"):
            raise InvalidArgument(f"timeout_action must be REJECT or DELAY, got {policy.timeout_action!r}")
        if policy.default_timeout_us < 0 or policy.max_queue_size < 0:
            raise InvalidArgument("default_timeout_us and max_queue_size must be >= 0")
        return cls(
            policy.timeout_action,
            policy.default_timeout_us * 1000,
            policy.allow_timeout_override,
            policy.max_queue_size,
        )

    def timeout_ns(self, override_us: int | None) -> int:
        """The request's queue timeout (0 = none): the default, lowered by a smaller override."""
        timeout = self.default_timeout_ns
        if self.allow_timeout_override and override_us is not None and 0 < override_us * 1000 < timeout:
            timeout = override_us * 1000
        return timeout


def levels_from_spec(spec: BatchingSpec) -> tuple[list[LevelPolicy], int]:
    """Per-level policies (index 0 is level 1) and the default level (1-based)."""
    count = spec.priority_levels
    if count < 0:
        raise InvalidArgument(f"priority_levels must be >= 0, got {count}")
    default = LevelPolicy.from_spec(spec.default_queue_policy)
    if count == 0:
        if spec.priority_queue_policy:
            raise InvalidArgument("priority_queue_policy needs priority_levels > 0")
        return [default], 1
    if not 1 <= spec.default_priority_level <= count:
        raise InvalidArgument(
            f"default_priority_level must be between 1 and priority_levels ({count}), "
            f"got {spec.default_priority_level}"
        )
    levels = [default] * count
    for level, policy in spec.priority_queue_policy.items():
        if not 1 <= level <= count:
            raise InvalidArgument(f"priority_queue_policy level {level} is outside 1..{count}")
        levels[level - 1] = LevelPolicy.from_spec(policy)
    return levels, spec.default_priority_level


@dataclass(eq=False, slots=True)
class Entry(Generic[P]):
    """One queued request: what the policy needs (rows, key, enqueued_ns) and the caller's payload."""

    payload: P
    rows: int
    key: Hashable
    enqueued_ns: int
    level: int
    timeout_ns: int = 0
    delayed: bool = False
    queued: bool = True


@dataclass(slots=True)
class _Level(Generic[P]):
    policy: LevelPolicy
    live: deque[Entry[P]] = field(default_factory=deque)
    delayed: deque[Entry[P]] = field(default_factory=deque)

    def __len__(self) -> int:
        return len(self.live) + len(self.delayed)


class PriorityQueue(Generic[P]):
    def __init__(self, policies: Sequence[LevelPolicy], default_level: int, capacity: int) -> None:
        if not policies or not 1 <= default_level <= len(policies):
            raise InvalidArgument("a priority queue needs at least one level and a default level among them")
        self._levels: list[_Level[P]] = [_Level(p) for p in policies]
        self._default = default_level
        self.capacity = capacity
        self._size = 0
        self._timeouts: list[tuple[int, int, Entry[P]]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return self._size

    def level_of(self, priority: int) -> int:
        """The 1-based level of a request's priority (0 or out of range: the default level)."""
        return priority if 1 <= priority <= len(self._levels) else self._default

    def push(
        self,
        payload: P,
        rows: int,
        key: Hashable,
        now_ns: int,
        priority: int = 0,
        timeout_us: int | None = None,
    ) -> Entry[P]:
        """Queue a request, or raise Unavailable at once when its level or the queue is full."""
        number = self.level_of(priority)
        level = self._levels[number - 1]
        limit = level.policy.max_queue_size
        if limit and len(level) >= limit:
            raise Unavailable(
                f"request exceeds maximum queue size ({limit} queued at priority level {number})"
            )
        if self._size >= self.capacity:
            raise Unavailable(f"request exceeds maximum queue size (the batcher holds {self.capacity})")
        timeout = level.policy.timeout_ns(timeout_us)
        entry = Entry(payload, rows, key, now_ns, number, now_ns + timeout if timeout else 0)
        level.live.append(entry)
        self._size += 1
        if timeout:
            heapq.heappush(self._timeouts, (entry.timeout_ns, next(self._seq), entry))
        return entry

    def __iter__(self) -> Iterator[Entry[P]]:
        """Queued requests in scheduling order."""
        for level in self._levels:
            yield from level.live
            yield from level.delayed

    def pop(self, count: int) -> list[Entry[P]]:
        """Remove and return the first ``count`` requests in scheduling order."""
        taken: list[Entry[P]] = []
        for level in self._levels:
            for fifo in (level.live, level.delayed):
                while fifo and len(taken) < count:
                    entry = fifo.popleft()
                    entry.queued = False
                    taken.append(entry)
        self._size -= len(taken)
        return taken

    def remove(self, entry: Entry[P]) -> bool:
        """Drop a queued request (its caller went away); False if it was no longer queued."""
        if not entry.queued:
            return False
        level = self._levels[entry.level - 1]
        (level.delayed if entry.delayed else level.live).remove(entry)
        entry.queued = False
        self._size -= 1
        return True

    def drain(self) -> list[Entry[P]]:
        """Remove and return everything (on shutdown)."""
        return self.pop(self._size)

    def expire(self, now_ns: int) -> list[Entry[P]]:
        """Apply timeouts at ``now_ns``: DELAY moves, REJECT removes; returns the rejected."""
        rejected: list[Entry[P]] = []
        heap = self._timeouts
        while heap and heap[0][0] < now_ns:
            entry = heapq.heappop(heap)[2]
            if not entry.queued or entry.delayed:
                continue
            level = self._levels[entry.level - 1]
            level.live.remove(entry)
            if level.policy.timeout_action == "DELAY":
                entry.delayed = True
                level.delayed.append(entry)
            else:
                entry.queued = False
                self._size -= 1
                rejected.append(entry)
        return rejected

    def next_timeout(self) -> int | None:
        """The first instant at which :meth:`expire` will find something to do."""
        heap = self._timeouts
        while heap and (not heap[0][2].queued or heap[0][2].delayed):
            heapq.heappop(heap)
        return heap[0][0] + 1 if heap else None
