"""The declarative description of models and graphs, shared by YAML graphs and config.pbtxt.

Everything here is frozen plain data; the graph layer compiles it into an execution plan.
Shapes follow Triton: when ``max_batch_size > 0`` the batch dimension is implicit and not
written in ``dims``; :meth:`TensorSpec.full_shape` adds it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from flowserve.spec.model_config import ModelConfig, new_config


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False
    reshape: tuple[int, ...] | None = None
    allow_ragged_batch: bool = False
    is_shape_tensor: bool = False
    label_filename: str = ""

    def full_shape(self, max_batch_size: int) -> tuple[int, ...]:
        """Shape as tensors really have it: a leading -1 batch dim when batching is on."""
        return (-1, *self.dims) if max_batch_size > 0 else self.dims


@dataclass(frozen=True, slots=True)
class Ref:
    """A reference to a tensor: a graph input (``$x``) or a node output (``node.tensor``)."""

    node: str | None
    tensor: str

    @property
    def key(self) -> str:
        return f"${self.tensor}" if self.node is None else f"{self.node}.{self.tensor}"

    def __str__(self) -> str:
        return self.key


# A node input: one reference, or several meaning "the first of these that is present".
Binding = tuple[Ref, ...]


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclass(frozen=True, slots=True)
class BatchingSpec:
    """Dynamic batching in front of a node (Triton's ``dynamic_batching`` semantics)."""

    max_batch_size: int
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = QueuePolicy()
    priority_queue_policy: dict[int, QueuePolicy] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ResourceSpec:
    """A rate-limiter resource an instance needs while it runs (Triton's
    ``instance_group.rate_limiter.resources``): ``global_`` resources are shared by every
    device, the others exist once per device."""

    name: str
    count: int
    global_: bool = False


@dataclass(frozen=True, slots=True)
class RaySpec:
    """What each ``KIND_RAY`` instance (a Ray actor, nodes/rayinstances.py) asks Ray for:
    CPUs, GPUs and custom resources (``resources``: sorted name, amount pairs), and how often
    Ray restarts an actor that died (-1: always)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: tuple[tuple[str, float], ...] = ()
    max_restarts: int = -1


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    count: int = 1
    kind: Literal["KIND_AUTO", "KIND_CPU", "KIND_GPU", "KIND_MODEL", "KIND_RAY"] = "KIND_AUTO"
    gpus: tuple[int, ...] = ()
    # rate limiter (used only when the server enables it): resources and priority (0 acts as 1;
    # priority 2 gets half the scheduling chances of priority 1)
    resources: tuple[ResourceSpec, ...] = ()
    priority: int = 0
    # KIND_RAY: the instances are Ray actors asking for these resources (set exactly then)
    ray: RaySpec | None = None
    # the index in the whole group of this process's first instance of it: with ``--workers N``
    # a worker may load a share of a group (repository/placement.py), named as Triton would
    first: int = 0


@dataclass(frozen=True, slots=True)
class WarmupInput:
    """One input of a warmup sample: ``source`` is "zero", "random" or "file" (``path``, raw
    row-major bytes; BYTES elements as a 4-byte length then the bytes, as Triton reads them)."""

    datatype: str
    dims: tuple[int, ...]
    source: Literal["zero", "random", "file"] = "zero"
    path: str = ""


@dataclass(frozen=True, slots=True)
class WarmupSpec:
    """A warmup sample (Triton's ``ModelWarmup``): run ``count`` times (at least once) through
    each instance before the model reports READY; ``batch_size`` rows when the model batches."""

    name: str
    inputs: dict[str, WarmupInput]
    batch_size: int = 1
    count: int = 1


@dataclass(frozen=True, slots=True)
class SwitchCase:
    """``when`` holds: ``op`` applied to (tensor, value), reduced over elements by ``reduce``."""

    branch: str
    op: Literal["eq", "ne", "gt", "ge", "lt", "le"]
    value: float | int | str | bool
    reduce: Literal["all", "any"] = "all"


@dataclass(frozen=True, slots=True)
class SwitchSpec:
    """Routes ``payload`` to the first branch whose case holds on ``on`` (else ``default``).

    ``on`` is written ``input`` in YAML (YAML 1.1 reads a bare ``on`` key as ``true``)."""

    on: Ref
    payload: Ref
    cases: tuple[SwitchCase, ...]
    default: str | None = None

    @property
    def branches(self) -> tuple[str, ...]:
        names = [c.branch for c in self.cases]
        if self.default is not None and self.default not in names:
            names.append(self.default)
        return tuple(dict.fromkeys(names))


@dataclass(frozen=True, slots=True)
class SplitTarget:
    """A servable a split node calls: a repository model (``kind`` "model", maybe a version)
    or a graph."""

    kind: Literal["model", "graph"]
    target: str
    version: str = ""

    def __str__(self) -> str:
        return f"{self.kind} '{self.target}'" + (f" version {self.version}" if self.version else "")


@dataclass(frozen=True, slots=True)
class SplitArm:
    name: str
    target: SplitTarget
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class ShadowSpec:
    """A copy of (a ``fraction`` of) the requests goes to ``target``; its answer is discarded.
    At most ``max_in_flight`` copies run at once (more are dropped and counted)."""

    target: SplitTarget
    fraction: float = 1.0
    max_in_flight: int = 64


# the node input a split's sticky key tensor arrives on (it is not passed on to the arm)
STICKY_INPUT = "split.sticky"


@dataclass(frozen=True, slots=True)
class SplitSpec:
    """Traffic split between arms (canary, A/B): the arm named by request parameter
    ``by_parameter`` when the request sets it; else, with a sticky key (the ``sticky`` input or
    the ``sticky_parameter`` request parameter), the arm the key's hash falls into by weight;
    else a weighted random draw. ``shadow`` mirrors requests to one more target."""

    arms: tuple[SplitArm, ...]
    by_parameter: str = ""
    sticky: Ref | None = None
    sticky_parameter: str = ""
    shadow: ShadowSpec | None = None


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    kind: str  # the name of a registered kind (flowserve/spec/kinds.py)
    target: str = ""
    version: str = ""
    inputs: dict[str, Binding] = field(default_factory=dict)
    outputs: dict[str, TensorSpec | None] = field(default_factory=dict)
    batching: BatchingSpec | None = None
    instances: InstanceSpec = InstanceSpec()
    parameters: dict[str, Any] = field(default_factory=dict)
    switch: SwitchSpec | None = None
    split: SplitSpec | None = None
    # answer identical inputs from the server's response cache instead of running the node
    cache: bool = False


def node_targets(node: NodeSpec, shadow: bool = True) -> tuple[str, ...]:
    """The servables a node calls (see :func:`flowserve.spec.kinds.node_targets`, which asks
    the node's kind; imported here when called, as kinds builds on these types)."""
    from flowserve.spec.kinds import node_targets as targets

    return targets(node, shadow)


@dataclass(frozen=True, slots=True)
class GraphOutput:
    name: str
    source: Binding
    datatype: str | None = None
    dims: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class GraphSpec:
    """A pipeline: named inputs, nodes wired by tensor references, named outputs."""

    name: str
    source: str
    inputs: dict[str, TensorSpec]
    outputs: dict[str, GraphOutput]
    nodes: dict[str, NodeSpec]
    max_batch_size: int = 0
    description: str = ""
    platform: str = "flowserve_graph"
    response_cache: bool = False
    warmup: tuple[WarmupSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model of a Triton-layout repository, after config.pbtxt/config.yaml translation.

    ``config`` keeps Triton's ModelConfig protobuf for the model-config endpoint;
    ``graph`` is set for ensembles (``platform: "ensemble"``).
    """

    name: str
    source: str
    backend: str
    platform: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    versions: dict[int, str]
    default_model_filename: str = ""
    batching: BatchingSpec | None = None
    instances: tuple[InstanceSpec, ...] = ()
    parameters: dict[str, str] = field(default_factory=dict)
    decoupled: bool = False
    graph: GraphSpec | None = None
    config: ModelConfig = field(default_factory=new_config)
    warmup: tuple[WarmupSpec, ...] = ()


def model_graph(model: ModelSpec) -> GraphSpec:
    """A repository model as a one-node graph (an ensemble is already a graph)."""
    if model.graph is not None:
        return model.graph
    node = NodeSpec(
        name=model.name,
        kind="backend",
        target=model.name,
        inputs={t.name: (Ref(None, t.name),) for t in model.inputs},
        outputs={t.name: t for t in model.outputs},
    )
    return GraphSpec(
        name=model.name,
        source=model.source,
        inputs={t.name: t for t in model.inputs},
        outputs={
            t.name: GraphOutput(t.name, (Ref(model.name, t.name),), t.datatype, t.dims) for t in model.outputs
        },
        nodes={model.name: node},
        max_batch_size=model.max_batch_size,
        platform=model.platform or model.backend,
    )
