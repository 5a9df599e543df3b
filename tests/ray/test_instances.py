"""KIND_RAY instances on a real two-node Ray cluster (tests/ray/conftest.py), in-process.

One engine for the module serves a YAML graph per behaviour and the ``ray_double`` python model
(flowserve.ray.* parameters, dynamic batching): the instances are actors in other processes,
loaded once; a 4 MB tensor reaches the actor as a read-only view of Ray's object store (no
pickled copy); what a node raises comes back as raised; an actor killed during a call fails
that call with UNAVAILABLE naming the node and saying the Ray actor died, and the next call is
served by the actor Ray restarted. This process is the Ray driver (the server's role).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

pytest.importorskip("ray")

import flowserve
from flowserve.core.errors import ErrorCode, FlowserveError, NodeError
from flowserve.repository.settings import RepositorySettings
from flowserve.runtime.registry import State
from tests.ray.conftest import RayCluster

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODELS = Path(__file__).resolve().parent / "models"
NODES = "tests.ray.ray_nodes"
# one instance per Ray node (each node has one 'slot'), no CPU held: room for the others
SPREAD = "{num_cpus: 0, slot: 1}"
SMALL = "{num_cpus: 0.1}"

GRAPHS = {
    "ray_pair": (
        "Double",
        "x: {datatype: FP32, dims: [-1]}",
        "y, pid, loads, x_owned, x_writeable",
        2,
        SPREAD,
    ),
    "ray_where": ("Where", "seconds: {datatype: FP32, dims: [1]}", "pid, node", 1, SMALL),
    "ray_fails": ("Fails", "x: {datatype: FP32, dims: [-1]}", "y", 1, SMALL),
    "ray_async": ("AsyncDouble", "x: {datatype: FP32, dims: [-1]}", "y, pid", 1, SMALL),
    "ray_gpu": ("Double", "x: {datatype: FP32, dims: [-1]}", "y", 1, "{num_cpus: 0, num_gpus: 1}"),
}


def write_graphs(folder: Path) -> None:
    for name, (cls, inputs, outputs, count, resources) in GRAPHS.items():
        outs = ", ".join(f"{o}: n.{o}" for o in outputs.split(", "))
        (folder / f"{name}.yaml").write_text(
            f"""
name: {name}
inputs: {{{inputs}}}
outputs: {{{outs}}}
nodes:
  n:
    python: {NODES}:{cls}
    inputs: {{{inputs.split(":")[0]}: ${inputs.split(":")[0]}}}
    instances: {{count: {count}, kind: KIND_RAY, resources: {resources}}}
"""
        )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(
    ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[flowserve.Engine]:
    graphs = tmp_path_factory.mktemp("ray_graphs")
    write_graphs(graphs)
    engine = await flowserve.Engine.start(MODELS, graphs, RepositorySettings(ray_address=ray_cluster.address))
    try:
        yield engine
    finally:
        await engine.stop()


def _reason(engine: flowserve.Engine, name: str) -> str:
    return next(s.reason for s in engine.registry.index() if s.name == name)


async def test_instances_are_actors_on_both_nodes_loaded_once(engine: flowserve.Engine) -> None:
    assert engine.registry.ready("ray_pair", ""), _reason(engine, "ray_pair")
    x = np.arange(6, dtype=np.float32)
    seen: set[int] = set()
    for _ in range(4):  # two at once: each call takes a free instance, so both are used
        outs = await asyncio.gather(*(engine.infer("ray_pair", {"x": x}) for _ in range(2)))
        for out in outs:
            np.testing.assert_array_equal(out["y"], x * 2)
            assert out["loads"][0] == 1  # the node was built once in that actor
            seen.add(int(out["pid"][0]))
    assert len(seen) == 2 and os.getpid() not in seen
    node = engine.registry.get("ray_pair").executor.nodes[0]
    places = node.pool.places  # type: ignore[attr-defined]
    assert {p["pid"] for p in places} == seen
    assert len({p["node_id"] for p in places}) == 2  # one actor per Ray node


async def test_large_tensor_is_not_copied_into_the_actor(engine: flowserve.Engine) -> None:
    """A 4 MB input arrives in the actor as a read-only view it does not own: deserialized in
    place from Ray's object store, not unpickled into a copy. The 4 MB output comes back the
    same way (a view of the object store in this process)."""
    x = np.random.default_rng(0).random(1 << 20, dtype=np.float32)  # 4 MiB
    out = await engine.infer("ray_pair", {"x": x})
    assert not out["x_owned"][0] and not out["x_writeable"][0]
    np.testing.assert_array_equal(out["y"], x * 2)
    assert not out["y"].flags.owndata and not out["y"].flags.writeable


async def test_errors_come_back_as_raised(engine: flowserve.Engine) -> None:
    ok = await engine.infer("ray_fails", {"x": np.ones(3, np.float32)})
    np.testing.assert_array_equal(ok["y"], np.ones(3, np.float32))
    with pytest.raises(NodeError) as failed:
        await engine.infer("ray_fails", {"x": -np.ones(3, np.float32)})
    assert failed.value.code is ErrorCode.INTERNAL
    message = str(failed.value)
    assert "graph 'ray_fails', node 'n'" in message
    assert "ValueError: negative input in process" in message
    assert str(os.getpid()) not in message.split("process")[-1]


async def test_async_execute_runs_on_the_actor(engine: flowserve.Engine) -> None:
    out = await engine.infer("ray_async", {"x": np.full(2, 3, np.float32)})
    np.testing.assert_array_equal(out["y"], np.full(2, 6, np.float32))
    assert out["pid"][0] != os.getpid()


async def test_python_model_on_ray_with_batching_and_statistics(engine: flowserve.Engine) -> None:
    assert engine.registry.ready("ray_double", ""), _reason(engine, "ray_double")
    before = engine.registry.get("ray_double").stats.inference_count
    rows = [np.full((1, 4), i, np.float32) for i in range(8)]
    outs = await asyncio.gather(*(engine.infer("ray_double", {"INPUT0": r}) for r in rows))
    for row, out in zip(rows, outs, strict=True):
        np.testing.assert_array_equal(out["OUTPUT0"], row * 2)
        assert out["PID"][0, 0] != os.getpid()
    # the batcher and the statistics are this process's, as for local instances
    assert engine.registry.get("ray_double").stats.inference_count - before == 8


async def test_unsatisfiable_resources_fail_the_load_at_once(engine: flowserve.Engine) -> None:
    assert not engine.registry.ready("ray_gpu", "")
    reason = _reason(engine, "ray_gpu")
    assert (
        "node 'n' of graph 'ray_gpu' cannot be placed on Ray: no node of the Ray cluster has {GPU: 1}"
        in reason
    )
    state = next(s.state for s in engine.registry.index() if s.name == "ray_gpu")
    assert state is State.UNAVAILABLE


async def test_actor_killed_mid_call_fails_that_call_then_serves_again(engine: flowserve.Engine) -> None:
    first = await engine.infer("ray_where", {"seconds": np.zeros(1, np.float32)})
    pid = int(first["pid"][0])
    running = asyncio.ensure_future(engine.infer("ray_where", {"seconds": np.full(1, 30, np.float32)}))
    await asyncio.sleep(1.0)  # the call is in the actor, sleeping
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(FlowserveError) as died:
        await asyncio.wait_for(running, 60)
    assert died.value.code is ErrorCode.UNAVAILABLE
    message = str(died.value)
    assert "node 'n' of graph 'ray_where'" in message and "its Ray actor" in message and "died" in message
    assert "Ray restarts it" in message
    again = await asyncio.wait_for(engine.infer("ray_where", {"seconds": np.zeros(1, np.float32)}), 120)
    assert int(again["pid"][0]) not in (pid, os.getpid())  # the actor Ray restarted
