"""OpenTelemetry export of request traces (Triton's ``--trace-config mode=opentelemetry``).

::

    exporter = OtlpExporter(plane, OtelOptions(url="http://collector:4318/v1/traces"))
    exporter(trace)          # plane.on_trace: a traced request ended (trace_mode "opentelemetry")
    exporter.close()         # at shutdown: what is queued is sent (for a few seconds at most)

A traced request becomes spans as Triton shapes them: a top-level ``InferRequest`` span (a
server span, the child of the caller's span when the request carried a W3C ``traceparent``
header), a span for the model or graph it addressed, and a span per node that ran (a graph
step's model runs inside the step's span), each with ``model_name``, ``request_id`` and
flowserve's ``flowserve.graph`` / ``flowserve.node`` attributes, REQUEST_START/END and
COMPUTE_START/END events, and an error status naming what failed. Skipped branches are
zero-length spans marked ``flowserve.skipped``.

Spans go out as OTLP/HTTP with JSON encoding (``Content-Type: application/json``, which the
OpenTelemetry collector, Jaeger and Tempo accept on ``/v1/traces``), through a batch span
processor with Triton's settings: ``bsp_max_queue_size`` (spans waiting; more are dropped and
counted), ``bsp_max_export_batch_size`` (spans per export) and ``bsp_schedule_delay`` (ms
between exports). Exports run on one daemon thread, so the event loop only converts and
queues; a collector that is down costs a logged warning (at most one a minute), never a
request. Times are wall-clock (OpenTelemetry's), converted from the monotonic clock spans keep.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from flowserve.core.node import Span
from flowserve.dataplane.plane import VERSION, DataPlane, Trace
from flowserve.observability.traces import trace_bounds

log = logging.getLogger("flowserve.otel")

DEFAULT_URL = "http://localhost:4318/v1/traces"
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")
SERVER, INTERNAL = 2, 1  # OTLP span kinds
STATUS_ERROR = 2


@dataclass
class OtelOptions:
    """Triton's ``--trace-config opentelemetry,<setting>=<value>`` settings."""

    url: str = DEFAULT_URL
    resource: dict[str, str] = field(default_factory=lambda: {"service.name": "flowserve"})
    max_queue_size: int = 2048
    schedule_delay_ms: int = 5000
    max_export_batch_size: int = 512
    timeout_s: float = 10.0

    @classmethod
    def from_env(cls) -> OtelOptions:
        """Defaults, with OpenTelemetry's environment variables applied (as Triton reads them)."""
        options = cls()
        for pair in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
            key, sep, value = pair.partition("=")
            if sep and key.strip():
                options.resource[key.strip()] = value.strip()
        for env, name in (
            ("OTEL_BSP_MAX_QUEUE_SIZE", "max_queue_size"),
            ("OTEL_BSP_SCHEDULE_DELAY", "schedule_delay_ms"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "max_export_batch_size"),
        ):
            if os.environ.get(env, "").strip():
                options.set(name, os.environ[env], env)
        return options

    def set(self, name: str, text: str, source: str) -> None:
        """One integer batch-processor setting from ``source`` (ValueError naming it)."""
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{source}: expected an integer, got {text!r}") from None
        if value < (0 if name == "schedule_delay_ms" else 1):
            raise ValueError(f"{source}: {value} is out of range")
        setattr(self, name, value)

    def check(self) -> None:
        if self.max_export_batch_size > self.max_queue_size:
            raise ValueError(
                f"bsp_max_export_batch_size ({self.max_export_batch_size}) must not exceed "
                f"bsp_max_queue_size ({self.max_queue_size})"
            )
        if "://" not in self.url:  # Triton's examples give host:port/path
            self.url = "http://" + self.url


def parse_traceparent(value: str | None) -> tuple[str, str] | None:
    """(trace id, parent span id) of a W3C ``traceparent`` header, None when absent or invalid."""
    if not value:
        return None
    match = _TRACEPARENT.match(value.strip().lower())
    if match is None or set(match.group(1)) == {"0"} or set(match.group(2)) == {"0"}:
        return None
    return match.group(1), match.group(2)


def _attrs(values: dict[str, str | int | bool]) -> list[dict[str, Any]]:
    out = []
    for key, value in values.items():
        if isinstance(value, bool):
            out.append({"key": key, "value": {"boolValue": value}})
        elif isinstance(value, int):
            out.append({"key": key, "value": {"intValue": str(value)}})
        else:
            out.append({"key": key, "value": {"stringValue": value}})
    return out


def _span(
    trace_id: str, span_id: str, parent: str, name: str, kind: int, start_ns: int, end_ns: int,
    attributes: dict[str, str | int | bool], events: tuple[str, str], error: str = "",
) -> dict[str, Any]:  # fmt: skip
    span: dict[str, Any] = {
        "traceId": trace_id,
        "spanId": span_id,
        "name": name,
        "kind": kind,
        "startTimeUnixNano": str(start_ns),
        "endTimeUnixNano": str(end_ns),
        "attributes": _attrs(attributes),
        "events": [
            {"timeUnixNano": str(start_ns), "name": events[0]},
            {"timeUnixNano": str(end_ns), "name": events[1]},
        ],
    }
    if parent:
        span["parentSpanId"] = parent
    if error:
        span["status"] = {"code": STATUS_ERROR, "message": error}
    return span


def _enclosing(span: Span, spans: list[Span], top: str) -> int | None:
    """The index of the shortest span of another graph that holds ``span`` in time (the step
    that ran its graph), None for a span of the addressed graph."""
    if span.graph == top:
        return None
    best, best_len = None, None
    for i, other in enumerate(spans):
        if other is span or other.graph == span.graph or other.skipped:
            continue
        if other.start_ns <= span.start_ns and span.end_ns <= other.end_ns:
            length = other.end_ns - other.start_ns
            if best_len is None or length < best_len:
                best, best_len = i, length
    return best


def otlp_spans(trace: Trace, wall_offset_ns: int, new_id: Any = None) -> list[dict[str, Any]]:
    """The OTLP (JSON) spans of one trace; ``wall_offset_ns`` turns monotonic into wall time."""
    new_id = new_id or (lambda n: os.urandom(n).hex())
    context = parse_traceparent(trace.traceparent)
    trace_id, caller = context if context is not None else (new_id(16), "")
    t0, t1 = (t + wall_offset_ns for t in trace_bounds(trace.spans))
    base: dict[str, str | int | bool] = {"model_name": trace.model, "request_id": trace.request_id}
    error = "" if trace.ok else trace.error or "failed"
    top_id, model_id = new_id(8), new_id(8)
    request = ("REQUEST_START", "REQUEST_END")
    out = [
        _span(trace_id, top_id, caller, "InferRequest", SERVER, t0, t1, base, request, error),
        _span(trace_id, model_id, top_id, trace.model, INTERNAL, t0, t1, base, request, error),
    ]
    ids = [new_id(8) for _ in trace.spans]
    for i, span in enumerate(trace.spans):
        holder = _enclosing(span, trace.spans, trace.model)
        start = span.start_ns + wall_offset_ns
        end = max(span.end_ns, span.start_ns) + wall_offset_ns
        attributes: dict[str, str | int | bool] = {
            "model_name": span.graph,
            "request_id": trace.request_id,
            "flowserve.graph": span.graph,
            "flowserve.node": span.node,
        }
        if span.batch_size:
            attributes["flowserve.batch_size"] = span.batch_size
        if span.skipped:
            attributes["flowserve.skipped"] = True
        parent = model_id if holder is None else ids[holder]
        events = ("COMPUTE_START", "COMPUTE_END")
        out.append(
            _span(
                trace_id,
                ids[i],
                parent,
                span.node,
                INTERNAL,
                start,
                end,
                attributes,
                events,
                span.error or "",
            )
        )
    return out


class OtlpExporter:
    """``plane.on_trace`` sink for traces whose settings say ``trace_mode: opentelemetry``."""

    def __init__(self, plane: DataPlane, options: OtelOptions) -> None:
        options.check()
        self.plane = plane
        self.options = options
        self.dropped = 0
        self.exported = 0
        self._queue: deque[dict[str, Any]] = deque()
        self._lock = threading.Condition()
        self._closing = False
        self._warned_at = 0.0
        self._resource = {"attributes": _attrs(dict(options.resource))}
        self._thread = threading.Thread(target=self._run, name="otlp-exporter", daemon=True)
        self._thread.start()

    def __call__(self, trace: Trace) -> None:
        if self.plane.trace_file_settings(trace.model).trace_mode != "opentelemetry":
            return
        spans = otlp_spans(trace, time.time_ns() - time.monotonic_ns())
        with self._lock:
            queue = self._queue
            was_empty = not queue
            room = self.options.max_queue_size - len(queue)
            if room < len(spans):
                self.dropped += len(spans) - max(room, 0)
                spans = spans[: max(room, 0)]
            queue.extend(spans)
            # wake the exporter: from idle (its delay starts), or because a batch is full
            if was_empty or len(queue) >= self.options.max_export_batch_size:
                self._lock.notify()

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (for ``timeout_s`` at most) and stop the export thread."""
        with self._lock:
            self._closing = True
            self._lock.notify()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        delay = self.options.schedule_delay_ms / 1000
        size = self.options.max_export_batch_size
        while True:
            with self._lock:
                while not self._closing and not self._queue:
                    self._lock.wait()  # idle until spans come
                if not self._closing and len(self._queue) < size:
                    self._lock.wait(delay)  # then send them after the delay, or once a batch fills
                batch = [self._queue.popleft() for _ in range(min(size, len(self._queue)))]
                last = self._closing and not self._queue
            if batch:
                self._export(batch)
            if last:
                return

    def _export(self, spans: list[dict[str, Any]]) -> None:
        body = {
            "resourceSpans": [
                {
                    "resource": self._resource,
                    "scopeSpans": [{"scope": {"name": "flowserve", "version": VERSION}, "spans": spans}],
                }
            ]
        }
        request = urllib.request.Request(
            self.options.url,
            data=json.dumps(body, separators=(",", ":")).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.options.timeout_s) as reply:
                reply.read()
        except (urllib.error.URLError, OSError, ValueError) as exc:
            with self._lock:  # __call__ counts drops too, on the loop's thread
                self.dropped += len(spans)
            now = time.monotonic()
            if now - self._warned_at > 60:
                self._warned_at = now
                log.warning(
                    "OpenTelemetry export to %s failed (%s); %d spans dropped",
                    self.options.url,
                    exc,
                    len(spans),
                )
        else:
            self.exported += len(spans)


__all__ = ["DEFAULT_URL", "OtelOptions", "OtlpExporter", "otlp_spans", "parse_traceparent"]
