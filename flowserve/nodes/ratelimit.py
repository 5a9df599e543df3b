"""Triton's rate limiter: model instances run only when the resources they declare are free.

Configured per instance group in config.pbtxt, used only when the server enables it
(``--rate-limit=execution_count``; the default ``off`` ignores these settings)::

    instance_group [{ count: 2  kind: KIND_GPU
      rate_limiter { resources [{ name: "R1" count: 4 }, { name: "MEM" global: true count: 2 }]
                     priority: 2 } }]

- A resource is per device (each GPU has its own ``R1``; CPU instances count as device 0)
  unless ``global``, then one pool serves every device.
- How many units exist: by default the most any single instance asks for (so each instance can
  run alone), or ``--rate-limit-resource=NAME:COUNT[:DEVICE]`` (no device: every device, and
  the global pool). An instance that asks for more than exist fails to load, with the reason.
- An instance holds its resources from the start of an execution to its end (on its thread,
  even when the request that started it is gone), so two instances whose needs together exceed
  what exists never run at the same time.
- When resources free up, the waiting instance that fits with the fewest executions scaled by
  its priority runs first (Triton's ``execution_count`` mode): priority 2 gets half the chances
  of priority 1; 0 counts as 1. Ties go to the one waiting longest.

The decision is the pure :func:`pick`; :class:`RateLimiter` keeps the counts and the waiters, and
:class:`Ticket` is what one instance presents (``nodes/instances.py`` takes it before running
the instance and gives it back after). Instances that declare no resources never wait and get
no ticket, so with the limiter off, or for models without ``rate_limiter``, the path is as fast
as before. The engine publishes its limiter to loading backends through :data:`RATE_LIMITER`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flowserve.core.errors import InvalidArgument
from flowserve.spec.schema import ModelSpec

# (resource name, device); device None: a global resource
Key = tuple[str, int | None]
RATE_LIMIT_MODES = ("off", "execution_count")


@dataclass(frozen=True, slots=True)
class ResourceLimit:
    """``--rate-limit-resource=NAME:COUNT[:DEVICE]``: how many units of NAME exist (on DEVICE;
    without one, on every device and in the global pool)."""

    name: str
    count: int
    device: int | None = None


def parse_resource_limit(text: str) -> ResourceLimit:
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3) or not parts[0]:
            raise ValueError
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else None
        if count < 0 or (device is not None and device < 0):
            raise ValueError
    except ValueError:
        raise InvalidArgument(
            f"rate limit resource {text!r} must be NAME:COUNT or NAME:COUNT:DEVICE (integers >= 0)"
        ) from None
    return ResourceLimit(parts[0], count, device)


def instance_needs(model: ModelSpec, index: int) -> tuple[dict[Key, int], int]:
    """What instance ``index`` of ``model`` needs to run, and its priority, from its instance
    group's ``rate_limiter`` (instances are numbered through the groups in order, as placed)."""
    start = 0
    for group in model.instances:
        if index < start + group.count:
            local = index - start
            device = group.gpus[local % len(group.gpus)] if group.kind == "KIND_GPU" and group.gpus else 0
            needs: dict[Key, int] = {}
            for r in group.resources:
                key = (r.name, None if r.global_ else device)
                needs[key] = needs.get(key, 0) + r.count
            return needs, group.priority
        start += group.count
    return {}, 0


def pick(waiting: Sequence[tuple[Mapping[Key, int], int]], free: Mapping[Key, int]) -> int | None:
    """Which waiter runs next: among ``waiting`` ((needs, scaled execution count), oldest first)
    those whose needs are all free now, the one with the lowest count (the oldest on a tie);
    None when none fits."""
    best: int | None = None
    best_count = 0
    for index, (needs, count) in enumerate(waiting):
        if best is not None and count >= best_count:
            continue
        if all(free.get(key, 0) >= n for key, n in needs.items()):
            best, best_count = index, count
    return best


class Ticket:
    """One instance's claim on the limiter: its needs, priority and executions so far."""

    __slots__ = ("executions", "label", "limiter", "needs", "priority")

    def __init__(self, limiter: RateLimiter, needs: dict[Key, int], priority: int, label: str) -> None:
        self.limiter = limiter
        self.needs = needs
        self.priority = max(priority, 1)
        self.executions = 0
        self.label = label

    @property
    def scaled(self) -> int:
        return self.executions * self.priority

    async def acquire(self) -> None:
        """Wait until the needs are free, and take them."""
        await self.limiter.acquire(self)

    def release(self) -> None:
        self.limiter.release(self)


class _Waiter:
    __slots__ = ("future", "ticket")

    def __init__(self, ticket: Ticket, future: asyncio.Future[None]) -> None:
        self.ticket = ticket
        self.future = future


class RateLimiter:
    """The resource counts and the instances waiting for them (one per server)."""

    def __init__(self, limits: Sequence[ResourceLimit] = ()) -> None:
        self.limits = list(limits)
        self.capacity: dict[Key, int] = {}
        self.free: dict[Key, int] = {}
        self._waiting: list[_Waiter] = []

    @property
    def waiting(self) -> int:
        """Instances waiting for resources now."""
        return len(self._waiting)

    def _limit(self, key: Key) -> int | None:
        name, device = key
        exact = [x.count for x in self.limits if x.name == name and x.device == device]
        if exact:
            return exact[-1]
        anywhere = [x.count for x in self.limits if x.name == name and x.device is None]
        return anywhere[-1] if anywhere else None

    def tickets(self, model: ModelSpec, count: int, version: int | str = "") -> list[Ticket | None]:
        """Tickets for instances 0..count-1 of ``model`` (None for an instance that needs no
        resource), growing the default counts to fit them. Raises InvalidArgument when an
        instance needs more of a resource than ``--rate-limit-resource`` allows."""
        out: list[Ticket | None] = []
        for index in range(count):
            needs, priority = instance_needs(model, index)
            for key, n in needs.items():
                limit = self._limit(key)
                if limit is not None and n > limit:
                    where = "global" if key[1] is None else f"device {key[1]}"
                    raise InvalidArgument(
                        f"model '{model.name}': an instance needs {n} of rate limiter resource "
                        f"'{key[0]}' ({where}), but only {limit} exist (--rate-limit-resource)"
                    )
            label = f"{model.name}-v{version}-{index}" if version != "" else f"{model.name}-{index}"
            out.append(Ticket(self, needs, priority, label) if needs else None)
        for ticket in out:
            if ticket is not None:
                for key, n in ticket.needs.items():
                    self._grow(key, n)
        self._dispatch()
        return out

    def _grow(self, key: Key, need: int) -> None:
        limit = self._limit(key)
        total = limit if limit is not None else max(self.capacity.get(key, 0), need)
        added = total - self.capacity.get(key, 0)
        if added:
            self.capacity[key] = total
            self.free[key] = self.free.get(key, 0) + added

    async def acquire(self, ticket: Ticket) -> None:
        if not self._waiting and self._fits(ticket):
            self._take(ticket)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(ticket, future)
        self._waiting.append(waiter)
        self._dispatch()
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(ticket)  # granted, but its caller is gone
            elif waiter in self._waiting:
                self._waiting.remove(waiter)
            raise

    def release(self, ticket: Ticket) -> None:
        free = self.free
        for key, n in ticket.needs.items():
            free[key] += n
        self._dispatch()

    def _fits(self, ticket: Ticket) -> bool:
        free = self.free
        return all(free.get(key, 0) >= n for key, n in ticket.needs.items())

    def _take(self, ticket: Ticket) -> None:
        free = self.free
        for key, n in ticket.needs.items():
            free[key] -= n
        ticket.executions += 1

    def _dispatch(self) -> None:
        waiting = self._waiting
        while waiting:
            waiting[:] = [w for w in waiting if not w.future.done()]
            index = pick([(w.ticket.needs, w.ticket.scaled) for w in waiting], self.free)
            if index is None:
                return
            waiter = waiting.pop(index)
            self._take(waiter.ticket)
            waiter.future.set_result(None)


# The engine's limiter, published to backends while they load (None: rate limiting is off).


__all__ = [
    "RATE_LIMIT_MODES",
    "RateLimiter",
    "ResourceLimit",
    "Ticket",
    "instance_needs",
    "parse_resource_limit",
    "pick",
]
