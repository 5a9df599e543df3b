"""A candidate measured for real: applied to the analysis's server, then loaded by
``flowserve bench`` at rising concurrency (the ladder stops once p99 passes the target or the
throughput stops rising), with the server's per-node statistics read around each level."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flowserve.analyze.search import Goal, MeasureError, NodeStat, Point
from flowserve.analyze.server import AnalysisServer
from flowserve.analyze.space import Candidate
from flowserve.bench.http import RequestFailed
from flowserve.bench.inputs import InputError
from flowserve.bench.run import BenchOptions, bench, levels

SATURATED = 1.03  # a level must beat the one before by this factor for the ladder to go on


@dataclass(frozen=True, slots=True)
class LoadPlan:
    protocol: str = "grpc"
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    seconds: float = 2.0
    warmup_s: float = 0.5
    processes: int = 1
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    repeats: int = 1  # windows per level; the level reads their medians (steadier on a busy machine)


def node_stats(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> tuple[NodeStat, ...]:
    """What the nodes did between two snapshots: averages per call over the calls in between
    (a node without a batcher has no queue and compute figures: its whole time in the node
    counts as computing)."""
    earlier = {n["name"]: n for n in before}
    out = []
    for node in after:
        old = earlier.get(node["name"], {})
        calls = int(node.get("calls", 0)) - int(old.get("calls", 0))
        if calls <= 0:
            continue

        def spent(
            key: str, node: dict[str, Any] = node, old: dict[str, Any] = old, calls: int = calls
        ) -> float:
            total = float(node.get(key, 0.0)) * int(node.get("calls", 0))
            total -= float(old.get(key, 0.0)) * int(old.get("calls", 0))
            return max(0.0, total / calls)

        rows = int(node.get("inference_count", 0)) - int(old.get("inference_count", 0))
        runs = int(node.get("execution_count", 0)) - int(old.get("execution_count", 0))
        name = str(node["name"])
        queue, compute = spent("queue_us"), spent("compute_us")
        if queue == 0 and compute == 0:  # a node with no batcher counts only its time inside
            compute = spent("avg_us")
        out.append(NodeStat(name, queue, compute, calls, rows / runs if runs > 0 else 1.0))
    return tuple(out)


def measurer(
    server: AnalysisServer, goal: Goal, plan: LoadPlan, log: Callable[[str], None] = lambda _: None
) -> Callable[[Candidate], list[Point]]:
    """The search's ``measure``: apply, then the ladder."""

    def measure(candidate: Candidate) -> list[Point]:
        server.apply(candidate)
        points: list[Point] = []
        for concurrency in plan.concurrency:
            options = BenchOptions(
                model=server.target.name,
                protocol=plan.protocol,
                url=server.url(plan.protocol),
                levels=levels([concurrency]),
                duration_s=plan.seconds,
                warmup_s=plan.warmup_s,
                processes=plan.processes,
                shapes=dict(plan.shapes),
            )
            before = server.stats()
            try:
                results = [bench(options)[0] for _ in range(max(1, plan.repeats))]
            except (RequestFailed, InputError) as exc:
                raise MeasureError(str(exc)) from None
            result = results[0]
            point = Point(
                concurrency,
                statistics.median(r.throughput for r in results),
                statistics.median(r.p50_ms for r in results),
                statistics.median(r.p99_ms for r in results),
                sum(r.errors + (0 if r.requests else 1) for r in results),
                node_stats(before, server.stats()),
            )
            points.append(point)
            log(f"    c={concurrency}: {point.throughput:.0f} infer/s, p99 {point.p99_ms:.2f} ms")
            if point.errors:
                first = next(iter(result.error_messages), "no request succeeded")
                raise MeasureError(f"c={concurrency}: {result.errors} error(s): {first}")
            if point.p99_ms > goal.p99_ms:
                break
            if len(points) > 1 and point.throughput < points[-2].throughput * SATURATED:
                break
        return points

    return measure


__all__ = ["LoadPlan", "measurer", "node_stats"]
