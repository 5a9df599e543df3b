"""docs/tutorial.md, run as written (tests/docs/runbook.py): train and export the model, write
the repository entry, nodes and graph, validate, serve on free ports, call the graph with
tritonclient over HTTP and gRPC, look at the metadata and UI endpoints, render the graph.
Every output the page shows is compared. About 30 s, most of it training and the ONNX export."""

from __future__ import annotations

import importlib.util
import json
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.docs.runbook import Runbook, blocks

TUTORIAL = ROOT / "docs" / "tutorial.md"

MISSING = [m for m in ("torch", "onnxscript", "onnxruntime") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"the tutorial needs {MISSING} (pip install -e '.[bundled]')"
)


@pytest.mark.slow
def test_tutorial_runs_as_written(tmp_path: Path) -> None:
    page = TUTORIAL.read_text()
    run = Runbook(tmp_path)
    try:
        run.run_page(page)
        project = tmp_path / "colours"
        assert (project / "model_repository/colour_net/1/model.onnx").stat().st_size > 0
        assert (project / "colours.svg").read_text().lstrip().startswith(("<svg", "<?xml"))
        # the graph ran its batched model: the model's statistics count the graph's rows
        url = f"http://127.0.0.1:{run.ports['8000']}/v2/models/colour_net/stats"
        with urllib.request.urlopen(url, timeout=30) as response:
            stats = json.loads(response.read())["model_stats"][0]
        assert stats["inference_count"] >= 6, stats
        assert "Traceback" not in run.log(), run.log()
    finally:
        run.stop()
    assert run.server is not None and run.server.returncode == 0, run.log()


def test_every_file_and_output_of_the_tutorial_is_used() -> None:
    """The page's titled blocks are files the run writes, and every Output follows a command."""
    found = blocks(TUTORIAL.read_text())
    titled = {b.title for b in found if b.title}
    assert {"train.py", "client.py", "nodes/colours.py", "graphs/colours.yaml"} <= titled
    assert "model_repository/colour_net/config.pbtxt" in titled
    assert sum(b.output is not None for b in found) >= 3
