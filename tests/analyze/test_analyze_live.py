"""Real analyses end to end, each well under a minute: the bundled fanout graph, and a graph that
uses a sub-graph (with a model node), a switch and a split (copies, with a copy of the simple
model); their own server started and stopped, two load levels per configuration, a budget of 15
seconds."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BUNDLED_GRAPHS, BUNDLED_REPOSITORY, ROOT

pytestmark = pytest.mark.slow


HERE = Path(__file__).parent


def test_analyze_a_graph_end_to_end(tmp_path: Path) -> None:
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    shutil.copy(BUNDLED_GRAPHS / "fanout.yaml", graphs / "fanout.yaml")
    shutil.copytree(BUNDLED_REPOSITORY / "simple", tmp_path / "repo" / "simple")
    original = (graphs / "fanout.yaml").read_text()
    page = tmp_path / "report.html"
    done = subprocess.run(
        [sys.executable, "-m", "flowserve.cli", "analyze", "fanout", "--graphs", str(graphs),
         "--model-repository", str(tmp_path / "repo"), "--p99-ms", "200", "--budget-minutes", "0.25",
         "-c", "1,2", "--seconds", "0.5", "--max-workers", "1", "--html", str(page), "--write"],
        capture_output=True, text=True, cwd=ROOT, timeout=150, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "tunable nodes: addsub (model node), double_sum (python), triple_diff (python), join (python), "
        "model:simple (model)" in done.stderr
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
        "model:simple",  # the model's own statistics
    }
    assert "<svg" in page.read_text()
    assert (graphs / "fanout.yaml").read_text() == original  # the user's file is left alone
    assert (graphs / "fanout.yaml.analyzed").read_text().startswith("# flowserve analyze: trial #")
    assert sorted(p.name for p in graphs.iterdir()) == ["fanout.yaml", "fanout.yaml.analyzed"]


def test_analyze_a_graph_with_a_sub_graph_a_switch_and_a_split(tmp_path: Path) -> None:
    """The sub-graph (another graph file) starts in analyze's work folder, its nodes and the model
    its model node calls are tuned, the switch and split are served untouched."""
    shutil.copytree(HERE / "graphs", tmp_path / "graphs")
    shutil.copytree(BUNDLED_REPOSITORY / "simple", tmp_path / "repo" / "simple")
    before = {
        p: p.read_text() for p in [*(tmp_path / "graphs").iterdir(), tmp_path / "repo/simple/config.pbtxt"]
    }
    page = tmp_path / "report.html"
    done = subprocess.run(
        [sys.executable, "-m", "flowserve.cli", "analyze", str(tmp_path / "graphs" / "outer.yaml"),
         "--model-repository", str(tmp_path / "repo"), "--p99-ms", "200", "--budget-minutes", "0.25",
         "-c", "1,2", "--seconds", "0.5", "--max-workers", "1", "--html", str(page), "--write",
         "--work", str(tmp_path / "work")],
        capture_output=True, text=True, cwd=ROOT, timeout=150, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "tunable nodes: big (python), small (python), inner/addsub (model node), inner/double (python), "
        "model:simple (model)" in done.stderr
    )
    report = json.loads(page.with_suffix(".json").read_text())
    assert len(report["trials"]) >= 2 and not [t["error"] for t in report["trials"] if t["error"]]
    first = report["trials"][0]["points"][0]
    assert {"inner/addsub", "inner/double", "model:simple"} <= {n["name"] for n in first["nodes"]}
    assert sorted(p.name for p in (tmp_path / "work" / "graphs").iterdir()) == ["inner.yaml", "outer.yaml"]
    assert {p: p.read_text() for p in before} == before  # the user's files are only read
    written = [
        Path(line.removeprefix("wrote ")) for line in done.stdout.splitlines() if line.startswith("wrote ")
    ]
    assert written[0] == tmp_path / "graphs" / "outer.yaml.analyzed"
    for path in written:  # each keeps its original's comments
        text = path.read_text()
        assert text.startswith("# flowserve analyze: trial #")
        assert before[path.with_suffix("")].splitlines()[0] in text.splitlines()


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


def test_a_model_and_a_sub_graph_are_applied_without_a_restart(tmp_path: Path) -> None:
    """A model's settings go in as a config override, a sub-graph's as its rewritten copy,
    reloaded; the same server process serves both, and back to the shipped configuration."""
    import urllib.request

    from flowserve.analyze.server import AnalysisServer
    from flowserve.analyze.space import Candidate, NodeConfig
    from flowserve.analyze.target import resolve, served_configs, space_of

    shutil.copytree(HERE / "graphs", tmp_path / "graphs")
    target = resolve(str(tmp_path / "graphs" / "outer.yaml"), [BUNDLED_REPOSITORY], [])
    server = AnalysisServer(target, tmp_path / "work")

    def get(path: str) -> dict[str, object]:
        with urllib.request.urlopen(f"http://{server.url('http')}{path}") as reply:
            return dict(json.loads(reply.read()))

    try:
        server.start(Candidate(1, ()))
        assert server.process is not None
        pid = server.process.pid
        _, shipped = space_of(target, served_configs(target.models, server.config), 4, 1)
        server.know_shipped(shipped)
        server.apply(
            shipped.with_node("inner/double", NodeConfig(2, 8, (), 100)).with_node(
                "model:simple", NodeConfig(3, 8, (4, 8), 0)
            )
        )
        vertices = get("/ui/api/graphs/inner")["vertices"]
        double = next(v for v in vertices if v["name"] == "double")  # type: ignore[attr-defined]
        assert (
            "batching: max 8, delay 100\u00b5s" in double["lines"]
            and "instances: 2 x AUTO" in double["lines"]
        )
        config = get("/v2/models/simple/config")
        assert config["instance_group"][0]["count"] == 3  # type: ignore[index]
        assert config["dynamic_batching"]["preferred_batch_size"] == [4, 8]  # type: ignore[index]
        assert {n["name"] for n in server.stats()} == {n for n, _ in shipped.nodes}
        server.apply(shipped)
        assert get("/v2/models/simple/config")["instance_group"][0]["count"] == 1  # type: ignore[index]
        assert server.process.pid == pid
    finally:
        server.stop()
