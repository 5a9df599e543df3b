"""The declarative description of models and graphs, shared by YAML graphs and config.pbtxt.

Everything here is frozen plain data; the graph layer compiles it into an execution plan.
Shapes follow Triton: when ``max_batch_size > 0`` the batch dimension is implicit and not
written in ``dims``; :meth:`TensorSpec.full_shape` adds it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# "backend" is internal: the one node of a repository model's own graph, running its backend.
NodeKind = Literal["model", "python", "switch", "graph", "backend"]
NODE_KINDS: tuple[NodeKind, ...] = ("model", "python", "switch", "graph")


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
class InstanceSpec:
    count: int = 1
    kind: Literal["KIND_AUTO", "KIND_CPU", "KIND_GPU", "KIND_MODEL"] = "KIND_AUTO"
    gpus: tuple[int, ...] = ()


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
class NodeSpec:
    name: str
    kind: NodeKind
    target: str = ""
    version: str = ""
    inputs: dict[str, Binding] = field(default_factory=dict)
    outputs: dict[str, TensorSpec | None] = field(default_factory=dict)
    batching: BatchingSpec | None = None
    instances: InstanceSpec = InstanceSpec()
    parameters: dict[str, Any] = field(default_factory=dict)
    switch: SwitchSpec | None = None


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
    config: Any = None


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
