"""A log line that a flood cannot multiply: :class:`LimitedLog` writes at most one line every
``interval_s`` seconds and says, in the next line it writes, how many it left out. For messages
a client can cause at will (a failing request, a refused connection), so that an attack costs
the server neither disk nor the time to format thousands of lines."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class LimitedLog:
    """At most one line every ``interval_s`` seconds of ``clock`` to ``logger``."""

    __slots__ = ("clock", "interval_s", "left_out", "logged_at", "logger")

    def __init__(
        self,
        logger: logging.Logger,
        clock: Callable[[], float] = time.monotonic,
        interval_s: float = 1.0,
    ) -> None:
        self.logger = logger
        self.clock = clock
        self.interval_s = interval_s
        self.logged_at = -1e18
        self.left_out = 0

    def __call__(self, level: int, message: str, *args: object, **kwargs: object) -> bool:
        """Log ``message % args`` at ``level`` unless a line was written within the interval
        (then count it); ``kwargs`` go to ``Logger.log`` (``extra=``). True when written."""
        now = self.clock()
        if now - self.logged_at < self.interval_s:
            self.left_out += 1
            return False
        if self.left_out:
            message += " (and %d more like it since the last such message)"
            args = (*args, self.left_out)
        self.logger.log(level, message, *args, **kwargs)  # type: ignore[arg-type]
        self.logged_at = now
        self.left_out = 0
        return True


__all__ = ["LimitedLog"]
