"""``flowserve bench`` against perf_analyzer on the same server, in the same run (issue 32 item 1):
does the built-in load generator measure the server, not itself?

    python benchmarks/analyze_loadgen.py                # ~3 min: HTTP and gRPC, c=8, 3 repeats
    python benchmarks/analyze_loadgen.py --repeats 5 --protocols grpc

One flowserve server serves the bundled ``simple`` model; within a repeat perf_analyzer 2.40
(``benchmarks/perf.py``: 1 s windows, stability check off after the first try) and
``flowserve bench`` with 1 and 2 client processes each measure concurrency 8, back to back in an
order that rotates between repeats. Ratios are per repeat (bench / perf_analyzer), reported as
the median with their range. Writes ``benchmarks/results/analyze_loadgen.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from compare import WORK, write_result
from perf import Settings, measure
from perf_analyzer_setup import ensure_perf_analyzer
from servers import HERE, ROOT, Server, ServerGroup, flowserve_command, free_port, sigterm_as_interrupt

RESULTS = HERE / "results"
MODEL = "simple"


def run_bench(
    server: Server, protocol: str, concurrency: int, processes: int, seconds: float, model: str = MODEL
) -> dict[str, Any]:
    command = [
        sys.executable, "-m", "flowserve.cli", "bench", model, "-i", protocol, "-u", server.url(protocol),
        "-c", str(concurrency), "-d", str(seconds), "--warmup", "1", "-p", str(processes), "--json", "-q",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"flowserve bench failed: {done.stderr.strip()[-500:]}")
    result: dict[str, Any] = json.loads(done.stdout)[0]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--protocols", nargs="+", default=["http", "grpc"])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=4.0, help="flowserve bench: seconds per measurement")
    args = parser.parse_args()
    binary = ensure_perf_analyzer()
    started = time.time()
    sides = ("perf_analyzer", "bench p=1", "bench p=2")
    records: list[dict[str, Any]] = []
    with sigterm_as_interrupt(), ServerGroup(WORK / "logs") as group:
        http, grpc = free_port(), free_port()
        command = flowserve_command(ROOT / "model_repository", ROOT / "graphs", http, grpc)
        server = group.start("flowserve_loadgen", command, http, grpc, [f"/v2/models/{MODEL}/ready"])
        for repeat in range(args.repeats):
            order = sides[repeat % 3 :] + sides[: repeat % 3]
            for protocol in args.protocols:
                for side in order:
                    if side == "perf_analyzer":
                        result = measure(binary, server, MODEL, protocol, args.concurrency, Settings())
                        rate, p99 = result["infer_per_s"], result["p99_us"] / 1000
                    else:
                        result = run_bench(server, protocol, args.concurrency, int(side[-1]), args.seconds)
                        rate, p99 = result["throughput"], result["p99_ms"]
                    records.append({"repeat": repeat, "protocol": protocol, "side": side, "infer_per_s": rate,
                                     "p99_ms": p99, "raw": result})  # fmt: skip
                    print(
                        f"repeat {repeat} {protocol:4s} {side:14s} {rate:8.0f} infer/s  p99 {p99:6.2f} ms",
                        flush=True,
                    )
    summary = []
    for protocol in args.protocols:
        for side in sides[1:]:
            ratios = []
            for repeat in range(args.repeats):
                by = {
                    r["side"]: r["infer_per_s"]
                    for r in records
                    if r["repeat"] == repeat and r["protocol"] == protocol
                }
                ratios.append(by[side] / by["perf_analyzer"] if by["perf_analyzer"] else 0.0)
            pa = statistics.median(
                r["infer_per_s"] for r in records if r["protocol"] == protocol and r["side"] == sides[0]
            )
            own = statistics.median(
                r["infer_per_s"] for r in records if r["protocol"] == protocol and r["side"] == side
            )
            line = {
                "protocol": protocol,
                "side": side,
                "perf_analyzer": round(pa),
                "bench": round(own),
                "ratio": round(statistics.median(ratios), 2),
                "range": [round(min(ratios), 2), round(max(ratios), 2)],
            }
            summary.append(line)
            low, high = line["range"]
            print(
                f"{protocol:4s} {side:10s} perf_analyzer {pa:7.0f}  bench {own:7.0f}  "
                f"ratio {line['ratio']:.2f}x ({low:.2f}-{high:.2f})"
            )
    path = RESULTS / "analyze_loadgen.json"
    write_result(
        path, "analyze_loadgen", started, concurrency=args.concurrency, summary=summary, runs=records
    )


if __name__ == "__main__":
    main()
