"""What a second core would give flowserve: one flowserve process against two sharing the HTTP
port, with Triton in the same run, over HTTP (perf_analyzer's HTTP client opens a connection
per concurrent request, which the kernel spreads over the processes; its gRPC client sends
everything over one connection, which one process would get)::

    python benchmarks/processes.py            # ~4 min: add_sub c=32, pipeline c=8, 3 repeats

flowserve runs Python on one event-loop thread, so one process uses at most one core; Triton's
C++ core and its Python stubs use both. This measures how far the missed targets of issue 8 would
move if flowserve used the second core too, and how much of the machine perf_analyzer itself
takes. It is a measurement, not a way to run flowserve: two independent processes do not share
what Triton's protocol treats as one server's (see ``reuseport_serve.py``).

Sides are measured back to back within a repeat, in an order that rotates from one repeat to the
next. Writes ``benchmarks/results/processes.json``.
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

from compare import WORK, run_script, start_servers, write_result
from perf import Settings, measure
from perf_analyzer_setup import ensure_perf_analyzer
from servers import HERE, Server, ServerGroup, free_port, sigterm_as_interrupt
from workloads import build_repositories

RESULTS = HERE / "results"
# (model, concurrency): the pipeline target is set at c=8; add_sub's HTTP target at c=8 and 32,
# and at 8 its 500 us queue delay bounds any server (benchmarks/README.md)
CASES = (("add_sub", 32), ("pipeline", 8))


def start_shared(group: ServerGroup, processes: int) -> Server:
    repos = build_repositories(WORK / "repos")
    http, ready = free_port(), free_port()
    command = [
        sys.executable, str(HERE / "reuseport_serve.py"), "--processes", str(processes),
        "--ready-port", str(ready), "--", "--host", "127.0.0.1", f"--http-port={http}",
        "--grpc-port=-1", "--metrics-port=-1", "--model-repository", str(repos.flowserve.resolve()),
        "--graphs", str(repos.graphs),
    ]  # fmt: skip
    # ready once the launcher listens on its ready port (after every process said it is ready)
    return group.start(f"flowserve_x{processes}", command, http, ready, ready_paths=())


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    binary = ensure_perf_analyzer()
    settings = Settings()
    records: list[dict[str, Any]] = []
    with sigterm_as_interrupt(), ServerGroup(WORK / "logs") as group:
        print("starting servers ...", flush=True)
        sides = {"triton": start_servers(group, {"triton"})["triton"]}
        for n in args.processes:
            sides[f"flowserve x{n}"] = start_shared(group, n)
        names = list(sides)
        for repeat in range(args.repeats):
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            for model, concurrency in CASES:
                for side in order:
                    result = _measure(binary, sides[side], model, concurrency, settings)
                    result.update(side=side, model=model, concurrency=concurrency, repeat=repeat)
                    records.append(result)
                    print(
                        f"repeat {repeat}  {model:9s} c={concurrency:<3d} {side:13s} "
                        f"{result['infer_per_s']:8.0f} infer/s  p99 {result['p99_us'] / 1000:6.2f} ms  "
                        f"cores: server {result['server_cores']:.2f} "
                        f"+ perf_analyzer {result['client_cores']:.2f}",
                        flush=True,
                    )
    return records


def _measure(
    binary: Path, server: Server, model: str, concurrency: int, settings: Settings
) -> dict[str, Any]:
    """One HTTP measurement. perf_analyzer also reads the model's statistics before and after
    each window, from whichever process its connection reaches; two processes count apart, so
    it may not find the counts it expects and give up (\"failed to find the requested model
    version\"): that run is repeated, at most 4 times in all."""
    for attempt in range(4):
        try:
            return measure(binary, server, model, "http", concurrency, settings)
        except RuntimeError as exc:
            if "requested model version" not in str(exc) or attempt == 3:
                raise
            print(f"  (statistics from another process: measuring {model} on {server.name} again)")
    raise AssertionError("unreachable")


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for model, concurrency in CASES:
        mine = [r for r in records if r["model"] == model and r["concurrency"] == concurrency]
        triton = {r["repeat"]: r["infer_per_s"] for r in mine if r["side"] == "triton"}
        for side in dict.fromkeys(r["side"] for r in mine):
            runs = [r for r in mine if r["side"] == side]
            ratios = [r["infer_per_s"] / triton[r["repeat"]] for r in runs if triton.get(r["repeat"])]
            rows.append(
                {
                    "model": model,
                    "concurrency": concurrency,
                    "side": side,
                    "infer_per_s": round(statistics.median(r["infer_per_s"] for r in runs)),
                    "infer_per_s_min": round(min(r["infer_per_s"] for r in runs)),
                    "infer_per_s_max": round(max(r["infer_per_s"] for r in runs)),
                    "p99_ms": round(statistics.median(r["p99_us"] for r in runs) / 1000, 2),
                    "vs_triton": round(statistics.median(ratios), 2) if ratios else None,
                    "server_cores": round(statistics.median(r["server_cores"] for r in runs), 2),
                    "client_cores": round(statistics.median(r["client_cores"] for r in runs), 2),
                    "client_cpu_us_per_infer": round(
                        statistics.median(r["client_cpu_us_per_infer"] for r in runs), 1
                    ),
                }
            )
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'model':9s} {'conc':>4s} {'side':13s} | {'infer/s (range)':>21s} {'p99 ms':>6s} "
        f"{'vs Triton':>9s} | {'server cores':>12s} {'perf_analyzer cores':>19s} {'pa us/inf':>9s}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        rate = f"{r['infer_per_s']} ({r['infer_per_s_min']}-{r['infer_per_s_max']})"
        ratio = f"{r['vs_triton']:.2f}x" if r["vs_triton"] is not None else "-"
        lines.append(
            f"{r['model']:9s} {r['concurrency']:4d} {r['side']:13s} | {rate:>21s} {r['p99_ms']:6.2f} "
            f"{ratio:>9s} | {r['server_cores']:12.2f} {r['client_cores']:19.2f} "
            f"{r['client_cpu_us_per_infer']:9.1f}"
        )
    lines.append("HTTP; medians over the repeats; vs Triton: median of the per-repeat ratios")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2], help="flowserve process counts")
    parser.add_argument("--output", type=Path, default=RESULTS / "processes.json")
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
    benchmark = "1 vs N flowserve processes on one HTTP port, with Triton 2.51, perf_analyzer 2.40"
    write_result(args.output, benchmark, started, summary=rows, runs=records)
    return 0


if __name__ == "__main__":
    run_script(main)
