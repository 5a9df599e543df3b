"""Draw a plan: DOT, Mermaid, SVG (graphviz or a built-in layout), PNG, a self-contained HTML page.

Everything starts from one pure view of the plan (:func:`graph_view`): vertices for the graph
inputs, the nodes and the graph outputs; one edge per tensor that flows, labelled with the
tensor name, datatype and shape. Switch branches are their own edge style (bold, labelled with
the case that selects them) and the candidates of a "first present" binding are dashed and
numbered. Nodes show their kind, target, batching and instance settings.

The only I/O here is the optional call of graphviz's ``dot`` binary (:func:`dot_to`); without
it, :func:`builtin_svg` lays the graph out in pure Python, so a page always has a drawing::

    view = graph_view(plan, models)
    text = to_dot(view)           # or to_mermaid(view), builtin_svg(view), to_html(view)
    svg = dot_to(text, "svg")     # raises GraphvizMissing when dot is not installed
"""

from __future__ import annotations

import html
import itertools
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from flowserve.core.errors import FlowserveError, Unsupported
from flowserve.graph.plan import Plan, PlanNode
from flowserve.spec.schema import BatchingSpec, InstanceSpec, ModelSpec, SwitchSpec, TensorSpec

Role = Literal["input", "node", "output"]
EdgeStyle = Literal["data", "branch", "first_present"]
FORMATS = ("dot", "mmd", "svg", "png", "html")


class GraphvizMissing(Unsupported):
    """graphviz's ``dot`` binary is not installed."""


# ----------------------------------------------------------------------------- the view


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


def case_text(switch: SwitchSpec, branch: str) -> str:
    on = switch.on.key.removeprefix("$")
    conds = [f"{on} {c.op} {c.value!r} ({c.reduce})" for c in switch.cases if c.branch == branch]
    if conds:
        return " or ".join(conds)
    return "default" if branch == switch.default else "never"


def _node_lines(node: PlanNode, models: Mapping[str, ModelSpec]) -> tuple[str, ...]:
    spec = node.spec
    lines: list[str] = []
    target = models.get(spec.target) if spec.kind in ("model", "backend") else None
    if spec.kind == "switch" and spec.switch is not None:
        lines.append("switch")
        lines += [f"{b}: {case_text(spec.switch, b)}" for b in spec.switch.branches]
    elif spec.kind == "split" and spec.split is not None:
        lines.append("split")
        lines += [f"{a.name} ({a.weight:g}): {a.target}" for a in spec.split.arms]
        if spec.split.shadow is not None:
            lines.append(f"shadow: {spec.split.shadow.target}")
    elif spec.kind == "backend":
        backend = target.platform or target.backend if target is not None else ""
        lines.append(f"backend: {backend}" if backend else "backend")
    else:
        version = f" v{spec.version}" if spec.version else ""
        runs = f" ({target.platform or target.backend})" if target is not None else ""
        lines.append(f"{spec.kind}: {spec.target}{version}{runs}")
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


# ----------------------------------------------------------------------------- DOT

KIND_COLORS = {
    "input": "#dbeafe",
    "output": "#e5e7eb",
    "python": "#fef3c7",
    "model": "#dcfce7",
    "backend": "#dcfce7",
    "graph": "#e0e7ff",
    "switch": "#fce7f3",
}
EDGE_COLORS: dict[EdgeStyle, str] = {"data": "#475569", "branch": "#be185d", "first_present": "#2563eb"}


def _dot_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _dot_html(text: str) -> str:
    return html.escape(text, quote=True)


def _dot_vertex(v: Vertex) -> str:
    rows = [f"<TR><TD><B>{_dot_html(v.name)}</B></TD></TR>"]
    rows += [f'<TR><TD><FONT POINT-SIZE="10">{_dot_html(line)}</FONT></TD></TR>' for line in v.lines]
    label = '<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="1">' + "".join(rows) + "</TABLE>>"
    shape = {"input": "cds", "output": "note", "switch": "hexagon"}.get(v.kind, "box")
    style = "filled" if v.kind in ("input", "output", "switch") else "filled,rounded"
    attrs = {
        "id": _dot_str(v.id),
        "label": label,
        "shape": shape,
        "style": _dot_str(style),
        "fillcolor": _dot_str(KIND_COLORS.get(v.kind, "#f3f4f6")),
        "tooltip": _dot_str(f"{v.kind}: {v.name}"),
        "class": _dot_str(f"fs-vertex fs-{v.role} fs-kind-{v.kind}"),
    }
    return f"  {_dot_str(v.id)} [" + ", ".join(f"{k}={a}" for k, a in attrs.items()) + "];"


def to_dot(view: GraphView) -> str:
    """Graphviz DOT source (left to right; ids of the SVG elements are the vertex ids)."""
    lines = [
        f"digraph {_dot_str(view.name)} {{",
        '  rankdir=LR; nodesep=0.6; ranksep=0.9; pad="0.2,0.4";',
        f'  graph [fontname="Helvetica", label={_dot_str(_title(view))}, labelloc=t, fontsize=14];',
        '  node [fontname="Helvetica", fontsize=12, margin="0.15,0.08"];',
        '  edge [fontname="Helvetica", fontsize=10];',
    ]
    lines += [_dot_vertex(v) for v in view.vertices]
    for i, e in enumerate(view.edges):
        attrs = {
            "id": _dot_str(f"fs_edge_{i}"),
            "label": _dot_str(e.label),
            "color": _dot_str(EDGE_COLORS[e.style]),
            "fontcolor": _dot_str(EDGE_COLORS[e.style]),
            "class": _dot_str(f"fs-edge fs-edge-{e.style}"),
        }
        if e.style == "branch":
            attrs["style"] = "bold"
            attrs["penwidth"] = "2"
        elif e.style == "first_present":
            attrs["style"] = "dashed"
        lines.append(
            f"  {_dot_str(e.source)} -> {_dot_str(e.target)} ["
            + ", ".join(f"{k}={a}" for k, a in attrs.items())
            + "];"
        )
    lines.append("}")
    return "\n".join(lines) + "\n"


def _title(view: GraphView) -> str:
    title = f"{view.name} ({view.platform}"
    title += f", max_batch_size {view.max_batch_size})" if view.max_batch_size else ")"
    return title + (f"\n{view.description}" if view.description else "")


# ----------------------------------------------------------------------------- Mermaid


def _mmd(text: str) -> str:
    return (
        text.replace("&", "&amp;")
        .replace('"', "#quot;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace("\n", "<br/>")
    )


def to_mermaid(view: GraphView) -> str:
    """A Mermaid ``flowchart`` (for Markdown docs): dashed edges for first-present candidates,
    thick edges for switch branches."""
    ids = {v.id: v.id.replace("-", "_") for v in view.vertices}
    out = [f"%% {view.name}: {view.description}" if view.description else f"%% {view.name}", "flowchart LR"]
    for v in view.vertices:
        text = _mmd("\n".join((v.name, *v.lines)))
        open_, close = {"input": ("([", "])"), "output": ("[[", "]]"), "switch": ("{{", "}}")}.get(
            v.kind, ("[", "]")
        )
        out.append(f'  {ids[v.id]}{open_}"{text}"{close}')
    arrows: dict[EdgeStyle, str] = {"data": "-->", "branch": "==>", "first_present": "-.->"}
    for e in view.edges:
        out.append(f'  {ids[e.source]} {arrows[e.style]}|"{_mmd(e.label)}"| {ids[e.target]}')
    for kind, color in KIND_COLORS.items():
        members = [ids[v.id] for v in view.vertices if v.kind == kind]
        if members:
            out.append(f"  classDef k_{kind} fill:{color},stroke:#334155")
            out.append(f"  class {','.join(members)} k_{kind}")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- graphviz


def dot_binary() -> str | None:
    return shutil.which("dot")


def dot_to(dot: str, fmt: Literal["svg", "png"], timeout_s: float = 60.0) -> bytes:
    """Run graphviz ``dot`` on ``dot`` source; raises GraphvizMissing when it is not installed."""
    binary = dot_binary()
    if binary is None:
        raise GraphvizMissing(
            f"cannot render {fmt.upper()}: graphviz's 'dot' program is not installed "
            "(Debian/Ubuntu: apt-get install graphviz); DOT, Mermaid (.mmd) and HTML need no graphviz"
        )
    result = subprocess.run(
        [binary, f"-T{fmt}"], input=dot.encode(), capture_output=True, timeout=timeout_s, check=False
    )
    if result.returncode != 0:
        raise FlowserveError(f"graphviz failed: {result.stderr.decode(errors='replace').strip()}")
    return result.stdout


def svg_element(svg: str) -> str:
    """The ``<svg>`` element of an SVG document (drops the XML prolog and DOCTYPE), for inlining."""
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


# ----------------------------------------------------------------------------- built-in layout

CHAR_W = 7.3  # monospace 12px
TITLE_W = 8.2  # bold 13px
LINE_H = 15.0
PAD = 10.0
V_GAP = 36.0  # room under each box for the live counters of the web page
EDGE_CHAR_W = 6.2  # 10.5px labels


@dataclass(slots=True)
class Box:
    x: float
    y: float
    w: float
    h: float


@dataclass(slots=True)
class Layout:
    boxes: dict[str, Box]
    routes: list[list[tuple[float, float]]]  # aligned with view.edges
    labels: list[tuple[float, float]]  # edge label: centre x, top y
    width: float
    height: float


def _box_size(v: Vertex) -> tuple[float, float]:
    w = max([len(v.name) * TITLE_W] + [len(line) * CHAR_W for line in v.lines]) + 2 * PAD
    h = (1 + len(v.lines)) * LINE_H + 2 * PAD - 4
    return max(w, 70.0), h


def _label_size(e: Edge) -> tuple[float, float]:
    lines = e.label.split("\n")
    return max(len(line) for line in lines) * EDGE_CHAR_W + 8, len(lines) * 13.0


def layout(view: GraphView) -> Layout:
    """Layered left-to-right layout: longest-path layers, long edges through dummy points,
    barycenter ordering, then coordinates. Pure and deterministic."""
    index = {v.id: i for i, v in enumerate(view.vertices)}
    preds: dict[str, list[str]] = {v.id: [] for v in view.vertices}
    for e in view.edges:
        preds[e.target].append(e.source)
    layer: dict[str, int] = {}
    for v in view.vertices:  # vertices come in topological order (inputs, plan nodes, outputs)
        if v.role == "input":
            layer[v.id] = 0
        elif v.role == "node":
            layer[v.id] = max((layer[p] + 1 for p in preds[v.id] if p in layer), default=0)
    last = max(layer.values(), default=-1) + 1
    for v in view.vertices:
        if v.role == "output":
            layer[v.id] = max(last, 1)
    depth = max(layer.values(), default=0) + 1

    # chains of points through the layers each edge crosses
    layers: list[list[str]] = [[] for _ in range(depth)]
    for v in view.vertices:
        layers[layer[v.id]].append(v.id)
    chains: list[list[str]] = []
    links: list[tuple[str, str]] = []
    for i, e in enumerate(view.edges):
        first, last_layer = layer[e.source], layer[e.target]
        chain = [e.source]
        for k in range(first + 1, last_layer):
            dummy = f"~{i}.{k}"
            layers[k].append(dummy)
            chain.append(dummy)
        chain.append(e.target)
        chains.append(chain)
        links += list(itertools.pairwise(chain))
    up: dict[str, list[str]] = {}
    down: dict[str, list[str]] = {}
    for a_id, b_id in links:
        down.setdefault(a_id, []).append(b_id)
        up.setdefault(b_id, []).append(a_id)

    def sweep(neighbours: dict[str, list[str]], order: range) -> None:
        for k in order:
            prev = k - 1 if neighbours is up else k + 1
            pos = {vid: p for p, vid in enumerate(layers[prev])}

            def key(vid: str, p: int, pos: dict[str, int] = pos) -> tuple[float, int]:
                ns = [pos[n] for n in neighbours.get(vid, []) if n in pos]
                return (sum(ns) / len(ns) if ns else float(p), p)

            layers[k] = [vid for _, vid in sorted((key(v, p), v) for p, v in enumerate(layers[k]))]

    for _ in range(4):
        sweep(up, range(1, depth))
        sweep(down, range(depth - 2, -1, -1))

    sizes = {v.id: _box_size(v) for v in view.vertices}

    def size(vid: str) -> tuple[float, float]:
        return sizes.get(vid, (0.0, 16.0))

    # horizontal: column widths, gaps wide enough for the labels of edges entering a column
    col_w = [max((size(vid)[0] for vid in col), default=0.0) for col in layers]
    gap = [60.0] * depth
    for e in view.edges:
        k = layer[e.target]
        gap[k] = max(gap[k], _label_size(e)[0] + 60)
    xs: list[float] = []
    x = 20.0
    for k in range(depth):
        if k:
            x += gap[k]
        xs.append(x)
        x += col_w[k]
    width = x + 20

    col_h = [sum(size(vid)[1] for vid in col) + V_GAP * max(len(col) - 1, 0) for col in layers]
    height = max(col_h, default=0.0) + 80
    boxes: dict[str, Box] = {}
    for k, col in enumerate(layers):
        y = 40 + (height - 60 - col_h[k]) / 2
        for vid in col:
            w, h = size(vid)
            boxes[vid] = Box(xs[k] + (col_w[k] - w) / 2, y, w, h)
            y += h + V_GAP

    # spread the ends of a vertex's edges along its side, ordered by where the other end is
    def centre(vid: str) -> float:
        return boxes[vid].y + boxes[vid].h / 2

    out_port: dict[int, float] = {}
    in_port: dict[int, float] = {}
    for vid, box in boxes.items():
        outs = sorted((centre(c[1]), i) for i, c in enumerate(chains) if c[0] == vid)
        ins = sorted((centre(c[-2]), i) for i, c in enumerate(chains) if c[-1] == vid)
        for ends, ports in ((outs, out_port), (ins, in_port)):
            for n, (_, i) in enumerate(ends):
                ports[i] = box.y + box.h * (0.2 + 0.6 * (n + 1) / (len(ends) + 1))

    routes: list[list[tuple[float, float]]] = []
    for i, chain in enumerate(chains):
        first_box, last_box = boxes[chain[0]], boxes[chain[-1]]
        pts = [(first_box.x + first_box.w, out_port[i])]
        for vid in chain[1:-1]:  # a dummy: pass straight through its column
            k = _layer_of(vid)
            pts += [(xs[k], centre(vid)), (xs[k] + col_w[k], centre(vid))]
        pts.append((last_box.x, in_port[i]))
        routes.append(pts)

    # edge labels on the segment entering the target, pushed apart where they would overlap
    labels: list[tuple[float, float]] = [(0.0, 0.0)] * len(view.edges)
    by_gap: dict[int, list[tuple[float, int]]] = {}
    for i, (e, pts) in enumerate(zip(view.edges, routes, strict=True)):
        (xa, ya), (xb, yb) = pts[-2], pts[-1]
        labels[i] = ((xa + xb) / 2, (ya + yb) / 2 - _label_size(e)[1] / 2)
        by_gap.setdefault(layer[e.target], []).append((labels[i][1], i))
    for entries in by_gap.values():
        bottom = -1e9
        for _, i in sorted(entries):
            x_mid, top = labels[i]
            top = max(top, bottom + 4)
            labels[i] = (x_mid, top)
            bottom = top + _label_size(view.edges[i])[1]
            height = max(height, bottom + 20)
    real = {vid: b for vid, b in boxes.items() if vid in index}
    return Layout(real, routes, labels, width, height)


def _layer_of(dummy: str) -> int:
    return int(dummy.rsplit(".", 1)[1])


def _path(points: list[tuple[float, float]]) -> str:
    (x0, y0), rest = points[0], points[1:]
    d = f"M{x0:.1f},{y0:.1f}"
    for x1, y1 in rest:
        if abs(y1 - y0) < 0.5:
            d += f" L{x1:.1f},{y1:.1f}"
        else:
            mx = (x0 + x1) / 2
            d += f" C{mx:.1f},{y0:.1f} {mx:.1f},{y1:.1f} {x1:.1f},{y1:.1f}"
        x0, y0 = x1, y1
    return d


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def builtin_svg(view: GraphView) -> str:
    """An SVG drawing of ``view`` laid out in pure Python (no graphviz needed). Vertex groups
    carry the vertex ids and ``data-name`` so a page can find them."""
    lay = layout(view)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="fs-graph" width="{lay.width:.0f}" '
        f'height="{lay.height:.0f}" viewBox="0 0 {lay.width:.0f} {lay.height:.0f}" '
        'font-family="DejaVu Sans Mono, Menlo, Consolas, monospace">',
        f"<title>{_esc(view.name)}</title>",
        "<defs>",
    ]
    for style, color in EDGE_COLORS.items():
        out.append(
            f'<marker id="fs-arrow-{style}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
            f'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{color}"/>'
            "</marker>"
        )
    out.append("</defs>")
    title = _esc(_title(view).split("\n")[0])
    out.append(f'<text x="20" y="22" font-size="14" font-weight="bold" fill="#0f172a">{title}</text>')
    for i, (e, pts) in enumerate(zip(view.edges, lay.routes, strict=True)):
        color = EDGE_COLORS[e.style]
        dash = ' stroke-dasharray="6,4"' if e.style == "first_present" else ""
        width = 2.6 if e.style == "branch" else 1.4
        out.append(
            f'<g id="fs_edge_{i}" class="fs-edge fs-edge-{e.style}"><title>{_esc(e.label)}</title>'
            f'<path d="{_path(pts)}" fill="none" stroke="{color}" stroke-width="{width}"{dash} '
            f'marker-end="url(#fs-arrow-{e.style})"/>'
        )
        lw, lh = _label_size(e)
        lx, ly = lay.labels[i]
        out.append(
            f'<rect x="{lx - lw / 2:.1f}" y="{ly - 2:.1f}" width="{lw:.1f}" height="{lh + 2:.1f}" '
            'fill="#ffffff" fill-opacity="0.85" rx="3"/>'
        )
        for j, line in enumerate(e.label.split("\n")):
            out.append(
                f'<text x="{lx:.1f}" y="{ly + 10 + 13 * j:.1f}" font-size="10.5" text-anchor="middle" '
                f'fill="{color}">{_esc(line)}</text>'
            )
        out.append("</g>")
    for v in view.vertices:
        b = lay.boxes[v.id]
        fill = KIND_COLORS.get(v.kind, "#f3f4f6")
        stroke = "#be185d" if v.kind == "switch" else "#334155"
        dash = ' stroke-dasharray="5,3"' if v.role != "node" else ""
        rx = 14 if v.kind == "switch" else 6
        out.append(
            f'<g id="{v.id}" class="fs-vertex fs-{v.role} fs-kind-{v.kind}" data-name="{_esc(v.name)}">'
            f"<title>{_esc(v.kind)}: {_esc(v.name)}</title>"
            f'<rect x="{b.x:.1f}" y="{b.y:.1f}" width="{b.w:.1f}" height="{b.h:.1f}" rx="{rx}" '
            f'fill="{fill}" stroke="{stroke}" stroke-width="1.3"{dash}/>'
            f'<text x="{b.x + PAD:.1f}" y="{b.y + PAD + 11:.1f}" font-size="13" font-weight="bold" '
            f'fill="#0f172a">{_esc(v.name)}</text>'
        )
        for j, line in enumerate(v.lines):
            out.append(
                f'<text x="{b.x + PAD:.1f}" y="{b.y + PAD + 11 + LINE_H * (j + 1):.1f}" font-size="12" '
                f'fill="#334155">{_esc(line)}</text>'
            )
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- HTML

PAGE_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0;
  color:#0f172a;background:#f8fafc}
header{background:#0f172a;color:#f8fafc;padding:10px 20px;display:flex;gap:18px;align-items:baseline}
header a{color:#93c5fd;text-decoration:none} header h1{font-size:18px;margin:0}
main{padding:16px 20px} h2{font-size:16px;margin:18px 0 8px}
.card{background:#fff;border:1px solid #e2e8f0;border-radius:8px;padding:12px;margin-bottom:14px;
  overflow:auto}
table{border-collapse:collapse;font-size:13px}
th,td{padding:4px 10px;border-bottom:1px solid #e2e8f0;text-align:left}
th{background:#f1f5f9;font-weight:600} td.num{text-align:right;font-variant-numeric:tabular-nums}
.card > svg{max-width:100%;height:auto}
.muted{color:#64748b} .bad{color:#b91c1c} .ok{color:#15803d}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
"""


def to_html(view: GraphView, svg: str | None = None) -> str:
    """A self-contained page: the drawing (``svg`` from graphviz, or the built-in layout),
    and tables of the inputs, outputs, nodes and edges. Needs nothing from the network."""
    drawing = svg_element(svg) if svg is not None else builtin_svg(view)
    rows = "".join(
        f"<tr><td>{_esc(v.role)}</td><td><b>{_esc(v.name)}</b></td><td>{_esc(v.kind)}</td>"
        f"<td>{'<br>'.join(_esc(line) for line in v.lines)}</td></tr>"
        for v in view.vertices
    )
    names = {v.id: v.name for v in view.vertices}
    edges = "".join(
        f"<tr><td>{_esc(names[e.source])}</td><td>{_esc(names[e.target])}</td><td>{_esc(e.tensor)}</td>"
        f"<td>{_esc(', '.join(e.ports))}</td><td>{_esc(e.datatype)}</td><td>{_esc(e.shape)}</td>"
        f"<td>{_esc(e.style)}</td><td>{_esc(e.note)}</td></tr>"
        for e in view.edges
    )
    legend = (
        '<div class="legend">'
        f'<span style="color:{EDGE_COLORS["data"]}">── data edge</span>'
        f'<span style="color:{EDGE_COLORS["branch"]}"><b>━━ switch branch</b></span>'
        f'<span style="color:{EDGE_COLORS["first_present"]}">- - first-present candidate</span></div>'
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_esc(view.name)} · flowserve graph</title>
<style>{PAGE_CSS}</style></head>
<body><header><h1>flowserve · {_esc(view.name)}</h1>
<span class="muted">{_esc(view.description)}</span></header>
<main><div class="card">{drawing}{legend}</div>
<h2>Vertices</h2><div class="card"><table><tr><th>role</th><th>name</th><th>kind</th><th>settings</th></tr>
{rows}</table></div>
<h2>Edges</h2><div class="card"><table><tr><th>from</th><th>to</th><th>tensor</th><th>into</th>
<th>datatype</th><th>shape</th><th>style</th><th>note</th></tr>{edges}</table></div>
</main></body></html>
"""


# ----------------------------------------------------------------------------- one entry point


def render(
    plan: Plan,
    fmt: str,
    models: Mapping[str, ModelSpec] | None = None,
    layout_engine: Literal["auto", "dot", "builtin"] = "auto",
) -> bytes:
    """``plan`` in ``fmt`` (dot, mmd, svg, png, html). SVG and PNG need graphviz unless
    ``layout_engine`` is "builtin" (SVG only); HTML uses graphviz when present ("auto")."""
    fmt = fmt.lower().removeprefix(".")
    fmt = "mmd" if fmt == "mermaid" else fmt
    view = graph_view(plan, models)
    if fmt == "dot":
        return to_dot(view).encode()
    if fmt == "mmd":
        return to_mermaid(view).encode()
    use_dot = layout_engine == "dot" or (layout_engine == "auto" and dot_binary() is not None)
    if fmt == "svg":
        return dot_to(to_dot(view), "svg") if use_dot else builtin_svg(view).encode()
    if fmt == "png":
        if layout_engine == "builtin":
            raise Unsupported("PNG needs graphviz; the built-in layout draws SVG only")
        return dot_to(to_dot(view), "png")
    if fmt == "html":
        svg = dot_to(to_dot(view), "svg").decode() if use_dot else None
        return to_html(view, svg).encode()
    raise Unsupported(f"unknown format '{fmt}' (formats: {', '.join(FORMATS)})")


__all__ = [
    "FORMATS",
    "Edge",
    "GraphView",
    "GraphvizMissing",
    "Layout",
    "Vertex",
    "builtin_svg",
    "dot_binary",
    "dot_to",
    "graph_view",
    "layout",
    "node_element_id",
    "render",
    "svg_element",
    "to_dot",
    "to_html",
    "to_mermaid",
]
