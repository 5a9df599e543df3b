"""flowserve bench against a real server (HTTP and gRPC, one and two client processes, an open
loop), in-process, and through the command line (--json, errors that name the model)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from flowserve.bench import BenchOptions, Level, bench, levels
from flowserve.bench.http import RequestFailed
from tests.conftest import BUNDLED_GRAPHS, BUNDLED_REPOSITORY, ROOT, ServerProcess, start_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served() -> Iterator[ServerProcess]:
    server = start_server(repositories=(BUNDLED_REPOSITORY,), graphs=(BUNDLED_GRAPHS,))
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_closed_loop_over_each_protocol(served: ServerProcess, protocol: str) -> None:
    url = served.http_url if protocol == "http" else served.grpc_url
    options = BenchOptions("simple", protocol, url, levels=levels([1, 4]), duration_s=0.5, warmup_s=0.2)
    results = bench(options)
    assert [r.concurrency for r in results] == [1, 4]
    for r in results:
        assert r.requests > 0 and r.errors == 0 and r.throughput > 0
        assert 0 < r.p50_ms <= r.p90_ms <= r.p99_ms <= r.max_ms


def test_a_graph_over_two_processes_and_an_open_loop(served: ServerProcess) -> None:
    options = BenchOptions(
        "fanout", "http", served.http_url, levels=(Level(concurrency=4), Level(rate=100.0, poisson=True)),
        duration_s=0.6, warmup_s=0.2, batch_size=2, processes=2,
    )  # fmt: skip
    closed, opened = bench(options)
    assert closed.requests > 0 and closed.errors == 0 and closed.batch_size == 2
    assert opened.rate == 100.0 and opened.errors == 0
    assert 20 <= opened.requests <= 120  # about 60 due in the window


def test_errors_name_the_model(served: ServerProcess) -> None:
    with pytest.raises(RequestFailed, match="nosuch"):
        bench(BenchOptions("nosuch", "http", served.http_url, duration_s=0.2, warmup_s=0))
    with pytest.raises(RequestFailed, match=r"'repeat' is decoupled"):
        bench(BenchOptions("repeat", "grpc", served.grpc_url, duration_s=0.2, warmup_s=0))


def test_in_process() -> None:
    options = BenchOptions(
        "simple", "inprocess", levels=levels([2]), duration_s=0.3, warmup_s=0.1,
        repositories=(BUNDLED_REPOSITORY,),
    )  # fmt: skip
    [result] = bench(options)
    assert result.requests > 0 and result.errors == 0


def test_command_line_json(served: ServerProcess) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "flowserve.cli", "bench", "simple", "-i", "grpc", "-u", served.grpc_url,
         "-c", "2", "-d", "0.4", "--warmup", "0.1", "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [level] = json.loads(done.stdout)
    assert (
        level["concurrency"] == 2 and level["requests"] > 0 and {"p50_ms", "p90_ms", "p99_ms"} <= set(level)
    )
    done = subprocess.run(
        [sys.executable, "-m", "flowserve.cli", "bench", "simple", "-u", served.http_url, "--shape", "INPUT0"],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and "--shape 'INPUT0': expected NAME:D1" in done.stderr
