"""Sub-millisecond waits on the event loop.

uvloop (libuv) keeps its timers in whole milliseconds: ``asyncio.timeout(0.0005)`` there ends
after about 1 ms, and a 200 us one at once. A dynamic batcher with ``max_queue_delay`` of
500 us would then hold every request twice as long as configured (measured: 1036 us for a
500 us wait). On Linux, :class:`PreciseTimer` arms a ``timerfd`` (the kernel's microsecond
timer) that the loop watches like a socket, so a wait ends within tens of microseconds of its
deadline with no thread and no busy loop. Elsewhere, or when ``timerfd`` is unavailable, it
falls back to the loop's own timers.

::

    timer = PreciseTimer(callback)      # callback() runs on the loop when the timer fires
    timer.arm(delay_ns)                 # (re)arm; at most one pending expiry
    timer.disarm()
    timer.close()
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time
from collections.abc import Callable

# below this a wait uses the timerfd; above it the loop's millisecond timers are precise enough
PRECISE_BELOW_NS = 5_000_000
# re-arming for an expiry at most this much later than the armed one keeps the armed one: a
# batcher re-arms for the same deadline (its oldest request's) each time a request wakes it,
# computed a little later each time; an earlier expiry is always armed
SAME_EXPIRY_NS = 50_000

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = 0o4000
_TFD_CLOEXEC = 0o2000000


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


class _Itimerspec(ctypes.Structure):
    _fields_ = (("it_interval", _Timespec), ("it_value", _Timespec))


def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        # the process's own symbols, libc's among them (find_library would run ldconfig at import)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.timerfd_create.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.timerfd_settime.argtypes = (
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(_Itimerspec),
            ctypes.POINTER(_Itimerspec),
        )
    except (OSError, AttributeError):
        return None
    return libc


_libc = _load_libc()


class PreciseTimer:
    """One re-armable one-shot timer on the running loop; ``callback`` runs on the loop."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback = callback
        self._loop = asyncio.get_running_loop()
        self._fd = -1
        self._handle: asyncio.TimerHandle | None = None
        self._spec = _Itimerspec()
        # when the armed timerfd expires (time.monotonic_ns), 0 when not armed: re-arming for
        # about the same moment, or disarming what already fired, needs no system call
        self._armed_at = 0
        if _libc is not None:
            fd = int(_libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC))
            if fd >= 0:
                try:
                    self._loop.add_reader(fd, self._fired)
                except (NotImplementedError, OSError):
                    os.close(fd)
                else:
                    self._fd = fd

    @property
    def precise(self) -> bool:
        """Whether waits use the kernel timer (else the loop's own timers)."""
        return self._fd >= 0

    def arm(self, delay_ns: int) -> None:
        """Fire once, ``delay_ns`` from now (replacing a pending expiry)."""
        delay_ns = max(delay_ns, 1)  # 0 would disarm a timerfd
        if self._fd < 0 or delay_ns >= PRECISE_BELOW_NS:
            self._disarm_fd()
            if self._handle is not None:
                self._handle.cancel()
            self._handle = self._loop.call_later(delay_ns / 1e9, self._fire_handle)
            return
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        at = time.monotonic_ns() + delay_ns
        if self._armed_at and 0 <= at - self._armed_at < SAME_EXPIRY_NS:
            return  # the armed expiry is at most that much earlier: keep it
        self._armed_at = at
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = divmod(delay_ns, 1_000_000_000)
        assert _libc is not None
        _libc.timerfd_settime(self._fd, 0, ctypes.byref(self._spec), None)

    def disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._disarm_fd()

    def _disarm_fd(self) -> None:
        if self._armed_at and self._fd >= 0 and _libc is not None:
            self._armed_at = 0
            value = self._spec.it_value
            value.tv_sec = value.tv_nsec = 0
            _libc.timerfd_settime(self._fd, 0, ctypes.byref(self._spec), None)

    def _fired(self) -> None:
        self._armed_at = 0
        try:
            os.read(self._fd, 8)  # the expiry count; reading re-arms readiness
        except (BlockingIOError, InterruptedError):
            return  # disarmed after it became readable: nothing fired
        self._callback()

    def _fire_handle(self) -> None:
        self._handle = None
        self._callback()

    def close(self) -> None:
        self.disarm()
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
