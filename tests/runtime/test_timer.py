"""PreciseTimer fires once per arm, on the loop; disarm and re-arm replace the pending expiry.
(Behaviour only: how precise it is lives in benchmarks/, not in tests.)"""

import asyncio

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
