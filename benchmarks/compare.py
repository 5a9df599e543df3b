"""flowserve vs Triton, side by side, same machine, same run, same load generator (perf_analyzer).

One command sets up everything it needs (perf_analyzer and Triton 2.51 from PyPI wheels into
benchmarks/.work, the model repositories, the MLP's ONNX file), starts four servers on
127.0.0.1 (Triton, flowserve, and the bare HTTP and gRPC handlers), measures every workload over
gRPC and HTTP at each concurrency, and stops every server whatever happens (errors, Ctrl-C)::

    python benchmarks/compare.py            # full run: concurrency 1, 8, 32; 3 repeats (~11 min)
    python benchmarks/compare.py --quick    # concurrency 8 only, 2 repeats (~3 min)
    python benchmarks/compare.py --quick --baseline /tmp/old   # this tree vs another flowserve tree

With ``--baseline TREE`` the reference side of every workload is flowserve itself, run from the
source tree TREE (e.g. ``git worktree add /tmp/old HEAD~3``) on the same models: the ratio is
new / old, measured in one run, which is how a refactoring shows it costs nothing.

Within a repeat, the two sides of each comparison run back to back and their order alternates
from one repeat to the next, so a load change on a shared machine hits both alike. The table
gives per side the median throughput with its range over the repeats, the median p50 and p99
latency, the server's CPU per inference, and the ratio flowserve / reference of the medians
(with the range of the per-repeat ratios). JSON with every run goes to benchmarks/results/.

Workloads and what they compare: see benchmarks/workloads.py and benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from perf import Settings, measure
from perf_analyzer_setup import ensure_perf_analyzer
from servers import Server, ServerGroup, bare_command, flowserve_command, free_port, sigterm_as_interrupt
from triton_setup import ensure_triton
from workloads import WORKLOADS, Workload, build_repositories

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"
RESULTS = HERE / "results"

# side -> models it is measured on (each (side, model) is one run per cell)
Run = tuple[str, str]


def runs_of(workloads: Sequence[Workload], baseline: bool = False) -> list[tuple[Run, Run]]:
    """(reference run, flowserve run) per workload; a run shared by two workloads is measured once.
    ``baseline``: the reference is flowserve from the baseline tree, on the same model."""
    pairs = []
    for w in workloads:
        if baseline:
            reference = ("baseline", w.flowserve_model)
        else:
            reference = ("bare", "add_sub") if w.reference == "bare" else ("triton", w.triton_model)
        pairs.append((reference, ("flowserve", w.flowserve_model)))
    return pairs


def start_servers(group: ServerGroup, sides: set[str], baseline: Path | None = None) -> dict[str, Server]:
    repos = build_repositories(WORK / "repos")
    servers: dict[str, Server] = {}
    if "triton" in sides:
        triton = ensure_triton()
        http, grpc = free_port(), free_port()
        ready = [f"/v2/models/{m}/ready" for m in ("add_sub", "pipeline", "mlp_onnx")]
        servers["triton"] = group.start(
            "triton", triton.command(repos.triton.resolve(), http, grpc), http, grpc, ready, triton.env()
        )
    trees = {"flowserve": HERE.parent, "baseline": baseline}
    for side in ("flowserve", "baseline"):
        tree = trees[side]
        if side not in sides or tree is None:
            continue
        http, grpc = free_port(), free_port()
        command = flowserve_command(repos.flowserve.resolve(), repos.graphs, http, grpc)
        ready = [f"/v2/models/{m}/ready" for m in ("add_sub", "pipeline", "pipeline_graph", "mlp_onnx")]
        env = dict(os.environ)
        env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
        # the tree's own working directory, so an installed flowserve does not shadow it
        servers[side] = group.start(side, command, http, grpc, ready, env, cwd=tree)
    if "bare" in sides:
        http, grpc = free_port(), free_port()
        bare_http = group.start("bare_http", bare_command("http", http), http, -1)
        bare_grpc = group.start("bare_grpc", bare_command("grpc", grpc), -1, grpc, ())
        # one Server per protocol, addressed through a combined view
        servers["bare:http"], servers["bare:grpc"] = bare_http, bare_grpc
    return servers


def server_for(servers: dict[str, Server], side: str, protocol: str) -> Server:
    return servers[f"bare:{protocol}"] if side == "bare" else servers[side]


def run_all(args: argparse.Namespace, binary: Path, servers: dict[str, Server]) -> list[dict[str, Any]]:
    settings = Settings(window_ms=args.window_ms, stability=args.stability, max_trials=args.max_trials)
    workloads = [WORKLOADS[name] for name in args.workloads]
    pairs = runs_of(workloads, args.baseline is not None)
    records: list[dict[str, Any]] = []
    total = args.repeats * len(args.protocols) * len(args.concurrency) * len({r for p in pairs for r in p})
    done = 0
    started = time.monotonic()
    for repeat in range(args.repeats):
        for protocol in args.protocols:
            for concurrency in args.concurrency:
                measured: set[Run] = set()
                for pair in pairs:
                    order = pair if repeat % 2 == 0 else pair[::-1]
                    for side, model in order:
                        if (side, model) in measured:
                            continue
                        measured.add((side, model))
                        server = server_for(servers, side, protocol)
                        result = measure(binary, server, model, protocol, concurrency, settings)
                        result.update(
                            side=side, model=model, protocol=protocol, concurrency=concurrency, repeat=repeat
                        )
                        records.append(result)
                        done += 1
                        print(
                            f"[{done:3d}/{total}] {time.monotonic() - started:6.0f}s  repeat {repeat}  "
                            f"{protocol:4s} c={concurrency:<3d} {side:9s} {model:15s} "
                            f"{result['infer_per_s']:8.0f} infer/s  p50 {result['p50_us'] / 1000:6.2f} ms  "
                            f"p99 {result['p99_us'] / 1000:6.2f} ms  "
                            f"cpu {result['server_cpu_us_per_infer']} us/inf"
                            + ("" if result["settled"] else "  (unsettled)"),
                            flush=True,
                        )
    return records


def _stats(records: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r["infer_per_s"] for r in records]
    cpu = [r["server_cpu_us_per_infer"] for r in records if r["server_cpu_us_per_infer"] is not None]
    # records from before perf_analyzer's own CPU was noted have no client_cores
    client = [r["client_cores"] for r in records if r.get("client_cores") is not None]
    return {
        "runs": len(records),
        "infer_per_s": round(statistics.median(rates), 1),
        "infer_per_s_min": round(min(rates), 1),
        "infer_per_s_max": round(max(rates), 1),
        "p50_ms": round(statistics.median(r["p50_us"] for r in records) / 1000, 3),
        "p99_ms": round(statistics.median(r["p99_us"] for r in records) / 1000, 3),
        "server_cpu_us_per_infer": round(statistics.median(cpu), 1) if cpu else None,
        "server_cores": round(statistics.median(r["server_cores"] for r in records), 2),
        "client_cores": round(statistics.median(client), 2) if client else None,
    }


def summarize(args: argparse.Namespace, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for name in args.workloads:
        workload = WORKLOADS[name]
        (ref_side, ref_model), (fs_side, fs_model) = runs_of([workload], args.baseline is not None)[0]
        for protocol in args.protocols:
            for concurrency in args.concurrency:

                def pick(
                    side: str, model: str, c: int = concurrency, p: str = protocol
                ) -> list[dict[str, Any]]:
                    return [
                        r
                        for r in records
                        if r["side"] == side
                        and r["model"] == model
                        and r["concurrency"] == c
                        and r["protocol"] == p
                    ]

                ref, fs = pick(ref_side, ref_model), pick(fs_side, fs_model)
                if not ref or not fs:
                    continue
                ref_stats, fs_stats = _stats(ref), _stats(fs)
                paired = {r["repeat"]: r["infer_per_s"] for r in ref}
                ratios = [r["infer_per_s"] / paired[r["repeat"]] for r in fs if paired.get(r["repeat"])]
                rows.append(
                    {
                        "workload": name,
                        "reference": ref_side,
                        "protocol": protocol,
                        "concurrency": concurrency,
                        "reference_stats": ref_stats,
                        "flowserve_stats": fs_stats,
                        "ratio": round(fs_stats["infer_per_s"] / ref_stats["infer_per_s"], 2),
                        "ratio_min": round(min(ratios), 2) if ratios else None,
                        "ratio_max": round(max(ratios), 2) if ratios else None,
                        "p99_ratio": round(fs_stats["p99_ms"] / ref_stats["p99_ms"], 2)
                        if ref_stats["p99_ms"]
                        else None,
                    }
                )
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'workload':15s} {'vs':6s} {'proto':5s} {'conc':>4s} | "
        f"{'reference infer/s (range)':>27s} {'p50':>6s} {'p99':>6s} {'cpu/inf':>7s} | "
        f"{'flowserve infer/s (range)':>27s} {'p50':>6s} {'p99':>6s} {'cpu/inf':>7s} | {'ratio (range)':>17s}"
    )
    lines = [head, "-" * len(head)]
    for row in rows:
        cells = []
        for key in ("reference_stats", "flowserve_stats"):
            s = row[key]
            rate = f"{s['infer_per_s']:.0f} ({s['infer_per_s_min']:.0f}-{s['infer_per_s_max']:.0f})"
            cpu = f"{s['server_cpu_us_per_infer']:.0f}us" if s["server_cpu_us_per_infer"] else "-"
            cells.append(f"{rate:>27s} {s['p50_ms']:6.2f} {s['p99_ms']:6.2f} {cpu:>7s}")
        spread = f"({row['ratio_min']:.2f}-{row['ratio_max']:.2f})" if row["ratio_min"] is not None else ""
        lines.append(
            f"{row['workload']:15s} {row['reference']:6s} {row['protocol']:5s} {row['concurrency']:4d} | "
            f"{cells[0]} | {cells[1]} | {row['ratio']:5.2f}x {spread:>11s}"
        )
    lines.append("latencies in ms (medians); cpu/inf: server CPU time per inference (all its processes)")
    sides = ("reference_stats", "flowserve_stats")
    if all(row[side].get("client_cores") is not None for row in rows for side in sides):
        lines += ["", "cores in use (medians): server + perf_analyzer = both"]
        for row in rows:
            cells = [_cores(row[side]) for side in sides]
            lines.append(
                f"{row['workload']:15s} {row['reference']:6s} {row['protocol']:5s} {row['concurrency']:4d} | "
                f"{cells[0]:>27s} | {cells[1]:>27s}"
            )
    return "\n".join(lines)


def _cores(stats: dict[str, Any]) -> str:
    server, client = stats["server_cores"], stats["client_cores"]
    return f"{server:4.2f} + {client:4.2f} = {server + client:4.2f}"


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="concurrency 8 only, 2 repeats (~3 min)")
    parser.add_argument("--repeats", type=int, help="runs of every measurement (default 3; quick: 2)")
    parser.add_argument("--concurrency", type=int, nargs="+", help="default 1 8 32 (quick: 8)")
    parser.add_argument("--protocols", nargs="+", choices=["grpc", "http"], default=["grpc", "http"])
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--window-ms", type=int, default=1000, help="perf_analyzer measurement window")
    parser.add_argument("--stability", type=int, default=30, help="perf_analyzer -s (percent)")
    parser.add_argument("--max-trials", type=int, default=4, help="perf_analyzer -r")
    parser.add_argument(
        "--output", type=Path, help="JSON file (default benchmarks/results/compare[-quick].json)"
    )
    parser.add_argument(
        "--show", type=Path, metavar="JSON", help="print the table of a recorded run and exit"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="TREE",
        help="compare against flowserve from this source tree instead of Triton (ratio: this tree / TREE)",
    )
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (2 if args.quick else 3)
    args.concurrency = args.concurrency or ([8] if args.quick else [1, 8, 32])
    name = "compare-baseline" if args.baseline is not None else "compare"
    args.output = args.output or RESULTS / (f"{name}-quick.json" if args.quick else f"{name}.json")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.show is not None:
        recorded = json.loads(args.show.read_text())
        print(render(recorded["summary"]))
        return 0
    binary = ensure_perf_analyzer()
    workloads = [WORKLOADS[n] for n in args.workloads]
    sides = {side for pair in runs_of(workloads, args.baseline is not None) for side, _ in pair}
    started = time.time()
    with sigterm_as_interrupt(), ServerGroup(WORK / "logs") as group:
        print("starting servers ...", flush=True)
        servers = start_servers(group, sides, args.baseline)
        records = run_all(args, binary, servers)
    rows = summarize(args, records)
    print()
    print(render(rows))
    benchmark = "flowserve vs Triton 2.51 (nvidia-pytriton), perf_analyzer 2.40, same machine and run"
    if args.baseline is not None:
        benchmark = f"flowserve vs flowserve from {args.baseline}, perf_analyzer 2.40, same machine and run"
    settings = {
        "repeats": args.repeats,
        "concurrency": args.concurrency,
        "protocols": args.protocols,
        "window_ms": args.window_ms,
        "stability_percent": args.stability,
        "max_trials": args.max_trials,
    }
    workloads_run = {n: WORKLOADS[n].description for n in args.workloads}
    write_result(
        args.output,
        benchmark,
        started,
        settings=settings,
        workloads=workloads_run,
        summary=rows,
        runs=records,
    )
    return 0


def write_result(path: Path, benchmark: str, started: float, **parts: Any) -> None:
    """A run's JSON: what it measured, on what machine, when, how long it took, then ``parts``."""
    result = {
        "benchmark": benchmark,
        "machine": machine(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": round(time.time() - started),
        **parts,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {path} ({result['duration_s']} s)")


def run_script(main: Callable[[], int]) -> NoReturn:
    """Exit with ``main()``'s status; Ctrl-C or SIGTERM (see sigterm_as_interrupt) exits 130."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted: every server was stopped", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    run_script(main)
