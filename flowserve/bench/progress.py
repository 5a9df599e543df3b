"""The progress bar: one line on stderr, redrawn in place, with the rate of the last moment."""

from __future__ import annotations

from typing import Any

from flowserve.bench.load import Level, Progress
from flowserve.bench.stats import Recorder


def progress_bar(stream: Any) -> Progress:
    state = {"completed": 0, "at": 0.0}

    def draw(level: Level, elapsed: float, total: float, recorder: Recorder) -> None:
        done = min(1.0, elapsed / total) if total else 1.0
        width = 24
        bar = "#" * int(done * width) + "." * (width - int(done * width))
        gap = elapsed - state["at"]
        rate = (recorder.completed - state["completed"]) / gap if gap > 0 else 0.0
        state["completed"], state["at"] = recorder.completed, elapsed
        what = f"c={level.concurrency}" if level.concurrency else f"rate={level.rate:g}/s"
        stream.write(f"\r{what:>12} [{bar}] {elapsed:5.1f}/{total:.0f}s {rate:9.0f} req/s ")
        stream.flush()
        if done >= 1.0 or elapsed + 0.3 > total:
            state["completed"], state["at"] = 0, 0.0

    return draw


__all__ = ["progress_bar"]
