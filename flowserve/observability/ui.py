"""The web page: models and graphs, a graph's DAG with live per-node counters, request traces.

:func:`make_ui_app` returns a raw ASGI callable for the HTTP front end to mount at ``/ui``.
It works whether the mount strips the prefix (``root_path`` set, ``path`` relative) or not
(``path`` still starting with ``/ui``). Pages are server-rendered HTML with a small inline
script that polls JSON under ``/ui/api/...``; the drawing is graphviz's SVG when ``dot`` is
installed and the built-in layout otherwise, so the page needs no CDN, no build step, no network.

Routes (relative to the mount)::

    GET  /                              models and graphs with their state
    GET  /graph/{name}[?version=]       the graph page
    GET  /api/models                    the same list as JSON
    GET  /api/graphs/{name}             the drawable view (vertices, edges) as JSON
    GET  /api/graphs/{name}/stats       model and per-node counters (what the page polls)
    GET  /api/graphs/{name}/{svg|dot|mmd}
    GET  /api/traces[?model=&limit=&format=triton]   recent traces, newest first
    GET  /api/traces/{id}               one request's timeline
    GET  /api/trace-settings[?model=]   the trace settings; POST a JSON object to change them
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
from typing import Any
from urllib.parse import parse_qs, quote

from flowserve.core.errors import FlowserveError, InvalidArgument, NotFound
from flowserve.dataplane.plane import DataPlane, Trace
from flowserve.graph.plan import Plan
from flowserve.observability import render
from flowserve.observability.httpserver import ASGIApp, Receive, Scope, Send
from flowserve.observability.snapshot import merge_summaries, model_summary, node_summary
from flowserve.observability.traces import find_trace, trace_bounds, trace_dict, trace_summary, triton_trace
from flowserve.observability.ui_assets import CSS, GRAPH_JS, INDEX_JS
from flowserve.runtime.servable import Servable

log = logging.getLogger("flowserve.observability")

_STATUS = {"NOT_FOUND": 404, "INVALID_ARG": 400, "UNSUPPORTED": 501}


class _Response:
    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type


def _json(obj: Any, status: int = 200) -> _Response:
    return _Response(status, json.dumps(obj, default=str).encode(), "application/json")


def _html(text: str, status: int = 200) -> _Response:
    return _Response(status, text.encode(), "text/html; charset=utf-8")


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _script_json(obj: Any) -> str:
    """JSON safe inside a <script> element."""
    return json.dumps(obj).replace("</", "<\\/")


class UI:
    """The state behind the app: the plane, and rendered SVGs cached per plan."""

    def __init__(self, plane: DataPlane, prefix: str = "/ui", interval_ms: int = 1000) -> None:
        self.plane = plane
        self.prefix = prefix.rstrip("/")
        self.interval_ms = interval_ms
        self._svg: dict[tuple[str, str], tuple[Plan, str, str]] = {}

    # ------------------------------------------------------------------ ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        root = str(scope.get("root_path", "") or "")
        path = str(scope["path"])
        if root and path.startswith(root):
            path = path[len(root) :]
        elif path == self.prefix or path.startswith(self.prefix + "/"):
            path = path[len(self.prefix) :]
        base = root or self.prefix
        query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        method = str(scope["method"])
        try:
            if method == "POST":
                body = await _read_body(receive)
                response = await self.post(path or "/", query, body)
            elif method in ("GET", "HEAD"):
                response = await self.get(path or "/", query, base)
            else:
                response = _json({"error": f"method {method} not allowed"}, 405)
        except FlowserveError as exc:
            response = _json({"error": exc.message}, _STATUS.get(exc.code.value, 503))
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": [
                    (b"content-type", response.content_type.encode()),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": response.body})

    async def get(self, path: str, query: dict[str, str], base: str) -> _Response:
        parts = [p for p in path.split("/") if p]
        version = query.get("version", "")
        if not parts or parts == ["index.html"]:
            return _html(self.index_page(base))
        if len(parts) == 2 and parts[0] == "graph":
            return _html(await self.graph_page(parts[1], version, base, query.get("engine", "auto")))
        if parts[0] != "api":
            raise NotFound(f"no page '{path}'")
        api = parts[1:]
        if api == ["models"]:
            return _json({"models": await self.server_models()})
        if len(api) == 2 and api[0] == "graphs":
            return _json(self.view(api[1], version).as_dict())
        if len(api) == 3 and api[0] == "graphs":
            name, what = api[1], api[2]
            if what == "stats":
                return _json(await self.server_stats(name, version))
            if what == "svg":
                _, svg, _ = await self.svg(name, version, query.get("engine", "auto"))
                return _Response(200, svg.encode(), "image/svg+xml")
            if what == "dot":
                return _Response(200, render.to_dot(self.view(name, version)).encode(), "text/vnd.graphviz")
            if what == "mmd":
                return _Response(200, render.to_mermaid(self.view(name, version)).encode(), "text/plain")
        if api == ["traces"]:
            return _json(self._traces_of(await self._recent(query.get("model", "")), query))
        if len(api) == 2 and api[0] == "traces":
            trace = find_trace(await self._recent(""), api[1])
            if trace is None:
                raise NotFound(f"no trace '{api[1]}' (only the most recent are kept)")
            return _json(trace_dict(trace))
        if api == ["trace-settings"]:
            return _json(self.plane.get_trace_settings(query.get("model", "")))
        raise NotFound(f"no endpoint '{path}'")

    async def post(self, path: str, query: dict[str, str], body: bytes) -> _Response:
        if [p for p in path.split("/") if p] != ["api", "trace-settings"]:
            return _json({"error": "only /api/trace-settings accepts POST"}, 405)
        try:
            settings = json.loads(body or b"{}")
        except ValueError:
            raise InvalidArgument("trace settings must be a JSON object") from None
        if not isinstance(settings, dict):
            raise InvalidArgument("trace settings must be a JSON object")
        return _json(await self.plane.set_trace_settings(settings, query.get("model", "")))

    # ------------------------------------------------------------------ data

    def _plan(self, name: str, version: str = "") -> tuple[Plan, Servable | None]:
        servable = self.plane.servable(name, version)
        if servable is not None:
            return servable.plan, servable
        plan = self.plane.plan(name)
        if plan is None:
            raise NotFound(f"unknown model or graph: '{name}'")
        return plan, None

    def view(self, name: str, version: str = "") -> render.GraphView:
        plan, _ = self._plan(name, version)
        return render.graph_view(plan, self.plane.model_specs())

    def models(self) -> list[dict[str, Any]]:
        plane = self.plane
        out = []
        for status in plane.model_states():
            servable = plane.servable(status.name, status.version) if status.version else None
            plan = servable.plan if servable is not None else plane.plan(status.name)
            kind = servable.kind if servable is not None else "graph"
            if servable is None and not plane.is_graph(status.name):
                kind = "model"
            out.append(
                {
                    "name": status.name,
                    "version": status.version,
                    "state": status.state.value,
                    "reason": status.reason,
                    "kind": kind,
                    "platform": plan.spec.platform if plan is not None else "",
                    "nodes": len(plan.nodes) if plan is not None else 0,
                    "success": servable.stats.success.count if servable is not None else 0,
                    "fail": servable.stats.fail.count if servable is not None else 0,
                }
            )
        return out

    async def server_models(self) -> list[dict[str, Any]]:
        """:meth:`models` with the whole server's counts (with several workers, every worker's
        requests, from the statistics API)."""
        models = self.models()
        if self.plane.peers is None:
            return models
        counts: dict[tuple[str, str], tuple[int, int]] = {}
        for entry in (await self.plane.server_statistics())["model_stats"]:
            stats = entry["inference_stats"]
            counts[(entry["name"], entry["version"])] = (stats["success"]["count"], stats["fail"]["count"])
        for model in models:
            model["success"], model["fail"] = counts.get((model["name"], model["version"]), (0, 0))
        return models

    async def server_stats(self, name: str, version: str = "") -> dict[str, Any]:
        """:meth:`stats` of the whole server: with several workers, every worker's merged."""
        peers = self.plane.peers
        if peers is None:
            return self.stats(name, version)
        self._plan(name, version)  # NotFound here, as in one process
        return merge_summaries(
            name, version, await peers.gather("ui_stats", {"name": name, "version": version})
        )

    def reason(self, name: str) -> str:
        """Why ``name`` is not available ("" when it is, or nothing is known)."""
        return "; ".join(
            s.reason
            for s in self.plane.model_states()
            if s.name == name and s.reason and s.state.value != "READY"
        )

    def stats(self, name: str, version: str = "") -> dict[str, Any]:
        _, servable = self._plan(name, version)
        if servable is None or servable.forwarded:  # another worker counts a forwarded one
            reason = "" if servable is not None else self.reason(name)
            return {"name": name, "version": version, "model": None, "nodes": [], "reason": reason}
        return {
            "name": servable.name,
            "version": str(servable.version),
            "model": model_summary(servable),
            "nodes": [
                node_summary(self.plane.servable, servable, node, stats, render.node_element_id(node.index))
                for node, stats in zip(servable.plan.nodes, servable.executor.stats, strict=True)
            ],
        }

    async def _recent(self, model: str) -> list[Trace]:
        """The recent traces (of ``model``; "": all) of the whole server, oldest first: with
        several workers, every worker's, in the order they started."""
        peers = self.plane.peers
        if peers is None:
            return self.plane.recent_traces(model)
        parts = await peers.gather("recent_traces", {"model": model})
        return sorted((t for part in parts for t in part), key=lambda t: trace_bounds(t.spans)[0])

    def traces(self, query: dict[str, str]) -> dict[str, Any]:
        return self._traces_of(self.plane.recent_traces(query.get("model", "")), query)

    def _traces_of(self, kept: list[Trace], query: dict[str, str]) -> dict[str, Any]:
        try:
            limit = max(0, int(query.get("limit", "50")))
        except ValueError:
            raise InvalidArgument("limit must be an integer") from None
        newest = list(reversed(kept))[:limit]
        if query.get("format") == "triton":
            records: list[dict[str, Any]] = []
            for i, trace in enumerate(reversed(newest), len(kept) - len(newest) + 1):
                records += triton_trace(trace, i)
            return {"traces": records}
        return {"total": len(kept), "traces": [trace_summary(t) for t in newest]}

    async def svg(self, name: str, version: str, engine: str = "auto") -> tuple[render.GraphView, str, str]:
        """(view, svg, which layout drew it); graphviz runs in a subprocess, off the loop."""
        plan, _ = self._plan(name, version)
        view = render.graph_view(plan, self.plane.model_specs())
        use_dot = engine != "builtin" and render.dot_binary() is not None
        key = (name, f"{version}:{'dot' if use_dot else 'builtin'}")
        cached = self._svg.get(key)
        if cached is not None and cached[0] is plan:
            return view, cached[1], cached[2]
        svg, drawn = render.builtin_svg(view), "built-in layout"
        if use_dot:
            try:
                svg, drawn = render.svg_element(await _dot_svg(render.to_dot(view))), "graphviz"
            except (OSError, FlowserveError, TimeoutError) as exc:
                log.warning("graphviz failed for '%s', using the built-in layout: %s", name, exc)
        if len(self._svg) > 256:
            self._svg.clear()
        self._svg[key] = (plan, svg, drawn)
        return view, svg, drawn

    # ------------------------------------------------------------------ pages

    def _page(self, title: str, base: str, body: str, script: str, config: dict[str, Any]) -> str:
        return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)} · flowserve</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>
<body><header><h1>flowserve</h1><a href="{_esc(base)}/">models &amp; graphs</a></header>
<main>{body}</main>
<script type="application/json" id="fs-config">{_script_json(config)}</script>
<script>{script}</script></body></html>
"""

    def index_page(self, base: str) -> str:
        rows = "".join(
            f'<tr><td><a href="{_esc(base)}/graph/{quote(m["name"])}"><b>{_esc(m["name"])}</b></a></td>'
            f'<td>{_esc(m["version"])}</td><td class="state-{_esc(m["state"])}">{_esc(m["state"])}</td>'
            f"<td>{_esc(m['kind'])}</td><td>{_esc(m['platform'])}</td><td class=num>{m['nodes']}</td>"
            f"<td class=num>{m['success']}</td><td class=num>{m['fail']}</td>"
            f"<td class=err>{_esc(m['reason'])}</td></tr>"
            for m in self.models()
        )
        body = (
            "<h2>Models and graphs</h2><div class=card><table><thead><tr><th>name</th><th>version</th>"
            "<th>state</th><th>kind</th><th>platform</th><th>nodes</th><th>success</th><th>failures</th>"
            f'<th>reason</th></tr></thead><tbody id="fs-models">{rows}</tbody></table></div>'
        )
        config = {"api": f"{base}/api", "base": base, "interval_ms": self.interval_ms * 2}
        return self._page("models", base, body, INDEX_JS, config)

    async def graph_page(self, name: str, version: str, base: str, engine: str = "auto") -> str:
        plan, servable = self._plan(name, version)
        view, svg, drawn = await self.svg(name, version, engine)
        state = "READY" if servable is not None else "UNAVAILABLE"
        reason = self.reason(name) if servable is None else ""
        kind = servable.kind if servable is not None else "graph"
        shown_version = str(servable.version) if servable is not None else version
        api = f"{base}/api/graphs/{quote(name)}"
        legend = (
            '<div class="legend">'
            f'<span style="color:{render.EDGE_COLORS["data"]}">── data edge</span>'
            f'<span style="color:{render.EDGE_COLORS["branch"]}"><b>━━ switch branch</b></span>'
            f'<span style="color:{render.EDGE_COLORS["first_present"]}">- - first-present candidate</span>'
            f'<span class=muted>drawn by {_esc(drawn)} · download <a href="{api}/dot">DOT</a> · '
            f'<a href="{api}/mmd">Mermaid</a> · <a href="{api}/svg">SVG</a></span></div>'
        )
        body = f"""
<nav class="crumbs"><a href="{_esc(base)}/">models &amp; graphs</a> / {_esc(name)}</nav>
<h2>{_esc(name)} <span class="pill">{_esc(kind)}</span> <span class="pill">{_esc(plan.spec.platform)}</span>
 <span class="pill">version {_esc(shown_version or "-")}</span>
 <span class="state-{state}">{state}</span></h2>
<div class="muted">{_esc(plan.spec.description)}</div>
{f'<div class="card err" id="fs-reason">{_esc(reason)}</div>' if reason else ""}
<div class="card"><div id="fs-model" class="grid"></div><div class="muted" id="fs-status">loading…</div></div>
<div class="card" id="fs-drawing">{svg}{legend}</div>
<h2>Nodes</h2>
<div class="card"><table><thead><tr><th>node</th><th>kind</th><th>calls</th><th>errors</th><th>skipped</th>
<th>in flight</th><th>avg time</th><th>avg queue</th><th>avg compute</th><th>batch sizes</th>
<th>model it runs</th><th>last error</th></tr></thead><tbody id="fs-nodes"></tbody></table></div>
<h2>Recent requests</h2>
<div class="card"><div><span id="fs-trace-settings" class="muted"></span>
 <button id="fs-trace-on">trace this graph</button> <button id="fs-trace-off">stop tracing</button></div>
<table><thead><tr><th>#</th><th>request id</th><th>result</th><th>duration</th><th>spans</th>
<th>failed / skipped nodes</th></tr></thead><tbody id="fs-traces"></tbody></table></div>
<h2>Timeline</h2><div class="card" id="fs-timeline"><span class="muted">select a request</span></div>
"""
        config = {
            "api": f"{base}/api",
            "name": name,
            "version": version,
            "interval_ms": self.interval_ms,
            "node_ids": view.node_ids,
        }
        return self._page(name, base, body, GRAPH_JS, config)


async def _read_body(receive: Receive, limit: int = 1 << 20) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = bytes(message.get("body", b""))
        size += len(chunk)
        if size > limit:
            raise InvalidArgument("request body too large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _dot_svg(dot: str, timeout_s: float = 30.0) -> str:
    binary = render.dot_binary()
    if binary is None:
        raise render.GraphvizMissing("graphviz is not installed")
    proc = await asyncio.create_subprocess_exec(
        binary,
        "-Tsvg",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(dot.encode()), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        raise FlowserveError(f"graphviz failed: {err.decode(errors='replace').strip()}")
    return out.decode()


def make_ui_app(plane: DataPlane, prefix: str = "/ui", interval_ms: int = 1000) -> ASGIApp:
    """The web page as a raw ASGI app, to mount at ``prefix`` on the HTTP port."""
    ui = UI(plane, prefix, interval_ms)
    if plane.peers is not None:  # with several workers: this worker's share, for the merged whole
        plane.peers.serve_local("ui_stats", lambda args: ui.stats(args["name"], args["version"]))
        plane.peers.serve_local("recent_traces", lambda args: plane.recent_traces(args["model"]))
    return ui


__all__ = ["UI", "make_ui_app"]
