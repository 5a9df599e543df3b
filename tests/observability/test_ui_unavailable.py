"""The page of a model or graph that is not available says why (no script error), and a graph
step that calls a model shows that model's queue and compute times as the node's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flowserve.core.types import InferRequest
from flowserve.dataplane.plane import DataPlane
from flowserve.observability.ui import make_ui_app
from tests.observability.test_browser import CHROMIUM, chromium, serve_ui

A = np.ones((2, 16), np.int32)


async def test_the_page_of_an_unavailable_model_shows_the_reason(plane: DataPlane, call: Any) -> None:
    app = make_ui_app(plane)
    status, _, body = await call(app, "GET", "/ui/graph/broken")
    assert status == 200
    page = body.decode()
    assert 'class="state-UNAVAILABLE">UNAVAILABLE' in page
    assert '<div class="card err" id="fs-reason">' in page and "broken on purpose" in page
    status, _, body = await call(app, "GET", "/ui/api/graphs/broken/stats")
    stats = json.loads(body)
    assert status == 200 and stats["model"] is None and "broken on purpose" in stats["reason"]
    status, _, body = await call(app, "GET", "/ui/api/graphs/fanout/stats")
    assert "reason" not in json.loads(body)  # a loaded one has none


async def test_a_model_step_shows_the_models_queue_and_compute(plane: DataPlane, call: Any) -> None:
    await plane.infer(InferRequest("fanout", {"a": A, "b": A}))
    app = make_ui_app(plane)
    status, _, body = await call(app, "GET", "/ui/api/graphs/fanout/stats")
    assert status == 200
    node = next(n for n in json.loads(body)["nodes"] if n["name"] == "addsub")  # model: simple
    assert node["target"]["name"] == "simple"
    assert node["compute_us"] == node["target"]["avg_compute_us"] > 0  # not 0 beside the model's
    assert node["queue_us"] == node["target"]["avg_queue_us"]


@pytest.mark.skipif(CHROMIUM is None, reason="needs a headless chromium")
async def test_the_unavailable_page_in_the_browser(plane: DataPlane, tmp_path: Path) -> None:
    listener = await serve_ui(plane)
    try:
        url = f"http://127.0.0.1:{listener.port}/ui/graph/broken"
        dom = await chromium(tmp_path / "p", url, "--dump-dom")
    finally:
        await listener.stop(1.0)
    assert "TypeError" not in dom
    assert "broken on purpose" in dom.split('id="fs-model"', 1)[1]  # the stats card says why
    settings = dom.split('id="fs-trace-settings"', 1)[1].split("</span>", 1)[0]
    assert "traces unavailable: " in settings and "broken" in settings, settings
