"""Where a node's work runs: a pool of instances, each with its own worker thread.

This is the one seam for placement. The executor and batcher only ``await pool.run(...)``;
an instance today is a thread (one per instance, so thread-affine frameworks and CUDA
streams stay put), and could be a process or a remote actor without anything above changing.
A call waits for a free instance, so an instance runs one batch at a time, as in Triton.

Handing a call to a thread and back costs 100 to 200 us on a small machine, several times
the work of a cheap Python node or model. A pool created with ``inline=True`` therefore runs a
call directly on the event loop while its measured execution time stays under a threshold
(default 100 us; ``configure_inline``), and on the worker thread otherwise: see
:class:`InlinePolicy`. Measured with the bundled "simple" model in-process: 5.3k -> 44k
infer/s (benchmarks/README.md). Backends whose frameworks are thread-affine keep inline off.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_inline_threshold_ns = 100_000


def configure_inline(threshold_us: float) -> None:
    """Set the inline threshold for pools created afterwards (0 turns inline execution off)."""
    global _inline_threshold_ns
    _inline_threshold_ns = int(threshold_us * 1000)


class InlinePolicy:
    """Whether the next call may run on the event loop, from the durations seen so far.

    Pure bookkeeping, no clock of its own: ``observe(ns)`` after each call, ``inline()`` before.
    The first ``probe`` calls run on the thread to measure; after that a call runs inline while
    the moving average (weight 1/10 for the newest call) stays under the threshold. A slow call
    lifts the average in proportion to how slow it was, so a node that turns slow goes back to
    its thread after one slow call, for as long as the average needs to decay (a 50 ms call
    over a 20 us habit: about 40 calls), while a brief preemption costs only a few calls.
    """

    __slots__ = ("_avg", "_seen", "probe", "threshold_ns")

    def __init__(self, threshold_ns: int, probe: int = 8) -> None:
        self.threshold_ns = threshold_ns
        self.probe = probe
        self._avg = 0.0
        self._seen = 0

    def inline(self) -> bool:
        return self.threshold_ns > 0 and self._seen >= self.probe and self._avg < self.threshold_ns

    def observe(self, ns: int) -> None:
        self._seen += 1
        self._avg = ns if self._seen == 1 else 0.9 * self._avg + 0.1 * ns


class Worker:
    """One dedicated thread."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def call(self, fn: Callable[..., R], *args: object) -> R:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class InstancePool(Generic[T]):
    """N instances (each paired with a worker thread); a call takes a free one."""

    def __init__(self, name: str, inline: bool = False) -> None:
        self.name = name
        self.policy = InlinePolicy(_inline_threshold_ns if inline else 0)
        self._free: list[tuple[T, Worker]] = []
        self._all: list[tuple[T, Worker]] = []
        self._sem: asyncio.Semaphore | None = None

    async def add(self, factory: Callable[[int], T]) -> T:
        """Create one instance by calling ``factory(index)`` on the instance's own thread."""
        index = len(self._all)
        worker = Worker(f"{self.name}-{index}")
        try:
            instance = await worker.call(factory, index)
        except BaseException:
            worker.shutdown()
            raise
        self._all.append((instance, worker))
        self._free.append((instance, worker))
        self._sem = asyncio.Semaphore(len(self._free))
        return instance

    @property
    def instances(self) -> list[T]:
        return [i for i, _ in self._all]

    async def run(
        self, fn: Callable[[T, R], object], arg: R, on_acquired: Callable[[], None] | None = None
    ) -> object:
        """Run ``fn(instance, arg)`` with a free instance: on the loop when the inline policy
        allows, else on the instance's thread."""
        sem = self._sem
        if sem is None:
            raise RuntimeError(f"{self.name}: no instance loaded")
        policy = self.policy
        async with sem:
            pair = self._free.pop()
            if on_acquired is not None:
                on_acquired()
            try:
                if policy.inline():
                    start = time.perf_counter_ns()
                    try:
                        return fn(pair[0], arg)
                    finally:
                        policy.observe(time.perf_counter_ns() - start)
                return await pair[1].call(_timed, policy, fn, pair[0], arg)
            finally:
                self._free.append(pair)

    async def run_async(self, fn: Callable[[T, R], Awaitable[object]], arg: R) -> object:
        """Await ``fn(instance, arg)`` on the event loop with a free instance (async user code)."""
        sem = self._sem
        if sem is None:
            raise RuntimeError(f"{self.name}: no instance loaded")
        async with sem:
            pair = self._free.pop()
            try:
                return await fn(pair[0], arg)
            finally:
                self._free.append(pair)

    async def run_on(self, index: int, fn: Callable[[T, R], object], arg: R) -> object:
        """Run ``fn(instance, arg)`` on instance ``index``'s thread (a sequence stays on one
        instance). The caller keeps calls to one instance one at a time."""
        instance, worker = self._all[index]
        return await worker.call(fn, instance, arg)

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[tuple[T, Worker]]:
        """Hold a free instance (and its worker thread) for a whole streamed request."""
        sem = self._sem
        if sem is None:
            raise RuntimeError(f"{self.name}: no instance loaded")
        async with sem:
            pair = self._free.pop()
            try:
                yield pair
            finally:
                self._free.append(pair)

    async def close(self, finalize: Callable[[T], None] | None = None) -> None:
        for instance, worker in self._all:
            if finalize is not None:
                # a failing finalize must not stop the others from closing
                with contextlib.suppress(Exception):
                    await worker.call(finalize, instance)
            worker.shutdown()
        self._all.clear()
        self._free.clear()
        self._sem = None


def _timed(policy: InlinePolicy, fn: Callable[[T, R], object], instance: T, arg: R) -> object:
    start = time.perf_counter_ns()
    try:
        return fn(instance, arg)
    finally:
        policy.observe(time.perf_counter_ns() - start)
