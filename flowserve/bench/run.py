"""A whole benchmark: find what the model takes, build the samples and the client once, then
measure each level in turn. :func:`bench` is what the CLI and ``flowserve analyze`` call."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from flowserve.bench import grpc_client, http
from flowserve.bench.inputs import Sample, from_file, generated
from flowserve.bench.load import Client, Level, Progress, run_level
from flowserve.bench.model import ModelInfo
from flowserve.bench.stats import LevelResult, Measured, Recorder, summarize

T = TypeVar("T")

PROTOCOLS = ("http", "grpc", "inprocess")


@dataclass(frozen=True, slots=True)
class BenchOptions:
    model: str
    protocol: str = "http"  # http | grpc | inprocess
    url: str = ""  # host:port; default 127.0.0.1:8000 (HTTP) or :8001 (gRPC)
    version: str = ""
    levels: tuple[Level, ...] = (Level(concurrency=1),)
    duration_s: float = 5.0
    warmup_s: float = 1.0
    batch_size: int = 1
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    data: Path | None = None
    zero: bool = False
    repositories: tuple[Path, ...] = ()  # in-process: what the engine serves
    graphs: tuple[Path, ...] = ()
    processes: int = 1  # client processes the load is spread over (HTTP and gRPC)

    @property
    def address(self) -> str:
        if self.url:
            return self.url.removeprefix("http://").removeprefix("grpc://").rstrip("/")
        return "127.0.0.1:8001" if self.protocol == "grpc" else "127.0.0.1:8000"


def samples_for(model: ModelInfo, options: BenchOptions) -> list[Sample]:
    if options.data is not None:
        return from_file(model, options.data, options.batch_size)
    return generated(model, options.shapes, options.batch_size, options.zero)


def _describe(options: BenchOptions) -> ModelInfo:
    fetch = grpc_client.fetch_model if options.protocol == "grpc" else http.fetch_model
    return fetch(options.address, options.model, options.version)


def _check(model: ModelInfo) -> None:
    if model.decoupled:
        raise http.RequestFailed(
            f"model '{model.name}' is decoupled (streams its responses): bench sends plain infer requests"
        )


async def measure_levels(
    options: BenchOptions,
    progress: Progress | None = None,
    before_level: Callable[[int], None] | None = None,
) -> list[Measured]:
    """Every level of ``options`` in this process, against a running server (or, ``inprocess``,
    an engine started here and stopped at the end). ``before_level(i)`` runs (in a thread) before
    level ``i`` starts: the processes of one benchmark meet there."""
    engine = None
    if options.protocol == "inprocess":
        from flowserve.bench import local

        engine = await local.start_engine(options.repositories, options.graphs)
    try:
        if engine is not None:
            from flowserve.bench import local

            model = local.describe(engine, options.model, options.version)
        else:
            model = await asyncio.to_thread(_describe, options)
        _check(model)
        samples = samples_for(model, options)
        client: Client
        if engine is not None:
            client = local.LocalClient(engine, model, samples, options.version)
        elif options.protocol == "grpc":
            client = grpc_client.GrpcClient(options.address, model, samples, options.version)
        else:
            client = http.HttpClient(options.address, model, samples, options.version)
        results = []
        try:
            for i, level in enumerate(options.levels):
                if before_level is not None:
                    await asyncio.to_thread(before_level, i)
                if level.concurrency == 0 and level.rate == 0:  # this process's share of the level is nothing
                    results.append(Measured(Recorder(), 0.0, 0.0))
                    continue
                results.append(
                    await run_level(
                        client,
                        level,
                        samples=len(samples),
                        warmup_s=options.warmup_s,
                        duration_s=options.duration_s,
                        progress=progress,
                    )
                )
        finally:
            await client.close()
        return results
    finally:
        if engine is not None:
            await engine.stop()


def _summaries(options: BenchOptions, parts: list[list[Measured]]) -> list[LevelResult]:
    return [
        summarize(
            [p[i] for p in parts],
            protocol=options.protocol,
            concurrency=level.concurrency,
            rate=level.rate,
            batch_size=options.batch_size,
        )
        for i, level in enumerate(options.levels)
    ]


async def bench_async(options: BenchOptions, progress: Progress | None = None) -> list[LevelResult]:
    """Every level of ``options`` in this process (``processes`` is not looked at)."""
    return _summaries(options, [await measure_levels(options, progress)])


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """``coro`` in an event loop of its own (uvloop where it is installed)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def bench(options: BenchOptions, progress: Progress | None = None) -> list[LevelResult]:
    """Every level of ``options``; with ``processes`` > 1 the load is spread over that many
    client processes (each level's concurrency or rate divided between them), which meet
    before each level, and their measurements are pooled."""
    if options.processes <= 1 or options.protocol == "inprocess":
        return _summaries(options, [_run(measure_levels(options, progress))])
    from flowserve.bench.spread import measure_spread

    return _summaries(options, measure_spread(options, progress))


def levels(
    concurrency: Sequence[int] = (), rates: Sequence[float] = (), poisson: bool = False
) -> tuple[Level, ...]:
    out = [Level(concurrency=c) for c in concurrency]
    out += [Level(rate=r, poisson=poisson) for r in rates]
    return tuple(out) or (Level(concurrency=1),)


__all__ = ["PROTOCOLS", "BenchOptions", "bench", "bench_async", "levels", "measure_levels", "samples_for"]
