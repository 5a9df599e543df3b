"""PreciseTimer fires once per arm, on the loop; disarm and re-arm replace the pending expiry.
(Behaviour only: how precise it is lives in benchmarks/, not in tests.)"""

import asyncio
import time

import pytest

from flowserve.runtime.timer import PRECISE_BELOW_NS, PreciseTimer


async def test_fires_once_for_short_and_long_delays() -> None:
    fired: list[int] = []
    event = asyncio.Event()

    def callback() -> None:
        fired.append(1)
        event.set()

    timer = PreciseTimer(callback)
    try:
        for delay in (200_000, PRECISE_BELOW_NS + 1_000_000):  # the timerfd, then the loop's timer
            event.clear()
            timer.arm(delay)
            await asyncio.wait_for(event.wait(), 5)
        await asyncio.sleep(0.02)
        assert len(fired) == 2
    finally:
        timer.close()


async def test_disarm_and_rearm_replace_the_expiry() -> None:
    fired: list[int] = []
    timer = PreciseTimer(lambda: fired.append(1))
    try:
        timer.arm(20_000_000)
        timer.disarm()
        timer.arm(1_000_000)
        timer.arm(30_000_000)  # replaces the 1 ms expiry
        timer.disarm()
        await asyncio.sleep(0.06)
        assert fired == []
    finally:
        timer.close()
        timer.close()  # idempotent


async def test_rearming_for_the_same_moment_keeps_one_expiry_and_skips_the_system_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flowserve.runtime import timer as timer_module

    if timer_module._libc is None:
        pytest.skip("no timerfd here")
    calls: list[int] = []
    real = timer_module._libc

    class CountingLibc:
        def timerfd_settime(self, *args: object) -> int:
            calls.append(1)
            return int(real.timerfd_settime(*args))

    fired: list[int] = []
    event = asyncio.Event()
    timer = PreciseTimer(lambda: (fired.append(1), event.set()))
    monkeypatch.setattr(timer_module, "_libc", CountingLibc())
    try:
        # the clock held still while arming, so "the same moment" does not depend on how
        # fast this busy machine gets from one call to the next
        with monkeypatch.context() as frozen:
            now = time.monotonic_ns()
            frozen.setattr(time, "monotonic_ns", lambda: now)
            timer.arm(3_000_000)
            timer.arm(3_000_000)  # the same expiry: kept
            assert len(calls) == 1
            timer.arm(2_000_000)  # an earlier one: armed
            assert len(calls) == 2
        await asyncio.wait_for(event.wait(), 5)
        timer.disarm()  # already fired: nothing to disarm
        assert len(calls) == 2 and fired == [1]
        event.clear()
        timer.arm(1_000_000)  # after firing, arming works again
        await asyncio.wait_for(event.wait(), 5)
        assert len(calls) == 3 and fired == [1, 1]
    finally:
        timer.close()
