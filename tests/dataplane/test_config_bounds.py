"""A load request's config override past a bound (flowserve/spec/bounds.py) is refused at
once, before anything is built from it, naming the model, the field and the bound; and a
request's own huge ``timeout`` overflows no timer."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import flowserve
from flowserve.core.errors import ErrorCode, FlowserveError
from flowserve.dataplane.plane import DataPlane
from flowserve.repository.settings import RepositorySettings

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "reliability" / "models"
ROW = np.arange(16, dtype=np.int32).reshape(1, 16)


def add_sub_config(**extra: Any) -> str:
    tensor = {"data_type": "TYPE_INT32", "dims": [16]}
    config = {
        "backend": "python",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", **tensor}, {"name": "INPUT1", **tensor}],
        "output": [{"name": "OUTPUT0", **tensor}, {"name": "OUTPUT1", **tensor}],
        **extra,
    }
    return json.dumps(config)


@pytest.fixture
async def plane() -> AsyncIterator[DataPlane]:
    engine = await flowserve.Engine.start(
        MODELS, settings=RepositorySettings(control_mode="explicit", load_models=("add_sub",))
    )
    try:
        yield DataPlane(engine)
    finally:
        await engine.stop()


@pytest.mark.parametrize(
    ("extra", "field", "bound"),
    [
        ({"instance_group": [{"count": 100_000}]}, "instance_group[0].count", "between 1 and 1024"),
        ({"instance_group": [{"count": 2**31 - 1}]}, "instance_group[0].count", "between 1 and 1024"),
        (
            {"dynamic_batching": {"max_queue_delay_microseconds": str(2**63)}},
            "dynamic_batching.max_queue_delay_microseconds",
            "between 0 and 3600000000 (microseconds, 1 hour)",
        ),
    ],
)
async def test_an_absurd_override_is_refused_at_once(
    plane: DataPlane, extra: dict[str, Any], field: str, bound: str
) -> None:
    threads = threading.active_count()
    started = time.monotonic()
    with pytest.raises(FlowserveError) as info:
        await plane.load("add_sub", {"config": add_sub_config(**extra)})
    assert time.monotonic() - started < 5.0
    assert info.value.code is ErrorCode.INVALID_ARG
    message = info.value.message
    assert "add_sub" in message and f"field '{field}'" in message and bound in message, message
    assert threading.active_count() <= threads + 2  # nothing was started for it
    # the model loaded before still serves
    out = await plane.engine.infer("add_sub", {"INPUT0": ROW, "INPUT1": ROW})
    assert np.array_equal(out["OUTPUT0"], ROW * 2)


async def test_a_sane_override_at_the_bounds_loads(plane: DataPlane) -> None:
    await plane.load(
        "add_sub",
        {"config": add_sub_config(dynamic_batching={"max_queue_delay_microseconds": 3_600_000_000})},
    )
    # a lone request waits the queue delay (an hour here) unless its timeout says less
    with pytest.raises(FlowserveError) as info:
        await plane.engine.infer("add_sub", {"INPUT0": ROW, "INPUT1": ROW}, parameters={"timeout": 200_000})
    assert info.value.code is ErrorCode.UNAVAILABLE


@pytest.mark.parametrize("timeout_us", [2**63, 2**64 + 1, 2**1100])
async def test_a_huge_request_timeout_overflows_nothing(plane: DataPlane, timeout_us: int) -> None:
    out = await plane.engine.infer(
        "add_sub", {"INPUT0": ROW, "INPUT1": ROW}, parameters={"timeout": timeout_us}
    )
    assert np.array_equal(out["OUTPUT1"], ROW * 0)
