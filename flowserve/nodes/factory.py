"""From specs to plans and node objects: signature resolution and node construction.

``compile_all`` compiles every model and graph of a scan in dependency order (a graph that
uses a model or another graph compiles after it); a failure marks that entry and everything
that depends on it, with every problem listed. ``build_nodes`` makes the node objects of one
compiled plan. Nothing here depends on which kinds exist: a node's signature and object come
from its kind's builder (:mod:`flowserve.nodes.kinds`; a new kind is added there and in
:mod:`flowserve.spec.kinds`), and the wrappers (batcher, cache) apply to any kind.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import networkx as nx

from flowserve.core.clock import MONOTONIC, Clock
from flowserve.core.errors import FlowserveError, InvalidArgument, SpecError, SpecIssue, Unavailable
from flowserve.core.node import Node
from flowserve.graph.compile import compile_graph
from flowserve.graph.plan import Plan, PlanNode, Signature
from flowserve.nodes.batching import Batcher
from flowserve.nodes.cached import CachedNode
from flowserve.nodes.kinds import Known, Place, builder
from flowserve.nodes.loading import LoadSettings
from flowserve.nodes.rayinstances import place_on_ray
from flowserve.nodes.step import StepNode
from flowserve.runtime.cache import ResponseCache
from flowserve.runtime.registry import Registry
from flowserve.runtime.stats import ModelStats
from flowserve.spec.kinds import kind_of, node_targets
from flowserve.spec.rayspec import ray_instances
from flowserve.spec.repository import Scan
from flowserve.spec.schema import GraphSpec, ModelSpec, NodeSpec, model_graph

log = logging.getLogger("flowserve")


@dataclass
class Compiled:
    plans: dict[str, Plan] = field(default_factory=dict)
    issues: list[SpecIssue] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)


def graph_specs(scan: Scan) -> dict[str, GraphSpec]:
    """Every servable of a scan as a graph spec (a model is a one-node graph)."""
    specs = {name: model_graph(m) for name, m in scan.models.items()}
    specs.update(scan.graphs)
    return specs


def dependencies(spec: GraphSpec) -> set[str]:
    return {t for n in spec.nodes.values() for t in node_targets(n)}


def dependency_graph(specs: dict[str, GraphSpec]) -> nx.DiGraph:
    """Every servable of ``specs`` a node, an edge from what each one uses to it."""
    deps = nx.DiGraph()
    for name, spec in specs.items():
        deps.add_node(name)
        deps.add_edges_from((dep, name) for dep in dependencies(spec))
    return deps


def users_of(scan: Scan, names: set[str]) -> set[str]:
    """The servables of ``scan`` that use any of ``names``, directly or through other graphs."""
    deps = dependency_graph(graph_specs(scan))
    return {user for name in names if name in deps for user in nx.descendants(deps, name)} - names


def compile_all(scan: Scan, known: dict[str, Plan] | None = None) -> Compiled:
    """Compile every spec of ``scan`` (``known``: plans already loaded that graphs may use)."""
    specs = graph_specs(scan)
    result = Compiled(issues=list(scan.issues), failed=dict(scan.failed))
    deps = dependency_graph(specs)
    for cycle in nx.simple_cycles(deps):
        path = " -> ".join([*cycle, cycle[0]])
        for name in cycle:
            if name in specs:
                result.issues.append(
                    SpecIssue(specs[name].source, f"graphs use each other in a cycle: {path}")
                )
                result.failed[name] = f"dependency cycle: {path}"
    catalog = dict(known or {})
    order = [n for n in _topo(deps) if n in specs and n not in result.failed]
    for name in order:
        spec = specs[name]
        try:
            plan = compile_graph(spec, _resolver(scan.models, catalog))
        except SpecError as exc:
            result.issues.extend(exc.issues)
            result.failed[name] = str(exc)
            continue
        catalog[name] = plan
        result.plans[name] = plan
        result.order.append(name)
    return result


def _topo(deps: nx.DiGraph) -> list[str]:
    acyclic = deps.copy()
    for cycle in nx.simple_cycles(deps):
        for node in cycle:
            if node in acyclic:
                acyclic.remove_node(node)
    return list(nx.lexicographical_topological_sort(acyclic))


def _resolver(models: dict[str, ModelSpec], catalog: dict[str, Plan]) -> Callable[[NodeSpec], Signature]:
    known = Known(models, catalog)

    def resolve(node: NodeSpec) -> Signature:
        return builder(node).signature(node, known)

    return resolve


def build_nodes(
    plan: Plan,
    registry: Registry,
    model: ModelSpec | None,
    version: int,
    stats: ModelStats,
    clock: Clock = MONOTONIC,
    cache: ResponseCache | None = None,
    load: LoadSettings | None = None,
) -> list[Node]:
    """The node objects of ``plan``, aligned with ``plan.nodes`` (not started). ``cache``
    serves the nodes whose spec asks for it (``cache: true``); ``load``: the repository's load
    settings, handed to every node built."""
    nodes: list[Node] = []
    place_load = load or LoadSettings()
    for pnode in plan.nodes:
        spec = pnode.spec
        try:
            node = _build(spec, plan, registry, model, version, stats, clock, place_load)
            node = _batched(node, pnode, model, stats, clock)
            nodes.append(_cached(node, plan.name, spec, cache))
        except FlowserveError as exc:
            raise Unavailable(f"in graph '{plan.name}', node '{spec.name}': {exc.message}") from None
    return nodes


def _build(
    spec: NodeSpec,
    plan: Plan,
    registry: Registry,
    model: ModelSpec | None,
    version: int,
    stats: ModelStats,
    clock: Clock,
    load: LoadSettings,
) -> Node:
    if model is not None and spec.kind == "backend":
        model = ray_instances(model)  # flowserve.ray.* parameters: the instances are Ray actors
    node = builder(spec).build(spec, Place(plan, registry, model, version, stats, clock, load))
    return place_on_ray(node, spec, plan.name, model, version, load)


def _cached(node: Node, graph: str, spec: NodeSpec, cache: ResponseCache | None) -> Node:
    if not spec.cache:
        return node
    if cache is None:
        log.warning(
            "graph '%s', node '%s' asks for the cache, but the server has none (--cache-size)",
            graph,
            spec.name,
        )
        return node
    if node.decoupled:
        raise InvalidArgument("a decoupled node cannot be cached (its answer is a stream)")
    return CachedNode(node, cache, f"{graph}/{spec.name}")


def _batched(node: Node, pnode: PlanNode, model: ModelSpec | None, stats: ModelStats, clock: Clock) -> Node:
    """Wrap ``node`` in a Batcher when it is configured to batch: a repository model with
    ``dynamic_batching`` (its executions count in the model's stats), or a graph node with
    ``batching:`` (``instances.count`` merged calls at once)."""
    spec = pnode.spec
    if kind_of(spec).model_batching:
        if model is None or model.batching is None:
            return node
        ragged = frozenset(t.name for t in model.inputs if t.allow_ragged_batch)
        return Batcher(node, model.batching, clock=clock, ragged=ragged, stats=stats)
    if spec.batching is None:
        return node
    if kind_of(spec).no_batching:
        raise InvalidArgument(kind_of(spec).no_batching)
    if isinstance(node, StepNode) and node.registry.has(node.target):
        limit = node.registry.get(node.target, node.version).plan.max_batch_size
        if 0 < limit < spec.batching.max_batch_size:
            raise InvalidArgument(
                f"batching.max_batch_size {spec.batching.max_batch_size} exceeds the max_batch_size "
                f"{limit} of '{node.target}', which a merged batch must respect"
            )
    inputs = pnode.signature.inputs or {}
    ragged = frozenset(n for n, t in inputs.items() if t is not None and t.allow_ragged_batch)
    return Batcher(node, spec.batching, clock=clock, ragged=ragged, capacity=spec.instances.count)
