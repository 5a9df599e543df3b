"""Throughput with dynamic batching on vs off, in-process, for a model dominated by per-call cost.

The model (Triton python backend, one instance) pays a fixed cost per ``execute`` call, whatever
the number of rows (``--overhead-us``, a sleep: like a kernel launch and sync, or a remote call),
plus a trivial numpy op. Two copies are served side by side from one temporary repository: one
without a scheduler (every request is its own execution), one with ``dynamic_batching``
(``--delay-us`` queue delay, max_batch_size 64). Closed-loop clients (``concurrency`` coroutines,
each sending its next request when the last one answered) call ``Engine.infer`` for
``--duration`` seconds after a warm-up; both models run at each concurrency in one process,
alternating off and on for ``--rounds`` rounds (the medians are compared).

    python benchmarks/batching.py                      # concurrency 16 and 64
    python benchmarks/batching.py --duration 10 --rounds 5 --overhead-us 500

Writes benchmarks/results/batching.json: infer/s, latency percentiles and the average batch
size (inference_count / execution_count from the model's statistics) per run, and per
concurrency the median infer/s off and on and their ratio. Not a unit test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import flowserve  # noqa: E402

MODEL_PY = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils

OVERHEAD_S = {overhead_s}


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(OVERHEAD_S)  # the fixed cost of one call, whatever the batch size
        arrays = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        merged = np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
        out = merged * 2 + 1
        bounds = np.cumsum([a.shape[0] for a in arrays])[:-1]
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", part)])
            for part in np.split(out, bounds)
        ]
"""

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 64
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{scheduler}
"""


def write_repository(root: Path, overhead_us: int, delay_us: int) -> None:
    schedulers = {
        "overhead_unbatched": "",
        "overhead_batched": f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}",
    }
    for name, scheduler in schedulers.items():
        version = root / name / "1"
        version.mkdir(parents=True)
        (version / "model.py").write_text(MODEL_PY.format(overhead_s=overhead_us / 1e6))
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, scheduler=scheduler))


async def load(engine: flowserve.Engine, model: str, concurrency: int, seconds: float) -> list[int]:
    """Closed-loop clients for ``seconds``; returns every request's latency (ns)."""
    latencies: list[int] = []
    stop_at = time.perf_counter() + seconds
    data = np.ones((1, 16), np.float32)

    async def client() -> None:
        while time.perf_counter() < stop_at:
            start = time.perf_counter_ns()
            await engine.infer(model, {"INPUT0": data})
            latencies.append(time.perf_counter_ns() - start)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return latencies


async def measure(
    engine: flowserve.Engine, model: str, concurrency: int, seconds: float, warmup: float
) -> dict[str, Any]:
    await load(engine, model, concurrency, warmup)
    stats = engine.registry.get(model).stats
    before = (stats.inference_count, stats.execution_count)
    started = time.perf_counter()
    latencies = await load(engine, model, concurrency, seconds)
    elapsed = time.perf_counter() - started
    inferences = stats.inference_count - before[0]
    executions = stats.execution_count - before[1]
    ms = sorted(lat / 1e6 for lat in latencies)
    return {
        "model": model,
        "batching": model == "overhead_batched",
        "concurrency": concurrency,
        "requests": len(latencies),
        "seconds": round(elapsed, 3),
        "infer_per_s": round(len(latencies) / elapsed, 1),
        "latency_ms": {
            "p50": round(statistics.median(ms), 3),
            "p90": round(ms[int(0.9 * (len(ms) - 1))], 3),
            "p99": round(ms[int(0.99 * (len(ms) - 1))], 3),
        },
        "avg_batch_size": round(inferences / executions, 2) if executions else None,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="flowserve-bench-batching-") as tmp:
        repo = Path(tmp)
        write_repository(repo, args.overhead_us, args.delay_us)
        engine = await flowserve.Engine.start(repo)
        runs: list[dict[str, Any]] = []
        try:
            # off and on alternate round by round, so a load change on a shared machine
            # hits both sides of a ratio alike
            for concurrency in args.concurrency:
                for round_ in range(args.rounds):
                    for model in ("overhead_unbatched", "overhead_batched"):
                        run = await measure(engine, model, concurrency, args.duration, args.warmup)
                        run["round"] = round_
                        runs.append(run)
                        print(
                            f"concurrency {concurrency:3d}  round {round_}  "
                            f"batching {'on ' if run['batching'] else 'off'}  "
                            f"{run['infer_per_s']:9.1f} infer/s  p50 {run['latency_ms']['p50']:7.2f} ms  "
                            f"avg batch {run['avg_batch_size']}",
                            flush=True,
                        )
        finally:
            await engine.stop()
    summary: dict[str, dict[str, float]] = {}
    for concurrency in args.concurrency:
        off, on = (
            statistics.median(
                r["infer_per_s"] for r in runs if r["concurrency"] == concurrency and r["batching"] is b
            )
            for b in (False, True)
        )
        summary[str(concurrency)] = {
            "off_infer_per_s": off,
            "on_infer_per_s": on,
            "ratio_on_over_off": round(on / off, 2),
        }
        print(
            f"concurrency {concurrency:3d}  median of {args.rounds}: off {off:.1f}, on {on:.1f} infer/s, "
            f"on / off = {on / off:.2f}x"
        )
    return {
        "benchmark": "dynamic batching on vs off, in-process Engine.infer, closed loop",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "model": {
            "backend": "python (model.py), 1 instance, max_batch_size 64, FP32 [16] per row",
            "per_call_overhead_us": args.overhead_us,
            "max_queue_delay_us": args.delay_us,
        },
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "rounds": args.rounds,
        "median_per_concurrency": summary,
        "runs": runs,
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds measured per run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating off/on rounds per concurrency")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of warm-up per run")
    parser.add_argument("--overhead-us", type=int, default=1000, help="fixed cost of one model call")
    parser.add_argument("--delay-us", type=int, default=0, help="max_queue_delay_microseconds")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "batching.json")
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse()
    result = asyncio.run(main(arguments))
    arguments.output.parent.mkdir(parents=True, exist_ok=True)
    arguments.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {arguments.output}")
