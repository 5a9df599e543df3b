"""Large tensors: flowserve vs Triton 2.51 on the same identity ``model.py``, tensor sizes
1 KiB .. 64 MiB, over HTTP (binary tensors), gRPC and system shared memory, side by side in one
run.

Both servers serve one directory: ``identity`` (Python backend, FP32 ``[-1]`` in, the same
tensor out; Triton runs it in its stub process, flowserve in-process). perf_analyzer sends one
request at a time (concurrency 1, ``--shape INPUT0:N``); for every (size, transport) the two
servers run back to back, their order alternating between repeats so a change of load on the
shared machine hits both. ``shm`` is perf_analyzer's ``--shared-memory system`` over gRPC:
the tensors never cross the socket, only the request and the region names do.

Reported per (size, transport): each side's median requests per second, latency p50, the
payload moved per second (input and output: ``2 * size * rate``), and flowserve / Triton
(above 1: flowserve is faster) with the range over repeats. Where both gRPC and HTTP ran, a
second table sets them side by side per size and server: latency p50, the server's CPU per
request and perf_analyzer's, so a gap between the protocols can be told the server's or the
client's.

``--client lean`` sends the same requests with ``lean_client.py``'s clients instead, which copy
the payload in user space on neither protocol (perf_analyzer's gRPC client copies it three
times, its HTTP client about once each way): with both clients costing the same, a gap between
gRPC and HTTP is the server's. HTTP and gRPC only (shm needs perf_analyzer); each measurement
lasts ``--window-ms``.

    python benchmarks/large_tensors.py                     # 1 KiB .. 64 MiB, 2 repeats, ~10 min
    python benchmarks/large_tensors.py --sizes 16M --transports grpc http --repeats 3
    python benchmarks/large_tensors.py --no-triton         # flowserve alone (no reference)
    python benchmarks/large_tensors.py --baseline /tmp/old # also flowserve from another tree
    python benchmarks/large_tensors.py --sizes 16M --transports grpc http --client lean

Writes benchmarks/results/large_tensors.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import lean_client  # noqa: E402
from compare import run_script, write_result  # noqa: E402
from perf import Settings, measure  # noqa: E402
from perf_analyzer_setup import ensure_perf_analyzer  # noqa: E402
from servers import Server, ServerGroup, flowserve_command, free_port, sigterm_as_interrupt  # noqa: E402
from triton_setup import ensure_triton  # noqa: E402

WORK = HERE / ".work"
RESULTS = HERE / "results"
MODEL = "identity"
SIZES = {"1K": 1024, "64K": 64 * 1024, "1M": 1024**2, "16M": 16 * 1024**2, "64M": 64 * 1024**2}
TRANSPORTS = ("http", "grpc", "shm")

CONFIG = """name: "identity"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

MODEL_PY = '''import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0, the same tensor (no copy the model could avoid)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            out = pb_utils.Tensor("OUTPUT0", tensor.as_numpy())
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
'''


def build_repository(root: Path) -> Path:
    """The model repository both servers serve."""
    model = root / MODEL
    (model / "1").mkdir(parents=True, exist_ok=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / "model.py").write_text(MODEL_PY)
    (root.parent / "empty_graphs").mkdir(exist_ok=True)
    return root


def start(
    group: ServerGroup, repository: Path, with_triton: bool, baseline: Path | None = None
) -> dict[str, Server]:
    servers: dict[str, Server] = {}
    ready = [f"/v2/models/{MODEL}/ready"]
    if with_triton:
        triton = ensure_triton()
        http, grpc = free_port(), free_port()
        command = triton.command(repository.resolve(), http, grpc)
        servers["triton"] = group.start("triton", command, http, grpc, ready, triton.env())
    http, grpc = free_port(), free_port()
    command = flowserve_command(repository.resolve(), repository.parent / "empty_graphs", http, grpc)
    servers["flowserve"] = group.start("flowserve", command, http, grpc, ready)
    if baseline is not None:  # flowserve from another source tree, in its own directory
        http, grpc = free_port(), free_port()
        command = flowserve_command(repository.resolve(), repository.parent / "empty_graphs", http, grpc)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(baseline) + os.pathsep + env.get("PYTHONPATH", "")
        servers["baseline"] = group.start("baseline", command, http, grpc, ready, env, cwd=baseline)
    return servers


def extra_args(size: int, transport: str) -> list[str]:
    """perf_analyzer's arguments for one tensor of ``size`` bytes over ``transport``."""
    args = ["--shape", f"INPUT0:{size // 4}"]
    if transport == "shm":
        args += ["--shared-memory", "system", "--output-shared-memory-size", str(size)]
    return args


def run(args: argparse.Namespace, binary: Path | None, servers: dict[str, Server]) -> list[dict[str, Any]]:
    settings = Settings(window_ms=args.window_ms, stability=50, max_trials=4, timeout_s=600.0)
    sides = [side for side in ("triton", "baseline", "flowserve") if side in servers]
    records: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for label in args.sizes:
            size = SIZES[label]
            for transport in args.transports:
                protocol = "http" if transport == "http" else "grpc"
                order = sides if repeat % 2 == 0 else sides[::-1]
                for side in order:
                    server = servers[side]
                    if binary is None:  # --client lean
                        port = server.http_port if protocol == "http" else server.grpc_port
                        window = args.window_ms / 1000
                        result = lean_client.measure(
                            "127.0.0.1", port, protocol, MODEL, size, window, server.pid
                        )
                    else:
                        result = measure(
                            binary, server, MODEL, protocol, 1, settings, extra_args(size, transport)
                        )
                    record = {"repeat": repeat, "size": label, "bytes": size, "transport": transport}
                    records.append({**record, "side": side, **result})
                    rate = result["infer_per_s"]
                    print(
                        f"  {label:>4} {transport:<4} {side:<9} {rate:9.1f} req/s "
                        f"{2 * size * rate / 1e6:9.1f} MB/s  p50 {result['p50_us'] / 1000:8.2f} ms",
                        flush=True,
                    )
    return records


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    keys = sorted({(r["bytes"], r["size"], r["transport"]) for r in records})
    for size, label, transport in keys:
        mine = [r for r in records if (r["bytes"], r["transport"]) == (size, transport)]
        row: dict[str, Any] = {"size": label, "bytes": size, "transport": transport}
        for side in ("triton", "baseline", "flowserve"):
            runs = [r for r in mine if r["side"] == side]
            if not runs:
                continue
            rate = statistics.median(r["infer_per_s"] for r in runs)
            row[side] = {
                "req_per_s": round(rate, 1),
                "MB_per_s": round(2 * size * rate / 1e6, 1),
                "p50_ms": round(statistics.median(r["p50_us"] for r in runs) / 1000, 3),
                # CPU per request: the server's (all its processes) and perf_analyzer's
                "server_cpu_ms": _median_ms(runs, "server_cpu_us_per_infer"),
                "client_cpu_ms": _median_ms(runs, "client_cpu_us_per_infer"),
            }
        if "triton" in row and "flowserve" in row:
            ratios = [
                f["infer_per_s"] / t["infer_per_s"]
                for f in mine
                if f["side"] == "flowserve"
                for t in mine
                if t["side"] == "triton" and t["repeat"] == f["repeat"]
            ]
            row["ratio"] = round(row["flowserve"]["req_per_s"] / row["triton"]["req_per_s"], 2)
            row["ratio_range"] = [round(min(ratios), 2), round(max(ratios), 2)]
        if "baseline" in row and "flowserve" in row:  # this tree / the baseline tree
            row["vs_baseline"] = round(row["flowserve"]["req_per_s"] / row["baseline"]["req_per_s"], 2)
        rows.append(row)
    return rows


def _median_ms(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return round(statistics.median(values) / 1000, 3) if values else None


def protocols(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per size and side: gRPC against HTTP (above 1: gRPC costs more) in latency p50, the
    server's CPU per request and the client's, so a gap can be told the server's or the
    client's (perf_analyzer's gRPC client costs more CPU per large request than its HTTP one)."""
    out = []
    for label in dict.fromkeys(row["size"] for row in rows):
        by = {row["transport"]: row for row in rows if row["size"] == label}
        if "grpc" not in by or "http" not in by:
            continue
        for side in ("triton", "baseline", "flowserve"):
            grpc, http = by["grpc"].get(side), by["http"].get(side)
            if not grpc or not http:
                continue
            entry: dict[str, Any] = {"size": label, "side": side}
            for key in ("p50_ms", "server_cpu_ms", "client_cpu_ms"):
                if grpc.get(key) and http.get(key):
                    entry[key] = [grpc[key], http[key], round(grpc[key] / http[key], 2)]
            out.append(entry)
    return out


def render_protocols(entries: list[dict[str, Any]]) -> str:
    head = f"{'size':>5} {'side':<9} {'p50 ms gRPC/HTTP':>24} {'server CPU ms':>24} {'client CPU ms':>24}"
    lines = [head, "-" * len(head)]
    for e in entries:
        cells = [
            f"{e[k][0]:.2f}/{e[k][1]:.2f} ({e[k][2]:.2f}x)" if k in e else "-"
            for k in ("p50_ms", "server_cpu_ms", "client_cpu_ms")
        ]
        lines.append(f"{e['size']:>5} {e['side']:<9} {cells[0]:>24} {cells[1]:>24} {cells[2]:>24}")
    return "\n".join(lines)


def render(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'size':>5} {'via':<5} {'Triton MB/s':>12} {'baseline MB/s':>14} {'flowserve MB/s':>15} "
        f"{'ratio':>6}  {'range':<10} {'vs baseline':>11}"
    )
    lines = [head, "-" * len(head)]
    for row in rows:
        triton = row.get("triton", {}).get("MB_per_s", "-")
        mine = row.get("flowserve", {}).get("MB_per_s", "-")
        ratio = row.get("ratio", "-")
        span = "-".join(str(x) for x in row.get("ratio_range", [])) or "-"
        base = row.get("baseline", {}).get("MB_per_s", "-")
        versus = row.get("vs_baseline", "-")
        lines.append(
            f"{row['size']:>5} {row['transport']:<5} {triton:>12} {base:>14} {mine:>15} {ratio:>6}  "
            f"{span:<10} {versus:>11}"
        )
    return "\n".join(lines)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument(
        "--transports", nargs="+", choices=TRANSPORTS, help="default: all (--client lean: http grpc)"
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument("--no-triton", action="store_true", help="measure flowserve alone")
    parser.add_argument("--baseline", type=Path, help="also flowserve from this source tree (before/after)")
    parser.add_argument(
        "--client",
        choices=("perf_analyzer", "lean"),
        default="perf_analyzer",
        help="lean: lean_client.py's clients, which copy nothing on either protocol (no shm)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "large_tensors.json")
    args = parser.parse_args(argv)
    if args.transports is None:
        args.transports = list(TRANSPORTS) if args.client == "perf_analyzer" else ["http", "grpc"]
    if args.client == "lean" and "shm" in args.transports:
        parser.error("--client lean measures http and grpc; shm needs perf_analyzer")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    binary = ensure_perf_analyzer() if args.client == "perf_analyzer" else None
    repository = build_repository(WORK / "large_tensors" / "repo")
    started = time.time()
    with sigterm_as_interrupt(), ServerGroup(WORK / "logs") as group:
        print("starting servers ...", flush=True)
        servers = start(group, repository, not args.no_triton, args.baseline)
        records = run(args, binary, servers)
    rows = summarize(records)
    versus = protocols(rows)
    print()
    print(render(rows))
    if versus:
        print()
        print(render_protocols(versus))
    write_result(
        args.output,
        f"large tensors: flowserve vs Triton 2.51, identity model.py, {args.client} c=1, same run",
        started,
        settings={
            "sizes": args.sizes,
            "transports": args.transports,
            "repeats": args.repeats,
            "window_ms": args.window_ms,
            "client": args.client,
            "baseline": str(args.baseline or ""),
        },
        summary=rows,
        grpc_vs_http=versus,
        runs=records,
    )
    return 0


if __name__ == "__main__":
    run_script(main)
