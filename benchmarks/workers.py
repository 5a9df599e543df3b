"""One flowserve process against one server of N worker processes (``--workers N``), same run.

    python benchmarks/workers.py            # ~3 min: cpu_burn and simple, gRPC and HTTP, c=8

Workloads (both from the repository, perf_analyzer 2.40 at concurrency 8):

- ``cpu_burn`` (tests/models): a Python model busy for 5 ms of CPU per request, two instances;
  in one process its instances share one core (the GIL), so this is what more cores are for;
- ``simple`` (model_repository): the bundled INT32 add/sub Python model, cheap: what the
  protocol stack costs per request.

Over gRPC perf_analyzer sends everything over **one** HTTP/2 connection, which one worker
accepts: the other workers are reached only by spilling (a request that finds requests of its
model in flight runs on a less busy worker: ``flowserve/cluster/worker.py``). Over HTTP it opens
a connection per concurrent request, which the kernel spreads over the workers. Sides are
measured back to back within a repeat, in an order that alternates. The ratio is N workers / 1.
Writes ``benchmarks/results/workers.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compare import WORK, run_script, write_result
from perf import Settings, measure
from perf_analyzer_setup import ensure_perf_analyzer
from servers import HERE, Server, ServerGroup, free_port, sigterm_as_interrupt

ROOT = HERE.parent
RESULTS = HERE / "results"
MODELS = ("cpu_burn", "simple")


def start(group: ServerGroup, workers: int) -> Server:
    http, grpc = free_port(), free_port()
    command = [
        sys.executable, "-m", "flowserve.cli", "serve", "--host", "127.0.0.1", f"--http-port={http}",
        f"--grpc-port={grpc}", f"--metrics-port={free_port()}", "--workers", str(workers),
        "--model-repository", str(ROOT / "model_repository"),
        "--model-repository", str(ROOT / "tests" / "models"),
        "--model-control-mode=explicit", "--load-model=cpu_burn", "--load-model=simple",
    ]  # fmt: skip
    ready = [f"/v2/models/{m}/ready" for m in MODELS]
    return group.start(f"flowserve_w{workers}", command, http, grpc, ready)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    binary = ensure_perf_analyzer()
    settings = Settings()
    records: list[dict[str, Any]] = []
    with sigterm_as_interrupt(), ServerGroup(WORK / "logs") as group:
        print("starting servers ...", flush=True)
        sides = {f"workers={n}": start(group, n) for n in (1, args.workers)}
        names = list(sides)
        for repeat in range(args.repeats):
            order = names if repeat % 2 == 0 else names[::-1]
            for protocol in args.protocols:
                for model in MODELS:
                    for side in order:
                        result = measure(binary, sides[side], model, protocol, args.concurrency, settings)
                        result.update(side=side, model=model, protocol=protocol, repeat=repeat)
                        records.append(result)
                        print(
                            f"repeat {repeat}  {protocol:4s} {model:9s} {side:10s} "
                            f"{result['infer_per_s']:8.0f} infer/s  p99 {result['p99_us'] / 1000:6.2f} ms  "
                            f"server cores {result['server_cores']:.2f}  "
                            f"cpu {result['server_cpu_us_per_infer']} us/inf",
                            flush=True,
                        )
    return records


def summarize(records: list[dict[str, Any]], workers: int) -> list[dict[str, Any]]:
    rows = []
    for protocol in dict.fromkeys(r["protocol"] for r in records):
        for model in MODELS:
            mine = [r for r in records if r["model"] == model and r["protocol"] == protocol]
            one = {r["repeat"]: r["infer_per_s"] for r in mine if r["side"] == "workers=1"}
            many = [r for r in mine if r["side"] == f"workers={workers}"]
            ratios = [r["infer_per_s"] / one[r["repeat"]] for r in many if one.get(r["repeat"])]
            row: dict[str, Any] = {"protocol": protocol, "model": model}
            for side in ("workers=1", f"workers={workers}"):
                runs = [r for r in mine if r["side"] == side]
                row[side] = {
                    "infer_per_s": round(statistics.median(r["infer_per_s"] for r in runs)),
                    "p99_ms": round(statistics.median(r["p99_us"] for r in runs) / 1000, 2),
                    "server_cores": round(statistics.median(r["server_cores"] for r in runs), 2),
                    "cpu_us_per_infer": round(
                        statistics.median(r["server_cpu_us_per_infer"] for r in runs), 1
                    ),
                }
            row["ratio"] = round(statistics.median(ratios), 2) if ratios else None
            row["ratio_range"] = [round(min(ratios), 2), round(max(ratios), 2)] if ratios else None
            rows.append(row)
    return rows


def render(rows: list[dict[str, Any]], workers: int) -> str:
    many = f"workers={workers}"
    head = (
        f"{'proto':5s} {'model':9s} | {'1 worker infer/s':>16s} {'cores':>5s} | "
        f"{many + ' infer/s':>18s} {'cores':>5s} | ratio"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        a, b = r["workers=1"], r[many]
        spread = f" ({r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f})" if r["ratio_range"] else ""
        lines.append(
            f"{r['protocol']:5s} {r['model']:9s} | {a['infer_per_s']:16d} {a['server_cores']:5.2f} | "
            f"{b['infer_per_s']:18d} {b['server_cores']:5.2f} | {r['ratio']:.2f}x{spread}"
        )
    lines.append("concurrency 8; medians over the repeats; cores: the server's (all its processes)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--protocols", nargs="+", choices=["grpc", "http"], default=["grpc", "http"])
    parser.add_argument("--output", type=Path, default=RESULTS / "workers.json")
    parser.add_argument("--show", type=Path, metavar="JSON", help="print a recorded run's table and exit")
    args = parser.parse_args(argv)
    if args.show is not None:
        recorded = json.loads(args.show.read_text())
        print(render(recorded["summary"], recorded["settings"]["workers"]))
        return 0
    started = time.time()
    records = run(args)
    rows = summarize(records, args.workers)
    print()
    print(render(rows, args.workers))
    settings = {"workers": args.workers, "repeats": args.repeats, "concurrency": args.concurrency}
    benchmark = "flowserve 1 process vs --workers N, perf_analyzer 2.40, same machine and run"
    write_result(args.output, benchmark, started, settings=settings, summary=rows, runs=records)
    return 0


if __name__ == "__main__":
    run_script(main)
