"""A loaded (name, version): its plan, its executor, its statistics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass, field

from flowserve.core.clock import MONOTONIC, Clock
from flowserve.core.device import host_map
from flowserve.core.node import Context, TensorMap
from flowserve.graph.plan import Plan
from flowserve.runtime.cache import ResponseCache, cache_key
from flowserve.runtime.executor import Executor
from flowserve.runtime.stats import ModelStats
from flowserve.runtime.validate import InputValidator
from flowserve.spec.model_config import ModelConfig
from flowserve.spec.schema import GraphSpec, ModelSpec


@dataclass(eq=False)
class Servable:
    """What a request addresses. ``kind`` is "model" (a repository model with a backend),
    "ensemble" (a Triton ensemble) or "graph" (a YAML graph)."""

    name: str
    version: int
    kind: str
    plan: Plan
    executor: Executor
    spec: ModelSpec | GraphSpec
    config: ModelConfig
    clock: Clock = MONOTONIC
    stats: ModelStats = field(default_factory=ModelStats)
    decoupled: bool = False
    cache: ResponseCache | None = None
    # another worker process runs it (--workers N, nodes/forward.py): its requests count there
    forwarded: bool = False
    # compiled once: the request check, and the names of the outputs a request may ask for
    validate: InputValidator = field(init=False, repr=False)
    output_names: frozenset[str] = field(init=False, repr=False)
    # set when the last in-flight request ends, once someone waits for that (see drained)
    _idle: asyncio.Event | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.validate = InputValidator(self.plan)
        self.output_names = frozenset(o.name for o in self.plan.outputs)

    @property
    def platform(self) -> str:
        return str(self.config.platform or self.config.backend)

    async def infer(
        self, inputs: TensorMap, ctx: Context, host: bool = True, keep: Collection[str] = ()
    ) -> TensorMap:
        """Validate the request, run it, and count it. The outputs are numpy (``host``, for a
        front end, but those named in ``keep``, which go to CUDA shared memory as they are) or
        the tensors as the graph made them (torch, OrtValue, on a GPU or not: for a graph step
        that hands them on; see flowserve/core/device.py)."""
        clock = self.clock
        start = clock.now_ns()
        stats = self.stats
        rows = self._validate(inputs, start)
        cache = self.cache
        key = b""
        looked = start
        if cache is not None:
            host, keep = True, ()  # a cached answer is numpy; so is what its key is made of
            inputs = host_map(inputs)[0]
            key = cache_key(self.name, self.version, inputs)
            hit = cache.get(key)
            looked = clock.now_ns()
            if hit is not None:
                stats.cache_hit.add(looked - start)
                stats.record_request(True, looked - start)
                return hit
        stats.pending += 1
        try:
            outputs = await self.executor.run(inputs, ctx, host, keep)
        except BaseException as exc:
            stats.record_request(False, clock.now_ns() - start, exc)
            raise
        finally:
            self._left()
        if cache is not None:
            before = clock.now_ns()
            cache.put(key, outputs)
            stats.cache_miss.add(clock.now_ns() - before + looked - start)
        self._succeeded(rows, start)
        return outputs

    async def stream(self, inputs: TensorMap, ctx: Context) -> AsyncIterator[TensorMap]:
        """Every response for one request: one for an ordinary graph, zero or more when a
        node is decoupled. The request counts as one success (or failure) when it ends."""
        clock = self.clock
        start = clock.now_ns()
        stats = self.stats
        rows = self._validate(inputs, start)
        stats.pending += 1
        try:
            async for outputs in self.executor.stream(inputs, ctx):
                yield outputs
        except BaseException as exc:
            stats.record_request(False, clock.now_ns() - start, exc)
            raise
        finally:
            self._left()
        self._succeeded(rows, start)

    def _validate(self, inputs: TensorMap, start: int) -> int:
        """The request's batch size; a bad request is counted as failed and raised."""
        try:
            return self.validate(inputs)
        except Exception as exc:
            self.stats.record_request(False, self.clock.now_ns() - start, exc)
            raise

    def _succeeded(self, rows: int, start: int) -> None:
        elapsed = self.clock.now_ns() - start
        if self.kind != "model":
            # a graph has no backend of its own to count executions; each request is one
            # (and one queue entry: perf_analyzer finds the version whose queue count grew)
            self.stats.record_execution(rows, 0, elapsed, 0)
            self.stats.queue.add(0)
        self.stats.record_request(True, elapsed)

    def _left(self) -> None:
        """A request is no longer in flight (``drained`` may be waiting for the last one)."""
        stats = self.stats
        stats.pending -= 1
        if self._idle is not None and not stats.pending:
            self._idle.set()

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no request is in flight (signalled where the count drops, no polling),
        at most ``timeout_s``; whether it drained."""
        if not self.stats.pending:
            return True
        if self._idle is None:
            self._idle = asyncio.Event()
        idle = self._idle
        try:
            async with asyncio.timeout(timeout_s):
                while self.stats.pending:
                    idle.clear()
                    await idle.wait()
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        for node in self.executor.nodes:
            await node.stop()
