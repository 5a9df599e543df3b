"""LimitedLog: a flood of one kind of message writes one line a second, and the next line
says how many were left out."""

from __future__ import annotations

import logging

import pytest

from flowserve.core.ratelog import LimitedLog


def test_a_flood_writes_one_line_an_interval_and_counts_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    limited = LimitedLog(logging.getLogger("flowserve.test"), lambda: now[0], interval_s=1.0)
    with caplog.at_level(logging.WARNING, logger="flowserve.test"):
        assert limited(logging.WARNING, "node failed: %s", "a")
        for _ in range(999):
            assert not limited(logging.WARNING, "node failed: %s", "b")
        now[0] = 1.5
        assert limited(logging.WARNING, "node failed: %s", "c", extra={"node": "n"})
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["node failed: a", "node failed: c (and 999 more like it since the last such message)"]
    assert caplog.records[1].node == "n"  # type: ignore[attr-defined]
