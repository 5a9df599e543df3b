"""Trace settings drive trace files in Triton's shape."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import flowserve
from flowserve.core.types import InferRequest
from flowserve.dataplane.plane import DataPlane
from flowserve.observability.traces import TraceFileWriter

ROOT = Path(__file__).resolve().parents[2]


async def test_traces_are_written_per_trace_settings(tmp_path: Path) -> None:
    engine = await flowserve.Engine.start(ROOT / "model_repository", ROOT / "graphs")
    plane = DataPlane(engine)
    plane.on_trace = TraceFileWriter(plane)
    a = np.ones((1, 16), np.int32)
    request = InferRequest("fanout", {"a": a, "b": a}, id="t1")
    try:
        await plane.infer(request)  # tracing is off: nothing written
        path = tmp_path / "trace.json"
        plane.update_trace_settings(
            {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_file": str(path)}, from_network=False
        )
        await plane.infer(request)
        records = json.loads(path.read_text())
        assert records[0]["model_name"] == "fanout" and records[0]["request_id"] == "t1"
        assert [r["timestamps"][0]["name"] for r in records[1:2]] == ["REQUEST_START"]
        nodes = {r["node"] for r in records if "node" in r}
        assert {"addsub", "double_sum", "triple_diff", "join"} <= nodes
        # with log_frequency 2, every two traces go to a numbered file
        rolled = tmp_path / "rolled.json"
        plane.update_trace_settings({"trace_file": str(rolled), "log_frequency": "2"}, from_network=False)
        for _ in range(4):
            await plane.infer(request)
        first, second, third = (rolled.with_name(f"rolled.json.{k}") for k in range(3))
        assert json.loads(first.read_text())[0]["model_name"] == "fanout"
        assert second.exists() and not third.exists()
    finally:
        await engine.stop()
