"""Request traces as JSON: the timeline the web page draws, and Triton's trace-file shape.

A :class:`~flowserve.dataplane.plane.Trace` holds one span per node a request passed (nodes of
the graphs it called too: a ``model:`` step adds the spans of that model's own graph), each
with start and end (monotonic ns), skipped, error and batch size.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from flowserve.core.node import Span
from flowserve.dataplane.plane import DataPlane, Trace

log = logging.getLogger("flowserve")


def trace_id(trace: Trace) -> str:
    """A handle for a trace while it is kept in the plane's ring of recent traces."""
    return format(id(trace), "x")


def find_trace(traces: Iterable[Trace], tid: str) -> Trace | None:
    for trace in traces:
        if trace_id(trace) == tid:
            return trace
    return None


def trace_bounds(spans: list[Span]) -> tuple[int, int]:
    """When a trace's spans began and ended (monotonic ns; skipped spans only when all are)."""
    starts = [s.start_ns for s in spans if not s.skipped]
    ends = [max(s.end_ns, s.start_ns) for s in spans if not s.skipped]
    if not starts:
        starts = [s.start_ns for s in spans] or [0]
        ends = starts
    return min(starts), max(ends)


def span_dict(span: Span, t0: int, top: str) -> dict[str, Any]:
    end = max(span.end_ns, span.start_ns)
    out = {
        "graph": span.graph,
        "node": span.node,
        "nested": span.graph != top,
        "start_us": (span.start_ns - t0) / 1000,
        "end_us": (end - t0) / 1000,
        "duration_us": (end - span.start_ns) / 1000,
        "skipped": span.skipped,
        "error": span.error or "",
        "batch_size": span.batch_size,
        "status": "skipped" if span.skipped else ("error" if span.error else "ok"),
    }
    if span.attributes:
        out["attributes"] = dict(span.attributes)
    return out


def trace_summary(trace: Trace) -> dict[str, Any]:
    t0, t1 = trace_bounds(trace.spans)
    return {
        "id": trace_id(trace),
        "request_id": trace.request_id,
        "model": trace.model,
        "ok": trace.ok,
        "error": trace.error,
        "duration_us": (t1 - t0) / 1000,
        "spans": len(trace.spans),
        "failed_nodes": [f"{s.graph}/{s.node}" for s in trace.spans if s.error],
        "skipped_nodes": [f"{s.graph}/{s.node}" for s in trace.spans if s.skipped],
    }


def trace_dict(trace: Trace) -> dict[str, Any]:
    """One request's timeline: spans ordered by start (outer graph first on ties), times in
    microseconds from the first span's start."""
    t0, _ = trace_bounds(trace.spans)
    ordered = sorted(trace.spans, key=lambda s: (s.skipped, s.start_ns, s.graph != trace.model, -s.end_ns))
    out = trace_summary(trace)
    out["timeline"] = [span_dict(s, t0, trace.model) for s in ordered]
    return out


def triton_trace(trace: Trace, number: int) -> list[dict[str, Any]]:
    """The trace in the shape of Triton's trace file (trace_mode "triton"): a record naming the
    model, its REQUEST_START/REQUEST_END timestamps, and one child record per node (``parent_id``
    pointing at the request) with COMPUTE_START/COMPUTE_END, as Triton does for ensemble steps."""
    t0, t1 = trace_bounds(trace.spans)
    records: list[dict[str, Any]] = [
        {"id": number, "model_name": trace.model, "model_version": 1, "request_id": trace.request_id},
        {
            "id": number,
            "timestamps": [{"name": "REQUEST_START", "ns": t0}, {"name": "REQUEST_END", "ns": t1}],
        },
    ]
    for i, span in enumerate(trace.spans, 1):
        child: dict[str, Any] = {
            "id": number * 1000 + i,
            "parent_id": number,
            "model_name": span.graph,
            "node": span.node,
        }
        if span.skipped:
            child["skipped"] = True
        if span.error:
            child["error"] = span.error
        if span.batch_size:
            child["batch_size"] = span.batch_size
        if span.attributes:
            child["attributes"] = dict(span.attributes)
        child["timestamps"] = [
            {"name": "COMPUTE_START", "ns": span.start_ns},
            {"name": "COMPUTE_END", "ns": max(span.end_ns, span.start_ns)},
        ]
        records.append(child)
    if not trace.ok:
        records[0]["error"] = trace.error
    return records


# (trace file, log frequency, trace): where a finished trace is written
TraceSink = Callable[[str, int, Trace], None]


class TraceFiles:
    """Trace files in Triton's shape (a JSON array of records), numbered across all traces.
    With ``log_frequency`` N > 0, every N traces go to a new file ``<trace_file>.<k>``, as
    Triton does; with 0 the file holds every trace so far (rewritten as each one arrives, the
    latest ``keep`` at most). One per server: with several workers, the supervisor's, which the
    workers send their traces to, so one file holds them all."""

    def __init__(self, keep: int = 10_000) -> None:
        self.keep = keep
        self._pending: dict[str, list[dict[str, Any]]] = {}
        self._files: dict[str, int] = {}
        self._number = 0

    def add(self, path: str, log_frequency: int, trace: Trace) -> None:
        self._number += 1
        pending = self._pending.setdefault(path, [])
        pending.extend(triton_trace(trace, self._number))
        if log_frequency > 0:
            if self._number % log_frequency == 0 or len(pending) >= self.keep:
                index = self._files.get(path, 0)
                self._files[path] = index + 1
                Path(f"{path}.{index}").write_text(json.dumps(pending))
                pending.clear()
            return
        del pending[: max(len(pending) - self.keep, 0)]
        Path(path).write_text(json.dumps(pending))


class TraceFileWriter:
    """Sends each finished trace to the ``trace_file`` of its trace settings (Triton mode):
    to ``sink`` (default: this process's own :class:`TraceFiles`)."""

    def __init__(self, plane: DataPlane, keep: int = 10_000, sink: TraceSink | None = None) -> None:
        self.plane = plane
        self.sink = sink or TraceFiles(keep).add

    def __call__(self, trace: Trace) -> None:
        settings = self.plane.trace_file_settings(trace.model)
        path = settings.trace_file
        if not path or settings.trace_mode != "triton":
            return
        self.sink(path, settings.log_frequency, trace)


def fan_out(*sinks: Callable[[Trace], None]) -> Callable[[Trace], None]:
    """One ``plane.on_trace`` that hands each finished trace to every sink in turn."""

    def each(trace: Trace) -> None:
        for sink in sinks:
            try:
                sink(trace)
            except Exception:  # one output failing must not starve the others
                log.exception("trace output %r failed", sink)

    return each


__all__ = [
    "TraceFileWriter",
    "TraceFiles",
    "TraceSink",
    "fan_out",
    "find_trace",
    "trace_bounds",
    "trace_dict",
    "trace_id",
    "trace_summary",
    "triton_trace",
]
