"""Inline execution (cheap Python work on the event loop) vs always on the instance's thread,
in-process, closed loop: ``Engine.infer`` from ``--concurrency`` coroutines for ``--duration``
seconds after a warm-up, uvloop, the two settings alternating for ``--rounds`` rounds.

Models: the bundled ``simple`` (INT32 add/sub, Python backend, no batcher) and the benchmark's
``add_sub`` (FP32, dynamic batching with a 500 us queue delay). "thread" is
``RepositorySettings(inline_threshold_us=0)`` (every call handed to the instance's thread),
"inline" the default threshold.

    python benchmarks/inline.py                 # about 1 minute
    python benchmarks/inline.py --rounds 5 --duration 5

Writes benchmarks/results/inline.json (per run: infer/s and process CPU per inference; per
model: the medians and their ratio). Not a unit test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import uvloop

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from workloads import build_repositories  # noqa: E402

import flowserve  # noqa: E402

DEFAULT_THRESHOLD_US = flowserve.RepositorySettings().inline_threshold_us

MODELS: dict[str, tuple[str, dict[str, np.ndarray]]] = {
    "simple": ("bundled", {"INPUT0": np.ones((1, 16), np.int32), "INPUT1": np.ones((1, 16), np.int32)}),
    "add_sub": ("bench", {"INPUT0": np.ones((1, 16), np.float32), "INPUT1": np.ones((1, 16), np.float32)}),
}


async def load(engine: flowserve.Engine, model: str, inputs: dict[str, np.ndarray], c: int, s: float) -> int:
    stop = time.perf_counter() + s
    done = 0

    async def client() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await engine.infer(model, dict(inputs))
            done += 1

    await asyncio.gather(*(client() for _ in range(c)))
    return done


async def one_run(
    repos: list[Path], model: str, threshold_us: float, args: argparse.Namespace
) -> dict[str, Any]:
    settings = flowserve.RepositorySettings(inline_threshold_us=threshold_us)
    engine = await flowserve.Engine.start(repos, settings=settings)
    try:
        inputs = MODELS[model][1]
        await load(engine, model, inputs, args.concurrency, args.warmup)
        cpu0, t0 = time.process_time(), time.perf_counter()
        count = await load(engine, model, inputs, args.concurrency, args.duration)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        await engine.stop()
    return {
        "model": model,
        "mode": "inline" if threshold_us else "thread",
        "infer_per_s": round(count / wall, 1),
        "cpu_us_per_infer": round(1e6 * cpu / count, 1),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    bench = build_repositories(HERE / ".work" / "repos").flowserve
    repos = {"bundled": ROOT / "model_repository", "bench": bench}
    runs: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for model, (repo, _) in MODELS.items():
            order = [0.0, DEFAULT_THRESHOLD_US] if round_ % 2 == 0 else [DEFAULT_THRESHOLD_US, 0.0]
            for threshold in order:
                run = await one_run([repos[repo]], model, threshold, args)
                run["round"] = round_
                runs.append(run)
                print(
                    f"round {round_}  {model:8s} {run['mode']:6s} {run['infer_per_s']:9.1f} infer/s  "
                    f"cpu {run['cpu_us_per_infer']:6.1f} us/infer",
                    flush=True,
                )
    summary: dict[str, Any] = {}
    for model in MODELS:
        med = {
            mode: statistics.median(
                r["infer_per_s"] for r in runs if r["model"] == model and r["mode"] == mode
            )
            for mode in ("thread", "inline")
        }
        cpu = {
            mode: statistics.median(
                r["cpu_us_per_infer"] for r in runs if r["model"] == model and r["mode"] == mode
            )
            for mode in ("thread", "inline")
        }
        summary[model] = {
            "thread_infer_per_s": med["thread"],
            "inline_infer_per_s": med["inline"],
            "ratio": round(med["inline"] / med["thread"], 2),
            "thread_cpu_us_per_infer": cpu["thread"],
            "inline_cpu_us_per_infer": cpu["inline"],
        }
        print(
            f"{model}: thread {med['thread']:.0f} -> inline {med['inline']:.0f} infer/s "
            f"({med['inline'] / med['thread']:.2f}x)"
        )
    return {
        "benchmark": "inline execution vs thread hand-off, in-process Engine.infer, closed loop, uvloop",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "inline_threshold_us": DEFAULT_THRESHOLD_US,
        "concurrency": args.concurrency,
        "duration_s": args.duration,
        "rounds": args.rounds,
        "median_per_model": summary,
        "runs": runs,
    }


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=HERE / "results" / "inline.json")
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse()
    result = uvloop.run(main(arguments))
    arguments.output.parent.mkdir(parents=True, exist_ok=True)
    arguments.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {arguments.output}")
