"""Attacks from an outside run against ``flowserve serve`` (default flags and ``--workers 2``) on
the HTTP side (and, for compression bombs, gRPC too), each with a good client answered promptly
meanwhile:

- gzip bombs (``Content-Encoding: gzip``, ``grpc-encoding: gzip``): each inflated to the request
  limit before it was refused, uncounted in the server's budget of buffered request bytes, and
  glibc kept the memory afterwards (20 bombs, 6 MB sent: 4.4 GB resident, 6.0 GB with
  --workers 2). Now the inflated bytes take the budget as they grow, a body inflates to at most
  ``inflate.RATIO`` times its size, and freed memory goes back to the system: resident memory
  stays within the budget and returns near its baseline.
- clients that ask for large answers and never read them: the answers stayed in memory, one
  per pipelined request. Now a connection answers nothing more until its client takes what it
  has, unsent bytes are counted against ``--max-unsent-response-bytes``, and past it the
  connections holding the most are closed.
- idle sockets up to the connection cap (4,200 per port) locked new clients out (79 of 85
  refused). Now idle connections are evicted to make room, and one address holds at most
  ``--max-connections-per-peer`` (attackers bind 127.0.0.2-7: Linux routes 127/8 to loopback).

The bounds are set lower than their defaults (budget 128 MiB, unsent 64 MiB, 50 connections,
20 per peer) so that the attacks stay small for a shared test machine; the mechanisms are the
defaults'.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from flowserve.dataplane.inflate import RATIO
from tests.conftest import ServerProcess, start_server
from tests.h2raw import DATA, HEADERS, RawClient, frame, grpc_message, request_headers, trailers
from tests.reliability.goodclient import Prober, rss

pytestmark = pytest.mark.slow

MiB = 1 << 20
BUDGET = 128 * MiB  # --max-buffered-request-bytes (per worker)
UNSENT = 64 * MiB  # --max-unsent-response-bytes (per worker)
MAX_CONNECTIONS, PER_PEER = 50, 20
INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module", params=["default", "workers"])
def served(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    workers = ("--workers", "2") if request.param == "workers" else ()
    server = start_server(
        *workers, "--model-control-mode=explicit", "--load-model=simple", "--load-model=identity_fp32",
        f"--max-buffered-request-bytes={BUDGET}", f"--max-unsent-response-bytes={UNSENT}",
        f"--max-connections={MAX_CONNECTIONS}", f"--max-connections-per-peer={PER_PEER}", timeout=180.0,
    )  # fmt: skip
    try:
        yield server
    finally:
        assert server.stop(60.0) == 0, server.log()[-4000:]


def workers(served: ServerProcess) -> int:
    return 2 if "--workers" in served.process.args else 1  # type: ignore[operator]


# ------------------------------------------------------------------ the server's memory


class Peak:
    """The most resident memory the server had while the block ran (sampled every 20 ms)."""

    def __init__(self, served: ServerProcess) -> None:
        self.served = served
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.most = max(self.most, rss(self.served))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def settled(served: ServerProcess, below: int | None = None, seconds: float = 15.0) -> int:
    """The server's resident memory once it stops falling (or is ``below``), within ``seconds``."""
    deadline = time.monotonic() + seconds
    last = rss(served)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = rss(served)
        if (below is not None and now < below) or (below is None and now >= last - MiB):
            return now
        last = now
    return rss(served)


# ------------------------------------------------------------------ a good client


def metric(served: ServerProcess, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(served.metrics_url, timeout=30).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def attacker(served: ServerProcess, n: int, port: int | None = None) -> socket.socket:
    """A connection from 127.0.0.(2 + n % 6): another client address than the good client's."""
    return socket.create_connection(
        ("127.0.0.1", port or served.http_port), timeout=10, source_address=(f"127.0.0.{2 + n % 6}", 0)
    )


def answer_head(sock: socket.socket, seconds: float = 60.0) -> bytes:
    """What the server answers first, its head and what came with it (b"" when it closed
    without an answer)."""
    sock.settimeout(seconds)
    data = b""
    with contextlib.suppress(OSError):
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return data


def waiting(sock: socket.socket) -> bytes:
    """What the server has sent on ``sock`` so far (without waiting)."""
    sock.setblocking(False)
    try:
        return sock.recv(65536)
    except (BlockingIOError, ConnectionError):
        return b""
    finally:
        sock.settimeout(10)


def answer(sock: socket.socket, seconds: float = 60.0) -> str:
    """A whole answer (a Content-Length body), as text."""
    data = answer_head(sock, seconds)
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            with contextlib.suppress(OSError):
                while len(body) < int(line.split(b":")[1]):
                    body += sock.recv(65536) or b"?"
    return (head + b"\r\n\r\n" + body).decode("latin-1")


# ------------------------------------------------------------------ A, E: compression bombs


def zeros_gzip(size: int, prefix: bytes = b"") -> bytes:
    """``prefix`` and ``size`` zero bytes, gzip, built without holding them."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [packer.compress(prefix)] + [packer.compress(bytes(MiB)) for _ in range(size // MiB)]
    return b"".join(parts) + packer.flush()


def http_bomb(served: ServerProcess, n: int, body: bytes) -> str:
    sock = attacker(served, n)
    try:
        sock.sendall(
            b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
            b"Inference-Header-Content-Length: 2\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        return answer(sock)
    finally:
        sock.close()


def grpc_bomb(served: ServerProcess, n: int, body: bytes) -> str:
    with RawClient(served.grpc_port, timeout=60) as client:
        client.sock.close()
        client.sock = attacker(served, n, served.grpc_port)
        client.handshake()
        message = grpc_message(body, compressed=True)
        chunks = [message[i : i + 16384] for i in range(0, len(message), 16384)]
        headers = request_headers(INFER, [("grpc-encoding", "gzip")])
        client.send(frame(HEADERS, 0x4, 1, headers))
        client.send(b"".join(frame(DATA, 0x1 if c is chunks[-1] else 0, 1, c) for c in chunks))
        client.until(HEADERS, 1, seconds=60, flags=0x1)
        fields = trailers(client.frames(), 1)
        return f"{fields.get('grpc-status')} {fields.get('grpc-message')}"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_gzip_bombs_stay_within_the_budget_and_the_memory_comes_back(
    served: ServerProcess, protocol: str
) -> None:
    """20 bombs at once (300 MiB of zeros in 300 KB each: 6 MB sent): each is refused (its
    ratio, or the budget), resident memory grows by no more than the budget (per worker),
    and returns near where it was once they are done. Before: each inflated to the 256 MiB
    request limit uncounted (1.6 GiB for one worker here) and the memory stayed."""
    if protocol == "http":
        body = zeros_gzip(300 * MiB, b"{}")
        bomb: Callable[[int], str] = lambda n: http_bomb(served, n, body)  # noqa: E731
    else:  # a ModelInferRequest for simple with 300 MiB of raw_input_contents
        size = 300 * MiB
        varint = bytearray()
        while True:
            varint.append((size & 0x7F) | (0x80 if size > 0x7F else 0))
            size >>= 7
            if not size:
                break
        body = zeros_gzip(300 * MiB, b"\x0a\x06simple\x3a" + bytes(varint))
        bomb = lambda n: grpc_bomb(served, n, body)  # noqa: E731
    assert len(body) < 400_000
    bomb(0)  # once before: the code paths are loaded
    before = settled(served)
    with Peak(served) as peak, Prober(served, protocol), ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(bomb, range(20)))
    for answer in answers:
        if protocol == "http":
            assert answer.startswith(("HTTP/1.1 413", "HTTP/1.1 503")), answer[:300]
        else:
            assert answer.startswith("8 "), answer[:300]  # RESOURCE_EXHAUSTED
        assert (
            f"exceeds {RATIO} times its compressed size" in answer or "--max-buffered-request-bytes" in answer
        )
    grown = peak.most - before
    assert grown < workers(served) * (BUDGET + 160 * MiB), (grown >> 20, before >> 20)
    after = settled(served, below=before + workers(served) * 96 * MiB)
    assert after < before + workers(served) * 96 * MiB, (after >> 20, before >> 20, peak.most >> 20)


# ------------------------------------------------------------------ B: answers nobody reads


def identity_request(count: int) -> bytes:
    header = (
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,%d],"parameters":{"binary_data_size":%d}}],'
        b'"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]}' % (count, 4 * count)
    )
    body = header + bytes(4 * count)
    head = (
        b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
        b"Inference-Header-Content-Length: %d\r\n\r\n" % (len(body), len(header))
    )
    return head + body


def never_read(served: ServerProcess, n: int, raw: bytes, seconds: float) -> socket.socket:
    """A client that sends ``raw`` (as much as the server takes in ``seconds``) and reads
    nothing; a small receive buffer, so the answers wait in the server, not the kernel."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.bind((f"127.0.0.{2 + n % 6}", 0))
    sock.connect(("127.0.0.1", served.http_port))
    sock.settimeout(seconds)
    with contextlib.suppress(OSError):  # the server stopped reading it, or closed it
        sock.sendall(raw)
    return sock


def test_clients_that_never_read_their_answers_hold_no_more_than_the_budget(served: ServerProcess) -> None:
    """40 clients each ask for a 24 MiB answer (960 MiB in all) and read none of it: the unsent
    bytes stay within --max-unsent-response-bytes (the connections holding the most are
    closed), resident memory with them, and a good client is served meanwhile. Before: every
    answer stayed in memory, as long as its client kept the connection open."""
    request = identity_request(6 * MiB)
    never_read(served, 0, request, 5).close()  # warm: the model has run once
    before = settled(served)
    with Peak(served) as peak, Prober(served), ThreadPoolExecutor(2) as pool:  # 2 requests in flight
        socks = list(pool.map(lambda n: never_read(served, n, request, 8), range(40)))
        time.sleep(2)
        unsent = metric(served, "flowserve_response_bytes_unsent")
    try:
        grown = peak.most - before
        assert unsent <= workers(served) * UNSENT, unsent
        # what may be held: the unsent budget's worth of answers, and the requests in flight
        # with their answers being encoded
        assert grown < workers(served) * (BUDGET + UNSENT + 128 * MiB), (grown >> 20, before >> 20)
        assert "--max-unsent-response-bytes" in served.log()
    finally:
        for sock in socks:
            sock.close()
    settled(served, below=before + workers(served) * 64 * MiB)
    assert metric(served, "flowserve_response_bytes_unsent") == 0


# ------------------------------------------------------------------ C: idle sockets


def test_one_address_holds_at_most_its_share_of_the_listener(served: ServerProcess) -> None:
    """--max-connections-per-peer: one attacking address (127.0.0.2) keeps at most its share
    of each worker's listener, the rest are refused at once, and the good client is served."""
    socks = [attacker(served, 0) for _ in range(workers(served) * PER_PEER + 10)]
    try:
        with Prober(served) as prober:
            time.sleep(0.5)
            refused = sum(waiting(sock).startswith(b"HTTP/1.1 503") for sock in socks)
            assert refused >= 10, refused
            started = time.monotonic()
            with urllib.request.urlopen(f"http://{served.http_url}/v2/health/live", timeout=10) as reply:
                assert reply.status == 200
            assert time.monotonic() - started < prober.bound()
    finally:
        for sock in socks:
            sock.close()


def test_idle_sockets_do_not_lock_new_clients_out(served: ServerProcess) -> None:
    """Attackers fill the HTTP and metrics listeners with idle sockets and heads never
    finished (from 127.0.0.2-7); once they have been idle for guard.EVICT_AFTER_S, a new client
    is served at once: the connection idle the longest is evicted to make room
    (flowserve_connections_evicted). Before: refused."""
    socks: list[socket.socket] = []
    try:
        with Prober(served) as prober:
            for n in range(workers(served) * MAX_CONNECTIONS + 40):  # the listeners fill up
                sock = attacker(served, n)
                socks.append(sock)
                if n % 2:
                    with contextlib.suppress(OSError):  # a head that never ends
                        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                socks.append(attacker(served, n, served.metrics_port))
            time.sleep(2.5)  # guard.EVICT_AFTER_S: the attackers are idle long enough
            for _ in range(8):  # new clients (new connections: with --workers 2, both workers)
                started = time.monotonic()
                with urllib.request.urlopen(f"http://{served.http_url}/v2/health/live", timeout=10) as reply:
                    assert reply.status == 200
                assert time.monotonic() - started < prober.bound()
            full = workers(served) * (MAX_CONNECTIONS - 1)  # all but room for the scrape
            assert metric(served, "flowserve_connections_open", listener="http") >= full
            assert metric(served, "flowserve_connections_evicted", listener="http") >= 1
            assert metric(served, "flowserve_connections_evicted", listener="metrics") >= 1
    finally:
        for sock in socks:
            sock.close()
