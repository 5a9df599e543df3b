"""The cost of one hop between worker processes: a call over ``flowserve.cluster.link`` to an
echo handler in a second process, closed loop, uvloop on both sides.

Payloads: a small dict with no tensor, and ``{"x": array}`` with a float32 array of 16
elements, 64 KiB, 1 MiB, 16 MiB and 64 MiB (the array goes there and back, as an out-of-band
buffer each way). For each payload and each concurrency (1 and 8 calls in flight on one link),
after a warm-up, calls run for ``--duration`` seconds (at least ``--min-calls``); the table
gives the median and p99 round trip per call, calls/s, and MB/s of payload carried one way
(each round trip carries it twice), plus the CPU both processes spent per call.

    python benchmarks/ipc_hop.py                     # about 30 s
    python benchmarks/ipc_hop.py --reader stream     # the link on plain asyncio streams
    python benchmarks/ipc_hop.py --transport socket  # large buffers through the socket too
    python benchmarks/ipc_hop.py --json out.json

``--reader buffered`` (the default, what ``Link.connect``/``serve`` use) receives a buffer
straight from the socket into the bytearray the array ends up in; ``--reader stream`` builds
the links on ``asyncio.open_unix_connection``, where each buffer passes through the stream's
own buffer first. ``--transport shared`` (the default) sends buffers of 256 KiB and more
through shared memory (``flowserve/cluster/arena.py``), ``--transport socket`` through the
socket like the small ones. Not a unit test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import uvloop

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from flowserve.cluster.link import Link, serve  # noqa: E402

PAYLOADS: dict[str, int | None] = {  # name -> bytes of the float32 array (None: no tensor)
    "no tensor": None,
    "16 float32": 64,
    "64 KiB": 64 << 10,
    "256 KiB": 256 << 10,
    "image 3x224x224": 3 * 224 * 224 * 4,
    "1 MiB": 1 << 20,
    "16 MiB": 16 << 20,
    "64 MiB": 64 << 20,
}


async def echo(kind: str, message: Any) -> Any:
    return message


async def peer(path: str, reader: str, shared: bool) -> None:
    """The other process: an echo handler on every link accepted at ``path``."""
    links: list[Link] = []
    if reader == "stream":

        async def accepted(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            links.append(Link(r, w, echo, "client"))

        server = await asyncio.start_unix_server(accepted, path)
    else:
        server = await serve(path, echo, links.append, name="client", shared=shared)
    print("ready", flush=True)
    async with server:
        await asyncio.get_running_loop().create_future()  # until killed


async def connect(path: str, reader: str, shared: bool) -> Link:
    if reader == "stream":
        r, w = await asyncio.open_unix_connection(path)
        return Link(r, w, None, "echo peer")
    return await Link.connect(path, None, "echo peer", shared=shared)


def message(size: int | None) -> Any:
    if size is None:
        return {"model": "add_sub", "version": "1", "id": 42, "parameters": {"priority": 0}}
    return {"x": np.ones(size // 4, dtype=np.float32)}


async def measure(link: Link, size: int | None, concurrency: int, args: argparse.Namespace) -> dict[str, Any]:
    payload = message(size)
    warm = time.perf_counter() + args.warmup
    for i in range(1_000_000):
        if i >= 3 and time.perf_counter() > warm:
            break
        await link.call("echo", payload)
    latencies: list[float] = []
    stop = time.perf_counter() + args.duration
    minimum = -(-args.min_calls // concurrency)

    async def client() -> None:
        done = 0
        while done < minimum or time.perf_counter() < stop:
            t0 = time.perf_counter()
            await link.call("echo", payload)
            latencies.append(time.perf_counter() - t0)
            done += 1

    cpu0 = os.times()
    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    cpu1 = os.times()
    # this process and the peer (a child: its time counts once it exits, so read /proc instead)
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    calls = len(latencies)
    latencies.sort()
    return {
        "calls": calls,
        "median_us": round(1e6 * statistics.median(latencies), 1),
        "p99_us": round(1e6 * latencies[min(calls - 1, int(calls * 0.99))], 1),
        "calls_per_s": round(calls / wall, 1),
        "mb_per_s": round((size or 0) * calls / wall / 1e6, 1),
        "client_cpu_us_per_call": round(1e6 * cpu / calls, 1),
    }


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a running process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def main(args: argparse.Namespace) -> dict[str, Any]:
    directory = tempfile.mkdtemp(prefix="hop", dir="/tmp")
    path = str(Path(directory) / "s")
    process = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--peer", path, "--reader", args.reader, "--transport", args.transport,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    rows: list[dict[str, Any]] = []
    try:
        assert process.stdout is not None
        assert (await asyncio.wait_for(process.stdout.readline(), 30)).strip() == b"ready"
        link = await connect(path, args.reader, args.transport == "shared")
        print(
            f"{'payload':>10s} {'c':>2s} {'median us':>10s} {'p99 us':>9s} {'calls/s':>9s} "
            f"{'MB/s':>8s} {'CPU us/call':>12s}",
            flush=True,
        )
        for name, size in PAYLOADS.items():
            for concurrency in args.concurrency:
                peer0 = proc_cpu(process.pid)
                row = await measure(link, size, concurrency, args)
                peer_cpu = proc_cpu(process.pid) - peer0
                row["cpu_us_per_call"] = round(
                    row["client_cpu_us_per_call"] + 1e6 * peer_cpu / row["calls"], 1
                )
                row.update(payload=name, bytes=size or 0, concurrency=concurrency)
                rows.append(row)
                print(
                    f"{name:>10s} {concurrency:2d} {row['median_us']:10.1f} {row['p99_us']:9.1f} "
                    f"{row['calls_per_s']:9.1f} {row['mb_per_s']:8.1f} {row['cpu_us_per_call']:12.1f}",
                    flush=True,
                )
        await link.close()
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
        shutil.rmtree(directory, ignore_errors=True)
    return {
        "benchmark": "round trip of one call over flowserve.cluster.link to an echo peer process, uvloop",
        "reader": args.reader,
        "transport": args.transport,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "duration_s": args.duration,
        "rows": rows,
    }


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=1.0, help="seconds per payload and concurrency")
    parser.add_argument("--warmup", type=float, default=0.2, help="seconds of calls first, not counted")
    parser.add_argument("--min-calls", type=int, default=20, help="at least this many calls per case")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--reader", choices=["buffered", "stream"], default="buffered")
    parser.add_argument("--transport", choices=["shared", "socket"], default="shared")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--peer", help=argparse.SUPPRESS)  # run as the echo process at this path
    return parser.parse_args()


if __name__ == "__main__":
    args = parse()
    if args.peer:
        uvloop.run(peer(args.peer, args.reader, args.transport == "shared"))
    else:
        result = uvloop.run(main(args))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
