"""A graph view as text: Graphviz DOT and a Mermaid flowchart, and the colours every drawing
uses. A node kind's colour and shape come from its ``Look`` (:mod:`flowserve.spec.kinds`)."""

from __future__ import annotations

import html

from flowserve.graph.view import EdgeStyle, GraphView, Vertex
from flowserve.spec.kinds import KINDS

NEUTRAL = "#f3f4f6"
# fill colours by vertex kind: the graph's inputs and outputs, then each node kind's own look
KIND_COLORS = {
    "input": "#dbeafe",
    "output": "#e5e7eb",
    **{k.name: k.look.color for k in KINDS.values() if k.look.color is not None},
}
EDGE_COLORS: dict[EdgeStyle, str] = {"data": "#475569", "branch": "#be185d", "first_present": "#2563eb"}


def _dot_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _dot_html(text: str) -> str:
    return html.escape(text, quote=True)


def hexagon(kind: str) -> bool:
    """Whether vertices of ``kind`` are drawn as hexagons (a switch: see ``Look``)."""
    k = KINDS.get(kind)
    return k is not None and k.look.shape == "hexagon"


def _dot_vertex(v: Vertex) -> str:
    rows = [f"<TR><TD><B>{_dot_html(v.name)}</B></TD></TR>"]
    rows += [f'<TR><TD><FONT POINT-SIZE="10">{_dot_html(line)}</FONT></TD></TR>' for line in v.lines]
    label = '<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="1">' + "".join(rows) + "</TABLE>>"
    shape = {"input": "cds", "output": "note"}.get(v.kind) or ("hexagon" if hexagon(v.kind) else "box")
    style = "filled" if v.kind in ("input", "output") or hexagon(v.kind) else "filled,rounded"
    attrs = {
        "id": _dot_str(v.id),
        "label": label,
        "shape": shape,
        "style": _dot_str(style),
        "fillcolor": _dot_str(KIND_COLORS.get(v.kind, NEUTRAL)),
        "tooltip": _dot_str(f"{v.kind}: {v.name}"),
        "class": _dot_str(f"fs-vertex fs-{v.role} fs-kind-{v.kind}"),
    }
    return f"  {_dot_str(v.id)} [" + ", ".join(f"{k}={a}" for k, a in attrs.items()) + "];"


def to_dot(view: GraphView) -> str:
    """Graphviz DOT source (left to right; ids of the SVG elements are the vertex ids)."""
    lines = [
        f"digraph {_dot_str(view.name)} {{",
        '  rankdir=LR; nodesep=0.6; ranksep=0.9; pad="0.2,0.4";',
        f'  graph [fontname="Helvetica", label={_dot_str(title_text(view))}, labelloc=t, fontsize=14];',
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


def title_text(view: GraphView) -> str:
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
        open_, close = {"input": ("([", "])"), "output": ("[[", "]]")}.get(
            v.kind, ("{{", "}}") if hexagon(v.kind) else ("[", "]")
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
