"""Merging the workers' statistics and /metrics into one server's (flowserve/cluster/merge.py).

The real cases run two in-process engines over the bundled content with different traffic and
check that the merged answer is exactly the sum (or, for the rules' exceptions, the max/min) of
the two; small hand-written cases cover what the real texts do not show.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, Summary, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import flowserve
from flowserve.cluster.merge import METRIC_RULES, merge_metrics, merge_statistics, metric_rule
from flowserve.core.errors import InvalidArgument
from flowserve.dataplane.plane import DataPlane
from flowserve.observability.metrics import make_registry, scrape

ROOT = Path(__file__).resolve().parents[2]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    """Every sample of an exposition, read by prometheus_client's own parser (which names the
    samples of a counter ``<name>_total``)."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"sample twice: {key}"
            out[key] = s.value
    return out


def rules(text: str) -> dict[str, str]:
    """Sample name -> the merge rule of its family."""
    return {s.name: metric_rule(f.name) for f in text_string_to_metric_families(text) for s in f.samples}


def rows(n: int) -> np.ndarray:
    return np.arange(16 * n, dtype=np.int32).reshape(n, 16)


async def _worker_answers(traffic: list[tuple[str, dict[str, np.ndarray]]]) -> tuple[dict[str, Any], str]:
    engine = await flowserve.Engine.start(ROOT / "model_repository", ROOT / "graphs")
    try:
        plane = DataPlane(engine)
        for model, inputs in traffic:
            await engine.infer(model, inputs)
        with pytest.raises(InvalidArgument):  # one failed request per worker
            await engine.infer("fanout", {"a": rows(1)})
        return plane.statistics(), scrape(make_registry(plane)).decode()
    finally:
        await engine.stop()


@pytest.fixture(scope="module")
def workers() -> list[tuple[dict[str, Any], str]]:
    """Two workers' (statistics, /metrics text) after different traffic: worker 0 serves
    3 fanout requests of 2 rows and one route request; worker 1 two fanout requests of 1 row
    and three route requests."""
    w0 = [("fanout", {"a": rows(2), "b": rows(2)})] * 3 + [("route", {"x": np.array([500.0], np.float32)})]
    w1 = [("fanout", {"a": rows(1), "b": rows(1)})] * 2 + [
        ("route", {"x": np.array(x, np.float32)}) for x in ([1.0], [200.0, 1.0], [2.0])
    ]

    async def both() -> list[tuple[dict[str, Any], str]]:
        return [await _worker_answers(w0), await _worker_answers(w1)]

    return asyncio.run(both())


# ----------------------------------------------------------------------------- statistics, real


def _by_model(stats: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m["name"], m["version"]): m for m in stats["model_stats"]}


def _numbers(obj: Any, path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], int]:
    """Every number of a statistics entry by its path (batch_stats entries by batch size)."""
    out: dict[tuple[Any, ...], int] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_numbers(v, (*path, k)))
    elif isinstance(obj, list):
        for e in obj:
            out.update(_numbers({k: v for k, v in e.items() if k != "batch_size"}, (*path, e["batch_size"])))
    elif isinstance(obj, int):
        out[path] = obj
    return out


def test_statistics_of_two_engines_are_the_exact_sums(workers: list[tuple[dict[str, Any], str]]) -> None:
    parts = [stats for stats, _ in workers]
    before = copy.deepcopy(parts)
    merged = merge_statistics(parts)
    assert parts == before  # the parts are not modified

    a, b, m = (_by_model(s) for s in (*parts, merged))
    assert list(m) == list(a)  # same models, same order (metadata.py sorts them)
    fanout = m[("fanout", "1")]
    assert fanout["inference_stats"]["success"]["count"] == 5
    assert fanout["inference_stats"]["fail"]["count"] == 2
    assert fanout["inference_count"] == 3 * 2 + 2 * 1
    assert fanout["execution_count"] == 5
    assert [e["batch_size"] for e in fanout["batch_stats"]] == [1, 2]
    assert [e["compute_infer"]["count"] for e in fanout["batch_stats"]] == [2, 3]
    assert m[("route", "1")]["inference_stats"]["success"]["count"] == 4
    for ident, entry in m.items():
        x, y = _numbers(a[ident]), _numbers(b[ident])
        got = _numbers(entry)
        assert set(got) == set(x) | set(y)
        for path, value in got.items():
            if path == ("last_inference",):
                assert value == max(x[path], y[path])
            else:
                assert value == x.get(path, 0) + y.get(path, 0), (ident, path)
        assert (entry["name"], entry["version"]) == ident
        assert list(entry) == list(a[ident])  # the keys keep metadata.py's order


# ----------------------------------------------------------------------------- statistics, by hand


def _entry(name: str, **over: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "version": "1",
        "last_inference": 0,
        "inference_count": 0,
        "execution_count": 0,
        "inference_stats": {"success": {"count": 0, "ns": 0}, "fail": {"count": 0, "ns": 0}},
        "response_stats": {},
        "batch_stats": [],
        "memory_usage": [],
    }
    entry.update(over)
    return entry


def test_statistics_rules_by_hand() -> None:
    d = {"count": 1, "ns": 10}
    p1 = {
        "model_stats": [
            _entry(
                "a",
                last_inference=500,
                inference_count=4,
                inference_stats={"success": {"count": 2, "ns": 100}, "fail": {"count": 0, "ns": 0}},
                batch_stats=[{"batch_size": 4, "compute_infer": d}],
                memory_usage=[{"type": "CPU", "id": 0, "byte_size": 100}],
                response_stats={"0": {"compute_infer": d}},
                extra={"note": "first", "n": 1, "tags": ["x"]},
            ),
            _entry("only_in_1", inference_count=7),
        ]
    }
    p2 = {
        "model_stats": [
            _entry("only_in_2", inference_count=3),
            _entry(
                "a",
                last_inference=400,
                inference_count=1,
                inference_stats={"success": {"count": 1, "ns": 5}, "fail": {"count": 1, "ns": 7}},
                batch_stats=[{"batch_size": 8, "compute_infer": d}, {"batch_size": 1, "compute_infer": d}],
                memory_usage=[
                    {"type": "CPU", "id": 0, "byte_size": 50},
                    {"type": "GPU", "id": 0, "byte_size": 9},
                ],
                response_stats={"0": {"compute_infer": d}, "1": {"compute_infer": d}},
                extra={"note": "second", "n": 2, "tags": ["y"], "new": 5},
            ),
        ]
    }
    merged = merge_statistics([p1, p2])
    assert [(m["name"], m["version"]) for m in merged["model_stats"]] == [
        ("a", "1"),
        ("only_in_1", "1"),
        ("only_in_2", "1"),
    ]
    a, only1, only2 = merged["model_stats"]
    assert a["last_inference"] == 500  # max, not a sum
    assert a["inference_count"] == 5
    assert a["inference_stats"] == {"success": {"count": 3, "ns": 105}, "fail": {"count": 1, "ns": 7}}
    assert a["batch_stats"] == [
        {"batch_size": 1, "compute_infer": d},
        {"batch_size": 4, "compute_infer": d},
        {"batch_size": 8, "compute_infer": d},
    ]
    assert a["memory_usage"] == [
        {"type": "CPU", "id": 0, "byte_size": 150},
        {"type": "GPU", "id": 0, "byte_size": 9},
    ]
    assert a["response_stats"] == {"0": {"compute_infer": {"count": 2, "ns": 20}}, "1": {"compute_infer": d}}
    assert a["extra"] == {"note": "first", "n": 3, "tags": ["x"], "new": 5}
    assert only1["inference_count"] == 7 and only2["inference_count"] == 3
    # results own their data: changing them leaves the parts alone
    a["batch_stats"][0]["compute_infer"]["count"] = 99
    only2["inference_count"] = 99
    assert d == {"count": 1, "ns": 10} and p2["model_stats"][0]["inference_count"] == 3

    assert merge_statistics([]) == {"model_stats": []}
    assert merge_statistics([p1]) == p1
    # same batch size in both: summed
    same = {"model_stats": [_entry("a", batch_stats=[{"batch_size": 2, "compute_infer": d}])]}
    assert merge_statistics([same, same, same])["model_stats"][0]["batch_stats"] == [
        {"batch_size": 2, "compute_infer": {"count": 3, "ns": 30}}
    ]


def test_statistics_versions_are_separate_entries() -> None:
    v1 = _entry("m", inference_count=1)
    v2 = _entry("m", version="2", inference_count=10)
    merged = merge_statistics([{"model_stats": [v1]}, {"model_stats": [v2, v1]}])
    assert [(m["version"], m["inference_count"]) for m in merged["model_stats"]] == [("1", 2), ("2", 10)]


# ----------------------------------------------------------------------------- metrics, real


def test_metrics_of_two_engines(workers: list[tuple[dict[str, Any], str]]) -> None:
    texts = [text for _, text in workers]
    merged = merge_metrics(texts)
    a, b, m = (samples(t) for t in (*texts, merged))
    assert set(m) == set(a) | set(b)
    families = [f.name for f in text_string_to_metric_families(merged)]
    assert families == [f.name for f in text_string_to_metric_families(texts[0])]  # same order
    rule_of = rules(merged)
    for key, value in m.items():
        rule = rule_of[key[0]]
        if rule == "max":
            assert value == max(a.get(key, value), b.get(key, value)), key
        elif rule == "min":
            assert value == min(a.get(key, value), b.get(key, value)), key
        else:
            assert value == a.get(key, 0) + b.get(key, 0), key

    def v(name: str, **labels: str) -> float:
        return m[(name, frozenset(labels.items()))]

    fanout = {"model": "fanout", "version": "1"}
    assert v("nv_inference_request_success_total", **fanout) == 5
    assert v("nv_inference_count_total", **fanout) == 8
    assert v("nv_inference_request_failure_total", **fanout, reason="OTHER") == 2
    assert v("nv_inference_request_success_total", model="route", version="1") == 4
    # one state per model version, not one per worker
    assert v("flowserve_model_state", model="fanout", version="1", state="READY") == 1
    assert v("process_max_fds") == samples(texts[0])[("process_max_fds", frozenset())]
    # the same process served both texts: its cpu seconds add up, its start time does not
    assert v("process_start_time_seconds") == min(
        s[("process_start_time_seconds", frozenset())] for s in (a, b)
    )
    # histogram: the batch sizes of model simple's executions (fanout runs it), 3 of 2 rows in
    # worker 0, 2 of 1 row in worker 1
    simple = {"model": "simple", "version": "1", "node": "simple", "kind": "backend"}
    assert v("flowserve_node_batch_size_bucket", **simple, le="1") == 2
    assert v("flowserve_node_batch_size_bucket", **simple, le="2") == 5
    assert v("flowserve_node_batch_size_bucket", **simple, le="+Inf") == 5
    assert v("flowserve_node_batch_size_count", **simple) == 5
    assert v("flowserve_node_batch_size_sum", **simple) == 3 * 2 + 2 * 1
    # integers are written as integers, as flowserve's exposition writes them
    assert 'nv_inference_request_success{model="fanout",version="1"} 5\n' in merged
    # merging one text gives it back unchanged
    assert merge_metrics(texts[:1]) == texts[0]


# ----------------------------------------------------------------------------- metrics, by hand

HIST_A = """\
# HELP lat Latency.
# TYPE lat histogram
lat_bucket{model="m",le="0.5"} 1
lat_bucket{model="m",le="1.0"} 3
lat_bucket{model="m",le="+Inf"} 4
lat_sum{model="m"} 2.5
lat_count{model="m"} 4
# HELP only_a Only in the first text.
# TYPE only_a counter
only_a 7
"""

HIST_B = """\
# HELP lat Latency (second spelling, ignored).
# TYPE lat histogram
lat_bucket{le="0.5",model="m"} 0
lat_bucket{le="1",model="m"} 2
lat_bucket{le="+Inf",model="m"} 2
lat_sum{model="m"} 1.25
lat_count{model="m"} 2
# HELP only_b Only in the second text.
# TYPE only_b gauge
only_b{x="1"} 1.5 1700000000000
"""


def test_histograms_label_order_and_families_of_one_text() -> None:
    merged = merge_metrics([HIST_A, HIST_B])
    assert merged == (
        "# HELP lat Latency.\n"
        "# TYPE lat histogram\n"
        'lat_bucket{model="m",le="0.5"} 1\n'
        'lat_bucket{model="m",le="1.0"} 5\n'
        'lat_bucket{model="m",le="+Inf"} 6\n'
        'lat_sum{model="m"} 3.75\n'
        'lat_count{model="m"} 6\n'
        "# HELP only_a Only in the first text.\n"
        "# TYPE only_a counter\n"
        "only_a 7\n"
        "# HELP only_b Only in the second text.\n"
        "# TYPE only_b gauge\n"
        'only_b{x="1"} 1.5\n'  # timestamp dropped
    )
    assert merge_metrics([]) == ""
    assert merge_metrics(["", "\n"]) == ""


def test_max_rules_and_tricky_labels() -> None:
    def text(gpu: float, state: int, reqs: int) -> str:
        return (
            "# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)\n"
            "# TYPE nv_gpu_utilization gauge\n"
            f'nv_gpu_utilization{{gpu_uuid="GPU-1"}} {gpu}\n'
            "# HELP flowserve_model_state Load state of each model version\n"
            "# TYPE flowserve_model_state gauge\n"
            f'flowserve_model_state{{model="m",state="READY",version="1"}} {state}\n'
            "# HELP python_info Python platform information\n"
            "# TYPE python_info gauge\n"
            'python_info{implementation="CPython",major="3"} 1.0\n'
            "# HELP nv_energy_consumption GPU energy consumption in joules since start\n"
            "# TYPE nv_energy_consumption counter\n"
            f'nv_energy_consumption{{gpu_uuid="GPU-1"}} {gpu * 1000}\n'
            "# TYPE reqs counter\n"
            f'reqs{{path="a,b}} \\"q\\" \\\\ end",model="m"}} {reqs}\n'
        )

    merged = merge_metrics([text(0.25, 1, 3), text(0.75, 1, 4), text(0.5, 1, 5)])
    m = samples(merged)
    assert m[("nv_gpu_utilization", frozenset({("gpu_uuid", "GPU-1")}))] == 0.75
    assert m[("nv_energy_consumption_total", frozenset({("gpu_uuid", "GPU-1")}))] == 750.0
    assert (
        m[("flowserve_model_state", frozenset({("model", "m"), ("state", "READY"), ("version", "1")}))] == 1
    )
    assert m[("python_info", frozenset({("implementation", "CPython"), ("major", "3")}))] == 1.0
    assert m[("reqs_total", frozenset({("path", 'a,b} "q" \\ end'), ("model", "m")}))] == 12
    assert 'nv_gpu_utilization{gpu_uuid="GPU-1"} 0.75\n' in merged  # the max, as written
    assert 'python_info{implementation="CPython",major="3"} 1.0\n' in merged
    assert merged.count("# TYPE") == 5 and merged.count("# HELP") == 4


def test_rule_table() -> None:
    assert metric_rule("flowserve_model_state") == "max"
    assert metric_rule("nv_gpu_memory_used_bytes") == "max"
    assert metric_rule("nv_cpu_utilization") == "max"
    assert metric_rule("nv_energy_consumption") == "max"
    assert metric_rule("python_info") == "max"
    assert metric_rule("nv_inference_pending_request_count") == "sum"
    assert metric_rule("flowserve_node_in_flight") == "sum"
    assert metric_rule("process_cpu_seconds_total") == "sum"
    assert all(rule in ("max", "min") for _, rule in METRIC_RULES)


def test_prometheus_client_exposition() -> None:
    """Texts as prometheus_client writes them (generate_latest: '_total', '_created', floats,
    summaries, info) merge into a text it parses, with the same rules."""

    def text(n: int) -> str:
        registry = CollectorRegistry()
        Counter("jobs", "Jobs done", ["queue"], registry=registry).labels("q").inc(n)
        Gauge("temp", "A gauge", registry=registry).set(n / 4)
        h = Histogram("size", "Sizes", buckets=(1, 10), registry=registry)
        s = Summary("wait", "Waits", registry=registry)
        Info("build", "Build", registry=registry).info({"version": "1.2"})
        for i in range(n):
            h.observe(i)
            s.observe(0.5)
        return generate_latest(registry).decode()

    one, two = text(3), text(12)
    merged = merge_metrics([one, two])
    m, a, b = samples(merged), samples(one), samples(two)
    assert set(m) == set(a)

    def v(name: str, **labels: str) -> float:
        return m[(name, frozenset(labels.items()))]

    assert v("jobs_total", queue="q") == 15.0
    assert v("temp") == 3.75
    assert v("size_bucket", le="1.0") == 2.0 + 2.0
    assert v("size_bucket", le="10.0") == 3.0 + 11.0
    assert v("size_bucket", le="+Inf") == v("size_count") == 15.0
    assert v("size_sum") == sum(range(3)) + sum(range(12))
    assert v("wait_count") == 15.0 and v("wait_sum") == 7.5
    assert v("build_info", version="1.2") == 1.0
    created = ("jobs_created", frozenset({("queue", "q")}))
    assert m[created] == min(a[created], b[created])
    assert 'jobs_total{queue="q"} 15.0\n' in merged  # floats stay floats


def test_many_large_texts_merge_exactly(workers: list[tuple[dict[str, Any], str]]) -> None:
    """64 workers' texts (a real exposition each): every count is 64 times the worker's."""
    text = workers[0][1]
    merged = samples(merge_metrics([text] * 64))
    rule_of = rules(text)
    for key, value in samples(text).items():
        expected = value if rule_of[key[0]] != "sum" else 64 * value
        assert merged[key] == pytest.approx(expected, rel=1e-12), key
