"""``--ray-address local`` starts a Ray cluster inside the server's process tree: stopping the
server stops it too (no raylet or GCS left running)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import start_server

GRAPH = """
name: on_ray
inputs: {seconds: {datatype: FP32, dims: [1]}}
outputs: {pid: where.pid}
nodes:
  where:
    python: tests.ray.ray_nodes:Where
    inputs: {seconds: $seconds}
    instances: {count: 1, kind: KIND_RAY, resources: {num_cpus: 0}}
"""


def _descendants(pid: int) -> dict[int, str]:
    """The processes below ``pid`` (pid -> command line), from /proc."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            commands[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                found[child] = commands.get(child, "")
                frontier.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_stopping_the_server_stops_the_local_ray_it_started(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    (tmp_path / "on_ray.yaml").write_text(GRAPH)
    server = start_server("--ray-address", "local", repositories=(), graphs=(tmp_path,), timeout=240)
    try:
        ray = {pid: cmd for pid, cmd in _descendants(server.process.pid).items() if "ray" in cmd}
        assert any("raylet" in cmd for cmd in ray.values()), ray  # started under the server
        assert any("gcs_server" in cmd for cmd in ray.values()), ray
    finally:
        assert server.stop(timeout=60) == 0, server.log()
    deadline = time.monotonic() + 30  # a bounded wait for the processes to go, not a goal
    while any(_alive(pid) for pid in ray) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {pid: cmd[:120] for pid, cmd in ray.items() if _alive(pid)}
    assert not left, f"Ray processes left running after the server stopped: {left}\n{server.log()}"
