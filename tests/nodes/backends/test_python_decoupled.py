"""A decoupled Triton python model (response sender) in-process."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import flowserve
from flowserve.core.errors import FlowserveError, Unsupported
from flowserve.core.types import InferRequest

ROOT = Path(__file__).resolve().parents[3]


async def test_responses_come_from_the_sender_until_final(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "tests" / "models" / "decoupled_repeat", repo / "decoupled_repeat")
    engine = await flowserve.Engine.start(repo)
    try:
        request = InferRequest("decoupled_repeat", {"IN": np.array([4, 5, 6], np.int32)})
        responses = [r async for r in engine.stream_request(request)]
        assert [(r.outputs["OUT"].tolist(), r.outputs["IDX"].tolist()) for r in responses] == [
            ([4], [0]),
            ([5], [1]),
            ([6], [2]),
        ]
        empty = InferRequest("decoupled_repeat", {"IN": np.array([], np.int32)})
        assert [r async for r in engine.stream_request(empty)] == []
        with pytest.raises(FlowserveError, match="negative value at 1"):
            bad = InferRequest("decoupled_repeat", {"IN": np.array([1, -1], np.int32)})
            _ = [r async for r in engine.stream_request(bad)]
        with pytest.raises(Unsupported, match="decoupled"):
            await engine.infer_request(request)
        # the instance is free again
        assert len([r async for r in engine.stream_request(request)]) == 3
    finally:
        await engine.stop()
