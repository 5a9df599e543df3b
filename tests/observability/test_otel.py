"""OpenTelemetry trace export (``--trace-config mode=opentelemetry``) through OpenTelemetry's
SDK: the option's parsing and its precedence over OpenTelemetry's environment variables, the
spans a trace becomes, and exports to stand-in OTLP/HTTP (protobuf) and OTLP/gRPC collectors on
loopback, served with the caller's ``traceparent`` continued over HTTP and gRPC."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from tritonclient.utils import InferenceServerException

from flowserve.core.node import Span
from flowserve.dataplane.plane import Trace
from flowserve.observability.otel import (
    OtelOptions,
    OtlpExporter,
    make_resource,
    parse_traceparent,
    record_trace,
)
from flowserve.observability.traceconfig import parse_trace_config

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
OTEL_ENV = (
    "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "OTEL_SDK_DISABLED",
    "OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
)  # fmt: skip


@pytest.fixture(autouse=True)
def _no_otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts from an environment without OpenTelemetry's variables."""
    for name in OTEL_ENV:
        monkeypatch.delenv(name, raising=False)


# ---------------------------------------------------------------- the option


def test_trace_config_takes_tritons_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test,service.name=env")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "250")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4096")
    config = parse_trace_config(
        [
            "level=TIMESTAMPS", "level=TENSORS", "rate=0", "count=-1", "mode=opentelemetry",
            "opentelemetry,url=collector:4318/v1/traces", "opentelemetry,resource=service.name=fs",
            "opentelemetry,bsp_max_export_batch_size=8", "opentelemetry,bsp_max_queue_size=64",
        ]
    )  # fmt: skip
    assert config.settings == {
        "trace_level": ["TIMESTAMPS", "TENSORS"],
        "trace_rate": "0",
        "trace_count": "-1",
        "trace_mode": "opentelemetry",
    }
    otel = config.otel
    assert otel is not None
    assert otel.url == "http://collector:4318/v1/traces"
    assert otel.transport() == ("http", "http://collector:4318/v1/traces")
    # the option wins over the environment, which wins over the default
    resource = make_resource(otel).attributes
    assert resource["service.name"] == "fs" and resource["deployment.environment"] == "test"
    assert resource["telemetry.sdk.name"] == "opentelemetry"  # the SDK's own
    assert otel.batch_settings() == (64, 250, 8)  # queue, delay (ms), batch
    triton = parse_trace_config(["triton,file=/tmp/t.json", "triton,log-frequency=50", "rate=100"])
    assert triton.otel is None
    assert triton.settings == {"trace_file": "/tmp/t.json", "log_frequency": "50", "trace_rate": "100"}


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ("level=LOUD", "level must be one of"),
        ("rate=often", "expected an integer"),
        ("count=-2", "between -1 and 2147483647"),
        ("rate=1e23", "expected an integer"),
        ("rate=2147483648", "between 0 and 2147483647 (every N-th request is traced, 0 none)"),
        ("mode=jaeger", "mode must be triton or opentelemetry"),
        ("zipkin,url=x", "unknown mode 'zipkin'"),
        ("opentelemetry,colour=red", "unknown opentelemetry setting"),
        ("opentelemetry,resource=novalue", "resource=<key>=<value>"),
        ("opentelemetry,bsp_max_queue_size=0", "out of range"),
        ("triton,url=x", "unknown triton setting"),
        ("verbose", "expected [<mode>,]<setting>=<value>"),
    ],
)
def test_trace_config_names_what_is_wrong(item: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_trace_config(["mode=opentelemetry", item])
    assert says in str(info.value) and item in str(info.value)


def test_a_batch_larger_than_the_queue_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="must not exceed"):
        parse_trace_config(["mode=opentelemetry", "opentelemetry,bsp_max_export_batch_size=4096"])
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")  # the environment's queue, the default batch
    with pytest.raises(ValueError, match=r"\(512\) must not exceed bsp_max_queue_size \(4\)"):
        parse_trace_config(["mode=opentelemetry"])
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "lots")
    with pytest.raises(ValueError, match="OTEL_BSP_MAX_QUEUE_SIZE: expected an integer"):
        parse_trace_config(["mode=opentelemetry"])
    # where an option says otherwise, the environment's value is not read at all
    config = parse_trace_config(
        [
            "mode=opentelemetry",
            "opentelemetry,bsp_max_queue_size=16",
            "opentelemetry,bsp_max_export_batch_size=8",
        ]
    ).otel
    assert config is not None and config.batch_settings() == (16, 5000, 8)


def test_opentelemetrys_environment_applies_where_the_options_say_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    default = parse_trace_config(["mode=opentelemetry"]).otel
    assert default is not None
    assert default.transport() == ("http", None)  # the SDK's exporter reads the environment
    assert default.endpoint() == "http://localhost:4318/v1/traces"
    assert default.batch_settings() == (2048, 5000, 512)
    assert make_resource(default).attributes["service.name"] == "flowserve"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://base:4318/")
    assert default.endpoint() == "http://base:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4318/custom")
    assert default.endpoint() == "http://traces:4318/custom"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes,team=ml")
    assert make_resource(default).attributes["service.name"] == "from-attributes"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-service-name")  # OpenTelemetry's own order
    assert make_resource(default).attributes["service.name"] == "from-service-name"
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "7")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    assert default.transport() == ("grpc", None) and default.batch_settings() == (2048, 5000, 7)
    # the options win over all of it
    config = parse_trace_config(
        [
            "mode=opentelemetry", "opentelemetry,url=http://option:4318/v1/traces",
            "opentelemetry,resource=service.name=option", "opentelemetry,bsp_max_export_batch_size=3",
        ]
    ).otel  # fmt: skip
    assert config is not None
    assert config.endpoint() == "http://option:4318/v1/traces"
    attributes = make_resource(config).attributes
    assert attributes["service.name"] == "option" and attributes["team"] == "ml"
    assert config.batch_settings() == (2048, 5000, 3)
    # a grpc:// url asks for gRPC whatever the environment says (grpcs://: with TLS)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
    assert OtelOptions(url="grpc://collector:4317").transport() == ("grpc", "http://collector:4317")
    assert OtelOptions(url="grpcs://collector:4317").transport() == ("grpc", "https://collector:4317")


def test_traceparent_is_read_as_w3c_defines_it() -> None:
    assert parse_traceparent(TRACEPARENT) == (TRACE_ID, PARENT_ID)
    assert parse_traceparent(TRACEPARENT.upper()) == (TRACE_ID, PARENT_ID)
    for bad in ("", "garbage", f"00-{'0' * 32}-{PARENT_ID}-01", f"00-{TRACE_ID}-{'0' * 16}-01"):
        assert parse_traceparent(bad) is None


# ---------------------------------------------------------------- spans


def _recorded(trace: Trace, wall_offset_ns: int) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    record_trace(provider.get_tracer("test"), trace, wall_offset_ns)
    provider.shutdown()
    return list(memory.get_finished_spans())


def _hex(value: int, digits: int) -> str:
    return format(value, f"0{digits}x")


def test_a_trace_becomes_request_model_and_node_spans_nested_as_they_ran() -> None:
    # an ensemble whose step "s1" ran model "m" (nested span), then "s2" failed; "b" skipped
    spans = [
        Span("m", "m", 1_100, 1_800),
        Span("ens", "s1", 1_000, 2_000, batch_size=4),
        Span("ens", "s2", 2_000, 3_000, error="ValueError: bad"),
        Span("ens", "b", 2_500, 2_500, skipped=True),
    ]
    trace = Trace("r7", "ens", spans, ok=False, error="node 's2' failed", traceparent=TRACEPARENT)
    out = _recorded(trace, 10_000)
    assert len(out) == 6
    by_name = {s.name: s for s in out}
    top, model = by_name["InferRequest"], by_name["ens"]

    def parent(span: ReadableSpan) -> int | None:
        return span.parent.span_id if span.parent is not None else None

    assert {_hex(s.context.trace_id, 32) for s in out} == {TRACE_ID}  # the caller's trace goes on
    assert top.parent is not None and top.parent.is_remote and _hex(top.parent.span_id, 16) == PARENT_ID
    assert top.kind is SpanKind.SERVER and model.kind is SpanKind.INTERNAL
    assert (top.start_time, top.end_time) == (11_000, 13_000)
    assert parent(model) == top.context.span_id
    assert parent(by_name["s1"]) == model.context.span_id
    assert parent(by_name["m"]) == by_name["s1"].context.span_id  # the step ran the model
    assert parent(by_name["b"]) == model.context.span_id
    assert (by_name["m"].start_time, by_name["m"].end_time) == (11_100, 11_800)
    assert by_name["s1"].attributes is not None and by_name["s1"].attributes["flowserve.batch_size"] == 4
    assert by_name["b"].attributes is not None and by_name["b"].attributes["flowserve.skipped"] is True
    assert by_name["b"].start_time == by_name["b"].end_time == 12_500
    assert by_name["s2"].status.status_code is StatusCode.ERROR
    assert by_name["s2"].status.description == "ValueError: bad"
    assert top.status.description == "node 's2' failed" and model.status.status_code is StatusCode.ERROR
    assert by_name["s1"].status.status_code is StatusCode.UNSET
    assert dict(top.attributes or {}) == {"model_name": "ens", "request_id": "r7"}
    assert dict(by_name["m"].attributes or {}) == {
        "model_name": "m", "request_id": "r7", "flowserve.graph": "m", "flowserve.node": "m",
    }  # fmt: skip
    assert [(e.name, e.timestamp) for e in by_name["m"].events] == [
        ("COMPUTE_START", 11_100),
        ("COMPUTE_END", 11_800),
    ]
    assert [e.name for e in top.events] == ["REQUEST_START", "REQUEST_END"]
    fresh = _recorded(Trace("r8", "m", [Span("m", "m", 0, 5)]), 0)
    request = next(s for s in fresh if s.name == "InferRequest")
    assert request.parent is None and request.context.trace_id != int(TRACE_ID, 16)
    assert all(s.status.status_code is StatusCode.UNSET for s in fresh)


def test_spans_of_the_same_time_in_two_graphs_do_not_loop() -> None:
    # two nested graphs' spans that hold each other in time: each is nested once, none recurses
    trace = Trace("r9", "top", [Span("a", "x", 0, 10), Span("b", "y", 0, 10), Span("top", "s", 0, 10)])
    out = {s.name: s for s in _recorded(trace, 0)}
    assert len(out) == 5 and all(s.parent is not None for n, s in out.items() if n != "InferRequest")


class _Plane:
    """What the exporter reads of the plane: the trace settings that apply to a model."""

    class Settings:
        trace_mode = "opentelemetry"

    def trace_file_settings(self, model: str) -> Any:
        return self.Settings()


def test_an_unreachable_collector_drops_spans_and_the_queue_stays_bounded() -> None:
    options = OtelOptions(url="http://127.0.0.1:9/v1/traces", max_queue_size=6, schedule_delay_ms=10_000)
    options.max_export_batch_size, options.timeout_s = 6, 1.0
    exporter = OtlpExporter(_Plane(), options)  # type: ignore[arg-type]
    try:
        trace = Trace("r", "m", [Span("m", "m", 0, 5)])  # 3 spans each
        for _ in range(5):
            exporter(trace)
    finally:
        began = time.monotonic()
        exporter.close()
    assert time.monotonic() - began < 8  # close() is bounded, whatever the collector does
    assert exporter.spans == 15 and exporter.exported == 0 and exporter.dropped == 15
    # a full batch was sent (and refused); the queue held 6 at most, so some never left
    assert 6 <= exporter.failed <= 12


# ---------------------------------------------------------------- stand-in collectors


Received = list[trace_service_pb2.ExportTraceServiceRequest]


class _Collector(http.server.BaseHTTPRequestHandler):
    """OTLP/HTTP with protobuf encoding, as the SDK's exporter sends it."""

    received: Received = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        assert self.path == "/v1/traces" and self.headers["Content-Type"] == "application/x-protobuf"
        self.received.append(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
        reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, Received]]:
    received: Received = []
    handler = type("Collector", (_Collector,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}/v1/traces", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class _GrpcCollector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (the service's name)
        self.received.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def grpc_collector() -> Iterator[tuple[str, Received]]:
    received: Received = []
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_GrpcCollector(received), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", received
    finally:
        server.stop(0).wait(5)


def _value(any_value: Any) -> Any:
    return getattr(any_value, any_value.WhichOneof("value"))


def _attributes(item: Any) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in item.attributes}


def _spans(received: Received) -> list[Any]:
    return [
        span
        for request in list(received)
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]


def _wait_for(received: Received, trace_id: str, count: int) -> list[Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        mine = [s for s in _spans(received) if s.trace_id.hex() == trace_id]
        if len(mine) >= count:
            return mine
        time.sleep(0.05)
    raise AssertionError(f"no {count} spans of trace {trace_id}: {_spans(received)}")


def _export_one(options: OtelOptions) -> OtlpExporter:
    """An exporter that was handed one trace (with the caller's context) and closed."""
    exporter = OtlpExporter(_Plane(), options)  # type: ignore[arg-type]
    try:
        exporter(Trace("r1", "m", [Span("m", "m", 1_000, 2_000, batch_size=2)], traceparent=TRACEPARENT))
    finally:
        exporter.close()
    return exporter


def test_the_sdks_exporter_sends_the_spans_over_otlp_http(collector: tuple[str, Received]) -> None:
    url, received = collector
    exporter = _export_one(OtelOptions(url=url, resource={"service.name": "unit"}, schedule_delay_ms=10))
    assert exporter.exported == 3 and exporter.failed == 0 and exporter.dropped == 0
    spans = _wait_for(received, TRACE_ID, 3)
    by_name = {s.name: s for s in spans}
    assert by_name["InferRequest"].parent_span_id.hex() == PARENT_ID
    assert by_name["InferRequest"].kind == 2  # SPAN_KIND_SERVER
    assert by_name["m"].parent_span_id == by_name["InferRequest"].span_id
    node = next(s for s in spans if _attributes(s).get("flowserve.node") == "m")
    assert node.parent_span_id == by_name["m"].span_id and _attributes(node)["flowserve.batch_size"] == 2
    assert [e.name for e in node.events] == ["COMPUTE_START", "COMPUTE_END"]
    assert node.end_time_unix_nano - node.start_time_unix_nano == 1_000
    request = received[0].resource_spans[0]
    assert _attributes(request.resource)["service.name"] == "unit"
    assert request.scope_spans[0].scope.name == "flowserve"


def test_the_environment_names_the_collector_when_the_options_do_not(
    collector: tuple[str, Received], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, received = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://{url.removesuffix('/v1/traces')}")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
    config = parse_trace_config(["mode=opentelemetry"]).otel
    assert config is not None
    assert _export_one(config).exported == 3
    assert _attributes(received[0].resource_spans[0].resource)["service.name"] == "from-env"
    # the option's url wins over the environment's (which names a port nothing listens on)
    received.clear()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/v1/traces")
    config = parse_trace_config(["mode=opentelemetry", f"opentelemetry,url={url}"]).otel
    assert config is not None
    assert _export_one(config).exported == 3 and len(_spans(received)) == 3


def test_a_grpc_url_exports_over_otlp_grpc(
    grpc_collector: tuple[str, Received], monkeypatch: pytest.MonkeyPatch
) -> None:
    address, received = grpc_collector
    exporter = _export_one(OtelOptions(url=f"grpc://{address}", schedule_delay_ms=10, timeout_s=5))
    assert exporter.exported == 3 and exporter.failed == 0
    spans = _wait_for(received, TRACE_ID, 3)
    assert {s.name for s in spans} == {"InferRequest", "m"}
    assert _attributes(received[0].resource_spans[0].resource)["service.name"] == "flowserve"
    # or OpenTelemetry's protocol variable, with an http:// url
    received.clear()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    assert _export_one(OtelOptions(url=f"http://{address}", schedule_delay_ms=10)).exported == 3


# ---------------------------------------------------------------- served


def _inputs(module: Any) -> list[Any]:
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
    return inputs


@pytest.mark.slow
def test_traces_of_requests_with_a_traceparent_reach_the_collector(
    server_factory: Any, collector: tuple[str, Received]
) -> None:
    url, received = collector
    proc = server_factory.start(
        "--trace-config=mode=opentelemetry", f"--trace-config=opentelemetry,url={url}",
        "--trace-config=opentelemetry,bsp_schedule_delay=50", "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=0", "--trace-config=opentelemetry,resource=service.name=fs-test",
        listeners="http,grpc",
    )  # fmt: skip
    with httpclient.InferenceServerClient(proc.http_url) as client:
        assert client.get_trace_settings()["trace_mode"] == "opentelemetry"
        client.infer("simple_ensemble", _inputs(httpclient))  # rate 0 and no context: not traced
        client.infer("simple_ensemble", _inputs(httpclient), headers={"traceparent": TRACEPARENT})
    spans = _wait_for(received, TRACE_ID, 6)  # request, ensemble, 2 steps, 2 nested models
    by_id = {s.span_id: s for s in spans}
    top = next(s for s in spans if s.name == "InferRequest")
    assert top.parent_span_id.hex() == PARENT_ID
    steps = [s for s in spans if _attributes(s).get("flowserve.graph") == "simple_ensemble"]
    assert len(steps) == 2 and all(by_id[s.parent_span_id].name == "simple_ensemble" for s in steps)
    nested = [s for s in spans if _attributes(s).get("flowserve.graph") == "simple"]
    assert {by_id[s.parent_span_id].span_id for s in nested} == {s.span_id for s in steps}
    resource = received[0].resource_spans[0].resource
    assert _attributes(resource)["service.name"] == "fs-test"
    assert len(_spans(received)) == 6  # the request without a context was not traced
    # over gRPC, the context comes as metadata
    grpc_trace = "0af7651916cd43dd8448eb211c80319c"
    with grpcclient.InferenceServerClient(proc.grpc_url) as client:
        client.infer(
            "simple", _inputs(grpcclient), headers={"traceparent": f"00-{grpc_trace}-b7ad6b7169203331-01"}
        )
    assert {s.name for s in _wait_for(received, grpc_trace, 3)} == {"InferRequest", "simple"}


@pytest.mark.slow
def test_opentelemetry_mode_needs_the_option_at_start(server: Any) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    with client, pytest.raises(InferenceServerException) as info:
        client.update_trace_settings(settings={"trace_mode": "opentelemetry"})
    assert "--trace-config mode=opentelemetry" in info.value.message()
