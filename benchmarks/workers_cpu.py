"""A CPU-bound Python model over ONE connection: flowserve ``--workers 1`` and ``--workers 2``
against Triton 2.51, side by side, same run (issue 28 item 4); and ``--workers 2
--cpu-affinity spread`` (each worker held to a core of its own: ``flowserve/cluster/affinity.py``).

    python benchmarks/workers_cpu.py                 # ~4 min: gRPC and HTTP, c=4, 3 repeats
    python benchmarks/workers_cpu.py --protocols grpc --repeats 5
    python benchmarks/workers_cpu.py --flowserve-count 4   # flowserve: the model with count: 4

The model (``benchmarks/models/workers/cpu_burn``): 2 ms of pure Python CPU per request,
``instance_group { count: 2 }``, served unchanged by both servers (Triton runs each instance in
its own stub process, so its two instances use two cores; flowserve's two workers load one
each: ``flowserve/repository/placement.py``). perf_analyzer 2.40 at concurrency 4:
over gRPC every request travels on **one** HTTP/2 connection, which one flowserve worker
accepts, so the second core is reached only by moving requests to the other worker
(``flowserve/cluster/routing.py``); over HTTP it opens one connection per concurrent request.
Within a repeat the three sides run back to back in an order that rotates. Ratios are per
repeat (flowserve / Triton, and 2 workers / 1), reported as the median with their range.
Writes ``benchmarks/results/workers_cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
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
from triton_setup import ensure_triton

RESULTS = HERE / "results"
REPOSITORY = HERE / "models" / "workers"
MODEL = "cpu_burn"
SPREAD = "workers=2 spread"
SIDES = ("triton", "workers=1", "workers=2", SPREAD)


def flowserve_repository(count: int | None) -> Path:
    """The repository flowserve serves: the shared one, or a copy whose model has ``count``
    instances (per worker) while Triton keeps the original's two."""
    if count is None:
        return REPOSITORY
    copy = WORK / "workers_cpu_repository"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(REPOSITORY, copy)
    config = copy / MODEL / "config.pbtxt"
    text = config.read_text()
    if "count: 2" not in text:
        raise SystemExit(f"{config}: no 'count: 2' to change")
    config.write_text(text.replace("count: 2", f"count: {count}"))
    return copy


def start_flowserve(group: ServerGroup, workers: int, repository: Path, cpu_affinity: str = "none") -> Server:
    http, grpc = free_port(), free_port()
    command = [
        sys.executable, "-m", "flowserve.cli", "serve", "--host", "127.0.0.1", f"--http-port={http}",
        f"--grpc-port={grpc}", f"--metrics-port={free_port()}", "--workers", str(workers),
        "--cpu-affinity", cpu_affinity, "--model-repository", str(repository),
    ]  # fmt: skip
    name = f"flowserve_w{workers}" + ("" if cpu_affinity == "none" else f"_{cpu_affinity}")
    return group.start(name, command, http, grpc, [f"/v2/models/{MODEL}/ready"])


def start_triton(group: ServerGroup) -> Server:
    triton = ensure_triton()
    http, grpc = free_port(), free_port()
    command = triton.command(REPOSITORY.resolve(), http, grpc)
    return group.start("triton", command, http, grpc, [f"/v2/models/{MODEL}/ready"], triton.env())


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    binary = ensure_perf_analyzer()
    settings = Settings()
    records: list[dict[str, Any]] = []
    with sigterm_as_interrupt(), ServerGroup(WORK / "logs") as group:
        print("starting servers ...", flush=True)
        servers = {"triton": start_triton(group)}
        repository = flowserve_repository(args.flowserve_count)
        for workers in (1, 2):
            servers[f"workers={workers}"] = start_flowserve(group, workers, repository)
        servers[SPREAD] = start_flowserve(group, 2, repository, "spread")
        for repeat in range(args.repeats):
            shift = repeat % len(SIDES)
            order = SIDES[shift:] + SIDES[:shift]
            for protocol in args.protocols:
                for side in order:
                    result = measure(binary, servers[side], MODEL, protocol, args.concurrency, settings)
                    result.update(side=side, protocol=protocol, repeat=repeat)
                    records.append(result)
                    print(
                        f"repeat {repeat}  {protocol:4s} {side:16s} {result['infer_per_s']:7.0f} infer/s  "
                        f"p99 {result['p99_us'] / 1000:6.2f} ms  server cores {result['server_cores']:.2f}",
                        flush=True,
                    )
    return records


def _ratio(records: list[dict[str, Any]], top: str, bottom: str) -> dict[str, Any] | None:
    """Per repeat ``top / bottom`` throughput: median and range."""
    by = {(r["side"], r["repeat"]): r["infer_per_s"] for r in records}
    ratios = [
        by[(top, repeat)] / by[(bottom, repeat)]
        for repeat in sorted({r["repeat"] for r in records})
        if by.get((top, repeat)) and by.get((bottom, repeat))
    ]
    if not ratios:
        return None
    spread = [round(min(ratios), 2), round(max(ratios), 2)]
    return {"median": round(statistics.median(ratios), 2), "range": spread}


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for protocol in dict.fromkeys(r["protocol"] for r in records):
        mine = [r for r in records if r["protocol"] == protocol]
        row: dict[str, Any] = {"protocol": protocol}
        for side in SIDES:
            runs = [r for r in mine if r["side"] == side]
            if not runs:
                continue
            row[side] = {
                "infer_per_s": round(statistics.median(r["infer_per_s"] for r in runs)),
                "p99_ms": round(statistics.median(r["p99_us"] for r in runs) / 1000, 2),
                "server_cores": round(statistics.median(r["server_cores"] for r in runs), 2),
            }
        row["w2_vs_triton"] = _ratio(mine, "workers=2", "triton")
        row["w1_vs_triton"] = _ratio(mine, "workers=1", "triton")
        row["w2_vs_w1"] = _ratio(mine, "workers=2", "workers=1")
        row["spread_vs_triton"] = _ratio(mine, SPREAD, "triton")
        row["spread_vs_w2"] = _ratio(mine, SPREAD, "workers=2")
        rows.append(row)
    return rows


def _fmt(ratio: dict[str, Any] | None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio['median']:.2f}x ({ratio['range'][0]:.2f}-{ratio['range'][1]:.2f})"


def render(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'proto':5s} | {'Triton':>7s} | {'w=1':>6s} | {'w=2':>6s} | {'spread':>6s} | {'w=2/Triton':>18s} | "
        f"{'spread/Triton':>18s} | {'w=1/Triton':>18s} | w=2/w=1"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        spread = r.get(SPREAD, {}).get("infer_per_s")
        lines.append(
            f"{r['protocol']:5s} | {r['triton']['infer_per_s']:7d} | {r['workers=1']['infer_per_s']:6d} | "
            f"{r['workers=2']['infer_per_s']:6d} | {'-' if spread is None else spread:>6} | "
            f"{_fmt(r['w2_vs_triton']):>18s} | {_fmt(r.get('spread_vs_triton')):>18s} | "
            f"{_fmt(r['w1_vs_triton']):>18s} | {_fmt(r['w2_vs_w1'])}"
        )
    lines.append("infer/s medians over the repeats; ratios per repeat, median (range); "
                 "spread: --workers 2 --cpu-affinity spread")  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--protocols", nargs="+", choices=["grpc", "http"], default=["grpc", "http"])
    parser.add_argument(
        "--flowserve-count", type=int, default=None, metavar="N",
        help="serve flowserve a copy of the model with count: N, shared over the workers (Triton keeps 2)",
    )  # fmt: skip
    parser.add_argument("--output", type=Path, default=RESULTS / "workers_cpu.json")
    parser.add_argument("--show", type=Path, metavar="JSON", help="print a recorded run's table and exit")
    args = parser.parse_args(argv)
    if args.show is not None:
        print(render(json.loads(args.show.read_text())["summary"]))
        return 0
    started = time.time()
    records = run(args)
    rows = summarize(records)
    print()
    print(render(rows))
    settings = {"repeats": args.repeats, "concurrency": args.concurrency, "model": MODEL,
                "flowserve_count": args.flowserve_count}  # fmt: skip
    benchmark = (
        "CPU-bound Python model: Triton 2.51 vs flowserve --workers 1 and 2 "
        "(and 2 with --cpu-affinity spread), perf_analyzer 2.40"
    )
    write_result(args.output, benchmark, started, settings=settings, summary=rows, runs=records)
    return 0


if __name__ == "__main__":
    run_script(main)
