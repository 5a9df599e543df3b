"""An injectable monotonic clock: components take one, tests pass a fake."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ns(self) -> int:
        """Monotonic time in nanoseconds."""
        ...


class MonotonicClock:
    def now_ns(self) -> int:
        return time.monotonic_ns()


class FakeClock:
    """A clock that moves only when told to (for tests)."""

    def __init__(self, start_ns: int = 0) -> None:
        self._now = start_ns

    def now_ns(self) -> int:
        return self._now

    def advance(self, ns: int) -> None:
        self._now += ns


MONOTONIC = MonotonicClock()


def wall_ms() -> int:
    """Wall-clock milliseconds since the epoch (only for reporting, e.g. last_inference)."""
    return time.time_ns() // 1_000_000
