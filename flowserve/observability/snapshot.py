"""Plain-dict snapshots of the statistics, shared by the metrics exporter and the web page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flowserve.graph.plan import PlanNode
from flowserve.runtime.servable import Servable
from flowserve.runtime.stats import Duration, ModelStats, NodeStats
from flowserve.spec.kinds import kind_of


def node_exec(servable: Servable, node: PlanNode, stats: NodeStats) -> ModelStats | NodeStats:
    """Where a node's queue, compute and batch figures live: the node's own statistics, except
    for the one node of a repository model, which *is* the model (its backend counts into the
    model statistics)."""
    return servable.stats if node.spec.kind == "backend" else stats


def avg_us(d: Duration) -> float:
    return d.ns / d.count / 1000 if d.count else 0.0


def batch_counts(stats: ModelStats | NodeStats) -> dict[str, int]:
    """Executions by batch size, ``{"4": 12}``."""
    return {str(size): b.compute_infer.count for size, b in sorted(stats.batches.items())}


def compute_ns(stats: ModelStats | NodeStats) -> int:
    return stats.compute_input.ns + stats.compute_infer.ns + stats.compute_output.ns


def avg_compute_us(stats: ModelStats | NodeStats) -> float:
    """Average compute time (input + infer + output) per request that was computed."""
    count = stats.compute_infer.count
    return compute_ns(stats) / count / 1000 if count else 0.0


def model_summary(servable: Servable) -> dict[str, Any]:
    s = servable.stats
    return {
        "name": servable.name,
        "version": str(servable.version),
        "kind": servable.kind,
        "success": s.success.count,
        "fail": s.fail.count,
        "fail_reasons": dict(s.fail_reasons),
        "pending": s.pending,
        "inference_count": s.inference_count,
        "execution_count": s.execution_count,
        "avg_request_us": avg_us(s.success),
        "avg_queue_us": avg_us(s.queue),
        "avg_compute_us": avg_compute_us(s),
        "batches": batch_counts(s),
        "last_inference_ms": s.last_inference_ms,
    }


def node_summary(
    lookup: Callable[[str, str], Servable | None],
    servable: Servable,
    node: PlanNode,
    stats: NodeStats,
    element_id: str = "",
) -> dict[str, Any]:
    """One node's counters; ``lookup(name, version)`` finds the servable a step node calls."""
    ex = node_exec(servable, node, stats)
    target = None
    if kind_of(node.spec).step:
        called = lookup(node.spec.target, node.spec.version)
        target = model_summary(called) if called is not None else None
    return {
        "name": node.name,
        "kind": node.spec.kind,
        "element_id": element_id,
        "calls": stats.calls,
        "errors": stats.errors,
        "skipped": stats.skipped,
        "in_flight": stats.in_flight,
        "duration_us": stats.total.ns / 1000,
        "avg_us": avg_us(stats.total),
        "queue_us": avg_us(ex.queue),
        "compute_us": avg_compute_us(ex),
        "inference_count": ex.inference_count,
        "execution_count": ex.execution_count,
        "batches": batch_counts(ex),
        "last_error": stats.last_error,
        "target": target,
    }


__all__ = [
    "avg_compute_us",
    "avg_us",
    "batch_counts",
    "compute_ns",
    "model_summary",
    "node_exec",
    "node_summary",
]
