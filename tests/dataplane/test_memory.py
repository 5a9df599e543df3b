"""Freed request memory given back to the system (flowserve/dataplane/memory.py): a trim once
enough was freed, in a worker thread, at most once per interval."""

from __future__ import annotations

import asyncio
import threading

from flowserve.dataplane.memory import Trimmer, _malloc_trim


async def test_trims_once_enough_was_freed_and_at_most_once_per_interval() -> None:
    ran: list[str] = []
    now = [100.0]
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def trim() -> None:
        ran.append(threading.current_thread().name)
        loop.call_soon_threadsafe(done.set)

    trimmer = Trimmer(trim, after=100, every_s=0.2, clock=lambda: now[0])
    trimmer.freed(60)
    await asyncio.sleep(0.05)
    assert ran == []  # not enough yet
    trimmer.freed(60)
    await asyncio.wait_for(done.wait(), 5)
    assert len(ran) == 1 and ran[0] != threading.current_thread().name  # in a worker thread
    done.clear()
    trimmer.freed(500)  # again at once: waits for the interval (the fake clock has not moved)
    trimmer.freed(500)  # one trim scheduled, not two
    started = loop.time()
    await asyncio.wait_for(done.wait(), 5)
    assert loop.time() - started >= 0.15 and len(ran) == 2 and trimmer.trims == 2


def test_no_trim_without_glibc_or_a_loop() -> None:
    Trimmer(None).freed(1 << 40)  # nothing happens
    Trimmer(lambda: None, after=1).freed(10)  # no running loop: nothing happens


def test_glibc_malloc_trim_is_found_here() -> None:
    trim = _malloc_trim()
    assert trim is not None  # the test machines run glibc
    trim()
