"""``--cpu-affinity spread``: each worker held to its own share of the cores
(``flowserve/cluster/affinity.py``), and ONNX Runtime's pool sized to a process's CPUs."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from flowserve.cluster import affinity
from flowserve.nodes.backends.onnxruntime import held_threads
from tests.conftest import start_server


def test_cpu_lists_parse_as_the_kernel_writes_them() -> None:
    assert affinity.parse_cpu_list("0-3,8,10-11\n") == frozenset({0, 1, 2, 3, 8, 10, 11})
    assert affinity.parse_cpu_list("5") == frozenset({5})
    with pytest.raises(ValueError):
        affinity.parse_cpu_list("3-1")
    assert affinity.describe({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert affinity.describe(set()) == ""


def test_hyperthread_siblings_stay_together_and_only_allowed_cpus_count() -> None:
    siblings = {0: frozenset({0, 4}), 1: frozenset({1, 5}), 4: frozenset({0, 4}), 5: frozenset({1, 5})}
    assert affinity.cores([0, 1, 4, 5], siblings) == [[0, 4], [1, 5]]
    assert affinity.cores([0, 1, 5], siblings) == [[0], [1, 5]]  # cpu 4 is not ours
    assert affinity.cores([2, 3], {}) == [[2], [3]]  # no topology: each CPU its own core


@pytest.mark.parametrize(
    ("cores", "workers", "shares"),
    [
        ([[0], [1]], 2, [{0}, {1}]),
        ([[0], [1], [2]], 2, [{0, 1}, {2}]),
        ([[0], [1], [2], [3], [4]], 2, [{0, 1, 2}, {3, 4}]),
        ([[0, 4], [1, 5], [2, 6], [3, 7]], 2, [{0, 4, 1, 5}, {2, 6, 3, 7}]),
        ([[0]], 2, [{0}, {0}]),  # fewer cores than workers: they share
        ([[0], [1]], 3, [{0}, {1}, {0}]),
        ([[2], [3], [6], [7]], 1, [{2, 3, 6, 7}]),
        ([], 2, [set(), set()]),
    ],
)
def test_the_cores_are_split_in_runs_that_differ_by_at_most_one(
    cores: list[list[int]], workers: int, shares: list[set[int]]
) -> None:
    assert [set(s) for s in affinity.partition(cores, workers)] == shares


def test_a_share_follows_the_machines_topology(tmp_path: Path) -> None:
    for cpu, listed in {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"}.items():
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "thread_siblings_list").write_text(listed + "\n")
    assert affinity.share(0, 2, {0, 1, 2, 3}, root=tmp_path) == {0, 2}
    assert affinity.share(1, 2, {0, 1, 2, 3}, root=tmp_path) == {1, 3}
    assert affinity.share(1, 2, {0, 1}, root=tmp_path) == {1}


def test_pin_holds_every_thread_and_says_none_when_the_kernel_refuses() -> None:
    applied: list[tuple[int, frozenset[int]]] = []

    def record(tid: int, cpus: frozenset[int]) -> None:
        if tid == 12:
            raise ProcessLookupError  # a thread that ended since it was listed
        applied.append((tid, cpus))

    mine = affinity.pin(1, 2, allowed={0, 1}, set_affinity=record, threads=lambda: [11, 12, 13])
    assert mine == frozenset({1})
    assert applied == [(0, frozenset({1})), (11, frozenset({1})), (13, frozenset({1}))]

    def refuse(tid: int, cpus: frozenset[int]) -> None:
        raise PermissionError("sched_setaffinity: not permitted")

    assert affinity.pin(0, 2, allowed={0, 1}, set_affinity=refuse, threads=list) is None


def test_onnxruntime_threads_follow_a_held_process_only() -> None:
    assert held_threads(allowed=1, machine=2) == 1
    assert held_threads(allowed=4, machine=16) == 4
    assert held_threads(allowed=16, machine=16) is None  # ONNX Runtime's own default
    assert held_threads(allowed=0, machine=16) is None


def _masks(supervisor: int) -> dict[int, set[str]]:
    """Per worker pid (the supervisor's children), the CPU lists of all its threads."""
    found: dict[int, set[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) != supervisor:
                continue
            lists = {
                re.search(r"Cpus_allowed_list:\s*(\S+)", (task / "status").read_text()).group(1)  # type: ignore[union-attr]
                for task in (entry / "task").iterdir()
            }
        except OSError:
            continue
        found[int(entry.name)] = lists
    return found


@pytest.mark.parametrize("mode", ["spread", "none"])
def test_workers_run_on_their_share_with_spread_and_anywhere_without(mode: str) -> None:
    server = start_server(
        "--workers", "2", "--cpu-affinity", mode, "--model-control-mode=explicit", "--load-model=simple",
        timeout=180.0,
    )  # fmt: skip
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        for _ in range(4):  # answered, whichever worker took the connection
            a = np.arange(16, dtype=np.int32).reshape(1, 16)
            inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(a)
            result = client.infer("simple", inputs)
            assert np.array_equal(result.as_numpy("OUTPUT0"), a + a)
        client.close()
        masks = _masks(server.process.pid)
        allowed = sorted(os.sched_getaffinity(0))
        assert len(masks) == 2
        for lists in masks.values():  # every thread of a worker (its instance threads too) alike
            assert len(lists) == 1
        held = sorted(next(iter(lists)) for lists in masks.values())
        if mode == "spread":
            shares = sorted(affinity.describe(affinity.share(i, 2, allowed)) for i in range(2))
            assert held == shares
            for index in range(2):
                assert f"worker {index} runs on CPUs" in server.log()
        else:
            assert held == [affinity.describe(allowed)] * 2
            assert "runs on CPUs" not in server.log()
    finally:
        assert server.stop(60.0) == 0, server.log()[-4000:]
