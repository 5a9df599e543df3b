"""Copies of the payload per request, in user space, on each protocol: how many times the server
copies a large tensor's bytes between the socket and the model (request) and between the model
and the socket (response).

How: the server runs with a small ``LD_PRELOAD`` library (built here with the system's C
compiler into ``benchmarks/.work/copies/``) that counts the bytes of every ``memcpy`` and
``memmove`` in the server process (all threads) into a shared counter file, so the count covers
whatever makes the copy (CPython's bytes and bytearray, uvloop, httptools, protobuf, numpy).
Copies made by the kernel (``recv``, ``send``) are not user-space copies and are not counted;
neither are copies that glibc makes inside ``realloc`` (it moves large blocks with ``mremap``,
without copying). The server's minor page faults per request are reported beside it (a fresh
16 MiB buffer costs 4,096 of them, which is where most of a copy's time went).

Three identity-like Python models (in-process on flowserve): ``identity`` (FP32 in, the same
tensor out), ``sink`` (FP32 in, one element out: the request direction alone) and ``source``
(the element count in, that many FP32 out: the response direction alone). For each protocol a
few requests warm up, then ``--requests`` are counted; reported per request: bytes copied /
payload bytes ("copies"), per direction, with the range over ``--repeats``. ``stream`` is gRPC's
bidirectional ModelStreamInfer (tritonclient's ``async_stream_infer``, one request at a time on
one stream).

    python benchmarks/copies.py                    # 16 MiB, HTTP, gRPC, system shm, gRPC stream
    python benchmarks/copies.py --size 1M --tree /tmp/base-c   # another flowserve tree as well

Writes benchmarks/results/copies.json.
"""

from __future__ import annotations

import argparse
import mmap
import os
import queue
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compare import run_script, write_result  # noqa: E402
from servers import Server, ServerGroup, flowserve_command, free_port, sigterm_as_interrupt  # noqa: E402

WORK = HERE / ".work" / "copies"
RESULTS = HERE / "results"
SIZES = {"64K": 64 * 1024, "1M": 1024**2, "16M": 16 * 1024**2, "64M": 64 * 1024**2}
PROTOCOLS = ("http", "grpc", "shm", "stream")

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* counters[0]: bytes memcpy'd/memmove'd in calls of at least 4 KiB, [1]: those calls,
   [2]: bytes of all calls */
static volatile uint64_t *counters;
static void *(*real_memcpy)(void *, const void *, size_t);
static void *(*real_memmove)(void *, const void *, size_t);

static void *plain_move(void *dst, const void *src, size_t n) {
    volatile unsigned char *d = dst;
    const volatile unsigned char *s = src;
    if (d < s) { for (size_t i = 0; i < n; i++) d[i] = s[i]; }
    else { for (size_t i = n; i > 0; i--) d[i - 1] = s[i - 1]; }
    return dst;
}

__attribute__((constructor)) static void copycount_init(void) {
    real_memcpy = dlsym(RTLD_NEXT, "memcpy");
    real_memmove = dlsym(RTLD_NEXT, "memmove");
    const char *path = getenv("COPYCOUNT_FILE");
    if (!path) return;
    int fd = open(path, O_RDWR);
    if (fd < 0) return;
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p != MAP_FAILED) counters = p;
}

static inline void count(size_t n) {
    volatile uint64_t *c = counters;
    if (!c) return;
    __atomic_add_fetch(&c[2], n, __ATOMIC_RELAXED);
    if (n >= 4096) {
        __atomic_add_fetch(&c[0], n, __ATOMIC_RELAXED);
        __atomic_add_fetch(&c[1], 1, __ATOMIC_RELAXED);
    }
}

void *memcpy(void *dst, const void *src, size_t n) {
    count(n);
    return real_memcpy ? real_memcpy(dst, src, n) : plain_move(dst, src, n);
}

void *memmove(void *dst, const void *src, size_t n) {
    count(n);
    return real_memmove ? real_memmove(dst, src, n) : plain_move(dst, src, n);
}

void *__memcpy_chk(void *dst, const void *src, size_t n, size_t len) {
    (void)len;
    return memcpy(dst, src, n);
}

void *__memmove_chk(void *dst, const void *src, size_t n, size_t len) {
    (void)len;
    return memmove(dst, src, n);
}
"""

CONFIGS = {
    "identity": ("TYPE_FP32", "TYPE_FP32"),
    "sink": ("TYPE_FP32", "TYPE_FP32"),
    "source": ("TYPE_INT64", "TYPE_FP32"),
}
MODEL_PY = '''import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """{doc}"""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", {expr})
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
'''
BODIES = {
    "identity": ("OUTPUT0 = INPUT0, the same array.", "x"),
    "sink": ("OUTPUT0 = INPUT0[:1] (the request's payload, nothing back).", "x[:1]"),
    "source": ("OUTPUT0 = INPUT0[0] float32 ones, made without a copy.", "np.ones(int(x[0]), np.float32)"),
}


def build_shim() -> Path:
    """The counting library, compiled once (needs ``cc``)."""
    WORK.mkdir(parents=True, exist_ok=True)
    lib = WORK / "libcopycount.so"
    source = WORK / "copycount.c"
    if lib.exists() and source.exists() and source.read_text() == SHIM:
        return lib
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("copies.py needs a C compiler (cc) to build its memcpy counter")
    source.write_text(SHIM)
    flags = ["-O2", "-shared", "-fPIC", "-fno-builtin", "-fno-tree-loop-distribute-patterns"]
    subprocess.run([compiler, *flags, "-o", str(lib), str(source), "-ldl"], check=True)
    return lib


def build_repository(root: Path) -> Path:
    for name, (in_type, out_type) in CONFIGS.items():
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
            f'input [ {{ name: "INPUT0" data_type: {in_type} dims: [ -1 ] }} ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: {out_type} dims: [ -1 ] }} ]\n'
            "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
        )
        doc, expr = BODIES[name]
        (root / name / "1" / "model.py").write_text(MODEL_PY.format(doc=doc, expr=expr))
    (root.parent / "empty_graphs").mkdir(exist_ok=True)
    return root


class Counter:
    """The shared counter file the library adds to: (bytes in copies of 4 KiB or more, such
    copies, bytes in all copies)."""

    def __init__(self, path: Path) -> None:
        path.write_bytes(bytes(4096))
        self.path = path
        self._file = path.open("r+b")
        self._map = mmap.mmap(self._file.fileno(), 4096)

    def read(self) -> tuple[int, int, int]:
        values = np.frombuffer(self._map, np.uint64, 3)
        return int(values[0]), int(values[1]), int(values[2])

    def close(self) -> None:
        self._map.close()
        self._file.close()


def minor_faults(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[7])  # field 10 of stat: minflt (fields after the name start at 3)


class Client:
    """One protocol's client: ``call(model, array)`` sends one request and returns OUTPUT0."""

    def __init__(self, protocol: str, server: Server, size: int) -> None:
        self.protocol = protocol
        self.regions: list[Any] = []
        if protocol == "http":
            import tritonclient.http as module
        else:
            import tritonclient.grpc as module
        self.module: Any = module
        self.client: Any = module.InferenceServerClient(server.url("http" if protocol == "http" else "grpc"))
        if protocol == "stream":
            self.results: queue.Queue[Any] = queue.Queue()
            self.client.start_stream(callback=lambda result, error: self.results.put(error or result))
        if protocol == "shm":
            import tritonclient.utils.shared_memory as shm

            self.shm = shm
            self.client.unregister_system_shared_memory()
            for name in ("copies_in", "copies_out"):
                handle = shm.create_shared_memory_region(name, f"/{name}_{os.getpid()}", size)
                self.client.register_system_shared_memory(name, f"/{name}_{os.getpid()}", size)
                self.regions.append(handle)

    def call(self, model: str, data: np.ndarray, out_size: int) -> np.ndarray:
        datatype = "INT64" if data.dtype == np.int64 else "FP32"
        tensor = self.module.InferInput("INPUT0", list(data.shape), datatype)
        wanted = self.module.InferRequestedOutput(
            "OUTPUT0", **({"binary_data": True} if self.protocol == "http" else {})
        )
        if self.protocol == "shm" and data.nbytes >= 1024:
            self.shm.set_shared_memory_region(self.regions[0], [data])
            tensor.set_shared_memory("copies_in", data.nbytes)
        elif self.protocol == "http":
            tensor.set_data_from_numpy(data, binary_data=True)
        else:
            tensor.set_data_from_numpy(data)
        if self.protocol == "shm" and out_size >= 1024:
            wanted.set_shared_memory("copies_out", out_size)
        if self.protocol == "stream":
            self.client.async_stream_infer(model, [tensor], outputs=[wanted])
            result = self.results.get(timeout=300)
            if isinstance(result, Exception):
                raise RuntimeError(f"stream {model}: {result}")
        else:
            result = self.client.infer(model, [tensor], outputs=[wanted])
        if self.protocol == "shm" and out_size >= 1024:
            shape = list(result.get_output("OUTPUT0").shape)
            return np.asarray(self.shm.get_contents_as_numpy(self.regions[1], np.float32, shape))
        return np.asarray(result.as_numpy("OUTPUT0"))

    def close(self) -> None:
        if self.protocol == "stream":
            self.client.stop_stream()
        if self.protocol == "shm":
            self.client.unregister_system_shared_memory()
            for handle in self.regions:
                self.shm.destroy_shared_memory_region(handle)
        self.client.close()


def requests_for(size: int) -> dict[str, tuple[np.ndarray, int, Callable[[np.ndarray], bool]]]:
    """model -> (input, output bytes, check of the output)."""
    count = size // 4
    payload = np.arange(count, dtype=np.float32)
    return {
        "identity": (payload, size, lambda out: out.shape == (count,) and float(out[-1]) == count - 1),
        "sink": (payload, 4, lambda out: out.shape == (1,)),
        "source": (
            np.array([count], np.int64),
            size,
            lambda out: out.shape == (count,) and float(out[-1]) == 1.0,
        ),
    }


def measure(
    server: Server, counter: Counter, protocol: str, size: int, requests: int
) -> dict[str, dict[str, float]]:
    client = Client(protocol, server, size)
    results: dict[str, dict[str, float]] = {}
    try:
        for model, (data, out_size, check) in requests_for(size).items():
            for _ in range(2):  # warm up (first-time imports, pools)
                client.call(model, data, out_size)
            before, faults = counter.read(), minor_faults(server.pid)
            started = time.perf_counter()
            for _ in range(requests):
                out = client.call(model, data, out_size)
                if not check(out):
                    raise RuntimeError(f"{protocol} {model}: wrong output {out[:4]} of shape {out.shape}")
            elapsed = time.perf_counter() - started
            after = counter.read()
            results[model] = {
                "copies": (after[0] - before[0]) / requests / size,
                "copy_calls": (after[1] - before[1]) / requests,
                "all_bytes_copies": (after[2] - before[2]) / requests / size,
                "page_faults": (minor_faults(server.pid) - faults) / requests,
                "ms": elapsed / requests * 1000,
            }
    finally:
        client.close()
    return results


def start(group: ServerGroup, name: str, tree: Path, repository: Path, lib: Path, counter: Counter) -> Server:
    http, grpc = free_port(), free_port()
    command = flowserve_command(repository.resolve(), repository.parent / "empty_graphs", http, grpc)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    env["LD_PRELOAD"] = str(lib)
    env["COPYCOUNT_FILE"] = str(counter.path)
    ready = [f"/v2/models/{m}/ready" for m in CONFIGS]
    return group.start(name, command, http, grpc, ready, env, cwd=tree)


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for key in sorted(
        {(r["tree"], r["protocol"]) for r in records}, key=lambda k: (k[0], PROTOCOLS.index(k[1]))
    ):
        runs = [r for r in records if (r["tree"], r["protocol"]) == key]
        row: dict[str, Any] = {"tree": key[0], "protocol": key[1]}
        for model, label in (("sink", "request"), ("source", "response"), ("identity", "both")):
            values = [r["results"][model]["copies"] for r in runs]
            row[label] = round(statistics.median(values), 2)
            row[f"{label}_range"] = [round(min(values), 2), round(max(values), 2)]
        row["faults_both"] = round(statistics.median(r["results"]["identity"]["page_faults"] for r in runs))
        row["ms_both"] = round(statistics.median(r["results"]["identity"]["ms"] for r in runs), 1)
        rows.append(row)
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'tree':<10} {'via':<5} {'request':>8} {'response':>9} {'in+out':>7}  "
        f"{'faults/req':>10} {'ms/req':>7}  (copies of the payload per request, median of repeats)"
    )
    lines = [head, "-" * len(head)]
    for row in rows:
        lines.append(
            f"{row['tree']:<10} {row['protocol']:<5} {row['request']:>8} {row['response']:>9} "
            f"{row['both']:>7}  {row['faults_both']:>10} {row['ms_both']:>7}"
        )
    return "\n".join(lines)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=list(SIZES), default="16M")
    parser.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS))
    parser.add_argument("--requests", type=int, default=5, help="requests counted per model and repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--tree", type=Path, help="also measure flowserve from this source tree (before/after)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "copies.json")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    lib = build_shim()
    repository = build_repository(WORK / "repo")
    size = SIZES[args.size]
    trees = {"this": HERE.parent}
    if args.tree is not None:
        trees["tree"] = args.tree.resolve()
    started = time.time()
    records: list[dict[str, Any]] = []
    with sigterm_as_interrupt(), ServerGroup(WORK / "logs") as group:
        for name, tree in trees.items():
            counter = Counter(WORK / f"counter-{name}")
            try:
                server = start(group, name, tree, repository, lib, counter)
                for repeat in range(args.repeats):
                    for protocol in args.protocols:
                        results = measure(server, counter, protocol, size, args.requests)
                        records.append(
                            {"tree": name, "repeat": repeat, "protocol": protocol, "results": results}
                        )
                        shown = "  ".join(f"{m} {r['copies']:.2f}" for m, r in results.items())
                        print(f"  {name:<5} {protocol:<5} repeat {repeat}: {shown}", flush=True)
                server.stop()
            finally:
                counter.close()
    rows = summarize(records)
    print()
    print(render(rows))
    write_result(
        args.output,
        "copies of the payload per request in the server's user space (memcpy/memmove bytes / payload)",
        started,
        settings={
            "size": args.size,
            "protocols": args.protocols,
            "requests": args.requests,
            "repeats": args.repeats,
            "trees": {k: str(v) for k, v in trees.items()},
        },
        summary=rows,
        runs=records,
    )
    return 0


if __name__ == "__main__":
    run_script(main)
