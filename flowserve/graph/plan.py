"""The immutable execution plan a spec compiles into."""

from __future__ import annotations

from dataclasses import dataclass

from flowserve.spec.schema import GraphSpec, NodeSpec, TensorSpec


@dataclass(frozen=True, slots=True)
class Signature:
    """What a node consumes and produces. Shapes are full shapes (batch dim included).

    ``inputs`` is None for a node that accepts whatever inputs it is wired with.
    A tensor spec of None means "type unknown" and is not checked.
    """

    inputs: dict[str, TensorSpec | None] | None
    outputs: dict[str, TensorSpec | None]
    optional: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class PlanNode:
    index: int
    name: str
    spec: NodeSpec
    # node input name -> candidate tensor keys ("$x" / "node.tensor"); first present wins
    bindings: tuple[tuple[str, tuple[str, ...]], ...]
    outputs: tuple[str, ...]
    optional: frozenset[str]
    signature: Signature


@dataclass(frozen=True, slots=True)
class PlanOutput:
    name: str
    keys: tuple[str, ...]
    tensor: TensorSpec


@dataclass(frozen=True, slots=True)
class Plan:
    """A validated graph: nodes in topological order, edges as tensor keys."""

    spec: GraphSpec
    nodes: tuple[PlanNode, ...]
    inputs: dict[str, TensorSpec]
    outputs: tuple[PlanOutput, ...]
    # tensor key -> indexes of nodes whose bindings name it
    consumers: dict[str, tuple[int, ...]]
    # tensor key -> names of graph outputs that name it
    output_keys: dict[str, tuple[str, ...]]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def max_batch_size(self) -> int:
        return self.spec.max_batch_size

    def node(self, name: str) -> PlanNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)
