"""One real multi-node Ray cluster for the Ray tests (tests/ray/), started once per session.

``ray.cluster_utils.Cluster`` runs a head node and a worker node as separate raylets on this
machine (Ray gives them the machine's own address; the traffic stays on the host). Each node
has one CPU and one ``slot`` resource, so instances asking for ``{num_cpus: 0, slot: 1}`` land
one per node. The GCS health check is fast so that a killed node is seen dead in about a
second. Everything skips when ray is not importable.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

# a killed node is declared dead after about period x threshold
FAST_HEALTH_CHECK = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 3,
}
NODE_ARGS: dict[str, Any] = {"num_cpus": 1, "resources": {"slot": 1}}


@dataclass
class RayCluster:
    cluster: Any  # ray.cluster_utils.Cluster
    worker: Any  # its worker node (replaced when a test kills it)

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def kill_worker(self) -> None:
        """Kill the worker node's processes (raylet, object store, its actors) at once."""
        self.cluster.remove_node(self.worker, allow_graceful=False)

    def add_worker(self) -> None:
        self.worker = self.cluster.add_node(**NODE_ARGS)
        self.cluster.wait_for_nodes()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={**NODE_ARGS, "include_dashboard": False, "_system_config": FAST_HEALTH_CHECK},
    )
    try:
        holder = RayCluster(cluster, None)
        holder.add_worker()
        yield holder
    finally:
        ray.shutdown()  # this process may be a driver of the cluster (tests/ray/test_instances.py)
        cluster.shutdown()
