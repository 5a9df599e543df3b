"""The web page's ASGI app, called directly: pages, JSON, live counters, traces, trace settings."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

import flowserve
from flowserve.core.errors import FlowserveError
from flowserve.core.types import InferRequest
from flowserve.dataplane.plane import DataPlane
from flowserve.observability import render
from flowserve.observability.ui import make_ui_app

A = np.ones((2, 16), np.int32)
Call = Callable[..., Awaitable[tuple[int, dict[str, str], bytes]]]  # the "call" fixture


async def get_json(call: Call, app: Any, path: str, query: str = "") -> Any:
    status, headers, body = await call(app, "GET", path, query)
    assert status == 200, body
    assert headers["content-type"] == "application/json"
    return json.loads(body)


async def fanout(plane: DataPlane, n: int, request_id: str = "") -> None:
    for i in range(n):
        await plane.infer(InferRequest("fanout", {"a": A, "b": A}, id=request_id or f"req-{i}"))


async def trace_everything(call: Call, app: Any, model: str = "") -> None:
    body = json.dumps({"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1"}).encode()
    query = f"model={model}" if model else ""
    status, _, answer = await call(app, "POST", "/ui/api/trace-settings", query, body)
    assert status == 200, answer
    assert json.loads(answer)["trace_level"] == ["TIMESTAMPS"]


@pytest.mark.parametrize(
    ("path", "root_path"),
    [("/ui", ""), ("/ui/", ""), ("/ui/", "/ui"), ("/", "/ui"), ("/ui/index.html", "")],
)
async def test_index_lists_models_and_graphs_with_state(
    plane: DataPlane, call: Call, path: str, root_path: str
) -> None:
    app = make_ui_app(plane)
    status, headers, body = await call(app, "GET", path, root_path=root_path)
    assert status == 200
    assert headers["content-type"].startswith("text/html")
    page = body.decode()
    for name in ("fanout", "route", "simple", "simple_ensemble", "checked", "broken"):
        assert f'href="/ui/graph/{name}"' in page
    assert 'class="state-READY">READY' in page
    assert 'class="state-UNAVAILABLE">UNAVAILABLE' in page
    assert "broken on purpose" in page  # the load failure's reason


async def test_models_json(plane: DataPlane, call: Call) -> None:
    app = make_ui_app(plane)
    models = {m["name"]: m for m in (await get_json(call, app, "/ui/api/models"))["models"]}
    assert models["fanout"]["kind"] == "graph"
    assert models["fanout"]["state"] == "READY"
    assert models["fanout"]["nodes"] == 4
    assert models["simple_ensemble"]["kind"] == "ensemble"
    assert models["simple"]["kind"] == "model"
    assert models["broken"]["state"] == "UNAVAILABLE"
    assert "broken on purpose" in models["broken"]["reason"]


async def test_graph_page_draws_the_dag_offline(plane: DataPlane, call: Call) -> None:
    app = make_ui_app(plane)
    status, _, body = await call(app, "GET", "/ui/graph/fanout")
    assert status == 200
    page = body.decode()
    assert "<svg" in page and "</svg>" in page
    for i, name in enumerate(("addsub", "double_sum", "triple_diff", "join")):
        assert f'id="fs_node_{i}"' in page
        assert name in page
    config = re.search(r'<script type="application/json" id="fs-config">(.*?)</script>', page, re.S)
    assert config is not None
    cfg = json.loads(config.group(1))
    assert cfg["name"] == "fanout" and cfg["api"] == "/ui/api"
    assert cfg["node_ids"] == {
        "addsub": "fs_node_0",
        "double_sum": "fs_node_1",
        "triple_diff": "fs_node_2",
        "join": "fs_node_3",
    }
    # self-contained: no external script, stylesheet or font, nothing but its own JSON
    assert "<script src" not in page and "<link" not in page
    assert not re.search(r"https?://(?!www\.w3\.org/)", page)
    drawn = "graphviz" if render.dot_binary() else "built-in layout"
    assert f"drawn by {drawn}" in page


async def test_graph_page_without_graphviz_uses_the_builtin_layout(
    plane: DataPlane, call: Call, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(render, "dot_binary", lambda: None)
    app = make_ui_app(plane)
    status, _, body = await call(app, "GET", "/ui/graph/route")
    page = body.decode()
    assert status == 200
    assert "drawn by built-in layout" in page
    assert 'class="fs-graph"' in page
    assert "branch big: x gt 100 (any)" in page
    status, headers, svg = await call(app, "GET", "/ui/api/graphs/route/svg")
    assert status == 200 and headers["content-type"] == "image/svg+xml"
    assert svg.startswith(b"<svg")


async def test_graph_view_dot_and_mermaid_endpoints(plane: DataPlane, call: Call) -> None:
    app = make_ui_app(plane)
    view = await get_json(call, app, "/ui/api/graphs/route")
    assert [v["name"] for v in view["vertices"]] == ["x", "gate", "shrink", "keep", "y"]
    styles = {(e["source"], e["target"]): e["style"] for e in view["edges"]}
    assert styles[("fs_node_0", "fs_node_1")] == "branch"
    assert styles[("fs_node_1", "fs_out_0")] == "first_present"
    status, _, dot = await call(app, "GET", "/ui/api/graphs/route/dot")
    assert status == 200 and dot.startswith(b'digraph "route"')
    status, _, mmd = await call(app, "GET", "/ui/api/graphs/route/mmd")
    assert status == 200 and b"flowchart LR" in mmd


async def test_counters_move_with_traffic(plane: DataPlane, call: Call) -> None:
    app = make_ui_app(plane)
    before = await get_json(call, app, "/ui/api/graphs/fanout/stats")
    assert [n["calls"] for n in before["nodes"]] == [0, 0, 0, 0]
    assert before["model"]["success"] == 0
    await fanout(plane, 3)
    after = await get_json(call, app, "/ui/api/graphs/fanout/stats")
    nodes = {n["name"]: n for n in after["nodes"]}
    assert {name: n["calls"] for name, n in nodes.items()} == dict.fromkeys(
        ("addsub", "double_sum", "triple_diff", "join"), 3
    )
    assert nodes["join"]["element_id"] == "fs_node_3"
    assert nodes["join"]["avg_us"] > 0
    assert after["model"]["success"] == 3
    assert after["model"]["inference_count"] == 6
    # a model step shows the model it runs (shared by every graph using it)
    assert nodes["addsub"]["target"]["name"] == "simple"
    assert nodes["addsub"]["target"]["success"] == 3
    assert nodes["addsub"]["target"]["batches"] == {"2": 3}


async def test_a_fanout_trace_shows_every_node(plane: DataPlane, call: Call) -> None:
    app = make_ui_app(plane)
    await fanout(plane, 1)  # tracing is OFF: nothing kept
    assert (await get_json(call, app, "/ui/api/traces"))["traces"] == []
    await trace_everything(call, app)
    await fanout(plane, 2, request_id="traced")
    listing = await get_json(call, app, "/ui/api/traces", "model=fanout&limit=1")
    assert listing["total"] == 2
    [summary] = listing["traces"]
    assert summary["request_id"] == "traced" and summary["ok"] is True
    trace = await get_json(call, app, f"/ui/api/traces/{summary['id']}")
    passed = [(s["graph"], s["node"]) for s in trace["timeline"]]
    assert sorted(passed) == sorted(
        [
            ("fanout", "addsub"),
            ("fanout", "double_sum"),
            ("fanout", "triple_diff"),
            ("fanout", "join"),
            ("simple", "simple"),  # inside the "simple" model the addsub step ran
        ]
    )
    spans = {s["node"]: s for s in trace["timeline"]}
    assert passed.index(("fanout", "addsub")) < passed.index(("fanout", "join"))
    assert spans["simple"]["nested"] is True and spans["join"]["nested"] is False
    assert spans["addsub"]["start_us"] == 0
    for s in trace["timeline"]:
        assert s["status"] == "ok" and s["end_us"] >= s["start_us"] >= 0
    assert spans["join"]["start_us"] >= spans["double_sum"]["end_us"]
    assert spans["join"]["start_us"] >= spans["triple_diff"]["end_us"]
    triton = (await get_json(call, app, "/ui/api/traces", "model=fanout&format=triton"))["traces"]
    assert triton[0]["model_name"] == "fanout"
    names = [t["name"] for t in triton[1]["timestamps"]]
    assert names == ["REQUEST_START", "REQUEST_END"]
    assert {r.get("node") for r in triton if "parent_id" in r} >= {"addsub", "join"}


async def test_a_failing_node_shows_in_trace_and_stats(plane: DataPlane, call: Call) -> None:
    app = make_ui_app(plane)
    await trace_everything(call, app, model="checked")
    with pytest.raises(FlowserveError, match="node 'check'"):
        await plane.infer(InferRequest("checked", {"x": np.array([-3], np.int32)}, id="bad"))
    [summary] = (await get_json(call, app, "/ui/api/traces", "model=checked"))["traces"]
    assert summary["ok"] is False
    assert "node 'check'" in summary["error"]
    assert "checked/check" in summary["failed_nodes"]
    trace = await get_json(call, app, f"/ui/api/traces/{summary['id']}")
    statuses = {(s["graph"], s["node"]): s["status"] for s in trace["timeline"]}
    assert statuses[("checked", "check")] == "error"
    assert statuses[("failing", "failing")] == "error"
    failing = next(s for s in trace["timeline"] if s["node"] == "check")
    assert "negative input" in failing["error"]
    stats = await get_json(call, app, "/ui/api/graphs/checked/stats")
    check = next(n for n in stats["nodes"] if n["name"] == "check")
    assert check["errors"] == 1 and "negative input" in check["last_error"]
    assert stats["model"]["fail"] == 1 and stats["model"]["fail_reasons"] == {"BACKEND": 1}


async def test_skipped_branch_is_in_the_trace(plane: DataPlane, call: Call) -> None:
    app = make_ui_app(plane)
    await trace_everything(call, app)
    await plane.infer(InferRequest("route", {"x": np.array([1.0], np.float32)}))
    [summary] = (await get_json(call, app, "/ui/api/traces", "model=route"))["traces"]
    assert summary["skipped_nodes"] == ["route/shrink"]
    trace = await get_json(call, app, f"/ui/api/traces/{summary['id']}")
    statuses = {s["node"]: s["status"] for s in trace["timeline"]}
    assert statuses == {"gate": "ok", "keep": "ok", "shrink": "skipped"}


async def test_trace_settings_round_trip_and_errors(plane: DataPlane, call: Call) -> None:
    app = make_ui_app(plane)
    settings = await get_json(call, app, "/ui/api/trace-settings")
    assert settings["trace_level"] == ["OFF"]
    status, _, body = await call(app, "POST", "/ui/api/trace-settings", "", b'{"trace_level": ["LOUD"]}')
    assert status == 400 and b"trace_level" in body
    status, _, body = await call(app, "POST", "/ui/api/trace-settings", "", b"not json")
    assert status == 400
    status, _, body = await call(app, "POST", "/ui/api/trace-settings", "model=nope", b"{}")
    assert status == 404
    status, _, _ = await call(app, "POST", "/ui/api/models")
    assert status == 405
    status, _, _ = await call(app, "DELETE", "/ui/")
    assert status == 405


async def test_unknown_things_are_404_json(plane: DataPlane, call: Call) -> None:
    app = make_ui_app(plane)
    for path in ("/ui/graph/nope", "/ui/api/graphs/nope/stats", "/ui/api/traces/123", "/ui/api/zzz", "/ui/x"):
        status, headers, body = await call(app, "GET", path)
        assert status == 404, path
        assert headers["content-type"] == "application/json"
        assert "error" in json.loads(body)


async def test_unloaded_graph_is_still_drawn(engine: flowserve.Engine, plane: DataPlane, call: Call) -> None:
    await engine.unload_model("route")
    app = make_ui_app(plane)
    status, _, body = await call(app, "GET", "/ui/graph/route")
    assert status == 200 and b"UNAVAILABLE" in body and b"gate" in body
    stats = await get_json(call, app, "/ui/api/graphs/route/stats")
    assert stats["model"] is None and stats["nodes"] == []
