"""OpenTelemetry trace export (``--trace-config mode=opentelemetry``): the option's parsing,
the spans a trace becomes, and a served export to a stand-in OTLP/HTTP collector, with the
caller's ``traceparent`` continued over HTTP and gRPC."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from flowserve.core.node import Span
from flowserve.dataplane.plane import Trace
from flowserve.observability.otel import OtelOptions, OtlpExporter, otlp_spans, parse_traceparent
from flowserve.observability.traceconfig import parse_trace_config

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


# ---------------------------------------------------------------- the option


def test_trace_config_takes_tritons_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test,service.name=env")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "250")
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
    # the option wins over the environment, which wins over the default
    assert otel.resource == {"service.name": "fs", "deployment.environment": "test"}
    assert (otel.schedule_delay_ms, otel.max_export_batch_size, otel.max_queue_size) == (250, 8, 64)
    triton = parse_trace_config(["triton,file=/tmp/t.json", "triton,log-frequency=50", "rate=100"])
    assert triton.otel is None
    assert triton.settings == {"trace_file": "/tmp/t.json", "log_frequency": "50", "trace_rate": "100"}


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ("level=LOUD", "level must be one of"),
        ("rate=often", "expected an integer"),
        ("count=-2", "at least -1"),
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


def test_a_batch_larger_than_the_queue_is_refused() -> None:
    with pytest.raises(ValueError, match="must not exceed"):
        parse_trace_config(["mode=opentelemetry", "opentelemetry,bsp_max_export_batch_size=4096"])


def test_traceparent_is_read_as_w3c_defines_it() -> None:
    assert parse_traceparent(TRACEPARENT) == (TRACE_ID, PARENT_ID)
    assert parse_traceparent(TRACEPARENT.upper()) == (TRACE_ID, PARENT_ID)
    for bad in ("", "garbage", f"00-{'0' * 32}-{PARENT_ID}-01", f"00-{TRACE_ID}-{'0' * 16}-01"):
        assert parse_traceparent(bad) is None


# ---------------------------------------------------------------- spans


def _attributes(span: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values())) for a in span["attributes"]}


def test_a_trace_becomes_request_model_and_node_spans_nested_as_they_ran() -> None:
    # an ensemble whose step "s1" ran model "m" (nested span), then "s2" failed; "b" skipped
    spans = [
        Span("m", "m", 1_100, 1_800),
        Span("ens", "s1", 1_000, 2_000, batch_size=4),
        Span("ens", "s2", 2_000, 3_000, error="ValueError: bad"),
        Span("ens", "b", 2_500, 2_500, skipped=True),
    ]
    trace = Trace("r7", "ens", spans, ok=False, error="node 's2' failed", traceparent=TRACEPARENT)
    counter = iter(range(1, 100))
    out = otlp_spans(trace, 10_000, new_id=lambda n: format(next(counter), f"0{2 * n}x"))
    by_name = {s["name"]: s for s in out}
    top, model = by_name["InferRequest"], by_name["ens"]
    assert {s["traceId"] for s in out} == {TRACE_ID}  # the caller's trace goes on
    assert top["parentSpanId"] == PARENT_ID and top["kind"] == 2
    assert (top["startTimeUnixNano"], top["endTimeUnixNano"]) == ("11000", "13000")
    assert model["parentSpanId"] == top["spanId"]
    assert by_name["s1"]["parentSpanId"] == model["spanId"]
    assert by_name["m"]["parentSpanId"] == by_name["s1"]["spanId"]  # the step ran the model
    assert _attributes(by_name["s1"])["flowserve.batch_size"] == "4"
    assert _attributes(by_name["b"])["flowserve.skipped"] is True
    assert by_name["s2"]["status"] == {"code": 2, "message": "ValueError: bad"}
    assert top["status"]["message"] == "node 's2' failed" and "status" not in by_name["s1"]
    assert _attributes(top) == {"model_name": "ens", "request_id": "r7"}
    assert [e["name"] for e in by_name["m"]["events"]] == ["COMPUTE_START", "COMPUTE_END"]
    fresh = otlp_spans(Trace("r8", "m", [Span("m", "m", 0, 5)]), 0)
    assert len(fresh[0]["traceId"]) == 32 and "parentSpanId" not in fresh[0]


class _Plane:
    """What the exporter reads of the plane: the trace settings that apply to a model."""

    class Settings:
        trace_mode = "opentelemetry"

    def trace_file_settings(self, model: str) -> Any:
        return self.Settings()


def test_an_unreachable_collector_drops_spans_and_the_queue_stays_bounded() -> None:
    options = OtelOptions(url="http://127.0.0.1:9/v1/traces", max_queue_size=6, schedule_delay_ms=10_000)
    options.max_export_batch_size, options.timeout_s = 6, 2.0
    exporter = OtlpExporter(_Plane(), options)  # type: ignore[arg-type]
    try:
        trace = Trace("r", "m", [Span("m", "m", 0, 5)])  # 3 spans each
        for _ in range(5):
            exporter(trace)
        deadline = time.monotonic() + 10
        while exporter.dropped < 15 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert exporter.exported == 0 and exporter.dropped == 15  # each sent and refused, or never queued
    finally:
        exporter.close()


# ---------------------------------------------------------------- served


class _Collector(http.server.BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        assert self.path == "/v1/traces" and self.headers["Content-Type"] == "application/json"
        self.received.append(json.loads(body))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []
    handler = type("Collector", (_Collector,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}/v1/traces", received
    finally:
        server.shutdown()
        server.server_close()


def _spans(received: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        span
        for body in received
        for resource in body["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    ]


def _wait_for(received: list[dict[str, Any]], trace_id: str, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        mine = [s for s in _spans(received) if s["traceId"] == trace_id]
        if len(mine) >= count:
            return mine
        time.sleep(0.05)
    raise AssertionError(f"no {count} spans of trace {trace_id}: {_spans(received)}")


def _inputs(module: Any) -> list[Any]:
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
    return inputs


@pytest.mark.slow
def test_traces_of_requests_with_a_traceparent_reach_the_collector(
    server_factory: Any, collector: tuple[str, list[dict[str, Any]]]
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
    by_id = {s["spanId"]: s for s in spans}
    top = next(s for s in spans if s["name"] == "InferRequest")
    assert top["parentSpanId"] == PARENT_ID
    steps = [s for s in spans if _attributes(s).get("flowserve.graph") == "simple_ensemble"]
    assert len(steps) == 2 and all(by_id[s["parentSpanId"]]["name"] == "simple_ensemble" for s in steps)
    nested = [s for s in spans if _attributes(s).get("flowserve.graph") == "simple"]
    assert {by_id[s["parentSpanId"]]["spanId"] for s in nested} == {s["spanId"] for s in steps}
    resource = received[0]["resourceSpans"][0]["resource"]
    assert _attributes(resource)["service.name"] == "fs-test"
    assert len(_spans(received)) == 6  # the request without a context was not traced
    # over gRPC, the context comes as metadata
    grpc_trace = "0af7651916cd43dd8448eb211c80319c"
    with grpcclient.InferenceServerClient(proc.grpc_url) as client:
        client.infer(
            "simple", _inputs(grpcclient), headers={"traceparent": f"00-{grpc_trace}-b7ad6b7169203331-01"}
        )
    assert {s["name"] for s in _wait_for(received, grpc_trace, 3)} == {"InferRequest", "simple"}


@pytest.mark.slow
def test_opentelemetry_mode_needs_the_option_at_start(server: Any) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    with client, pytest.raises(InferenceServerException) as info:
        client.update_trace_settings(settings={"trace_mode": "opentelemetry"})
    assert "--trace-config mode=opentelemetry" in info.value.message()
