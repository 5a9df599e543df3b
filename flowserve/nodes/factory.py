"""From specs to plans and node objects: signature resolution and node construction.

``compile_all`` compiles every model and graph of a scan in dependency order (a graph that
uses a model or another graph compiles after it); a failure marks that entry and everything
that depends on it, with every problem listed. ``build_nodes`` makes the node objects of one
compiled plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from flowserve.core.clock import MONOTONIC, Clock
from flowserve.core.errors import FlowserveError, InvalidArgument, SpecError, SpecIssue, Unavailable
from flowserve.core.node import Node
from flowserve.graph.compile import compile_graph
from flowserve.graph.plan import Plan, Signature
from flowserve.nodes.backends import backend_class
from flowserve.nodes.backends.base import backend_signature
from flowserve.nodes.python import PythonNode, python_signature
from flowserve.nodes.step import StepNode, step_signature
from flowserve.nodes.switch import SwitchNode, switch_signature
from flowserve.runtime.registry import Registry
from flowserve.runtime.stats import ModelStats
from flowserve.spec.repository import Scan
from flowserve.spec.schema import GraphSpec, ModelSpec, NodeSpec, model_graph


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
    return {n.target for n in spec.nodes.values() if n.kind in ("model", "graph")}


def compile_all(scan: Scan, known: dict[str, Plan] | None = None) -> Compiled:
    """Compile every spec of ``scan`` (``known``: plans already loaded that graphs may use)."""
    specs = graph_specs(scan)
    result = Compiled(issues=list(scan.issues), failed=dict(scan.failed))
    deps = nx.DiGraph()
    for name, spec in specs.items():
        deps.add_node(name)
        for dep in dependencies(spec):
            deps.add_edge(dep, name)
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


def _resolver(models: dict[str, ModelSpec], catalog: dict[str, Plan]):  # type: ignore[no-untyped-def]
    def resolve(node: NodeSpec) -> Signature:
        if node.kind == "backend":
            return backend_signature(models[node.target])
        if node.kind == "python":
            return python_signature(node)
        if node.kind == "switch":
            return switch_signature(node, None)
        plan = catalog.get(node.target)
        if plan is None:
            what = "model" if node.kind == "model" else "graph"
            raise InvalidArgument(f"{what} '{node.target}' is unknown or failed to load")
        return step_signature(plan)

    return resolve


def build_nodes(
    plan: Plan,
    registry: Registry,
    model: ModelSpec | None,
    version: int,
    stats: ModelStats,
    clock: Clock = MONOTONIC,
) -> list[Node]:
    """The node objects of ``plan``, aligned with ``plan.nodes`` (not started)."""
    nodes: list[Node] = []
    for pnode in plan.nodes:
        spec = pnode.spec
        try:
            nodes.append(_build(spec, plan, registry, model, version, stats, clock))
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
) -> Node:
    if spec.kind == "backend":
        assert model is not None
        return backend_class(model.backend, model.name)(model, version, stats, clock)
    if spec.kind == "python":
        return PythonNode(spec, plan.name)
    if spec.kind == "switch":
        return SwitchNode(spec)
    return StepNode(spec.name, registry, spec.target, spec.version)
