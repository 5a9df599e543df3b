"""The built-in layout: a layered drawing of a graph view in pure Python (no graphviz), as an
SVG whose vertex groups carry the vertex ids and ``data-name`` so a page can find them."""

from __future__ import annotations

import html
import itertools
from dataclasses import dataclass

from flowserve.graph.view import Edge, GraphView, Vertex
from flowserve.observability.render.text import EDGE_COLORS, KIND_COLORS, NEUTRAL, hexagon, title_text

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
    title = _esc(title_text(view).split("\n")[0])
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
        fill = KIND_COLORS.get(v.kind, NEUTRAL)
        stroke = "#be185d" if hexagon(v.kind) else "#334155"
        dash = ' stroke-dasharray="5,3"' if v.role != "node" else ""
        rx = 14 if hexagon(v.kind) else 6
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
