"""Compression bombs and giving memory back: ``flowserve serve`` of one or more source trees.

An outside attack run sent 20 gzip bombs (300 MiB of zeros in about 300 KB each, 6 MB in all)
and took the default server to 4.4 GB and ``--workers 2`` to 6.0 GB, and the memory stayed.
Two measurements, each tree side by side in the same run:

- ``bombs``: 20 bombs at once over HTTP or gRPC (raw HTTP/2) against a server with default
  flags or ``--workers 2``: resident memory of the server's processes before, at the peak
  (sampled every 20 ms) and 0 and 10 s after; the answers.
- ``latency``: the median time of a 16 MiB binary HTTP request (``identity_fp32``, one
  keep-alive connection per server, requests alternating between servers); a tree given as
  ``NAME:TREE:MALLOC_MMAP_THRESHOLD_=1048576`` runs with that glibc setting (what
  ``mallopt(M_MMAP_THRESHOLD, 1 MiB)`` at start would do: every block over 1 MiB mapped and
  unmapped), to weigh it against ``malloc_trim`` (flowserve/dataplane/memory.py).

    git worktree add /tmp/old <commit>
    python benchmarks/memory_return.py bombs /tmp/old . --protocol http grpc --workers 1 2
    python benchmarks/memory_return.py latency old:/tmp/old new:. new+mmap:.:MALLOC_MMAP_THRESHOLD_=1048576

Not a unit test: numbers depend on the machine (and on what else runs on it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.h2raw import DATA, HEADERS, RawClient, frame, grpc_message, request_headers, trailers  # noqa: E402

MiB = 1 << 20
BOMBS = 20
BOMB_SIZE = 300 * MiB
INFER = "/inference.GRPCInferenceService/ModelInfer"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(
    tree: Path, extra: list[str], env: dict[str, str] | None = None
) -> Iterator[tuple[int, int, int]]:
    """``flowserve serve`` from ``tree``: (pid, HTTP port, gRPC port), stopped afterwards."""
    http, grpc = free_port(), free_port()
    repos = ["--model-repository", str(HERE.parent / "model_repository"),
             "--model-repository", str(HERE.parent / "tests" / "models")]  # fmt: skip
    models = ["--model-control-mode=explicit", "--load-model=simple", "--load-model=identity_fp32"]
    cmd = [sys.executable, "-m", "flowserve.cli", "serve", "--host", "127.0.0.1", f"--http-port={http}",
           f"--grpc-port={grpc}", "--metrics-port=-1", *repos, "--strict-readiness=false",
           *models, *extra]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tree, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if "flowserve ready" in line:
            break
    out = proc.stdout
    threading.Thread(target=lambda: [None for _ in out], daemon=True).start()
    try:
        yield proc.pid, http, grpc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def resident(pid: int) -> int:
    """Resident MiB of ``pid`` and its children."""
    pids = [pid]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    pids.append(int(entry.name))
            except OSError:
                continue
    total = 0
    for p in pids:
        with contextlib.suppress(OSError):
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * 4096
    return total // MiB


# ------------------------------------------------------------------ bombs


def zeros_gzip(size: int, prefix: bytes = b"") -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [packer.compress(prefix)] + [packer.compress(bytes(MiB)) for _ in range(size // MiB)]
    return b"".join(parts) + packer.flush()


def http_bomb(port: int, body: bytes) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=300) as sock:
        sock.sendall(
            b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
            b"Inference-Header-Content-Length: 2\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        return sock.recv(400).split(b"\r\n")[0].decode("latin-1")


def grpc_bomb(port: int, body: bytes) -> str:
    with RawClient(port, timeout=300) as client:
        client.handshake()
        message = grpc_message(body, compressed=True)
        chunks = [message[i : i + 16384] for i in range(0, len(message), 16384)]
        client.send(frame(HEADERS, 0x4, 1, request_headers(INFER, [("grpc-encoding", "gzip")])))
        client.send(b"".join(frame(DATA, 0x1 if c is chunks[-1] else 0, 1, c) for c in chunks))
        client.until(HEADERS, 1, seconds=300, flags=0x1)
        return f"grpc-status {trailers(client.frames(), 1).get('grpc-status')}"


def bomb_body(protocol: str) -> bytes:
    if protocol == "http":
        return zeros_gzip(BOMB_SIZE, b"{}")
    size, varint = BOMB_SIZE, bytearray()  # a ModelInferRequest for simple: raw_input_contents
    while True:
        varint.append((size & 0x7F) | (0x80 if size > 0x7F else 0))
        size >>= 7
        if not size:
            break
    return zeros_gzip(BOMB_SIZE, b"\x0a\x06simple\x3a" + bytes(varint))


def bombs(tree: Path, protocol: str, workers: int) -> None:
    body = bomb_body(protocol)
    extra = ["--workers", str(workers)] if workers > 1 else []
    with serving(tree, extra) as (pid, http, grpc):
        send: Callable[[], str] = (
            (lambda: http_bomb(http, body)) if protocol == "http" else (lambda: grpc_bomb(grpc, body))
        )
        time.sleep(2)
        base = resident(pid)
        peak, stop = [base], threading.Event()

        def watch() -> None:
            while not stop.wait(0.02):
                peak[0] = max(peak[0], resident(pid))

        watcher = threading.Thread(target=watch)
        watcher.start()
        started = time.monotonic()
        with ThreadPoolExecutor(BOMBS) as pool:
            answers = list(pool.map(lambda _: send(), range(BOMBS)))
        took = time.monotonic() - started
        stop.set()
        watcher.join()
        after0 = resident(pid)
        time.sleep(10)
        after10 = resident(pid)
    sent = BOMBS * len(body) / 1e6
    print(
        f"{tree!s:24s} {protocol:4s} workers {workers} | {sent:.1f} MB sent, {took:5.1f} s | resident MiB: "
        f"before {base}, peak {peak[0]}, after {after0}, 10 s after {after10} | {sorted(set(answers))}",
        flush=True,
    )


# ------------------------------------------------------------------ latency of a 16 MiB request


def identity_request(count: int) -> bytes:
    header = (
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,%d],"parameters":{"binary_data_size":%d}}],'
        b'"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]}' % (count, 4 * count)
    )
    body = header + os.urandom(4 * count)
    return (
        b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
        b"Inference-Header-Content-Length: %d\r\n\r\n" % (len(body), len(header))
    ) + body


def round_trip(sock: socket.socket, request: bytes) -> float:
    started = time.perf_counter()
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(MiB)
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length"))
    got = len(rest)
    while got < length:
        got += len(sock.recv(4 * MiB))
    return time.perf_counter() - started


def latency(specs: list[str], rounds: int) -> None:
    request = identity_request(4 * MiB)  # 16 MiB of FP32 in, 16 MiB out
    with contextlib.ExitStack() as stack:
        socks: dict[str, socket.socket] = {}
        for spec in specs:
            name, tree, *envs = spec.split(":")
            env = dict(e.split("=", 1) for e in envs)
            _, http, _ = stack.enter_context(serving(Path(tree), [], env))
            socks[name] = stack.enter_context(socket.create_connection(("127.0.0.1", http)))
        for sock in socks.values():
            for _ in range(5):
                round_trip(sock, request)
        times: dict[str, list[float]] = {name: [] for name in socks}
        for _ in range(rounds):
            for name, sock in socks.items():
                for _ in range(4):
                    times[name].append(round_trip(sock, request))
    for name, values in times.items():
        values.sort()
        print(f"{name:12s} 16 MiB request: median {statistics.median(values) * 1e3:6.1f} ms, "
              f"p10 {values[len(values) // 10] * 1e3:6.1f}, p90 {values[9 * len(values) // 10] * 1e3:6.1f} "
              f"(n={len(values)})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    b = sub.add_parser("bombs")
    b.add_argument("trees", nargs="+", type=Path)
    b.add_argument("--protocol", nargs="+", choices=("http", "grpc"), default=["http", "grpc"])
    b.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    lat = sub.add_parser("latency")
    lat.add_argument("specs", nargs="+", help="NAME:TREE[:ENV=VALUE...]")
    lat.add_argument("--rounds", type=int, default=25)
    args = parser.parse_args()
    if args.what == "bombs":
        for protocol in args.protocol:
            for workers in args.workers:
                for tree in args.trees:
                    bombs(tree.resolve(), protocol, workers)
    else:
        latency(args.specs, args.rounds)


if __name__ == "__main__":
    main()
