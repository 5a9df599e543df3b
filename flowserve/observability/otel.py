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

The spans are made with OpenTelemetry's SDK (a ``TracerProvider`` of flowserve's own, never the
global one), with the start and end times flowserve recorded (wall-clock, converted from the
monotonic clock spans keep), and go out through the SDK's ``BatchSpanProcessor`` to its OTLP
exporter: OTLP/HTTP with protobuf encoding (which the OpenTelemetry collector, Jaeger and Tempo
accept on ``/v1/traces``), or OTLP/gRPC for a ``grpc://`` url (see ``OtelOptions``). The
processor takes Triton's settings (``bsp_max_queue_size``: spans waiting, more are dropped;
``bsp_max_export_batch_size``: spans per export; ``bsp_schedule_delay``: ms between exports) and
exports on its own daemon thread, so the event loop only makes spans and queues them; a
collector that is down costs a logged warning (at most one a minute), never a request.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Sequence

from flowserve.core.node import Span
from flowserve.core.version import VERSION
from flowserve.dataplane.plane import DataPlane, Trace
from flowserve.observability.traceconfig import DEFAULT_URL, OtelOptions
from flowserve.observability.traces import trace_bounds

try:
    from opentelemetry import trace as otel_trace
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON
except ImportError as exc:  # pragma: no cover - a dependency of flowserve
    raise ImportError(
        "--trace-config mode=opentelemetry needs opentelemetry-sdk and "
        f"opentelemetry-exporter-otlp-proto-http (flowserve's dependencies): {exc}"
    ) from exc

log = logging.getLogger("flowserve.otel")

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")
# the SDK exporters' own loggers: a retry notice per attempt and an error per failed batch
_EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
)


def parse_traceparent(value: str | None) -> tuple[str, str] | None:
    """(trace id, parent span id) of a W3C ``traceparent`` header, None when absent or invalid."""
    if not value:
        return None
    match = _TRACEPARENT.match(value.strip().lower())
    if match is None or set(match.group(1)) == {"0"} or set(match.group(2)) == {"0"}:
        return None
    return match.group(1), match.group(2)


def make_resource(options: OtelOptions) -> Resource:
    """The exporter's resource: ``opentelemetry,resource=`` over ``OTEL_SERVICE_NAME`` and
    ``OTEL_RESOURCE_ATTRIBUTES`` (the SDK reads those), with service.name "flowserve" when
    none of them names the service."""
    attributes: dict[str, str] = {}
    if "service.name" not in OTELResourceDetector().detect().attributes:
        attributes["service.name"] = "flowserve"
    attributes.update(options.resource)
    return Resource.create(attributes)


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


def record_trace(tracer: otel_trace.Tracer, trace: Trace, wall_offset_ns: int) -> None:
    """Make (and end) the spans of one trace with ``tracer``; ``wall_offset_ns`` turns
    flowserve's monotonic times into wall-clock ones."""
    parent = None
    caller = parse_traceparent(trace.traceparent)
    if caller is not None:  # the caller's span, continued
        context = otel_trace.SpanContext(
            int(caller[0], 16),
            int(caller[1], 16),
            is_remote=True,
            trace_flags=otel_trace.TraceFlags(otel_trace.TraceFlags.SAMPLED),
        )
        parent = otel_trace.set_span_in_context(otel_trace.NonRecordingSpan(context))
    t0, t1 = (t + wall_offset_ns for t in trace_bounds(trace.spans))
    base = {"model_name": trace.model, "request_id": trace.request_id}
    error = "" if trace.ok else trace.error or "failed"
    server, internal = otel_trace.SpanKind.SERVER, otel_trace.SpanKind.INTERNAL
    top = tracer.start_span("InferRequest", parent, server, base, start_time=t0)
    model = tracer.start_span(trace.model, otel_trace.set_span_in_context(top), internal, base, start_time=t0)
    for span in (top, model):
        span.add_event("REQUEST_START", timestamp=t0)

    holders = [_enclosing(span, trace.spans, trace.model) for span in trace.spans]
    made: dict[int, otel_trace.Span] = {}

    def make(i: int, visiting: frozenset[int]) -> otel_trace.Span:
        """Node ``i``'s span, after the span of the step that holds it."""
        if i in made:
            return made[i]
        holder = holders[i]
        # the addressed graph's node (or a tie in time): under the model's span
        outer = model if holder is None or holder in visiting else make(holder, visiting | {i})
        node = trace.spans[i]
        attributes: dict[str, str | int | float | bool] = {
            "model_name": node.graph,
            "request_id": trace.request_id,
            "flowserve.graph": node.graph,
            "flowserve.node": node.node,
        }
        if node.batch_size:
            attributes["flowserve.batch_size"] = node.batch_size
        if node.skipped:
            attributes["flowserve.skipped"] = True
        if node.attributes:
            attributes.update(node.attributes)
        start = node.start_ns + wall_offset_ns
        made[i] = tracer.start_span(
            node.node, otel_trace.set_span_in_context(outer), internal, attributes, start_time=start
        )
        made[i].add_event("COMPUTE_START", timestamp=start)
        return made[i]

    for i in range(len(trace.spans)):
        make(i, frozenset())
    for i, otel_span in reversed(made.items()):  # the inner spans end first
        node = trace.spans[i]
        end = max(node.end_ns, node.start_ns) + wall_offset_ns
        otel_span.add_event("COMPUTE_END", timestamp=end)
        if node.error:
            otel_span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, node.error))
        otel_span.end(end_time=end)
    for span in (model, top):
        span.add_event("REQUEST_END", timestamp=t1)
        if error:
            span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, error))
        span.end(end_time=t1)


class _OncePerMinute(logging.Filter):
    """On the SDK exporters' loggers: their errors at most once a minute, no retry notices."""

    def __init__(self) -> None:
        super().__init__()
        self._at = -60.0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return False
        now = time.monotonic()
        if now - self._at < 60:
            return False
        self._at = now
        return True


for _name in _EXPORTER_LOGGERS:
    logging.getLogger(_name).addFilter(_OncePerMinute())


class _Counting(SpanExporter):
    """The SDK's OTLP exporter, counting what it exported and what failed, with a warning (at
    most one a minute) naming the collector."""

    def __init__(self, inner: SpanExporter, endpoint: str) -> None:
        self.inner = inner
        self.endpoint = endpoint
        self.exported = 0
        self.failed = 0
        self._lock = threading.Lock()
        self._warned_at = -60.0
        self._shut = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception as exc:
            log.debug("OpenTelemetry exporter raised: %r", exc)
            result = SpanExportResult.FAILURE
        with self._lock:
            if result is SpanExportResult.SUCCESS:
                self.exported += len(spans)
                return result
            self.failed += len(spans)
            now = time.monotonic()
            warn, self._warned_at = now - self._warned_at > 60, now
        if warn:
            log.warning("OpenTelemetry export to %s failed; %d spans dropped", self.endpoint, len(spans))
        return result

    def shutdown(self) -> None:
        with self._lock:
            shut, self._shut = self._shut, True
        if not shut:
            self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def _span_exporter(options: OtelOptions) -> SpanExporter:
    protocol, endpoint = options.transport()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcSpanExporter,
            )
        except ImportError as exc:  # pragma: no cover - a dependency of flowserve
            raise ImportError(f"OTLP over gRPC needs opentelemetry-exporter-otlp-proto-grpc: {exc}") from exc
        return GrpcSpanExporter(endpoint=endpoint, timeout=options.timeout_s)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint, timeout=options.timeout_s)


class OtlpExporter:
    """``plane.on_trace`` sink for traces whose settings say ``trace_mode: opentelemetry``."""

    def __init__(self, plane: DataPlane, options: OtelOptions) -> None:
        options.check()
        self.plane = plane
        self.options = options
        self.endpoint = options.endpoint()
        self.spans = 0  # spans made (each to be exported, refused, or dropped)
        self._exporter = _Counting(_span_exporter(options), self.endpoint)
        queue, delay, batch = options.batch_settings()
        self._provider = TracerProvider(
            sampler=ALWAYS_ON,  # flowserve's trace settings chose the request
            resource=make_resource(options),
            shutdown_on_exit=False,  # close() does, at the server's stop
        )
        self._provider.add_span_processor(
            BatchSpanProcessor(
                self._exporter, max_queue_size=queue, schedule_delay_millis=delay, max_export_batch_size=batch
            )
        )
        self._tracer = self._provider.get_tracer("flowserve", VERSION)

    @property
    def exported(self) -> int:
        """Spans the collector took."""
        return self._exporter.exported

    @property
    def failed(self) -> int:
        """Spans sent (or, at close, abandoned) whose export failed."""
        return self._exporter.failed

    @property
    def dropped(self) -> int:
        """Spans not exported: refused, or over the queue's bound (final once closed; before,
        what is still queued counts too)."""
        return self.spans - self._exporter.exported

    def __call__(self, trace: Trace) -> None:
        if self.plane.trace_file_settings(trace.model).trace_mode != "opentelemetry":
            return
        record_trace(self._tracer, trace, time.time_ns() - time.monotonic_ns())
        self.spans += 2 + len(trace.spans)

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (for ``timeout_s`` at most) and stop the export thread."""
        done = threading.Thread(target=self._provider.shutdown, name="otlp-shutdown", daemon=True)
        done.start()
        done.join(timeout_s)
        if done.is_alive():  # a collector that does not answer: its retries are given up
            self._exporter.shutdown()
            done.join(1.0)


__all__ = [
    "DEFAULT_URL",
    "OtelOptions",
    "OtlpExporter",
    "make_resource",
    "parse_traceparent",
    "record_trace",
]
