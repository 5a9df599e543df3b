"""An injectable monotonic clock: components take one, tests pass a fake."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ns(self) -> int:
        """Monotonic time in nanoseconds."""
        ...


class MonotonicClock:
    """``time.monotonic_ns`` itself as ``now_ns`` (an attribute, not a method that calls it:
    the request path reads the clock dozens of times per request, and the extra Python frame
    was about a third of each read)."""

    def __init__(self) -> None:
        self.now_ns = time.monotonic_ns


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
