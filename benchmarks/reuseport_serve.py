"""N ``flowserve serve`` processes on one HTTP port, for ``processes.py`` only (a measurement,
not a way to run flowserve: each process is a whole server of its own, with its own models,
statistics, shared-memory registrations and sequences, which Triton's protocol expects to be one).

::

    python benchmarks/reuseport_serve.py --processes 2 --ready-port R -- <flowserve serve arguments>

Every process binds the HTTP port with SO_REUSEPORT, so the kernel spreads connections over
them (perf_analyzer's HTTP client opens one per concurrent request); the serve arguments
should turn gRPC and metrics off (``--grpc-port=-1 --metrics-port=-1``). The processes start
one after another; once all of them say they are ready, this launcher listens on
``127.0.0.1:R`` (the readiness signal) and waits. SIGTERM or SIGINT stops them all.
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
READY = "flowserve ready"


def child(serve_args: Sequence[str]) -> int:
    sys.path.insert(0, str(ROOT))
    from flowserve import cli
    from flowserve.frontends.http import listener

    bind = listener.bind

    def shared_bind(host: str, port: int) -> socket.socket:
        return bind(host, port, reuse_port=True)

    listener.bind = shared_bind  # start_http looks it up when it binds
    return cli.main(["serve", *serve_args])


def _echo(stream: IO[str]) -> None:
    for line in stream:
        sys.stdout.write(line)
        sys.stdout.flush()


def launch(processes: int, ready_port: int, serve_args: Sequence[str], timeout_s: float = 120.0) -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    children: list[subprocess.Popen[str]] = []
    try:
        for _ in range(processes):
            proc = subprocess.Popen(
                [sys.executable, __file__, "--child", "--", *serve_args],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            children.append(proc)
            assert proc.stdout is not None
            deadline, line = time.monotonic() + timeout_s, ""
            for line in proc.stdout:  # this process's start, before the next one's
                sys.stdout.write(line)
                if READY in line or time.monotonic() > deadline:
                    break
            if proc.poll() is not None or READY not in line:
                print(f"a flowserve process did not get ready (exit {proc.poll()})", flush=True)
                return 1
            threading.Thread(target=_echo, args=(proc.stdout,), daemon=True).start()
        with socket.create_server(("127.0.0.1", ready_port)):
            print(f"{processes} flowserve processes ready", flush=True)
            while not stop.wait(0.5):
                if any(p.poll() is not None for p in children):
                    print("a flowserve process exited", flush=True)
                    return 1
        return 0
    finally:
        for proc in children:
            proc.terminate()
        for proc in children:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--ready-port", type=int)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("serve_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    serve_args = args.serve_args[1:] if args.serve_args[:1] == ["--"] else args.serve_args
    if args.child:
        return child(serve_args)
    if args.ready_port is None:
        parser.error("--ready-port is required")
    return launch(args.processes, args.ready_port, serve_args)


if __name__ == "__main__":
    sys.exit(main())
