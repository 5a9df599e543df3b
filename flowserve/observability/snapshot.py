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


def bytes_copied(servable: Servable, node: PlanNode, stats: NodeStats) -> int:
    """Bytes a node copied to hand tensors on (device <-> host, batch merges): what the
    executor converted for it plus, for a repository model's node, what its backend copied."""
    ex = node_exec(servable, node, stats)
    return stats.bytes_copied + (ex.bytes_copied if ex is not stats else 0)


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
    called = None
    if kind_of(node.spec).step:
        called = lookup(node.spec.target, node.spec.version)
        target = model_summary(called) if called is not None else None
    # a step that calls a model queues and computes in that model: its figures are the node's
    # (the node keeps none of its own unless it batches itself)
    timed = called.stats if called is not None and not ex.compute_infer.count else ex
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
        "queue_us": avg_us(timed.queue),
        "compute_us": avg_compute_us(timed),
        "inference_count": ex.inference_count,
        "execution_count": ex.execution_count,
        "batches": batch_counts(ex),
        "bytes_copied": bytes_copied(servable, node, stats),
        "last_error": stats.last_error,
        "target": target,
    }


# averages in the summaries, and the count each is an average over (merging weighs by it)
_AVERAGES = {
    "avg_request_us": "success",
    "avg_queue_us": "success",
    "avg_compute_us": "execution_count",
    "avg_us": "calls",
    "queue_us": "calls",
    "compute_us": "calls",
}


def merge_summary(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Several workers' summaries of one model or node as one: counts and durations summed,
    averages weighted by what they average over, the latest time the latest, dicts of counts
    summed key by key, the rest (names, kinds, the last error) the first worker's."""
    out = dict(parts[0])
    for key, value in parts[0].items():
        values = [p.get(key) for p in parts]
        if key in _AVERAGES:
            weights = [p.get(_AVERAGES[key]) or 0 for p in parts]
            total = sum(weights)
            out[key] = sum(v * w for v, w in zip(values, weights, strict=True) if v) / total if total else 0.0
        elif key.startswith("last_") and isinstance(value, int | float):
            out[key] = max(v for v in values if v is not None)
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int | float):
            out[key] = sum(v for v in values if isinstance(v, int | float))
        elif isinstance(value, dict) and all(isinstance(v, int | float) for v in value.values()):
            merged: dict[str, Any] = {}
            for v in values:
                for k, n in (v or {}).items():
                    merged[k] = merged.get(k, 0) + n
            out[key] = merged
        elif key == "target":
            targets = [v for v in values if v]
            out[key] = merge_summary(targets) if targets else None
        elif key == "last_error":
            out[key] = next((v for v in values if v), value)
    return out


def merge_summaries(name: str, version: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The whole server's statistics page of one model or graph from every worker's (a worker
    that runs no part of it, or forwards it to another, says ``model: None``)."""
    counted = [p for p in parts if p.get("model") is not None]
    if not counted:
        return {"name": name, "version": version, "model": None, "nodes": []}
    nodes = [merge_summary([p["nodes"][i] for p in counted]) for i in range(len(counted[0]["nodes"]))]
    return {
        "name": counted[0]["name"],
        "version": counted[0]["version"],
        "model": merge_summary([p["model"] for p in counted]),
        "nodes": nodes,
    }


__all__ = [
    "avg_compute_us",
    "avg_us",
    "batch_counts",
    "bytes_copied",
    "compute_ns",
    "merge_summaries",
    "merge_summary",
    "model_summary",
    "node_exec",
    "node_summary",
]
