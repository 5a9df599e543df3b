"""One benchmark over several client processes: a loaded machine wakes one process late, and a
single Python process is one core at most, so ``--processes N`` splits each level's
concurrency (or rate) between N processes that start every level together (a barrier) and
whose recordings are pooled by the parent."""

from __future__ import annotations

import dataclasses
import multiprocessing
import queue
from typing import Any

from flowserve.bench.load import Level, Progress
from flowserve.bench.run import BenchOptions, _run, measure_levels
from flowserve.bench.stats import Measured

START_TIMEOUT_S = 120.0


def share(level: Level, index: int, processes: int) -> Level:
    """Process ``index``'s part of ``level``: concurrency divided as evenly as it goes (a
    process may get none), a rate divided exactly."""
    if level.concurrency:
        count = level.concurrency // processes + (1 if index < level.concurrency % processes else 0)
        return dataclasses.replace(level, concurrency=count)
    return dataclasses.replace(level, rate=level.rate / processes)


def _child(options: BenchOptions, index: int, barrier: Any, out: Any, show: bool) -> None:
    import sys
    import threading

    from flowserve.bench.http import RequestFailed
    from flowserve.bench.progress import progress_bar

    progress = progress_bar(sys.stderr) if show else None
    mine = dataclasses.replace(
        options, processes=1, levels=tuple(share(lv, index, options.processes) for lv in options.levels)
    )
    try:
        measured = _run(measure_levels(mine, progress, lambda _: barrier.wait(START_TIMEOUT_S)))
    except threading.BrokenBarrierError:
        out.put((index, None, None))  # another process failed and says why
        return
    except Exception as exc:
        barrier.abort()
        out.put((index, None, str(exc) if isinstance(exc, RequestFailed) else f"{type(exc).__name__}: {exc}"))
        return
    out.put((index, measured, None))


def measure_spread(options: BenchOptions, progress: Progress | None = None) -> list[list[Measured]]:
    """Each process's measurements of every level; raises the first process's error."""
    from flowserve.bench.http import RequestFailed

    context = multiprocessing.get_context("spawn")  # grpc and uvloop do not survive a fork
    barrier = context.Barrier(options.processes)
    out = context.Queue()
    show = progress is not None  # a function does not travel to a spawned process: the first draws one
    children = [
        context.Process(target=_child, args=(options, i, barrier, out, show and i == 0), daemon=True)
        for i in range(options.processes)
    ]
    for child in children:
        child.start()
    results: dict[int, list[Measured]] = {}
    error = None
    budget = START_TIMEOUT_S + len(options.levels) * (options.warmup_s + options.duration_s + 60.0)
    try:
        for _ in children:
            index, measured, problem = out.get(timeout=budget)
            if measured is not None:
                results[index] = measured
            else:
                error = error or problem
    except queue.Empty:
        error = error or "a client process gave no result in time"
    finally:
        for child in children:
            child.join(5.0)
            if child.is_alive():
                child.terminate()
    if error is not None or len(results) < len(children):
        raise RequestFailed(error or "a client process failed")
    return [results[i] for i in range(options.processes)]


__all__ = ["measure_spread", "share"]
