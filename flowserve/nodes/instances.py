"""Where a node's work runs: a pool of instances, each with its own worker thread.

This is the one seam for placement. The executor and batcher only ``await pool.run(...)``;
an instance today is a thread (one per instance, so thread-affine frameworks and CUDA
streams stay put), and could be a process or a remote actor without anything above changing.
A call waits for a free instance, so an instance runs one batch at a time, as in Triton.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


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

    def __init__(self, name: str) -> None:
        self.name = name
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
        """Run ``fn(instance, arg)`` on a free instance's thread."""
        sem = self._sem
        if sem is None:
            raise RuntimeError(f"{self.name}: no instance loaded")
        async with sem:
            pair = self._free.pop()
            if on_acquired is not None:
                on_acquired()
            try:
                return await pair[1].call(fn, pair[0], arg)
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
