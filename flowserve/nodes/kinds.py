"""What each node kind is at run time: its signature and its node object, one :class:`Builder`
per kind of :data:`flowserve.spec.kinds.KINDS`, registered in :data:`BUILDERS`.

The declarative half of a kind (YAML key and parser, flags, look) lives in
:mod:`flowserve.spec.kinds`, low enough for the spec and graph layers to read; this is the
half that needs node classes. Importing this module fails while a registered kind has no
builder, so a new kind cannot be half added. **Adding a node kind**: its ``Kind`` in
``flowserve/spec/kinds.py``, then its ``Builder`` here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from flowserve.core.clock import Clock
from flowserve.core.errors import InvalidArgument
from flowserve.core.node import Node
from flowserve.graph.plan import Plan, Signature
from flowserve.nodes.backends import backend_class
from flowserve.nodes.backends.base import backend_signature
from flowserve.nodes.loading import LoadSettings
from flowserve.nodes.python import PythonNode, python_signature
from flowserve.nodes.remote import RemoteNode, remote_signature
from flowserve.nodes.sequence import SequenceBatcher
from flowserve.nodes.split import SplitNode, split_signature
from flowserve.nodes.step import StepNode, step_signature
from flowserve.nodes.switch import SwitchNode, switch_signature
from flowserve.runtime.registry import Registry
from flowserve.runtime.stats import ModelStats
from flowserve.spec.kinds import KINDS
from flowserve.spec.schema import ModelSpec, NodeSpec
from flowserve.spec.sequence import sequence_from_config
from flowserve.spec.suggest import did_you_mean


@dataclass(frozen=True, slots=True)
class Known:
    """What a node's signature may depend on: the repository's models and the plans compiled
    so far (the models and graphs a step or a split calls)."""

    models: Mapping[str, ModelSpec]
    plans: Mapping[str, Plan]


@dataclass(frozen=True, slots=True)
class Place:
    """Where a node object is built: its plan, the server's registry, and for a repository
    model's own node the model, version, statistics and clock; ``load``: the repository's load
    settings (load threads, inline threshold, rate limiter)."""

    plan: Plan
    registry: Registry
    model: ModelSpec | None
    version: int
    stats: ModelStats
    clock: Clock
    load: LoadSettings


@dataclass(frozen=True, slots=True)
class Builder:
    signature: Callable[[NodeSpec, Known], Signature]
    build: Callable[[NodeSpec, Place], Node]


def _step_signature(node: NodeSpec, known: Known) -> Signature:
    plan = known.plans.get(node.target)
    if plan is None:
        hint = "" if node.target in known.models else did_you_mean(node.target, [*known.models, *known.plans])
        raise InvalidArgument(f"{node.kind} '{node.target}' is unknown or failed to load{hint}")
    return step_signature(plan)


def _step(node: NodeSpec, at: Place) -> Node:
    return StepNode(node.name, at.registry, node.target, node.version)


def _remote(node: NodeSpec, at: Place) -> Node:
    pnode = next(p for p in at.plan.nodes if p.name == node.name)
    return RemoteNode(node, at.plan.name, list(pnode.signature.outputs), at.clock)


def _backend(node: NodeSpec, at: Place) -> Node:
    model = at.model
    assert model is not None
    backend_type = backend_class(model.backend, model.name)
    backend = backend_type(model, at.version, at.stats, at.clock, registry=at.registry, load=at.load)
    sequence = sequence_from_config(model.config, Path(model.versions[at.version]).parent)
    if sequence is not None:
        return SequenceBatcher(backend, sequence, model.max_batch_size, at.clock)
    return backend


BUILDERS: dict[str, Builder] = {
    "model": Builder(_step_signature, _step),
    "python": Builder(
        lambda node, _: python_signature(node),
        lambda node, at: PythonNode(node, at.plan.name, at.load),
    ),
    "switch": Builder(lambda node, _: switch_signature(node, None), lambda node, _: SwitchNode(node)),
    "graph": Builder(_step_signature, _step),
    "split": Builder(
        lambda node, known: split_signature(node, known.plans),
        lambda node, at: SplitNode(node, at.registry, at.clock),
    ),
    "remote": Builder(lambda node, _: remote_signature(node), _remote),
    "backend": Builder(lambda node, known: backend_signature(known.models[node.target]), _backend),
}

_missing = set(KINDS) ^ set(BUILDERS)
if _missing:  # pragma: no cover - a kind added in one place only
    raise ImportError(f"node kinds without a builder or builders without a kind: {sorted(_missing)}")


def builder(node: NodeSpec) -> Builder:
    return BUILDERS[node.kind]


__all__ = ["BUILDERS", "Builder", "Known", "Place", "builder"]
