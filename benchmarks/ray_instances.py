"""KIND_RAY instances (nodes/rayinstances.py) against local instances, in-process, one run.

Three measurements, each local and on Ray side by side, on a local Ray started for the run
(``ray_address="local"``: one Ray node on this machine, all its CPUs; each actor asks for half a
CPU so that all five fit on two cores: Ray CPUs are bookkeeping, not pinning):

- **heavy**: a node that burns ``--burn-ms`` of CPU per call in Python (holding the GIL), with
  1 and 2 instances, ``--concurrency`` requests in flight for ``--requests`` requests: local
  instances share this process's GIL, Ray instances are processes of their own;
- **hop**: an empty call (a 4-element FP32 in and out), one at a time: the per-call cost of the
  Ray hop (pickled call, two object-store-or-inline transfers, the actor's event loop and its
  instance thread) against a local instance;
- **4 MB**: the same with a 4 MiB FP32 input and a 4 MiB output (both through the object store).

    python benchmarks/ray_instances.py                  # about a minute on 2 cores
    python benchmarks/ray_instances.py --burn-ms 5 --requests 400

Writes benchmarks/results/ray_instances.json. Not a unit test: numbers depend on the machine.
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import flowserve  # noqa: E402
from flowserve.repository.settings import RepositorySettings  # noqa: E402


class Burn:
    """Burns ``burn_ms`` (a parameter) of CPU per call in Python, then echoes x."""

    inputs = {"x": {"datatype": "FP32", "dims": [-1]}}
    outputs = {"y": {"datatype": "FP32", "dims": [-1]}}
    inline = False

    def initialize(self, config: dict[str, Any]) -> None:
        self.burn_s = float(config["parameters"].get("burn_ms", 5)) / 1000.0

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        end = time.thread_time() + self.burn_s
        total = 0
        while time.thread_time() < end:
            total += sum(range(200))
        return {"y": inputs["x"]}


class Echo:
    """y = x (the cheapest call there is)."""

    inputs = {"x": {"datatype": "FP32", "dims": [-1]}}
    outputs = {"y": {"datatype": "FP32", "dims": [-1]}}
    inline = False  # local calls on the instance's thread, as a Ray actor's are

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"y": inputs["x"]}


def _graph(folder: Path, name: str, cls: str, count: int, ray: bool, burn_ms: float) -> None:
    kind = "{kind: KIND_RAY, resources: {num_cpus: 0.5}, " if ray else "{kind: KIND_CPU, "
    (folder / f"{name}.yaml").write_text(
        f"""
name: {name}
inputs: {{x: {{datatype: FP32, dims: [-1]}}}}
outputs: {{y: n.y}}
nodes:
  n: {{python: "ray_instances:{cls}", inputs: {{x: $x}}, parameters: {{burn_ms: {burn_ms}}},
       instances: {kind}count: {count}}}}}
"""
    )


async def _throughput(engine: flowserve.Engine, name: str, requests: int, concurrency: int) -> float:
    x = np.ones(4, np.float32)
    left = requests

    async def client() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await engine.infer(name, {"x": x})

    for _ in range(4):  # warm up
        await engine.infer(name, {"x": x})
    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return requests / (time.perf_counter() - start)


async def _latency_us(engine: flowserve.Engine, name: str, x: np.ndarray, calls: int) -> float:
    for _ in range(10):
        await engine.infer(name, {"x": x})
    times = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        await engine.infer(name, {"x": x})
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1000


async def main(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))  # the node classes above, for the actors too (module ray_instances)
    folder = Path(tempfile.mkdtemp(prefix="ray_bench_"))
    for ray in (False, True):
        where = "ray" if ray else "local"
        for count in (1, 2):
            _graph(folder, f"heavy_{where}_{count}", "Burn", count, ray, args.burn_ms)
        _graph(folder, f"echo_{where}", "Echo", 1, ray, 0)
    settings = RepositorySettings(ray_address="local")
    engine = await flowserve.Engine.start(None, folder, settings)
    try:
        failed = [s for s in engine.registry.index() if s.reason]
        if failed:
            raise SystemExit(f"not loaded: {[(s.name, s.reason) for s in failed]}")
        heavy = {
            name: await _throughput(engine, name, args.requests, args.concurrency)
            for name in ("heavy_local_1", "heavy_local_2", "heavy_ray_1", "heavy_ray_2")
        }
        small = np.ones(4, np.float32)
        big = np.ones(1 << 20, np.float32)
        hop = {w: await _latency_us(engine, f"echo_{w}", small, args.calls) for w in ("local", "ray")}
        large = {w: await _latency_us(engine, f"echo_{w}", big, args.calls // 4) for w in ("local", "ray")}
    finally:
        await engine.stop()
    return {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "settings": vars(args),
        "heavy_infer_per_s": heavy,
        "heavy_ratios": {
            "local 2/1": heavy["heavy_local_2"] / heavy["heavy_local_1"],
            "ray 2/1": heavy["heavy_ray_2"] / heavy["heavy_ray_1"],
            "ray 2 / local 2": heavy["heavy_ray_2"] / heavy["heavy_local_2"],
        },
        "hop_median_us": hop,
        "hop_ratio_ray/local": hop["ray"] / hop["local"],
        "4MiB_median_us": large,
        "4MiB_ratio_ray/local": large["ray"] / large["local"],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burn-ms", type=float, default=5.0)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--calls", type=int, default=400)
    result = asyncio.run(main(parser.parse_args()))
    import ray

    ray.shutdown()
    print(json.dumps(result, indent=2))
    out = HERE / "results" / "ray_instances.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
