"""One real analysis end to end, well under a minute: the bundled fanout graph (a copy), its own
server started and stopped, two load levels per configuration, a budget of 15 seconds."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BUNDLED_GRAPHS, BUNDLED_REPOSITORY, ROOT

pytestmark = pytest.mark.slow


def test_analyze_a_graph_end_to_end(tmp_path: Path) -> None:
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    shutil.copy(BUNDLED_GRAPHS / "fanout.yaml", graphs / "fanout.yaml")
    original = (graphs / "fanout.yaml").read_text()
    page = tmp_path / "report.html"
    done = subprocess.run(
        [sys.executable, "-m", "flowserve.cli", "analyze", "fanout", "--graphs", str(graphs),
         "--model-repository", str(BUNDLED_REPOSITORY), "--p99-ms", "200", "--budget-minutes", "0.25",
         "-c", "1,2", "--seconds", "0.5", "--max-workers", "1", "--html", str(page), "--write"],
        capture_output=True, text=True, cwd=ROOT, timeout=150, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "tunable nodes: addsub (model), double_sum (python), triple_diff (python), join (python)"
        in done.stderr
    )
    assert "chosen: trial #" in done.stdout and "Pareto front:" in done.stdout
    report = json.loads(page.with_suffix(".json").read_text())
    assert report["trials"][0]["why"] == "as shipped" and len(report["trials"]) >= 2
    first = report["trials"][0]["points"][0]
    assert first["throughput"] > 0 and {n["name"] for n in first["nodes"]} == {
        "addsub",
        "double_sum",
        "triple_diff",
        "join",
    }
    assert "<svg" in page.read_text()
    assert (graphs / "fanout.yaml").read_text() == original  # the user's file is left alone
    assert (graphs / "fanout.yaml.analyzed").read_text().startswith("# flowserve analyze: trial #")
    assert sorted(p.name for p in graphs.iterdir()) == ["fanout.yaml", "fanout.yaml.analyzed"]


def test_a_candidate_is_applied_without_a_restart(tmp_path: Path) -> None:
    """The server the analysis starts reloads the graph in place (same process) with the
    candidate's settings, which the served graph's view then shows; the user's file is only read."""
    import urllib.request

    from flowserve.analyze.server import AnalysisServer
    from flowserve.analyze.space import NodeConfig
    from flowserve.analyze.target import resolve, space_of

    target = resolve("fanout", [BUNDLED_REPOSITORY], [BUNDLED_GRAPHS])
    _, shipped = space_of(target, {"simple": {"max_batch_size": 8}}, 4, 2)
    server = AnalysisServer(target, tmp_path / "work")
    try:
        server.start(shipped)
        assert server.process is not None
        pid = server.process.pid
        server.apply(shipped.with_node("join", NodeConfig(2, 8, (), 100)))
        with urllib.request.urlopen(f"http://{server.url('http')}/ui/api/graphs/fanout") as reply:
            view = json.loads(reply.read())
        join = next(v for v in view["vertices"] if v["name"] == "join")
        assert "batching: max 8, delay 100\u00b5s" in join["lines"] and "instances: 2 x AUTO" in join["lines"]
        assert server.process.pid == pid
        assert {n["name"] for n in server.stats()} == {"addsub", "double_sum", "triple_diff", "join"}
    finally:
        server.stop()
    assert server.process is None
