"""The self-contained HTML page of a graph, and the one call of graphviz's ``dot`` binary
(the only I/O of rendering; without it, the built-in layout draws)."""

from __future__ import annotations

import html
import shutil
import subprocess
from typing import Literal

from flowserve.core.errors import FlowserveError, Unsupported
from flowserve.graph.view import GraphView
from flowserve.observability.render.layout import builtin_svg
from flowserve.observability.render.text import EDGE_COLORS


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


class GraphvizMissing(Unsupported):
    """graphviz's ``dot`` binary is not installed."""


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
