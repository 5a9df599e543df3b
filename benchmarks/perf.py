"""One perf_analyzer measurement: run the binary at one concurrency, read its CSV, and note how
much CPU the server and perf_analyzer itself spent meanwhile (both share the machine's cores).

Settings (:class:`Settings`) that settle on two shared cores: time windows of ``window_ms``
(1 s), stability ``stability`` percent (30) over 3 windows with at most ``max_trials`` (4)
windows; when a measurement does not settle, perf_analyzer is run once more with the check
in effect off (``-s 1000``), and the result is marked ``settled: false``. The spread across
runs is measured by repeating runs, not by perf_analyzer.
"""

from __future__ import annotations

import csv
import resource
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servers import Server, cpu_seconds

UNCHECKED = 1000  # a stability percent any three windows meet


@dataclass(frozen=True, slots=True)
class Settings:
    window_ms: int = 1000
    stability: int = 30
    max_trials: int = 4
    timeout_s: float = 120.0


def _command(
    binary: Path,
    model: str,
    url: str,
    protocol: str,
    concurrency: int,
    out: Path,
    settings: Settings,
    stability: int,
    extra: Sequence[str] = (),
) -> list[str]:
    return [
        str(binary), "-m", model, "-u", url, "-i", protocol,
        "--concurrency-range", f"{concurrency}:{concurrency}",
        "--measurement-mode", "time_windows", "-p", str(settings.window_ms),
        "-s", str(stability), "-r", str(settings.max_trials),
        "-f", str(out), *extra,
    ]  # fmt: skip


def _parse(path: Path) -> dict[str, float]:
    with path.open() as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise RuntimeError(f"perf_analyzer wrote no measurement to {path}")
    row = rows[-1]
    return {
        "infer_per_s": float(row["Inferences/Second"]),
        "p50_us": float(row["p50 latency"]),
        "p90_us": float(row["p90 latency"]),
        "p99_us": float(row["p99 latency"]),
    }


def measure(
    binary: Path,
    server: Server,
    model: str,
    protocol: str,
    concurrency: int,
    settings: Settings,
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    """One measurement of ``model`` on ``server`` (``extra``: more perf_analyzer arguments, such
    as ``--shape`` or ``--shared-memory``); raises RuntimeError when perf_analyzer fails."""
    with tempfile.TemporaryDirectory(prefix="flowserve-perf-") as tmp:
        out = Path(tmp) / "out.csv"
        settled = True
        for stability in (settings.stability, UNCHECKED):
            cmd = _command(
                binary, model, server.url(protocol), protocol, concurrency, out, settings, stability, extra
            )
            cpu0, client0, t0 = cpu_seconds(server.pid), _children_cpu(), time.perf_counter()
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=settings.timeout_s, check=False
            )
            wall, cpu = time.perf_counter() - t0, cpu_seconds(server.pid) - cpu0
            client = _children_cpu() - client0
            if done.returncode == 0 and out.is_file():
                break
            unsettled = "stable" in (done.stdout + done.stderr).lower()
            if stability == UNCHECKED or not unsettled:
                tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
                raise RuntimeError(f"perf_analyzer failed ({' '.join(cmd)}): " + " | ".join(tail))
            settled = False
        result: dict[str, Any] = _parse(out)
    rate = result["infer_per_s"]
    result["settled"] = settled
    # CPU per inference, from the average load over the run and the measured rate: the
    # server's (all its processes) and perf_analyzer's own, which shares the machine with it
    for who, seconds in (("server", cpu), ("client", client)):
        cores = seconds / wall if wall > 0 else 0.0
        result[f"{who}_cores"] = round(cores, 3)
        result[f"{who}_cpu_us_per_infer"] = round(1e6 * cores / rate, 1) if rate else None
    return result


def _children_cpu() -> float:
    """User + system CPU seconds of this process's waited-for children (perf_analyzer runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
