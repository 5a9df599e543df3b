"""Does ``flowserve analyze`` pay off? (issue 32 item 5) On the benchmark pipeline with a CPU-bound
step (``analyze_pipeline/graphs/embed.yaml``), the configuration analyze picks against the
shipped one, measured side by side by ``flowserve bench`` and perf_analyzer in one run.

    python benchmarks/analyze_pipeline.py                       # ~10 min: analyze 4 min, then 3 repeats
    python benchmarks/analyze_pipeline.py --budget-minutes 5 --p99-ms 50

1. The pipeline is copied to ``.work/analyze_pipeline``; ``flowserve analyze`` runs on the copy
   with ``--write`` (so the chosen YAML lands beside the copy, ``embed.yaml.analyzed``).
2. Two servers: the shipped graph (``--workers 1``) and the chosen one (its ``--workers``).
3. At each concurrency (default 8 and 16), per repeat, in a rotating order: perf_analyzer over
   gRPC on each server, then ``flowserve bench`` over gRPC (2 client processes) on each. Ratios
   are chosen / shipped per repeat and tool; medians with their range are reported, with both
   sides' p99. Writes ``benchmarks/results/analyze_pipeline.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from analyze_loadgen import run_bench
from compare import WORK, write_result
from perf import Settings, measure
from perf_analyzer_setup import ensure_perf_analyzer
from servers import HERE, ROOT, Server, ServerGroup, free_port, sigterm_as_interrupt

RESULTS = HERE / "results"
SOURCE = HERE / "analyze_pipeline"
GRAPH = "embed"


def run_analyze(copy: Path, args: argparse.Namespace) -> dict[str, Any]:
    page = WORK / "analyze-embed.html"
    command = [
        sys.executable, "-m", "flowserve.cli", "analyze", str(copy / "graphs" / "embed.yaml"),
        "--p99-ms", str(args.p99_ms), "--budget-minutes", str(args.budget_minutes), "--write",
        "--html", str(page), "--max-workers", "2", "--seconds", str(args.analyze_seconds),
    ]  # fmt: skip
    print("$ flowserve analyze ...", flush=True)
    done = subprocess.run(
        command, cwd=ROOT, text=True, capture_output=True, timeout=args.budget_minutes * 60 + 600
    )
    print(done.stdout, flush=True)
    if done.returncode != 0:
        raise RuntimeError(f"flowserve analyze failed: {done.stderr[-2000:]}")
    report: dict[str, Any] = json.loads(page.with_suffix(".json").read_text())
    return report


def start(group: ServerGroup, name: str, graphs: Path, workers: int, copy: Path) -> Server:
    http, grpc = free_port(), free_port()
    empty = WORK / "empty_repository"
    empty.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "flowserve.cli", "serve", "--host", "127.0.0.1", f"--http-port={http}",
        f"--grpc-port={grpc}", "--metrics-port=-1", "--workers", str(workers),
        "--model-repository", str(empty), "--graphs", str(graphs),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(copy))
    return group.start(name, command, http, grpc, [f"/v2/models/{GRAPH}/ready"], env)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--p99-ms", type=float, default=50.0)
    parser.add_argument("--budget-minutes", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--seconds", type=float, default=4.0, help="flowserve bench: seconds per measurement")
    parser.add_argument("--analyze-seconds", type=float, default=3.0, help="analyze: seconds per load level")
    args = parser.parse_args()
    binary = ensure_perf_analyzer()
    started = time.time()
    copy = WORK / "analyze_pipeline"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(SOURCE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    report = run_analyze(copy, args)
    chosen = report["trials"][report["chosen"]] if report["chosen"] is not None else None
    if chosen is None:
        raise SystemExit("analyze met the target with no configuration: nothing to compare")
    for side in ("shipped", "chosen"):
        (copy / side).mkdir(exist_ok=True)
    shutil.copy(copy / "graphs" / "embed.yaml", copy / "shipped" / "embed.yaml")
    shutil.copy(copy / "graphs" / "embed.yaml.analyzed", copy / "chosen" / "embed.yaml")
    records: list[dict[str, Any]] = []
    with sigterm_as_interrupt(), ServerGroup(WORK / "logs") as group:
        servers = {
            "shipped": start(group, "analyze_shipped", copy / "shipped", 1, copy),
            "chosen": start(group, "analyze_chosen", copy / "chosen", int(chosen["workers"]), copy),
        }
        for repeat in range(args.repeats):
            for concurrency in args.concurrency:
                for tool in ("perf_analyzer", "bench"):
                    order = ("shipped", "chosen") if repeat % 2 == 0 else ("chosen", "shipped")
                    for side in order:
                        server = servers[side]
                        if tool == "perf_analyzer":
                            result = measure(binary, server, GRAPH, "grpc", concurrency, Settings())
                            rate, p99 = result["infer_per_s"], result["p99_us"] / 1000
                        else:
                            result = run_bench(server, "grpc", concurrency, 2, args.seconds, GRAPH)
                            rate, p99 = result["throughput"], result["p99_ms"]
                        record = {"repeat": repeat, "concurrency": concurrency, "tool": tool, "side": side}
                        records.append({**record, "infer_per_s": rate, "p99_ms": p99})
                        what = f"repeat {repeat} c={concurrency:<3d} {tool:13s} {side:8s}"
                        print(f"{what} {rate:8.0f} infer/s  p99 {p99:7.2f} ms", flush=True)
    summary = []
    for concurrency in args.concurrency:
        for tool in ("perf_analyzer", "bench"):
            rows = [r for r in records if r["concurrency"] == concurrency and r["tool"] == tool]

            def of(side: str, key: str, rows: list[dict[str, Any]] = rows) -> float:
                return float(statistics.median(r[key] for r in rows if r["side"] == side))

            ratios = []
            for repeat in range(args.repeats):
                by = {r["side"]: r["infer_per_s"] for r in rows if r["repeat"] == repeat}
                ratios.append(by["chosen"] / by["shipped"] if by.get("shipped") else 0.0)
            line = {
                "concurrency": concurrency,
                "tool": tool,
                "shipped": round(of("shipped", "infer_per_s")),
                "chosen": round(of("chosen", "infer_per_s")),
                "shipped_p99_ms": round(of("shipped", "p99_ms"), 2),
                "chosen_p99_ms": round(of("chosen", "p99_ms"), 2),
                "ratio": round(statistics.median(ratios), 2),
                "range": [round(min(ratios), 2), round(max(ratios), 2)],
            }
            summary.append(line)
            shipped = f"shipped {line['shipped']:6d}/s p99 {line['shipped_p99_ms']:6.2f}"
            mine = f"chosen {line['chosen']:6d}/s p99 {line['chosen_p99_ms']:6.2f}"
            low, high = line["range"]
            print(
                f"c={concurrency:<3d} {tool:13s} {shipped} | {mine} | "
                f"{line['ratio']:.2f}x ({low:.2f}-{high:.2f})"
            )
    write_result(
        RESULTS / "analyze_pipeline.json", "analyze_pipeline", started, p99_ms=args.p99_ms,
        budget_minutes=args.budget_minutes, chosen=chosen["configuration"], reason=report["reason"],
        analyze_trials=len(report["trials"]), summary=summary, runs=records,
    )  # fmt: skip


if __name__ == "__main__":
    main()
