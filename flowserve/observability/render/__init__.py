"""Drawing a plan: DOT, Mermaid, SVG (graphviz or a built-in layout), PNG, a self-contained
HTML page. Presentation, next to the web page that shows it (``observability/ui.py``) and used
by ``flowserve graph render``; the graph layer only supplies the pure view
(:func:`flowserve.graph.view.graph_view`).

- ``text``: DOT and Mermaid source, the colours; a node kind's colour and shape are its
  ``Look`` in :mod:`flowserve.spec.kinds` (nothing here names a node kind)
- ``layout``: the built-in layered layout and its SVG (no graphviz needed)
- ``page``: the HTML page and the one subprocess, graphviz's ``dot`` (:func:`dot_to`)

::

    view = graph_view(plan, models)
    text = to_dot(view)           # or to_mermaid(view), builtin_svg(view), to_html(view)
    svg = dot_to(text, "svg")     # raises GraphvizMissing when dot is not installed
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from flowserve.core.errors import Unsupported
from flowserve.graph.plan import Plan
from flowserve.graph.view import Edge, GraphView, Vertex, graph_view, node_element_id
from flowserve.observability.render.layout import Layout, builtin_svg, layout
from flowserve.observability.render.page import (
    PAGE_CSS,
    GraphvizMissing,
    dot_binary,
    dot_to,
    svg_element,
    to_html,
)
from flowserve.observability.render.text import EDGE_COLORS, KIND_COLORS, to_dot, to_mermaid
from flowserve.spec.schema import ModelSpec

FORMATS = ("dot", "mmd", "svg", "png", "html")


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
    "EDGE_COLORS",
    "FORMATS",
    "KIND_COLORS",
    "PAGE_CSS",
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
