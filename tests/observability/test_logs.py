"""Log lines about a failing node carry the request id, graph and node."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

import flowserve
from flowserve.observability.logs import JsonFormatter, RequestFormatter

ROOT = Path(__file__).resolve().parents[2]


async def test_a_failing_node_is_logged_with_its_request(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = await flowserve.Engine.start([ROOT / "tests" / "models"])
    try:
        with (
            caplog.at_level(logging.WARNING, logger="flowserve.executor"),
            pytest.raises(flowserve.FlowserveError),
        ):
            await engine.infer("failing", {"INPUT0": np.array([-1], np.int32)}, request_id="req-9")
        [record] = [r for r in caplog.records if r.name == "flowserve.executor"]
        line = RequestFormatter("%(levelname)s %(message)s").format(record)
        assert line.startswith("WARNING node failed: ")
        assert line.endswith("[request_id=req-9 graph=failing node=failing]")
        doc = json.loads(JsonFormatter().format(record))
        assert (doc["request_id"], doc["graph"], doc["node"]) == ("req-9", "failing", "failing")
    finally:
        await engine.stop()
