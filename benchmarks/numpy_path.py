"""The common numpy path, this tree against another commit's, in-process, alternating runs.

What issue 22 (tensors that stay where they are) must not slow: requests whose tensors are all
numpy. Two workloads through ``Engine.infer`` (no wire), closed loop, ``--concurrency``
coroutines, uvloop: the bundled ``simple`` model (Python backend, INT32 [1, 16] add/sub) and the
``fanout`` graph (simple, then two Python scaling nodes in parallel, then a Python join). Each
run is its own process importing flowserve from one tree (``--old`` is a checkout of the
other commit, e.g. ``git worktree add /tmp/x c7fc4dc``); the trees alternate, ``--rounds``
times, and what is compared is the process CPU time per request (the machine is shared: CPU
time is steadier than the rate).

    python benchmarks/numpy_path.py --old /tmp/x                  # about 2 minutes
    python benchmarks/numpy_path.py --old /tmp/x --rounds 8 --requests 20000

Writes benchmarks/results/numpy_path.json. Not a unit test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKLOADS = ("simple", "fanout")


def _run_one(tree: Path, workload: str, requests: int, concurrency: int) -> dict[str, float]:
    """In the child process: flowserve from ``tree``, one workload, CPU and wall per request."""
    sys.path.insert(0, str(tree))
    os.chdir(tree)
    import numpy as np
    import uvloop

    import flowserve

    work = Path(tempfile.mkdtemp(prefix="numpy-path-"))
    try:
        repo, graphs = work / "models", work / "graphs"
        shutil.copytree(tree / "model_repository" / "simple", repo / "simple")
        graphs.mkdir()
        if workload == "fanout":
            shutil.copy(tree / "graphs" / "fanout.yaml", graphs / "fanout.yaml")
        if workload == "simple":
            name, inputs = (
                "simple",
                {"INPUT0": np.ones((1, 16), np.int32), "INPUT1": np.ones((1, 16), np.int32)},
            )
        else:
            name, inputs = "fanout", {"a": np.ones((1, 16), np.int32), "b": np.ones((1, 16), np.int32)}

        async def drive(total: int) -> None:
            left = total

            async def client() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    await engine.infer(name, dict(inputs))

            await asyncio.gather(*(client() for _ in range(concurrency)))

        async def main() -> dict[str, float]:
            nonlocal engine
            engine = await flowserve.Engine.start([repo], [graphs])
            try:
                await drive(max(requests // 10, 500))  # warm-up
                cpu0, t0 = time.process_time(), time.perf_counter()
                await drive(requests)
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            finally:
                await engine.stop()
            return {"cpu_us": 1e6 * cpu / requests, "wall_us": 1e6 * wall / requests}

        engine: Any = None
        return uvloop.run(main())
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--old", type=Path, help="a checkout of the commit to compare with")
    parser.add_argument("--old-label", default="old")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=12000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "numpy_path.json")
    parser.add_argument("--child", nargs=2, metavar=("TREE", "WORKLOAD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = _run_one(Path(args.child[0]), args.child[1], args.requests, args.concurrency)
        print(json.dumps(result))
        return
    if args.old is None:
        parser.error("--old is required")
    trees = {"new": ROOT, args.old_label: args.old.resolve()}
    runs: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for workload in WORKLOADS:
            order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
            for label in order:
                out = (
                    subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            "--child",
                            str(trees[label]),
                            workload,
                            "--requests",
                            str(args.requests),
                            "--concurrency",
                            str(args.concurrency),
                        ],
                        check=True,
                        capture_output=True,
                        text=True,
                    )
                    .stdout.strip()
                    .splitlines()[-1]
                )
                run = {"round": round_, "workload": workload, "tree": label, **json.loads(out)}
                runs.append(run)
                print(
                    f"round {round_} {workload:7s} {label:8s} cpu {run['cpu_us']:6.1f} us/req  "
                    f"wall {run['wall_us']:6.1f} us/req",
                    flush=True,
                )
    summary: dict[str, Any] = {}
    for workload in WORKLOADS:
        per = {
            label: sorted(r["cpu_us"] for r in runs if r["workload"] == workload and r["tree"] == label)
            for label in trees
        }
        summary[workload] = {
            label: {"median_cpu_us": round(statistics.median(v), 1), "min_cpu_us": round(v[0], 1)}
            for label, v in per.items()
        }
        print(workload, json.dumps(summary[workload]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "numpy path, in-process Engine.infer, closed loop, uvloop, CPU per request",
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                },
                "old": str(args.old),
                "requests": args.requests,
                "concurrency": args.concurrency,
                "rounds": args.rounds,
                "summary": summary,
                "runs": runs,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
