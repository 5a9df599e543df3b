"""What ``flowserve analyze`` may change, and the single steps it takes from a configuration
(pure): per node instance count, max batch size, preferred batch sizes and queue delay, and
the server's ``--workers``."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from flowserve.repository.placement import share_counts

DELAYS_US = (0, 200, 1000)  # the queue delays tried, in order
FIRST_BATCH = 8  # the max batch size batching is turned on with


@dataclass(frozen=True, slots=True)
class NodeConfig:
    instances: int = 1
    max_batch_size: int = 0  # 0: no batching in front of the node
    preferred: tuple[int, ...] = ()
    delay_us: int = 0

    def describe(self) -> str:
        batching = "no batching"
        if self.max_batch_size:
            batching = f"batch {self.max_batch_size}"
            if self.preferred:
                batching += f" (preferred {','.join(map(str, self.preferred))})"
            if self.delay_us:
                batching += f" delay {self.delay_us}us"
        return f"{self.instances} inst, {batching}"


@dataclass(frozen=True, slots=True)
class Candidate:
    """One configuration of the server and every tunable node."""

    workers: int
    nodes: tuple[tuple[str, NodeConfig], ...]

    def node(self, name: str) -> NodeConfig:
        return dict(self.nodes)[name]

    def with_node(self, name: str, config: NodeConfig) -> Candidate:
        return Candidate(self.workers, tuple((n, config if n == name else c) for n, c in self.nodes))

    def describe(self, base: Candidate | None = None) -> str:
        """Every setting, or (``base`` given) only what differs from ``base``."""
        parts = [] if base is not None and base.workers == self.workers else [f"workers={self.workers}"]
        for name, config in self.nodes:
            if base is None or base.node(name) != config:
                parts.append(f"{name}: {config.describe()}")
        return "; ".join(parts) or "as shipped"


@dataclass(frozen=True, slots=True)
class NodeSpace:
    """How far one node may be tuned: ``batch_limit`` 0 means it cannot batch (a model without a
    batch dimension, a graph that does not batch); ``max_instances`` 1 means its instance count is
    not ours to change."""

    name: str
    kind: str
    batch_limit: int = 0
    max_instances: int = 1
    shared: bool = False  # its instance count is the server's, split over the workers (a Python model)


@dataclass(frozen=True, slots=True)
class Space:
    nodes: tuple[NodeSpace, ...]
    max_workers: int = 1
    delays_us: tuple[int, ...] = DELAYS_US

    def of(self, name: str) -> NodeSpace:
        return next(n for n in self.nodes if n.name == name)

    def layout(self, candidate: Candidate) -> tuple[object, ...]:
        """What the server runs for ``candidate``: the same for two candidates that differ only
        in how many instances of a shared node there are when each worker loads one either way
        (``count: 1`` and ``count: 2`` of a Python model under ``--workers 2``), so the search
        measures one of them."""
        shared = {n.name for n in self.nodes if n.shared}
        nodes = []
        for name, config in candidate.nodes:
            count = share_counts(config.instances, candidate.workers) if name in shared else config.instances
            nodes.append((name, count, dataclasses.replace(config, instances=0)))  # the rest as it is
        return (candidate.workers, tuple(nodes))


@dataclass(frozen=True, slots=True)
class Move:
    """One step from a candidate, with why it is tried."""

    candidate: Candidate
    why: str
    node: str = ""  # "" for the server's workers


def node_moves(candidate: Candidate, space: NodeSpace, fill: float, waits: bool) -> Iterator[Move]:
    """Steps for one node, most promising first. ``fill``: the average rows per execution over
    the max batch size (0 when not batching); ``waits``: tokens spend longer queued in front of
    the node than computing in it (it lacks capacity)."""
    now = candidate.node(space.name)
    name = space.name

    def move(config: NodeConfig, why: str) -> Move:
        return Move(candidate.with_node(name, config), f"{name}: {why}", name)

    if space.batch_limit and not now.max_batch_size:
        size = min(FIRST_BATCH, space.batch_limit)
        yield move(dataclasses.replace(now, max_batch_size=size), f"batch up to {size} rows")
    if now.max_batch_size and fill >= 0.6 and now.max_batch_size < space.batch_limit:
        size = min(now.max_batch_size * 2, space.batch_limit)
        yield move(
            dataclasses.replace(now, max_batch_size=size, preferred=()), f"batches are full: up to {size}"
        )
    if waits and now.instances < space.max_instances:
        yield move(dataclasses.replace(now, instances=now.instances + 1), f"{now.instances + 1} instances")
    if now.max_batch_size and fill < 0.6:
        for delay in DELAYS_US:
            if delay > now.delay_us:
                yield move(dataclasses.replace(now, delay_us=delay), f"wait {delay}us to fill batches")
                break
    if now.max_batch_size and not now.preferred and fill >= 0.3:
        sizes = tuple(sorted({max(1, now.max_batch_size // 2), now.max_batch_size}))
        yield move(dataclasses.replace(now, preferred=sizes), "prefer full batches")
    if not waits and now.instances < space.max_instances:
        yield move(dataclasses.replace(now, instances=now.instances + 1), f"{now.instances + 1} instances")


def worker_move(candidate: Candidate, space: Space) -> Move | None:
    if candidate.workers >= space.max_workers:
        return None
    return Move(
        dataclasses.replace(candidate, workers=candidate.workers + 1), f"--workers {candidate.workers + 1}"
    )


def grid(space: Space, start: Candidate, instances: tuple[int, ...] = (1, 2)) -> list[Candidate]:
    """Brute mode: every combination of a small grid per node (instances; no batching, or batching
    at 8 and at the limit, each with no delay and a 1 ms delay) and every worker count."""
    options: list[list[tuple[str, NodeConfig]]] = []
    for node in space.nodes:
        configs: list[NodeConfig] = []
        counts = [i for i in instances if i <= node.max_instances] or [start.node(node.name).instances]
        sizes = [0, *sorted({min(FIRST_BATCH, node.batch_limit), node.batch_limit} - {0})]
        for count in counts:
            for size in sizes:
                for delay in (0, 1000) if size else (0,):
                    configs.append(NodeConfig(count, size, (), delay))
        options.append([(node.name, c) for c in configs])
    combos: list[tuple[tuple[str, NodeConfig], ...]] = [()]
    for choices in options:
        combos = [(*combo, choice) for combo in combos for choice in choices]
    return [Candidate(w, combo) for w in range(1, space.max_workers + 1) for combo in combos]


__all__ = [
    "Candidate",
    "Move",
    "NodeConfig",
    "NodeSpace",
    "Space",
    "grid",
    "node_moves",
    "worker_move",
]
