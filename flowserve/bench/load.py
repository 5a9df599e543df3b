"""The load itself: a closed loop (N requests always outstanding, each session sending its next
request when its previous one is answered) or an open loop (requests started at a given rate
whatever the server does, latency counted from when each request was due, so a server that
falls behind shows it instead of slowing the load down).

A level runs ``warmup_s`` unrecorded, then ``duration_s`` recorded: only requests that started
and finished inside that window count."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from flowserve.bench.http import RequestFailed
from flowserve.bench.stats import Measured, Recorder

MAX_OPEN_SESSIONS = 1024  # an open loop that outruns the server opens at most this many connections
DRAIN_S = 30.0  # how long the requests still in flight at the end of a level may take


class Session(Protocol):
    async def send(self, index: int) -> None: ...

    def close(self) -> None: ...


class Client(Protocol):
    async def session(self) -> Session: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Level:
    concurrency: int = 0  # > 0: closed loop
    rate: float = 0.0  # > 0: open loop, requests per second
    poisson: bool = False  # open loop: exponential gaps instead of even ones


@dataclass(slots=True)
class _State:
    running: bool = True


Progress = Callable[[Level, float, float, Recorder], None]  # level, elapsed s, total s, recorder


async def _closed_worker(client: Client, recorder: Recorder, state: _State, samples: int, first: int) -> None:
    clock = time.perf_counter_ns
    session = await client.session()
    index = first
    while state.running:
        start = clock()
        try:
            await session.send(index % samples)
        except RequestFailed as exc:
            recorder.failed(start, clock(), str(exc))
            if "connection lost" in str(exc):
                session.close()
                session = await client.session()
        else:
            recorder.ok(start, clock())
        index += 1
    session.close()


async def _open_loop(client: Client, level: Level, recorder: Recorder, state: _State, samples: int) -> None:
    clock = time.perf_counter_ns
    idle: list[Session] = []
    opened = 0
    tasks: set[asyncio.Task[None]] = set()
    rng = random.Random(0)
    gap = 1e9 / level.rate

    async def one(due: int, index: int) -> None:
        nonlocal opened
        if idle:
            session = idle.pop()
        elif opened < MAX_OPEN_SESSIONS:
            opened += 1
            try:
                session = await client.session()
            except RequestFailed as exc:
                opened -= 1
                recorder.failed(due, clock(), str(exc))
                return
        else:
            recorder.failed(due, clock(), f"more than {MAX_OPEN_SESSIONS} requests outstanding: dropped")
            return
        try:
            await session.send(index % samples)
        except RequestFailed as exc:
            recorder.failed(due, clock(), str(exc))
            session.close()
            opened -= 1
            return
        recorder.ok(due, clock())
        idle.append(session)

    due = float(clock())
    index = 0
    while state.running:
        now = clock()
        while due <= now:
            task = asyncio.create_task(one(int(due), index))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            index += 1
            due += rng.expovariate(1.0) * gap if level.poisson else gap
        await asyncio.sleep(max(0.0, (due - clock()) / 1e9))
    if tasks:
        await asyncio.wait(tasks, timeout=DRAIN_S)
    for session in idle:
        session.close()


async def run_level(
    client: Client,
    level: Level,
    *,
    samples: int,
    warmup_s: float,
    duration_s: float,
    progress: Progress | None = None,
) -> Measured:
    """One level; what was recorded in its window (summarize it with :func:`stats.summarize`)."""
    recorder = Recorder()
    state = _State()
    if level.concurrency > 0:
        drivers = [
            asyncio.create_task(_closed_worker(client, recorder, state, samples, i))
            for i in range(level.concurrency)
        ]
    elif level.rate > 0:
        drivers = [asyncio.create_task(_open_loop(client, level, recorder, state, samples))]
    else:
        raise ValueError("a level needs a concurrency or a rate above 0")
    start = time.perf_counter()
    total = warmup_s + duration_s
    cpu0 = 0.0
    try:
        while (elapsed := time.perf_counter() - start) < total:
            if recorder.window_start < 0 and elapsed >= warmup_s:
                recorder.window_start = time.perf_counter_ns()
                cpu0 = time.process_time()
            if any(d.done() for d in drivers):
                break  # a driver failed (e.g. no connection): its exception is raised below
            if progress is not None:
                progress(level, elapsed, total, recorder)
            await asyncio.sleep(
                min(0.25, max(0.001, (warmup_s if recorder.window_start < 0 else total) - elapsed))
            )
        if recorder.window_start < 0:
            recorder.window_start = time.perf_counter_ns()
            cpu0 = time.process_time()
        recorder.window_end = time.perf_counter_ns()
        cpu = time.process_time() - cpu0
    finally:
        state.running = False
        _, pending = await asyncio.wait(drivers, timeout=DRAIN_S)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    for task in drivers:
        error = task.exception() if task.done() and not task.cancelled() else None
        if error is not None:
            raise error
    window_s = (recorder.window_end - recorder.window_start) / 1e9
    return Measured(recorder, window_s, cpu)


__all__ = ["Client", "Level", "Progress", "Session", "run_level"]
