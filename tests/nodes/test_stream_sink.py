"""A streamed request's sink (nodes/batching/runners.py): responses cross from the model's
threads to the caller; once the caller has left, nothing more is held for it."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from flowserve.nodes.batching.runners import StreamSink


async def test_responses_cross_threads_in_order_until_final() -> None:
    sink = StreamSink(asyncio.get_running_loop())

    def model() -> None:
        for i in range(3):
            sink.put({"i": np.array([i])}, final=i == 2)

    threading.Thread(target=model).start()
    got = [int(out["i"][0]) async for out in sink.responses()]
    assert got == [0, 1, 2]


async def test_after_the_caller_left_what_the_model_sends_is_dropped_and_it_is_told() -> None:
    sink = StreamSink(asyncio.get_running_loop())
    told = threading.Event()
    sink.cancel = told.set
    sink.put({"i": np.array([0])}, final=False)
    await asyncio.sleep(0)  # delivered on the loop
    assert sink.queued == 1
    sink.leave()
    assert told.is_set() and sink.queued == 0

    def model() -> None:  # a model that goes on sending without looking at is_cancelled()
        for i in range(1000):
            sink.put({"i": np.full(1024, i)}, final=False)
        sink.fail(RuntimeError("late"))

    thread = threading.Thread(target=model)
    thread.start()
    await asyncio.to_thread(thread.join)
    await asyncio.sleep(0)
    assert sink.queued == 0  # nothing held for a reader that is gone
