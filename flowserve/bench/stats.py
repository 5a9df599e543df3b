"""One load level's result and how it is computed from the recorded latencies (pure)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class Recorder:
    """Latencies of the requests that completed inside the measurement window, and errors.

    ``window`` is (start_ns, end_ns); before it is set nothing is kept (the warm-up), and a
    request counts only when it both started and finished inside it."""

    window_start: int = -1
    window_end: int = 1 << 62
    latencies: list[int] = field(default_factory=list)
    errors: int = 0
    messages: dict[str, int] = field(default_factory=dict)
    completed: int = 0  # every completion, warm-up included (the progress bar reads it)

    def ok(self, start_ns: int, end_ns: int) -> None:
        self.completed += 1
        if self.window_start <= start_ns and end_ns <= self.window_end:
            self.latencies.append(end_ns - start_ns)

    def failed(self, start_ns: int, end_ns: int, message: str) -> None:
        self.completed += 1
        if len(self.messages) < 20 or message in self.messages:
            self.messages[message] = self.messages.get(message, 0) + 1
        if self.window_start <= start_ns and end_ns <= self.window_end:
            self.errors += 1


@dataclass(frozen=True, slots=True)
class LevelResult:
    """One measured level: closed loop at ``concurrency`` or open loop at ``rate`` requests/s."""

    protocol: str
    concurrency: int  # 0 for an open loop
    rate: float  # 0.0 for a closed loop
    batch_size: int
    duration_s: float
    requests: int
    errors: int
    throughput: float  # inferences/s: successful requests x batch size per second
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    client_cores: float  # CPU the benchmark's own processes used, in cores
    error_messages: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def level(self) -> str:
        return f"c={self.concurrency}" if self.concurrency else f"rate={self.rate:g}/s"


@dataclass(slots=True)
class Measured:
    """What one process recorded in one level's window, before it is summarized (several
    client processes' are merged)."""

    recorder: Recorder
    window_s: float
    cpu_s: float


def summarize(
    parts: list[Measured], *, protocol: str, concurrency: int, rate: float, batch_size: int
) -> LevelResult:
    """One level's result from what each client process measured: latencies pooled, throughput
    summed over the processes (each over its own window), errors and CPU added up."""
    data = np.concatenate([np.asarray(p.recorder.latencies, dtype=np.int64) for p in parts]) / 1e6
    if data.size:
        p50, p90, p95, p99 = (float(v) for v in np.percentile(data, [50, 90, 95, 99]))
        mean, top = float(data.mean()), float(data.max())
    else:
        p50 = p90 = p95 = p99 = mean = top = 0.0
    throughput = sum(len(p.recorder.latencies) / p.window_s for p in parts if p.window_s > 0) * batch_size
    window = max((p.window_s for p in parts), default=0.0)
    messages: dict[str, int] = {}
    for part in parts:
        for message, count in part.recorder.messages.items():
            messages[message] = messages.get(message, 0) + count
    return LevelResult(
        protocol=protocol,
        concurrency=concurrency,
        rate=rate,
        batch_size=batch_size,
        duration_s=round(window, 3),
        requests=int(data.size),
        errors=sum(p.recorder.errors for p in parts),
        throughput=throughput,
        p50_ms=p50,
        p90_ms=p90,
        p95_ms=p95,
        p99_ms=p99,
        mean_ms=mean,
        max_ms=top,
        client_cores=round(sum(p.cpu_s / p.window_s for p in parts if p.window_s > 0), 3),
        error_messages=messages,
    )


def table(results: list[LevelResult]) -> str:
    """The terminal table of several levels."""
    head = f"{'level':>12} {'infer/s':>10} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'requests':>9} "
    head += f"{'errors':>7}"
    rows = [head, "-" * len(head)]
    for r in results:
        rows.append(
            f"{r.level:>12} {r.throughput:>10.1f} {r.p50_ms:>8.2f} {r.p90_ms:>8.2f} {r.p99_ms:>8.2f} "
            f"{r.requests:>9} {r.errors:>7}"
        )
    return "\n".join(rows)


__all__ = ["LevelResult", "Measured", "Recorder", "summarize", "table"]
