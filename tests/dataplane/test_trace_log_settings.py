"""Trace and log settings from the network (HTTP /v2/trace/setting, /v2/models/M/trace/setting,
/v2/logging; gRPC UpdateTraceSettings, LogSettings: both front ends call these plane methods)
are checked against their bounds (flowserve/spec/bounds.py SETTINGS) in Triton's words where
Triton has them; a refused update changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import flowserve
from flowserve.core.errors import ErrorCode, FlowserveError
from flowserve.dataplane.plane import DataPlane
from flowserve.repository.settings import RepositorySettings

MODELS = Path(__file__).resolve().parents[2] / "tests" / "reliability" / "models"


@pytest.fixture
async def plane() -> AsyncIterator[DataPlane]:
    engine = await flowserve.Engine.start(
        MODELS, settings=RepositorySettings(control_mode="explicit", load_models=("add_sub",))
    )
    try:
        yield DataPlane(engine)
    finally:
        await engine.stop()


def refused(call: Any, *args: Any) -> str:
    with pytest.raises(FlowserveError) as info:
        call(*args)
    assert info.value.code is ErrorCode.INVALID_ARG
    return info.value.message


@pytest.mark.parametrize("model", ["", "add_sub"])
@pytest.mark.parametrize(
    ("settings", "says"),
    [
        (
            {"trace_rate": "-1"},
            "Unable to parse 'trace_rate', value is out of range [ 0, 2147483647 ], got: -1",
        ),
        ({"trace_rate": -1}, "Unable to parse 'trace_rate', value is out of range [ 0, 2147483647 ]"),
        ({"trace_rate": 1e23}, "Unable to parse 'trace_rate', got: 1e+23"),
        ({"trace_rate": "1e23"}, "Unable to parse 'trace_rate', got: 1e23"),
        ({"trace_rate": str(2**31)}, "Unable to parse 'trace_rate', value is out of range [ 0, 2147483647 ]"),
        ({"trace_rate": True}, "Unable to parse 'trace_rate', got: True"),
        ({"trace_rate": ["5", "6"]}, "expect only 1 value for 'trace_rate'"),
        ({"trace_count": "-2"}, "Unable to parse 'trace_count'. Expecting value >= -1, got:-2"),
        (
            {"trace_count": str(2**63)},
            "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ]",
        ),
        ({"log_frequency": str(2**63)}, "Unable to parse 'log_frequency', value is out of range"),
        ({"trace_rate": "9" * 100_000}, "Unable to parse 'trace_rate', got: 999"),
        ({"trace_level": ["TIMESTAMPS"] * 100_000}, "trace_level has 100000 entries, more than 8"),
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, "Expect only one trace level 'OFF' is specified"),
        ({"trace_level": ["LOUD"]}, "trace_level must be OFF, TIMESTAMPS or TENSORS"),
        ({"trace_level": [1]}, "trace_level must be a string or a list of strings"),
        ({"trace_mode": "zipkin"}, "trace_mode 'zipkin' is not available"),
        ({"x" * 10_000: "1"}, "unknown trace setting 'xxx"),
    ],
)
def test_absurd_trace_settings_are_refused_naming_the_setting(
    plane: DataPlane, model: str, settings: dict[str, Any], says: str
) -> None:
    before = plane.get_trace_settings(model)
    message = refused(plane.update_trace_settings, {"trace_level": ["TIMESTAMPS"], **settings}, model)
    assert says in message, message
    assert len(message) < 300  # a client's value is shown cut short
    assert plane.get_trace_settings(model) == before  # nothing of it was applied


def test_sane_trace_settings_at_the_bounds(plane: DataPlane) -> None:
    got = plane.update_trace_settings(
        {
            "trace_level": ["TENSORS", "TIMESTAMPS", "TENSORS"],
            "trace_rate": "2147483647",
            "trace_count": ["-1"],
            "log_frequency": 0,
        }
    )
    assert got["trace_level"] == ["TENSORS", "TIMESTAMPS"]  # repeats dropped
    assert (got["trace_rate"], got["trace_count"], got["log_frequency"]) == ("2147483647", "-1", "0")
    assert plane.update_trace_settings({"trace_level": []})["trace_level"] == ["TENSORS", "TIMESTAMPS"]
    assert plane.update_trace_settings({"trace_level": "OFF"})["trace_level"] == ["OFF"]


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        (
            {"log_verbose_level": 2**63},
            "log setting 'log_verbose_level' must be an integer between 0 and 255 (verbosity, 0 off), "
            "got 9223372036854775808",
        ),
        ({"log_verbose_level": -1}, "between 0 and 255"),
        ({"log_verbose_level": True}, "between 0 and 255"),
        ({"log_verbose_level": 1.5}, "between 0 and 255"),
        ({"log_format": "x" * 10_000}, "invalid argument for log_format, got: xxx"),
        ({"log_info": "yes"}, "log setting 'log_info' must be a boolean"),
    ],
)
def test_absurd_log_settings_are_refused_and_change_nothing(
    plane: DataPlane, settings: dict[str, Any], says: str
) -> None:
    before = plane.get_log_settings()
    message = refused(plane.update_log_settings, {"log_info": not before["log_info"], **settings})
    assert says in message, message
    assert len(message) < 300
    assert plane.get_log_settings() == before  # log_info, valid, was not applied either


def test_the_highest_verbose_level_is_accepted(plane: DataPlane) -> None:
    try:
        assert plane.update_log_settings({"log_verbose_level": 255})["log_verbose_level"] == 255
    finally:
        plane.update_log_settings({"log_verbose_level": 0, "log_info": True})
