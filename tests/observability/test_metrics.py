"""/metrics after known traffic: Triton's series per model and flowserve's per node, exact."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import flowserve
from flowserve.core.errors import Cancelled, FlowserveError, InvalidArgument, NodeError, Unavailable
from flowserve.dataplane.plane import DataPlane
from flowserve.observability.metrics import exposition, make_registry, scrape, start_metrics
from flowserve.runtime.stats import FAILURE_REASONS, ModelStats, failure_reason

A = np.arange(32, dtype=np.int32).reshape(2, 16)


async def http_get(port: int, path: str, requests: int = 1) -> list[tuple[str, dict[str, str], str]]:
    """GET ``path`` ``requests`` times on one kept-alive connection (a real socket)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answers = []
    try:
        for _ in range(requests):
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            await writer.drain()
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            status, *lines = head.strip().split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
            body = await reader.readexactly(int(headers["content-length"]))
            answers.append((status, headers, body.decode()))
    finally:
        writer.close()
        await writer.wait_closed()
    return answers


async def traffic(engine: flowserve.Engine) -> None:
    """3 fanout requests of 2 rows, 3 route requests (2 big, 1 small), one invalid fanout
    request, and 'checked' twice: once fine, once failing in node 'check'."""
    for _ in range(3):
        await engine.infer("fanout", {"a": A, "b": A})
    for x in ([500.0], [1.0], [200.0, 1.0]):
        await engine.infer("route", {"x": np.array(x, np.float32)})
    with pytest.raises(InvalidArgument):
        await engine.infer("fanout", {"a": A})
    await engine.infer("checked", {"x": np.array([1, 2], np.int32)})
    with pytest.raises(FlowserveError, match="node 'check'"):
        await engine.infer("checked", {"x": np.array([-1], np.int32)})


async def test_metrics_after_traffic_are_exact(
    engine: flowserve.Engine,
    plane: DataPlane,
    metrics_of: Callable[[str], Any],
    value: Callable[..., float],
) -> None:
    await traffic(engine)
    listener = await start_metrics(plane, "127.0.0.1", 0)
    try:
        [(status, headers, text)] = await http_get(listener.port, "/metrics")
    finally:
        await listener.stop(1.0)
    assert status == "HTTP/1.1 200 OK"
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    m = metrics_of(text)

    def v(name: str, **labels: str) -> float:
        return value(m, name, **labels)

    fanout = {"model": "fanout", "version": "1"}
    assert v("nv_inference_request_success", **fanout) == 3
    assert v("nv_inference_count", **fanout) == 6  # rows: 3 requests x 2
    assert v("nv_inference_exec_count", **fanout) == 3
    assert v("nv_inference_pending_request_count", **fanout) == 0
    assert v("nv_inference_request_failure", **fanout, reason="OTHER") == 1
    for reason in ("REJECTED", "CANCELED", "BACKEND"):
        assert v("nv_inference_request_failure", **fanout, reason=reason) == 0
    assert v("nv_cache_num_hits_per_model", **fanout) == 0
    assert v("nv_cache_num_misses_per_model", **fanout) == 0
    assert v("nv_inference_request_duration_us", **fanout) > 0
    # the "simple" model ran once per fanout request (its step), with 2 rows each time
    simple = {"model": "simple", "version": "1"}
    assert v("nv_inference_request_success", **simple) == 3
    assert v("nv_inference_count", **simple) == 6
    assert v("nv_inference_exec_count", **simple) == 3

    def node(model: str, name: str, kind: str) -> dict[str, str]:
        return {"model": model, "version": "1", "node": name, "kind": kind}

    for name, kind in (("addsub", "model"), ("double_sum", "python"), ("triple_diff", "python")):
        assert v("flowserve_node_calls", **node("fanout", name, kind)) == 3
        assert v("flowserve_node_errors", **node("fanout", name, kind)) == 0
        assert v("flowserve_node_in_flight", **node("fanout", name, kind)) == 0
    assert v("flowserve_node_calls", **node("fanout", "join", "python")) == 3
    assert v("flowserve_node_calls", **node("route", "gate", "switch")) == 3
    assert v("flowserve_node_calls", **node("route", "shrink", "python")) == 2
    assert v("flowserve_node_skipped", **node("route", "shrink", "python")) == 1
    assert v("flowserve_node_calls", **node("route", "keep", "python")) == 1
    assert v("flowserve_node_skipped", **node("route", "keep", "python")) == 2
    # the failing node is named in the series; the request failed in a backend
    assert v("flowserve_node_calls", **node("checked", "check", "model")) == 2
    assert v("flowserve_node_errors", **node("checked", "check", "model")) == 1
    assert v("flowserve_node_errors", **node("checked", "echo", "python")) == 0
    assert v("nv_inference_request_failure", model="checked", version="1", reason="BACKEND") == 1
    assert v("nv_inference_request_success", model="checked", version="1") == 1
    assert v("nv_inference_request_failure", model="failing", version="1", reason="BACKEND") == 1
    # load state, with failures visible
    assert v("flowserve_model_state", model="fanout", version="1", state="READY") == 1
    assert v("flowserve_model_state", model="broken", version="1", state="UNAVAILABLE") == 1
    # Triton's counters keep their names: no _total, typed as counters
    assert "# TYPE nv_inference_request_success counter" in text
    assert "# TYPE nv_inference_pending_request_count gauge" in text
    assert "# TYPE flowserve_node_batch_size histogram" in text
    assert "_total{" not in text.split("# HELP process_")[0]


async def test_every_node_of_every_graph_has_series(
    engine: flowserve.Engine, plane: DataPlane, metrics_of: Callable[[str], Any]
) -> None:
    m = metrics_of(scrape(make_registry(plane, process=False)).decode())
    series = [dict(labels) for name, labels in m if name == "flowserve_node_calls"]
    calls = {f"{labels['model']}/{labels['node']}" for labels in series}
    expected = {f"{s.name}/{n.name}" for s in engine.registry.servables() for n in s.plan.nodes}
    assert calls == expected
    assert "fanout/join" in calls and "route/gate" in calls and "simple/simple" in calls
    kinds = {labels["kind"] for labels in series}
    assert {"model", "python", "switch", "backend"} <= kinds


async def test_durations_queue_and_batch_sizes_come_from_the_statistics(
    engine: flowserve.Engine,
    plane: DataPlane,
    metrics_of: Callable[[str], Any],
    value: Callable[..., float],
) -> None:
    fanout = engine.registry.get("fanout")
    s = fanout.stats
    s.success.add(5_500_999, 2)
    s.queue.add(1_000_000)
    s.record_execution(4, 1_000, 2_000_000, 3_000)
    s.cache_hit.add(7_000)
    join = fanout.plan.node("join").index
    ns = fanout.executor.stats[join]
    ns.total.add(42_000, 3)
    ns.queue.add(9_000, 3)
    for size in (1, 4, 4, 8, 3):
        ns.record_execution(size, 0, 1_000, 0)
    m = metrics_of(scrape(make_registry(plane, process=False)).decode())

    def v(name: str, **labels: str) -> float:
        return value(m, name, **labels)

    key = {"model": "fanout", "version": "1"}
    assert v("nv_inference_request_success", **key) == 2
    assert v("nv_inference_request_duration_us", **key) == 5500
    assert v("nv_inference_queue_duration_us", **key) == 1000
    assert v("nv_inference_compute_input_duration_us", **key) == 1
    assert v("nv_inference_compute_infer_duration_us", **key) == 2000
    assert v("nv_inference_compute_output_duration_us", **key) == 3
    assert v("nv_inference_count", **key) == 4
    assert v("nv_inference_exec_count", **key) == 1
    assert v("nv_cache_num_hits_per_model", **key) == 1
    assert v("nv_cache_hit_duration_per_model", **key) == 7
    n = {**key, "node": "join", "kind": "python"}
    assert v("flowserve_node_duration_us", **n) == 42
    assert v("flowserve_node_queue_duration_us", **n) == 9
    assert v("flowserve_node_compute_duration_us", **n) == 5
    assert v("flowserve_node_inference_count", **n) == 20
    assert v("flowserve_node_exec_count", **n) == 5
    buckets = {le: v("flowserve_node_batch_size_bucket", **n, le=le) for le in ("1", "2", "4", "8", "+Inf")}
    assert buckets == {"1": 1, "2": 1, "4": 4, "8": 5, "+Inf": 5}
    assert v("flowserve_node_batch_size_count", **n) == 5
    assert v("flowserve_node_batch_size_sum", **n) == 20


async def test_a_models_own_node_reports_the_models_executions(
    engine: flowserve.Engine,
    plane: DataPlane,
    metrics_of: Callable[[str], Any],
    value: Callable[..., float],
) -> None:
    for rows in (1, 3, 3):
        await engine.infer("simple", {"INPUT0": A[:1].repeat(rows, 0), "INPUT1": A[:1].repeat(rows, 0)})
    m = metrics_of(scrape(make_registry(plane, process=False)).decode())
    n = {"model": "simple", "version": "1", "node": "simple", "kind": "backend"}
    assert value(m, "flowserve_node_calls", **n) == 3
    assert (
        value(m, "flowserve_node_exec_count", **n)
        == value(m, "nv_inference_exec_count", model="simple", version="1")
        == 3
    )
    assert value(m, "flowserve_node_inference_count", **n) == 7
    assert value(m, "flowserve_node_batch_size_bucket", **n, le="1") == 1
    assert value(m, "flowserve_node_batch_size_bucket", **n, le="4") == 3


async def test_listener_keeps_alive_answers_404_and_stops(plane: DataPlane) -> None:
    listener = await start_metrics(plane, "127.0.0.1", 0)
    port = listener.port
    assert port > 0
    answers = await http_get(port, "/metrics", requests=2)
    assert [a[0] for a in answers] == ["HTTP/1.1 200 OK"] * 2
    [(status, _, body)] = await http_get(port, "/nope")
    assert status.startswith("HTTP/1.1 404") and "/metrics" in body
    await listener.stop(1.0)
    with pytest.raises(OSError):
        await http_get(port, "/metrics")


def test_failure_reasons_follow_triton() -> None:
    assert failure_reason(NodeError("g", "n", ValueError("boom"))) == "BACKEND"
    assert failure_reason(NodeError("g", "n", Unavailable("queue full"))) == "REJECTED"
    assert failure_reason(Unavailable("queue full")) == "REJECTED"
    assert failure_reason(asyncio.CancelledError()) == "CANCELED"
    assert failure_reason(Cancelled("client went away")) == "CANCELED"
    assert failure_reason(InvalidArgument("bad shape")) == "OTHER"
    assert failure_reason(None) == "OTHER"
    stats = ModelStats()
    stats.record_request(False, 10, NodeError("g", "n", RuntimeError("x")))
    stats.record_request(False, 5, Unavailable("queue full"))
    stats.record_request(True, 1)
    assert stats.fail_reasons == {"BACKEND": 1, "REJECTED": 1}
    assert stats.fail.count == 2 and stats.success.count == 1
    assert set(FAILURE_REASONS) == {"REJECTED", "CANCELED", "BACKEND", "OTHER"}


def test_exposition_format() -> None:
    from prometheus_client.metrics_core import Metric

    counter = Metric("nv_x", "doc with \\ and\nnewline", "counter")
    counter.add_sample("nv_x", {"model": 'a"b', "version": "1"}, 3.0)
    gauge = Metric("g", "gauge", "gauge")
    gauge.add_sample("g", {}, 0.25)
    assert exposition([counter, gauge]).decode() == (
        "# HELP nv_x doc with \\\\ and\\nnewline\n"
        "# TYPE nv_x counter\n"
        'nv_x{model="a\\"b",version="1"} 3\n'
        "# HELP g gauge\n"
        "# TYPE g gauge\n"
        "g 0.25\n"
    )


@pytest.mark.slow
async def test_flowserve_serve_exposes_metrics(server_factory: Any, metrics_of: Callable[[str], Any]) -> None:
    """The composition root starts the metrics listener: `flowserve serve` with only it on."""
    proc = server_factory.start(listeners="metrics")
    [(status, _, text)] = await http_get(proc.metrics_port, "/metrics")
    assert status == "HTTP/1.1 200 OK"
    m = metrics_of(text)
    assert m[("nv_inference_request_success", frozenset({("model", "fanout"), ("version", "1")}))] == 0
    labels = frozenset({("model", "fanout"), ("version", "1"), ("node", "join"), ("kind", "python")})
    assert m[("flowserve_node_calls", labels)] == 0
    assert proc.stop() == 0


def test_connections_and_buffered_bytes_are_exported(
    plane: DataPlane, metrics_of: Callable[[str], Any]
) -> None:
    """Open and refused connections per listener and the request byte budget (guard.py)."""
    guards = plane.guards
    guards.max_connections = 2
    http = guards.listener("http")
    assert http.admit() and http.admit() and not http.admit() and not http.admit()
    grpc = guards.listener("grpc")
    assert grpc.admit()
    grpc.release()
    assert guards.budget.take(1 << 20) and guards.budget.take(1 << 16)
    guards.budget.limit = 2 << 20
    assert not guards.budget.take(2 << 20)
    m = metrics_of(scrape(make_registry(plane, process=False)).decode())
    assert m[("flowserve_connections_open", frozenset({("listener", "http")}))] == 2
    assert m[("flowserve_connections_refused", frozenset({("listener", "http")}))] == 2
    assert m[("flowserve_connections_open", frozenset({("listener", "grpc")}))] == 0
    assert m[("flowserve_request_bytes_buffered", frozenset())] == (1 << 20) + (1 << 16)
    assert m[("flowserve_request_bytes_refused", frozenset())] == 1


def test_triton_series_list_their_labels_in_tritons_order() -> None:
    """prometheus-cpp keeps labels sorted: Triton prints {model,reason,version}; so does
    flowserve for its nv_* series (scrapers and dashboards matching Triton's text)."""
    from prometheus_client.metrics_core import Metric

    from flowserve.observability.metrics import exposition

    family = Metric("nv_inference_request_failure", "failures", "counter")
    family.add_sample("nv_inference_request_failure", {"model": "m", "version": "1", "reason": "BACKEND"}, 2)
    own = Metric("flowserve_node_calls", "calls", "counter")
    own.add_sample("flowserve_node_calls", {"model": "m", "version": "1", "node": "n"}, 3)
    text = exposition([family, own]).decode()
    assert 'nv_inference_request_failure{model="m",reason="BACKEND",version="1"} 2' in text
    assert 'flowserve_node_calls{model="m",version="1",node="n"} 3' in text
