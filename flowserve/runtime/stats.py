"""Cumulative statistics, exact and cheap to update, pulled by readers at report time.

Model statistics mirror Triton's statistics extension (counts and nanoseconds per phase);
node statistics add what a graph needs to be seen: calls, errors, skips, queue and compute time,
batch sizes.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from flowserve.core.clock import wall_ms
from flowserve.core.errors import ErrorCode, FlowserveError, NodeError

# Triton's failure reasons (the ``reason`` label of nv_inference_request_failure)
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")

# guards ``bytes_copied``, which instance threads (a backend's execute) and the event loop (the
# executor's conversions) both add to; taken only when something was copied, so the numpy path
# that copies nothing never touches it
_COPIED = threading.Lock()


def failure_reason(exc: BaseException | None) -> str:
    """Triton's reason for a failed request: REJECTED (queue full, timed out), CANCELED,
    BACKEND (a node failed while running) or OTHER (e.g. the request was invalid)."""
    if isinstance(exc, asyncio.CancelledError):
        return "CANCELED"
    code = exc.code if isinstance(exc, FlowserveError) else None  # a NodeError has its cause's code
    if code is ErrorCode.CANCELLED:
        return "CANCELED"
    if code is ErrorCode.UNAVAILABLE:
        return "REJECTED"
    return "BACKEND" if isinstance(exc, NodeError) else "OTHER"


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class BatchStat:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class ExecStats:
    """What executing batches costs: shared by model stats and node stats."""

    inference_count: int = 0
    execution_count: int = 0
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    batches: dict[int, BatchStat] = field(default_factory=dict)
    # bytes copied between host and device memory, or to merge a batch: where a tensor could
    # not be handed on as it was (see flowserve/core/device.py)
    bytes_copied: int = 0

    def add_copied(self, nbytes: int) -> None:
        """Count ``nbytes`` more bytes copied; safe from any thread. Callers call it only when
        they copied something (``if copied: stats.add_copied(copied)``): a ``+=`` on the
        attribute from an instance thread could lose an update made on the loop meanwhile."""
        with _COPIED:
            self.bytes_copied += nbytes

    def record_execution(
        self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int, requests: int = 1
    ) -> None:
        """One execution of ``batch_size`` rows (or requests) with its phase durations.

        ``requests``: how many requests the execution served (a dynamic batch merges several).
        As in Triton, the compute durations count once per request (each request spent the
        batch's time) while ``batches`` counts once per execution."""
        self.inference_count += batch_size
        self.execution_count += 1
        self.compute_input.add(input_ns * requests, requests)
        self.compute_infer.add(infer_ns * requests, requests)
        self.compute_output.add(output_ns * requests, requests)
        stat = self.batches.get(batch_size)
        if stat is None:
            stat = self.batches[batch_size] = BatchStat()
        stat.compute_input.add(input_ns)
        stat.compute_infer.add(infer_ns)
        stat.compute_output.add(output_ns)


@dataclass(slots=True)
class ModelStats(ExecStats):
    """Per (model, version): Triton's statistics extension."""

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    last_inference_ms: int = 0
    pending: int = 0
    # failed requests by Triton's failure reason (REJECTED, CANCELED, BACKEND, OTHER)
    fail_reasons: dict[str, int] = field(default_factory=dict)

    def record_request(self, ok: bool, ns: int, error: BaseException | None = None) -> None:
        """Count one request; a failure is also counted under Triton's reason for ``error``."""
        (self.success if ok else self.fail).add(ns)
        if not ok:
            reason = failure_reason(error)
            self.fail_reasons[reason] = self.fail_reasons.get(reason, 0) + 1
        self.last_inference_ms = wall_ms()


@dataclass(slots=True)
class NodeStats(ExecStats):
    """Per node of a graph."""

    calls: int = 0
    errors: int = 0
    skipped: int = 0
    in_flight: int = 0
    queue: Duration = field(default_factory=Duration)
    total: Duration = field(default_factory=Duration)
    last_error: str = ""
    cache_hits: int = 0
    cache_misses: int = 0
