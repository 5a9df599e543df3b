"""A sync generator node's items cross from its thread to the loop (nodes/python.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from flowserve.nodes.instances import Worker
from flowserve.nodes.python import _drain_on_thread


async def test_a_consumer_that_stops_early_releases_a_producer_blocked_on_the_full_queue() -> None:
    worker = Worker("drain")
    made: list[int] = []
    closed = threading.Event()
    behind = threading.Event()

    def items() -> Iterator[int]:
        try:
            for i in range(1000):
                made.append(i)
                if i == 5:
                    behind.set()
                yield i
        finally:
            closed.set()

    try:
        stream = _drain_on_thread(worker, items)
        assert await anext(stream) == 0
        # the queue (4) fills up and the producer waits to hand over more
        assert await asyncio.to_thread(behind.wait, 5)
        await asyncio.wait_for(stream.aclose(), 5)
        assert closed.is_set()  # the generator was left and closed on its thread
        assert len(made) < 20  # and stopped soon after the consumer did
    finally:
        worker.shutdown()


async def test_a_producer_held_up_when_the_consumer_stops_ends_without_hanging_the_close() -> None:
    worker = Worker("drain")
    go = threading.Event()

    def items() -> Iterator[int]:
        yield 1
        go.wait(5)
        yield from range(10)  # more than the queue holds: it stops at the first after the close
        raise RuntimeError("late")

    try:
        stream = _drain_on_thread(worker, items)
        assert await anext(stream) == 1
        closing = asyncio.ensure_future(stream.aclose())
        await asyncio.sleep(0)
        go.set()
        await asyncio.wait_for(closing, 5)
    finally:
        worker.shutdown()


async def test_the_producers_error_reaches_the_consumer() -> None:
    worker = Worker("drain")

    def items() -> Iterator[int]:
        yield 1
        raise ValueError("boom")

    try:
        stream = _drain_on_thread(worker, items)
        assert await anext(stream) == 1
        with pytest.raises(ValueError, match="boom"):
            await anext(stream)
    finally:
        worker.shutdown()
