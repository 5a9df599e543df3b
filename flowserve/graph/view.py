"""The drawable form of a plan (:func:`graph_view`): a pure function of the plan, kept in the
graph layer; drawing it (DOT, Mermaid, layout, SVG, HTML, graphviz) is presentation and lives
in :mod:`flowserve.observability.render`.

The view has vertices for the graph inputs, the nodes and the graph outputs, and one edge per
tensor that flows, labelled with the tensor name, datatype and shape. Switch branches are their
own edge style (labelled with the case that selects them) and the candidates of a "first
present" binding are numbered. Nodes show their kind's label (``Kind.label`` in
:mod:`flowserve.spec.kinds`), then batching and instance settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from flowserve.graph.plan import Plan, PlanNode
from flowserve.spec.kinds import case_text, kind_of
from flowserve.spec.schema import BatchingSpec, InstanceSpec, ModelSpec, SwitchSpec, TensorSpec

Role = Literal["input", "node", "output"]
EdgeStyle = Literal["data", "branch", "first_present"]


@dataclass(frozen=True, slots=True)
class Vertex:
    id: str  # stable element id, also used in SVG ("fs_node_2")
    role: Role
    name: str
    kind: str  # "input" | "output" | a node kind (python, model, switch, graph, backend)
    lines: tuple[str, ...] = ()  # details shown under the name


@dataclass(frozen=True, slots=True)
class Edge:
    source: str  # vertex ids
    target: str
    tensor: str  # the producer's tensor name
    ports: tuple[str, ...]  # the consumer's input names (or the graph output name)
    datatype: str
    shape: str
    style: EdgeStyle = "data"
    note: str = ""  # "branch big: x gt 100 (any)" or "1st of 2"

    @property
    def label(self) -> str:
        ports = [p for p in self.ports if p != self.tensor]
        head = f"{self.tensor} → {', '.join(ports)}" if ports else self.tensor
        lines = [head, f"{self.datatype} {self.shape}"]
        if self.note:
            lines.insert(0, self.note)
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class GraphView:
    name: str
    description: str
    platform: str
    max_batch_size: int
    vertices: tuple[Vertex, ...]
    edges: tuple[Edge, ...]
    node_ids: dict[str, str] = field(default_factory=dict)  # plan node name -> vertex id

    def vertex(self, vid: str) -> Vertex:
        for v in self.vertices:
            if v.id == vid:
                return v
        raise KeyError(vid)

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "description": self.description,
            "platform": self.platform,
            "max_batch_size": self.max_batch_size,
            "vertices": [
                {"id": v.id, "role": v.role, "name": v.name, "kind": v.kind, "lines": list(v.lines)}
                for v in self.vertices
            ],
            "edges": [
                {
                    "source": e.source,
                    "target": e.target,
                    "tensor": e.tensor,
                    "ports": list(e.ports),
                    "datatype": e.datatype,
                    "shape": e.shape,
                    "style": e.style,
                    "note": e.note,
                    "label": e.label,
                }
                for e in self.edges
            ],
            "node_ids": dict(self.node_ids),
        }


def node_element_id(index: int) -> str:
    """The element id of plan node ``index`` in every drawing (DOT/graphviz SVG and built-in)."""
    return f"fs_node_{index}"


def shape_text(dims: tuple[int, ...] | None) -> str:
    if dims is None:
        return "[?]"
    return "[" + ",".join(str(d) for d in dims) + "]"


def batching_text(b: BatchingSpec) -> str:
    parts = [f"max {b.max_batch_size}"]
    if b.preferred_batch_size:
        parts.append("preferred " + "/".join(str(p) for p in b.preferred_batch_size))
    if b.max_queue_delay_us:
        parts.append(f"delay {b.max_queue_delay_us}µs")
    if b.priority_levels:
        parts.append(f"{b.priority_levels} priorities")
    if b.default_queue_policy.max_queue_size:
        parts.append(f"queue ≤{b.default_queue_policy.max_queue_size}")
    if b.preserve_ordering:
        parts.append("ordered")
    return "batching: " + ", ".join(parts)


def instances_text(groups: tuple[InstanceSpec, ...]) -> str:
    parts = []
    for g in groups:
        text = f"{g.count} x {g.kind.removeprefix('KIND_')}"
        if g.gpus:
            text += " gpu " + ",".join(str(i) for i in g.gpus)
        parts.append(text)
    return "instances: " + " + ".join(parts)


def _node_lines(node: PlanNode, models: Mapping[str, ModelSpec]) -> tuple[str, ...]:
    spec = node.spec
    kind = kind_of(spec)
    target = models.get(spec.target) if kind.runs_model else None
    lines = kind.label(spec, target)
    batching = spec.batching or (target.batching if target is not None else None)
    if batching is not None:
        where = "" if spec.batching is not None else " (model)"
        lines.append(batching_text(batching) + where)
    groups: tuple[InstanceSpec, ...] = ()
    if spec.instances != InstanceSpec():
        groups = (spec.instances,)
    elif target is not None and target.instances:
        groups = target.instances
    if groups:
        lines.append(instances_text(groups))
    return tuple(lines)


def _ordinal(i: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(i, f"{i}th")


def graph_view(plan: Plan, models: Mapping[str, ModelSpec] | None = None) -> GraphView:
    """The drawable form of ``plan``. ``models`` (the repository's model specs) adds the
    batching and instance settings of the models that nodes run."""
    models = models or {}
    vertices: list[Vertex] = []
    key_source: dict[str, tuple[str, str, TensorSpec | None]] = {}  # key -> (vertex, tensor, type)
    for i, (name, tspec) in enumerate(plan.inputs.items()):
        vid = f"fs_in_{i}"
        extra = ("optional",) if tspec.optional else ()
        lines = (f"{tspec.datatype} {shape_text(tspec.dims)}", *extra)
        vertices.append(Vertex(vid, "input", name, "input", lines))
        key_source[f"${name}"] = (vid, name, tspec)
    node_ids: dict[str, str] = {}
    switches: dict[str, SwitchSpec] = {}
    for node in plan.nodes:
        vid = node_element_id(node.index)
        node_ids[node.name] = vid
        vertices.append(Vertex(vid, "node", node.name, node.spec.kind, _node_lines(node, models)))
        if node.spec.switch is not None:
            switches[node.name] = node.spec.switch
        for out in node.outputs:
            key_source[f"{node.name}.{out}"] = (vid, out, node.signature.outputs.get(out))

    # (source, target, tensor, style, note) -> ports, in first-seen order
    grouped: dict[tuple[str, str, str, EdgeStyle, str], list[str]] = {}
    types: dict[tuple[str, str, str, EdgeStyle, str], TensorSpec | None] = {}

    def connect(key: str, target: str, port: str, rank: int, of: int, want: TensorSpec | None) -> None:
        source_vid, tensor, spec = key_source[key]
        style: EdgeStyle = "data"
        note = ""
        producer = key.split(".", 1)[0]
        if not key.startswith("$") and producer in switches:
            style, note = "branch", f"branch {tensor}: {case_text(switches[producer], tensor)}"
        if of > 1:
            style = "first_present" if style == "data" else style
            note = (note + "; " if note else "") + f"{_ordinal(rank)} of {of} (first present)"
        group = (source_vid, target, tensor, style, note)
        grouped.setdefault(group, []).append(port)
        types.setdefault(group, spec if spec is not None else want)

    for node in plan.nodes:
        vid = node_ids[node.name]
        inputs = node.signature.inputs or {}
        for port, keys in node.bindings:
            for rank, key in enumerate(keys, 1):
                if key in key_source:
                    connect(key, vid, port, rank, len(keys), inputs.get(port))
    for i, pout in enumerate(plan.outputs):
        vid = f"fs_out_{i}"
        lines = (f"{pout.tensor.datatype} {shape_text(pout.tensor.dims)}",)
        vertices.append(Vertex(vid, "output", pout.name, "output", lines))
        for rank, key in enumerate(pout.keys, 1):
            if key in key_source:
                connect(key, vid, pout.name, rank, len(pout.keys), pout.tensor)

    edges = []
    for group, ports in grouped.items():
        source, target, tensor, style, note = group
        ttype = types[group]
        datatype = ttype.datatype if ttype is not None else "?"
        shape = shape_text(ttype.dims) if ttype is not None else "[?]"
        edges.append(Edge(source, target, tensor, tuple(ports), datatype, shape, style, note))
    return GraphView(
        name=plan.name,
        description=plan.spec.description,
        platform=plan.spec.platform,
        max_batch_size=plan.max_batch_size,
        vertices=tuple(vertices),
        edges=tuple(edges),
        node_ids=node_ids,
    )


__all__ = [
    "Edge",
    "EdgeStyle",
    "GraphView",
    "Role",
    "Vertex",
    "batching_text",
    "case_text",
    "graph_view",
    "instances_text",
    "node_element_id",
    "shape_text",
]
