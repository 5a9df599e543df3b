"""Prometheus metrics on the metrics port (GET /metrics), read from the statistics at scrape time.

Nothing is counted on the request path for this: :class:`EngineCollector` walks the registry's
servables when Prometheus scrapes and turns their cumulative statistics into series, with
Triton's names and labels (``model``, ``version``; ``reason`` on failures) so Triton dashboards
work unchanged, plus flowserve's series for every node of every graph (labels ``model``,
``version``, ``node``, ``kind``)::

    nv_inference_request_success{model="fanout",version="1"} 3
    flowserve_node_calls{model="fanout",version="1",node="join",kind="python"} 3

Counters keep Triton's names (no ``_total`` suffix) and durations are microseconds, as in
Triton. The exposition is Prometheus' text format 0.0.4.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry

from flowserve.dataplane.plane import DataPlane
from flowserve.graph.plan import PlanNode
from flowserve.nodes.backends.pb_utils import custom_metrics
from flowserve.nodes.split import SplitNode
from flowserve.observability.gpu_metrics import GpuCollector
from flowserve.observability.httpserver import ASGIApp, AsgiListener, Receive, Scope, Send
from flowserve.observability.snapshot import bytes_copied, node_exec
from flowserve.runtime.servable import Servable
from flowserve.runtime.stats import FAILURE_REASONS, Duration, NodeStats
from flowserve.spec.schema import SplitTarget

MODEL_LABELS = ("model", "version")
NODE_LABELS = ("model", "version", "node", "kind")
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


def _us(d: Duration) -> int:
    return d.ns // 1000


class _Family:
    """One metric family being filled: a name, a type, label names, samples."""

    def __init__(self, name: str, doc: str, typ: str, labels: tuple[str, ...]) -> None:
        self.metric = Metric(name, doc, typ)
        self.name = name
        self.labels = labels

    def add(self, values: tuple[str, ...], value: float, suffix: str = "", **extra: str) -> None:
        labels = dict(zip(self.labels, values, strict=True))
        labels.update(extra)
        self.metric.add_sample(self.name + suffix, labels, value)


def _model_families() -> dict[str, _Family]:
    spec = [
        ("nv_inference_request_success", "counter", "Number of successful inference requests"),
        ("nv_inference_count", "counter", "Number of inferences performed (each batch element counts)"),
        ("nv_inference_exec_count", "counter", "Number of model executions performed"),
        ("nv_inference_request_duration_us", "counter", "Cumulative inference request duration in us"),
        ("nv_inference_queue_duration_us", "counter", "Cumulative inference queuing duration in us"),
        (
            "nv_inference_compute_input_duration_us",
            "counter",
            "Cumulative compute input duration in us",
        ),
        (
            "nv_inference_compute_infer_duration_us",
            "counter",
            "Cumulative compute inference duration in us",
        ),
        (
            "nv_inference_compute_output_duration_us",
            "counter",
            "Cumulative inference compute output duration in us",
        ),
        ("nv_inference_pending_request_count", "gauge", "Instantaneous number of pending requests"),
        ("nv_cache_num_hits_per_model", "counter", "Number of cache hits per model"),
        ("nv_cache_num_misses_per_model", "counter", "Number of cache misses per model"),
        ("nv_cache_hit_duration_per_model", "counter", "Total cache hit duration per model in us"),
        ("nv_cache_miss_duration_per_model", "counter", "Total cache miss duration per model in us"),
    ]
    families = {name: _Family(name, doc, typ, MODEL_LABELS) for name, typ, doc in spec}
    families["nv_inference_request_failure"] = _Family(
        "nv_inference_request_failure",
        "Number of failed inference requests, all batch sizes",
        "counter",
        MODEL_LABELS,
    )
    return families


def _node_families() -> dict[str, _Family]:
    spec = [
        ("flowserve_node_calls", "counter", "Number of times a node of a graph was started"),
        ("flowserve_node_errors", "counter", "Number of node runs that failed"),
        ("flowserve_node_skipped", "counter", "Number of requests for which the node was skipped (branch)"),
        ("flowserve_node_in_flight", "gauge", "Tokens inside the node now"),
        ("flowserve_node_duration_us", "counter", "Cumulative time tokens spent in the node in us"),
        ("flowserve_node_queue_duration_us", "counter", "Cumulative queuing time in the node in us"),
        ("flowserve_node_compute_duration_us", "counter", "Cumulative compute time of the node in us"),
        ("flowserve_node_inference_count", "counter", "Rows (batch elements) the node computed"),
        ("flowserve_node_exec_count", "counter", "Executions (batches) the node ran"),
        (
            "flowserve_node_bytes_copied",
            "counter",
            "Bytes the node copied to hand tensors on (device <-> host, batch merges)",
        ),
    ]
    families = {name: _Family(name, doc, typ, NODE_LABELS) for name, typ, doc in spec}
    families["flowserve_node_batch_size"] = _Family(
        "flowserve_node_batch_size",
        "Executions of the node by batch size (rows per execution)",
        "histogram",
        NODE_LABELS,
    )
    return families


SPLIT_LABELS = ("model", "version", "node", "arm", "target")
SHADOW_LABELS = ("model", "version", "node", "target")


def _split_families() -> dict[str, _Family]:
    spec = [
        ("flowserve_split_requests", "counter", SPLIT_LABELS, "Requests a split node sent to each arm"),
        ("flowserve_split_errors", "counter", SPLIT_LABELS, "Requests of each arm that failed"),
        (
            "flowserve_split_duration_us",
            "counter",
            SPLIT_LABELS,
            "Cumulative time of each arm's requests in us",
        ),
        ("flowserve_split_weight", "gauge", SPLIT_LABELS, "Current weight of each arm"),
        ("flowserve_shadow_requests", "counter", SHADOW_LABELS, "Copies a split node sent to its shadow"),
        (
            "flowserve_shadow_errors",
            "counter",
            SHADOW_LABELS,
            "Shadow copies that failed (never seen by clients)",
        ),
        ("flowserve_shadow_dropped", "counter", SHADOW_LABELS, "Copies not sent: max_in_flight were running"),
        (
            "flowserve_shadow_duration_us",
            "counter",
            SHADOW_LABELS,
            "Cumulative time of the shadow's requests in us",
        ),
    ]
    return {name: _Family(name, doc, typ, labels) for name, typ, labels, doc in spec}


def _split(servable: Servable, node: SplitNode, f: dict[str, _Family]) -> None:
    base = (servable.name, str(servable.version), node.name)
    for arm, weight, stats in zip(node.arms, node.weights, node.arm_stats, strict=True):
        key = (*base, arm.name, _target_label(arm.target))
        f["flowserve_split_requests"].add(key, stats.calls)
        f["flowserve_split_errors"].add(key, stats.errors)
        f["flowserve_split_duration_us"].add(key, _us(stats.duration))
        f["flowserve_split_weight"].add(key, weight)
    if node.shadow is not None:
        where = (*base, _target_label(node.shadow.spec.target))
        shadow = node.shadow.stats
        f["flowserve_shadow_requests"].add(where, shadow.calls)
        f["flowserve_shadow_errors"].add(where, shadow.errors)
        f["flowserve_shadow_dropped"].add(where, shadow.dropped)
        f["flowserve_shadow_duration_us"].add(where, _us(shadow.duration))


def _target_label(target: SplitTarget) -> str:
    return f"{target.target}:{target.version}" if target.version else target.target


def _custom() -> Iterator[Metric]:
    """The custom metric families Python models made (``pb_utils.MetricFamily``), as Triton
    exports them: their own names, kinds and labels."""
    for name, doc, typ, samples in custom_metrics():
        metric = Metric(name, doc, typ)
        for sample, labels, value in samples:
            metric.add_sample(sample, labels, value)
        yield metric


class EngineCollector:
    """A prometheus-client collector over a data plane's engine, read at scrape time."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    def collect(self) -> Iterator[Metric]:
        servables = self.plane.servables()
        models = _model_families()
        nodes = _node_families()
        splits = _split_families()
        for servable in servables:
            self._model(servable, models)
            for plan_node, stats in zip(servable.plan.nodes, servable.executor.stats, strict=True):
                self._node(servable, plan_node, stats, nodes)
            for node in servable.executor.nodes:
                if isinstance(node, SplitNode):
                    _split(servable, node, splits)
        state = _Family("flowserve_model_state", "Load state of each model version", "gauge", ())
        for status in self.plane.model_states():
            state.add((), 1, model=status.name, version=status.version, state=status.state.value)
        for family in (*models.values(), state, *nodes.values(), *splits.values(), *self._guards()):
            yield family.metric
        yield from self._workers()
        yield from _custom()

    def _workers(self) -> Iterator[Metric]:
        """With several workers: how many there are, how many are up, and how often one was
        restarted (the supervisor's numbers; the same in every worker)."""
        peers = self.plane.peers
        if peers is None:
            return
        status = peers.status()
        workers = _Family(
            "flowserve_workers", "Worker processes of this server, by state", "gauge", ("state",)
        )
        workers.add(("configured",), status["workers"])
        workers.add(("up",), status["up"])
        yield workers.metric
        restarts = _Family(
            "flowserve_worker_restarts", "Worker processes restarted after they ended", "counter", ()
        )
        restarts.add((), status["restarts"], "_total")
        yield restarts.metric

    def _guards(self) -> tuple[_Family, ...]:
        """Open, refused and evicted connections per listener, the budget of buffered request
        bytes and the unsent response bytes (dataplane/guard.py)."""
        guards = self.plane.guards
        open_ = _Family("flowserve_connections_open", "Open connections per listener", "gauge", ("listener",))
        refused = _Family(
            "flowserve_connections_refused",
            "Connections closed at once because the listener (or the client's address) was at "
            "--max-connections (--max-connections-per-peer) with none idle to evict",
            "counter",
            ("listener",),
        )
        evicted = _Family(
            "flowserve_connections_evicted",
            "Idle connections closed to make room for new ones at --max-connections "
            "(--max-connections-per-peer)",
            "counter",
            ("listener",),
        )
        for name, guard in sorted(guards.listeners.items()):
            open_.add((name,), guard.open)
            refused.add((name,), guard.refused)
            evicted.add((name,), guard.evicted)
        budget = guards.budget
        held = _Family(
            "flowserve_request_bytes_buffered", "Request bytes held in memory, all listeners", "gauge", ()
        )
        held.add((), budget.in_use)
        over = _Family(
            "flowserve_request_bytes_refused",
            "Requests refused because they did not fit --max-buffered-request-bytes",
            "counter",
            (),
        )
        over.add((), budget.refused)
        unsent = _Family(
            "flowserve_response_bytes_unsent",
            "Response bytes written but not yet taken by their clients, all listeners "
            "(--max-unsent-response-bytes)",
            "gauge",
            (),
        )
        unsent.add((), guards.unsent.in_use)
        return open_, refused, evicted, held, over, unsent

    @staticmethod
    def _model(servable: Servable, f: dict[str, _Family]) -> None:
        s = servable.stats
        key = (servable.name, str(servable.version))
        f["nv_inference_request_success"].add(key, s.success.count)
        for reason in FAILURE_REASONS:
            f["nv_inference_request_failure"].add(key, s.fail_reasons.get(reason, 0), reason=reason)
        f["nv_inference_count"].add(key, s.inference_count)
        f["nv_inference_exec_count"].add(key, s.execution_count)
        f["nv_inference_request_duration_us"].add(key, _us(s.success))
        f["nv_inference_queue_duration_us"].add(key, _us(s.queue))
        f["nv_inference_compute_input_duration_us"].add(key, _us(s.compute_input))
        f["nv_inference_compute_infer_duration_us"].add(key, _us(s.compute_infer))
        f["nv_inference_compute_output_duration_us"].add(key, _us(s.compute_output))
        f["nv_inference_pending_request_count"].add(key, s.pending)
        f["nv_cache_num_hits_per_model"].add(key, s.cache_hit.count)
        f["nv_cache_num_misses_per_model"].add(key, s.cache_miss.count)
        f["nv_cache_hit_duration_per_model"].add(key, _us(s.cache_hit))
        f["nv_cache_miss_duration_per_model"].add(key, _us(s.cache_miss))

    @staticmethod
    def _node(servable: Servable, node: PlanNode, stats: NodeStats, f: dict[str, _Family]) -> None:
        key = (servable.name, str(servable.version), node.name, node.spec.kind)
        ex = node_exec(servable, node, stats)
        f["flowserve_node_calls"].add(key, stats.calls)
        f["flowserve_node_errors"].add(key, stats.errors)
        f["flowserve_node_skipped"].add(key, stats.skipped)
        f["flowserve_node_in_flight"].add(key, stats.in_flight)
        f["flowserve_node_duration_us"].add(key, _us(stats.total))
        f["flowserve_node_queue_duration_us"].add(key, _us(ex.queue))
        compute = ex.compute_input.ns + ex.compute_infer.ns + ex.compute_output.ns
        f["flowserve_node_compute_duration_us"].add(key, compute // 1000)
        f["flowserve_node_inference_count"].add(key, ex.inference_count)
        f["flowserve_node_exec_count"].add(key, ex.execution_count)
        f["flowserve_node_bytes_copied"].add(key, bytes_copied(servable, node, stats))
        hist = f["flowserve_node_batch_size"]
        executions = {size: b.compute_infer.count for size, b in ex.batches.items()}
        for bound in BATCH_BUCKETS:
            count = sum(n for size, n in executions.items() if size <= bound)
            hist.add(key, count, "_bucket", le=str(bound))
        hist.add(key, sum(executions.values()), "_bucket", le="+Inf")
        hist.add(key, sum(executions.values()), "_count")
        hist.add(key, sum(size * n for size, n in executions.items()), "_sum")


# ----------------------------------------------------------------------------- exposition


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(v: float) -> str:
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == int(v) and abs(v) < 2**53:
        return str(int(v))
    return repr(float(v))


_TYPES = {"unknown": "untyped", "info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram"}


def exposition(metrics: Iterable[Metric]) -> bytes:
    """Prometheus text format 0.0.4, keeping each family's own sample names (Triton's counters
    have no ``_total``), integers without ``.0``. Labels: Triton's ``nv_*`` series in Triton's
    order (alphabetical: prometheus-cpp keeps labels in a sorted map, so dashboards and scrapers
    matching Triton's lines see the same text, e.g. ``{model=..,reason=..,version=..}``), the
    others model and version first."""
    out: list[str] = []
    for metric in metrics:
        name = metric.name
        if metric.type == "counter" and any(s.name == name + "_total" for s in metric.samples):
            name += "_total"
        doc = metric.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {name} {doc}")
        out.append(f"# TYPE {name} {_TYPES.get(metric.type, metric.type)}")
        triton = name.startswith("nv_")
        for s in metric.samples:
            if s.name.endswith("_created"):
                continue
            items = sorted(s.labels.items()) if triton else s.labels.items()
            labels = ",".join(f'{k}="{_escape_label(str(v))}"' for k, v in items)
            out.append(f"{s.name}{{{labels}}} {_value(s.value)}" if labels else f"{s.name} {_value(s.value)}")
    return ("\n".join(out) + "\n").encode()


def make_registry(plane: DataPlane, process: bool = True) -> CollectorRegistry:
    """A prometheus-client registry holding the engine collector (and the process collector)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(plane))
    registry.register(GpuCollector())  # Triton's nv_gpu_* series where NVML sees a GPU, else none
    if process:
        from prometheus_client import ProcessCollector

        ProcessCollector(registry=registry)
    return registry


def scrape(registry: CollectorRegistry) -> bytes:
    return exposition(registry.collect())


def make_metrics_app(plane: DataPlane, process: bool = True) -> ASGIApp:
    """A raw ASGI app answering GET /metrics (and / with a pointer to it)."""
    registry = make_registry(plane, process)
    peers = plane.peers
    if peers is not None:  # with several workers: this worker's share, for the merged whole
        peers.serve_local("metrics", lambda _: scrape(registry).decode())

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if scope["method"] not in ("GET", "HEAD"):
            status, ctype, body = 405, b"text/plain", b"method not allowed\n"
        elif path == "/metrics":
            # the whole server: with several workers, every worker's metrics merged
            body = scrape(registry) if peers is None else (await peers.metrics()).encode()
            status, ctype = 200, CONTENT_TYPE
        elif path == "/":
            status, ctype, body = 200, b"text/plain", b"flowserve metrics: GET /metrics\n"
        else:
            status, ctype, body = 404, b"text/plain", b"not found (metrics are at /metrics)\n"
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", ctype)]})
        await send({"type": "http.response.body", "body": body})

    return app


class MetricsListener(AsgiListener):
    """The metrics port (``port``, ``stop(grace_s)``), as the composition root lists it."""


async def start_metrics(plane: DataPlane, host: str, port: int, reuse_port: bool = False) -> MetricsListener:
    """Serve /metrics on (host, port) until ``listener.stop(grace_s)``; port 0 picks one;
    ``reuse_port``: the workers of one server share the port."""
    listener = MetricsListener(make_metrics_app(plane), guard=plane.guards.listener("metrics"))
    await listener.start(host, port, reuse_port)
    return listener


__all__ = [
    "EngineCollector",
    "MetricsListener",
    "exposition",
    "make_metrics_app",
    "make_registry",
    "scrape",
    "start_metrics",
]
